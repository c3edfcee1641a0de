"""Hugging Face `bert` checkpoints, and the BERT-style encoder that
RoBERTa shares (`hf.roberta`): word, position and token type embeddings
and their layer norm, then post-norm `TransformerEncoderBlock`s, the
tensor names mapped to their weights by `bert_table`."""

import keras

from keras_attention.interop import _common
from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import configs

LAYER = "encoder.layer.{i}."
OURS = "transformer_layer_{i}/"


def _linear_rows(theirs, ours, transform="linear", bias="copy"):
    """A torch `Linear`'s weight and bias rows."""
    return (
        (theirs + ".weight", ours + "/kernel", transform),
        (theirs + ".bias", ours + "/bias", bias),
    )


def _norm_rows(theirs, ours):
    """A torch `LayerNorm`'s rows (Keras: `gamma`, `beta`)."""
    return (
        (theirs + ".weight", ours + "/gamma", "copy"),
        (theirs + ".bias", ours + "/beta", "copy"),
    )


# The base model's tensors (`BertModel`, `RobertaModel`) -> our weight
# path, transform (`hf.weights`); `{i}`: the layer index.
WEIGHT_TABLE = (
    (
        "embeddings.word_embeddings.weight",
        "word_embeddings/embeddings",
        "copy",
    ),
    (
        "embeddings.position_embeddings.weight",
        "position_embeddings/embeddings",
        "copy",
    ),
    (
        "embeddings.token_type_embeddings.weight",
        "token_type_embeddings/embeddings",
        "copy",
    ),
    *_norm_rows("embeddings.LayerNorm", "embeddings_layer_norm"),
    *(
        row
        for name in ("query", "key", "value")
        for row in _linear_rows(
            LAYER + "attention.self." + name,
            OURS + "self_attention/" + name,
            bias="flat",
        )
    ),
    *_linear_rows(
        LAYER + "attention.output.dense",
        OURS + "self_attention/attention_output",
        "linear_in2",
    ),
    *_norm_rows(
        LAYER + "attention.output.LayerNorm", OURS + "self_attention_norm"
    ),
    *_linear_rows(
        LAYER + "intermediate.dense", OURS + "feed_forward/intermediate_dense"
    ),
    *_linear_rows(LAYER + "output.dense", OURS + "feed_forward/output_dense"),
    *_norm_rows(LAYER + "output.LayerNorm", OURS + "feed_forward_norm"),
)

# Left unread on purpose: the pooler (a tanh `Dense` of the first
# token; the model outputs the hidden states, `last_hidden_state`) and
# the task heads of a task model's checkpoint (`BertForMaskedLM`'s
# `cls.*`, ...): the encoder is loaded, not its heads.
IGNORED = ("pooler.dense.weight", "pooler.dense.bias")
HEADS = ("cls.*", "classifier.*", "qa_outputs.*")


def base_prefix(config, base, prefix):
    """The prefix of the base model's tensor names: none in a checkpoint
    of the base model itself (`config.json`'s `architectures` naming
    `base`, or none), `prefix` (transformers' `base_model_prefix` and a
    dot) in a task model's (`BertForMaskedLM`: `bert.`)."""
    architectures = config.get("architectures") or [base]
    return "" if base in architectures else prefix


def table_and_ignored(config, base, prefix, table, ignored, heads):
    """`table` and `ignored` under the checkpoint's prefix
    (`base_prefix`), with the task heads `heads` ignored in a task
    model's checkpoint."""
    prefix = base_prefix(config, base, prefix)
    table = tuple((prefix + theirs, ours, t) for theirs, ours, t in table)
    ignored = tuple(prefix + name for name in ignored)
    return table, ignored + (tuple(heads) if prefix else ())


def bert_style_config(config):
    """The BERT-style encoder's settings of an `HFConfig`: sizes,
    `layer_norm_eps`, `hidden_act` (`"gelu"`: the exact erf form),
    `type_vocab_size`; refuses (`ValueError` naming it) a decoder
    (`is_decoder`, `add_cross_attention`) and a `position_embedding_type`
    other than `"absolute"` (the relative ones of old configs)."""
    config.refuse("is_decoder", (False,), False)
    config.refuse("add_cross_attention", (False,), False)
    config.refuse("position_embedding_type", ("absolute",), "absolute")
    hidden = int(config.require("hidden_size"))
    heads = int(config.require("num_attention_heads"))
    if hidden % heads:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: hidden_size="
            f"{hidden!r} is not a multiple of num_attention_heads={heads!r}."
        )
    return {
        "vocabulary_size": int(config.require("vocab_size")),
        "num_layers": int(config.require("num_hidden_layers")),
        "num_heads": heads,
        "hidden_dim": hidden,
        "intermediate_dim": int(config.require("intermediate_size")),
        "max_positions": int(config.require("max_position_embeddings")),
        "type_vocab_size": int(config.get("type_vocab_size", 2)),
        "layer_norm_epsilon": float(config.get("layer_norm_eps", 1e-12)),
        "activation": configs.activation(config, default="gelu"),
    }


def bert_positions(token_ids):
    """`BertModel`'s position ids: `0 .. T - 1` from the first column,
    padding included."""
    ones = keras.ops.ones_like(token_ids)
    return keras.ops.cumsum(ones, axis=1) - 1


def bert_style_model(config, dtype, name, positions=bert_positions):
    """The BERT-style encoder of `config` (`bert_style_config`) as a
    `keras.Model`: inputs `token_ids`, `padding_mask` and, with a
    `type_vocab_size` above 1, `segment_ids` (the token types; with one
    type, type 0 everywhere); output the last post-norm block's hidden
    states. Embeddings `word + token type + position` (the position ids
    `positions(token_ids)`), a layer norm, then post-norm
    `TransformerEncoderBlock`s (a `SelfAttention` of heads `hidden //
    heads` with biases, a `FeedForward` of `activation`). No dropout
    (inference)."""
    types = config["type_vocab_size"]
    names = ("token_ids", "padding_mask")
    inputs = _common.token_inputs(
        *names, *(("segment_ids",) if types > 1 else ())
    )
    ids = inputs["token_ids"]
    hidden = config["hidden_dim"]
    words = keras.layers.Embedding(
        config["vocabulary_size"], hidden, dtype=dtype, name="word_embeddings"
    )(ids)
    segments = inputs.get("segment_ids")
    if segments is None:
        segments = keras.ops.zeros_like(ids)
    segments = keras.layers.Embedding(
        types, hidden, dtype=dtype, name="token_type_embeddings"
    )(segments)
    places = keras.layers.Embedding(
        config["max_positions"], hidden, dtype=dtype, name="position_embeddings"
    )(positions(ids))
    x = keras.layers.Add(dtype=dtype, name="embeddings_add")(
        [words, segments, places]
    )
    epsilon = config["layer_norm_epsilon"]
    x = keras.layers.LayerNormalization(
        epsilon=epsilon, dtype=dtype, name="embeddings_layer_norm"
    )(x)
    heads = config["num_heads"]
    for i in range(config["num_layers"]):
        x = _common.encoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads, hidden // heads, causal=False, dtype=dtype
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"],
                activation=config["activation"],
                dtype=dtype,
            ),
            layer_norm_epsilon=epsilon,
            dtype=dtype,
        )(x, padding_mask=inputs["padding_mask"])
    return keras.Model(inputs=inputs, outputs=x, name=name)


def convert_bert(config, dtype):
    """A `bert` checkpoint's model: `bert_style_model` with `BertModel`'s
    positions (`0 .. T - 1` from the first column, padding included: a
    left-padded row gives what transformers gives on the same padded
    batch), the token types as the `segment_ids` input, the exact or
    tanh GELU as `hidden_act` says. The pooler is not loaded (`IGNORED`:
    the model outputs `last_hidden_state`); a task model's checkpoint
    (`BertForMaskedLM`, ...) gives its encoder, its heads left unread.

    References:
        - Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional
          Transformers for Language Understanding".
    """
    arguments = bert_style_config(config)
    model = bert_style_model(arguments, dtype, config.model_type)
    table, ignored = table_and_ignored(
        config, "BertModel", "bert.", WEIGHT_TABLE, IGNORED, HEADS
    )
    return Conversion(model, table, arguments["num_layers"], ignored)
