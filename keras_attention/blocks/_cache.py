"""The blocks' side of the cache protocol (`keras_attention.layers.
TokenMixer`; private to `blocks`): a decoder block's cache is the nest of
its sublayers' caches, and its cached call hands each one back to its
sublayer.

A decoder block's cache is `(self_attention_cache,)`, and with
cross-attention `(self_attention_cache, cross_keys_values,
context_mask)`: the self-attention's own cache (`init_cache` of whatever
layer the block's `self_attention` is), the encoder's keys and values
projected once (`compute_cross_attention_cache`) and the context's
padding mask, read only. The block never looks inside the
self-attention's cache.
"""

import keras
from keras import ops

from keras_attention.blocks import _compose
from keras_attention.utils import validation

# Call arguments of a block that a protocol call (`cache=`) cannot take:
# the self-attention's cache keeps its own key mask and positions.
_NOT_WITH_CACHE = (
    "context",
    "context_padding_mask",
    "attention_mask",
    "cross_attention_mask",
    "self_attention_cache",
    "self_attention_cache_update_index",
    "cross_attention_cache",
    "mod_inputs",
    "segment_ids",
    "self_attention_cache_sink_tokens",
    "positions",
)


def cache_window(block):
    """The block's self-attention's `cache_window()` (None when it has
    none: every earlier position)."""
    window = getattr(block.self_attention, "cache_window", None)
    return None if window is None else window()


def overwrites_positions(block, cache):
    """The self-attention's `cache_overwrites_positions` of its part of
    the block's `cache` (False for a layer that does not say)."""
    overwrites = getattr(
        block.self_attention, "cache_overwrites_positions", None
    )
    return callable(overwrites) and bool(overwrites(cache[0]))


def init_block_cache(
    block,
    batch_size,
    max_length,
    dtype=None,
    context=None,
    context_padding_mask=None,
    sink_tokens=None,
):
    """The empty cache of a built decoder block (module docstring).

    `sink_tokens` reaches a windowed self-attention only (a ring of
    `sink_tokens + window + 1` slots); the others keep `max_length`
    positions. `context` (and its optional padding mask) is required
    with cross-attention and refused without."""
    if not block.built:
        raise ValueError(
            f"`init_cache` of block {block.name!r} needs a built block: "
            "call it once first. Received: an unbuilt block"
        )
    attention = block.self_attention
    if not callable(getattr(attention, "init_cache", None)):
        raise TypeError(
            f"The self-attention of block {block.name!r} implements no "
            "cache: it must be a `keras_attention.layers.TokenMixer`. "
            f"Received: self_attention={type(attention).__name__}"
        )
    options = {}
    if sink_tokens is not None and cache_window(block) is not None:
        options["sink_tokens"] = sink_tokens
    dtype = dtype or block.compute_dtype
    cache = (attention.init_cache(batch_size, max_length, dtype, **options),)
    if not block.cross_attention:
        if context is not None:
            raise ValueError(
                "This block has `cross_attention=False` and takes no "
                "context. Received: "
                f"context.shape={getattr(context, 'shape', None)!r}"
            )
        return cache
    if context is None:
        raise ValueError(
            "The cache of a block with `cross_attention=True` holds the "
            "context's keys and values: pass `context`. Received: "
            "context=None"
        )
    context = ops.convert_to_tensor(context)
    if context_padding_mask is None:
        context_padding_mask = ops.ones(ops.shape(context)[:2], "bool")
    validation.check_padding_mask(
        "context_padding_mask", context_padding_mask, context, "context"
    )
    keys_values = block.compute_cross_attention_cache(context)
    return cache + (keys_values, ops.cast(context_padding_mask, "bool"))


def cached_call(block, inputs, cache, index, padding_mask, training, given):
    """A decoder block's protocol call: `(outputs, cache)` for the tokens
    `inputs` at positions `index ..`, `padding_mask` their mask.
    `given`: the block's other call arguments (name -> value), refused
    when set."""
    for name in _NOT_WITH_CACHE:
        if given.get(name) is not None:
            raise ValueError(
                "A block's `cache` (its `init_cache`'s) holds its context and "
                f"masks itself: pass no `{name}` with it. Received: "
                f"{name} given with cache"
            )
    if given.get("return_attention_scores"):
        raise ValueError(
            "`return_attention_scores` cannot apply to a call with a "
            "block's `cache`. Received: return_attention_scores=True"
        )
    expected = 3 if block.cross_attention else 1
    if not isinstance(cache, (tuple, list)) or len(cache) != expected:
        raise ValueError(
            f"`cache` must be the block's `init_cache()`: a tuple of "
            f"{expected}. Received: cache of type {type(cache).__name__!r}"
        )
    validation.check_call_input(
        "inputs", inputs, getattr(block, "_features", None)
    )
    x = inputs
    if not keras.backend.is_float_dtype(x.dtype):
        x = ops.cast(x, block.compute_dtype)
    block_inputs = x  # the feed-forward's, with `parallel_residual`

    def attend(y):
        return _compose.protocol_call(
            block, y, cache[0], index, padding_mask, training
        )

    x, (self_cache,) = block._residual(
        x,
        attend,
        block.self_attention_norm,
        block.self_attention_dropout,
        training,
        post_norm=block.self_attention_post_norm,
    )
    if block.cross_attention:
        x, _ = block._cross_attention_residual(
            x,
            training,
            context=None,
            query_mask=padding_mask,
            context_mask=cache[2],
            cache=cache[1],
        )
    x = block._feed_forward_residual(x, training, padding_mask, block_inputs)
    return x, (self_cache,) + tuple(cache[1:])
