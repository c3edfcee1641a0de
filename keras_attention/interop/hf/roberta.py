"""Hugging Face `roberta` checkpoints: the BERT-style encoder (`hf.bert`)
with RoBERTa's position ids, counted from the token ids as transformers'
`RobertaEmbeddings` counts them."""

import functools

import keras

from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import bert

# A task model's heads, left unread (`RobertaForMaskedLM`'s `lm_head.*`,
# ...); the pooler too (`bert.IGNORED`).
HEADS = ("lm_head.*", "classifier.*", "qa_outputs.*")


def roberta_positions(token_ids, pad_token_id):
    """`RobertaEmbeddings`' position ids: the non-pad tokens (`token_ids
    != pad_token_id`) numbered `pad_token_id + 1, pad_token_id + 2, ...`
    in order, the pad tokens at `pad_token_id`. Read from the token ids,
    not the padding mask: a left-padded row's first real token is at
    `pad_token_id + 1` too."""
    real = keras.ops.cast(keras.ops.not_equal(token_ids, pad_token_id), "int32")
    return keras.ops.cumsum(real, axis=1) * real + pad_token_id


def convert_roberta(config, dtype):
    """A `roberta` checkpoint's model: `bert.bert_style_model` with
    RoBERTa's positions (`roberta_positions` of `pad_token_id`, default
    1); `segment_ids` only with a `type_vocab_size` above 1 (RoBERTa's
    checkpoints have one type). The pooler and a task model's heads are
    not loaded.

    References:
        - Liu et al., 2019, "RoBERTa: A Robustly Optimized BERT
          Pretraining Approach".
    """
    arguments = bert.bert_style_config(config)
    pad = int(config.get("pad_token_id", 1))
    model = bert.bert_style_model(
        arguments,
        dtype,
        config.model_type,
        positions=functools.partial(roberta_positions, pad_token_id=pad),
    )
    table, ignored = bert.table_and_ignored(
        config,
        "RobertaModel",
        "roberta.",
        bert.WEIGHT_TABLE,
        bert.IGNORED,
        HEADS,
    )
    return Conversion(model, table, arguments["num_layers"], ignored)
