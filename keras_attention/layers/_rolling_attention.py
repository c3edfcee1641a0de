"""Attention over a rolling key/value cache (`MultiHeadAttention(...,
cache_sink_tokens=S)`): windowed attention decoding without a length
limit.

The cache's slots hold the attention sinks (positions `0 .. S - 1`) and a
ring of the latest positions (`keras_attention.ops.rolling_cache`). A call
attends to `[cache slots, its own T keys]`, masked by the positions each
slot holds, then writes its keys and values into the cache.
"""

import types

from keras import ops

from keras_attention import masks as masks_lib
from keras_attention.layers import _keras_override
from keras_attention.mods import base as mods_base
from keras_attention.ops import scoring
from keras_attention.ops.rolling_cache import rolling_cache_positions
from keras_attention.ops.rolling_cache import rolling_cache_slots
from keras_attention.ops.rolling_cache import rolling_cache_write
from keras_attention.utils import attention_checks


def attend_rolling_cache(layer, call, q):
    """Attention of `T` queries at positions `start ..` over a rolling
    cache (positions `0 .. start - 1` written in order) and this call's
    own keys; then this call's keys and values are written into the
    cache.

    Keys are `[cache slots, this call's T keys]`: each query sees those
    whose position is at most its own, within the window or below
    `sink_tokens`. Score and mask functions see absolute positions: the
    query's, and the one each slot holds (`scoring.AtPositions`).

    Args:
        layer: the `MultiHeadAttention`.
        call: its `AttentionCall` (`cache`, `cache_update_index` = start,
            `cache_sink_tokens`).
        q: the projected, rotated and scaled queries `(b, T, heads, d)`.

    Returns:
        `(heads result, scores or None, updated cache)`.
    """
    cache, start, sink_tokens = (
        call.cache,
        call.cache_update_index,
        call.cache_sink_tokens,
    )
    attention_checks.check_rolling_cache(
        cache, start, sink_tokens, layer.cache_window(), layer.name
    )
    size, steps = cache.shape[2], q.shape[1]
    new_k = layer._rotate(layer._project_key(call.key), start)
    new_v = layer._value_dense(call.value)
    start = ops.cast(start, "int32")
    query_positions = start + ops.arange(steps, dtype="int32")
    if call.attention_mask is not None:
        attention_checks.check_attention_mask(
            call.attention_mask,
            call.query,
            types.SimpleNamespace(shape=(None, size + steps)),
            layer.num_heads,
        )
    key_mask = masks_lib.combine_masks(call.value_mask, call.key_mask)
    if key_mask is not None:
        key_mask = ops.cast(key_mask, "bool")
    attention_mask = call.attention_mask
    if attention_mask is not None:
        attention_mask = ops.cast(attention_mask, "bool")
    new = ops.cast(ops.stack([new_k, new_v], axis=1), cache.dtype)
    updated = rolling_cache_write(cache, new, start, sink_tokens, axis=2)
    if steps == 1 and not call.return_attention_scores:
        # One position (a decoding step): written first, into the slot of
        # a position out of its window (the ring holds `window + 1`), so
        # the query attends to the `size` slots alone and the write is
        # one slice, updated in place under XLA: no copy of the ring.
        slot = rolling_cache_slots(start, size, sink_tokens)
        k, v = updated[:, 0], updated[:, 1]
        key_positions = rolling_cache_positions(size, sink_tokens, start + 1)
        # The masks cover `[slots, this key]`: this key now sits in `slot`.
        written = ops.equal(ops.arange(size, dtype="int32"), slot)
        if attention_mask is not None:
            attention_mask = ops.where(
                written, attention_mask[..., size:], attention_mask[..., :size]
            )
        if key_mask is not None:
            key_mask = ops.where(written[None], key_mask, True)
    else:
        k = ops.concatenate([cache[:, 0], new[:, 0]], 1)
        v = ops.concatenate([cache[:, 1], new[:, 1]], 1)
        key_positions = ops.concatenate(
            [rolling_cache_positions(size, sink_tokens, start), query_positions]
        )
        if key_mask is not None:
            batch = ops.shape(key_mask)[0]
            key_mask = ops.concatenate(
                [ops.ones((batch, size), "bool"), key_mask], axis=1
            )
    qp, kp = query_positions[:, None], key_positions[None]
    visible = ops.logical_and(kp >= 0, kp <= qp)
    near = ops.logical_or(qp - kp <= layer.cache_window(), kp < sink_tokens)
    mask = ops.logical_and(visible, near)[None]  # (1, T, keys)
    if attention_mask is not None:
        mask = ops.logical_and(attention_mask, mask)
    masks = layer._attention_masks(
        call.query,
        k,
        query_mask=call.query_mask,
        key_mask=key_mask,
        attention_mask=mask,
    )
    # The functions index keys by slot: give them the positions (an
    # unwritten slot, -1, is masked; any valid position will do).
    mods = mods_base.bind_all(layer.score_mod, layer.mask_mod, call.mod_inputs)
    score_mod, mask_mod = (
        None
        if fn is None
        else scoring.AtPositions(
            fn, query_positions, ops.maximum(key_positions, 0)
        )
        for fn in mods
    )
    result = _keras_override.attention_step(
        layer,
        q,
        k,
        v,
        call.return_attention_scores,
        call.training,
        score_mod=score_mod,
        mask_mod=mask_mod,
        **masks,
        **(call.step_inputs or {}),
    )
    if call.return_attention_scores:
        return result[0], result[1], updated
    return result[0], None, updated
