"""Attention rollout across layers (Abnar & Zuidema, 2020), NumPy only.

With `A_l` the attention of layer `l` averaged over its heads `(T, T)`,
the residual connection is accounted for by
`Â_l = normalize_rows(A_l / 2 + I / 2)`, and the attention that flows from
the inputs to the last layer's tokens is the product
`R = Â_L · ... · Â_2 · Â_1` (rows still sum to 1): `R[i, j]` is how much
output token `i` draws on input token `j`. With attention pooling over
the last layer's tokens (weights `w`), what the pooled vector draws on
input token `j` is `(w · R)[j]`.
"""

import numpy as np


def attention_rollout(attentions, residual=True):
    """Attention rollout across layers.

    Args:
        attentions: list of `(batch, heads, T, T)` attention weights, first
            layer first (rows sum to 1).
        residual: bool, add the identity for the residual connections
            (`A / 2 + I / 2`, rows renormalized), as in the paper.

    Returns:
        NumPy float32 `(batch, T, T)`, `R = Â_L ... Â_1`; every row sums
        to 1 when the input rows do.
    """
    if not attentions:
        raise ValueError(
            "`attentions` must hold at least one layer's weights. "
            f"Received: attentions={attentions!r}"
        )
    rollout = None
    for weights in attentions:
        # b - batch, i/j/k - tokens
        a = np.asarray(weights, "float64").mean(axis=1)  # (b, T, T)
        if residual:
            a = 0.5 * a + 0.5 * np.eye(a.shape[-1])[None]
            a = a / a.sum(axis=-1, keepdims=True)
        rollout = (
            a if rollout is None else np.einsum("bij,bjk->bik", a, rollout)
        )
    return rollout.astype("float32")


def pooled_rollout(pooling_weights, attentions, residual=True):
    """`w · R`: what the pooled vector draws on each input token.

    Args:
        pooling_weights: `(batch, T)`, the pooling weights over the last
            layer's tokens.
        attentions: the self-attention weights of the layers below the
            pooling, as for `attention_rollout`; none (an encoder without
            attention) leaves the pooling weights.

    Returns:
        NumPy float32 `(batch, T)`, summing to the pooling weights' sum.
    """
    weights = np.asarray(pooling_weights, "float64")
    if not attentions:
        return weights.astype("float32")
    rollout = attention_rollout(attentions, residual).astype("float64")
    return np.einsum("bi,bij->bj", weights, rollout).astype("float32")
