"""keras-hub's `MixtralBackbone` rebuilt from `keras_attention` blocks (and
what the mixture-of-experts families share: their `moe` arguments and the
copy of their experts' weights)."""

from keras_attention.interop import _common
from keras_attention.interop.llama import WEIGHT_TABLE
from keras_attention.interop.llama import build_llama_style
from keras_attention.interop.llama import linear_rotary_scaling
from keras_attention.interop.llama import llama_style_config
from keras_attention.layers import mixture_of_experts

# The decoder layers' attributes that hold keras-hub's sparse MoE block
# (Mixtral's `_sparse_moe_block`, Qwen3-MoE's `mlp`, dense on some layers).
_MOE_ATTRIBUTES = ("_sparse_moe_block", "mlp")


def sparse_moe_blocks(backbone):
    """Per decoder layer of a keras-hub MoE backbone, its sparse MoE block
    (`MixtralSparseMoeBlock`, `Qwen3SparseMoeBlock`), or None for a layer
    with a dense feed-forward."""
    blocks = []
    for layer in backbone.transformer_layers:
        found = None
        for attribute in _MOE_ATTRIBUTES:
            block = getattr(layer, attribute, None)
            if type(block).__name__ in mixture_of_experts.HUB_BLOCKS:
                found = block
        blocks.append(found)
    return blocks


def moe_arguments(block):
    """The `MixtureOfExperts` arguments (a dict, without `dtype`) equal to a
    keras-hub sparse MoE block: its routing, `top_k`, expert width, top-k
    renormalization, load-balancing coefficient and jitter noise; None
    for None (a dense layer)."""
    if block is None:
        return None
    kwargs, _, _ = mixture_of_experts.hub_arguments_and_weights(block)
    kwargs.pop("dtype")  # the block's own
    return kwargs


def copy_moe_weights(backbone, model, prefixes, blocks):
    """Copies every weight of `backbone` into `model`: by the path
    `prefixes` (theirs -> ours), and each sparse MoE block of `blocks`
    (per layer, or None) into the `MixtureOfExperts` of our block
    `transformer_layer_{i}` (`hub_arguments_and_weights`: Mixtral's gate
    and up kernels concatenated into our `gate_up_kernel`). keras-hub
    names its MoE blocks by a global counter (`mixtral_sparse_moe_block_3`),
    so they are matched by layer, not by path. Every weight of both models
    is matched (`ValueError` otherwise)."""
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
        bank = block.expert_bank
        theirs = [
            block._sparse_feedforward_gate_dense.kernel,
            bank._expert_feedforward_gate_dense,
            bank._expert_feedforward_output_dense,
        ]
        pairs.extend(zip(theirs, experts.weights, values))
        up = getattr(bank, "_expert_feedforward_intermediate_dense", None)
        if up is not None:  # Mixtral's: inside the gate_up value above.
            merged.append(up)
    _common.copy_pairs(backbone, model, pairs, recomputed=merged)


def build_moe_llama_style(backbone, config, blocks, prefixes, **kwargs):
    """`build_llama_style` with a `MixtureOfExperts` feed-forward equal to
    each layer's sparse MoE block (`blocks`, None: the dense
    feed-forward), the weights copied by `copy_moe_weights`; `kwargs` go
    to `build_llama_style`."""
    arguments = [moe_arguments(block) for block in blocks]

    def layer_feed_forward(i):
        if arguments[i] is None:
            return None
        return _common.mixture_of_experts(arguments[i], backbone.dtype_policy)

    model = build_llama_style(
        backbone,
        config,
        table=None,
        layer_feed_forward=layer_feed_forward,
        **kwargs,
    )
    copy_moe_weights(backbone, model, prefixes, blocks)
    return model


def convert_mixtral(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `MixtralBackbone`, holding a copy of its weights.

    Mistral's model (`keras_attention.interop.mistral`: RMS norms, no biases,
    grouped-query attention, rotary positions, the sliding window as a causal
    `LocalSelfAttention`'s `window_size = sliding_window - 1`, the
    `rope_scaling_factor` as `rotary_scaling={"scaling_factor": ...}`, an untied
    token embedding) with a mixture-of-experts feed-forward in every block: a
    `keras_attention.layers.MixtureOfExperts` with Mixtral's routing (the
    softmax over all experts, its `top_k` largest renormalized to sum 1), SwiGLU
    experts of width `intermediate_dim` (keras-hub's gate and up kernels
    `(experts, hidden, intermediate)` concatenated as our `gate_up_kernel`, gate
    columns first), its `router_jitter_noise` and its load-balancing loss
    (`router_aux_loss_coef`), added in training as keras-hub's block adds it
    (with the padding tokens left out).

    Args:
        backbone: a built `keras_hub.models.MixtralBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.mixtral import convert_mixtral
    >>> backbone = keras_hub.models.MixtralBackbone(
    ...     vocabulary_size=20, num_layers=1, num_query_heads=4,
    ...     num_key_value_heads=2, hidden_dim=8, intermediate_dim=16,
    ...     num_experts=4, top_k=2, sliding_window=3)
    >>> model = convert_mixtral(backbone)
    >>> model.get_layer("transformer_layer_0").feed_forward.num_experts
    4

    References:
        - Jiang et al., 2024, "Mixtral of Experts".
    """
    get = backbone.get_config()
    config = llama_style_config(backbone)
    sliding_window = get.get("sliding_window")
    window_size = None
    if sliding_window is not None:
        window_size = int(sliding_window) - 1
    blocks = sparse_moe_blocks(backbone)
    if any(block is None for block in blocks):
        raise ValueError(
            "Every decoder layer of a MixtralBackbone holds a "
            "`MixtralSparseMoeBlock` (`_sparse_moe_block`); some of "
            f"{backbone.name!r} do not (an unsupported keras-hub version). "
            f"Received: backbone={backbone.name!r}"
        )
    return build_moe_llama_style(
        backbone,
        config,
        blocks,
        _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"]),
        window_size=window_size,
        rotary_scaling=linear_rotary_scaling(get.get("rope_scaling_factor")),
    )
