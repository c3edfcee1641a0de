"""The backward pass of blockwise attention (`blockwise.py`): each
tile's gradients from its probabilities, kept by the forward pass or
recomputed (from the saved log-sum-exp, or the softmax of a one-tile
row), `dV = P^T dO`, `dP = dO V^T`, `dS = P * (dP - (D - dlse))`,
`dQ = dS K`, `dK = dS^T Q`; the query tiles last to first, each key
tile's gradient summed as it comes; a score function differentiated tile
by tile; learned sinks through `keep` (`blockwise._sink_row`).

Axes as in `blockwise.py`.
"""

from keras import ops

from keras_attention.ops import _backend
from keras_attention.ops import blockwise_tiles
from keras_attention.ops import scoring
from keras_attention.ops.scoring import score_dtype
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import keras_utils

_slice = keras_utils.slice_axis


def concat_rows(tiles):
    """Query tiles `(b, g, r, Bq, .)` joined along the query axis."""
    return tiles[0] if len(tiles) == 1 else ops.concatenate(tiles, axis=3)


def key_chunks(stop, size):
    """Key tiles `[j0, j1)` on the global grid of `size`, cut at `stop`."""
    return [
        (c, a, min(a + size, stop)) for c, a in enumerate(range(0, stop, size))
    ]


def _row_terms(d_out, out, d_lse, valid, i0, i1, dtype):
    """A row of tiles' `dO` `(b, g, r, Bq, e)` (zero on the queries that
    attend to nothing), `D - dlse` `(b, g, r, Bq, 1)` with `D_i = dO_i .
    O_i` in `dtype` (float32 or float64), and the same with every row's
    dlse for the sinks' gradient (a row that attends to nothing has lse
    = z there, the sink's share 1; without sinks its lse is -inf, a
    constant)."""
    do_t = _slice(d_out, 3, i0, i1)
    if valid is not None:
        do_t = ops.where(valid, do_t, ops.zeros_like(do_t))
    dd_t = ops.sum(
        ops.cast(do_t, dtype) * ops.cast(_slice(out, 3, i0, i1), dtype),
        axis=-1,
        keepdims=True,
    )
    sink_dd = dd_t
    if d_lse is not None:
        dl_t = ops.cast(_slice(d_lse, 3, i0, i1)[..., None], dtype)
        sink_dd = dd_t - dl_t
        if valid is not None:
            dl_t = ops.where(valid, dl_t, ops.zeros_like(dl_t))
        dd_t = dd_t - dl_t
    return do_t, dd_t, sink_dd


def _sink_terms(keep_t, sink_dd, do_t, dd_t):
    """Learned sinks in a row's backward pass: `P' = keep * P` (P without
    the sink, as kept or recomputed), so `dS = P * (keep dO V^T - keep (D
    - dlse))`: `dO` `(b, g, q, e)` and `D - dlse` `(b, g, q, 1)` scaled by
    `keep`; and the sinks' gradient `(g, r)`, `sum_i (1 - keep_i)(dlse_i
    - D_i)` summed over the batch, per query row `(g, q)`."""
    keep_t = ops.cast(keep_t, dd_t.dtype)
    sink_dd = ops.reshape(sink_dd, ops.shape(dd_t))
    contribution = ops.sum(-(1.0 - keep_t) * sink_dd, axis=(0, 3))  # (g, q)
    return (
        do_t * ops.cast(keep_t, do_t.dtype),
        dd_t * keep_t,
        contribution,
    )


def backward(
    plan,
    qh,
    kh,
    vh,
    aux,
    params,
    out,
    saved,
    d_out,
    d_lse=None,
    sinks=None,
    variables=(),
):
    """Gradients w.r.t. `qh, kh, vh` (and a score function's `params`)
    from each tile's probabilities: kept by the forward pass
    (`plan.keep_probabilities`), else recomputed (the softmax of a
    one-tile row, or from the saved log-sum-exp). A score function is
    differentiated tile by tile (`_backend.vjp`). `d_lse` `(b, g, r, i)`:
    the gradient of the returned log-sum-exp, if any (`d lse_i / d s_ij =
    P_ij`, so `dS = P * (dP - (D - dlse))`). With learned `sinks` `(g,
    r)` (each row's kept share `keep` saved by the forward pass), also
    their gradient `sum_i p_sink,i (dlse_i - D_i)`, `p_sink = 1 - keep`,
    appended to the parameters' gradients (`_sink_terms`). `variables`
    (TensorFlow: those the score function reads itself, which the custom
    gradient gets): their gradients come last, summed over the tiles as
    the parameters' are."""
    g, r, d, e = qh.shape[1], qh.shape[2], qh.shape[-1], vh.shape[-1]
    dtype = qh.dtype
    sm_dtype = softmax_dtype(kh.dtype)
    ks = ops.cast(kh, score_dtype(kh.dtype))
    dqs = []
    dks, dvs = {}, {}
    dparams = [ops.zeros_like(p) for p in tuple(params) + tuple(variables)]
    dz = None if sinks is None else ops.zeros((g, r), sm_dtype)
    # Last query tile first: with a causal structure each key tile then
    # gets ever shorter contributions, summed as they come (not kept).
    rows = list(zip(plan.rows, *saved))[::-1]
    for (i0, i1, chunks), lse_t, valid, p_t, keep_t in rows:
        n = i1 - i0
        if not chunks:
            dqs.append(ops.zeros_like(qh[:, :, :, i0:i1]))
            if sinks is not None and d_lse is not None:  # p_sink = 1.
                row = ops.cast(_slice(d_lse, 3, i0, i1), sm_dtype)
                dz = dz + ops.sum(row, axis=(0, 3))
            continue
        do_t, dd_t, sink_dd = _row_terms(
            d_out, out, d_lse, valid, i0, i1, sm_dtype
        )
        # One row of tiles at a time (TensorFlow would start them all).
        previous = dqs[-1:] + [x[0] for x in list(dks.values())[-1:]]
        previous += [x[0] for x in list(dvs.values())[-1:]]
        q_src, k_src, ks_src, v_src = _backend.after((qh, kh, ks, vh), previous)
        q_t = ops.reshape(_slice(q_src, 3, i0, i1), (-1, g, r * n, d))
        do_t = ops.reshape(do_t, (-1, g, r * n, e))
        dd_t = ops.reshape(dd_t, (-1, g, r * n, 1))
        if sinks is not None:
            do_t, dd_t, d_sinks = _sink_terms(keep_t, sink_dd, do_t, dd_t)
            dz = dz + ops.sum(ops.reshape(d_sinks, (g, r, n)), axis=2)
        dq_t, last = None, []
        for chunk in chunks:
            c, j0, j1, _, _ = chunk
            # One key tile at a time within the row, too.
            q_t, k_src, ks_src, v_src = _backend.after(
                (q_t, k_src, ks_src, v_src), last
            )
            k_c, v_c = _slice(k_src, 2, j0, j1), _slice(v_src, 2, j0, j1)
            tile = blockwise_tiles.grid_and_mask(plan, aux, q_t, i0, i1, chunk)

            def grads(
                q_t=q_t,
                k_c=k_c,
                v_c=v_c,
                ks_src=ks_src,
                j0=j0,
                j1=j1,
                chunk=chunk,
                tile=tile,
            ):
                p, pull = p_t, None  # p_t: kept by the forward pass.
                if p_t is None or plan.score_fn is not None:
                    p, pull = recompute(
                        plan,
                        params,
                        q_t,
                        ks_src,
                        i0,
                        i1,
                        j0,
                        j1,
                        tile,
                        p_t,
                        lse_t,
                        variables,
                    )
                dv_c = ops.einsum("bgqk,bgqe->bgke", ops.cast(p, dtype), do_t)
                dp = ops.einsum("bgqe,bgke->bgqk", do_t, v_c)
                ds = p * (ops.cast(dp, sm_dtype) - dd_t)
                d_params = ()
                if pull is not None:  # Back through the score function.
                    shape = ops.shape(ds)
                    ds, *d_params = pull(
                        ops.reshape(ds, (-1, plan.heads, n, j1 - j0))
                    )
                    ds = ops.reshape(ds, shape)
                if not d_params:  # No pullback reaches them: zeros.
                    d_params = [ops.zeros_like(p) for p in dparams]
                ds = ops.cast(ds, dtype)
                dq_c = ops.einsum("bgqk,bgkd->bgqd", ds, k_c)
                dk_c = ops.einsum("bgqk,bgqd->bgkd", ds, q_t)
                return (dq_c, dk_c, dv_c) + tuple(d_params)

            live = blockwise_tiles.live(plan, chunk, tile[1])
            if live is None:
                dq_c, dk_c, dv_c, *d_params = grads()
            else:  # Block sparsity decided at run time.
                zeros = tuple(map(ops.zeros_like, [q_t, k_c, v_c] + dparams))
                dq_c, dk_c, dv_c, *d_params = ops.cond(
                    live, grads, lambda z=zeros: z
                )
            dparams = [a + b for a, b in zip(dparams, d_params)]
            dq_t = dq_c if dq_t is None else dq_t + dq_c
            # The parameters' gradients too: a tile's `ds` would otherwise
            # stay alive until its (unscheduled) parameter sums run.
            last = [dq_t, dk_c, dv_c] + dparams
            accumulate(dks, c, dk_c)
            accumulate(dvs, c, dv_c)
        dqs.append(ops.reshape(dq_t, (-1, g, r, n, d)))
    dq = concat_rows(dqs[::-1])
    dk, dv = gather_keys(plan, dks, kh), gather_keys(plan, dvs, vh)
    if sinks is not None:  # After the parameters, before the variables.
        dparams.insert(len(params), ops.cast(dz, sinks.dtype))
    return dq, dk, dv, tuple(dparams)


def recompute(
    plan, params, q_t, ks, i0, i1, j0, j1, tile, p_t, lse_t, variables=()
):
    """A tile's probabilities `(b, g, q, k)` for the backward pass and the
    pullback of its score function (None without one). Kept
    probabilities `p_t` are reused: with a score function only the raw
    scores are recomputed then (for the pullback), no softmax. The score
    function runs once, its output serving both. Soft-capping keeps
    `tanh` of the raw scores for its derivative; a relative bias needs no
    raw scores for its pullback (d score / d raw = 1). The pullback gives
    the gradients w.r.t. the scores, the parameters, then `variables`
    (TensorFlow's: read by the score function itself)."""
    g, rows = q_t.shape[1], q_t.shape[2]
    grid, mask = tile
    k_c = _slice(ks, 2, j0, j1)
    if plan.soft_cap is not None:
        t = blockwise_tiles.soft_capped_tanh(plan, q_t, k_c, i0, i1)

        def pull(ds):
            return (_backend.tanh_grad(t, ds),)

        def scores():
            return plan.soft_cap * t

    elif plan.relative_fn is not None and (params or not variables):
        pull = None
        if params:
            pull = blockwise_tiles.relative_pullback(
                plan, params, grid, j1 - j0, variables
            )

        def scores():
            raw = blockwise_tiles.raw_scores(plan, q_t, k_c, i0, i1)
            return blockwise_tiles.relative_scores(plan, params, raw, grid)

    else:
        s = blockwise_tiles.raw_scores(plan, q_t, k_c, i0, i1)
        pull = None
        if plan.score_fn is not None:

            def fn(scores, *p):
                # As `scoring.modify_scores`: -inf raised to the fill.
                out = ops.cast(plan.score_fn(p, scores, *grid), scores.dtype)
                return scoring.finite_scores(out)

            s, pull = _backend.vjp(fn, (s,) + tuple(params), variables)

        def scores():
            return s

    if p_t is not None:
        return p_t, pull
    s, _ = scoring.modify_scores(scores(), grid, None, None, mask)
    s = ops.reshape(s, (-1, g, rows, j1 - j0))
    p = scoring.plain_softmax(s, -1) if lse_t is None else ops.exp(s - lse_t)
    return p, pull


def accumulate(store, c, grad):
    """Adds the contribution `(b, g, length, .)` of a row of tiles to key
    tile `c`: it covers the tile's first `length` keys, and arrives no
    longer than the previous ones, so the keys past it are final and split
    off (no padding, no list of every contribution kept)."""
    if c not in store:
        store[c] = [grad, []]
        return
    total, tails = store[c]
    length = grad.shape[2]
    if length < total.shape[2]:
        tails.append(total[:, :, length:])
        total = total[:, :, :length]
    store[c][0] = total + grad


def gather_keys(plan, store, like):
    """The summed contributions of every key tile, laid out along `j`."""
    parts = []
    for c, j0, j1 in key_chunks(plan.tk, plan.key_block):
        if c not in store:
            parts.append(ops.zeros_like(like[:, :, j0:j1]))
            continue
        total, tails = store[c]
        parts += [total] + tails[::-1]
        missing = j1 - j0 - sum(x.shape[2] for x in [total] + tails)
        if missing:
            parts.append(ops.zeros_like(like[:, :, j1 - missing : j1]))
    return parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=2)
