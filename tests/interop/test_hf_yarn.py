"""`from_huggingface`'s YaRN (`hf.configs.rope_arguments`, "yarn"): the
rotary embedding our layers build from a config's YaRN settings equals
transformers' `_compute_yarn_parameters` (its inverse frequencies and
`attention_factor`, the scale of cos and sin) and DeepSeek's softmax
scale (`yarn_apply_mscale`), on configs of both layouts, with and without
DeepSeek's `mscale` / `mscale_all_dim`, `truncate`, defaults, a derived
factor and partial rotary. transformers runs in a subprocess (torch
must not share a process with TensorFlow): slow tier; the refusals run
in the fast tier (TensorFlow)."""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from tiers import family_tier

from keras_attention.interop.hf import configs
from keras_attention.layers import _latent_rotary
from keras_attention.layers.rotary_embedding import RotaryEmbedding

pytestmark = family_tier()
# The comparisons need a transformers subprocess (~5 s): CI's fast tier
# checks YaRN end to end instead, in the gpt_oss and deepseek_v3 cases of
# test_from_huggingface.py; the edge cases here run in the slow tier.
transformers_tier = pytest.mark.slow(
    reason="YaRN's edge cases against transformers (a subprocess); the "
    "gpt_oss and deepseek_v3 cases of test_from_huggingface.py check YaRN "
    "in the fast tier"
)

_SCRIPT = r"""
import json, sys
import numpy as np
import transformers
from transformers.modeling_rope_utils import (
    _compute_yarn_parameters, yarn_apply_mscale)

out = {}
for name, case in json.loads(sys.argv[1]).items():
    fields = dict(case["config"])
    kind = fields.pop("model_type")
    config = transformers.AutoConfig.for_model(kind, **fields)
    layer_type = case.get("layer_type")
    inv_freq, factor = _compute_yarn_parameters(config, layer_type=layer_type)
    params = config.rope_parameters
    params = params[layer_type] if layer_type else params
    out[name + "/inv_freq"] = inv_freq.numpy()
    out[name + "/attention_factor"] = np.float64(factor)
    out[name + "/softmax"] = np.float64(yarn_apply_mscale(params, 1.0))
np.savez(sys.argv[2], **out)
"""

HEAD_DIM = 64  # of every case (DeepSeek: its rotated key)
LLAMA = dict(
    model_type="llama",
    vocab_size=24,
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=64,
    max_position_embeddings=131072,
)
# DeepSeek-V3's rotary sizes: the rotated key of 64, YaRN of factor 40 on
# a pretraining length of 4096, old layout (`rope_scaling`, "type").
DEEPSEEK = dict(
    model_type="deepseek_v3",
    vocab_size=24,
    hidden_size=256,
    num_attention_heads=4,
    qk_rope_head_dim=64,
    qk_nope_head_dim=32,
    v_head_dim=32,
    max_position_embeddings=163840,
    rope_theta=10000.0,
    rope_scaling=dict(
        type="yarn",
        factor=40.0,
        original_max_position_embeddings=4096,
        beta_fast=32,
        beta_slow=1,
        mscale=1.0,
        mscale_all_dim=1.0,
    ),
)
CASES = {
    # gpt-oss's: truncate off, rope_theta 150000.
    "gpt_oss": dict(
        config=dict(
            LLAMA,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=150000.0,
                factor=32.0,
                beta_fast=32.0,
                beta_slow=1.0,
                original_max_position_embeddings=4096,
                truncate=False,
            ),
        ),
    ),
    "deepseek_v3": dict(config=DEEPSEEK),
    # mscale differing from mscale_all_dim: cos and sin scaled by their
    # ratio, the softmax by m(f, mscale_all_dim) ** 2.
    "deepseek_mscale_ratio": dict(
        config=dict(
            DEEPSEEK,
            rope_scaling=dict(
                type="yarn",
                factor=40.0,
                original_max_position_embeddings=4096,
                mscale=0.707,
                mscale_all_dim=1.3,
            ),
        ),
    ),
    # A null factor, derived from the lengths (131072 / 8192), beta 32 / 1
    # and truncate by default; half of each head rotated; a lone `mscale`
    # (no effect).
    "defaults_partial": dict(
        config=dict(
            LLAMA,
            partial_rotary_factor=0.5,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=5e5,
                factor=None,
                original_max_position_embeddings=8192,
                mscale=0.5,
            ),
        ),
    ),
    # RoPE dicts per layer type (Gemma 3's layout): transformers reads
    # `truncate` from the top-level dict only, so it is on here.
    "nested_truncate": dict(
        config=dict(
            LLAMA,
            model_type="gemma3_text",
            num_hidden_layers=2,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters=dict(
                full_attention=dict(
                    rope_type="yarn",
                    rope_theta=1e6,
                    factor=8.0,
                    original_max_position_embeddings=4096,
                    truncate=False,
                ),
                sliding_attention=dict(rope_type="default", rope_theta=1e4),
            ),
        ),
        layer_type="full_attention",
    ),
    # An explicit attention_factor equal to its default is read.
    "explicit_default_factor": dict(
        config=dict(
            LLAMA,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=1e4,
                factor=4.0,
                original_max_position_embeddings=2048,
                attention_factor=0.1 * float(np.log(4.0)) + 1.0,
                beta_fast=16,
                beta_slow=2,
            ),
        ),
    ),
}


@pytest.fixture(scope="module")
def reference():
    if importlib.util.find_spec("transformers") is None:  # pragma: no cover
        pytest.skip("transformers is not installed")
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "yarn.npz")
        subprocess.run(
            [sys.executable, "-c", _SCRIPT, json.dumps(CASES), path],
            check=True,
            env=env,
            timeout=300,
        )
        with np.load(path) as data:
            return {k: data[k] for k in data.files}


def np_rope(x, inv_freq, factor, positions):
    """Halves rotated by `positions * inv_freq`, cos and sin times
    `factor` (transformers' `apply_rotary_pos_emb`)."""
    angles = positions[:, None] * inv_freq[None].astype("float64")
    cos, sin = np.cos(angles) * factor, np.sin(angles) * factor
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[None, :, None], sin[None, :, None]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


@transformers_tier
@pytest.mark.parametrize("name", sorted(CASES))
def test_yarn_equals_transformers(reference, name):
    case = CASES[name]
    rope = configs.rope_arguments(
        configs.HFConfig(case["config"]), case.get("layer_type")
    )
    scaling = rope["rotary_scaling"]
    assert scaling["rope_type"] == "yarn"
    dim = int(HEAD_DIM * rope["rotary_fraction"])
    inv_freq = reference[name + "/inv_freq"]
    assert inv_freq.shape == (dim // 2,)
    # Our layers: `RotaryEmbedding` (its YaRN cos/sin factor m(f, 1)),
    # times MLA's correction for DeepSeek's mscale ratio.
    correction, softmax = _latent_rotary.yarn_factors(scaling)
    layer = RotaryEmbedding(
        max_wavelength=rope["rotary_max_wavelength"],
        **_latent_rotary.rotary_arguments(scaling),
    )
    positions = np.array([0, 1, 5, 17, 300], "float32")
    x = np.random.default_rng(0).normal(size=(1, len(positions), 2, dim))
    ours = np.asarray(layer(x.astype("float32"), positions=positions))
    want = np_rope(
        x, inv_freq, reference[name + "/attention_factor"], positions
    )
    # Angles up to 300 rad in float32.
    np.testing.assert_allclose(ours * correction, want, atol=5e-4)
    np.testing.assert_allclose(ours[:, :3] * correction, want[:, :3], atol=2e-5)
    np.testing.assert_allclose(
        _latent_rotary.yarn_mscale(scaling["scaling_factor"]) * correction,
        reference[name + "/attention_factor"],
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        softmax, reference[name + "/softmax"], rtol=1e-12
    )


@transformers_tier
def test_yarn_frequencies_equal_transformers(reference):
    """The frequencies themselves, to float32 rounding (all cases)."""
    from keras_attention.layers.rotary_embedding import inverse_frequencies

    for name, case in CASES.items():
        rope = configs.rope_arguments(
            configs.HFConfig(case["config"]), case.get("layer_type")
        )
        dim = int(HEAD_DIM * rope["rotary_fraction"])
        ours = inverse_frequencies(
            dim,
            rope["rotary_max_wavelength"],
            **_latent_rotary.rotary_arguments(rope["rotary_scaling"]),
        )
        np.testing.assert_allclose(
            ours, reference[name + "/inv_freq"], rtol=2e-6, err_msg=name
        )


@pytest.mark.parametrize(
    "params, match",
    [
        (dict(factor=4.0, attention_factor=2.0), "attention_factor=2.0"),
        (dict(factor=4.0, extrapolation=1.0), r"\['extrapolation'\]"),
        (dict(factor=0.5), "factor=0.5"),
    ],
)
def test_yarn_options_it_cannot_apply_are_refused(params, match):
    config = configs.HFConfig(
        dict(
            LLAMA,
            rope_parameters=dict(
                params,
                rope_type="yarn",
                original_max_position_embeddings=64,
                rope_theta=1e4,
            ),
        )
    )
    with pytest.raises(ValueError, match=match):
        configs.rope_arguments(config)


def test_yarn_of_factor_one_is_plain_rope():
    config = configs.HFConfig(
        dict(LLAMA, rope_parameters=dict(rope_type="yarn", factor=1.0))
    )
    assert configs.rope_arguments(config)["rotary_scaling"] is None
