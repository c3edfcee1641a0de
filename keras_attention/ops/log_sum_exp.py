"""The softmax's log-sum-exp: rows' `lse` from masked scores, learned
attention sinks applied through it, and attention over disjoint key sets
merged into attention over their union.

For one query row with scores `s_j` over the keys it may attend to,

    lse = log sum_j exp(s_j),      o = sum_j exp(s_j - lse) v_j,

so `exp(s_j - lse)` are the attention weights. A row that may attend to
nothing has `lse = -inf` and `o = 0` (the package's rule for empty rows).

**Merging.** Attention computed separately over disjoint key sets
`K_1, ..., K_n` (split-key decoding, a ring of devices) combines exactly:

    lse = log sum_p exp(lse_p),    o = sum_p exp(lse_p - lse) o_p.

**Learned sinks** (gpt-oss; Xiao et al. 2023's "attention sinks" made a
parameter): one logit `z_h` per query head is a virtual key that takes
probability mass and contributes no value:

    lse' = log(exp(lse) + exp(z_h)),   o' = exp(lse - lse') o.

The `lse` returned with sinks is `lse'`, the log of the whole softmax
denominator (the sink's term included): the weights are still
`exp(s_j - lse')`, and a fully masked row has `lse' = z_h` and `o' = 0`.
To merge partial results exactly, compute the parts *without* sinks and
give the sinks once to `merge_attention(..., sink_logits=z)` (merging
parts that each carry the sink would count it once per part).

Shapes: outputs `(b, i, h, e)` (as `dot_product_attention`), `lse`
`(b, h, i)` in float32 (float64 for float64 inputs).
"""

import numpy as np
from keras import ops

from keras_attention.ops.scoring import rows_valid
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils.keras_utils import constant

NEG_INF = float("-inf")


def lse_dtype(dtype):
    """The dtype of a log-sum-exp: float32, float64 for float64 inputs."""
    return softmax_dtype(dtype)


def row_log_sum_exp(scores, valid=None, axis=-1):
    """The log-sum-exp over `axis` of scores from `scoring.modify_scores`
    (finite; masked entries at the fill value), keeping the axis; `-inf`
    on rows that may attend to nothing: `valid` False (a row's mask is
    all False) or a row whose maximum is the fill value.

    Stable (`m + log sum exp(s - m)` with `m` the row maximum, finite)
    and with finite gradients everywhere (an empty row's gradient is 0).
    """
    m = ops.max(scores, axis=axis, keepdims=True)
    total = ops.sum(ops.exp(scores - m), axis=axis, keepdims=True)
    lse = m + ops.log(total)
    seen = rows_valid(m)
    valid = seen if valid is None else ops.logical_and(valid, seen)
    return ops.where(valid, lse, ops.full_like(lse, NEG_INF))


def check_sink_logits(sink_logits, num_heads):
    """`ValueError` unless `sink_logits` (a tensor or an array-like) is
    `(num_heads,)`."""
    shape = getattr(sink_logits, "shape", None)
    shape = tuple(np.shape(sink_logits) if shape is None else shape)
    if len(shape) != 1 or (isinstance(shape[0], int) and shape[0] != num_heads):
        raise ValueError(
            "`sink_logits` must have shape (num_heads,) = "
            f"({num_heads},): one logit per query head. Received: "
            f"sink_logits.shape={shape!r}"
        )


def _finite_lse(lse, fallback):
    """`lse` with its `-inf` rows replaced by `fallback` (no `-inf` in
    the arithmetic that follows, so no NaN in its gradient), and the
    mask of finite rows."""
    valid = lse > NEG_INF
    return ops.where(valid, lse, fallback), valid


def kept_share(lse, z, valid=None):
    """`(keep, lse')` of rows with log-sum-exp `lse` and sink logit `z`
    (broadcastable): the share of the mass the keys keep, `sigmoid(lse -
    z)`, and `lse' = logaddexp(lse, z)`; where `valid` is False (the row
    attends to nothing) `keep = 0` and `lse' = z`, with no `-inf` in the
    arithmetic (no NaN in the gradient).

    `lse'` is the larger of the two plus `softplus(-|lse - z|)`, never
    `z + softplus(lse - z)`: a sink far below the scores then leaves
    `lse` exact (`-1e4 + softplus(lse + 1e4)` rounds to float32's
    spacing at 1e4, 1e-3), and a sink of `-inf` is no sink (not `-inf +
    inf`). The branch is a `where`, so that the gradient at `lse = z`
    is split evenly (`|d|`'s gradient at 0 would be 0)."""
    d = lse - z
    if valid is not None:
        d = ops.where(valid, d, ops.zeros_like(d))
    above = d >= 0  # The keys outweigh the sink (NaN d: never, see below).
    larger = ops.where(above, lse, z)
    # -|d| by branch; d is NaN only where valid is False (replaced).
    new_lse = larger + ops.softplus(ops.where(above, -d, d))
    keep = ops.sigmoid(d)
    if valid is None:
        return keep, new_lse
    zeros = ops.zeros_like(d)
    keep = ops.where(valid, keep, zeros)
    return keep, ops.where(valid, new_lse, z + zeros)


def apply_sinks(output, lse, sink_logits, weights=None):
    """Attention without sinks (`output` `(b, i, h, e)`, `lse` `(b, h, i)`
    and optionally the weights `(b, h, i, j)`) turned into attention with
    the learned sinks `sink_logits` `(h,)`: `(output, lse, weights)`.

    See the module docstring: `o' = exp(lse - lse') o` with `lse' =
    logaddexp(lse, z_h)`; rows that attend to nothing keep `o' = 0` and
    get `lse' = z_h`. Differentiable w.r.t. every input (the sinks'
    gradient is `sum_i p_sink,i (dlse'_i - dO'_i . O'_i)`).
    """
    dtype = lse.dtype
    z = constant(sink_logits, dtype)[None, :, None]  # (1, h, 1)
    valid = lse > NEG_INF
    # On rows that attend to something: the kept share of the mass
    # sigmoid(lse - z), and lse' = logaddexp(lse, z) (`kept_share`).
    keep, new_lse = kept_share(lse, z, valid)
    factor = ops.transpose(keep, (0, 2, 1))[..., None]  # (b, i, h, 1)
    if output.dtype == factor.dtype:
        output = output * factor
    else:
        output = ops.cast(ops.cast(output, dtype) * factor, output.dtype)
    if weights is not None:
        weights = ops.cast(
            ops.cast(weights, dtype) * keep[..., None], weights.dtype
        )
    return output, new_lse, weights


def sinks_on_result(result, sink_logits, return_weights, return_lse):
    """A path's result computed without sinks and with its log-sum-exp,
    `output` then `weights` if `return_weights` then `lse`, with the
    learned sinks `sink_logits` `(h,)` applied (`apply_sinks`): the
    output, then the weights if `return_weights`, then the
    sink-inclusive lse if `return_lse` (a tuple when more than one)."""
    output, lse = result[0], result[-1]
    weights = result[1] if return_weights else None
    output, lse, weights = apply_sinks(output, lse, sink_logits, weights)
    results = (output,) + ((weights,) if return_weights else ())
    results += (lse,) if return_lse else ()
    return results[0] if len(results) == 1 else results


def _agrees(shape, expected):
    """Whether `shape` has the rank of `expected` and its sizes (None:
    unknown at trace time, agreeing with anything)."""
    return len(shape) == len(expected) and all(
        a is None or b is None or a == b for a, b in zip(shape, expected)
    )


def _checked_parts(outputs, lses):
    """`merge_attention`'s parts as tensors, checked against each other:
    lists of the same length, every output `(b, i, h, e)` of the first's
    shape, every lse `(b, h, i)` of the outputs' sizes. A mismatch is
    refused (`ValueError` naming the part and its shape), never
    broadcast."""
    for name, value in (("outputs", outputs), ("lses", lses)):
        if not isinstance(value, (list, tuple)):
            raise TypeError(
                f"`{name}` must be a list (or tuple), one entry per key "
                f"set. Received: {name} of type {type(value).__name__}"
            )
    if not outputs or len(outputs) != len(lses):
        raise ValueError(
            "`outputs` and `lses` must be non-empty lists of the same "
            f"length. Received: len(outputs)={len(outputs)!r}, "
            f"len(lses)={len(lses)!r}"
        )
    outputs = [ops.convert_to_tensor(x) for x in outputs]
    lses = [ops.convert_to_tensor(x) for x in lses]
    first = tuple(outputs[0].shape)
    if len(first) != 4:
        raise ValueError(
            "`outputs[0]` must have rank 4, (batch, queries, heads, dim) "
            "as `dot_product_attention` returns it. Received: "
            f"outputs[0].shape={first!r}"
        )
    for p, x in enumerate(outputs[1:], 1):
        if not _agrees(tuple(x.shape), first):
            raise ValueError(
                f"`outputs[{p}]` must have the shape of `outputs[0]`, "
                f"{first!r} (attention of the same queries over another "
                "key set: the same batch, queries, heads and dim). "
                f"Received: outputs[{p}].shape={tuple(x.shape)!r}"
            )
    expected = (first[0], first[2], first[1])
    for p, x in enumerate(lses):
        if not _agrees(tuple(x.shape), expected):
            raise ValueError(
                f"`lses[{p}]` must have shape (batch, heads, queries) = "
                f"{expected!r}, matching the outputs' (batch, queries, "
                f"heads, dim) = {first!r} (the layout "
                "`dot_product_attention(..., return_lse=True)` returns). "
                f"Received: lses[{p}].shape={tuple(x.shape)!r}"
            )
    return outputs, lses


def merge_attention(outputs, lses, sink_logits=None):
    """Attention over disjoint key sets combined into attention over their
    union: equal to one `dot_product_attention` call over all the keys
    (masks included: a part whose row attends to nothing has `lse = -inf`
    and counts for nothing).

    `lse = log sum_p exp(lse_p)`, `output = sum_p exp(lse_p - lse)
    output_p`; rows empty in every part get a zero output and `lse =
    -inf`. With `sink_logits` `(h,)`, learned sinks are applied once to
    the merged result (the parts must come without them: see the module
    docstring).

    Args:
        outputs: a list of `(b, i, h, e)` tensors (or array-likes), one
            per key set, all of one shape.
        lses: a list of their log-sum-exps `(b, h, i)`
            (`dot_product_attention(..., return_lse=True)`), of the
            outputs' sizes.
        sink_logits: optional `(h,)` learned sink logits (`-inf`: no
            sink on that head).

    Parts whose shapes disagree are refused (`ValueError` naming the
    part), never broadcast.

    Returns:
        `(output, lse)`: `(b, i, h, e)` in the first output's dtype and
        `(b, h, i)` float32 (float64 if any part is float64).

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> rng = np.random.default_rng(0)
    >>> q = rng.normal(size=(1, 3, 2, 4)).astype("float32")
    >>> kv = rng.normal(size=(1, 6, 2, 4)).astype("float32")
    >>> attend = keras_attention.ops.dot_product_attention
    >>> parts = [attend(q, kv[:, a:b], kv[:, a:b], return_lse=True)
    ...          for a, b in ((0, 2), (2, 6))]
    >>> out, lse = keras_attention.ops.merge_attention(
    ...     [o for o, _ in parts], [l for _, l in parts])
    >>> full, full_lse = attend(q, kv, kv, return_lse=True)
    >>> bool(np.allclose(out, full, atol=1e-6))
    True
    >>> bool(np.allclose(lse, full_lse, atol=1e-6))
    True
    """
    outputs, lses = _checked_parts(outputs, lses)
    if sink_logits is not None:
        check_sink_logits(sink_logits, outputs[0].shape[2])
    dtypes = {str(x.dtype) for x in lses}
    dtype = "float64" if any("64" in d for d in dtypes) else "float32"
    lses = [ops.cast(x, dtype) for x in lses]
    m = lses[0]
    for x in lses[1:]:
        m = ops.maximum(m, x)
    m_f, valid = _finite_lse(m, ops.zeros_like(m))
    # exp(-inf - m_f) = 0: a part that attends nothing adds nothing.
    scales = [ops.exp(x - m_f) for x in lses]
    total = scales[0]
    for s in scales[1:]:
        total = total + s
    safe = ops.where(valid, total, ops.ones_like(total))
    lse = ops.where(valid, m_f + ops.log(safe), ops.full_like(m, NEG_INF))
    out_dtype = outputs[0].dtype
    output = None
    for o, s in zip(outputs, scales):
        factor = ops.transpose(s / safe, (0, 2, 1))[..., None]
        part = ops.cast(o, dtype) * factor
        output = part if output is None else output + part
    output = ops.cast(output, out_dtype)
    if sink_logits is not None:
        output, lse, _ = apply_sinks(output, lse, sink_logits)
    return output, lse
