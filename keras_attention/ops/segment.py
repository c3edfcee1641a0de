"""Softmax over segments: the normalization of attention over a graph's
edges (each receiver node attends over its own incoming edges).

    w_e = exp(s_e - m_k) / sum_{e' in k} exp(s_e' - m_k),  k = segment(e)

with `m_k` the maximum score of segment `k` (so no `exp` overflows).
Only `keras.ops` segment reductions are used: memory is linear in the
number of entries, and no `(segments, entries)` tensor is built.

Axes in comments: e - entries (edges), k - segments (nodes), ... - any
trailing axes (heads).
"""

from keras import ops

from keras_attention.ops import _backend
from keras_attention.ops.scoring import mask_fill_value
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import attention_checks


def segment_softmax(scores, segment_ids, num_segments, mask=None):
    """Softmax of `scores` over the entries of each segment, in at least
    float32 (float64 scores stay float64).

    Numerically stable: each segment's maximum is subtracted before the
    `exp` (it is a constant of the segment, so no gradient flows through
    it). Entries whose `mask` is False get weight exactly 0; a segment
    with no entries, or only masked ones, has nothing to normalize and no
    NaN appears anywhere (also in the gradient).

    Args:
        scores: float tensor `(E, ...)`: one score per entry (and head).
        segment_ids: int tensor `(E,)`, the segment of each entry, in
            `[0, num_segments)` (ids need not be sorted).
        num_segments: int, the number of segments (static for JAX).
        mask: optional boolean tensor `(E,)` or broadcastable to `scores`;
            False entries are left out of their segment's softmax.

    Returns:
        float32 (float64 for float64 scores) tensor shaped like `scores`:
        within each segment, the weights (of every trailing index) sum
        to 1.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> w = keras_attention.ops.segment_softmax(
    ...     np.array([0.0, 0.0, 5.0, 1.0], "float32"),
    ...     segment_ids=np.array([0, 0, 2, 2]), num_segments=3)
    >>> tuple(round(float(v), 3) for v in np.asarray(w))
    (0.5, 0.5, 0.982, 0.018)
    """
    scores, segment_ids, mask = attention_checks.as_tensors(
        scores=scores, segment_ids=segment_ids, mask=mask
    )
    dtype = softmax_dtype(scores.dtype)
    scores = ops.cast(scores, dtype)
    segment_ids = ops.cast(segment_ids, "int32")
    if mask is not None:
        mask = ops.cast(mask, "bool")
        while len(mask.shape) < len(scores.shape):
            mask = ops.expand_dims(mask, -1)
        mask = ops.broadcast_to(mask, ops.shape(scores))
        fill = ops.zeros((), dtype) + mask_fill_value(dtype)
        scores = ops.where(mask, scores, fill)
    # k: per-segment maximum (a constant of the softmax: no gradient).
    peak = ops.segment_max(scores, segment_ids, num_segments=num_segments)
    peak = ops.stop_gradient(peak)
    shifted = scores - ops.take(peak, segment_ids, axis=0)  # e, <= 0
    if mask is not None:
        shifted = ops.where(mask, shifted, 0.0)
    e = ops.exp(shifted)
    if mask is not None:
        e = ops.where(mask, e, 0.0)
    total = segment_sum(e, segment_ids, num_segments)
    total = ops.take(total, segment_ids, axis=0)  # e
    # An unmasked entry's segment total is >= 1 (its maximum gives 1);
    # a total of 0 only comes with masked entries, whose e is 0.
    return e / ops.where(total > 0, total, 1.0)


def segment_sum(data, segment_ids, num_segments):
    """`keras.ops.segment_sum` that keeps float64 data in float64 on every
    backend (Keras's torch segment reductions compute in float32).

    Args:
        data: tensor `(E, ...)`.
        segment_ids: int tensor `(E,)` in `[0, num_segments)`.
        num_segments: int, the number of segments.

    Returns:
        `(num_segments, ...)` in the data's dtype.
    """
    return _backend.segment_sum(data, segment_ids, num_segments)
