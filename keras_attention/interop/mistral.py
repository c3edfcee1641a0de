"""keras-hub's `MistralBackbone` rebuilt from `keras_attention` blocks."""

from keras_attention.interop import _common
from keras_attention.interop.llama import build_llama_style

# The Llama table (`keras_attention.interop.llama.WEIGHT_TABLE`): Mistral's
# layers and weights have the same names and shapes.


def convert_mistral(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `MistralBackbone`, holding a copy of its weights.

    The Llama-style model of `keras_attention.interop.llama` (RMS norms, no
    biases, grouped-query attention, rotary positions, SwiGLU), with
    Mistral's sliding window: the blocks' causal `window_size =
    sliding_window - 1` (position `i` sees `i - sliding_window + 1 .. i`,
    keras-hub's mask; computed banded, `LocalSelfAttention`), and its
    `head_dim` as the blocks' `key_dim`. The token embedding is untied, as
    keras-hub's. Its `rope_scaling_factor` (position interpolation: the
    rotary frequencies divided by it) becomes the blocks'
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
    config = {
        name: _common.config_value(backbone, name)
        for name in (
            "vocabulary_size",
            "num_layers",
            "num_query_heads",
            "num_key_value_heads",
            "hidden_dim",
            "intermediate_dim",
            "rope_max_wavelength",
            "layer_norm_epsilon",
        )
    }
    config["dropout"] = get.get("dropout", 0.0)
    config["tie_word_embeddings"] = False
    sliding_window = get.get("sliding_window")
    window_size = None
    if sliding_window is not None:
        window_size = int(sliding_window) - 1
    factor = get.get("rope_scaling_factor")
    rotary_scaling = None
    if factor is not None and factor != 1:
        rotary_scaling = {"scaling_factor": float(factor)}
    return build_llama_style(
        backbone,
        config,
        window_size=window_size,
        key_dim=get.get("head_dim"),
        rotary_scaling=rotary_scaling,
    )
