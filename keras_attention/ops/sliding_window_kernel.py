"""The kernel of sliding-window attention: softmax attention of query
blocks on their key windows (`window_attention`), chunk by chunk, with a
hand-written backward pass (the core of `local_attention`).

`softmax(q k^T + mask) v` for every query block and its key window, as
`sliding_window.py` lays them out. The blocks are computed in chunks of
consecutive blocks (on TensorFlow one chunk after the other), and the
backward pass recomputes each chunk's probabilities instead of keeping
them: no tensor of the band's full size `(b n, h, B, W)` is kept between
the passes, and while they run only one chunk's band tensors are alive.

Backward, per chunk (P the probabilities, dO the output's gradient):
`dV = P^T dO`, `dP = dO V^T`, `dS = P * (dP - rowsum(dO * O))`,
`dQ = dS K`, `dK = dS^T Q`.

Axes in comments: z - query blocks folded into the batch (`b * n`),
g - key/value heads, r - query heads per key/value head, B - queries of a
block, q - the `r * B` query rows of a group, k - keys of a window (`W`),
d/e - key/value head dims.
"""

import math

from keras import ops

from keras_attention.ops import _backend
from keras_attention.ops import scoring
from keras_attention.utils import keras_utils

# Band tensors of one chunk: at most this many elements per batch element
# (64 MiB in float32). Measured at T=8,192, 4 heads, window 128 each side
# (one chunk): 222 ms and 350 MiB above the idle process per training
# step; with 2**21 (seven chunks) 256 ms and 284 MiB: chunks only bound
# memory for longer sequences, they cost time.
_CHUNK_ELEMENTS = 2**24


def _chunks(n, per_block, chunk_blocks=None):
    """Static `[n0, n1)` ranges of blocks computed together (one range
    when the number of blocks `n` is not static): `chunk_blocks` blocks,
    or as many as fit in `_CHUNK_ELEMENTS` band elements."""
    if not isinstance(n, int):
        return [(None, None)]
    size = chunk_blocks or max(1, _CHUNK_ELEMENTS // max(1, per_block))
    return [(n0, min(n, n0 + size)) for n0 in range(0, n, size)]


def _take(x, n, n0, n1):
    """Blocks `n0 .. n1 - 1` of `(b n, ...)`: `(b (n1 - n0), ...)`."""
    if n0 is None:
        return x
    shape = tuple(x.shape[1:])
    x = ops.reshape(x, (-1, n, math.prod(shape)))
    return ops.reshape(keras_utils.slice_axis(x, 1, n0, n1), (-1,) + shape)


def _join(parts, n):
    """Inverse of `_take`: `(tensor, blocks)` pairs of consecutive ranges
    covering `0 .. n - 1`."""
    if len(parts) == 1:
        return parts[0][0]
    shape = tuple(parts[0][0].shape[1:])
    flat = [ops.reshape(p, (-1, p_n, math.prod(shape))) for p, p_n in parts]
    return ops.reshape(ops.concatenate(flat, axis=1), (-1,) + shape)


def _probabilities(q, k, mask):
    """Masked probabilities `(z, g, q, k)` in the queries' dtype (float32,
    or float64) and the queries' validity `(z, g|1, r|1, B, 1)` (a query
    whose window is all masked gets zeros); scores masked by
    `scoring.modify_scores`."""
    g, rows, width = q.shape[1], q.shape[2], k.shape[2]
    block = mask.shape[3]
    r = rows // block
    s = ops.einsum("zgqd,zgkd->zgqk", q, ops.cast(k, q.dtype))
    s = ops.reshape(s, (-1, g, r, block, width))
    s, _ = scoring.modify_scores(s, None, mask=mask)
    p = ops.reshape(scoring.plain_softmax(s, axis=-1), (-1, g, rows, width))
    return p, ops.any(mask, axis=-1, keepdims=True)


def _rows_where(valid, x):
    """`x` `(z, g, r B, .)` with the rows of invalid queries set to 0."""
    g, rows, last = x.shape[1], x.shape[2], x.shape[3]
    block = valid.shape[3]
    r = rows // block
    x5 = ops.reshape(x, (-1, g, r, block, last))
    x5 = ops.where(valid, x5, ops.zeros_like(x5))
    return ops.reshape(x5, (-1, g, rows, last))


def window_attention(q, k, v, mask, blocks=None, chunk_blocks=None):
    """`softmax(q k^T, masked) v` per query block on its key window.

    Args:
        q: scaled query blocks `(z, g, r B, d)` in the dtype of the scores
            and softmax (float32, or float64: `scoring.softmax_dtype`).
        k: key windows `(z, g, W, d)`.
        v: value windows `(z, g, W, e)`.
        mask: bool `(z, g|1, r|1, B, W)`, True = may attend; `z` must be
            the full `b * n` (no broadcasting over blocks).
        blocks: the number of blocks per batch element `n` when static
            (then the blocks are computed in chunks), else None.
        chunk_blocks: blocks per chunk (None: as many as fit in
            `_CHUNK_ELEMENTS` band elements); results do not depend on it.

    Returns:
        `(z, g, r B, e)` in the value's dtype; queries with nothing to
        attend to get zeros (and no gradient).
    """
    g, rows, width = q.shape[1], q.shape[2], k.shape[2]
    n = blocks
    chunks = _chunks(n, g * rows * width, chunk_blocks)

    def forward(q, k, v, aux):
        (mask,) = aux
        outs = []
        for n0, n1 in chunks:
            srcs = _backend.after((q, k, v, mask), [o for o, _ in outs[-1:]])
            q_c, k_c, v_c, m_c = (_take(x, n, n0, n1) for x in srcs)
            p, valid = _probabilities(q_c, k_c, m_c)
            out = ops.einsum("zgqk,zgke->zgqe", ops.cast(p, v.dtype), v_c)
            outs.append((_rows_where(valid, out), _count(n0, n1)))
        out = _join(outs, n)
        return out, (q, k, v, mask, out)

    def backward(residuals, d_out):
        q, k, v, mask, out = residuals
        dqs, dks, dvs = [], [], []
        for n0, n1 in chunks:
            last = [x for x, _ in dqs[-1:] + dks[-1:] + dvs[-1:]]
            srcs = _backend.after((q, k, v, mask, out, d_out), last)
            q_c, k_c, v_c, m_c, o_c, do_c = (_take(x, n, n0, n1) for x in srcs)
            p, valid = _probabilities(q_c, k_c, m_c)
            do_c = _rows_where(valid, ops.cast(do_c, v.dtype))
            # D_i = sum_j P_ij dP_ij = dO_i . O_i, in the scores' dtype.
            dtype = q_c.dtype
            dd = ops.sum(
                ops.cast(do_c, dtype) * ops.cast(o_c, dtype),
                axis=-1,
                keepdims=True,
            )
            dv = ops.einsum("zgqk,zgqe->zgke", ops.cast(p, v.dtype), do_c)
            dp = ops.cast(ops.einsum("zgqe,zgke->zgqk", do_c, v_c), dtype)
            ds = p * (dp - dd)
            dq = ops.einsum("zgqk,zgkd->zgqd", ds, ops.cast(k_c, dtype))
            dk = ops.einsum("zgqk,zgqd->zgkd", ds, q_c)
            count = _count(n0, n1)
            dqs.append((dq, count))
            dks.append((ops.cast(dk, k.dtype), count))
            dvs.append((ops.cast(dv, v.dtype), count))
        return _join(dqs, n), _join(dks, n), _join(dvs, n)

    return _backend.custom_vjp(forward, backward)(q, k, v, (mask,))


def _count(n0, n1):
    return None if n0 is None else n1 - n0
