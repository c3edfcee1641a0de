"""Hugging Face `modernbert` checkpoints: ModernBERT's pre-norm encoder
of alternating global and local (banded, symmetric) attention, each kind
with its own RoPE, composed from the library's layers."""

import keras

from keras_attention.interop import _common
from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import bert
from keras_attention.interop.hf import configs
from keras_attention.layers.feed_forward import FeedForward
from keras_attention.layers.local_self_attention import LocalSelfAttention
from keras_attention.layers.self_attention import SelfAttention

LAYER = "layers.{i}."
OURS = "transformer_layer_{i}_"


def _rows(bias, rows):
    """`rows` (their name, our path, transform, bias transform or None)
    as table rows: the weights, and with `bias` the biases."""
    out = []
    for theirs, ours, transform, bias_transform in rows:
        paths = (ours,) if isinstance(ours, str) else ours
        out.append((theirs + ".weight", _suffix(paths, "kernel"), transform))
        if bias:
            out.append(
                (theirs + ".bias", _suffix(paths, "bias"), bias_transform)
            )
    return tuple(out)


def _suffix(paths, name):
    paths = tuple(f"{p}/{name}" for p in paths)
    return paths[0] if len(paths) == 1 else paths


def _norm_rows(theirs, ours, bias):
    rows = ((theirs + ".weight", ours + "/gamma", "copy"),)
    if bias:
        rows += ((theirs + ".bias", ours + "/beta", "copy"),)
    return rows


def weight_table(options, num_layers):
    """The base model's tensors (`ModernBertModel`) -> our weight paths,
    transforms: the fused `Wqkv` split into query, key and value, the
    fused `Wi` into the GeGLU's activated half (`gate_dense`) and its
    linear half (`intermediate_dense`); biases and norm biases as
    `options` say (`attention_bias`, `mlp_bias`, `norm_bias`). Layer 0
    has no attention norm."""
    attention = OURS + "self_attention/"
    feed_forward = OURS + "feed_forward/"
    norm_bias = options["norm_bias"]
    table = (
        (
            "embeddings.tok_embeddings.weight",
            "token_embedding/embeddings",
            "copy",
        ),
        *_norm_rows("embeddings.norm", "embeddings_norm", norm_bias),
        *_rows(
            options["attention_bias"],
            (
                (
                    LAYER + "attn.Wqkv",
                    tuple(attention + p for p in ("query", "key", "value")),
                    "linear",
                    "flat",
                ),
                (
                    LAYER + "attn.Wo",
                    attention + "attention_output",
                    "linear_in2",
                    "copy",
                ),
            ),
        ),
        *_rows(
            options["mlp_bias"],
            (
                (
                    LAYER + "mlp.Wi",
                    (
                        feed_forward + "gate_dense",
                        feed_forward + "intermediate_dense",
                    ),
                    "linear",
                    "copy",
                ),
                (
                    LAYER + "mlp.Wo",
                    feed_forward + "output_dense",
                    "linear",
                    "copy",
                ),
            ),
        ),
        *_norm_rows(LAYER + "mlp_norm", OURS + "feed_forward_norm", norm_bias),
        *_norm_rows("final_norm", "final_norm", norm_bias),
    )
    # Layer 0's attention norm is the identity: rows for layers 1 on.
    for i in range(1, num_layers):
        table += _norm_rows(
            f"layers.{i}.attn_norm",
            f"transformer_layer_{i}_attention_norm",
            norm_bias,
        )
    return table


def layer_types(config):
    """Each layer's kind: `layer_types`, else transformers' default of
    older configs: global (`"full_attention"`) on every
    `global_attn_every_n_layers`-th layer from layer 0, local
    (`"sliding_attention"`) elsewhere."""
    layers = int(config.require("num_hidden_layers"))
    every = int(config.get("global_attn_every_n_layers", 3))
    default = [
        "sliding_attention" if i % every else "full_attention"
        for i in range(layers)
    ]
    return config.layer_types(default)


def modernbert_config(config):
    """ModernBERT's settings of an `HFConfig`: sizes, `norm_eps`, the
    biases (`attention_bias`, `mlp_bias`, `norm_bias`, all default off),
    `hidden_activation` (the GeGLU's; `"gelu"`: exact), the kinds of
    layers and each kind's rotary arguments (`rope_parameters` per layer
    type, else `global_rope_theta` / `local_rope_theta`), the local
    window (`local_attention`: the whole window, `local_attention // 2`
    each side, as transformers masks `|q - k| <= local_attention //
    2`)."""
    hidden = int(config.require("hidden_size"))
    heads = int(config.require("num_attention_heads"))
    if hidden % heads:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: hidden_size="
            f"{hidden!r} is not a multiple of num_attention_heads={heads!r}."
        )
    rope = {
        "full_attention": configs.rope_arguments(
            config,
            "full_attention",
            default_theta=float(config.get("global_rope_theta", 160000.0)),
        ),
        "sliding_attention": configs.rope_arguments(
            config,
            "sliding_attention",
            default_theta=float(config.get("local_rope_theta", 10000.0)),
        ),
    }
    return {
        "vocabulary_size": int(config.require("vocab_size")),
        "num_heads": heads,
        "hidden_dim": hidden,
        "intermediate_dim": int(config.require("intermediate_size")),
        "layer_types": layer_types(config),
        "rope": rope,
        "half_window": int(config.get("local_attention", 128)) // 2,
        "epsilon": float(config.get("norm_eps", 1e-5)),
        "attention_bias": bool(config.get("attention_bias", False)),
        "mlp_bias": bool(config.get("mlp_bias", False)),
        "norm_bias": bool(config.get("norm_bias", False)),
        "activation": configs.activation(
            config, "hidden_activation", default="gelu"
        ),
    }


def _attention(options, kind, dtype, name):
    """Layer's self-attention of `kind`: a `SelfAttention` (global), or
    a symmetric `LocalSelfAttention` of `half_window` each side; its
    kind's RoPE."""
    rope = options["rope"][kind]
    arguments = dict(
        num_heads=options["num_heads"],
        key_dim=options["hidden_dim"] // options["num_heads"],
        causal=False,
        use_bias=options["attention_bias"],
        rotary_max_wavelength=rope["rotary_max_wavelength"],
        rotary_scaling=rope["rotary_scaling"],
        dtype=dtype,
    )
    if rope["rotary_fraction"] != 1.0:
        arguments["rotary_fraction"] = rope["rotary_fraction"]
    if kind == "sliding_attention":
        return LocalSelfAttention(
            window_size=options["half_window"], name=name, **arguments
        )
    return SelfAttention(name=name, **arguments)


def modernbert_model(options, dtype, name):
    """ModernBERT's encoder from `options` (`modernbert_config`): inputs
    `token_ids`, `padding_mask`; the token embedding and its layer norm,
    then per layer `x + a(norm(x))` (no norm on layer 0) and `x +
    f(norm'(x))` with a GeGLU `FeedForward`, then the final norm (its
    output is the model's). Layer norms without biases unless
    `norm_bias`."""
    inputs = _common.token_inputs("token_ids", "padding_mask")
    mask = inputs["padding_mask"]

    def norm(layer_name):
        return keras.layers.LayerNormalization(
            epsilon=options["epsilon"],
            center=options["norm_bias"],
            dtype=dtype,
            name=layer_name,
        )

    x = keras.layers.Embedding(
        options["vocabulary_size"],
        options["hidden_dim"],
        dtype=dtype,
        name="token_embedding",
    )(inputs["token_ids"])
    x = norm("embeddings_norm")(x)
    for i, kind in enumerate(options["layer_types"]):
        prefix = f"transformer_layer_{i}_"
        y = x if i == 0 else norm(prefix + "attention_norm")(x)
        attention = _attention(options, kind, dtype, prefix + "self_attention")
        y = attention(y, padding_mask=mask)
        x = keras.layers.Add(dtype=dtype, name=prefix + "attention_add")([x, y])
        y = norm(prefix + "feed_forward_norm")(x)
        y = FeedForward(
            options["intermediate_dim"],
            activation=options["activation"],
            gated=True,
            use_bias=options["mlp_bias"],
            dtype=dtype,
            name=prefix + "feed_forward",
        )(y)
        x = keras.layers.Add(dtype=dtype, name=prefix + "feed_forward_add")(
            [x, y]
        )
    x = norm("final_norm")(x)
    return keras.Model(inputs=inputs, outputs=x, name=name)


# A task model's heads (`ModernBertForMaskedLM`'s `head.*` and
# `decoder.*`, ...), left unread: the encoder is loaded.
HEADS = ("head.*", "decoder.*", "classifier.*", "qa_outputs.*")


def convert_modernbert(config, dtype):
    """A `modernbert` checkpoint's model: `modernbert_model` (global and
    local layers as `layer_types` or `global_attn_every_n_layers` say,
    each kind with its own RoPE theta, the local layers banded
    `LocalSelfAttention`s of `local_attention // 2` each side). Positions
    count from the first column, padding included, as transformers'.

    References:
        - Warner et al., 2024, "Smarter, Better, Faster, Longer: A Modern
          Bidirectional Encoder for Fast, Memory Efficient, and Long
          Context Finetuning and Inference" (ModernBERT).
    """
    options = modernbert_config(config)
    model = modernbert_model(options, dtype, config.model_type)
    layers = len(options["layer_types"])
    table, ignored = bert.table_and_ignored(
        config,
        "ModernBertModel",
        "model.",
        weight_table(options, layers),
        (),
        HEADS,
    )
    return Conversion(model, table, layers, ignored)
