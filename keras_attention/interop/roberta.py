"""keras-hub's `RobertaBackbone` (and `XLMRobertaBackbone`, its subclass)
rebuilt from `keras_attention` blocks."""

from keras_attention.interop import _common

# Their weight path prefix -> ours (`{i}`: the layer index). The weights
# under each prefix have the same names and shapes on both sides.
WEIGHT_TABLE = (
    ("embeddings", "embeddings"),
    ("embeddings_layer_norm", "embeddings_layer_norm"),
    *_common.encoder_layer_table(
        "transformer_layer_{i}", "transformer_layer_{i}"
    ),
)

CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "dropout",
    "max_sequence_length",
)


def convert_roberta(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `RobertaBackbone` or `XLMRobertaBackbone`, holding a copy of its
    weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`; no token types);
    output the hidden states `(batch, T, hidden)`, as the backbone's.
    Token plus position embeddings (`TokenAndPositionEmbedding`, positions
    counted from 0 as keras-hub counts them), layer norm (epsilon 1e-5)
    and dropout; post-norm `TransformerEncoderBlock`s with the exact GELU
    (`activation="gelu"`), layer norms of epsilon 1e-5 (read from the
    backbone's layers: `keras_hub_encoder_options`).

    Args:
        backbone: a built `keras_hub.models.RobertaBackbone` (or
            `XLMRobertaBackbone`).

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.roberta import convert_roberta
    >>> backbone = keras_hub.models.RobertaBackbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=6)
    >>> model = convert_roberta(backbone)
    >>> sorted(model.input), model.get_layer(
    ...     "transformer_layer_0").feed_forward.activation.__name__
    (['padding_mask', 'token_ids'], 'gelu')

    References:
        - Liu et al., 2019, "RoBERTa: A Robustly Optimized BERT
          Pretraining Approach".
        - Conneau et al., 2020, "Unsupervised Cross-lingual Representation
          Learning at Scale" (XLM-R).
    """
    config = {name: _common.config_value(backbone, name) for name in CONFIG}
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    return _common.convert_bert_like(
        backbone, config, prefixes, backbone.transformer_layers
    )
