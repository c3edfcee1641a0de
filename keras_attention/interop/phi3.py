"""keras-hub's `Phi3Backbone` rebuilt from `keras_attention` blocks."""

from keras_attention.interop.llama import build_llama_style
from keras_attention.interop.llama import llama_style_config

# Their weight path prefix -> ours (`{i}`: the layer index); the weights
# under each prefix have the same names and shapes on both sides.
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    ("transformer_layer_{i}/attention", "transformer_layer_{i}/self_attention"),
    (
        "transformer_layer_{i}/pre_attention_layernorm",
        "transformer_layer_{i}/self_attention_norm",
    ),
    (
        "transformer_layer_{i}/post_attention_layernorm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
    (
        "transformer_layer_{i}/feedforward_intermediate_dense",
        "transformer_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "transformer_layer_{i}/feedforward_gate_dense",
        "transformer_layer_{i}/feed_forward/gate_dense",
    ),
    (
        "transformer_layer_{i}/feedforward_output_dense",
        "transformer_layer_{i}/feed_forward/output_dense",
    ),
    ("sequence_output_layernorm", "sequence_output_layernorm"),
)


def phi3_rotary_scaling(backbone):
    """The self-attention's `rotary_scaling` equal to a keras-hub Phi-3
    backbone's rotary embedding: None, or LongRoPE ("su": `rope_type="longrope"`
    with its short and long factors, `original_max_position_embeddings =
    pretraining_sequence_length` and `scaling_factor = max(1,
    max_sequence_length / pretraining_sequence_length)`, which sets the
    attention factor `sqrt(1 + ln(s) / ln(original))`).

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.phi3 import phi3_rotary_scaling
    >>> backbone = keras_hub.models.Phi3Backbone(
    ...     vocabulary_size=20, num_layers=1, num_query_heads=2,
    ...     num_key_value_heads=1, hidden_dim=8, intermediate_dim=16,
    ...     rope_scaling_type="su", rope_scaling_short_factor=[1.0, 1.5],
    ...     rope_scaling_long_factor=[2.0, 3.0], max_sequence_length=64,
    ...     pretraining_sequence_length=16)
    >>> phi3_rotary_scaling(backbone)["rope_type"]
    'longrope'
    """
    get = backbone.get_config()
    kind = get.get("rope_scaling_type")
    if kind is None:
        return None
    if kind != "su":
        raise ValueError(
            "Phi-3's `rope_scaling_type` must be None or 'su' (LongRoPE). "
            f"Received: rope_scaling_type={kind!r}"
        )
    original = int(get["pretraining_sequence_length"])
    return {
        "rope_type": "longrope",
        "short_factor": [float(f) for f in get["rope_scaling_short_factor"]],
        "long_factor": [float(f) for f in get["rope_scaling_long_factor"]],
        "original_max_position_embeddings": original,
        "scaling_factor": max(1.0, get["max_sequence_length"] / original),
    }


def convert_phi3(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `Phi3Backbone`, holding a copy of its weights.

    The Llama-style model of `keras_attention.interop.llama` (RMS norms, no
    biases, grouped-query attention, rotary positions, SwiGLU, an untied token
    embedding) with Phi-3's rotary embedding: LongRoPE ("su") as the
    self-attention's `rotary_scaling` (`phi3_rotary_scaling`). LongRoPE takes
    its long factors when a call's positions reach past the pretraining length
    (`start_index + length`, as keras-hub's): a cached generation that crosses
    that length keeps the keys it rotated with the short factors, so it differs
    from one uncached forward pass over the whole sequence (keras-hub's own
    cached generation does the same).

    Args:
        backbone: a built `keras_hub.models.Phi3Backbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.phi3 import convert_phi3
    >>> backbone = keras_hub.models.Phi3Backbone(
    ...     vocabulary_size=20, num_layers=1, num_query_heads=4,
    ...     num_key_value_heads=2, hidden_dim=8, intermediate_dim=16)
    >>> convert_phi3(backbone).output.shape
    (None, None, 8)

    References:
        - Abdin et al., 2024, "Phi-3 Technical Report".
        - Ding et al., 2024, "LongRoPE: Extending LLM Context Window Beyond
          2 Million Tokens".
    """
    return build_llama_style(
        backbone,
        llama_style_config(backbone),
        rotary_scaling=phi3_rotary_scaling(backbone),
        table=WEIGHT_TABLE,
    )
