"""DeepSeek's YaRN for `MultiHeadLatentAttention`: the `rotary_scaling`
dict (`RotaryEmbedding`'s scaling arguments plus DeepSeek's `mscale` and
`mscale_all_dim`) and the two factors it sets.

DeepSeek-V2/V3 (and `transformers`' `DeepseekV3Attention`) scale YaRN
differently from keras-hub's `RotaryEmbedding`, with
`m(f, x) = 0.1 x ln(f) + 1` (1 for `f <= 1`) and `f` the
`scaling_factor`:

- cos and sin are multiplied by `m(f, mscale) / m(f, mscale_all_dim)`
  when both are given, else by `m(f, 1)` (`RotaryEmbedding`'s own YaRN
  factor);
- the softmax scale `1 / sqrt(qk_head_dim)` is multiplied by
  `m(f, mscale_all_dim) ** 2` when `mscale_all_dim` is given: the
  position-free features are rescaled too.

DeepSeek-V3's checkpoint (`mscale = mscale_all_dim = 1`, `f = 40`)
leaves cos and sin unscaled and multiplies the softmax scale by
`(0.1 ln 40 + 1) ** 2`, about 1.87.
"""

import math

from keras_attention.layers import rotary_embedding
from keras_attention.utils import validation

MSCALE_KEYS = ("mscale", "mscale_all_dim")


def yarn_mscale(factor, mscale=1.0):
    """YaRN's `0.1 * mscale * ln(factor) + 1` (1 for `factor <= 1`)."""
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def check_rope_theta(rope_theta):
    """`MultiHeadLatentAttention`'s `rope_theta`, checked: a number >= 1
    (as a float), or None (no rotary positions: NoPE)."""
    if rope_theta is None:
        return None
    return float(
        validation.check_positive_number("rope_theta", rope_theta, minimum=1)
    )


def check_rotary_scaling(rotary_scaling, rope_theta):
    """`rotary_scaling` of `MultiHeadLatentAttention`, checked: None, or
    a dict of `RotaryEmbedding`'s scaling arguments plus `mscale` and
    `mscale_all_dim` (positive numbers, with `rope_type="yarn"` only;
    refused without rotary positions, `rope_theta=None`). Returns a
    plain dict copy (or None)."""
    if rotary_scaling is None:
        return None
    if rope_theta is None:
        raise ValueError(
            "`rotary_scaling` scales rotary positions, which "
            "`rope_theta=None` turns off. Received: rotary_scaling="
            f"{rotary_scaling!r}, rope_theta=None"
        )
    if not isinstance(rotary_scaling, dict):
        raise TypeError(
            "`rotary_scaling` must be None or a dict of RotaryEmbedding "
            "scaling arguments (plus `mscale`, `mscale_all_dim`). "
            f"Received: rotary_scaling={rotary_scaling!r}"
        )
    rotary = {k: v for k, v in rotary_scaling.items() if k not in MSCALE_KEYS}
    unknown = sorted(
        set(rotary) - set(rotary_embedding.ROTARY_SCALING_ARGUMENTS)
    )
    if unknown:
        raise ValueError(
            "`rotary_scaling` takes the keys "
            f"{rotary_embedding.ROTARY_SCALING_ARGUMENTS + MSCALE_KEYS}; "
            f"unknown: {unknown}. Received: rotary_scaling={rotary_scaling!r}"
        )
    rotary_embedding.check_rotary_scaling(rotary, rope_theta)
    out = dict(rotary_scaling)
    for key in MSCALE_KEYS:
        if key not in out:
            continue
        out[key] = float(validation.check_positive_number(key, out[key]))
        if rotary.get("rope_type", "linear") != "yarn":
            raise ValueError(
                f"`{key}` applies to `rope_type='yarn'` only (DeepSeek's "
                f"YaRN). Received: {key}={out[key]!r}, rope_type="
                f"{rotary.get('rope_type', 'linear')!r}"
            )
    return out


def rotary_arguments(rotary_scaling):
    """The `RotaryEmbedding` arguments of a checked `rotary_scaling`."""
    return {
        k: v for k, v in (rotary_scaling or {}).items() if k not in MSCALE_KEYS
    }


def yarn_factors(rotary_scaling):
    """`(rope_correction, softmax_factor)` of a checked `rotary_scaling`:
    the factor on the rotated features after `RotaryEmbedding` (which
    scaled its YaRN cos and sin by `m(f, 1)`; DeepSeek's factor is
    `m(f, mscale) / m(f, mscale_all_dim)` when both are given) and the
    factor on the softmax scale (`m(f, mscale_all_dim) ** 2`). Both 1
    without DeepSeek's keys."""
    scaling = rotary_scaling or {}
    if scaling.get("rope_type") != "yarn":
        return 1.0, 1.0
    factor = float(scaling.get("scaling_factor", 1.0))
    mscale, mscale_all_dim = (scaling.get(k) for k in MSCALE_KEYS)
    correction = 1.0
    if mscale and mscale_all_dim:
        deepseek = yarn_mscale(factor, mscale) / yarn_mscale(
            factor, mscale_all_dim
        )
        correction = deepseek / yarn_mscale(factor)
    softmax = 1.0
    if mscale_all_dim:
        softmax = yarn_mscale(factor, mscale_all_dim) ** 2
    return correction, softmax
