"""Scaled dot-product attention with the package's masking rules.

Axes in comments: b - batch, i/j - query/key positions, h - query heads,
g - key/value heads (groups), r - query heads per group, d/e - key/value
head dims.

Rules (shared by every layer of the package):
- mask True means "may attend";
- the softmax runs in float32 whatever the compute dtype;
- a query row with no key to attend to gets all-zero weights (so a zero
  result), never NaN and never uniform weights; gradients stay finite.
"""

import numpy as np
from keras import ops


def mask_fill_value(dtype):
    """A large negative *finite* score for masked positions of `dtype`.

    Half of the dtype's lowest value: adding a bias to it cannot overflow to
    `-inf` (as a fixed `-1e9` does in float16).
    """
    dtype = str(getattr(dtype, "name", dtype))
    if dtype == "bfloat16":
        return -1.6e38
    return float(np.finfo(np.dtype(dtype)).min) / 2.0


def masked_softmax(scores, mask=None, axis=-1):
    """Softmax over `axis` in float32 with masked entries set to exactly 0.

    Rows where `mask` is all False get all-zero weights.

    Args:
        scores: float tensor of any dtype.
        mask: optional boolean tensor broadcastable to `scores`.
        axis: the axis to normalize over.

    Returns:
        float32 tensor shaped like `scores`.
    """
    scores = ops.cast(scores, "float32")
    if mask is None:
        return ops.softmax(scores, axis=axis)
    mask = ops.cast(mask, "bool")
    scores = ops.where(mask, scores, mask_fill_value("float32"))
    weights = ops.softmax(scores, axis=axis)
    return ops.where(mask, weights, ops.zeros_like(weights))


def as_4d_mask(mask):
    """Brings a `(Tq, Tk)`, `(b, Tq, Tk)` or `(b, h, Tq, Tk)` mask to rank 4."""
    if mask is None:
        return None
    mask = ops.cast(mask, "bool")
    rank = len(mask.shape)
    if rank == 2:
        return mask[None, None]
    if rank == 3:
        return mask[:, None]
    if rank == 4:
        return mask
    raise ValueError(
        "An attention mask must have rank 2, 3 or 4. "
        f"Received: mask.shape={mask.shape}"
    )


def dot_product_attention(
    query,
    key,
    value,
    mask=None,
    scale=None,
    dropout_fn=None,
    return_weights=False,
):
    """softmax(q k^T * scale) v, per head, with grouped-query support.

    Args:
        query: `(b, i, h, d)`.
        key: `(b, j, g, d)` with `h % g == 0` (`g < h`: grouped-query
            attention, query head `n` reads key/value head `n // (h // g)`).
        value: `(b, j, g, e)`.
        mask: optional boolean, broadcastable to `(b, h, i, j)` (ranks 2-4
            accepted, see `as_4d_mask`). True means "may attend".
        scale: float; defaults to `1 / sqrt(d)`.
        dropout_fn: optional callable applied to the attention weights.
        return_weights: also return the weights `(b, h, i, j)`.

    Returns:
        `(b, i, h, e)` in the query's dtype, and the weights (query dtype) if
        `return_weights`.
    """
    num_heads = query.shape[2]
    num_groups = key.shape[2]
    d = query.shape[-1]
    if scale is None:
        scale = 1.0 / float(np.sqrt(d))
    query = ops.multiply(query, ops.cast(scale, query.dtype))
    mask = as_4d_mask(mask)
    if num_groups == num_heads:
        scores = ops.einsum("bihd,bjhd->bhij", query, key)
        weights = masked_softmax(scores, mask)
        weights = ops.cast(weights, value.dtype)
        kept = dropout_fn(weights) if dropout_fn is not None else weights
        output = ops.einsum("bhij,bjhe->bihe", kept, value)
    else:
        r = num_heads // num_groups
        b, i = ops.shape(query)[0], ops.shape(query)[1]
        j = ops.shape(key)[1]
        q = ops.reshape(query, (b, i, num_groups, r, d))
        scores = ops.einsum("bigrd,bjgd->bgrij", q, key)
        scores = ops.reshape(scores, (b, num_heads, i, j))
        weights = masked_softmax(scores, mask)
        weights = ops.cast(weights, value.dtype)
        kept = dropout_fn(weights) if dropout_fn is not None else weights
        kept = ops.reshape(kept, (b, num_groups, r, i, j))
        output = ops.einsum("bgrij,bjge->bigre", kept, value)
        output = ops.reshape(output, (b, i, num_heads, value.shape[-1]))
    if return_weights:
        return output, weights
    return output
