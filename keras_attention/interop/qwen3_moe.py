"""keras-hub's `Qwen3MoeBackbone` rebuilt from `keras_attention` blocks."""

from keras_attention.interop import _common
from keras_attention.interop.llama import linear_rotary_scaling
from keras_attention.interop.llama import llama_style_config
from keras_attention.interop.mixtral import build_moe_llama_style
from keras_attention.interop.mixtral import sparse_moe_blocks
from keras_attention.interop.qwen3 import WEIGHT_TABLE
from keras_attention.interop.qwen3 import attention_epsilon

# A dense layer's feed-forward (`Qwen3MoeMLP`, under its own name in the
# decoder layer): their weight -> ours under `feed_forward`.
_DENSE = (
    ("feedforward_intermediate_dense", "intermediate_dense"),
    ("feedforward_gate_dense", "gate_dense"),
    ("feedforward_output_dense", "output_dense"),
)


def convert_qwen3_moe(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `Qwen3MoeBackbone`, holding a copy of its weights.

    Qwen 3's model (`keras_attention.interop.qwen3`: RMS norms, no biases,
    grouped-query attention, rotary positions, QK-norm as the self-attention's
    `qk_norm="rms"` with its attention layers' epsilon, `head_dim` as
    `key_dim`, the window as the causal `window_size =
    sliding_window_size - 1`, `rope_scaling_factor` as `rotary_scaling`,
    the tied or untied token embedding) with a mixture-of-experts
    feed-forward on its sparse layers: a
    `keras_attention.layers.MixtureOfExperts` with Qwen3-MoE's routing (the
    softmax over all experts, then its `top_k` largest, renormalized to
    sum 1 only with `norm_top_k_prob`), SwiGLU experts of width
    `moe_intermediate_dim` (keras-hub's gate-up kernel is our
    `gate_up_kernel`) and its load-balancing loss
    (`router_aux_loss_coefficient`), added in training. The layers
    keras-hub makes dense (`mlp_only_layers`, those off the
    `decoder_sparse_step`, all with `num_experts=0`) keep the SwiGLU
    `FeedForward` of width `intermediate_dim`.

    keras-hub's block counts a padded token in the load-balancing loss's
    statistics when some earlier token is real (it reduces the rows of the
    causal attention mask, so right padding counts); ours leaves every
    padded token out. Without right padding the two losses are equal.

    Args:
        backbone: a built `keras_hub.models.Qwen3MoeBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.qwen3_moe import convert_qwen3_moe
    >>> backbone = keras_hub.models.Qwen3MoeBackbone(
    ...     vocabulary_size=20, num_layers=2, num_query_heads=4,
    ...     num_key_value_heads=2, hidden_dim=8, head_dim=4,
    ...     intermediate_dim=16, moe_intermediate_dim=8, num_experts=4,
    ...     top_k=2, mlp_only_layers=[0])
    >>> model = convert_qwen3_moe(backbone)
    >>> [type(model.get_layer(f"transformer_layer_{i}").feed_forward)
    ...  .__name__ for i in range(2)]
    ['FeedForward', 'MixtureOfExperts']

    References:
        - Qwen Team, 2025, "Qwen3 Technical Report".
    """
    get = backbone.get_config()
    config = llama_style_config(backbone, get.get("tie_word_embeddings", True))
    window = get.get("sliding_window_size")
    blocks = sparse_moe_blocks(backbone)
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    for i, layer in enumerate(backbone.transformer_layers):
        if blocks[i] is None:
            mlp = f"transformer_layer_{i}/{layer.mlp.name}"
            for theirs, ours in _DENSE:
                prefixes[f"{mlp}/{theirs}"] = (
                    f"transformer_layer_{i}/feed_forward/{ours}"
                )
    return build_moe_llama_style(
        backbone,
        config,
        blocks,
        prefixes,
        window_size=None if not window else int(window) - 1,
        key_dim=get.get("head_dim"),
        rotary_scaling=linear_rotary_scaling(get.get("rope_scaling_factor")),
        qk_norm="rms",
        qk_norm_epsilon=attention_epsilon(backbone, config),
    )
