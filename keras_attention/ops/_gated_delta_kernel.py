"""The kernels of `gated_delta_rule`: the chunked (WY / UT-transform)
form, the recurrent form and the attention matrix the rule implies.

Inputs are prepared by `gated_delta_rule` (heads first, in the compute
dtype, float32 or float64): `q` (scaled), `k` `(b, h, t, k)`, `v` `(b,
h, t, v)`, `g`, `beta` `(b, h, t)` with padded keys already given `g = 0`
and `beta = 0` (they neither decay nor write), `start` `(b, t)` (1.0 at
the first token of every packed document but the first, else 0.0) and
the state `(b, h, k, v)`.

The recurrence (state `S` of `(key_dim, value_dim)`, keras-hub's
orientation), per token, `a_t = exp(g_t)` (0 at a document start):

    S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T q_t

Chunked form, chunks of `C` tokens, `G_i = g_1 + ... + g_i` inside the
chunk (`G_i - G_j <= 0` for `j <= i`: no exponential of a positive
number; summed as `g_{j+1} + ... + g_i` over its own segment,
`segment_sums`, never subtracted: after a decay of -1e4, `G_i` and `G_j`
are ~-1e4 and their float32 difference is off by 1e-3), `S` the state
entering the chunk: the state after token `i` is
`S_i = exp(G_i) S + sum_{j <= i} exp(G_i - G_j) k_j u_j^T` with the
"new values" `u_j = beta_j (v_j - exp(G_j) S^T k_j - sum_{l < j}
exp(G_j - G_l) (k_j . k_l) u_l)`, that is the lower-triangular system

    (I + A) U = beta V - diag(beta exp(G)) K S,
    A_jl = beta_j exp(G_j - G_l) (k_j . k_l)   (l < j, else 0),

solved once for both right-hand sides (`X_v`, `X_k` with `U = X_v - X_k
S`, the UT transform). Then

    o_i = exp(G_i) S^T q_i + sum_{j <= i} exp(G_i - G_j) (q_i . k_j) u_j
    S' = M S + B,  M = exp(G_C) I - K_w^T X_k,  B = K_w^T X_v,

with `K_w` the keys weighted by `exp(G_C - G_j)`. `M` and `B` of every
chunk are computed at once; only `S <- M S + B` runs chunk after chunk
(one matrix product per chunk), then the outputs of all chunks at once.
Packed documents: a term crosses no document start (pairs of tokens in
different documents are masked; the entering state reaches only the
tokens of the document it belongs to).

Axes in comments: b - batch, h - heads, t - positions, n - chunks, c/i/j
- positions in a chunk, k/l - key features, v - value features.
"""

import functools

from keras import ops

from keras_attention.ops._backend import compiled_kernel
from keras_attention.ops._backend import cumsum
from keras_attention.ops._backend import scan_carry
from keras_attention.ops._linear_attention_kernel import segment_sums


@compiled_kernel
def recurrent(q, k, v, g, beta, start, state):
    """The recurrence, one token per step: `(outputs (b, h, t, v),
    final state)`. Every step's state is kept (`(t, b, h, k, v)`) and the
    outputs are read from them after the loop. `g` is `(b, h, t)`, a
    decay per head, or `(b, h, t, k)`, one per key channel (Kimi delta
    attention: `S_t = (I - beta_t k_t k_t^T) diag(a_t) S_{t-1} + beta_t
    k_t v_t^T`)."""
    if len(g.shape) == 3:
        g = g[..., None]  # one decay for every key channel
    keep = 1.0 - ops.cast(start, g.dtype)[:, None, :, None]  # (b, 1, t, 1)
    decay = ops.exp(g) * keep

    def time_first(x):
        axes = (2, 0, 1) + tuple(range(3, len(x.shape)))
        return ops.transpose(x, axes)

    def step(s, x):
        k_t, v_t, a_t, beta_t = x
        s = s * a_t[..., :, None]
        recalled = ops.einsum("bhk,bhkv->bhv", k_t, s)
        delta = beta_t[..., None] * (v_t - recalled)
        s = s + k_t[..., :, None] * delta[..., None, :]
        return s, s

    xs = (time_first(k), time_first(v), time_first(decay), time_first(beta))
    final, states = scan_carry(step, state, xs)
    out = ops.einsum("bhtk,tbhkv->bhtv", q, states)
    return out, final


def _chunk_terms(k, g, beta, doc):
    """The masks and decays of chunks `(b, h, n, c, ...)`: `(G, same,
    decay, lower, to_end)`: `G` the cumulative log decay `(b, h, n, c)`,
    `same` `(b, 1, n, c, c)` True where `j <= i` in one document, `decay`
    `exp(G_i - G_j)` there (0 elsewhere), `lower` `I + A`, `to_end` the
    log decay from each position to the chunk's end, `G_{c-1} - G_j`
    `(b, h, n, c)`."""
    c = k.shape[3] if k.shape[3] is not None else ops.shape(k)[3]
    causal = ops.cast(ops.tril(ops.ones((c, c), "int32")), "bool")
    # A cumulative sum (`_backend.cumsum`: in float64 on torch too), not a
    # product with the lower triangle, which reduced-precision products
    # (TensorFloat-32) would round.
    G = cumsum(g, axis=3)
    same = ops.logical_and(doc[..., :, None] == doc[..., None, :], causal)
    same = same[:, None]
    diff = segment_sums(g)  # G_i - G_j, (b, h, n, i, j)
    zeros = ops.zeros_like(diff)
    decay = ops.where(same, ops.exp(ops.where(same, diff, zeros)), zeros)
    eye = ops.eye(c, dtype=k.dtype)
    strict = decay * (1.0 - eye)
    kk = ops.einsum("bhnik,bhnjk->bhnij", k, k)
    lower = eye + beta[..., None] * kk * strict
    return G, same, decay, lower, diff[..., -1, :]


def _chunks(x, n, c):
    """`(b, h, n * c, ...)` -> `(b, h, n, c, ...)`."""
    shape = ops.shape(x)
    return ops.reshape(x, (shape[0], shape[1], n, c) + tuple(x.shape[3:]))


def pad_time(x, pad, axis=2):
    widths = [[0, 0]] * len(x.shape)
    widths[axis] = [0, pad]
    return ops.pad(x, widths)


def document_index(start, n, c):
    """`(doc (b, n, c), doc_before (b, n, 1))`: the document index of
    every position (the count of starts up to it) and that of the
    position before each chunk (0 before the first)."""
    doc = ops.cumsum(ops.cast(start, "int32"), axis=1)
    doc = ops.reshape(doc, (ops.shape(doc)[0], n, c))
    before = ops.concatenate(
        [ops.zeros_like(doc[:, :1, -1]), doc[:, :-1, -1]], axis=1
    )
    return doc, before[..., None]


@functools.partial(compiled_kernel, static_argnames=("chunk_size",))
def chunked(q, k, v, g, beta, start, state, chunk_size):
    """The chunked form (module docstring): `(outputs (b, h, t, v), final
    state)`. `t` is padded to a multiple of `chunk_size` with tokens that
    neither decay nor write; the outputs are cut back to `t`."""
    t = ops.shape(q)[2]
    c = chunk_size
    pad = (-t) % c
    if not isinstance(pad, int) or pad:
        q, k, v = (pad_time(x, pad) for x in (q, k, v))
        g, beta = pad_time(g, pad), pad_time(beta, pad)
        start = pad_time(start, pad, axis=1)
    n = (t + pad) // c
    q, k, v, g, beta = (_chunks(x, n, c) for x in (q, k, v, g, beta))
    doc, before = document_index(start, n, c)
    G, same, decay, lower, to_end = _chunk_terms(k, g, beta, doc)
    alive = ops.cast(doc == before, q.dtype)[:, None]  # (b, 1, n, c)
    dv = v.shape[-1]
    rhs = ops.concatenate(
        [beta[..., None] * v, (beta * ops.exp(G) * alive)[..., None] * k],
        axis=-1,
    )
    x = ops.solve_triangular(lower, rhs, lower=True)
    x_v, x_k = x[..., :dv], x[..., dv:]
    # The transition S' = M S + B of every chunk.
    last = doc[..., -1:]  # (b, n, 1)
    w = ops.exp(to_end) * ops.cast(doc == last, q.dtype)[:, None]
    k_w = k * w[..., None]
    carried = (
        ops.exp(G[..., -1]) * ops.cast(last == before, q.dtype)[:, None, :, 0]
    )
    eye = ops.eye(k.shape[-1], dtype=q.dtype)
    m = carried[..., None, None] * eye - ops.einsum(
        "bhnck,bhncl->bhnkl", k_w, x_k
    )
    b = ops.einsum("bhnck,bhncv->bhnkv", k_w, x_v)

    def step(s, x):
        m_n, b_n = x
        return ops.einsum("bhkl,bhlv->bhkv", m_n, s) + b_n, s

    chunk_first = (2, 0, 1, 3, 4)
    final, entering = scan_carry(
        step,
        state,
        (ops.transpose(m, chunk_first), ops.transpose(b, chunk_first)),
    )
    entering = ops.transpose(entering, (1, 2, 0, 3, 4))  # (b, h, n, k, v)
    u = x_v - ops.einsum("bhnck,bhnkv->bhncv", x_k, entering)
    q_alive = q * (ops.exp(G) * alive)[..., None]
    out = ops.einsum("bhnck,bhnkv->bhncv", q_alive, entering)
    scores = ops.einsum("bhnik,bhnjk->bhnij", q, k) * decay
    out = out + ops.einsum("bhnij,bhnjv->bhniv", scores, u)
    shape = ops.shape(out)
    out = ops.reshape(out, (shape[0], shape[1], n * c, dv))
    return out[:, :, :t], final


@compiled_kernel
def implied_attention(q, k, g, beta, start):
    """The matrix `W` `(b, h, t, t)` with `o = W v` from a zero state:
    `W = (Q K^T * D) (I + A)^{-1} diag(beta)` over the whole sequence as
    one chunk (`D` the decays `exp(G_i - G_j)`, `j <= i` in one
    document), lower triangular."""
    t = ops.shape(q)[2]
    q, k, g, beta = (_chunks(x, 1, t) for x in (q, k, g, beta))
    doc, _ = document_index(start, 1, t)
    _, _, decay, lower, _ = _chunk_terms(k, g, beta, doc)
    eye = ops.eye(t, dtype=q.dtype)
    x = ops.solve_triangular(lower, beta[..., None, :] * eye, lower=True)
    scores = ops.einsum("bhnik,bhnjk->bhnij", q, k) * decay
    return ops.einsum("bhnij,bhnjl->bhnil", scores, x)[:, :, 0]
