"""Hugging Face `qwen3` checkpoints: the Llama-style model (`hf.llama`)
with Qwen 3's per-head QK-norm and its sliding-window layers."""

from keras_attention.interop.hf import llama

# The Llama table plus the QK-norms (one `head_dim` scale each, shared
# by the heads).
WEIGHT_TABLE = llama.WEIGHT_TABLE + (
    (
        llama.LAYER + "self_attn.q_norm.weight",
        llama.OURS + "self_attention/query_norm/scale",
        "copy",
    ),
    (
        llama.LAYER + "self_attn.k_norm.weight",
        llama.OURS + "self_attention/key_norm/scale",
        "copy",
    ),
)


def qwen_windows(config):
    """Qwen 2's and 3's windows per layer: `layer_types` when the config
    has them, else transformers' default (windowed from layer
    `max_window_layers` on when `use_sliding_window`); the window
    `sliding_window` only with `use_sliding_window`."""
    layers = int(config.require("num_hidden_layers"))
    window = None
    if config.get("use_sliding_window", False):
        window = config.get("sliding_window")
    first = int(config.get("max_window_layers", layers))
    default = [
        "sliding_attention"
        if window is not None and i >= first
        else "full_attention"
        for i in range(layers)
    ]
    return llama.layer_windows(config, window, default)


def convert_qwen3(config, dtype):
    """A `qwen3` checkpoint's model: `llama_style_model` with Qwen 3's
    QK-norm (the self-attention's `qk_norm="rms"`, epsilon
    `rms_norm_eps`), `head_dim`, `attention_bias` (all four projections),
    no feed-forward biases, and its windowed layers (`qwen_windows`) as
    causal `LocalSelfAttention`s of `window_size = sliding_window - 1`.

    References:
        - Qwen Team, 2025, "Qwen3 Technical Report".
    """
    return llama.convert(
        config,
        dtype,
        table=WEIGHT_TABLE,
        arguments={"mlp_bias": False},
        qk_norm="rms",
        qk_norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        layer_attention=llama.windowed(qwen_windows(config)),
    )
