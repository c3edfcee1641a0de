"""The blocks' `mixer` option (private to `blocks`): the self-attention
sublayer replaced by a linear-time token mixer, `LinearAttention`
(`mixer="linear"`) or `GatedDeltaNet` (`mixer="gated_delta"`), its
checks, and the block's self-attention arguments as the mixer takes
them.

A mixer keeps a recurrent state instead of keys and values: it has no
window, score or mask objects, rotary positions, QK-norm, sinks, key
heads shared across queries, attention scale or attention mask, so the
block's arguments for those are refused beside it rather than ignored.
The mixer sits where the self-attention does (the attribute and weight
path `self_attention`), with the same norm, residual and dropout around
it.
"""

import inspect

import keras

from keras_attention.layers.gated_delta_net import GatedDeltaNet
from keras_attention.layers.linear_attention import LinearAttention
from keras_attention.utils import keras_utils

# `mixer=` -> the layer of the self-attention sublayer (None: the block's
# attention layer).
MIXERS = {
    "attention": None,
    "linear": LinearAttention,
    "gated_delta": GatedDeltaNet,
}

# Arguments of each mixer layer that the block gives.
FROM_BLOCK = {
    "linear": (
        "num_heads",
        "key_dim",
        "kernel_initializer",
        "bias_initializer",
        "dtype",
        "name",
    ),
    "gated_delta": ("hidden_size", "kernel_initializer", "dtype", "name"),
}

# The block's arguments that cannot apply to a mixer, and their unset
# values (`key_dim` is `LinearAttention`'s head size, refused beside
# `GatedDeltaNet`, whose head sizes are its own arguments).
REFUSED = dict(
    num_key_value_heads=None,
    window_size=None,
    score_mod=None,
    mask_mod=None,
    qk_norm=None,
    qk_norm_epsilon=None,
    learned_sinks=False,
    attention_output_gate=False,
    rotary_max_wavelength=None,
    rotary_scaling=None,
    rotary_fraction=1.0,
    attention_scale=None,
    latent_attention=None,
)


def _required(layer_class):
    """The arguments `layer_class` needs (no default)."""
    parameters = inspect.signature(layer_class.__init__).parameters
    return [
        name
        for name, p in parameters.items()
        if name != "self"
        and p.default is inspect.Parameter.empty
        and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]


def check_mixer(mixer, mixer_options, block):
    """The blocks' `(mixer, mixer_options)`, checked: `mixer` one of
    `MIXERS`; `mixer_options` None with `"attention"`, else None or a
    dict of the mixer layer's own arguments (checked by building one),
    returned as a plain dict (`LinearAttention`'s `use_bias` defaulting
    to the block's).

    The block's arguments of `REFUSED` (read from `block`, whose
    `__init__` set them; `key_dim` too beside `"gated_delta"`) cannot
    apply to a mixer: one that is set is refused, naming it and its
    value.
    """
    if not isinstance(mixer, str) or mixer not in MIXERS:
        raise ValueError(
            f"`mixer` must be one of {tuple(MIXERS)!r}. "
            f"Received: mixer={mixer!r}"
        )
    if mixer == "attention":
        if mixer_options is not None:
            raise ValueError(
                "`mixer_options` are the arguments of a linear-time mixer "
                '(mixer="linear" or "gated_delta"); the attention layer '
                "takes the block's own arguments. Received: "
                f"mixer={mixer!r}, mixer_options={mixer_options!r}"
            )
        return mixer, None
    layer_class = MIXERS[mixer]
    if mixer_options is None:
        mixer_options = {}
    if not isinstance(mixer_options, dict):
        raise TypeError(
            "`mixer_options` must be None or a dict of "
            f"{layer_class.__name__} arguments. Received: "
            f"mixer_options={mixer_options!r}"
        )
    refused = sorted(set(FROM_BLOCK[mixer]) & set(mixer_options))
    if refused:
        raise ValueError(
            f"`mixer_options` takes {layer_class.__name__}'s own "
            f"arguments; {refused} come from the block. Received: "
            f"mixer={mixer!r}, mixer_options={mixer_options!r}"
        )
    refused = dict(REFUSED)
    if mixer == "gated_delta":
        refused["key_dim"] = None
    for name, unset in refused.items():
        value = getattr(block, name, unset)
        if value is not unset and value != unset:
            raise ValueError(
                f"With mixer={mixer!r} the self-attention is a "
                f"{layer_class.__name__}, a recurrent token mixer with no "
                "window, score or mask objects, rotary positions, QK-norm, "
                "sinks, shared key heads, scale or latent attention: "
                f"`{name}` cannot apply. Received: {name}={value!r}, "
                f"mixer={mixer!r}"
            )
    options = dict(mixer_options)
    if mixer == "linear":
        options.setdefault("use_bias", block.use_bias)
        LinearAttention(num_heads=block.num_heads, key_dim=1, **options)
    else:
        sizes = [
            name
            for name in _required(GatedDeltaNet)
            if name not in FROM_BLOCK[mixer]
        ]
        missing = [name for name in sizes if name not in options]
        if missing and len(missing) < len(sizes):
            raise ValueError(
                f"`mixer_options` of mixer={mixer!r} gives the GatedDeltaNet "
                "head layout whole or not at all (then one key and one "
                "value head per block head, of size features // "
                f"num_heads); it lacks {missing}. Received: "
                f"mixer_options={mixer_options!r}"
            )
        defaults = dict.fromkeys(missing, 1)  # sized at build
        GatedDeltaNet(hidden_size=1, **defaults, **options)  # its checks
    return mixer, options


def check_causal(block, layer=None):
    """Raises `ValueError` when the block's mixer (from its options, or
    the given self-attention `layer`) cannot run with its `causal` (an
    encoder block's argument): the gated delta rule and a decaying linear
    attention read the past only."""
    if block.causal:
        return
    if layer is not None:
        decay = getattr(layer, "decay", None)
        if isinstance(layer, GatedDeltaNet) or (
            isinstance(layer, LinearAttention) and decay is not None
        ):
            raise ValueError(
                f"The self-attention {type(layer).__name__} runs in one "
                "direction (a state carried from token to token): it "
                f"needs causal=True. Received: causal={block.causal!r}, "
                f"self_attention={layer!r}"
            )
        return
    if block.mixer == "attention":
        return
    decay = (block.mixer_options or {}).get("decay")
    if block.mixer == "gated_delta" or decay is not None:
        what = "the gated delta rule" if decay is None else f"decay={decay!r}"
        raise ValueError(
            f"With mixer={block.mixer!r}, {what} runs in one direction "
            "(a state carried from token to token): it needs causal=True. "
            f"Received: causal={block.causal!r}, mixer={block.mixer!r}, "
            f"mixer_options={block.mixer_options!r}"
        )


def make_mixer(block, hidden_dim):
    """The block's mixer layer, named `self_attention` (the weight path of
    saved files)."""
    clone = keras_utils.clone_initializer
    common = dict(
        kernel_initializer=clone(block.kernel_initializer),
        dtype=block.dtype_policy,
        name="self_attention",
    )
    if block.mixer == "linear":
        return LinearAttention(
            num_heads=block.num_heads,
            key_dim=block._head_dim(hidden_dim),
            bias_initializer=clone(block.bias_initializer),
            **block.mixer_options,
            **common,
        )
    options = dict(block.mixer_options)
    if "linear_num_key_heads" not in options:  # sizes from the block
        head_dim = block._head_dim(hidden_dim)
        options.update(
            linear_num_key_heads=block.num_heads,
            linear_num_value_heads=block.num_heads,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
        )
    return GatedDeltaNet(hidden_size=hidden_dim, **options, **common)


# Call arguments of the block's self-attention that a mixer cannot take,
# and why.
_CANNOT = {
    "attention_mask": "an attention mask (a mixer weighs no key pairs: "
    "pass `padding_mask`, or `segment_ids` for packed documents)",
    "mod_inputs": "inputs of score or mask objects",
    "positions": "rotary positions",
    "cache_sink_tokens": "a rolling cache",
    "global_mask": "global tokens",
}


def mixer_call_kwargs(layer, causal, kwargs):
    """The block's self-attention arguments (`mask`, `attention_mask`,
    `cache`, `cache_update_index`, `segment_ids`, ...) as the mixer's
    `call` takes them: `mask` as `query_mask` (`LinearAttention`) or
    `mask` (`GatedDeltaNet`), `causal` as `use_causal_mask`
    (`LinearAttention`); the index is dropped (the state does not depend
    on it). Arguments a mixer cannot take are refused when given."""
    kwargs = dict(kwargs)
    for name, what in _CANNOT.items():
        value = kwargs.pop(name, None)
        if value is not None:
            shown = getattr(value, "shape", value)
            raise ValueError(
                f"A block with mixer={_name(layer)!r} takes no {what}. "
                f"Received: {name}={shown!r}"
            )
    kwargs.pop("cache_update_index", None)
    mask = kwargs.pop("mask", None)
    if kwargs.get("cache") is None:
        kwargs.pop("cache", None)
    if isinstance(layer, LinearAttention):
        kwargs["query_mask"] = mask
        kwargs["use_causal_mask"] = causal
    else:
        kwargs["mask"] = mask
    return kwargs


def _name(layer):
    """The `mixer=` name of a mixer layer."""
    return "linear" if isinstance(layer, LinearAttention) else "gated_delta"


def serialized_options(options):
    """`mixer_options` for a config: a callable feature map serialized."""
    if options is None:
        return None
    options = dict(options)
    if callable(options.get("feature_map")):
        options["feature_map"] = keras.saving.serialize_keras_object(
            options["feature_map"]
        )
    return options
