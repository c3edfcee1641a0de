"""keras-hub's `Qwen3Backbone` rebuilt from `keras_attention` blocks."""

from keras_attention.interop.llama import WEIGHT_TABLE as LLAMA_TABLE
from keras_attention.interop.llama import build_llama_style
from keras_attention.interop.llama import linear_rotary_scaling
from keras_attention.interop.llama import llama_style_config

# The Llama table, plus Qwen 3's per-head query and key norms (QK-norm),
# which our attention layers call `query_norm` and `key_norm`.
WEIGHT_TABLE = LLAMA_TABLE + (
    (
        "transformer_layer_{i}/self_attention/query_dense_layernorm",
        "transformer_layer_{i}/self_attention/query_norm",
    ),
    (
        "transformer_layer_{i}/self_attention/key_dense_layernorm",
        "transformer_layer_{i}/self_attention/key_norm",
    ),
)


def convert_qwen3(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `Qwen3Backbone`, holding a copy of its weights.

    The Llama-style model of `keras_attention.interop.llama` (RMS norms, no
    biases, grouped-query attention, rotary positions, SwiGLU) with Qwen
    3's QK-norm (the self-attention's `qk_norm="rms"`: each head's query and key
    RMS-normalized before the rotary positions, with the epsilon its
    attention layers use: keras-hub 0.32's decoder does not pass
    `layer_norm_epsilon` on to them, so they keep 1e-5), its `head_dim`
    as the self-attention's `key_dim`, its
    sliding window as a causal `LocalSelfAttention`'s `window_size =
    sliding_window_size - 1` (keras-hub's mask: position `i` sees `i -
    sliding_window_size + 1 .. i`), its `rope_scaling_factor` as
    `rotary_scaling={"scaling_factor": ...}` and its tied (or untied)
    token embedding.

    Args:
        backbone: a built `keras_hub.models.Qwen3Backbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.qwen3 import convert_qwen3
    >>> backbone = keras_hub.models.Qwen3Backbone(
    ...     vocabulary_size=20, num_layers=1, num_query_heads=4,
    ...     num_key_value_heads=2, hidden_dim=8, head_dim=4,
    ...     intermediate_dim=16)
    >>> convert_qwen3(backbone).output.shape
    (None, None, 8)

    References:
        - Qwen Team, 2025, "Qwen3 Technical Report".
    """
    get = backbone.get_config()
    config = llama_style_config(backbone, get.get("tie_word_embeddings", True))
    window = get.get("sliding_window_size")
    rotary_scaling = linear_rotary_scaling(get.get("rope_scaling_factor"))
    return build_llama_style(
        backbone,
        config,
        window_size=None if not window else int(window) - 1,
        key_dim=get.get("head_dim"),
        rotary_scaling=rotary_scaling,
        qk_norm="rms",
        table=WEIGHT_TABLE,
        qk_norm_epsilon=attention_epsilon(backbone, config),
    )


def attention_epsilon(backbone, config):
    """The epsilon of the backbone's QK-norms: its attention layers'
    own (keras-hub 0.32 leaves them at their default), else the
    backbone's `layer_norm_epsilon`."""
    for layer in getattr(backbone, "transformer_layers", ()):
        attention = getattr(layer, "_self_attention_layer", None)
        epsilon = getattr(attention, "layer_norm_epsilon", None)
        if epsilon is not None:
            return float(epsilon)
    return float(config["layer_norm_epsilon"])
