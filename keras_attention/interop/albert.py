"""keras-hub's `AlbertBackbone` rebuilt from `keras_attention` blocks: its
factorized embedding (tokens embedded in `embedding_dim`, then projected
to `hidden_dim`) and its shared layers, one block per shared layer called
as often as the backbone calls it."""

from keras_attention.interop import _common

# Their weight path prefix -> ours (`{g}`: the group, `{j}`: the layer in
# the group). Each shared layer is one block of ours, named as theirs,
# holding the weights once. The weights under each prefix have the same
# names and shapes on both sides.
WEIGHT_TABLE = (
    ("token_embedding", "embeddings/token_embedding"),
    ("position_embedding", "embeddings/position_embedding"),
    ("segment_embedding", "segment_embedding"),
    ("embeddings_layer_norm", "embeddings_layer_norm"),
    ("embedding_projection", "embedding_projection"),
    *_common.encoder_layer_table(
        "group_{g}_inner_layer_{j}", "group_{g}_inner_layer_{j}"
    ),
    ("pooled_dense", "pooled_dense"),
)

CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "embedding_dim",
    "hidden_dim",
    "intermediate_dim",
    "num_groups",
    "num_inner_repetitions",
    "dropout",
    "max_sequence_length",
    "num_segments",
)


def weight_prefixes(num_groups, num_inner_repetitions):
    """`WEIGHT_TABLE` made concrete for the groups `0 .. num_groups - 1`
    of `num_inner_repetitions` layers each: `{their prefix: ours}`."""
    out = {}
    for theirs, ours in WEIGHT_TABLE:
        for g in range(num_groups):
            for j in range(num_inner_repetitions):
                out[theirs.format(g=g, j=j)] = ours.format(g=g, j=j)
    return out


def convert_albert(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `AlbertBackbone`, holding a copy of its weights.

    Inputs `token_ids`, `segment_ids`, `padding_mask` (int `(batch, T)`);
    outputs `{"sequence_output": (batch, T, hidden), "pooled_output":
    (batch, hidden)}`, as the backbone's. The factorized embedding: token
    plus position embeddings (`TokenAndPositionEmbedding`) and segment
    embeddings of `embedding_dim`, layer norm (epsilon 1e-12) and
    dropout, then a `Dense` (`embedding_projection`) to `hidden_dim`. The
    shared layers: `num_groups` groups of `num_inner_repetitions`
    post-norm `TransformerEncoderBlock`s (`gelu_approximate`), one block
    per layer of theirs, named as it (`group_{g}_inner_layer_{j}`); each
    group runs `num_layers // num_groups` times over, in keras-hub's
    order, calling the same blocks (their weights shared, as ALBERT's
    are). The pooler is a tanh `Dense` on the first token.

    Args:
        backbone: a built `keras_hub.models.AlbertBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.albert import convert_albert
    >>> backbone = keras_hub.models.AlbertBackbone(
    ...     vocabulary_size=20, num_layers=4, num_heads=2, embedding_dim=4,
    ...     hidden_dim=8, intermediate_dim=16, num_groups=2,
    ...     max_sequence_length=6)
    >>> model = convert_albert(backbone)
    >>> [layer.name for layer in model.layers if hasattr(layer, "causal")]
    ['group_0_inner_layer_0', 'group_1_inner_layer_0']

    References:
        - Lan et al., 2020, "ALBERT: A Lite BERT for Self-supervised
          Learning of Language Representations".
    """
    config = {name: _common.config_value(backbone, name) for name in CONFIG}
    per_group = config["num_layers"] // config["num_groups"]
    calls = [
        layer
        for group in backbone.transformer_layers
        for _ in range(per_group)
        for layer in group
    ]
    prefixes = weight_prefixes(
        config["num_groups"], config["num_inner_repetitions"]
    )
    return _common.convert_bert_like(
        backbone, config, prefixes, calls, projection="embedding_projection"
    )
