"""Hugging Face `mistral` checkpoints: the Llama-style model
(`hf.llama`) with Mistral's sliding window on every layer."""

from keras_attention.interop.hf import llama


def convert_mistral(config, dtype):
    """A `mistral` checkpoint's model: `llama_style_model` (no biases:
    transformers' Mistral has none) with `head_dim`, the RoPE of either
    config layout, and `sliding_window` on every layer as a causal
    `LocalSelfAttention`'s `window_size = sliding_window - 1`
    (transformers masks `q - k < sliding_window`; `layer_types`, which
    transformers' Mistral does not read, is not read either).

    References:
        - Jiang et al., 2023, "Mistral 7B".
    """
    window = config.get("sliding_window")
    return llama.convert(
        config,
        dtype,
        arguments={"attention_bias": False, "mlp_bias": False},
        window_size=None if window is None else int(window) - 1,
    )
