"""keras-hub's `ElectraBackbone` rebuilt from `keras_attention` blocks."""

from keras_attention.interop import _common

# Their weight path prefix -> ours (`{i}`: the layer index). The weights
# under each prefix have the same names and shapes on both sides.
# `embeddings_projection` exists when `embedding_dim != hidden_dim`.
WEIGHT_TABLE = (
    ("token_embedding", "embeddings/token_embedding"),
    ("position_embedding", "embeddings/position_embedding"),
    ("segment_embedding", "segment_embedding"),
    ("embeddings_layer_norm", "embeddings_layer_norm"),
    ("embeddings_projection", "embeddings_projection"),
    *_common.encoder_layer_table(
        "transformer_layer_{i}", "transformer_layer_{i}"
    ),
    ("pooled_dense", "pooled_dense"),
)

# Our config name -> keras-hub's (ELECTRA's vocabulary is `vocab_size`).
CONFIG = {
    "vocabulary_size": "vocab_size",
    "num_layers": "num_layers",
    "num_heads": "num_heads",
    "embedding_dim": "embedding_dim",
    "hidden_dim": "hidden_dim",
    "intermediate_dim": "intermediate_dim",
    "dropout": "dropout",
    "max_sequence_length": "max_sequence_length",
    "num_segments": "num_segments",
}


def convert_electra(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `ElectraBackbone`, holding a copy of its weights.

    Inputs `token_ids`, `segment_ids`, `padding_mask` (int `(batch, T)`);
    outputs `{"sequence_output": (batch, T, hidden), "pooled_output":
    (batch, hidden)}`, as the backbone's. Token plus position embeddings
    (`TokenAndPositionEmbedding`) and segment embeddings of
    `embedding_dim`, layer norm (epsilon 1e-12) and dropout, then, when
    `embedding_dim != hidden_dim`, a `Dense` (`embeddings_projection`) to
    `hidden_dim`; post-norm `TransformerEncoderBlock`s with
    `gelu_approximate`; the pooler is a tanh `Dense` on the first token.

    Args:
        backbone: a built `keras_hub.models.ElectraBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.electra import convert_electra
    >>> backbone = keras_hub.models.ElectraBackbone(
    ...     vocab_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     embedding_dim=4, intermediate_dim=16, max_sequence_length=6)
    >>> model = convert_electra(backbone)
    >>> tuple(model.get_layer("embeddings_projection").kernel.shape)
    (4, 8)

    References:
        - Clark et al., 2020, "ELECTRA: Pre-training Text Encoders as
          Discriminators Rather Than Generators".
    """
    config = {
        ours: _common.config_value(backbone, theirs)
        for ours, theirs in CONFIG.items()
    }
    projection = None
    if config["embedding_dim"] != config["hidden_dim"]:
        projection = "embeddings_projection"
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    return _common.convert_bert_like(
        backbone,
        config,
        prefixes,
        backbone.transformer_layers,
        projection=projection,
    )
