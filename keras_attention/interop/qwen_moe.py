"""keras-hub's `QwenMoeBackbone` (Qwen 1.5-MoE, Qwen 2-MoE) rebuilt from
`keras_attention` blocks."""

from keras_attention.interop import _common
from keras_attention.interop.llama import WEIGHT_TABLE as LLAMA_TABLE
from keras_attention.interop.llama import build_llama_style
from keras_attention.interop.llama import linear_rotary_scaling
from keras_attention.interop.llama import llama_style_config
from keras_attention.interop.qwen import QKV_BIAS
from keras_attention.interop.qwen import qwen_window_size
from keras_attention.layers import mixture_of_experts

# Their weight path prefix -> ours (`{i}`: the layer index): the Llama
# table without its feed-forward rows. Each layer's feed-forward (a
# sparse MoE block, or a dense `QwenMoeMLP`) is named by a global counter
# in keras-hub (`qwen_sparse_moe_block_3`): matched by layer instead.
WEIGHT_TABLE = tuple(
    pair for pair in LLAMA_TABLE if "feedforward_" not in pair[0]
) + (
    (
        "transformer_layer_{i}/feedforward_layernorm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
)

# A dense layer's `QwenMoeMLP`: their weight -> ours under `feed_forward`.
_DENSE = (
    ("feedforward_intermediate_dense", "intermediate_dense"),
    ("feedforward_gate_dense", "gate_dense"),
    ("feedforward_output_dense", "output_dense"),
)


def moe_layers(backbone):
    """Per decoder layer, its keras-hub sparse MoE block (with the shared
    expert), or None for a dense layer. keras-hub 0.32's decoder layers
    are all built with `layer_index=0` (the backbone does not pass it),
    so `mlp_only_layers` and `decoder_sparse_step` select all layers or
    none: the kinds are read from the layers themselves."""
    return [
        layer.mlp
        if type(layer.mlp).__name__ in mixture_of_experts.HUB_BLOCKS
        else None
        for layer in backbone.transformer_layers
    ]


def copy_moe_layer_weights(backbone, model, prefixes, blocks):
    """Copies every weight of `backbone` into `model`: those of `prefixes`
    by path, each sparse block of `blocks` (per layer, None for a dense
    one) into the `MixtureOfExperts` of our `transformer_layer_{i}` (the
    shared expert's gate and up kernels concatenated into our
    `shared_gate_up_kernel`). Every weight of both is matched
    (`ValueError` otherwise)."""
    ours = {w.path: w for w in model.weights}
    pairs = []
    for weight in backbone.weights:
        target = ours.get(_common.our_path(weight.path, prefixes))
        if target is not None:
            pairs.append((weight, target, None))
    merged = []
    for i, block in enumerate(blocks):
        if block is None:
            continue
        experts = model.get_layer(f"transformer_layer_{i}").feed_forward
        _, _, values = mixture_of_experts.hub_arguments_and_weights(block)
        theirs = mixture_of_experts.shared_expert_variables(block)
        for variable, our_weight, value in zip(theirs, experts.weights, values):
            if isinstance(variable, tuple):  # gate and up, one of ours
                merged.append(variable[1])
                variable = variable[0]
            pairs.append((variable, our_weight, value))
    _common.copy_pairs(backbone, model, pairs, recomputed=merged)


def moe_feed_forward(blocks, dtype):
    """`layer_feed_forward(i)` of `build_llama_style`: a
    `MixtureOfExperts` equal to layer `i`'s sparse block, or None (the
    dense SwiGLU `FeedForward`)."""
    arguments = []
    for block in blocks:
        kwargs = None
        if block is not None:
            kwargs, _, _ = mixture_of_experts.hub_arguments_and_weights(block)
            kwargs.pop("dtype")  # the block's own
        arguments.append(kwargs)

    def layer_feed_forward(i):
        if arguments[i] is None:
            return None
        return _common.mixture_of_experts(arguments[i], dtype)

    return layer_feed_forward


def convert_qwen_moe(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `QwenMoeBackbone`, holding a copy of its weights.

    Qwen 2's model (`keras_attention.interop.qwen`: RMS norms,
    grouped-query attention with biases on the query, key and value
    projections, `use_bias="qkv"`, rotary positions, the window with
    `use_sliding_window_attention`, an untied token embedding by default)
    with a mixture-of-experts feed-forward on its sparse layers: a
    `keras_attention.layers.MixtureOfExperts` with Qwen-MoE's routing (the
    softmax over all experts, then its `top_k` largest, renormalized with
    `norm_top_k_prob`), SwiGLU experts of width `moe_intermediate_dim`,
    its shared expert (`shared_expert_dim=shared_expert_intermediate_dim`,
    a SwiGLU expert every token goes through) scaled by its sigmoid gate
    (`shared_expert_gate=True`), and its load-balancing loss
    (`router_aux_loss_coefficient`), added in training. Dense layers keep
    the SwiGLU `FeedForward` of width `intermediate_dim`.

    keras-hub 0.32's backbone builds every decoder layer with
    `layer_index=0`: `mlp_only_layers` and `decoder_sparse_step` make all
    layers sparse or all dense (sparse unless 0 is in `mlp_only_layers`
    or the step is above 1); the converter follows each layer as built.
    keras-hub counts a padded token in the load-balancing loss's
    statistics when some earlier token is real (right padding; it reduces
    the rows of the causal attention mask); ours leaves every padded
    token out. Its attention applies the window on every backend (it
    never uses Keras's fused attention op on a CPU).

    Args:
        backbone: a built `keras_hub.models.QwenMoeBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.qwen_moe import convert_qwen_moe
    >>> backbone = keras_hub.models.QwenMoeBackbone(
    ...     vocabulary_size=20, num_layers=1, num_query_heads=4,
    ...     num_key_value_heads=2, hidden_dim=8, intermediate_dim=16,
    ...     moe_intermediate_dim=8, shared_expert_intermediate_dim=12,
    ...     num_experts=4, top_k=2)
    >>> experts = convert_qwen_moe(backbone).get_layer(
    ...     "transformer_layer_0").feed_forward
    >>> experts.shared_expert_dim, experts.shared_expert_gate
    (12, True)

    References:
        - Qwen Team, 2024, "Qwen1.5-MoE: Matching 7B Model Performance
          with 1/3 Activated Parameters".
        - Qwen Team, 2024, "Qwen2 Technical Report".
    """
    get = backbone.get_config()
    config = llama_style_config(backbone, get.get("tie_word_embeddings"))
    blocks = moe_layers(backbone)
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    for i, layer in enumerate(backbone.transformer_layers):
        if blocks[i] is None:
            mlp = f"transformer_layer_{i}/{layer.mlp.name}"
            for theirs, ours in _DENSE:
                prefixes[f"{mlp}/{theirs}"] = (
                    f"transformer_layer_{i}/feed_forward/{ours}"
                )
    model = build_llama_style(
        backbone,
        config,
        window_size=qwen_window_size(backbone),
        rotary_scaling=linear_rotary_scaling(get.get("rope_scaling_factor")),
        table=None,
        layer_attention=lambda i: {"use_bias": QKV_BIAS},
        layer_feed_forward=moe_feed_forward(blocks, backbone.dtype_policy),
    )
    copy_moe_layer_weights(backbone, model, prefixes, blocks)
    return model
