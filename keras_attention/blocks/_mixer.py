"""The blocks' `mixer` option (private to `blocks`): the self-attention
sublayer replaced by a linear-time token mixer, `LinearAttention`
(`mixer="linear"`), `GatedDeltaNet` (`mixer="gated_delta"`) or
`KimiDeltaAttention` (`mixer="kda"`), its checks, and the block's
self-attention arguments as the mixer takes them. One table, `MIXERS`,
holds what differs from one mixer to the next: a new mixer is a row.

A mixer keeps a recurrent state instead of keys and values: it has no
window, score or mask objects, rotary positions, QK-norm, sinks, key
heads shared across queries, attention scale or attention mask, so the
block's arguments for those are refused beside it rather than ignored.
The mixer sits where the self-attention does (the attribute and weight
path `self_attention`), with the same norm, residual and dropout around
it.
"""

import dataclasses

import keras

from keras_attention.layers.gated_delta_net import GatedDeltaNet
from keras_attention.layers.kimi_delta_attention import KimiDeltaAttention
from keras_attention.layers.linear_attention import LinearAttention
from keras_attention.utils import keras_utils

# The head layout of `GatedDeltaNet`, given whole in `mixer_options` or
# not at all (then from the block).
_DELTA_LAYOUT = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
)


def _linear_arguments(block, hidden_dim, options):
    return dict(
        num_heads=block.num_heads,
        key_dim=block._head_dim(hidden_dim),
        bias_initializer=keras_utils.clone_initializer(block.bias_initializer),
    )


def _linear_probe(block, options):
    return dict(num_heads=block.num_heads, key_dim=1)


def _delta_arguments(block, hidden_dim, options):
    arguments = dict(hidden_size=hidden_dim)
    if "linear_num_key_heads" not in options:  # sizes from the block
        head_dim = block._head_dim(hidden_dim)
        arguments.update(
            linear_num_key_heads=block.num_heads,
            linear_num_value_heads=block.num_heads,
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
        )
    return arguments


def _delta_probe(block, options):
    missing = [name for name in _DELTA_LAYOUT if name not in options]
    if missing and len(missing) < len(_DELTA_LAYOUT):
        raise ValueError(
            "`mixer_options` of mixer='gated_delta' gives the "
            "GatedDeltaNet head layout whole or not at all (then one key "
            "and one value head per block head, of size features // "
            f"num_heads); it lacks {missing}. Received: "
            f"mixer_options={options!r}"
        )
    return dict(hidden_size=1, **dict.fromkeys(missing, 1))  # sized at build


def _kda_arguments(block, hidden_dim, options):
    return dict(
        hidden_size=hidden_dim,
        num_heads=block.num_heads,
        head_dim=block._head_dim(hidden_dim),
    )


def _kda_probe(block, options):
    return dict(hidden_size=1, num_heads=block.num_heads, head_dim=1)


@dataclasses.dataclass(frozen=True)
class Mixer:
    """A row of `MIXERS`: how a block builds and calls one mixer layer.

    Attributes:
        layer: the layer class.
        from_block: its arguments the block gives (refused in
            `mixer_options`), besides the initializers, dtype and name.
        arguments: `(block, hidden_dim, options) -> dict`, the values of
            those arguments (sizes from the block).
        probe: `(block, options) -> dict`, stand-in values of those
            arguments to check `options` by building a layer before the
            block knows its width (raises on a layout it cannot take).
        refused: the block's arguments, and their unset values, that
            cannot apply to this mixer beyond `REFUSED`.
        one_direction: `options -> bool`, whether the mixer reads the
            past only (needs `causal=True`).
        mask_argument: the name of the mixer call's padding mask.
        causal_argument: the name of its call's causality flag, or None
            (causal always).
        option_defaults: `block -> dict`, defaults of `mixer_options`
            taken from the block.
    """

    layer: type
    from_block: tuple
    arguments: object
    probe: object
    refused: dict = dataclasses.field(default_factory=dict)
    one_direction: object = lambda options: True
    mask_argument: str = "mask"
    causal_argument: str = None
    option_defaults: object = lambda block: {}


# `mixer=` -> its row (None: the block's attention layer).
MIXERS = {
    "attention": None,
    "linear": Mixer(
        LinearAttention,
        from_block=("num_heads", "key_dim", "bias_initializer"),
        arguments=_linear_arguments,
        probe=_linear_probe,
        one_direction=lambda options: options.get("decay") is not None,
        mask_argument="query_mask",
        causal_argument="use_causal_mask",
        option_defaults=lambda block: dict(use_bias=block.use_bias),
    ),
    "gated_delta": Mixer(
        GatedDeltaNet,
        from_block=("hidden_size",),
        arguments=_delta_arguments,
        probe=_delta_probe,
        # Its head sizes are its own arguments.
        refused=dict(key_dim=None),
    ),
    "kda": Mixer(
        KimiDeltaAttention,
        from_block=("hidden_size", "num_heads", "head_dim"),
        arguments=_kda_arguments,
        probe=_kda_probe,
    ),
}

# The arguments every mixer takes from the block.
_COMMON = ("kernel_initializer", "dtype", "name")

# The block's arguments that cannot apply to a mixer, and their unset
# values.
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


def _row(layer):
    """`(name, row)` of `MIXERS` for a mixer layer: the row of its class
    or its nearest base class; None for another layer."""
    for cls in type(layer).__mro__:
        for name, row in MIXERS.items():
            if row is not None and row.layer is cls:
                return name, row
    return None


def is_mixer(layer):
    """Whether `layer` is one of the `MIXERS` layers (or a subclass)."""
    return _row(layer) is not None


def check_mixer(mixer, mixer_options, block):
    """The blocks' `(mixer, mixer_options)`, checked: `mixer` one of
    `MIXERS`; `mixer_options` None with `"attention"`, else None or a
    dict of the mixer layer's own arguments (checked by building one),
    returned as a plain dict (with the row's defaults from the block,
    `LinearAttention`'s `use_bias`).

    The block's arguments of `REFUSED` and of the row's `refused` (read
    from `block`, whose `__init__` set them) cannot apply to a mixer: one
    that is set is refused, naming it and its value.
    """
    if not isinstance(mixer, str) or mixer not in MIXERS:
        raise ValueError(
            f"`mixer` must be one of {tuple(MIXERS)!r}. "
            f"Received: mixer={mixer!r}"
        )
    if mixer == "attention":
        if mixer_options is not None:
            names = " or ".join(repr(n) for n in MIXERS if n != "attention")
            raise ValueError(
                "`mixer_options` are the arguments of a linear-time mixer "
                f"(mixer={names}); the attention layer "
                "takes the block's own arguments. Received: "
                f"mixer={mixer!r}, mixer_options={mixer_options!r}"
            )
        return mixer, None
    row = MIXERS[mixer]
    layer_class = row.layer
    if mixer_options is None:
        mixer_options = {}
    if not isinstance(mixer_options, dict):
        raise TypeError(
            "`mixer_options` must be None or a dict of "
            f"{layer_class.__name__} arguments. Received: "
            f"mixer_options={mixer_options!r}"
        )
    refused = sorted(set(row.from_block + _COMMON) & set(mixer_options))
    if refused:
        raise ValueError(
            f"`mixer_options` takes {layer_class.__name__}'s own "
            f"arguments; {refused} come from the block. Received: "
            f"mixer={mixer!r}, mixer_options={mixer_options!r}"
        )
    for name, unset in dict(REFUSED, **row.refused).items():
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
    options = dict(row.option_defaults(block), **mixer_options)
    layer_class(**row.probe(block, options), **options)  # its checks
    return mixer, options


def check_causal(block, layer=None):
    """Raises `ValueError` when the block's mixer (from its options, or
    the given self-attention `layer`) cannot run with its `causal` (an
    encoder block's argument): the delta rules and a decaying linear
    attention read the past only (`Mixer.one_direction`)."""
    if block.causal:
        return
    if layer is not None:
        found = _row(layer)
        options = {"decay": getattr(layer, "decay", None)}
        if found is not None and found[1].one_direction(options):
            raise ValueError(
                f"The self-attention {type(layer).__name__} runs in one "
                "direction (a state carried from token to token): it "
                f"needs causal=True. Received: causal={block.causal!r}, "
                f"self_attention={layer!r}"
            )
        return
    row = MIXERS[block.mixer]
    options = block.mixer_options or {}
    if row is not None and row.one_direction(options):
        decay = options.get("decay")
        what = row.layer.__name__ if decay is None else f"decay={decay!r}"
        raise ValueError(
            f"With mixer={block.mixer!r}, {what} runs in one direction "
            "(a state carried from token to token): it needs causal=True. "
            f"Received: causal={block.causal!r}, mixer={block.mixer!r}, "
            f"mixer_options={block.mixer_options!r}"
        )


def make_mixer(block, hidden_dim):
    """The block's mixer layer (its `MIXERS` row's), named
    `self_attention` (the weight path of saved files)."""
    row = MIXERS[block.mixer]
    options = dict(block.mixer_options)
    return row.layer(
        **row.arguments(block, hidden_dim, options),
        **options,
        kernel_initializer=keras_utils.clone_initializer(
            block.kernel_initializer
        ),
        dtype=block.dtype_policy,
        name="self_attention",
    )


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
    `call` takes them: `mask` as its row's `mask_argument`, `causal` as
    its `causal_argument` (`LinearAttention`'s `use_causal_mask`); the
    index is dropped (the state does not depend on it). Arguments a mixer
    cannot take are refused when given."""
    mixer, row = _row(layer)
    kwargs = dict(kwargs)
    for name, what in _CANNOT.items():
        value = kwargs.pop(name, None)
        if value is not None:
            shown = getattr(value, "shape", value)
            raise ValueError(
                f"A block with mixer={mixer!r} takes no {what}. "
                f"Received: {name}={shown!r}"
            )
    kwargs.pop("cache_update_index", None)
    mask = kwargs.pop("mask", None)
    if kwargs.get("cache") is None:
        kwargs.pop("cache", None)
    kwargs[row.mask_argument] = mask
    if row.causal_argument is not None:
        kwargs[row.causal_argument] = causal
    return kwargs


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
