"""A NumPy port of DeBERTa's disentangled attention (Hugging Face's
`DisentangledSelfAttention` of DeBERTa-v2/v3 and keras-hub's), independent
of the package's code, for the tests of `scores.DisentangledRelativeBias`
and `layers.DisentangledSelfAttention`."""

import math

import numpy as np
from keras import ops
from references import masked_softmax


def bucket(relative, bucket_size, max_position):
    """DeBERTa's `make_log_bucket_position` of one relative position, in
    Python floats (keras-hub's order of operations)."""
    mid = bucket_size // 2
    if abs(relative) <= mid:
        return relative
    log_pos = math.ceil(
        math.log(abs(relative) / mid)
        * (mid - 1)
        / math.log((max_position - 1) / mid)
    )
    return int(math.copysign(log_pos + mid, relative))


def rows(tq, tk, bucket_size, max_position):
    """The table row of each (query i, key j): the bucket of `i - j` plus
    `bucket_size`, clipped to the `2 * bucket_size` rows."""
    out = np.zeros((tq, tk), "int64")
    for i in range(tq):
        for j in range(tk):
            b = bucket(i - j, bucket_size, max_position)
            out[i, j] = min(max(b + bucket_size, 0), 2 * bucket_size - 1)
    return out


def scores(q, k, pq, pk, bucket_size, max_position):
    """`q.k + q.pk[r] + k.pq[r]` `(b, h, i, j)`: c2p gathered by query,
    p2c by key, both at the row of `i - j`; grouped keys repeated."""
    heads = q.shape[2]
    k = np.repeat(k, heads // k.shape[2], 2)
    pk = np.repeat(pk, heads // pk.shape[1], 1)
    r = rows(q.shape[1], k.shape[1], bucket_size, max_position)
    s = np.einsum("bihd,bjhd->bhij", q, k)
    s += np.einsum("bihd,ijhd->bhij", q, pk[r])
    s += np.einsum("bjhd,ijhd->bhij", k, pq[r])
    return s


def layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


def self_attention(weights, x, padding, bucket_size, max_position, epsilon):
    """DeBERTa-v3's self-attention of `x` `(b, T, e)` with `weights`
    (NumPy: `table` `(2 bucket_size, e)`, its norm's `gamma`, `beta`
    (None: no norm), and
    the `(kernel, bias)` pairs `query`, `key`, `value` (`(e, heads,
    d)`), `output` (`(heads, d, out)`)): the table layer-normed,
    projected by the query and key projections, scores scaled by
    `1 / sqrt(3 d)`, padded keys masked (`padding` `(b, T)` bool).
    Returns `(output, weights)`."""
    table = weights["table"]
    if weights["gamma"] is not None:  # the table's layer norm
        table = layer_norm(table, weights["gamma"], weights["beta"], epsilon)
    (wq, bq), (wk, bk) = weights["query"], weights["key"]
    (wv, bv), (wo, bo) = weights["value"], weights["output"]
    q = np.einsum("bid,dhk->bihk", x, wq) + bq
    k = np.einsum("bjd,dgk->bjgk", x, wk) + bk
    v = np.einsum("bjd,dge->bjge", x, wv) + bv
    pq = np.einsum("rd,dhk->rhk", table, wq) + bq
    pk = np.einsum("rd,dgk->rgk", table, wk) + bk
    s = scores(q, k, pq, pk, bucket_size, max_position)
    s /= np.sqrt(3 * q.shape[-1])
    probabilities = masked_softmax(s, padding[:, None, None, :])
    v = np.repeat(v, q.shape[2] // v.shape[2], 2)
    out = np.einsum("bhij,bjhe->bihe", probabilities, v)
    return np.einsum("bihe,heo->bio", out, wo) + bo, probabilities


def layer_weights(layer):
    """`self_attention`'s `weights` of a built `DisentangledSelfAttention`
    (NumPy)."""

    def np_(w):
        return np.asarray(ops.convert_to_numpy(w))

    bias = layer.score_mod
    norm = bias.layer_norm
    return {
        "table": np_(bias.embeddings),
        "gamma": None if norm is None else np_(norm.gamma),
        "beta": None if norm is None else np_(norm.beta),
        "query": (np_(layer.query_dense.kernel), np_(layer.query_dense.bias)),
        "key": (np_(layer.key_dense.kernel), np_(layer.key_dense.bias)),
        "value": (np_(layer.value_dense.kernel), np_(layer.value_dense.bias)),
        "output": (
            np_(layer.output_dense.kernel),
            np_(layer.output_dense.bias),
        ),
    }
