"""NumPy references of linear attention, written as the papers'
recurrences (Katharopoulos et al. 2020, eq. 16-20; RetNet's retention,
Sun et al. 2023, eq. 1-2; gated linear attention, Yang et al. 2024,
eq. 2), step by step in float64, independent of the chunked and
recurrent code of `keras_attention.ops.linear_attention`:

    S_t = exp(a_t) S_{t-1} + phi(k_t) v_t^T
    z_t = exp(a_t) z_{t-1} + phi(k_t)
    o_t = phi(q_t)^T S_t / sqrt(d)            (unnormalised)
    o_t = phi(q_t)^T S_t / phi(q_t)^T z_t     (normalised; 0 if the
                                               denominator is 0)

A padded key (`key_mask` False) skips its step; a document start (the
segment id changes) empties the states first. Non-causal: each query
reads the sum over its document's keys (the first document's plus the
initial state).
"""

import numpy as np


def phi(name):
    """The feature maps by name, in NumPy."""
    return {
        "elu_plus_one": lambda x: np.where(
            x > 0, x + 1.0, np.exp(np.minimum(x, 0.0))
        ),
        "relu": lambda x: np.maximum(x, 0.0),
        "identity": lambda x: x,
    }[name]


def _states(state, normalize, b, h, d, e):
    if state is None:
        return np.zeros((b, h, d, e)), np.zeros((b, h, d))
    if normalize:
        return tuple(np.array(s, "float64") for s in state)
    return np.array(state, "float64"), np.zeros((b, h, d))


def _divide(num, den):
    return np.divide(num, den, out=np.zeros_like(num), where=den != 0)


def linear_attention(
    q,
    k,
    v,
    feature_map="elu_plus_one",
    causal=True,
    decay=None,
    state=None,
    segment_ids=None,
    key_mask=None,
    normalize=False,
):
    """`(output (b, t, h, e), S (b, h, d, e), z (b, h, d))` in float64
    (S and z None when not `causal`)."""
    q, k, v = (np.asarray(x, "float64") for x in (q, k, v))
    b, t, h, d = q.shape
    fq, fk = phi(feature_map)(q) / np.sqrt(d), phi(feature_map)(k)
    valid = np.ones((b, t), bool)
    if key_mask is not None:
        valid = np.asarray(key_mask, bool)
    a = np.zeros((b, t, h)) + (0.0 if decay is None else np.asarray(decay))
    s, z = _states(state, normalize, b, h, d, v.shape[-1])
    seg = np.zeros((b, t), int)
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
    out = np.zeros(v.shape[:3] + (v.shape[-1],))
    if not causal:
        return _global(fq, fk, v, seg, valid, s, z, normalize), None, None
    for i in range(t):
        if i:
            start = seg[:, i] != seg[:, i - 1]
            s[start], z[start] = 0.0, 0.0
        w = valid[:, i]
        gamma = np.exp(a[w, i])  # (b', h)
        s[w] = gamma[..., None, None] * s[w] + np.einsum(
            "bhd,bhe->bhde", fk[w, i], v[w, i]
        )
        z[w] = gamma[..., None] * z[w] + fk[w, i]
        out[:, i] = np.einsum("bhd,bhde->bhe", fq[:, i], s)
        if normalize:
            den = np.einsum("bhd,bhd->bh", fq[:, i], z)[..., None]
            out[:, i] = _divide(out[:, i], den)
    return out, s, z


def _global(fq, fk, v, seg, valid, s, z, normalize):
    out = np.zeros(v.shape)
    for r in range(fq.shape[0]):
        starts = np.r_[True, seg[r, 1:] != seg[r, :-1]]
        docs = np.cumsum(starts)
        for doc in np.unique(docs):
            members = docs == doc
            keys = members & valid[r]
            s_doc = np.einsum("thd,the->hde", fk[r, keys], v[r, keys])
            z_doc = fk[r, keys].sum(0)
            if doc == 1:  # the first document goes on from the state
                s_doc, z_doc = s_doc + s[r], z_doc + z[r]
            o = np.einsum("thd,hde->the", fq[r, members], s_doc)
            if normalize:
                den = np.einsum("thd,hd->th", fq[r, members], z_doc)
                o = _divide(o, den[..., None])
            out[r, members] = o
    return out


def weights(
    q,
    k,
    feature_map="elu_plus_one",
    decay=None,
    key_mask=None,
    normalize=False,
    segment_ids=None,
):
    """The implied causal attention matrix `(b, h, t, t)`: the weight of
    key `j` in query `i`'s output, from the unrolled recurrence."""
    q, k = np.asarray(q, "float64"), np.asarray(k, "float64")
    b, t, h, d = q.shape
    fq, fk = phi(feature_map)(q) / np.sqrt(d), phi(feature_map)(k)
    a = np.zeros((b, t, h)) + (0.0 if decay is None else np.asarray(decay))
    valid = np.ones((b, t), bool)
    if key_mask is not None:
        valid = np.asarray(key_mask, bool)
    a = np.where(valid[..., None], a, 0.0)
    seg = np.zeros((b, t), int)
    if segment_ids is not None:
        seg = np.asarray(segment_ids)
    w = np.zeros((b, h, t, t))
    for i in range(t):
        for j in range(i + 1):
            same = np.all(seg[:, j : i + 1] == seg[:, i : i + 1], axis=1)
            keep = (valid[:, j] & same)[:, None]
            gain = np.exp(a[:, j + 1 : i + 1].sum(1))  # (b, h)
            dot = np.einsum("bhd,bhd->bh", fq[:, i], fk[:, j])
            w[:, :, i, j] = np.where(keep, gain * dot, 0.0)
    if normalize:
        w = _divide(w, w.sum(-1, keepdims=True))
    return w
