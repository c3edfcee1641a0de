"""Gathering and scattering fixed-width windows of a sequence (local
attention of `LuongAttention`): `window_indices`, `gather_windows`,
`scatter_windows`.

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
    positions = ops.cast(start, "int32")[..., None] + ops.arange(
        width, dtype="int32"
    )
    length = ops.cast(length, "int32")
    in_range = ops.logical_and(positions >= 0, positions < length)
    clipped = ops.clip(positions, 0, ops.maximum(length - 1, 0))
    return positions, clipped, in_range


def gather_windows(x, clipped):
    """`x` `(b, t, ...)`, `clipped` `(b, i, w)` -> `(b, i, w, ...)`.

    A flat `take` on `(b * t, ...)` (its gradient differentiates inside
    loops under XLA, unlike a broadcasting `take_along_axis`).
    """
    b, t = ops.shape(x)[0], ops.shape(x)[1]
    _, i, w = ops.shape(clipped)
    extra = tuple(x.shape[2:])
    flat_x = ops.reshape(x, (b * t,) + extra)
    rows = ops.arange(b, dtype="int32")[:, None, None] * ops.cast(t, "int32")
    flat_index = ops.reshape(ops.cast(clipped, "int32") + rows, (-1,))
    out = ops.take(flat_x, flat_index, axis=0)  # (b i w) ...
    return ops.reshape(out, (b, i, w) + extra)


def scatter_windows(weights, start, length):
    """Dense `(b, i, t)` weights from window weights `(b, i, w)`.

    Slot `s` of query `i` lands on source step `start_i + s`; slots outside
    `[0, t)` must already be zero (they are dropped). `O(b * i * t)` memory
    (one pass per slot, `w` is static).
    """
    width = weights.shape[-1]
    offset = (
        ops.arange(length, dtype="int32") - ops.cast(start, "int32")[..., None]
    )
    dense = ops.zeros_like(ops.cast(offset, weights.dtype))  # b i t
    for s in range(width):
        dense = dense + ops.where(offset == s, weights[..., s : s + 1], 0.0)
    return dense
