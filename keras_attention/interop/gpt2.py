"""keras-hub's `GPT2Backbone` rebuilt from `keras_attention` blocks."""

import keras

from keras_attention.interop import _common
from keras_attention.layers.activations import gelu_approximate
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)

# keras-hub's GPT-2: pre-norm decoder layers, layer norms with epsilon
# 1e-5, tanh-approximate GELU, a final layer norm.
LAYER_NORM_EPSILON = 1e-5

# Their weight path prefix -> ours (`{i}`: the layer index); the weights
# under each prefix have the same names and shapes on both sides.
WEIGHT_TABLE = (
    ("token_embedding", "embeddings/token_embedding"),
    ("position_embedding", "embeddings/position_embedding"),
    (
        "transformer_layer_{i}/self_attention",
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
    ("layer_norm", "layer_norm"),
)


def convert_gpt2(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `GPT2Backbone`, holding a copy of its weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`); output the
    sequence output `(batch, T, hidden)`, as the backbone's. Token plus
    position embeddings (`TokenAndPositionEmbedding`, its token table tied
    to the logits as keras-hub's) and dropout; pre-norm
    `TransformerDecoderBlock`s without cross-attention, with
    `gelu_approximate` and layer norms of epsilon 1e-5; a final layer norm.

    Args:
        backbone: a built `keras_hub.models.GPT2Backbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.gpt2 import convert_gpt2
    >>> backbone = keras_hub.models.GPT2Backbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=6)
    >>> convert_gpt2(backbone).output.shape
    (None, None, 8)

    References:
        - Radford et al., 2019, "Language Models are Unsupervised Multitask
          Learners".
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
        )
    }
    dtype = backbone.dtype_policy
    inputs = _common.token_inputs("token_ids", "padding_mask")
    x = TokenAndPositionEmbedding(
        config["vocabulary_size"],
        config["max_sequence_length"],
        config["hidden_dim"],
        dtype=dtype,
        name="embeddings",
    )(inputs["token_ids"])
    x = keras.layers.Dropout(
        config["dropout"], dtype=dtype, name="embeddings_dropout"
    )(x)
    heads, hidden = config["num_heads"], config["hidden_dim"]
    for i in range(config["num_layers"]):
        x = _common.decoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads,
                hidden // heads,
                causal=True,
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
            norm_first=True,
            layer_norm_epsilon=LAYER_NORM_EPSILON,
            dtype=dtype,
        )(x, padding_mask=inputs["padding_mask"])
    x = keras.layers.LayerNormalization(
        epsilon=LAYER_NORM_EPSILON, dtype=dtype, name="layer_norm"
    )(x)
    model = keras.Model(inputs=inputs, outputs=x, name=backbone.name)
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    _common.copy_weights(backbone, model, prefixes)
    return model
