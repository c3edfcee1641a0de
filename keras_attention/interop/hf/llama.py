"""Hugging Face `llama` checkpoints, and the Llama-style reading that
Mistral, Qwen 2, Qwen 3, SmolLM3 and Phi-3 share: the config read into
`keras_attention.interop.llama.llama_style_model`'s arguments, the
tensor names mapped to its weights by `WEIGHT_TABLE`."""

from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import _config
from keras_attention.interop.llama import llama_style_model

_LAYER = "model.layers.{i}."
_OURS = "transformer_layer_{i}/"

# Their tensor -> our weight path, transform (`hf._weights`).
WEIGHT_TABLE = (
    ("model.embed_tokens.weight", "token_embedding/embeddings", "copy"),
    (
        _LAYER + "self_attn.q_proj.weight",
        _OURS + "self_attention/query/kernel",
        "linear",
    ),
    (
        _LAYER + "self_attn.k_proj.weight",
        _OURS + "self_attention/key/kernel",
        "linear",
    ),
    (
        _LAYER + "self_attn.v_proj.weight",
        _OURS + "self_attention/value/kernel",
        "linear",
    ),
    (
        _LAYER + "self_attn.o_proj.weight",
        _OURS + "self_attention/attention_output/kernel",
        "linear_in2",
    ),
    (
        _LAYER + "mlp.gate_proj.weight",
        _OURS + "feed_forward/gate_dense/kernel",
        "linear",
    ),
    (
        _LAYER + "mlp.up_proj.weight",
        _OURS + "feed_forward/intermediate_dense/kernel",
        "linear",
    ),
    (
        _LAYER + "mlp.down_proj.weight",
        _OURS + "feed_forward/output_dense/kernel",
        "linear",
    ),
    (
        _LAYER + "input_layernorm.weight",
        _OURS + "self_attention_norm/scale",
        "copy",
    ),
    (
        _LAYER + "post_attention_layernorm.weight",
        _OURS + "feed_forward_norm/scale",
        "copy",
    ),
    ("model.norm.weight", "sequence_output_layernorm/scale", "copy"),
)
# The untied head: `lm_head` `(vocab, hidden)` to the reverse embedding.
HEAD_TABLE = (
    ("lm_head.weight", "token_embedding/reverse_embeddings", "linear"),
)
# `attention_bias`: the four projections' biases.
ATTENTION_BIAS_TABLE = tuple(
    (
        _LAYER + f"self_attn.{theirs}_proj.bias",
        _OURS + f"self_attention/{ours}/bias",
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
        _LAYER + f"mlp.{theirs}_proj.bias",
        _OURS + f"feed_forward/{ours}/bias",
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


def llama_style_config(config, tie_default=False):
    """`llama_style_model`'s `config` from a Llama-style `HFConfig`:
    sizes, `rms_norm_eps`, `rope_theta` (either layout), `hidden_act`,
    `tie_word_embeddings` (`tie_default` when absent), `attention_bias`,
    `mlp_bias`, `partial_rotary_factor`; dropout 0 (inference)."""
    rope = _config.rope_arguments(config)
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
        "activation": _config.activation(config, default="silu"),
    }


def llama_style_table(arguments, table=WEIGHT_TABLE):
    """`table` plus the head and bias rows that `arguments` (a
    `llama_style_config`) call for."""
    table = tuple(table)
    if not arguments["tie_word_embeddings"]:
        table += HEAD_TABLE
    if arguments["attention_bias"]:
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


def convert(config, dtype, tie_default=False, table=WEIGHT_TABLE, **options):
    """The Llama-style `Conversion` of `config` (an `HFConfig`):
    `llama_style_config` into `llama_style_model` (with `options`: its
    `window_size`, `key_dim`, `qk_norm`, `layer_attention`, ...), `table`
    with its head and bias rows."""
    arguments = llama_style_config(config, tie_default)
    options.setdefault("key_dim", config.head_dim())
    options.setdefault(
        "rotary_scaling", _config.rope_arguments(config)["rotary_scaling"]
    )
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
