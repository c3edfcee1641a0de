"""Small NumPy references of the attention formulas, independent of the
package's code, for numerical tests."""

import math

import numpy as np


def softmax(x, axis=-1):
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def masked_softmax(scores, mask):
    """Softmax over the last axis; rows with no True (or no key) get zeros."""
    scores = np.where(mask, scores, -np.inf)
    row_max = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(mask, np.exp(scores - row_max), 0.0)
    total = e.sum(-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def multi_head_attention(layer, query, value, key=None, mask=None, scale=None):
    """softmax(Q K^T * scale) V (`scale` default 1 / sqrt(d)) with the
    weights of a built
    MultiHeadAttention-layout layer; mask broadcastable to (b, h, i, j).
    With `use_gate`, each head's result is multiplied by
    sigmoid(query W_g + b_g) before the output projection.

    Returns (output (b, i, out), weights (b, h, i, j)).
    """
    key = value if key is None else key
    gated = getattr(layer, "use_gate", False)
    w = [np.asarray(v) for v in layer.weights if "/gate/" not in v.path]
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
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    scores = np.einsum("bihk,bjhk->bhij", q, k) * scale
    if mask is None:
        mask = np.ones(scores.shape, bool)
    weights = masked_softmax(scores, np.broadcast_to(mask, scores.shape))
    out = np.einsum("bhij,bjhe->bihe", weights, v)
    if gated:  # Gated attention: each head's result * sigmoid(x W_g + b_g).
        gate = [np.asarray(v) for v in layer.weights if "/gate/" in v.path]
        wg, bg = gate if len(gate) == 2 else (gate[0], 0)
        gate_logits = np.einsum("bid,dhe->bihe", query, wg) + bg
        out = out / (1.0 + np.exp(-gate_logits))
    return np.einsum("bihe,heo->bio", out, wo) + bo, weights


def qk_norm_sinks_attention(layer, query, value, mask=None):
    """`MultiHeadAttention(qk_norm=..., learned_sinks=...)` in NumPy from
    its weights (read by name): projections, each head's query and key
    normalized over its dimension ("rms": x / sqrt(mean(x^2) + eps) *
    scale; "layer": (x - mean) / sqrt(var + eps) * gamma + beta), then a
    softmax over the unmasked keys and one sink logit per head (a column
    that takes mass and has no value). Returns `(output, weights)`."""
    w = {v.path.split("/", 1)[1]: np.asarray(v) for v in layer.weights}
    eps = layer.qk_norm_epsilon

    def project(x, name):
        return np.einsum("bid,dhk->bihk", x, w[f"{name}/kernel"]) + w.get(
            f"{name}/bias", 0.0
        )

    def norm(x, name):
        if layer.qk_norm == "rms":
            x = x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps)
            return x * w[f"{name}/scale"]
        if layer.qk_norm == "layer":
            x = x - x.mean(-1, keepdims=True)
            x = x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps)
            return x * w[f"{name}/gamma"] + w[f"{name}/beta"]
        return x

    q = norm(project(query, "query"), "query_norm")
    k = norm(project(value, "key"), "key_norm")
    v = project(value, "value")
    h, g = q.shape[2], k.shape[2]
    k, v = np.repeat(k, h // g, axis=2), np.repeat(v, h // g, axis=2)
    scores = np.einsum("bihk,bjhk->bhij", q, k) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(np.broadcast_to(mask, scores.shape), scores, -np.inf)
    if "sinks" in w:
        sinks = np.broadcast_to(
            w["sinks"][None, :, None, None], scores.shape[:3] + (1,)
        )
        scores = np.concatenate([scores, sinks], axis=-1)
    m = scores.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(scores - m)
    total = e.sum(-1, keepdims=True)
    weights = np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)
    weights = weights[..., : k.shape[1]]
    out = np.einsum("bhij,bjhe->bihe", weights, v)
    out = np.einsum("bihe,heo->bio", out, w["attention_output/kernel"])
    return out + w.get("attention_output/bias", 0.0), weights


def _np(x):
    return np.asarray(x)


def attention_pooling(layer, x, mask):
    """AttentionPooling: a = softmax_t(v^T tanh(W x_t + b)) (or v^T x_t
    without `units`), pooled sum_t a_t x_t. Returns (pooled, weights)."""
    w = [np.asarray(v) for v in layer.get_weights()]
    if len(w) == 3:
        wh, bh, v = w
        h = np.tanh(x @ wh + bh)
    else:
        (v,) = w
        h = x
    weights = masked_softmax((h @ v)[..., 0], mask)
    return np.einsum("bt,btd->bd", weights, x), weights


def bahdanau(layer, query, value, value_mask, query_mask):
    """e_ij = v^T tanh(W_q q_i + W_k k_j + b) (v weight-normalized with
    `normalize`), softmax over j, c_i = sum_j a_ij v_j; rank-3 query.
    Returns (context, weights)."""
    wq = _np(layer.query_dense.kernel)
    wk = _np(layer.key_dense.kernel)
    v = _np(layer.attention_v)
    b = _np(layer.attention_bias) if layer.use_bias else 0.0
    if layer.normalize:
        v = _np(layer.attention_g) * v / np.linalg.norm(v)
    hidden = np.tanh((query @ wq)[:, :, None] + (value @ wk)[:, None] + b)
    scores = hidden @ v
    if scores.ndim == 4:
        scores = scores[..., 0]
    mask = value_mask[:, None, :] & query_mask[:, :, None]
    weights = masked_softmax(scores, mask)
    return weights @ value, weights


def luong_scores(layer, query, value):
    """Luong's score functions with the layer's weights, `(b, i, j)`."""
    d = query.shape[-1]
    if layer.score_mode == "dot":
        scores = np.einsum("bid,bjd->bij", query, value)
    elif layer.score_mode == "general":
        w = _np(layer.key_dense.kernel)  # h_t^T W_a h_s
        scores = np.einsum("bid,bjd->bij", query, value @ w)
    else:  # v_a^T tanh(W_a [h_t; h_s]) on every pair
        b, i, j = query.shape[0], query.shape[1], value.shape[1]
        pairs = np.concatenate(
            [
                np.broadcast_to(query[:, :, None], (b, i, j, d)),
                np.broadcast_to(value[:, None], (b, i, j, value.shape[-1])),
            ],
            -1,
        )
        scores = np.tanh(pairs @ _np(layer.concat_kernel)) @ _np(
            layer.attention_v
        )
        if scores.ndim == 4:
            scores = scores[..., 0]
    if layer.scale is True:
        scores = scores / np.sqrt(
            layer.units if layer.score_mode == "concat" else d
        )
    elif layer.scale == "learned":
        scores = scores * _np(layer.scale_factor)
    return scores


def luong(layer, query, value, value_mask, query_mask, positions=None):
    """Luong attention, global / local-m (window around p_t = t, or
    `positions`) / local-p (p_t = S sigmoid(v_p^T tanh(W_p h_t)), S the
    number of valid source steps, Gaussian weighting sigma = D / 2).
    Returns (context, weights)."""
    b, i, j = query.shape[0], query.shape[1], value.shape[1]
    scores = luong_scores(layer, query, value)
    mask = value_mask[:, None, :] & query_mask[:, :, None]
    s = np.arange(j)[None, None, :]
    if layer.alignment == "local-m":
        p = np.broadcast_to(
            np.arange(i) if positions is None else positions, (b, i)
        )
        mask = mask & (np.abs(s - p[..., None]) <= layer.window)
    if layer.alignment == "local-p":
        hidden = np.tanh(query @ _np(layer.position_dense.kernel))
        length = value_mask.sum(1)[:, None]
        logits = hidden @ _np(layer.position_v)
        if logits.ndim == 3:
            logits = logits[..., 0]
        p = length / (1 + np.exp(-logits))
        mask = mask & (np.abs(s - p[..., None]) <= layer.window)
    weights = masked_softmax(scores, mask)
    if layer.alignment == "local-p":
        sigma = layer.window / 2
        weights = weights * np.exp(-((s - p[..., None]) ** 2) / (2 * sigma**2))
    return weights @ value, weights


def layer_norm(x, norm):
    """`keras.layers.LayerNormalization` over the last axis, its weights."""
    gamma, beta = [np.asarray(w) for w in norm.get_weights()]
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(
        x.var(-1, keepdims=True) + norm.epsilon
    ) * gamma + beta


def feed_forward(x, ffn):
    """Two dense layers with a ReLU between (the blocks' default)."""
    w1, b1, w2, b2 = [np.asarray(w) for w in ffn.get_weights()]
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def residual(x, f, norm, norm_first):
    """Post-norm: LN(x + f(x)); pre-norm: x + f(LN(x))."""
    if norm_first:
        return x + f(layer_norm(x, norm))
    return layer_norm(x + f(x), norm)


def encoder_block(block, x, mask):
    """TransformerEncoderBlock (ReLU feed-forward, no dropout) with its
    own weights; `mask` broadcastable to (b, h, i, j)."""

    def attend(y):
        return multi_head_attention(block.self_attention, y, y, mask=mask)[0]

    x = residual(x, attend, block.self_attention_norm, block.norm_first)
    return residual(
        x,
        lambda y: feed_forward(y, block.feed_forward),
        block.feed_forward_norm,
        block.norm_first,
    )


def decoder_block(block, x, context, self_mask, cross_mask):
    """TransformerDecoderBlock: self-attention under `self_mask`,
    cross-attention to `context` under `cross_mask` (both broadcastable
    to (b, h, i, j); the caller adds the causal part), feed-forward."""
    mha = multi_head_attention
    x = residual(
        x,
        lambda y: mha(block.self_attention, y, y, mask=self_mask)[0],
        block.self_attention_norm,
        block.norm_first,
    )
    if context is not None:
        x = residual(
            x,
            lambda y: mha(
                block.cross_attention_layer, y, context, mask=cross_mask
            )[0],
            block.cross_attention_norm,
            block.norm_first,
        )
    return residual(
        x,
        lambda y: feed_forward(y, block.feed_forward),
        block.feed_forward_norm,
        block.norm_first,
    )


def t5_bucket(relative, bidirectional, num_buckets, max_distance):
    """T5's `_relative_position_bucket` (Mesh TensorFlow / HF), NumPy."""
    ret = np.zeros_like(relative)
    n = -relative
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(relative.dtype) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):
        large = max_exact + (
            np.log(n / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).astype(relative.dtype)
    large = np.minimum(large, num_buckets - 1)
    return ret + np.where(is_small, n, large)


def mixture_of_experts(layer, x, mask=None):
    """A built `MixtureOfExperts`, token by token in float64: the routing
    of `layer.routing` over the router's logits, each chosen expert's
    gated feed-forward, and keras-hub's load-balancing loss (without the
    coefficient) over the tokens where `mask` (`x.shape[:-1]`) is True.

    Returns (output (x's shape), aux_loss).
    """
    w = lambda v: None if v is None else _np(v).astype("float64")  # noqa: E731
    wr, br = w(layer.router_kernel), w(layer.router_bias_weight)
    wgu, bgu = w(layer.gate_up_kernel), w(layer.gate_up_bias)
    wd, bd = w(layer.down_kernel), w(layer.down_bias)
    e, k, i = layer.num_experts, layer.top_k, layer.intermediate_dim
    tokens = np.asarray(x, "float64").reshape(-1, x.shape[-1])
    valid = np.ones(len(tokens), bool) if mask is None else mask.reshape(-1)
    out, f, p = np.zeros_like(tokens), np.zeros(e), np.zeros(e)
    for n, t in enumerate(tokens):
        logits = t @ wr + (0.0 if br is None else br)
        probs = softmax(logits)
        if layer.routing == "softmax_topk":
            chosen = np.argsort(-probs, kind="stable")[:k]
            gates = probs[chosen]
            if layer.normalize_top_k:
                gates = gates / gates.sum()
        else:
            chosen = np.argsort(-logits, kind="stable")[:k]
            gates = softmax(logits[chosen])
        for expert, gate in zip(chosen, gates):
            h = t @ wgu[expert] + (0.0 if bgu is None else bgu[expert])
            g, u = h[:i], h[i:]
            if layer.activation == "swiglu":
                a = g / (1 + np.exp(-g)) * u
            else:
                g = np.minimum(g, layer.glu_limit)
                u = np.clip(u, -layer.glu_limit, layer.glu_limit)
                a = (u + 1) * g / (1 + np.exp(-layer.glu_alpha * g))
            y = a @ wd[expert] + (0.0 if bd is None else bd[expert])
            out[n] += gate * y
        if valid[n]:
            f[chosen] += 1.0
            p += probs
    count = max(valid.sum(), 1e-9)
    aux = e * np.sum(f / (count * k) * (p / count))
    return out.reshape(x.shape), aux


def _weights_by_name(layer):
    """A built layer's weights by path inside it (`q_proj/kernel`,
    `A_log`, `indexer/wk/kernel`, ...), float64."""
    return {
        v.path.split("/", 1)[1]: _np(v).astype("float64") for v in layer.weights
    }


def _rms_norm(x, scale, eps):
    return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps) * scale


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def kimi_delta_attention(layer, x, mask=None):
    """A built `KimiDeltaAttention` (Kimi Linear's KDA) in float64, token
    by token, with padded tokens (`mask` `(b, t)` False) taken out of the
    row: they enter neither the convolution nor the state, and output 0.

        [q, k, v] = silu(conv([x W_q, x W_k, x W_v]))  (per channel, the
            tap K - 1 on the token, tap K - 1 - j on the j-th real token
            before it)
        q, k = l2norm(q), l2norm(k)                    (per head)
        g = -exp(A_log) softplus((x W_fa) W_fb + dt_bias)  (per channel)
        beta = sigmoid(x W_b)
        S = (I - beta k k^T) diag(exp(g)) S + beta k v^T;  o = S^T q / sqrt(d)
        y = (RMSNorm(o) * sigmoid((x W_ga) W_gb)) W_o

    Returns the output `(b, t, hidden_size)`.
    """
    w = _weights_by_name(layer)
    x = np.asarray(x, "float64")
    b, t, _ = x.shape
    h, d = layer.num_heads, layer.head_dim
    kernel = w["conv1d_kernel"]  # (3 h d, K)
    size = kernel.shape[1]
    mask = np.ones((b, t), bool) if mask is None else np.asarray(mask, bool)
    mixed = np.concatenate(
        [x @ w[f"{n}_proj/kernel"] for n in ("q", "k", "v")], -1
    )
    g = (x @ w["f_a_proj/kernel"]) @ w["f_b_proj/kernel"] + w["dt_bias"]
    g = -np.exp(w["A_log"])[:, None] * np.logaddexp(0.0, g.reshape(b, t, h, d))
    beta = _sigmoid(x @ w["b_proj/kernel"])
    gate = _sigmoid((x @ w["g_a_proj/kernel"]) @ w["g_b_proj/kernel"])
    out = np.zeros((b, t, h, d))
    for row in range(b):
        history = []  # the row's real projected tokens so far
        state = np.zeros((h, d, d))
        for step in range(t):
            if not mask[row, step]:
                continue
            history.append(mixed[row, step])
            conv = sum(
                history[-1 - j] * kernel[:, size - 1 - j]
                for j in range(min(size, len(history)))
            )
            conv = conv / (1.0 + np.exp(-conv))  # silu
            q, k, v = (conv[i * h * d : (i + 1) * h * d] for i in range(3))
            q, k, v = (a.reshape(h, d) for a in (q, k, v))
            q = q / np.sqrt(np.sum(q * q, -1, keepdims=True) + 1e-6)
            k = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + 1e-6)
            for head in range(h):
                decayed = np.exp(g[row, step, head])[:, None] * state[head]
                beta_t, k_t = beta[row, step, head], k[head]
                state[head] = (
                    decayed
                    - beta_t * np.outer(k_t, k_t @ decayed)
                    + beta_t * np.outer(k_t, v[head])
                )
                o = state[head].T @ q[head] / np.sqrt(d)
                o = _rms_norm(o, w["o_norm/scale"], layer.layer_norm_epsilon)
                out[row, step, head] = o * gate[row, step].reshape(h, d)[head]
    return out.reshape(b, t, h * d) @ w["o_proj/kernel"]


def _rope_halves(x, positions, theta):
    """Rotary positions on the last axis of `x` `(b, t, ..., p)` in halves
    `(x_i, x_{i + p/2})`; `positions` `(t,)`."""
    p = x.shape[-1]
    angle = positions[:, None] * theta ** (-np.arange(0, p, 2) / p)
    shape = (1, len(positions)) + (1,) * (x.ndim - 3) + (p // 2,)
    cos, sin = np.cos(angle).reshape(shape), np.sin(angle).reshape(shape)
    x1, x2 = x[..., : p // 2], x[..., p // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def top_k_keys(scores, allowed, top_k, gap=1e-4):
    """Bool `(b, t, s)`: each query's `top_k` best `allowed` keys (all of
    them when it has fewer), equal scores lowest position first. Checks
    that the choice has a clear gap (the k-th and the next scores differ
    by more than `gap`, or are exactly equal: ReLU's zeros, which both
    sides break alike), so that float rounding cannot change it."""
    kept = np.zeros(scores.shape, bool)
    for n, i in np.ndindex(*scores.shape[:2]):
        keys = np.flatnonzero(allowed[n, i])
        order = sorted(keys, key=lambda s: (-scores[n, i, s], s))
        kept[n, i, order[:top_k]] = True
        if len(order) > top_k:
            kth, after = (
                scores[n, i, order[top_k - 1]],
                scores[n, i, order[top_k]],
            )
            if not (kth == after or kth - after > gap):
                raise ValueError(
                    f"near tie in the top-{top_k} choice of row {(n, i)}: "
                    f"{kth!r} vs {after!r}; pick weights with clearer gaps"
                )
    return kept


def lightning_indexer_scores(w, layer, x, query_inputs, positions):
    """`LightningIndexer`'s `I[t, s]` `(b, t, s)` in float64 from its
    weights `w` (by name, without the `indexer/` prefix):
    `sum_j w[t, j] ReLU(q[t, j] . k[s] / sqrt(d))`, `w[t] = x_t W_w /
    sqrt(heads)`, `q = RoPE(query_inputs W_q)`, `k = RoPE(LayerNorm(x
    W_k))` (the first `rope_head_dim` features rotated, in halves)."""
    h, d, p = layer.num_heads, layer.head_dim, layer.rope_head_dim
    b, t = x.shape[:2]
    q = (query_inputs @ w["wq_b/kernel"]).reshape(b, t, h, d)
    k = x @ w["wk/kernel"]
    mean = k.mean(-1, keepdims=True)
    var = ((k - mean) ** 2).mean(-1, keepdims=True)
    k = (k - mean) / np.sqrt(var + layer.layer_norm_epsilon)
    k = (k * w["k_norm/gamma"] + w["k_norm/beta"])[:, :, None]
    if p:
        q = np.concatenate(
            [_rope_halves(q[..., :p], positions, layer.rope_theta), q[..., p:]],
            -1,
        )
        k = np.concatenate(
            [_rope_halves(k[..., :p], positions, layer.rope_theta), k[..., p:]],
            -1,
        )
    dots = np.maximum(
        np.einsum("bthd,bsd->bths", q, k[:, :, 0]) / np.sqrt(d), 0
    )
    heads_weights = x @ w["weights_proj/kernel"] / np.sqrt(h)
    return np.einsum("bths,bth->bts", dots, heads_weights)


def multi_head_latent_attention(layer, x, mask=None):
    """A built `MultiHeadLatentAttention` (DeepSeek-V2/V3's MLA; with
    `indexer`, DeepSeek-V3.2's sparse attention) in float64, uncached,
    positions `0..t-1`, no rotary scaling, the naive form:

        q = x W_q, or RMSNorm(x W_qa) W_qb
        [c, k_rope] = x W_kv_a;  c = RMSNorm(c)
        [k_nope, v] = c W_kv_b                          (per head)
        score = [q_nope, RoPE(q_rope)] . [k_nope, RoPE(k_rope)] / sqrt(n + p)
        output = (softmax(score) v) W_o

    (DeepSeek's interleaved rope pairs gathered into halves first, with
    `rope_interleave`.) `mask` `(b, t, s)`: True where a query may attend.
    With an indexer each query attends to the `top_k` keys of the
    indexer's scores among those it may attend to (`top_k_keys`, checked
    for clear gaps). A query with no key gets zero attention (the output
    is `o_proj`'s bias). Returns `(output, weights (b, h, t, s))`.
    """
    w = _weights_by_name(layer)
    x = np.asarray(x, "float64")
    b, t, _ = x.shape
    h, n = layer.num_heads, layer.qk_nope_head_dim
    p, r = layer.qk_rope_head_dim, layer.kv_lora_rank
    eps, theta = layer.rms_norm_eps, layer.rope_theta
    positions = np.arange(t, dtype="float64")

    def dense(name, inputs):
        return inputs @ w[f"{name}/kernel"] + w.get(f"{name}/bias", 0.0)

    def rope(features):
        if theta is None:
            return features
        if layer.rope_interleave:
            features = np.concatenate(
                [features[..., 0::2], features[..., 1::2]], -1
            )
        return _rope_halves(features, positions, theta)

    q_latent = None
    if layer.q_lora_rank is None:
        q = dense("q_proj", x)
    else:
        q_latent = _rms_norm(
            dense("q_a_proj", x), w["q_a_layernorm/scale"], eps
        )
        q = dense("q_b_proj", q_latent)
    q = q.reshape(b, t, h, n + p)
    query = np.concatenate([q[..., :n], rope(q[..., n:])], -1)
    kv = dense("kv_a_proj_with_mqa", x)
    c = _rms_norm(kv[..., :r], w["kv_a_layernorm/scale"], eps)
    k_rope = rope(kv[:, :, None, r:])
    v = layer.v_head_dim  # widths named, not -1: `t` may be 0
    up = dense("kv_b_proj", c).reshape(b, t, h, n + v)
    key = np.concatenate([up[..., :n], np.repeat(k_rope, h, 2)], -1)
    allowed = np.ones((b, t, t), bool) if mask is None else np.asarray(mask)
    allowed = np.broadcast_to(allowed, (b, t, t))
    if layer.indexer is not None:
        indexer = {
            k.split("/", 1)[1]: v
            for k, v in w.items()
            if k.startswith("indexer/")
        }
        scores = lightning_indexer_scores(
            indexer, layer.indexer, x, q_latent, positions
        )
        allowed = top_k_keys(scores, allowed, layer.indexer.top_k)
    scores = np.einsum("bihd,bjhd->bhij", query, key) / np.sqrt(n + p)
    weights = masked_softmax(scores, allowed[:, None])
    heads = np.einsum("bhij,bjhv->bihv", weights, up[..., n:])
    return dense("o_proj", heads.reshape(b, t, h * v)), weights
