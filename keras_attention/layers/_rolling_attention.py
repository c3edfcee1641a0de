"""Attention over a rolling key/value cache (`MultiHeadAttention(...,
cache_sink_tokens=S)`): windowed attention decoding without a length
limit.

The cache's slots hold the attention sinks (positions `0 .. S - 1`) and a
ring of the latest positions (`keras_attention.ops.rolling_cache`). A call
attends to `[cache slots, its own T keys]`, masked by the positions each
slot holds, then writes its keys and values into the cache.
"""

from keras import ops

from keras_attention import masks as masks_lib
from keras_attention.layers import _keras_override
from keras_attention.mods import base as mods_base
from keras_attention.ops import scoring
from keras_attention.ops.rolling_cache import rolling_cache_positions
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
    k = ops.concatenate([cache[:, 0], ops.cast(new_k, cache.dtype)], 1)
    v = ops.concatenate([cache[:, 1], ops.cast(new_v, cache.dtype)], 1)
    start = ops.cast(start, "int32")
    query_positions = start + ops.arange(steps, dtype="int32")
    key_positions = ops.concatenate(
        [rolling_cache_positions(size, sink_tokens, start), query_positions]
    )
    qp, kp = query_positions[:, None], key_positions[None]
    visible = ops.logical_and(kp >= 0, kp <= qp)
    near = ops.logical_or(qp - kp <= layer.cache_window(), kp < sink_tokens)
    mask = ops.logical_and(visible, near)[None]  # (1, T, size + T)
    if call.attention_mask is not None:
        attention_checks.check_attention_mask(
            call.attention_mask, call.query, k, layer.num_heads
        )
        mask = ops.logical_and(ops.cast(call.attention_mask, "bool"), mask)
    key_mask = masks_lib.combine_masks(call.value_mask, call.key_mask)
    if key_mask is not None:
        batch = ops.shape(key_mask)[0]
        key_mask = ops.concatenate(
            [ops.ones((batch, size), "bool"), ops.cast(key_mask, "bool")],
            axis=1,
        )
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
    updated = rolling_cache_write(
        cache,
        ops.stack([new_k, new_v], axis=1),
        start,
        sink_tokens,
        axis=2,
    )
    if call.return_attention_scores:
        return result[0], result[1], updated
    return result[0], None, updated
