"""Memory-efficient blockwise attention (FlashAttention's algorithm).

`softmax(q k^T) v` computed over query tiles and, within each query tile,
over key tiles with a running row max `m`, row sum and accumulator (online
softmax, Milakov & Gimelshein 2018; Rabe & Staats 2021; Dao et al. 2022).
A query tile whose keys fit in one key tile (the usual case: see
`paths.blockwise_tiles`) takes the softmax directly, one large matmul
and one softmax op. The backward pass (hand-written:
`dV = P^T dO`, `dP = dO V^T`, `dS = P * (dP - rowsum(dO * O))`,
`dQ = dS K`, `dK = dS^T Q`) reuses the probabilities of one-tile rows when
they are small (`keeps_probabilities`: one score matmul and one softmax
less per tile), and otherwise recomputes each tile's probabilities (from
the saved log-sum-exp, or the softmax of a one-tile row), so that memory
is O(T * tile), never O(T^2), for long sequences; it runs the query tiles
last to first and sums each key tile's gradient as it comes. With a
causal structure, tiles entirely above the diagonal are neither computed
nor differentiated.

Axes in comments: b - batch, g - key/value heads (groups), r - query heads
per group, i/j - query/key positions, q - rows of a query tile (r * Bq),
k - columns of a key tile, d/e - key/value head dims.

Masks (True = may attend) are given structurally so that no (Tq, Tk) tensor
is ever built: `is_causal` with a static `causal_offset` (query `i` may see
keys `j <= i + offset`), `key_padding` `(b, Tk)`, `query_padding` `(b, Tq)`
and, optionally, a dense `mask` `(b|1, h|1, Tq, Tk)` that is sliced per
tile. A query that can attend to nothing gets a zero result and zero
gradients.

This module plans the tiles (`_Plan`) and runs the forward pass over
them; the backward pass is in `blockwise_backward.py`, and the scores and
masks of one tile are formed in `blockwise_tiles.py`.
"""

import numpy as np
from keras import ops

from keras_attention.ops import _backend
from keras_attention.ops import blockwise_backward
from keras_attention.ops import blockwise_tiles
from keras_attention.ops import captured
from keras_attention.ops import scoring
from keras_attention.ops.blockwise_backward import concat_rows
from keras_attention.ops.blockwise_backward import key_chunks
from keras_attention.ops.log_sum_exp import kept_share
from keras_attention.ops.scoring import score_dtype
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import keras_utils

_slice = keras_utils.slice_axis
# The backward pass reuses the forward's probabilities of one-tile rows
# instead of recomputing them (one score matmul and one softmax less per
# tile) when they hold at most this many elements per batch element
# (128 MiB in float32: T = 2,048 with 8 heads); longer sequences recompute
# them, so that memory stays O(T * tile).
_KEEP_ELEMENTS = 2**25


def keeps_probabilities(scores_per_head, heads):
    """Whether the backward pass reuses the forward's probabilities of
    `scores_per_head` scores per head (at most `_KEEP_ELEMENTS` per batch
    element in all) instead of recomputing them."""
    return heads * scores_per_head <= _KEEP_ELEMENTS


def _tiles(start, stop, size):
    return [(a, min(a + size, stop)) for a in range(start, stop, size)]


class _Plan:
    """Static tiling of one call: which (query tile, key tile) pairs run.

    `rows` lists, per query tile `[i0, i1)`, its key tiles as
    `(c, j0, j1, needs_causal, needs_mod)`: `needs_causal` when the tile
    crosses the causal diagonal (or the offset is a tensor), `needs_mod`
    when the mask function must be evaluated on it. A static mask
    function (NumPy in, NumPy out: `scoring.static_block_mask`) is
    evaluated on every tile while planning: tiles it masks entirely are
    left out (block sparsity, forward and backward), tiles it allows
    entirely need no mask.
    """

    def __init__(
        self,
        tq,
        tk,
        is_causal,
        causal_offset,
        query_block,
        key_block,
        heads=1,
        mask_mod=None,
        score_fn=None,
        keep_probabilities=None,
        relative_fn=None,
        soft_cap=None,
    ):
        self.tq, self.tk = tq, tk
        self.relative_fn, self.soft_cap = relative_fn, soft_cap
        self.query_block, self.key_block = query_block, key_block
        self.heads = heads
        self.mask_mod, self.score_fn = mask_mod, score_fn
        if isinstance(causal_offset, np.integer):
            causal_offset = int(causal_offset)
        static_offset = isinstance(causal_offset, int)
        self.static_causal = is_causal and static_offset
        self.dynamic_causal = is_causal and not self.static_causal
        self.offset = causal_offset
        self.skipped_tiles = 0
        static_mod = mask_mod is not None and static_offset
        # A mask function that reads tensors (segment ids): its tiles are
        # tested at run time, and skipped when no example attends in them.
        self.dynamic_mod = mask_mod is not None and not static_offset
        self.rows = []  # (i0, i1, [(c, j0, j1, causal, mod), ...])
        for i0, i1 in _tiles(0, tq, query_block):
            stop = tk
            if self.static_causal:
                # Last key visible to the tile's last query.
                stop = max(0, min(tk, i1 + causal_offset))
            chunks = []
            for c, j0, j1 in key_chunks(stop, key_block):
                crosses = (
                    (j1 - 1) > (i0 + causal_offset)
                    if self.static_causal
                    else False
                )
                needs_mod = mask_mod is not None
                if static_mod:
                    tile = scoring.static_block_mask(
                        mask_mod,
                        heads,
                        i0 + causal_offset,
                        i1 + causal_offset,
                        j0,
                        j1,
                    )
                    if tile is None:  # Reads tensors: masked at run time.
                        static_mod = False
                        self.dynamic_mod = True
                    elif not tile.any():
                        self.skipped_tiles += 1
                        continue
                    else:
                        needs_mod = not tile.all()
                chunks.append(
                    (c, j0, j1, crosses or self.dynamic_causal, needs_mod)
                )
            self.rows.append((i0, i1, chunks))
        # Probabilities of one-tile rows kept for the backward pass (not
        # recomputed) when they are small: see `_KEEP_ELEMENTS`. A score
        # function's pullback recomputes only the raw scores then (which
        # a graph compiler drops when its gradient does not read them:
        # an additive bias).
        kept = sum(
            (i1 - i0) * (chunks[0][2] - chunks[0][1])
            for i0, i1, chunks in self.rows
            if len(chunks) == 1
        )
        if keep_probabilities is None:
            keep_probabilities = keeps_probabilities(kept, heads)
        self.keep_probabilities = keep_probabilities
        self.return_lse = False
        self.sinks = False


def _forward(plan, qh, kh, vh, aux, params, valid_rows, sinks=None):
    """Softmax attention for every row of tiles (query tile).

    A row with one key tile takes the softmax in one op and keeps no
    log-sum-exp (its backward recomputes the softmax); a row with several
    runs the online softmax over them and keeps its log-sum-exp.

    Returns the output `(b, g, r, i, e)` and, per row of tiles, the
    log-sum-exp `(b, g, q, 1)` (None for one-tile rows), the validity
    of its queries, bool `(b|1, g|1, r|1, Bq, 1)` (None: all valid), and
    the kept probabilities (None: recomputed). With learned `sinks`
    `(g, r)`, each row's output is scaled by its kept share of the mass
    and the log-sum-exp kept (and returned) is the sink-inclusive one
    (`_sink_row`).
    """
    g, r, e = qh.shape[1], qh.shape[2], vh.shape[-1]
    ks = ops.cast(kh, score_dtype(kh.dtype))
    dtype = softmax_dtype(kh.dtype)
    outs, lses, valids, probs, row_lses, keeps = [], [], [], [], [], []
    for i0, i1, chunks in plan.rows:
        n = i1 - i0
        # One row of tiles at a time (TensorFlow would start them all).
        q_src, k_src, v_src = _backend.after((qh, ks, vh), outs[-1:])
        q_t = ops.reshape(
            _slice(q_src, 3, i0, i1), (-1, g, r * n, qh.shape[-1])
        )
        tile = (plan, q_t, k_src, v_src, aux, params, i0, i1, chunks)
        p = None
        if not chunks:  # A row that sees no key at all.
            out, lse = ops.zeros_like(qh[:, :, :, i0:i1, :1]), None
            out = ops.cast(out, dtype) + ops.zeros((e,), dtype)
            valid = ops.zeros_like(out[..., :1], "bool")
        elif len(chunks) == 1:
            out, lse, valid, p = _one_tile(*tile)
        else:
            out, lse, valid = _online_tiles(*tile)
        if valid_rows is not None:
            rows = valid_rows[:, None, None, i0:i1, None]
            valid = rows if valid is None else ops.logical_and(valid, rows)
        if valid is not None:
            out = ops.where(valid, out, 0.0)
        keep = None
        if sinks is not None:
            out, keep, row_lse = _sink_row(sinks, out, lse, valid)
        elif plan.return_lse:
            row_lse = _row_lse(lse, valid, out)
        if plan.return_lse:
            row_lses.append(row_lse)
        outs.append(ops.cast(out, qh.dtype))
        lses.append(lse)
        valids.append(valid)
        probs.append(p if plan.keep_probabilities else None)
        keeps.append(keep)
    lse_out = concat_rows(row_lses) if plan.return_lse else None
    return concat_rows(outs), lse_out, lses, valids, probs, keeps


def _sink_row(sinks, out, lse, valid):
    """Learned sinks on one row of tiles: the output `(b, g, r, Bq, e)`
    times the kept share of the mass `keep = sigmoid(lse - z)` (0 where
    the row attends to nothing), `keep` as the backward pass reads it
    `(b, g, q, 1)`, and the sink-inclusive log-sum-exp `lse' =
    logaddexp(lse, z)` (`kept_share`: stable, a sink of `-inf` is no
    sink; `z` where the row attends to nothing) as returned
    `(b, g, r, Bq)`. The probabilities stay those without the sink (the
    backward pass scales `dO` and `D` by `keep` instead: one multiply per
    row, not per score)."""
    g, r, n = out.shape[1], out.shape[2], out.shape[3]
    z = ops.reshape(ops.cast(sinks, out.dtype), (1, g, r, 1, 1))
    zeros = ops.zeros_like(out[..., :1])
    if lse is None:  # No key tile: all the mass on the sink.
        keep, new = zeros, zeros + z
    else:
        lse = ops.reshape(ops.cast(lse, out.dtype), ops.shape(zeros))
        keep, new = kept_share(lse, z, valid)
    out = out * keep
    return out, ops.reshape(keep, (-1, g, r * n, 1)), new[..., 0]


def _row_lse(lse, valid, out):
    """A row of tiles' log-sum-exp as returned, `(b, g, r, Bq)` (the
    shape of its output `out` `(b, g, r, Bq, e)` without `e`): `-inf`
    where its queries attend to nothing (`valid` False, or no key tile:
    `lse` None)."""
    like = ops.cast(out[..., 0], softmax_dtype(out.dtype))
    if lse is None:
        return ops.full_like(like, float("-inf"))
    lse = ops.reshape(lse, ops.shape(like))
    if valid is None:
        return lse
    return ops.where(valid[..., 0], lse, ops.full_like(lse, float("-inf")))


def _one_tile(plan, q_t, ks, vh, aux, params, i0, i1, chunks):
    """`softmax(s) v` of a row with one key tile, `(b, g, r, Bq, e)` in
    `softmax_dtype`; its log-sum-exp `(b, g, q, 1)` when
    `plan.return_lse` (else None: the backward recomputes the softmax);
    validity from the row max (None when
    the row cannot be empty); the probabilities `(b, g, q, k)`."""
    g, n, e = q_t.shape[1], i1 - i0, vh.shape[-1]
    r = q_t.shape[2] // n
    (chunk,) = chunks
    _, j0, j1, _, _ = chunk
    s, _ = blockwise_tiles.scores(
        plan, aux, params, q_t, _slice(ks, 2, j0, j1), i0, i1, chunk
    )
    p = scoring.plain_softmax(s, axis=-1)
    lse = None
    if plan.return_lse or plan.sinks:
        # From the fused softmax, with two reductions and no extra pass
        # over the tile: the largest probability is exp(m - lse).
        m = ops.max(s, axis=-1, keepdims=True)
        lse = m - ops.log(ops.max(p, axis=-1, keepdims=True))
    out = ops.einsum(
        "bgqk,bgke->bgqe", ops.cast(p, vh.dtype), _slice(vh, 2, j0, j1)
    )
    out = ops.reshape(ops.cast(out, s.dtype), (-1, g, r, n, e))
    valid = None
    if not blockwise_tiles.never_empty(plan, aux, i0, chunks):
        m = ops.max(s, axis=-1, keepdims=True)
        valid = ops.reshape(scoring.rows_valid(m), (-1, g, r, n, 1))
    return out, lse, valid, p


def _online_tiles(plan, q_t, ks, vh, aux, params, i0, i1, chunks):
    """Online softmax over the key tiles of one row: the output
    `(b, g, r, Bq, e)` in `softmax_dtype`, the log-sum-exp `(b, g, q, 1)`
    and the validity `(b, g, r, Bq, 1)`.

    The scores are finite (masked ones and a score function's `-inf` at
    the fill value): a tile of masked scores gives `exp(0)` terms that
    the first tile with a real score scales away (`alpha = 0`), and a
    row that never gets one is invalid (its maximum is the fill value).
    """
    g, n, e = q_t.shape[1], i1 - i0, vh.shape[-1]
    r = q_t.shape[2] // n
    dtype = softmax_dtype(ks.dtype)
    m = row_sum = acc = None
    if plan.dynamic_mod:  # Tiles may be skipped: start from an empty row.
        m = ops.zeros_like(q_t[..., :1], dtype)
        m = m + scoring.mask_fill_value(dtype)
        row_sum = ops.zeros_like(m)
        acc = ops.zeros_like(m) + ops.zeros((e,), dtype)
    for chunk in chunks:
        _, j0, j1, _, _ = chunk
        # One key tile at a time (TensorFlow would start them all).
        q_t, ks, vh = _backend.after((q_t, ks, vh), [acc])
        tile = blockwise_tiles.grid_and_mask(plan, aux, q_t, i0, i1, chunk)

        def update(m=m, row_sum=row_sum, acc=acc, j0=j0, j1=j1, tile=tile):
            s, _ = blockwise_tiles.scores(
                plan,
                aux,
                params,
                q_t,
                _slice(ks, 2, j0, j1),
                i0,
                i1,
                chunk,
                tile,
            )
            m_c = ops.max(s, axis=-1, keepdims=True)
            m_new = m_c if m is None else blockwise_tiles.maximum(m, m_c)
            p = ops.exp(s - m_new)
            sum_c = ops.sum(p, axis=-1, keepdims=True)
            pv = ops.einsum(
                "bgqk,bgke->bgqe", ops.cast(p, vh.dtype), _slice(vh, 2, j0, j1)
            )
            pv = ops.cast(pv, s.dtype)
            if m is None:
                return m_new, sum_c, pv
            alpha = ops.exp(m - m_new)
            return m_new, row_sum * alpha + sum_c, acc * alpha + pv

        live = blockwise_tiles.live(plan, chunk, tile[1])
        if live is None:
            m, row_sum, acc = update()
        else:  # Block sparsity decided at run time.
            state = (m, row_sum, acc)
            m, row_sum, acc = ops.cond(live, update, lambda s=state: s)
    # An empty row (every tile skipped) has a zero sum and a zero result.
    out = ops.reshape(
        acc / blockwise_tiles.maximum(row_sum, 1e-30), (-1, g, r, n, e)
    )
    valid = None
    if not blockwise_tiles.never_empty(plan, aux, i0, chunks):
        valid = ops.reshape(scoring.rows_valid(m), (-1, g, r, n, 1))
    return out, m + ops.log(blockwise_tiles.maximum(row_sum, 1e-30)), valid


def blockwise_attention(
    query,
    key,
    value,
    is_causal=False,
    causal_offset=0,
    key_padding=None,
    query_padding=None,
    mask=None,
    query_block=128,
    key_block=1024,
    score_mod=None,
    mask_mod=None,
    keep_probabilities=None,
    return_lse=False,
    sink_logits=None,
):
    """Exact attention in O(T * tile) memory, forward and backward.

    Args:
        query: `(b, i, h, d)`, already multiplied by the softmax scale.
        key: `(b, j, g, d)`, `h % g == 0`.
        value: `(b, j, g, e)`.
        is_causal: query `i` may only attend to keys `j <= i + causal_offset`.
        causal_offset: int (tiles above the diagonal are skipped) or scalar
            tensor (then the causal mask is applied on every tile): the
            absolute position of the first query (also for `score_mod` and
            `mask_mod`).
        key_padding: optional bool `(b, j)`, True on real keys.
        query_padding: optional bool `(b, i)`, True on real queries (padded
            queries get zeros).
        mask: optional bool `(b|1, h|1, i, j)` (rank 4), True = may attend.
        query_block, key_block: static tile sizes (Bq, Bk); results do not
            depend on them.
        score_mod: optional `score_mod(score, batch, head, q_idx, kv_idx)`
            (see `scoring`); a Keras layer's trainable weights get
            gradients (passed to the backward pass explicitly), and so do
            the trainable variables and differentiated tensors a plain
            function reads (`captured.split_captured`; on TensorFlow a
            variable it reads that is not found so reaches the custom
            gradient's `variables`).
        mask_mod: optional `mask_mod(batch, head, q_idx, kv_idx)`; tiles a
            static one masks entirely are skipped.
        keep_probabilities: whether the backward pass reuses the forward's
            probabilities of one-tile rows (True) or recomputes them
            (False); None: `keeps_probabilities` decides (small problems
            keep them). Results do not depend on it.
        return_lse: also return the softmax's log-sum-exp `(b, h, i)`
            (float32, float64 for float64 inputs; `-inf` on rows that
            attend to nothing), differentiable (`log_sum_exp.py`).
        sink_logits: optional learned sinks `(h,)` (`log_sum_exp.py`),
            applied in each row of tiles through its log-sum-exp (no
            score column) and differentiated by the hand-written backward
            pass; the returned log-sum-exp then includes the sink.

    Returns:
        `(b, i, h, e)` in the query's dtype, and the log-sum-exp if
        `return_lse`.
    """
    b_tq, tk = query.shape[1], key.shape[1]
    h, g = query.shape[2], key.shape[2]
    r = h // g
    d, e = query.shape[-1], value.shape[-1]
    score_fn, params = scoring.split_score_mod(score_mod)
    relative_fn = scoring.split_relative_bias(score_mod)
    soft_cap = scoring.split_soft_cap(score_mod)
    if not params:  # A plain function: the tensors it reads, explicit.
        score_fn, params = captured.split_captured(
            score_mod, h, softmax_dtype(key.dtype)
        )
        if params:  # Its fast paths would read them where they are.
            relative_fn = soft_cap = None
    plan = _Plan(
        b_tq,
        tk,
        is_causal,
        causal_offset,
        query_block,
        key_block,
        heads=h,
        mask_mod=mask_mod,
        score_fn=score_fn,
        keep_probabilities=keep_probabilities,
        relative_fn=relative_fn,
        soft_cap=soft_cap,
    )
    plan.return_lse = bool(return_lse)
    plan.sinks = sink_logits is not None
    num_params = len(params)
    if plan.sinks:  # Differentiable: passed with the score parameters.
        params = tuple(params) + (ops.reshape(sink_logits, (g, r)),)
    if mask is not None:
        mask = ops.cast(mask, "bool")
    if key_padding is not None:
        key_padding = ops.cast(key_padding, "bool")
    if query_padding is not None:
        query_padding = ops.cast(query_padding, "bool")
    offset = causal_offset if not isinstance(plan.offset, int) else None

    def split(params):
        params = tuple(params)
        if not plan.sinks:
            return params, None
        return params[:num_params], params[num_params]

    def forward(q, k, v, aux, params=()):
        params, sinks = split(params)
        key_padding, query_padding, mask, offset = aux
        qh = ops.transpose(ops.reshape(q, (-1, b_tq, g, r, d)), (0, 2, 3, 1, 4))
        kh = ops.transpose(k, (0, 2, 1, 3))
        vh = ops.transpose(v, (0, 2, 1, 3))
        tile_aux = (key_padding, mask, offset)
        out, lse, *saved = _forward(
            plan, qh, kh, vh, tile_aux, params, query_padding, sinks
        )
        result = ops.reshape(
            ops.transpose(out, (0, 3, 1, 2, 4)), (-1, b_tq, h, e)
        )
        if return_lse:
            result = (result, ops.reshape(lse, (-1, h, b_tq)))
        return result, (qh, kh, vh, tile_aux, params, out, saved, sinks)

    def backward(residuals, d_result, variables=()):
        qh, kh, vh, tile_aux, params, out, saved, sinks = residuals
        d_lse = None
        if return_lse:
            d_result, d_lse = d_result
            if d_lse is not None:
                d_lse = ops.reshape(d_lse, (-1, g, r, b_tq))
        if d_result is None:  # Only the log-sum-exp is used.
            d_out = ops.zeros_like(out, qh.dtype)
        else:
            d_out = ops.transpose(
                ops.reshape(ops.cast(d_result, qh.dtype), (-1, b_tq, g, r, e)),
                (0, 2, 3, 1, 4),
            )
        args = (plan, qh, kh, vh, tile_aux, params, out, saved, d_out)
        dq, dk, dv, dparams = blockwise_backward.backward(
            *args, d_lse, sinks, variables
        )
        dq = ops.reshape(ops.transpose(dq, (0, 3, 1, 2, 4)), (-1, b_tq, h, d))
        grads = (
            dq,
            ops.transpose(dk, (0, 2, 1, 3)),
            ops.transpose(dv, (0, 2, 1, 3)),
        )
        if params or sinks is not None or variables:
            return grads + (dparams,)
        return grads

    aux = (key_padding, query_padding, mask, offset)
    return _backend.custom_vjp(forward, backward)(
        query, key, value, aux, params
    )
