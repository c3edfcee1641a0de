"""keras-hub's `DistilBertBackbone` rebuilt from `keras_attention`
blocks."""

from keras_attention.interop import _common

# Their weight path prefix -> ours (`{i}`: the layer index). The weights
# under each prefix have the same names and shapes on both sides.
WEIGHT_TABLE = (
    ("token_and_position_embedding", "embeddings"),
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


def convert_distil_bert(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `DistilBertBackbone`, holding a copy of its weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`: DistilBERT has
    no token types, so no `segment_ids`); output the hidden states
    `(batch, T, hidden)`, as the backbone's (no pooler). Token plus
    position embeddings (`TokenAndPositionEmbedding`), layer norm (epsilon
    1e-12) and dropout; post-norm `TransformerEncoderBlock`s with the
    exact GELU (`activation="gelu"`), layer norms of epsilon 1e-12 (read
    from the backbone's layers: `keras_hub_encoder_options`).

    Args:
        backbone: a built `keras_hub.models.DistilBertBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.distil_bert import convert_distil_bert
    >>> backbone = keras_hub.models.DistilBertBackbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=6)
    >>> sorted(convert_distil_bert(backbone).input)
    ['padding_mask', 'token_ids']

    References:
        - Sanh et al., 2019, "DistilBERT, a distilled version of BERT:
          smaller, faster, cheaper and lighter".
    """
    config = {name: _common.config_value(backbone, name) for name in CONFIG}
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    return _common.convert_bert_like(
        backbone, config, prefixes, backbone.transformer_layers
    )
