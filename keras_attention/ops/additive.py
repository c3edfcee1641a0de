"""Additive (Bahdanau) attention scores without the `(b, i, j, u)` tensor.

    e_ij = sum_u v_u tanh(q_iu + k_ju)

A direct broadcast materializes `tanh(q_i + k_j)` for every query/key pair
and unit: `b * Tq * Tk * units` values, kept again for the backward pass.
`additive_scores` walks over chunks of queries instead (a `map` in the
forward pass) and has its own gradient that recomputes each chunk's `tanh`
(a loop in the backward pass), so the extra memory of both passes is a
few chunks of about `max(max_chunk_elements, b * Tk * units)` values,
whatever `Tq`. Shapes known to fit in one chunk, and single queries (one
decoder step), are differentiated by plain autodiff.

Gradients (t = tanh(q_i + k_j), g = dL/de):
    dL/dq_iu = sum_j g_ij v_u (1 - t_iju^2)
    dL/dk_ju = sum_i g_ij v_u (1 - t_iju^2)
    dL/dv_u  = sum_ij g_ij t_iju

Axes in comments: b - batch, i - queries, c - queries of one chunk,
j - keys, u - units, n - chunks.
"""

from keras import ops

# About 16 MB of float32 per chunk tensor.
DEFAULT_MAX_CHUNK_ELEMENTS = 2**22


def _static(*xs):
    return all(isinstance(x, int) for x in xs)


def _chunk_plan(b, i, j, u, max_chunk_elements):
    """Queries per chunk `c` and number of chunks `n` (ints or tensors)."""
    if _static(b, i, j, u):
        c = max(1, min(i, max_chunk_elements // max(1, b * j * u)))
        return c, -(-i // c)
    b, i, j = (ops.cast(x, "int32") for x in (b, i, j))
    per_query = ops.maximum(b * j * u, 1)
    c = ops.maximum(1, ops.minimum(i, max_chunk_elements // per_query))
    return c, (i + c - 1) // c


def _to_chunks(x, c, n):
    """`(b, i, f)` -> `(n, b, c, f)`, zero-padding the query axis."""
    b, i, f = ops.shape(x)
    pad = n * c - i
    if not (_static(pad) and pad == 0):
        x = ops.concatenate([x, ops.zeros((b, pad, f), x.dtype)], axis=1)
    return ops.transpose(ops.reshape(x, (b, n, c, f)), (1, 0, 2, 3))


def _from_chunks(x, i):
    """`(n, b, c, f)` -> `(b, i, f)`."""
    n, b, c, f = ops.shape(x)
    x = ops.reshape(ops.transpose(x, (1, 0, 2, 3)), (b, n * c, f))
    return x[:, :i]


def _chunk_scores(q, k, v):
    # q: (b, c, u), k: (b, j, u), v: (u,) -> (b, c, j)
    t = ops.tanh(ops.expand_dims(q, 2) + ops.expand_dims(k, 1))  # b c j u
    return ops.einsum("bcju,u->bcj", t, v)


def _chunk_grads(q, k, v, g):
    t = ops.tanh(q[:, :, None, :] + k[:, None, :, :])  # b c j u
    dt = g[..., None] * v * (1.0 - ops.square(t))  # b c j u
    dq = ops.sum(dt, axis=2)  # b c u
    dk = ops.sum(dt, axis=1)  # b j u
    dv = ops.einsum("bcj,bcju->u", g, t)
    return dq, dk, dv


def additive_scores(query, key, v, max_chunk_elements=None):
    """`e_ij = v^T tanh(q_i + k_j)` with memory bounded in both passes.

    Args:
        query: `(b, Tq, units)`, the projected queries (add any bias here).
        key: `(b, Tk, units)`, the projected keys.
        v: `(units,)`, the score vector.
        max_chunk_elements: int, about how many `tanh` values one chunk
            holds (default `2**22`); the extra memory is a few of these.

    Returns:
        `(b, Tq, Tk)` scores in the query's dtype.
    """
    max_chunk_elements = max_chunk_elements or DEFAULT_MAX_CHUNK_ELEMENTS
    # Read variables here: the custom-gradient function must see tensors.
    query, key, v = (ops.copy(x) for x in (query, key, v))
    b, i, u = ops.shape(query)
    j = ops.shape(key)[1]
    if (_static(i) and i == 1) or (
        _static(b, i, j, u) and b * i * j * u <= max_chunk_elements
    ):
        # Small enough (e.g. one decoder step): plain autodiff, which also
        # differentiates inside loops under XLA.
        return _chunk_scores(query, key, v)
    c, n = _chunk_plan(b, i, j, u, max_chunk_elements)
    single = _static(n) and n == 1

    @ops.custom_gradient
    def scores_fn(query, key, v):
        # The forward pass must not be recorded by an eager gradient tape
        # (it would keep every chunk's `tanh` alive): the gradient is ours.
        q_, k_, v_ = (ops.stop_gradient(x) for x in (query, key, v))
        if single:
            scores = _chunk_scores(q_, k_, v_)
        else:
            chunks = ops.map(
                lambda q: _chunk_scores(q, k_, v_), _to_chunks(q_, c, n)
            )  # n b c j
            scores = _from_chunks(chunks, i)

        def grad(*args, upstream=None):
            g = args[0] if upstream is None else upstream
            g = ops.cast(g, query.dtype)
            if single:
                return _chunk_grads(query, key, v, g)

            q_chunks, g_chunks = _to_chunks(query, c, n), _to_chunks(g, c, n)

            def body(index, carry):
                dq, dk, dv = carry
                dq_c, dk_c, dv_c = _chunk_grads(
                    q_chunks[index], key, v, g_chunks[index]
                )
                dq = ops.slice_update(dq, (index, 0, 0, 0), dq_c[None])
                return dq, dk + dk_c, dv + dv_c

            init = (
                ops.zeros_like(q_chunks),
                ops.zeros_like(key),
                ops.zeros_like(v),
            )
            dq, dk, dv = ops.fori_loop(0, n, body, init)
            return _from_chunks(dq, i), dk, dv

        return scores, grad

    return scores_fn(query, key, v)


def additive_scores_reference(query, key, v):
    """The direct broadcast (materializes `(b, Tq, Tk, units)`)."""
    return ops.einsum(
        "biju,u->bij", ops.tanh(query[:, :, None, :] + key[:, None, :, :]), v
    )
