"""The own caches (`TokenMixer` protocol) of the softmax attention layers.

`MultiHeadAttention.init_cache` makes one of two dicts, each keeping its
key mask beside what it caches:

- `{"keys_values", "key_mask"}`: `(batch, 2, max_length, kv_heads,
  key_dim)` keys (`[:, 0]`) and values (`[:, 1]`) of every position, and
  boolean `(batch, max_length)`, True where a written token may be
  attended to;
- `{"keys_values", "slot_mask"}`: a rolling cache of `S = sink_tokens +
  window + 1` slots (`ops.rolling_cache`: the first `sink_tokens`
  positions, then a ring of the latest ones) and the key mask of its
  slots `(batch, S)`; the number of sinks is `S - window - 1`.

`MultiHeadLatentAttention`'s is `{"latent", "key_mask"}`. A call with such
a cache (`open_cache`) writes its tokens' padding mask into the key mask
and runs as a call with the bare cache and that key mask as its
`attention_mask`; `close` puts the updated cache back in the dict.
"""

import keras
from keras import ops

from keras_attention.ops.rolling_cache import rolling_cache_write
from keras_attention.utils import validation
from keras_attention.utils.attention_checks import check_cache_index


def is_own_cache(cache):
    """Whether `cache` is a dict of `init_cache` (not a bare tensor)."""
    return isinstance(cache, dict)


def ring_sinks(cache, window):
    """The sink slots of a rolling own cache (`window`: the layer's
    `cache_window()`), None for any other cache."""
    if not is_own_cache(cache) or "slot_mask" not in cache:
        return None
    return cache["keys_values"].shape[2] - window - 1


def _check_built(layer, batch_size, max_length):
    if not layer.built:
        raise ValueError(
            f"`init_cache` of layer {layer.name!r} needs a built layer (its "
            "heads' shape): call it once first. Received: "
            f"batch_size={batch_size!r}, max_length={max_length!r}"
        )
    if validation.is_int(max_length) or not hasattr(max_length, "shape"):
        return validation.check_positive_int("max_length", max_length)
    return max_length  # a scalar tensor (a buffer of unknown length)


def init_kv_cache(layer, batch_size, max_length, dtype=None, sink_tokens=None):
    """The empty own cache of a `MultiHeadAttention` (module docstring):
    `max_length` positions, or with `sink_tokens` a rolling cache."""
    max_length = _check_built(layer, batch_size, max_length)
    if layer.value_dim != layer.key_dim:
        raise ValueError(
            "A key/value cache stacks keys and values: it needs "
            f"value_dim == key_dim. Received: value_dim={layer.value_dim!r}, "
            f"key_dim={layer.key_dim!r} in layer {layer.name!r}"
        )
    dtype = keras.backend.standardize_dtype(dtype or layer.compute_dtype)
    heads = layer.num_key_value_heads or layer.num_heads
    if sink_tokens is None:
        shape = (batch_size, 2, max_length, heads, layer.key_dim)
        return dict(
            keys_values=ops.zeros(shape, dtype),
            key_mask=ops.zeros((batch_size, max_length), "bool"),
        )
    window = layer.cache_window()
    if not validation.is_int(sink_tokens) or sink_tokens < 0 or window is None:
        raise ValueError(
            "`sink_tokens` asks for a rolling cache: a non-negative int, for "
            "windowed attention (`sliding_window`, or a causal "
            f"`window_size`). Received: sink_tokens={sink_tokens!r}, "
            f"window={window!r} in layer {layer.name!r}"
        )
    sinks = int(sink_tokens)
    size = sinks + window + 1
    shape = (batch_size, 2, size, heads, layer.key_dim)
    return dict(
        keys_values=ops.zeros(shape, dtype),
        slot_mask=ops.zeros((batch_size, size), "bool"),
    )


def overwrites_positions(cache):
    """Whether an own cache keeps a slot per position (`key_mask`: the
    key/value and latent caches of `max_length` positions), which a call
    at that position overwrites; a rolling cache (`slot_mask`) does
    not."""
    return isinstance(cache, dict) and "key_mask" in cache


class SlotPerPosition:
    """`TokenMixer.cache_overwrites_positions` of the layers whose own
    cache is one of this module's: True for a cache of `max_length`
    positions (a call at a position overwrites its slot), False for a
    ring of slots."""

    def cache_overwrites_positions(self, cache):
        return overwrites_positions(cache)


def init_latent_cache(
    layer, batch_size, max_length, dtype=None, sink_tokens=None
):
    """The empty own cache of a `MultiHeadLatentAttention`: `(latent,
    key_mask)`, `(batch, max_length, cache_dim)` and `(batch,
    max_length)`; `sink_tokens` refused (no window)."""
    max_length = _check_built(layer, batch_size, max_length)
    if sink_tokens is not None:
        raise ValueError(
            "`sink_tokens` asks for a ring of slots, for windowed "
            f"attention. Received: sink_tokens={sink_tokens!r}, "
            f"window=None in layer {layer.name!r}"
        )
    dtype = keras.backend.standardize_dtype(dtype or layer.compute_dtype)
    return dict(
        latent=ops.zeros((batch_size, max_length, layer.cache_dim), dtype),
        key_mask=ops.zeros((batch_size, max_length), "bool"),
    )


def token_mask(inputs, mask):
    """The boolean `(batch, T)` padding mask of `inputs` (all True when
    `mask` is None)."""
    if mask is None:
        return ops.ones(ops.shape(inputs)[:2], "bool")
    return ops.cast(mask, "bool")


def key_attention_mask(keys, attention_mask, steps):
    """`keys` `(batch, Tk)` as an attention mask `(batch, steps, Tk)`,
    and-ed with the caller's `attention_mask` (rank 2, 3 or 4)."""
    mask = ops.repeat(ops.expand_dims(keys, 1), steps, axis=1)
    if attention_mask is None:
        return mask
    attention_mask = ops.cast(attention_mask, "bool")
    if len(attention_mask.shape) == 4:
        mask = ops.expand_dims(mask, 1)
    return ops.logical_and(attention_mask, mask)


def open_cache(
    cache, index, new_mask, attention_mask, steps, window=None, slots_axis=2
):
    """What a call with an own `cache` runs with: `(bare cache, attention
    mask, sink tokens or None, close)`, `close(updated bare cache)` giving
    the updated own cache. `new_mask`: this call's tokens' `(batch, T)`
    padding mask; `window`: the layer's `cache_window()`; `slots_axis`:
    the positions' axis of the bare cache."""
    if index is None:
        raise ValueError(
            "A cache of `init_cache` needs `cache_update_index`, the "
            "position of this call's first token. Received: "
            "cache_update_index=None"
        )
    name = "latent" if "latent" in cache else "keys_values"
    bare, sinks = cache[name], ring_sinks(cache, window)
    check_cache_index(
        index, steps, bare.shape[slots_axis], rolling=sinks is not None
    )
    if sinks is None:
        keys = ops.slice_update(cache["key_mask"], (0, index), new_mask)
        written = {"key_mask": keys}
    else:
        slots = cache["slot_mask"]
        keys = ops.concatenate([slots, new_mask], axis=1)
        slots = rolling_cache_write(slots, new_mask, index, sinks)
        written = {"slot_mask": slots}

    def close(updated):
        return {name: updated, **written}

    mask = key_attention_mask(keys, attention_mask, steps)
    return bare, mask, sinks, close


def open_attention_call(call, window):
    """A `MultiHeadAttention` call (`AttentionCall`) with an own cache as
    a call with its bare keys and values, causal, its key mask as the
    `attention_mask`; and `close`, which gives the updated dict.
    `window`: the layer's `cache_window()`."""
    if call.cache_sink_tokens is not None:
        raise ValueError(
            "A cache of `init_cache` knows its sink tokens: pass no "
            "`cache_sink_tokens` with it. Received: "
            f"cache_sink_tokens={call.cache_sink_tokens!r}"
        )
    mask = call.value_mask if call.key_mask is None else call.key_mask
    if call.value_mask is not None and call.key_mask is not None:
        mask = ops.logical_and(
            ops.cast(call.value_mask, "bool"), ops.cast(call.key_mask, "bool")
        )
    bare, attention_mask, sinks, close = open_cache(
        call.cache,
        call.cache_update_index,
        token_mask(call.query, mask),
        call.attention_mask,
        call.query.shape[1],
        window,
    )
    call = call.replace(
        cache=bare,
        attention_mask=attention_mask,
        value_mask=None,
        key_mask=None,
        use_causal_mask=True,
        cache_sink_tokens=sinks,
    )
    return call, close
