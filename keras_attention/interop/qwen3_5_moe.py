"""keras-hub's `Qwen3_5MoeBackbone` (text) rebuilt from `keras_attention`
blocks: gated delta net and gated attention layers, each with a mixture
of experts and its gated shared expert."""

import numpy as np

from keras_attention.interop import _common
from keras_attention.interop import qwen3_5
from keras_attention.interop.qwen_moe import moe_feed_forward
from keras_attention.layers import mixture_of_experts

# Their weight path prefix -> ours (`{i}`: the layer index): Qwen 3.5's
# table without its dense feed-forward. Each layer's `sparse_moe_block`
# goes to our `MixtureOfExperts` by layer (`_copy_weights`).
WEIGHT_TABLE = tuple(
    pair for pair in qwen3_5.WEIGHT_TABLE if "feedforward_" not in pair[0]
)


def _copy_weights(backbone, model, num_layers, head_dim, blocks):
    """Copies the backbone's weights into `model`: by `WEIGHT_TABLE`, with
    Qwen 3.5's transforms (the query kernel split into our query and gate
    kernels, the zero-centred scales plus 1), and each layer's sparse MoE
    block into its `MixtureOfExperts` (the shared expert's gate and up
    kernels concatenated)."""
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, num_layers)
    ours = {w.path: w for w in model.weights}
    pairs = []
    for weight in backbone.weights:
        path = _common.our_path(weight.path, prefixes)
        if path not in ours:
            continue  # the experts below, or reported by `copy_pairs`
        value = _common.numpy_value(weight)
        if weight.path.endswith(qwen3_5.QUERY_AND_GATE):
            gate = path[: -len("query/kernel")] + "gate/kernel"
            pairs.append((weight, ours[path], value[..., :head_dim]))
            pairs.append((weight, ours[gate], value[..., head_dim:]))
            continue
        if weight.path.endswith(qwen3_5.ZERO_CENTRED):
            value = value + np.asarray(1.0, value.dtype)
        pairs.append((weight, ours[path], value))
    merged = []
    for i, block in enumerate(blocks):
        experts = model.get_layer(f"transformer_layer_{i}").feed_forward
        _, _, values = mixture_of_experts.hub_arguments_and_weights(block)
        theirs = mixture_of_experts.shared_expert_variables(block)
        for variable, our_weight, value in zip(theirs, experts.weights, values):
            if isinstance(variable, tuple):  # gate and up, one of ours
                merged.append(variable[1])
                variable = variable[0]
            pairs.append((variable, our_weight, value))
    _common.copy_pairs(backbone, model, pairs, recomputed=merged)


def convert_qwen3_5_moe(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `Qwen3_5MoeBackbone` without vision encoder (text), holding a copy of
    its weights.

    Qwen 3.5's model (`keras_attention.interop.qwen3_5`: pre-norm blocks
    with RMS norms whose self-attention is, as `layer_types` says, a
    `GatedDeltaNet` or gated attention with QK-norm and partial rotary
    positions; zero-centred norm scales copied plus one) with a
    mixture-of-experts feed-forward in every block: a
    `keras_attention.layers.MixtureOfExperts` with Qwen 3.5-MoE's routing
    (the softmax over all experts, its `top_k` largest renormalized to
    sum 1), SwiGLU experts of width `moe_intermediate_dim`, its shared
    expert (`shared_expert_dim=shared_expert_intermediate_size`) scaled
    by its sigmoid gate (`shared_expert_gate=True`), and its
    load-balancing loss (`router_aux_loss_coefficient`, padded tokens left
    out on both sides), added in training.

    Generation (`interop.causal_lm_generator`) differs from keras-hub's
    `Qwen3_5MoeCausalLM.generate` on padded prompts, as Qwen 3.5's: ours
    runs the gated delta rule and its convolution over each prompt's real
    tokens only, keras-hub's prefill over the whole padded buffer; ours
    equals greedy decoding driven by keras-hub's forward pass.

    Args:
        backbone: a built `keras_hub.models.Qwen3_5MoeBackbone` (text
            only).

    Returns:
        The converted `keras.Model`.

    Raises:
        ValueError: a vision encoder, unknown `layer_types`, or a partial
            rotary share that rotates an odd number of features (as
            Qwen 3.5's converter).

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.qwen3_5_moe import convert_qwen3_5_moe
    >>> backbone = keras_hub.models.Qwen3_5MoeBackbone(
    ...     vocabulary_size=20, num_layers=2, num_query_heads=2,
    ...     num_key_value_heads=1, head_dim=8, hidden_dim=8,
    ...     moe_intermediate_dim=8, shared_expert_intermediate_size=12,
    ...     num_experts=4, top_k=2, layer_types=["linear_attention",
    ...     "full_attention"], linear_num_key_heads=1,
    ...     linear_num_value_heads=2, linear_key_head_dim=4,
    ...     linear_value_head_dim=4, sliding_window_size=None)
    >>> model = convert_qwen3_5_moe(backbone)
    >>> [type(model.get_layer(f"transformer_layer_{i}").self_attention)
    ...  .__name__ for i in range(2)]
    ['GatedDeltaNet', 'SelfAttention']

    References:
        - Qwen Team, 2026, "Qwen3.5" (model release).
        - Yang, Kautz & Hatamizadeh, 2025, "Gated Delta Networks:
          Improving Mamba2 with Delta Rule".
    """
    get = backbone.get_config()
    qwen3_5._check_text_only(backbone, get)
    config = qwen3_5.hub_config(backbone, get)
    dtype = backbone.dtype_policy
    blocks = [layer.mlp for layer in backbone.transformer_layers]
    model = qwen3_5.qwen3_5_style_model(
        config,
        dtype,
        backbone.name,
        layer_feed_forward=moe_feed_forward(blocks, dtype),
    )
    _copy_weights(
        backbone, model, config["num_layers"], int(get["head_dim"]), blocks
    )
    return model
