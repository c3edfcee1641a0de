"""The arithmetic of a rolling key/value cache (windowed attention without
a length limit): which slot holds which position, and how a call's keys
are written into it.

A rolling cache of `size` slots keeps the first `sink_tokens` positions
(the attention sinks) in its first slots forever and every later position
in a ring of the other `size - sink_tokens` slots. Used by
`MultiHeadAttention(cache_sink_tokens=...)`
(`layers/_rolling_attention.py`) and by generation's rolling caches.
"""

from keras import ops


def rolling_cache_slots(positions, size, sink_tokens):
    """The slots of a rolling key/value cache that hold `positions`.

    A rolling cache of `size` slots keeps positions `0 .. sink_tokens - 1`
    (the attention sinks) in its first `sink_tokens` slots forever, and
    every later position `p` in slot `sink_tokens + (p - sink_tokens) %
    (size - sink_tokens)` (a ring of the latest positions).

    Args:
        positions: int tensor of absolute positions (any shape).
        size: int, the slots of the cache.
        sink_tokens: int in `[0, size)`, the sink slots.

    Returns:
        int32 tensor of `positions`' shape, the slots.

    Example:

    >>> import keras
    >>> from keras_attention.ops.rolling_cache import (
    ...     rolling_cache_slots)
    >>> slots = rolling_cache_slots(keras.ops.arange(8), 5, 1)
    >>> keras.ops.convert_to_numpy(slots).tolist()
    [0, 1, 2, 3, 4, 1, 2, 3]
    """
    positions = ops.cast(positions, "int32")
    ring = size - sink_tokens
    rolled = sink_tokens + ops.mod(positions - sink_tokens, ring)
    return ops.where(positions < sink_tokens, positions, rolled)


def rolling_cache_positions(size, sink_tokens, length):
    """The absolute position each slot of a rolling cache holds once
    positions `0 .. length - 1` were written in order (see
    `rolling_cache_slots`); -1 for slots not written yet.

    Args:
        size: int, the slots of the cache.
        sink_tokens: int in `[0, size)`, the sink slots.
        length: int or int scalar tensor, the positions written.

    Returns:
        int32 `(size,)`.

    Example:

    >>> import keras
    >>> from keras_attention.ops.rolling_cache import (
    ...     rolling_cache_positions)
    >>> keras.ops.convert_to_numpy(rolling_cache_positions(5, 1, 7)).tolist()
    [0, 5, 6, 3, 4]
    >>> keras.ops.convert_to_numpy(rolling_cache_positions(5, 1, 2)).tolist()
    [0, 1, -1, -1, -1]
    """
    slots = ops.arange(size, dtype="int32")
    # For a ring slot s: the latest position written there is the largest
    # s + ring * m <= length - 1; for a sink slot, s itself.
    behind = ops.cast(length, "int32") - 1 - slots
    ring = size - sink_tokens
    latest = slots + ring * ops.floor_divide(ops.maximum(behind, 0), ring)
    positions = ops.where(slots < sink_tokens, slots, latest)
    return ops.where(behind >= 0, positions, -1)


def rolling_cache_write(cache, updates, start, sink_tokens, axis=1):
    """Writes `updates` (positions `start ..`) into a rolling cache.

    Each slot takes the latest of the positions that map to it (see
    `rolling_cache_slots`); the other slots keep their values.

    Args:
        cache: tensor with the slots on `axis` (`size` of them).
        updates: tensor of `cache`'s shape but with `T` positions on
            `axis` (static `T`), the values at positions `start ..
            start + T - 1`.
        start: int or int scalar tensor, the position of `updates`' first
            entry.
        sink_tokens: int in `[0, size)`, the sink slots.
        axis: int, the slot axis (1 or 2).

    Returns:
        The updated cache (same shape and dtype as `cache`).

    Example:

    >>> import numpy as np
    >>> import keras
    >>> from keras_attention.ops.rolling_cache import (
    ...     rolling_cache_write)
    >>> cache = np.zeros((1, 4), "float32")
    >>> new = np.array([[1.0, 2.0, 3.0, 4.0, 5.0]], "float32")
    >>> out = rolling_cache_write(cache, new, 0, sink_tokens=1)
    >>> keras.ops.convert_to_numpy(out).tolist()
    [[1.0, 5.0, 3.0, 4.0]]
    """
    size, steps = cache.shape[axis], updates.shape[axis]
    ring = size - sink_tokens
    start = ops.cast(start, "int32")
    if steps == 1:  # one slot: a slice, updated in place under XLA
        starts = [0] * len(cache.shape)
        starts[axis] = rolling_cache_slots(start, size, sink_tokens)
        return ops.slice_update(cache, starts, ops.cast(updates, cache.dtype))
    offsets = ops.arange(steps, dtype="int32")
    positions = start + offsets
    slots = rolling_cache_slots(positions, size, sink_tokens)
    # Of several positions on one ring slot, the last one stays.
    kept = ops.logical_or(positions < sink_tokens, offsets >= steps - ring)
    writes = ops.logical_and(
        ops.equal(slots[:, None], ops.arange(size, dtype="int32")[None]),
        kept[:, None],
    )  # (T, size)
    written = ops.any(writes, axis=0)
    source = ops.argmax(ops.cast(writes, "int32"), axis=0)
    taken = ops.take(updates, source, axis=axis)
    shape = [1] * len(cache.shape)
    shape[axis] = size
    written = ops.reshape(written, shape)
    return ops.where(written, ops.cast(taken, cache.dtype), cache)
