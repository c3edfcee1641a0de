"""Reading a Hugging Face `config.json` into block arguments, written
once for every family: `HFConfig` (required fields, options refused by
name), the rotary embedding in both config layouts (`rope_arguments`)
and the activation (`activation`).

Two layouts of the rotary settings exist: transformers 4's `rope_theta`
and `rope_scaling` (`{"type" or "rope_type": ..., "factor": ...}`) at
the config's top level, and transformers 5's `rope_parameters` (the same
keys and `rope_theta` in one dict, or one dict per kind of layer:
`{"full_attention": {...}, "sliding_attention": {...}}`). Both read the
same here. A RoPE type or key this module does not know is refused
(`ValueError` naming it), never ignored.
"""

import math

from keras_attention.layers.activations import gelu_approximate

# transformers' `hidden_act` names -> our activation. "gelu" is the exact
# (erf) GELU; "gelu_pytorch_tanh" and "gelu_new" the tanh approximation.
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_pytorch_tanh": gelu_approximate,
    "gelu_new": gelu_approximate,
    "relu": "relu",
}

# RoPE types -> the keys of their dicts that are read (every other key
# is refused); `rope_theta`, `partial_rotary_factor` and the type's own
# name are read for every type.
ROPE_KEYS = {
    "default": (),
    "linear": ("factor",),
    "llama3": (
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ),
    "longrope": (
        "short_factor",
        "long_factor",
        "factor",
        "original_max_position_embeddings",
    ),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "attention_factor",
        "truncate",
        "mscale",
        "mscale_all_dim",
    ),
}
_ROPE_COMMON = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
# Keys a config may carry with a value that changes nothing.
_NEUTRAL = {"attention_factor": (None,), "mscale": (None,)}
LAYER_TYPES = ("full_attention", "sliding_attention")


class HFConfig:
    """A `config.json` (a dict) with the checks a converter needs.

    Args:
        values: the config's dict.
    """

    def __init__(self, values):
        self.values = dict(values)
        self.model_type = self.values.get("model_type")

    def get(self, name, default=None):
        """The config's `name`, `default` when absent or null."""
        value = self.values.get(name)
        return default if value is None else value

    def require(self, name):
        """The config's `name`; `ValueError` naming it when absent."""
        if self.values.get(name) is None:
            raise ValueError(
                f"config.json of model_type {self.model_type!r} has no "
                f"`{name}`, which its converter needs."
            )
        return self.values[name]

    def refuse(self, name, supported, default=None):
        """The config's `name` (`default` when absent), `ValueError`
        naming it unless one of `supported`: an option the converter
        does not implement is refused, never ignored."""
        value = self.get(name, default)
        if value not in supported:
            raise ValueError(
                f"config.json of model_type {self.model_type!r}: "
                f"{name}={value!r} is not supported by its converter "
                f"(supported: {list(supported)!r})."
            )
        return value

    def head_dim(self):
        """The heads' size: `head_dim`, else `hidden_size //
        num_attention_heads`."""
        return int(
            self.get(
                "head_dim",
                self.require("hidden_size")
                // self.require("num_attention_heads"),
            )
        )

    def layer_types(self, default):
        """`layer_types` (one of `LAYER_TYPES` per layer), else
        `default` (a list); `ValueError` for another length or kind."""
        types = list(self.get("layer_types", default))
        layers = int(self.require("num_hidden_layers"))
        unknown = sorted(set(types) - set(LAYER_TYPES))
        if len(types) != layers or unknown:
            raise ValueError(
                f"config.json of model_type {self.model_type!r}: "
                f"layer_types={types!r} must give one of {LAYER_TYPES} for "
                f"each of its {layers} layers."
            )
        return types


def activation(config, name="hidden_act", default=None):
    """Our activation for the config's `name` (`ACTIVATIONS`; `ValueError`
    for another)."""
    value = config.get(name, default)
    if value not in ACTIVATIONS:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            f"{name}={value!r} is not supported (supported: "
            f"{sorted(ACTIVATIONS)!r})."
        )
    return ACTIVATIONS[value]


def rope_dict(config, layer_type=None, default_theta=10000.0):
    """The rotary settings of layers of `layer_type` as one dict with
    `rope_type` and `rope_theta` (either layout; nested by layer type or
    not)."""
    params = config.get("rope_parameters")
    if params is None:  # transformers 4: top-level fields
        params = dict(config.get("rope_scaling") or {})
    else:
        params = dict(params)
    nested = [key for key in params if key in LAYER_TYPES]
    if nested:
        params = dict(params.get(layer_type or "full_attention") or {})
    kind = params.get("rope_type", params.get("type", "default"))
    params["rope_type"] = kind
    params.setdefault("rope_theta", config.get("rope_theta", default_theta))
    if "partial_rotary_factor" not in params:
        factor = config.get("partial_rotary_factor")
        if factor is not None:
            params["partial_rotary_factor"] = factor
    return params


def rope_arguments(config, layer_type=None, default_theta=10000.0):
    """The self-attention's rotary arguments for layers of `layer_type`
    (None: the model's only kind): `rotary_max_wavelength`,
    `rotary_scaling` (None, or `RotaryEmbedding`'s context-extension
    dict) and `rotary_fraction`.

    Types: "default", "linear" (position interpolation), "llama3" (Llama
    3.1's frequency adjustment), "longrope" (Phi-3's LongRoPE; the
    config's top-level `original_max_position_embeddings` takes
    precedence, as transformers'), "yarn" (YaRN as transformers'
    `_compute_yarn_parameters`, with DeepSeek's `mscale` and
    `mscale_all_dim`: `yarn_scaling`). Others ("dynamic", ...: add one
    with a family test that checks it against transformers) and keys not
    read for the type are refused (`ValueError` naming them).

    Example:

    >>> from keras_attention.interop.hf.configs import HFConfig
    >>> from keras_attention.interop.hf.configs import rope_arguments
    >>> config = HFConfig({"model_type": "llama", "rope_theta": 5e5,
    ...     "rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    >>> rope_arguments(config)["rotary_scaling"]
    {'scaling_factor': 4.0}
    """
    params = rope_dict(config, layer_type, default_theta)
    kind = params["rope_type"]
    if kind not in ROPE_KEYS:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: RoPE type "
            f"{kind!r} is not supported (supported: {sorted(ROPE_KEYS)!r})."
        )
    known = set(ROPE_KEYS[kind]) | set(_ROPE_COMMON)
    extra = sorted(
        key
        for key, value in params.items()
        if key not in known and value not in _NEUTRAL.get(key, ())
    )
    if extra:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: RoPE "
            f"({kind!r}) keys {extra!r} are not supported (read: "
            f"{sorted(known)!r})."
        )
    out = {
        "rotary_max_wavelength": float(params["rope_theta"]),
        "rotary_scaling": _SCALINGS[kind](config, params),
        "rotary_fraction": float(params.get("partial_rotary_factor", 1.0)),
    }
    return out


def _original_length(config, params):
    return int(
        config.get(
            "original_max_position_embeddings",
            params.get(
                "original_max_position_embeddings",
                config.require("max_position_embeddings"),
            ),
        )
    )


def _longrope(config, params):
    original = _original_length(config, params)
    factor = params.get("factor")
    if factor is None:
        factor = config.require("max_position_embeddings") / original
    return {
        "rope_type": "longrope",
        "short_factor": [float(f) for f in params["short_factor"]],
        "long_factor": [float(f) for f in params["long_factor"]],
        "original_max_position_embeddings": original,
        "scaling_factor": max(1.0, float(factor)),
    }


def _llama3(config, params):
    return {
        "rope_type": "llama3",
        "scaling_factor": float(params["factor"]),
        "low_freq_factor": float(params["low_freq_factor"]),
        "high_freq_factor": float(params["high_freq_factor"]),
        "original_max_position_embeddings": int(
            params["original_max_position_embeddings"]
        ),
    }


def _linear(config, params):
    factor = float(params["factor"])
    return None if factor == 1.0 else {"scaling_factor": factor}


def _yarn_mscale(factor, mscale=1.0):
    """transformers' `yarn_get_mscale`: `0.1 * mscale * ln(factor) + 1`
    (1 for `factor <= 1`)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_scaling(config, params):
    """The `rotary_scaling` of a "yarn" RoPE dict `params` (`rope_dict`),
    equal to transformers' `_compute_yarn_parameters`: `factor` (None:
    `max_position_embeddings / original_max_position_embeddings`; at
    least 1: a factor of 1 is plain RoPE, None here),
    `original_max_position_embeddings` (the config's top-level one
    first, then the dict's, then `max_position_embeddings`),
    `beta_fast` / `beta_slow` (32 / 1 when absent or 0), `truncate`
    (default True; read, as transformers reads it, from a flat RoPE
    dict only: with RoPE dicts per layer type it is True, and the
    length is the layer type's own), and DeepSeek's
    `mscale` and `mscale_all_dim` (kept when `mscale_all_dim` is
    non-zero, as `MultiHeadLatentAttention` reads them: cos and sin scaled by
    `m(factor, mscale) / m(factor, mscale_all_dim)` when both are given,
    the softmax scale by `m(factor, mscale_all_dim) ** 2`; a
    `MultiHeadAttention` refuses them).

    cos and sin are scaled by transformers' `attention_factor`, whose
    default our layers compute (`0.1 ln(factor) + 1`, or DeepSeek's ratio
    above); a config's explicit `attention_factor` is read when it is
    that default (within 1e-6) and refused (`ValueError` naming it)
    otherwise.
    """
    flat = config.get("rope_parameters", config.get("rope_scaling")) or {}
    nested = any(key in LAYER_TYPES for key in flat)
    original = _original_length(config, params)
    if nested:  # transformers reads the top-level length for flat ones only
        original = int(
            params.get(
                "original_max_position_embeddings",
                config.require("max_position_embeddings"),
            )
        )
    factor = params.get("factor")
    if factor is None:
        factor = config.require("max_position_embeddings") / original
    factor = float(factor)
    if factor < 1:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: YaRN "
            f"factor={factor!r} is not supported (supported: >= 1)."
        )
    mscales = {}
    if params.get("mscale_all_dim"):  # a lone `mscale` changes nothing
        mscales = {k: float(params[k]) for k in _MSCALES if params.get(k)}
    default = _yarn_mscale(factor)
    if len(mscales) == 2:
        default = _yarn_mscale(factor, mscales["mscale"]) / _yarn_mscale(
            factor, mscales["mscale_all_dim"]
        )
    given = params.get("attention_factor")
    if given is not None and abs(float(given) - default) > 1e-6 * default:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: YaRN "
            f"attention_factor={given!r} is not supported (supported: "
            f"its default from factor and mscale, {default!r})."
        )
    if factor == 1.0:
        return None  # YaRN of factor 1: plain RoPE, cos and sin unscaled
    return {
        "rope_type": "yarn",
        "scaling_factor": factor,
        "beta_fast": float(params.get("beta_fast") or 32.0),
        "beta_slow": float(params.get("beta_slow") or 1.0),
        "original_max_position_embeddings": original,
        "truncate": True if nested else bool(params.get("truncate", True)),
        **mscales,
    }


_MSCALES = ("mscale", "mscale_all_dim")

_SCALINGS = {
    "default": lambda config, params: None,
    "linear": _linear,
    "llama3": _llama3,
    "longrope": _longrope,
    "yarn": yarn_scaling,
}
