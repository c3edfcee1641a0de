"""Hugging Face `qwen2` checkpoints: the Llama-style model (`hf.llama`)
with Qwen 2's biases on the query, key and value projections (none on
the output projection) and its sliding-window layers."""

from keras_attention.interop.hf import llama
from keras_attention.interop.hf.qwen3 import qwen_windows


def convert_qwen2(config, dtype):
    """A `qwen2` checkpoint's model: `llama_style_model` with the
    self-attention's `use_bias="qkv"` (transformers' Qwen 2 always has
    `q_proj`, `k_proj` and `v_proj` biases and no `o_proj` bias), no
    feed-forward biases, and its windowed layers (`qwen_windows`:
    `layer_types`, or from `max_window_layers` on with
    `use_sliding_window`) as causal `LocalSelfAttention`s of
    `window_size = sliding_window - 1`.

    References:
        - Qwen Team, 2024, "Qwen2 Technical Report".
    """
    return llama.convert(
        config,
        dtype,
        arguments={"attention_bias": "qkv", "mlp_bias": False},
        layer_attention=llama.windowed(qwen_windows(config)),
    )
