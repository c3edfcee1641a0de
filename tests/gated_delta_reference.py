"""NumPy references of the gated delta rule and of the Gated DeltaNet
layer, written from the paper's recurrence (Yang, Kautz & Hatamizadeh
2025, eq. 10, "Gated Delta Networks") and keras-hub's
`Qwen3_5GatedDeltaNet`, step by step in float64, independent of
`keras_attention`'s chunked and recurrent code.

The paper writes the state as `(value_dim, key_dim)`:
`S_t = S_{t-1} (a_t (I - beta_t k_t k_t^T)) + beta_t v_t k_t^T`,
`o_t = S_t q_t`. keras-hub (and fla, and the op) store its transpose
`(key_dim, value_dim)`: `S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} +
beta_t k_t v_t^T`, `o_t = S_t^T q_t`; keras-hub's recurrent step reads
`kv_mem = sum(S * k[..., None], axis=-2)` (`S^T k`) and writes
`S += k delta^T`. `a_t = exp(g_t)`; queries scaled by `1/sqrt(key_dim)`.

`g` is `(b, t, hv)` (a decay per head) or `(b, t, hv, d)` (one per key
channel, Kimi delta attention: `S_t = (I - beta_t k_t k_t^T) diag(a_t)
S_{t-1} + beta_t k_t v_t^T`, the same for a scalar `a_t`).

A padded token (`key_mask` False) is skipped (no decay, no write, output
0); a change of segment id empties the state first.
"""

import numpy as np


def gated_delta_rule(
    q, k, v, g, beta, initial_state=None, segment_ids=None, key_mask=None
):
    """`(outputs (b, t, hv, e), final state (b, hv, d, e))` in float64;
    query/key heads repeated to the value heads."""
    q, k, v, g, beta = (np.asarray(x, "float64") for x in (q, k, v, g, beta))
    b, t, hk, d = q.shape
    hv, e = v.shape[2], v.shape[3]
    q = np.repeat(q, hv // hk, axis=2) / np.sqrt(d)
    k = np.repeat(k, hv // hk, axis=2)
    if initial_state is None:
        state = np.zeros((b, hv, d, e))
    else:
        state = np.array(initial_state, "float64")
    out = np.zeros((b, t, hv, e))
    for row in range(b):
        for step in range(t):
            if (
                segment_ids is not None
                and step > 0
                and segment_ids[row, step] != segment_ids[row, step - 1]
            ):
                state[row] = 0.0  # also where the change is at padding
            if key_mask is not None and not key_mask[row, step]:
                continue
            for head in range(hv):
                s = state[row, head]
                k_t = k[row, step, head]
                beta_t = beta[row, step, head]
                # Paper: S (a (I - beta k k^T)) + beta v k^T, transposed;
                # a decay per key channel (Kimi delta attention) decays
                # row `d` of S by `a[d]` first.
                a = np.reshape(np.exp(g[row, step, head]), (-1, 1))
                s = (np.eye(d) - beta_t * np.outer(k_t, k_t)) @ (a * s)
                s = s + beta_t * np.outer(k_t, v[row, step, head])
                state[row, head] = s
                out[row, step, head] = s.T @ q[row, step, head]
    return out, state


def attention_matrix(q, k, g, beta, segment_ids=None, key_mask=None):
    """The matrix `W` `(b, hv, t, t)` with `o = W v` (zero state): the
    rule run on the identity values (value `j` = the unit vector `e_j`
    in every head, so output `i` is row `i` of `W`)."""
    b, t = q.shape[:2]
    hv = g.shape[2]
    eye = np.broadcast_to(np.eye(t)[None, :, None, :], (b, t, hv, t))
    out, _ = gated_delta_rule(
        q, k, eye, g, beta, segment_ids=segment_ids, key_mask=key_mask
    )
    return np.transpose(out, (0, 2, 1, 3))


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(0.0, x)


def _l2(x):
    return x / np.sqrt(np.sum(x * x, -1, keepdims=True) + 1e-6)


def layer(weights, config, x, mask=None, segment_ids=None, cache=None):
    """Gated DeltaNet (keras-hub's `Qwen3_5GatedDeltaNet`) on `x` `(b, t,
    features)`, with padded tokens taken out of each row (they neither
    enter the convolution nor touch the state; their outputs are 0).

    `weights`: dict of NumPy arrays by keras-hub's names (`in_proj_qkv`,
    `in_proj_z`, `in_proj_b`, `in_proj_a`, `conv1d_kernel`, `dt_bias`,
    `A_log`, `norm`, `out_proj`); `config`: the layer's constructor
    arguments; `cache`: optional `(conv_state (b, K-1, c), state (b, hv,
    d, e))`. Returns `(output, W (b, hv, t, t) or None, (conv_state,
    state))`, `W` the attention matrix of an uncached call.
    """
    x = np.asarray(x, "float64")
    b, t, _ = x.shape
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    d, e = config["linear_key_head_dim"], config["linear_value_head_dim"]
    size = config.get("linear_conv_kernel_dim", 4)
    kernel = weights["conv1d_kernel"]  # (channels, K)
    mask = np.ones((b, t), bool) if mask is None else np.asarray(mask)
    mixed = x @ weights["in_proj_qkv"]
    channels = mixed.shape[-1]
    if cache is None:
        conv_state = np.zeros((b, size - 1, channels))
        state = None
    else:
        conv_state = np.array(cache[0], "float64")
        state = np.array(cache[1], "float64")
    conv = np.zeros_like(mixed)
    new_conv = np.zeros_like(conv_state)
    for row in range(b):
        # The row's history: the cache's inputs, then its real tokens,
        # each with its document (the cache's belongs to the first).
        history = list(conv_state[row])
        docs = [0] * (size - 1)
        doc = 0
        for step in range(t):
            if segment_ids is not None and step > 0:
                doc += int(segment_ids[row, step] != segment_ids[row, step - 1])
            if not mask[row, step]:
                continue
            history.append(mixed[row, step])
            docs.append(doc)
            taps = [
                history[-1 - j] * kernel[:, size - 1 - j]
                for j in range(size)
                if docs[-1 - j] == doc
            ]
            conv[row, step] = np.sum(taps, axis=0)
        new_conv[row] = np.array(history[-(size - 1) :])
    mixed = _silu(conv)
    kd = hk * d
    q = _l2(mixed[..., :kd].reshape(b, t, hk, d))
    k = _l2(mixed[..., kd : 2 * kd].reshape(b, t, hk, d))
    v = mixed[..., 2 * kd :].reshape(b, t, hv, e)
    beta = 1.0 / (1.0 + np.exp(-(x @ weights["in_proj_b"])))
    g = -np.exp(weights["A_log"]) * _softplus(
        x @ weights["in_proj_a"] + weights["dt_bias"]
    )
    core, state = gated_delta_rule(q, k, v, g, beta, state, segment_ids, mask)
    core = core * mask[:, :, None, None]
    eps = config.get("layer_norm_epsilon", 1e-6)
    normed = core / np.sqrt(np.mean(core**2, -1, keepdims=True) + eps)
    z = (x @ weights["in_proj_z"]).reshape(b, t, hv, e)
    gated = normed * weights["norm"] * _silu(z)
    output = gated.reshape(b, t, hv * e) @ weights["out_proj"]
    matrix = None
    if cache is None:
        matrix = attention_matrix(q, k, g, beta, segment_ids, mask)
    return output, matrix, (new_conv, state)


def layer_weights(keras_layer):
    """The NumPy weights of a built `GatedDeltaNet` (or keras-hub's
    layer) by keras-hub's names, in float64."""
    names = [
        "conv1d_kernel",
        "dt_bias",
        "A_log",
        "in_proj_qkv",
        "in_proj_z",
        "in_proj_b",
        "in_proj_a",
        "norm",
        "out_proj",
    ]
    values = keras_layer.get_weights()
    return {n: np.asarray(w, "float64") for n, w in zip(names, values)}
