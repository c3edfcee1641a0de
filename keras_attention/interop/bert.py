"""keras-hub's `BertBackbone` rebuilt from `keras_attention` blocks."""

import keras

from keras_attention.interop import _common
from keras_attention.layers.activations import gelu_approximate
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)

# keras-hub's BERT: layer norms with epsilon 1e-12, post-norm encoder
# layers with tanh-approximate GELU.
LAYER_NORM_EPSILON = 1e-12

# Their weight path prefix -> ours (`{i}`: the layer index). The weights
# under each prefix have the same names and shapes on both sides (Keras's
# `MultiHeadAttention` and ours share their layout).
WEIGHT_TABLE = (
    ("token_embedding", "embeddings/token_embedding"),
    ("position_embedding", "embeddings/position_embedding"),
    ("segment_embedding", "segment_embedding"),
    ("embeddings_layer_norm", "embeddings_layer_norm"),
    (
        "transformer_layer_{i}/self_attention_layer",
        "transformer_layer_{i}/self_attention",
    ),
    (
        "transformer_layer_{i}/self_attention_layer_norm",
        "transformer_layer_{i}/self_attention_norm",
    ),
    (
        "transformer_layer_{i}/feedforward_intermediate_dense",
        "transformer_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "transformer_layer_{i}/feedforward_output_dense",
        "transformer_layer_{i}/feed_forward/output_dense",
    ),
    (
        "transformer_layer_{i}/feedforward_layer_norm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
    ("pooled_dense", "pooled_dense"),
)


def convert_bert(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `BertBackbone`, holding a copy of its weights.

    Inputs `token_ids`, `segment_ids`, `padding_mask` (int `(batch, T)`);
    outputs `{"sequence_output": (batch, T, hidden), "pooled_output":
    (batch, hidden)}`, as the backbone's. Token plus position embeddings
    (`TokenAndPositionEmbedding`), plus segment embeddings, layer norm
    (epsilon 1e-12) and dropout; post-norm `TransformerEncoderBlock`s with
    `gelu_approximate`; the pooler is a tanh `Dense` on the first token.

    Args:
        backbone: a built `keras_hub.models.BertBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.bert import convert_bert
    >>> backbone = keras_hub.models.BertBackbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=6)
    >>> sorted(convert_bert(backbone).output)
    ['pooled_output', 'sequence_output']

    References:
        - Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional
          Transformers for Language Understanding".
    """
    config = {
        name: _common.config_value(backbone, name)
        for name in (
            "vocabulary_size",
            "num_layers",
            "num_heads",
            "hidden_dim",
            "intermediate_dim",
            "dropout",
            "max_sequence_length",
            "num_segments",
        )
    }
    dtype = backbone.dtype_policy
    inputs = _common.token_inputs("token_ids", "segment_ids", "padding_mask")
    x = TokenAndPositionEmbedding(
        config["vocabulary_size"],
        config["max_sequence_length"],
        config["hidden_dim"],
        dtype=dtype,
        name="embeddings",
    )(inputs["token_ids"])
    segments = keras.layers.Embedding(
        config["num_segments"],
        config["hidden_dim"],
        dtype=dtype,
        name="segment_embedding",
    )(inputs["segment_ids"])
    x = keras.layers.Add(dtype=dtype, name="embeddings_add")([x, segments])
    x = keras.layers.LayerNormalization(
        epsilon=LAYER_NORM_EPSILON, dtype=dtype, name="embeddings_layer_norm"
    )(x)
    x = keras.layers.Dropout(
        config["dropout"], dtype=dtype, name="embeddings_dropout"
    )(x)
    heads, hidden = config["num_heads"], config["hidden_dim"]
    for i in range(config["num_layers"]):
        x = _common.encoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads,
                hidden // heads,
                causal=False,
                dropout=config["dropout"],
                dtype=dtype,
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"],
                activation=gelu_approximate,
                dropout=config["dropout"],
                dtype=dtype,
            ),
            dropout=config["dropout"],
            layer_norm_epsilon=LAYER_NORM_EPSILON,
            dtype=dtype,
        )(x, padding_mask=inputs["padding_mask"])
    pooled = keras.layers.Dense(
        config["hidden_dim"],
        activation="tanh",
        dtype=dtype,
        name="pooled_dense",
    )(x[:, 0, :])
    model = keras.Model(
        inputs=inputs,
        outputs={"sequence_output": x, "pooled_output": pooled},
        name=backbone.name,
    )
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    _common.copy_weights(backbone, model, prefixes)
    return model
