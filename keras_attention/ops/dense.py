"""The dense attention path: the scores `(b, h, i, j)` in memory, the
only path that can return the weights or apply dropout to them; and
`dense_mask`, every mask source of a call as one dense boolean mask (for
the fused kernels and `_compute_attention` overrides that take a dense
mask only).

Axes: b - batch, i/j - query/key positions, h - query heads, g -
key/value heads (groups), r - query heads per group, d/e - key/value head
dims.
"""

from keras import ops

from keras_attention import masks
from keras_attention.ops import _backend
from keras_attention.ops import scoring
from keras_attention.ops.log_sum_exp import row_log_sum_exp
from keras_attention.ops.masking import as_4d_mask
from keras_attention.ops.scoring import score_dtype
from keras_attention.utils import keras_utils


def dense_attention(
    query,
    key,
    value,
    mask,
    scale,
    dropout_fn,
    return_weights,
    rows_nonempty=False,
    score_mod=None,
    mask_mod=None,
    query_offset=0,
    return_lse=False,
):
    """softmax(score_mod(q k^T * scale)) v with `mask` (dense, True =
    may attend, None: nothing masks) and optional `dropout_fn` on the
    weights; `(output, weights)` when `return_weights`, then the
    log-sum-exp `(b, h, i)` when `return_lse` (`log_sum_exp.py`).
    `rows_nonempty`: the caller knows every row attends to something (no
    masking of empty rows needed)."""
    num_heads = query.shape[2]
    num_groups = key.shape[2]
    d = query.shape[-1]
    # Scores in float32 for float16 inputs: they cannot overflow (float64
    # stays float64, and so does the softmax: `scoring.softmax_dtype`).
    dtype = score_dtype(query.dtype)
    query = ops.multiply(
        ops.cast(query, dtype), keras_utils.constant(scale, dtype)
    )
    key = ops.cast(key, dtype)
    mask = as_4d_mask(mask)
    b, i = ops.shape(query)[0], ops.shape(query)[1]
    j = ops.shape(key)[1]
    r = num_heads // num_groups
    by_matmul = query.shape[1] == 1 and _backend.single_query_by_matmul(
        num_groups
    )
    if by_matmul:
        scores = _single_query_scores(query, key, r)
    elif num_groups == num_heads:
        scores = ops.einsum("bihd,bjhd->bhij", query, key)
    else:
        q = ops.reshape(query, (b, i, num_groups, r, d))
        scores = ops.einsum("bigrd,bjgd->bgrij", q, key)
        scores = ops.reshape(scores, (b, num_heads, i, j))
    grid = None
    if score_mod is not None or mask_mod is not None:
        grid = scoring.Grid.dense(b, num_heads, i, j, q_offset=query_offset)
    scores, mask = scoring.modify_scores(
        scores, grid, score_mod, mask_mod, mask
    )
    # A score function's -inf may empty rows (zeros, as masked rows).
    weights = scoring.softmax(
        scores,
        None if rows_nonempty else mask,
        empty_rows=score_mod is not None,
    )
    lse = None
    if return_lse:
        valid = None if mask is None else ops.any(mask, -1, keepdims=True)
        lse = row_log_sum_exp(scores, valid)[..., 0]
    weights = ops.cast(weights, value.dtype)
    kept = dropout_fn(weights) if dropout_fn is not None else weights
    if by_matmul:
        output = _single_query_output(kept, value, r)
    elif num_groups == num_heads:
        output = ops.einsum("bhij,bjhe->bihe", kept, value)
    else:
        kept = ops.reshape(kept, (b, num_groups, r, i, j))
        output = ops.einsum("bgrij,bjge->bigre", kept, value)
        output = ops.reshape(output, (b, i, num_heads, value.shape[-1]))
    results = (output,) + ((weights,) if return_weights else ())
    results += (lse,) if return_lse else ()
    return results[0] if len(results) == 1 else results


def _single_query_scores(query, key, r):
    """The scores `(b, h, 1, j)` of one query `(b, 1, h, d)` over `key`
    `(b, j, g, d)` (`r` query heads per key/value head) as one matmul of
    the keys as they lie, `(b, j g, d)`, with every head's query: each
    key/value head's block of the `(b, j, g, g, r)` products is kept
    (`_backend.single_query_by_matmul`)."""
    b, j, g, d = (
        ops.shape(key)[0],
        ops.shape(key)[1],
        key.shape[2],
        key.shape[3],
    )
    h = g * r
    queries = ops.transpose(ops.reshape(query, (b, h, d)), (0, 2, 1))
    scores = ops.matmul(ops.reshape(key, (b, j * g, d)), queries)
    scores = ops.reshape(scores, (b, j, g, g, r))
    own = ops.reshape(ops.eye(g, dtype=scores.dtype), (1, 1, g, g, 1))
    scores = ops.sum(ops.multiply(scores, own), axis=3)  # (b, j, g, r)
    scores = ops.transpose(ops.reshape(scores, (b, j, h)), (0, 2, 1))
    return ops.expand_dims(scores, 2)


def _single_query_output(weights, value, r):
    """`_single_query_scores`' counterpart: `weights` `(b, h, 1, j)`
    times `value` `(b, j, g, e)` as it lies, `(b, j, g e)`, summed over
    the keys in at least float32, each query head's own block kept:
    `(b, 1, h, e)`."""
    b, j, g, e = (
        ops.shape(value)[0],
        ops.shape(value)[1],
        value.shape[2],
        value.shape[3],
    )
    dtype = score_dtype(value.dtype)
    values = ops.cast(ops.reshape(value, (b, j, g * e)), dtype)
    output = ops.matmul(ops.cast(weights[:, :, 0], dtype), values)
    output = ops.reshape(output, (b, g, r, g, e))
    own = ops.reshape(ops.eye(g, dtype=dtype), (1, g, 1, g, 1))
    output = ops.sum(ops.multiply(output, own), axis=3)  # (b, g, r, e)
    output = ops.reshape(output, (b, 1, g * r, e))
    return ops.cast(output, value.dtype)


def _positions_mask(tq, tk, offset):
    i = ops.arange(tq, dtype="int32")[:, None] + ops.cast(offset, "int32")
    j = ops.arange(tk, dtype="int32")[None, :]
    return scoring.causal(i, j)[None, None]


def dense_mask(
    attention_mask,
    query,
    key,
    causal=False,
    query_offset=0,
    key_mask=None,
    query_mask=None,
    mask_mod=None,
):
    """Every mask source of `dot_product_attention` as one dense boolean
    `(b|1, h|1, i, j)` mask, or None when nothing masks (for kernels and
    `_compute_attention` overrides that take a dense mask only).

    Arguments as `dot_product_attention`'s; `query` `(b, i, h, d)` and
    `key` `(b, j, g, d)` give the sizes.
    """
    causal_mask = None
    if causal:
        causal_mask = _positions_mask(
            ops.shape(query)[1], ops.shape(key)[1], query_offset
        )
    if key_mask is not None:  # (b, j) -> (b, 1, 1, j)
        key_mask = ops.cast(key_mask, "bool")[:, None, None, :]
    if query_mask is not None:  # (b, i) -> (b, 1, i, 1)
        query_mask = ops.cast(query_mask, "bool")[:, None, :, None]
    mod = None
    if mask_mod is not None:
        grid = scoring.Grid.dense(
            ops.shape(query)[0],
            query.shape[2],
            ops.shape(query)[1],
            ops.shape(key)[1],
            q_offset=query_offset,
        )
        mod = scoring.evaluate_mask(mask_mod, grid)
    return masks.combine_masks(
        as_4d_mask(attention_mask), causal_mask, key_mask, query_mask, mod
    )
