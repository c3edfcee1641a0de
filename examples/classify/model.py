"""The model of the `classify` example.

The classifier reads token ids, encodes them (a bidirectional GRU, or
transformer encoder blocks), pools the sequence with `AttentionPooling`
(Yang et al., 2016) and predicts a class. `__main__.py` plots the pooling
weights beside the attention rollout into the pooling (`explain.py`).
"""

import keras
import tensorflow as tf

from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.layers import AttentionPooling
from keras_attention.layers import TokenAndPositionEmbedding


def build_classifier(
    vocabulary_size,
    num_classes,
    encoder="gru",
    max_length=64,
    embedding_dim=128,
    hidden_dim=128,
    num_layers=2,
    num_heads=4,
    dropout=0.1,
):
    """Returns `(model, attention_model)`, sharing their layers.

    `model`: token ids `(batch, T)` (0 pads) -> class logits `(batch, C)`,
    the model that is trained. `attention_model`: the same ids -> `(class
    probabilities (batch, C), pooling weights (batch, T))`.
    """
    # b - batch, t - token positions, d - features, c - classes
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    if encoder == "gru":
        x = keras.layers.Embedding(
            vocabulary_size, embedding_dim, mask_zero=True, name="embedding"
        )(ids)
        x = keras.layers.Dropout(dropout)(x)
        x = keras.layers.Bidirectional(
            keras.layers.GRU(hidden_dim // 2, return_sequences=True),
            name="bigru",
        )(x)  # (b, t, d), keeps the padding mask
    elif encoder == "transformer":
        x = TokenAndPositionEmbedding(
            vocabulary_size,
            max_length,
            hidden_dim,
            mask_zero=True,
            name="embedding",
        )(ids)
        x = keras.layers.Dropout(dropout)(x)
        for i in range(num_layers):
            x = TransformerEncoderBlock(
                num_heads=num_heads,
                intermediate_dim=2 * hidden_dim,
                dropout=dropout,
                norm_first=True,
                name=f"encoder_block_{i}",
            )(x)
        x = keras.layers.LayerNormalization(name="final_norm")(x)
    else:
        raise ValueError(
            "`encoder` must be 'gru' or 'transformer'. "
            f"Received: encoder={encoder!r}"
        )
    pooled, weights = AttentionPooling(units=hidden_dim, name="pooling")(
        x, return_attention_scores=True
    )  # (b, d), (b, t)
    pooled = keras.layers.Dropout(dropout)(pooled)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(
        pooled
    )
    probabilities = keras.layers.Softmax(dtype="float32", name="probabilities")(
        logits
    )
    model = keras.Model(ids, logits, name=f"{encoder}_classifier")
    attention_model = keras.Model(
        ids,
        [probabilities, weights],
        name=f"{encoder}_classifier_with_attention",
    )
    return model, attention_model


def pad_ids(token_ids, max_length):
    """Ragged, dense or nested-list ids -> dense `(batch, max_length)`
    int32, 0-padded. (`keras_hub` tokenizers return lists when run eagerly.)"""
    if isinstance(token_ids, list):
        token_ids = tf.ragged.constant(token_ids, dtype=tf.int32, ragged_rank=1)
    if isinstance(token_ids, tf.RaggedTensor):
        token_ids = token_ids[:, :max_length].to_tensor(
            0, shape=[None, max_length]
        )
    return tf.cast(token_ids, tf.int32)
