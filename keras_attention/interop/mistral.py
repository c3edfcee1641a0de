"""keras-hub's `MistralBackbone` rebuilt from `keras_attention` blocks."""

from keras_attention.interop.llama import build_llama_style
from keras_attention.interop.llama import linear_rotary_scaling
from keras_attention.interop.llama import llama_style_config

# The Llama table (`keras_attention.interop.llama.WEIGHT_TABLE`): Mistral's
# layers and weights have the same names and shapes.


def convert_mistral(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `MistralBackbone`, holding a copy of its weights.

    The Llama-style model of `keras_attention.interop.llama` (RMS norms, no
    biases, grouped-query attention, rotary positions, SwiGLU), with Mistral's
    sliding window: a causal `LocalSelfAttention`'s `window_size =
    sliding_window - 1` (position `i` sees `i - sliding_window + 1 .. i`,
    keras-hub's mask; computed banded, `LocalSelfAttention`), and its `head_dim`
    as the self-attention's `key_dim`. The token embedding is untied, as
    keras-hub's. Its `rope_scaling_factor` (position interpolation: the rotary
    frequencies divided by it) becomes the self-attention's
    `rotary_scaling={"scaling_factor": ...}`.

    Args:
        backbone: a built `keras_hub.models.MistralBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.mistral import convert_mistral
    >>> backbone = keras_hub.models.MistralBackbone(
    ...     vocabulary_size=20, num_layers=1, num_query_heads=4,
    ...     num_key_value_heads=2, hidden_dim=8, intermediate_dim=16,
    ...     sliding_window=3)
    >>> convert_mistral(backbone).output.shape
    (None, None, 8)

    References:
        - Jiang et al., 2023, "Mistral 7B".
    """
    get = backbone.get_config()
    config = llama_style_config(backbone)
    sliding_window = get.get("sliding_window")
    window_size = None
    if sliding_window is not None:
        window_size = int(sliding_window) - 1
    rotary_scaling = linear_rotary_scaling(get.get("rope_scaling_factor"))
    return build_llama_style(
        backbone,
        config,
        window_size=window_size,
        key_dim=get.get("head_dim"),
        rotary_scaling=rotary_scaling,
    )
