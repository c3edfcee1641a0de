"""The computations of `MixtureOfExperts`: routing, the experts' gated
activations, the load-balancing loss, and the copy of keras-hub's weights.

Functions of tensors (`keras.ops` only), so that the layer module holds the
arguments, weights and config, and each convention here can be read against
keras-hub's (`keras_hub/src/models/{mixtral,qwen3_moe,gpt_oss}/*_decoder.py`,
0.32).
"""

import keras
import numpy as np
from keras import ops

from keras_attention.utils.keras_utils import constant

ROUTINGS = ("softmax_topk", "topk_softmax", "sigmoid_topk")
ACTIVATIONS = ("swiglu", "gpt_oss_glu")


def softmax(x):
    """The softmax over the last axis, `exp(x - logsumexp(x))`, in `x`'s
    dtype (1 exactly over one logit): `keras.ops.softmax` warns ("Did
    you mean to use a sigmoid instead?") on every call over an axis of
    size 1, which one expert or one routed logit (`top_k=1`,
    `"topk_softmax"`) is, and where 1 is the right answer. (A max-shifted
    `exp / sum` would need `ops.max`, which refuses no tokens on
    TensorFlow and PyTorch.)"""
    return ops.exp(x - ops.logsumexp(x, axis=-1, keepdims=True))


def route(logits, top_k, routing, normalize_top_k):
    """The routing weights of every token over every expert.

    Args:
        logits: `(tokens, num_experts)`, the router's logits, in the
            routing dtype (float32 or float64).
        top_k: int, experts per token.
        routing: `"softmax_topk"` (softmax over all experts, then the `top_k`
            largest probabilities: Mixtral, Qwen3-MoE) or `"topk_softmax"`
            (the `top_k` largest logits, then a softmax over them: gpt-oss).
        normalize_top_k: bool, divide the kept probabilities by their sum
            (`"softmax_topk"` only; the other routing sums to 1 already).

    Returns:
        `(weights, selected)`: `weights` `(tokens, num_experts)`, zero
        outside each token's `top_k` experts; `selected` `(tokens,
        num_experts)`, 1.0 for the chosen experts (for the load-balancing
        loss).
    """
    num_experts = logits.shape[-1]
    if routing == "softmax_topk":
        values, indices = ops.top_k(softmax(logits), k=top_k)
        if normalize_top_k:
            values = values / ops.sum(values, axis=-1, keepdims=True)
    else:
        values, indices = ops.top_k(logits, k=top_k)
        values = softmax(values)
    one_hot = ops.cast(ops.one_hot(indices, num_experts), logits.dtype)
    weights = ops.sum(one_hot * values[..., None], axis=1)
    return weights, ops.sum(one_hot, axis=1)


def route_sigmoid(
    logits, top_k, normalize_top_k, correction=None, groups=(1, 1)
):
    """DeepSeek-V3's routing weights of every token over every expert
    (`transformers`' `DeepseekV3TopkRouter`): the scores are
    `sigmoid(logits)`; the experts are chosen by `scores + correction`
    (the score-correction bias, which steers the choice but not the
    weights), among those of the `top_k_groups` groups whose two best
    corrected scores sum highest (`groups = (num_groups, top_k_groups)`,
    `num_experts / num_groups` consecutive experts a group; one group:
    no limit); the chosen experts' weights are their scores, divided by
    their sum (plus 1e-20) when `normalize_top_k`.

    Args:
        logits: `(tokens, num_experts)`, the router's logits, in the
            routing dtype.
        top_k: int, experts per token.
        normalize_top_k: bool.
        correction: None or `(num_experts,)`, the score-correction bias.
        groups: `(num_groups, top_k_groups)`.

    Returns:
        `(weights, selected)`, as `route`'s.
    """
    num_experts = logits.shape[-1]
    scores = ops.sigmoid(logits)
    choice = scores
    if correction is not None:
        choice = scores + ops.cast(correction, scores.dtype)
    num_groups, top_k_groups = groups
    if num_groups > 1:
        choice = _in_top_groups(choice, num_groups, top_k_groups)
    indices = ops.top_k(choice, k=top_k)[1]
    one_hot = ops.cast(ops.one_hot(indices, num_experts), logits.dtype)
    selected = ops.sum(one_hot, axis=1)
    weights = selected * scores
    if normalize_top_k:
        total = ops.sum(weights, axis=-1, keepdims=True)
        weights = weights / (total + constant(1e-20, weights.dtype))
    return weights, selected


def _in_top_groups(choice, num_groups, top_k_groups):
    """`choice` `(tokens, num_experts)` with `-inf` outside each token's
    `top_k_groups` best groups (a group's score: the sum of its two best
    choices)."""
    size = choice.shape[-1] // num_groups
    grouped = ops.reshape(choice, (-1, num_groups, size))
    group_scores = ops.sum(ops.top_k(grouped, k=2)[0], axis=-1)
    best = ops.top_k(group_scores, k=top_k_groups)[1]
    kept = ops.sum(ops.one_hot(best, num_groups), axis=1)  # (tokens, groups)
    kept = ops.repeat(kept, size, axis=-1) > 0
    return ops.where(kept, choice, ops.full_like(choice, float("-inf")))


def load_balancing_loss(logits, selected, top_k, token_mask=None):
    """keras-hub's (and Switch Transformer's) load-balancing loss, without
    its coefficient: `num_experts * sum_e f_e * P_e`, `f_e` the share of
    the `top_k` choices that went to expert `e`, `P_e` the mean softmax
    probability of `e` (over all experts, whatever the routing).

    Args:
        logits: `(tokens, num_experts)` router logits.
        selected: `(tokens, num_experts)`, 1.0 for each token's chosen
            experts (`route`'s second result).
        top_k: int.
        token_mask: None or `(tokens,)` bool, the tokens counted (padding
            excluded, as keras-hub's Mixtral block does with its padding
            mask).

    Returns:
        A scalar in the logits' dtype (0 when no token counts, where
        keras-hub's mean over no token is NaN).
    """
    num_experts = logits.shape[-1]
    probs = softmax(logits)
    if token_mask is None:
        m = ops.ones_like(logits[:, :1])
    else:
        m = ops.cast(token_mask, logits.dtype)[:, None]
    count = ops.sum(m)
    # No token: numerators 0, loss 0 (`where`: Keras's torch `maximum`
    # computes float64 in float32).
    count = ops.where(count > 0, count, ops.ones_like(count))
    tokens_per_expert = ops.sum(selected * m, axis=0) / count / top_k
    prob_per_expert = ops.sum(probs * m, axis=0) / count
    return num_experts * ops.sum(tokens_per_expert * prob_per_expert)


def gated_activation(gate, up, activation, alpha, limit):
    """`silu(gate) * up` (`"swiglu"`), or gpt-oss's clamped GLU
    (`"gpt_oss_glu"`): `gate` clipped above at `limit`, `up` to
    `[-limit, limit]`, `(up + 1) * gate * sigmoid(alpha * gate)`."""
    if activation == "swiglu":
        return ops.silu(gate) * up
    # `where` and `clip`: Keras's torch `minimum` and `maximum` compute
    # float64 in float32.
    gate = ops.where(gate > limit, ops.cast(limit, gate.dtype), gate)
    up = ops.clip(up, -limit, limit)
    return (up + 1.0) * (gate * ops.sigmoid(gate * alpha))


# --- keras-hub ---------------------------------------------------------------

HUB_BLOCKS = {
    "MixtralSparseMoeBlock": "mixtral",
    "Qwen3SparseMoeBlock": "qwen3_moe",
    "GptOssSparseMoeBlock": "gpt_oss",
    "QwenSparseMoeBlock": "qwen_moe",
    "Qwen3_5MoeSparseMoeBlock": "qwen3_5_moe",
}

# The shared expert of Qwen-MoE's and Qwen 3.5-MoE's blocks: (the block's
# attributes of its router, its shared SwiGLU layer, its gate `Dense(1)`,
# its width), and its normalization of the top-k probabilities (None: the
# block's `norm_top_k_prob`).
_SHARED = {
    "qwen_moe": (
        "_sparse_feedforward_gate_dense",
        "shared_expert_dense",
        "shared_expert_gate_dense",
        "intermediate_dim_shared",
        None,
    ),
    "qwen3_5_moe": (
        "_router_gate",
        "shared_expert",
        "_shared_expert_gate",
        "shared_expert_intermediate_size",
        True,
    ),
}


def _np(variable):
    return keras.ops.convert_to_numpy(variable)


def deinterleave(w):
    """gpt-oss's gate/up columns `[g0, u0, g1, u1, ...]` as `[g..., u...]`
    on the last axis."""
    shape = w.shape
    w = w.reshape(shape[:-1] + (shape[-1] // 2, 2))
    w = w.swapaxes(-1, -2)
    return w.reshape(shape)


def hub_arguments_and_weights(block):
    """The `MixtureOfExperts` arguments and `set_weights` list (NumPy) of a
    built keras-hub sparse MoE block.

    Returns `(kwargs, hidden_dim, weights)`. Raises `TypeError` for other
    objects.
    """
    family = HUB_BLOCKS.get(type(block).__name__)
    if family is None or not block.built:
        raise TypeError(
            "`block` must be a built keras-hub sparse MoE block, one of "
            f"{sorted(HUB_BLOCKS)!r}. Received: block={block!r}"
        )
    if family in _SHARED:
        return _shared_expert_block(block, family)
    kwargs = dict(
        num_experts=block.num_experts,
        top_k=block.top_k,
        intermediate_dim=block.intermediate_dim,
        dtype=block.dtype_policy,
    )
    if family == "gpt_oss":
        router, experts = block.router.router_dense, block.experts
        kwargs.update(
            routing="topk_softmax",
            router_bias=True,
            activation="gpt_oss_glu",
            expert_bias=True,
            glu_alpha=experts.alpha,
            glu_limit=experts.limit,
        )
        weights = [
            _np(router.kernel),
            _np(router.bias),
            deinterleave(_np(experts.gate_up_proj)),
            deinterleave(_np(experts.gate_up_proj_bias)),
            _np(experts.down_proj),
            _np(experts.down_proj_bias),
        ]
        return kwargs, block.hidden_dim, weights
    bank = block.expert_bank
    gate_up = _np(bank._expert_feedforward_gate_dense)
    if family == "mixtral":
        up = _np(bank._expert_feedforward_intermediate_dense)
        gate_up = np.concatenate([gate_up, up], axis=-1)
        kwargs.update(
            normalize_top_k=True,
            router_aux_loss_coef=block.router_aux_loss_coef,
            router_jitter_noise=block.router_jitter_noise,
        )
    else:
        kwargs.update(
            normalize_top_k=bool(block.norm_top_k_prob),
            router_aux_loss_coef=block.router_aux_loss_coefficient,
        )
    weights = [
        _np(block._sparse_feedforward_gate_dense.kernel),
        gate_up,
        _np(bank._expert_feedforward_output_dense),
    ]
    return kwargs, block.hidden_dim, weights


def shared_expert_variables(block):
    """The variables of a keras-hub Qwen-MoE / Qwen 3.5-MoE block in the
    order of `hub_arguments_and_weights`'s weights, the shared expert's
    gate and up kernels as one pair (their values concatenated there)."""
    router, shared, gate, _, _ = _SHARED[HUB_BLOCKS[type(block).__name__]]
    mlp, bank = getattr(block, shared), block.expert_bank
    return [
        getattr(block, router).kernel,
        bank._expert_feedforward_gate_dense,
        bank._expert_feedforward_output_dense,
        (
            mlp._feedforward_gate_dense.kernel,
            mlp._feedforward_intermediate_dense.kernel,
        ),
        mlp._feedforward_output_dense.kernel,
        getattr(block, gate).kernel,
    ]


def _shared_expert_block(block, family):
    """`hub_arguments_and_weights` of a block with a gated shared expert
    (softmax then top-k routing, SwiGLU experts with their gate-up
    kernel as ours; the shared expert's gate and up kernels concatenated
    on the last axis, gate first)."""
    _, _, _, width, normalize = _SHARED[family]
    if normalize is None:
        normalize = bool(block.norm_top_k_prob)
    kwargs = dict(
        num_experts=block.num_experts,
        top_k=block.top_k,
        intermediate_dim=block.expert_bank.intermediate_dim,
        normalize_top_k=normalize,
        router_aux_loss_coef=block.router_aux_loss_coefficient,
        shared_expert_dim=getattr(block, width),
        shared_expert_gate=True,
        dtype=block.dtype_policy,
    )
    weights = []
    for variable in shared_expert_variables(block):
        if isinstance(variable, tuple):  # the shared gate and up kernels
            weights.append(np.concatenate([_np(v) for v in variable], -1))
        else:
            weights.append(_np(variable))
    return kwargs, block.hidden_dim, weights
