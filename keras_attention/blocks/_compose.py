"""Blocks by composition (private to `blocks`): the sublayers a block is
given as layers, the block's options each sublayer is built from, and the
self-attention's call as each kind of layer takes it.

A block has three sublayers: its self-attention (any token mixer:
`MultiHeadAttention` and its subclasses, `MultiHeadLatentAttention`,
`LinearAttention`, `GatedDeltaNet`, `KimiDeltaAttention`, a user's
`TokenMixer`), its feed-forward (`FeedForward`, `MixtureOfExperts`, any
Keras layer) and, in a decoder block, its cross-attention
(`CrossAttention`). Each is either
given as a layer or built by the block from its options. An option that
configures only sublayers given as layers cannot apply, and is refused
naming it and the layer; an option that configures none that are built
is left out of the block's config.
"""

import keras

from keras_attention.blocks import _latent
from keras_attention.blocks import _mixer
from keras_attention.layers.cross_attention import CrossAttention
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.layers.multi_head_latent_attention import (
    MultiHeadLatentAttention,
)
from keras_attention.layers.self_attention import SelfAttention
from keras_attention.utils import validation

SELF, CROSS, FEED_FORWARD = "self_attention", "cross_attention", "feed_forward"

# The block's options that configure its sublayers: their unset values
# and the sublayers built from them. (`dropout` also sets the residual
# dropouts, and the norms' options the block's norms: always used.)
OPTIONS = {
    "num_heads": (None, (SELF, CROSS)),
    "intermediate_dim": (None, (FEED_FORWARD,)),
    "key_dim": (None, (SELF, CROSS)),
    "num_key_value_heads": (None, (SELF, CROSS)),
    "activation": ("relu", (FEED_FORWARD,)),
    "rotary_max_wavelength": (None, (SELF,)),
    "kernel_initializer": ("glorot_uniform", (SELF, CROSS, FEED_FORWARD)),
    "bias_initializer": ("zeros", (SELF, CROSS, FEED_FORWARD)),
    "window_size": (None, (SELF,)),
    "score_mod": (None, (SELF,)),
    "mask_mod": (None, (SELF,)),
    "use_bias": (True, (SELF, CROSS, FEED_FORWARD)),
    "gated_feed_forward": (False, (FEED_FORWARD,)),
    "rotary_scaling": (None, (SELF,)),
    "attention_scale": (None, (SELF, CROSS)),
    "qk_norm": (None, (SELF, CROSS)),
    "qk_norm_epsilon": (None, (SELF, CROSS)),
    "learned_sinks": (False, (SELF, CROSS)),
    "rotary_fraction": (1.0, (SELF,)),
    "moe": (None, (FEED_FORWARD,)),
    "mixer": ("attention", (SELF,)),
    "mixer_options": (None, (SELF,)),
    "latent_attention": (None, (SELF,)),
    "attention_output_gate": (False, (SELF,)),
    "global_projections": (False, (SELF,)),
    "max_global_tokens": (None, (SELF,)),
}


def check_layer(name, layer, allow_none=True):
    """`layer`, a Keras layer (or None), else a `TypeError`."""
    if layer is None and allow_none:
        return None
    if not isinstance(layer, keras.layers.Layer):
        raise TypeError(
            f"`{name}` must be a Keras layer instance (or None: built from "
            f"the block's options). Received: {name}={layer!r}"
        )
    return layer


def check_cross_attention(cross_attention):
    """The decoder's `cross_attention`: `(present, layer or None)`."""
    if isinstance(cross_attention, keras.layers.Layer):
        if not isinstance(cross_attention, CrossAttention):
            raise TypeError(
                "`cross_attention` must be a bool or a "
                "keras_attention.layers.CrossAttention (it attends from "
                "the block's sequence to a `context`). Received: "
                f"cross_attention={cross_attention!r}"
            )
        return True, cross_attention
    return validation.check_bool("cross_attention", cross_attention), None


def _is_unset(value, unset):
    if value is unset:
        return True
    try:
        return bool(value == unset)
    except Exception:  # An array-like: set.
        return False


def unused_options(given, present):
    """The options no built sublayer reads: each configures only sublayers
    that are `given` as layers (names) or not `present` (names)."""
    built = set(present) - set(given)
    return [
        name for name, (_, users) in OPTIONS.items() if not built & set(users)
    ]


def check_options(options, given, present):
    """Refuses an option (`options`: name -> value as passed) that is set
    although every sublayer it configures is given as a layer
    (`given`: name -> layer) or absent; names it and the layers."""
    for name in unused_options(given, present):
        if name not in options:
            continue
        value, unset = options[name], OPTIONS[name][0]
        if _is_unset(value, unset):
            continue
        users = [user for user in OPTIONS[name][1] if user in present]
        layers = ", ".join(f"{user}={given[user]!r}" for user in users)
        raise ValueError(
            f"`{name}` configures the block's {' and '.join(users) or 'no'} "
            "sublayer built from its options, but that sublayer is given "
            f"as a layer: `{name}` cannot apply (configure the layer "
            f"itself). Received: {name}={value!r}, {layers}"
        )


def check_required(block, moe, given, present):
    """`num_heads` and `intermediate_dim` where a sublayer is built from
    them (`moe` may give the experts' own), else a `ValueError`."""
    built = set(present) - set(given)
    if block.num_heads is None and built & {SELF, CROSS}:
        what = " and ".join(sorted(built & {SELF, CROSS}))
        raise ValueError(
            f"`num_heads` is required: the block builds its {what} from "
            "its options (or pass the layer itself, e.g. "
            "`self_attention=keras_attention.layers.SelfAttention(...)`). "
            "Received: num_heads=None"
        )
    own_size = isinstance(moe, dict) and "intermediate_dim" in moe
    if (
        FEED_FORWARD in built
        and block.intermediate_dim is None
        and not own_size
    ):
        raise ValueError(
            "`intermediate_dim` is required: the block builds its "
            "feed-forward from its options (or pass "
            "`feed_forward=<layer>`). Received: intermediate_dim=None"
        )


def check_causal(layer, causal):
    """Refuses a given self-attention `layer` whose own `causal` (where it
    has one: `SelfAttention`, `LocalSelfAttention`) differs from the
    block's `causal` (a decoder block's is always True)."""
    own = getattr(layer, "causal", None)
    if isinstance(own, bool) and own != causal:
        raise ValueError(
            f"The given self_attention is causal={own!r} and the block "
            f"causal={causal!r}: they must agree. Received: "
            f"causal={causal!r}, self_attention={layer!r}"
        )


def build_layer(layer, inputs_shape):
    """Builds a sublayer on the block's input shape, if not built yet: a
    `MultiHeadAttention` that is not a `SelfAttention` from the query and
    value shapes, any other layer from `inputs_shape`."""
    if layer.built:
        return
    plain_attention = isinstance(layer, MultiHeadAttention) and not (
        isinstance(layer, SelfAttention)
    )
    if plain_attention:
        layer.build(inputs_shape, inputs_shape)
    else:
        layer.build(inputs_shape)


def kind(layer):
    """The self-attention's kind for the block's call: `"attention"`
    (`MultiHeadAttention` and its subclasses), `"latent"`
    (`MultiHeadLatentAttention`), `"mixer"` (the layers of
    `_mixer.MIXERS`: `LinearAttention`, `GatedDeltaNet`,
    `KimiDeltaAttention`) or `"protocol"` (any other token mixer)."""
    if isinstance(layer, MultiHeadAttention):
        return "attention"
    if isinstance(layer, MultiHeadLatentAttention):
        return "latent"
    if _mixer.is_mixer(layer):
        return "mixer"
    return "protocol"


# Call arguments of the block's self-attention that a user's token mixer
# (`TokenMixer`'s call) does not take.
_NOT_IN_PROTOCOL = (
    "attention_mask",
    "mod_inputs",
    "segment_ids",
    "positions",
    "cache_sink_tokens",
    "global_mask",
)


def self_attention_call(block, inputs, kwargs):
    """`(args, kwargs)` of the block's self-attention call: the block's
    arguments (`mask`, `attention_mask`, `return_attention_scores`,
    `cache`, `cache_update_index`, ...) as its layer takes them."""
    layer = block.self_attention
    layer_kind = kind(layer)
    if layer_kind == "latent":
        return (inputs,), _latent.latent_call_kwargs(kwargs, block.causal)
    if layer_kind == "mixer":
        return (inputs,), _mixer.mixer_call_kwargs(layer, block.causal, kwargs)
    if layer_kind == "attention":
        if isinstance(layer, SelfAttention):
            return (inputs,), kwargs
        kwargs = dict(kwargs)
        mask = kwargs.pop("mask", None)
        if kwargs.pop("global_mask", None) is not None:
            raise ValueError(
                "`global_mask` needs a LocalSelfAttention self-attention. "
                f"Received: self_attention={layer!r}"
            )
        kwargs.update(
            query_mask=mask, value_mask=mask, use_causal_mask=block.causal
        )
        return (inputs, inputs), kwargs
    return (inputs,), _protocol_call_kwargs(layer, kwargs)


def protocol_call(block, inputs, cache, index, padding_mask, training):
    """The block's self-attention called with its cache (the `TokenMixer`
    protocol): `layer(inputs, cache=, cache_update_index=, padding_mask=,
    training=)`, except a `MultiHeadAttention` that is not a
    `SelfAttention`, which attends from `inputs` to `inputs` with the
    block's causality. Returns `(outputs, cache)`."""
    layer = block.self_attention
    if kind(layer) == "attention" and not isinstance(layer, SelfAttention):
        return layer(
            inputs,
            inputs,
            query_mask=padding_mask,
            value_mask=padding_mask,
            use_causal_mask=block.causal,
            cache=cache,
            cache_update_index=index,
            training=training,
        )
    return layer(
        inputs,
        cache=cache,
        cache_update_index=index,
        padding_mask=padding_mask,
        training=training,
    )


def _protocol_call_kwargs(layer, kwargs):
    """A user's token mixer takes `padding_mask`, `training` and, with a
    cache, `cache` and `cache_update_index` (`TokenMixer`)."""
    kwargs = dict(kwargs)
    for name in _NOT_IN_PROTOCOL:
        value = kwargs.pop(name, None)
        if value is not None:
            shown = getattr(value, "shape", value)
            raise ValueError(
                f"The self-attention {type(layer).__name__} is a token "
                "mixer of the `TokenMixer` protocol, whose call takes "
                "`padding_mask` and a cache only: "
                f"`{name}` cannot apply. Received: {name}={shown!r}"
            )
    if kwargs.pop("return_attention_scores", False):
        raise ValueError(
            f"The self-attention {type(layer).__name__} returns no "
            "attention weights. Received: return_attention_scores=True"
        )
    out = {"padding_mask": kwargs.pop("mask", None)}
    if kwargs.get("cache") is not None:
        out["cache"] = kwargs.pop("cache")
        out["cache_update_index"] = kwargs.pop("cache_update_index", None)
    return out


def serialize_given(config, given, present):
    """The block's `config` with its given sublayers as nested configs and
    the options no built sublayer reads left out."""
    for name in unused_options(given, present):
        config.pop(name, None)
    for name, layer in given.items():
        config[name] = keras.saving.serialize_keras_object(layer)
    return config


def deserialize_given(config):
    """A copy of a block config with its nested sublayer configs made
    layers again."""
    config = dict(config)
    for name in (SELF, CROSS, FEED_FORWARD):
        if isinstance(config.get(name), dict):
            config[name] = keras.saving.deserialize_keras_object(config[name])
    return config
