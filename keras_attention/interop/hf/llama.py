"""Hugging Face `llama` checkpoints, and the Llama-style reading that
Mistral, Qwen 2, Qwen 3, SmolLM3 and Phi-3 share: the config read into
`keras_attention.interop.llama.llama_style_model`'s arguments, the
tensor names mapped to its weights by `WEIGHT_TABLE`."""

from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import configs
from keras_attention.interop.llama import llama_style_model

LAYER = "model.layers.{i}."
OURS = "transformer_layer_{i}/"

# Their tensor -> our weight path, transform (`hf.weights`).
WEIGHT_TABLE = (
    ("model.embed_tokens.weight", "token_embedding/embeddings", "copy"),
    (
        LAYER + "self_attn.q_proj.weight",
        OURS + "self_attention/query/kernel",
        "linear",
    ),
    (
        LAYER + "self_attn.k_proj.weight",
        OURS + "self_attention/key/kernel",
        "linear",
    ),
    (
        LAYER + "self_attn.v_proj.weight",
        OURS + "self_attention/value/kernel",
        "linear",
    ),
    (
        LAYER + "self_attn.o_proj.weight",
        OURS + "self_attention/attention_output/kernel",
        "linear_in2",
    ),
    (
        LAYER + "mlp.gate_proj.weight",
        OURS + "feed_forward/gate_dense/kernel",
        "linear",
    ),
    (
        LAYER + "mlp.up_proj.weight",
        OURS + "feed_forward/intermediate_dense/kernel",
        "linear",
    ),
    (
        LAYER + "mlp.down_proj.weight",
        OURS + "feed_forward/output_dense/kernel",
        "linear",
    ),
    (
        LAYER + "input_layernorm.weight",
        OURS + "self_attention_norm/scale",
        "copy",
    ),
    (
        LAYER + "post_attention_layernorm.weight",
        OURS + "feed_forward_norm/scale",
        "copy",
    ),
    ("model.norm.weight", "sequence_output_layernorm/scale", "copy"),
)
# The untied head: `lm_head` `(vocab, hidden)` to the reverse embedding.
HEAD_TABLE = (
    ("lm_head.weight", "token_embedding/reverse_embeddings", "linear"),
)
# `attention_bias`: the projections' biases (Qwen 2's "qkv": all but
# `o_proj`'s).
ATTENTION_BIAS_TABLE = tuple(
    (
        LAYER + f"self_attn.{theirs}_proj.bias",
        OURS + f"self_attention/{ours}/bias",
        "flat",
    )
    for theirs, ours in (
        ("q", "query"),
        ("k", "key"),
        ("v", "value"),
        ("o", "attention_output"),
    )
)
# `mlp_bias`: the feed-forward's biases.
MLP_BIAS_TABLE = tuple(
    (
        LAYER + f"mlp.{theirs}_proj.bias",
        OURS + f"feed_forward/{ours}/bias",
        "copy",
    )
    for theirs, ours in (
        ("gate", "gate_dense"),
        ("up", "intermediate_dense"),
        ("down", "output_dense"),
    )
)
# Stored by some older checkpoints, recomputed by our layers.
IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


def llama_style_config(config, tie_default=False, rope=None):
    """`llama_style_model`'s `config` from a Llama-style `HFConfig`:
    sizes, `rms_norm_eps`, the RoPE (`rope`, else
    `configs.rope_arguments(config)`), `hidden_act`,
    `tie_word_embeddings` (`tie_default` when absent), `attention_bias`,
    `mlp_bias`; dropout 0 (inference)."""
    rope = rope or configs.rope_arguments(config)
    return {
        "vocabulary_size": int(config.require("vocab_size")),
        "num_layers": int(config.require("num_hidden_layers")),
        "num_query_heads": int(config.require("num_attention_heads")),
        "num_key_value_heads": int(
            config.get("num_key_value_heads", config.get("num_attention_heads"))
        ),
        "hidden_dim": int(config.require("hidden_size")),
        "intermediate_dim": int(config.require("intermediate_size")),
        "rope_max_wavelength": rope["rotary_max_wavelength"],
        "rotary_fraction": rope["rotary_fraction"],
        "layer_norm_epsilon": float(config.get("rms_norm_eps", 1e-6)),
        "dropout": 0.0,
        "tie_word_embeddings": bool(
            config.get("tie_word_embeddings", tie_default)
        ),
        "attention_bias": bool(config.get("attention_bias", False)),
        "mlp_bias": bool(config.get("mlp_bias", False)),
        "activation": configs.activation(config, default="silu"),
    }


def llama_style_table(arguments, table=WEIGHT_TABLE):
    """`table` plus the head and bias rows that `arguments` (a
    `llama_style_config`) call for."""
    table = tuple(table)
    if not arguments["tie_word_embeddings"]:
        table += HEAD_TABLE
    if arguments["attention_bias"] == "qkv":
        table += ATTENTION_BIAS_TABLE[:3]
    elif arguments["attention_bias"]:
        table += ATTENTION_BIAS_TABLE
    if arguments["mlp_bias"]:
        table += MLP_BIAS_TABLE
    return table


def llama_style_ignored(arguments):
    """The tensors left unread: `IGNORED`, and a tied model's
    `lm_head.weight` (some checkpoints store the tied head anyway)."""
    if arguments["tie_word_embeddings"]:
        return IGNORED + ("lm_head.weight",)
    return IGNORED


def layer_windows(config, window, default_types=None):
    """Each layer's causal `window_size` (None: full attention): `window
    - 1` (transformers masks `q - k < sliding_window`) on the layers whose
    `layer_types` entry is "sliding_attention" (`default_types` when the
    config has none; all full when both are None); `ValueError` for a
    sliding layer without a window."""
    layers = int(config.require("num_hidden_layers"))
    types = config.layer_types(default_types or ["full_attention"] * layers)
    if "sliding_attention" in types and window is None:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: layer_types "
            "has sliding_attention layers but sliding_window is null."
        )
    return [
        int(window) - 1 if kind == "sliding_attention" else None
        for kind in types
    ]


def windowed(windows, layer_attention=None):
    """`llama_style_model`'s `layer_attention` giving layer `i` the
    `window_size` `windows[i]` (and `layer_attention(i)`'s arguments)."""

    def arguments(i):
        own = dict(layer_attention(i)) if layer_attention else {}
        if windows[i] is not None:
            own["window_size"] = windows[i]
        return own

    return arguments


def convert(
    config,
    dtype,
    tie_default=False,
    table=WEIGHT_TABLE,
    arguments=None,
    default_theta=10000.0,
    **options,
):
    """The Llama-style `Conversion` of `config` (an `HFConfig`):
    `llama_style_config` (updated with `arguments`: the fields a family
    fixes, e.g. Mistral's `attention_bias=False`; `default_theta`: the
    family's `rope_theta` when the config has none) into
    `llama_style_model` (with `options`: its `window_size`, `key_dim`,
    `qk_norm`, `layer_attention`, ...), `table` with its head and bias
    rows."""
    rope = configs.rope_arguments(config, default_theta=default_theta)
    arguments = {
        **llama_style_config(config, tie_default, rope),
        **(arguments or {}),
    }
    options.setdefault("key_dim", config.head_dim())
    options.setdefault("rotary_scaling", rope["rotary_scaling"])
    model = llama_style_model(
        arguments, dtype=dtype, name=config.model_type, **options
    )
    return Conversion(
        model,
        llama_style_table(arguments, table),
        arguments["num_layers"],
        llama_style_ignored(arguments),
    )


def convert_llama(config, dtype):
    """A `llama` checkpoint's model: `llama_style_model` with Llama's
    options: its RoPE (default, linear, Llama 3.1's "llama3"),
    `head_dim`, `attention_bias` (all four projections), `mlp_bias`,
    `hidden_act`, the tied or untied head.

    References:
        - Touvron et al., 2023, "LLaMA: Open and Efficient Foundation
          Language Models".
    """
    return convert(config, dtype)
