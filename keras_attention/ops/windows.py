"""Gathering fixed-width windows of a sequence (local attention).

Each query `i` reads only the `w` steps `start_i, ..., start_i + w - 1` of a
`(b, T, d)` sequence: `O(Tq * w)` work and memory instead of `O(Tq * T)`.
Slots outside `[0, T)` are clipped for the gather and flagged invalid.

Axes in comments: b - batch, i - queries, s - window slots, t - source
steps, d - features.
"""

from keras import ops


def window_indices(start, width, length):
    """Source positions of each window slot and whether they exist.

    Args:
        start: int tensor `(b, i)`, first source position of each window
            (may be negative or past the end).
        width: int, number of slots `w`.
        length: int or scalar tensor, source length `T`.

    Returns:
        `positions` `(b, i, w)` int32 (unclipped), `clipped` `(b, i, w)`
        int32 in `[0, T)`, `in_range` `(b, i, w)` bool.
    """
    positions = ops.cast(start, "int32")[..., None] + ops.arange(width, dtype="int32")
    length = ops.cast(length, "int32")
    in_range = ops.logical_and(positions >= 0, positions < length)
    clipped = ops.clip(positions, 0, ops.maximum(length - 1, 0))
    return positions, clipped, in_range


def gather_windows(x, clipped):
    """`x` `(b, t, ...)`, `clipped` `(b, i, w)` -> `(b, i, w, ...)`."""
    b, i, w = ops.shape(clipped)
    flat = ops.reshape(clipped, (b, i * w))
    extra = tuple(x.shape[2:])
    for _ in extra:
        flat = flat[..., None]
    out = ops.take_along_axis(x, flat, axis=1)  # b (i w) ...
    return ops.reshape(out, (b, i, w) + extra)


def scatter_windows(weights, start, length):
    """Dense `(b, i, t)` weights from window weights `(b, i, w)`.

    Slot `s` of query `i` lands on source step `start_i + s`; slots outside
    `[0, t)` must already be zero (they are dropped).
    """
    w = ops.shape(weights)[-1]
    t = ops.arange(length, dtype="int32")  # t
    offset = t - ops.cast(start, "int32")[..., None]  # b i t
    inside = ops.logical_and(offset >= 0, offset < w)
    picked = ops.take_along_axis(weights, ops.clip(offset, 0, w - 1), axis=-1)
    return ops.where(inside, picked, ops.zeros_like(picked))
