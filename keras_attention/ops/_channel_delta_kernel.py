"""The kernels of `gated_delta_rule` with a decay per key channel (Kimi
delta attention, KDA): the chunked form and the attention matrix the
rule implies. The recurrent form is `_gated_delta_kernel.recurrent`'s,
which takes either decay.

Inputs as `_gated_delta_kernel`'s (prepared by `gated_delta_rule`, heads
first, in the compute dtype), except the log decay `g` `(b, h, t, k)`:
one per key channel. The recurrence, per token (`a_t = exp(g_t)`, a
vector; 0 at a document start):

    S_t = (I - beta_t k_t k_t^T) diag(a_t) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T q_t

Chunked form, chunks of `C` tokens, `G_i = g_1 + ... + g_i` (a vector)
inside the chunk, `S` the state entering it, `d` a key channel: the
state after token `i` is `S_i = diag(exp(G_i)) S + sum_{j <= i}
diag(exp(G_i - G_j)) k_j u_j^T` with the new values `u` solving

    (I + A) U = beta V - diag(beta) (exp(G) * K) S,
    A_ij = beta_i sum_d k_id k_jd exp(G_id - G_jd)    (j < i, else 0),

(the UT transform, one triangular solve for both right-hand sides: `U =
X_v - X_k S`), then

    o_i = S^T (exp(G_i) * q_i) + sum_{j <= i} P_ij u_j,
    P_ij = sum_d q_id k_jd exp(G_id - G_jd),
    S' = M S + B,  M = diag(exp(G_C)) - K_w^T X_k,  B = K_w^T X_v,

with `K_w` the keys weighted by `exp(G_C - G_j)` channel by channel. As
in the per-head form, only sums of `g` over a segment (`<= 0`) are
exponentiated, summed (`segment_sums`), never subtracted; but the pair
terms `A` and `P` carry a decay per channel, so they are formed from a
`(C, C)` matrix of decays per channel, `(b h, n, k, C, C)`: memory
`O(T C key_dim)` per head (the chunk size trades it against the steps
of the scan over chunks). Batch and heads are merged into one axis `B`
so that no tensor has rank above 5. Packed documents as in the per-head
form: no term crosses a document start.

Axes in comments: B - batch x heads, n - chunks, c/i/j - positions in a
chunk, d/k/l - key channels, v - value features.
"""

import functools

from keras import ops

from keras_attention.ops._backend import compiled_kernel
from keras_attention.ops._backend import cumsum
from keras_attention.ops._backend import scan_carry
from keras_attention.ops._gated_delta_kernel import document_index
from keras_attention.ops._gated_delta_kernel import pad_time
from keras_attention.ops._linear_attention_kernel import segment_sums


def _merge_heads(x, n, c):
    """`(b, h, n * c, ...)` -> `(b h, n, c, ...)`."""
    shape = ops.shape(x)
    rest = tuple(x.shape[3:])
    return ops.reshape(x, (shape[0] * x.shape[1], n, c) + rest)


def _pair_terms(q, k, g, beta, same):
    """`(G, diff, qk, lower)` of chunks `(B, n, c, ...)`: `G` the
    cumulative log decay `(B, n, c, k)`, `diff` the log decays `G_i -
    G_j` per channel `(B, n, k, i, j)` (`j < i`, else 0), `qk` the
    decayed pair terms `P` and `lower` `I + A` `(B, n, i, j)`, no term
    but where `same` (`(B, n, i, j)`: `j <= i` in one document)."""
    c = k.shape[2] if k.shape[2] is not None else ops.shape(k)[2]
    G = cumsum(g, axis=2)
    diff = segment_sums(ops.transpose(g, (0, 1, 3, 2)))  # (B, n, k, i, j)
    same = same[:, :, None]
    zeros = ops.zeros_like(diff)
    decay = ops.where(same, ops.exp(ops.where(same, diff, zeros)), zeros)
    k_t = ops.transpose(k, (0, 1, 3, 2))  # (B, n, k, c)
    keyed = decay * k_t[..., None, :]  # k_jd exp(G_id - G_jd)
    qk = ops.einsum("bndij,bndi->bnij", keyed, ops.transpose(q, (0, 1, 3, 2)))
    kk = ops.einsum("bndij,bndi->bnij", keyed, k_t)
    eye = ops.eye(c, dtype=k.dtype)
    lower = eye + beta[..., None] * kk * (1.0 - eye)
    return G, diff, qk, lower


def _same_document(doc, heads):
    """`(B, n, i, j)` True where `j <= i` in one document, of the
    document index `doc` `(b, n, c)` repeated over `heads`."""
    c = doc.shape[-1] if doc.shape[-1] is not None else ops.shape(doc)[-1]
    causal = ops.cast(ops.tril(ops.ones((c, c), "int32")), "bool")
    same = ops.logical_and(doc[..., :, None] == doc[..., None, :], causal)
    return _repeat_heads(same, heads)


def _repeat_heads(x, heads):
    """`(b, ...)` -> `(b heads, ...)`, row `b` repeated (batch major, as
    `_merge_heads` lays the heads out)."""
    shape = ops.shape(x)
    x = ops.broadcast_to(x[:, None], (shape[0], heads) + tuple(shape[1:]))
    return ops.reshape(x, (shape[0] * heads,) + tuple(shape[1:]))


@functools.partial(compiled_kernel, static_argnames=("chunk_size",))
def chunked(q, k, v, g, beta, start, state, chunk_size):
    """The chunked form (module docstring): `(outputs (b, h, t, v), final
    state (b, h, k, v))`. `t` is padded to a multiple of `chunk_size`
    with tokens that neither decay nor write; the outputs are cut back
    to `t`."""
    shape = ops.shape(q)
    b, h, t = shape[0], q.shape[1], shape[2]
    c = chunk_size
    pad = (-t) % c
    if not isinstance(pad, int) or pad:
        q, k, v, g, beta = (pad_time(x, pad) for x in (q, k, v, g, beta))
        start = pad_time(start, pad, axis=1)
    n = (t + pad) // c
    q, k, v, g, beta = (_merge_heads(x, n, c) for x in (q, k, v, g, beta))
    doc, before = document_index(start, n, c)
    same = _same_document(doc, h)
    doc, before = _repeat_heads(doc, h), _repeat_heads(before, h)
    G, diff, qk, lower = _pair_terms(q, k, g, beta, same)
    alive = ops.cast(doc == before, q.dtype)  # (B, n, c)
    dv = v.shape[-1]
    rhs = ops.concatenate(
        [beta[..., None] * v, (beta * alive)[..., None] * ops.exp(G) * k],
        axis=-1,
    )
    x = ops.solve_triangular(lower, rhs, lower=True)
    x_v, x_k = x[..., :dv], x[..., dv:]
    # The transition S' = M S + B of every chunk.
    last = doc[..., -1:]  # (B, n, 1)
    to_end = ops.transpose(diff[..., -1, :], (0, 1, 3, 2))  # (B, n, c, k)
    in_last = ops.cast(doc == last, q.dtype)[..., None]
    k_w = k * ops.exp(to_end) * in_last
    carried = ops.exp(G[:, :, -1]) * ops.cast(last == before, q.dtype)
    eye = ops.eye(k.shape[-1], dtype=q.dtype)
    m = carried[..., None] * eye - ops.einsum("bnck,bncl->bnkl", k_w, x_k)
    b_ = ops.einsum("bnck,bncv->bnkv", k_w, x_v)

    def step(s, x):
        m_n, b_n = x
        return ops.einsum("bkl,blv->bkv", m_n, s) + b_n, s

    state = ops.reshape(state, (b * h,) + tuple(state.shape[2:]))
    chunk_first = (1, 0, 2, 3)
    final, entering = scan_carry(
        step,
        state,
        (ops.transpose(m, chunk_first), ops.transpose(b_, chunk_first)),
    )
    entering = ops.transpose(entering, chunk_first)  # (B, n, k, v)
    u = x_v - ops.einsum("bnck,bnkv->bncv", x_k, entering)
    q_alive = q * ops.exp(G) * alive[..., None]
    out = ops.einsum("bnck,bnkv->bncv", q_alive, entering)
    out = out + ops.einsum("bnij,bnjv->bniv", qk, u)
    out = ops.reshape(out, (b, h, n * c, dv))
    final = ops.reshape(final, (b, h) + tuple(final.shape[1:]))
    return out[:, :, :t], final


@compiled_kernel
def implied_attention(q, k, g, beta, start):
    """The matrix `W` `(b, h, t, t)` with `o = W v` from a zero state:
    `W = P (I + A)^{-1} diag(beta)` over the whole sequence as one chunk
    (`P`, `A` the decayed pair terms of the module docstring), lower
    triangular. `O(T^2 key_dim)` memory."""
    shape = ops.shape(q)
    b, h, t = shape[0], q.shape[1], shape[2]
    q, k, g, beta = (_merge_heads(x, 1, t) for x in (q, k, g, beta))
    doc, _ = document_index(start, 1, t)
    _, _, qk, lower = _pair_terms(q, k, g, beta, _same_document(doc, h))
    eye = ops.eye(t, dtype=q.dtype)
    x = ops.solve_triangular(lower, beta[..., None, :] * eye, lower=True)
    weights = ops.einsum("bnij,bnjl->bnil", qk, x)
    return ops.reshape(weights, (b, h, t, t))
