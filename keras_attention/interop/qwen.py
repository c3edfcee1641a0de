"""keras-hub's `QwenBackbone` (Qwen 2 and 2.5; `Qwen2Backbone` is the
same class) rebuilt from `keras_attention` blocks."""

from keras_attention.interop import _common
from keras_attention.interop.llama import WEIGHT_TABLE
from keras_attention.interop.llama import build_llama_style
from keras_attention.interop.llama import linear_rotary_scaling
from keras_attention.interop.llama import llama_style_config

# Qwen 2's attention: biases on the query, key and value projections,
# none on the output projection (the self-attention's `use_bias="qkv"`).
QKV_BIAS = "qkv"


def qwen_window_size(backbone):
    """The self-attention's causal `window_size` of a keras-hub Qwen (or
    Qwen-MoE) backbone: `sliding_window_size - 1` when
    `use_sliding_window_attention` (keras-hub's mask keeps keys `j` with
    `|i - j| <= sliding_window_size - 1`), else None."""
    get = backbone.get_config()
    if not get.get("use_sliding_window_attention"):
        return None
    return int(_common.config_value(backbone, "sliding_window_size")) - 1


def convert_qwen(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `QwenBackbone` (also exported as `Qwen2Backbone`: Qwen 2, Qwen 2.5),
    holding a copy of its weights.

    The Llama-style model of `keras_attention.interop.llama` (pre-norm
    blocks with RMS norms, grouped-query attention, rotary positions, a
    SwiGLU feed-forward without biases, a final RMS norm) with Qwen 2's
    attention biases: on the query, key and value projections and not on
    the output projection (the self-attention's `use_bias="qkv"`); its
    `rope_scaling_factor` as `rotary_scaling={"scaling_factor": ...}`,
    its tied (or untied) token embedding, and with
    `use_sliding_window_attention` its window as a causal
    `LocalSelfAttention`'s `window_size = sliding_window_size - 1`.
    keras-hub 0.32 applies that window only where Keras has no fused
    attention op (TensorFlow): on JAX and PyTorch its backbone attends to
    every earlier position, and the converted model, windowed, does not
    equal it there.

    Args:
        backbone: a built `keras_hub.models.QwenBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.qwen import convert_qwen
    >>> backbone = keras_hub.models.Qwen2Backbone(
    ...     vocabulary_size=20, num_layers=1, num_query_heads=4,
    ...     num_key_value_heads=2, hidden_dim=8, intermediate_dim=16)
    >>> model = convert_qwen(backbone)
    >>> model.get_layer("transformer_layer_0").self_attention.use_bias
    'qkv'

    References:
        - Qwen Team, 2024, "Qwen2 Technical Report".
    """
    get = backbone.get_config()
    config = llama_style_config(backbone, get.get("tie_word_embeddings", True))
    return build_llama_style(
        backbone,
        config,
        window_size=qwen_window_size(backbone),
        rotary_scaling=linear_rotary_scaling(get.get("rope_scaling_factor")),
        table=WEIGHT_TABLE,
        layer_attention=lambda i: {"use_bias": QKV_BIAS},
    )
