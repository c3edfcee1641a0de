"""Small NumPy references of the attention formulas, independent of the
package's code, for numerical tests."""

import numpy as np


def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def masked_softmax(scores, mask):
    """Softmax over the last axis; rows with no True get zeros."""
    scores = np.where(mask, scores, -np.inf)
    row_max = np.max(scores, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(mask, np.exp(scores - row_max), 0.0)
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def multi_head_attention(layer, query, value, key=None, mask=None):
    """softmax(Q K^T / sqrt(d)) V with the weights of a built
    MultiHeadAttention-layout layer; mask broadcastable to (b, h, i, j).

    Returns (output (b, i, out), weights (b, h, i, j)).
    """
    key = value if key is None else key
    w = [np.asarray(v) for v in layer.get_weights()]
    if len(w) == 8:
        wq, bq, wk, bk, wv, bv, wo, bo = w
    else:
        (wq, wk, wv, wo), (bq, bk, bv, bo) = w, (0, 0, 0, 0)
    q = np.einsum("bid,dhk->bihk", query, wq) + bq
    k = np.einsum("bjd,dgk->bjgk", key, wk) + bk
    v = np.einsum("bjd,dge->bjge", value, wv) + bv
    h, g = q.shape[2], k.shape[2]
    k = np.repeat(k, h // g, axis=2)
    v = np.repeat(v, h // g, axis=2)
    scores = np.einsum("bihk,bjhk->bhij", q, k) / np.sqrt(q.shape[-1])
    if mask is None:
        mask = np.ones(scores.shape, bool)
    weights = masked_softmax(scores, np.broadcast_to(mask, scores.shape))
    out = np.einsum("bhij,bjhe->bihe", weights, v)
    return np.einsum("bihe,heo->bio", out, wo) + bo, weights
