"""The two forms of `linear_attention` (chunked and recurrent), its
global (non-causal) sum and its implied attention matrix.

Every function here takes the op's tensors already prepared by
`linear_attention.py`: queries feature-mapped and scaled, keys
feature-mapped and zero at padded positions, values zero there (with a
column of ones appended in the normalised form), the per-step log decay
`a` `(b, t, h)` (None: no decay; 0 at padded positions) and the
document index `doc` `(b, t)` (None: one document), all in the state's
dtype. They return the numerator `o` (before any normalisation) and the
final state.

The recurrence (`S_{-1}` the initial state, zeros by default):

    S_t = exp(a_t) [doc_t = doc_{t-1}] S_{t-1} + k_t v_t^T,
    o_t = q_t^T S_t.

Chunked form (chunks of `C` steps, `L_i` the cumulative log decay
inside the chunk up to step `i` included, `S_in` the state entering it):

    o_i = exp(L_i) q_i^T S_in + sum_{j <= i} exp(L_i - L_j) (q_i . k_j) v_j
    S_out = exp(L_{C-1}) S_in + sum_j exp(L_{C-1} - L_j) k_j v_j^T

(terms across a document start dropped). Only `L_i` and the decays
`L_i - L_j = a_{j+1} + ... + a_i` with `j <= i` are exponentiated, each
`<= 0`: no overflow whatever the decay. The latter are summed over
their own segment (`segment_sums`), never subtracted: `L_i` and `L_j`
after a decay of -1e4 are ~-1e4, and their difference in float32 is
off by the spacing there, 1e-3 (a relative error of 1e-3 in every
weight, which then depends on where the chunks start). The chunks'
entering states come from a scan over the chunks (`scan_carry`), or,
with neither decay nor documents, from an exclusive cumulative sum.

Axes in comments: b - batch, t - steps, n - chunks, i/j - query/key step
inside a chunk (`C`), h - heads, d - key features, e - value features
(plus one in the normalised form). No tensor has rank above 5.
"""

import numpy as np
from keras import ops

from keras_attention.ops._backend import cumsum
from keras_attention.ops._backend import scan_carry


def document_index(segment_ids):
    """`(b, t)` int32: how many document starts (changes of
    `segment_ids` from one step to the next) lie at or before each step;
    0 on the first document."""
    ids = ops.convert_to_tensor(segment_ids)
    change = ops.cast(ops.not_equal(ids[:, 1:], ids[:, :-1]), "int32")
    zeros = ops.zeros_like(ids[:, :1], dtype="int32")
    return ops.cumsum(ops.concatenate([zeros, change], axis=1), axis=1)


def segment_sums(a):
    """`(..., i, j)`: `a_{j+1} + ... + a_i` for `j < i`, 0 for `j >= i`,
    of the log decays `a` `(..., t)`.

    Each is a sum of its own segment's terms, never the difference
    `L_i - L_j` of two cumulative sums (which cancels: ~1e-3 off after a
    -1e4 in float32). Formed as `(lower * a) @ upper` (`lower[i, s] = [s
    <= i]`, `upper[s, j] = [s > j]`): products with 1 and 0 are exact
    (at the matrix products' precision, as the scores'), and one product
    costs less here than a cumulative sum over the `(t, t)` axes."""
    t = a.shape[-1] if a.shape[-1] is not None else ops.shape(a)[-1]
    steps = ops.arange(t, dtype="int32")
    lower = ops.cast(steps[:, None] >= steps[None, :], a.dtype)
    upper = ops.cast(steps[:, None] > steps[None, :], a.dtype)
    # An einsum: Keras's torch `matmul` returns float32 for float64.
    return ops.einsum("...is,sj->...ij", lower * a[..., None, :], upper)


def _pad_steps(x, pad, edge=False):
    """`x` `(b, t, ...)` with `pad` more steps at the end: zeros, or
    copies of the last step (`edge`)."""
    if isinstance(pad, int) and pad == 0:
        return x
    shape = list(ops.shape(x))
    shape[1] = pad
    if edge:
        return ops.concatenate([x, ops.broadcast_to(x[:, -1:], shape)], 1)
    return ops.concatenate([x, ops.zeros(shape, x.dtype)], axis=1)


def _chunks(x, n, size):
    """`(b, n * size, ...)` -> `(b, n, size, ...)`."""
    shape = ops.shape(x)
    return ops.reshape(x, (shape[0], n, size) + tuple(shape[2:]))


def _intra(qc, kc, vc, decays, docs):
    """The within-chunk part: masked, decayed `q_i . k_j` times `v_j`,
    `(b, n, i, h, e)` (`decays`: `segment_sums` `(b, n, h, i, j)`)."""
    size = qc.shape[2]
    scores = ops.einsum("bnihd,bnjhd->bnhij", qc, kc)
    mask = ops.convert_to_tensor(np.tril(np.ones((size, size), bool)))
    if docs is not None:
        same = ops.equal(docs[..., :, None], docs[..., None, :])
        mask = ops.logical_and(mask, same)[:, :, None]  # (b, n, 1, i, j)
    if decays is not None:
        if docs is not None:  # Pairs across documents: masked before exp.
            decays = ops.where(mask, decays, 0.0)
        scores = scores * ops.exp(decays)  # 0 (exp 1) for j >= i
    scores = ops.where(mask, scores, ops.zeros_like(scores))
    return ops.einsum("bnhij,bnjhe->bnihe", scores, vc)


def _scan_states(gamma, delta, state):
    """The state entering each chunk, `(b, n, h, d, e)`, and the final one:
    `S_{c+1} = gamma_c S_c + delta_c` (`gamma` `(b, n, h)`, `delta` `(b,
    n, h, d, e)`, `state` `(b, h, d, e)`)."""

    def step(carry, x):
        g, d_state = x
        return g[..., None, None] * carry + d_state, carry

    xs = (
        ops.transpose(gamma, (1, 0, 2)),
        ops.transpose(delta, (1, 0, 2, 3, 4)),
    )
    final, entering = scan_carry(step, state, xs)
    return ops.transpose(entering, (1, 0, 2, 3, 4)), final


def chunked(q, k, v, a, doc, state, chunk_size):
    """The chunked form: `(o (b, t, h, e), final state (b, h, d, e))`.

    `state` is `(b, h, d, e)` (zeros for none); `chunk_size` a positive
    int (the sequence is padded at the end to a multiple of it: padded
    steps neither write nor decay the state)."""
    t = q.shape[1]
    if t is None:  # only a TensorFlow graph; n, pad as tensors
        t = ops.shape(q)[1]
        n = (t + chunk_size - 1) // chunk_size
        pad = n * chunk_size - t
    else:
        n = -(-t // chunk_size)
        pad = n * chunk_size - t
    qc, kc, vc = (_chunks(_pad_steps(x, pad), n, chunk_size) for x in (q, k, v))
    cum = docs = decays = None
    if a is not None:
        a = _chunks(_pad_steps(a, pad), n, chunk_size)  # (b, n, i, h)
        a = ops.transpose(a, (0, 1, 3, 2))  # (b, n, h, i)
        cum = cumsum(a, axis=3)
        decays = segment_sums(a)  # (b, n, h, i, j)
    if doc is not None:
        docs = _chunks(_pad_steps(doc, pad, edge=True), n, chunk_size)
    o = _intra(qc, kc, vc, decays, docs)

    # What each chunk adds to the state, and how it carries the old one.
    key_weight = query_weight = gamma = None
    if cum is not None:
        # a_{j+1} + ... + a_{C-1}: the last row of the segment sums.
        key_weight = ops.exp(decays[..., -1, :])  # (b, n, h, j), <= 0
        query_weight = ops.exp(cum)  # (b, n, h, i)
        gamma = ops.exp(cum[..., -1])  # (b, n, h)
    if docs is not None:
        first = docs[:, :1, 0]  # the first chunk goes on from `state`
        previous = ops.concatenate([first, docs[:, :-1, -1]], axis=1)
        dtype = q.dtype
        goes_on = ops.cast(ops.equal(docs, previous[..., None]), dtype)
        in_last = ops.cast(ops.equal(docs, docs[..., -1:]), dtype)
        goes_on, in_last = goes_on[:, :, None], in_last[:, :, None]
        key_weight = in_last if key_weight is None else key_weight * in_last
        query_weight = (
            goes_on if query_weight is None else query_weight * goes_on
        )
        kept = goes_on[..., -1]  # (b, n, 1): no document starts inside
        gamma = kept if gamma is None else gamma * kept
    kw = kc
    if key_weight is not None:
        kw = kc * ops.transpose(key_weight, (0, 1, 3, 2))[..., None]
    delta = ops.einsum("bnjhd,bnjhe->bnhde", kw, vc)
    if gamma is None:
        # Neither decay nor documents: an exclusive cumulative sum.
        total = cumsum(delta, axis=1)
        entering = total - delta + state[:, None]
        final = total[:, -1] + state
    else:
        gamma = ops.broadcast_to(gamma, ops.shape(delta)[:3])
        entering, final = _scan_states(gamma, delta, state)
    inter = ops.einsum("bnihd,bnhde->bnihe", qc, entering)
    if query_weight is not None:
        inter = inter * ops.transpose(query_weight, (0, 1, 3, 2))[..., None]
    o = o + inter
    shape = ops.shape(o)
    o = ops.reshape(o, (shape[0], shape[1] * shape[2], shape[3], shape[4]))
    return o[:, :t], final


def recurrent(q, k, v, a, doc, state):
    """The recurrent form, one step at a time: `(o (b, t, h, e), final
    state (b, h, d, e))`."""
    keep = None
    if a is not None:
        keep = ops.exp(a)  # (b, t, h), a <= 0
    if doc is not None:
        previous = ops.concatenate([doc[:, :1], doc[:, :-1]], axis=1)
        goes_on = ops.cast(ops.equal(doc, previous), q.dtype)[..., None]
        keep = goes_on if keep is None else keep * goes_on
    if keep is None:
        keep = ops.ones_like(q[..., 0])
    keep = ops.broadcast_to(keep, ops.shape(q)[:3])

    def step(carry, x):
        s, _ = carry
        q_t, k_t, v_t, keep_t = x
        s = keep_t[..., None, None] * s + ops.einsum("bhd,bhe->bhde", k_t, v_t)
        o_t = ops.einsum("bhd,bhde->bhe", q_t, s)
        return (s, o_t), (s, o_t)

    steps = [ops.moveaxis(x, 1, 0) for x in (q, k, v, keep)]
    o_init = ops.zeros_like(state[..., 0, :])
    (final, _), (_, o) = scan_carry(step, (state, o_init), tuple(steps))
    return ops.moveaxis(o, 0, 1), final


def global_sum(q, k, v, state):
    """Non-causal, one document: every query reads the sum over all keys,
    `o_i = q_i^T (S_init + sum_j k_j v_j^T)`."""
    total = state + ops.einsum("bthd,bthe->bhde", k, v)
    return ops.einsum("bthd,bhde->bthe", q, total), total


def implied_weights(q, k, a, doc, causal):
    """The attention matrix the op applies, `(b, h, t, t)`: `w_ij = [j
    allowed] exp(sum_{j < s <= i} a_s) (q_i . k_j)` (q feature-mapped and
    scaled, k feature-mapped and zero at padded keys), `O(t^2)`."""
    scores = ops.einsum("bihd,bjhd->bhij", q, k)
    mask = None
    if causal:
        steps = ops.arange(ops.shape(q)[1], dtype="int32")
        mask = ops.greater_equal(steps[:, None], steps[None, :])[None]
    if doc is not None:
        same = ops.equal(doc[:, :, None], doc[:, None, :])  # (b, i, j)
        mask = same if mask is None else ops.logical_and(mask, same)
    if a is not None:
        decays = segment_sums(ops.transpose(a, (0, 2, 1)))  # (b, h, i, j)
        scores = scores * ops.exp(ops.where(mask[:, None], decays, 0.0))
    if mask is not None:
        scores = ops.where(mask[:, None], scores, ops.zeros_like(scores))
    return scores
