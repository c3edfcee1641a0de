"""keras-hub's `DebertaV3Backbone` rebuilt from `keras_attention` blocks:
its disentangled attention as a `DisentangledSelfAttention` holding one
`scores.DisentangledRelativeBias` shared by every layer."""

import keras

from keras_attention.interop import _common
from keras_attention.layers.disentangled_self_attention import (
    DisentangledSelfAttention,
)
from keras_attention.scores.disentangled import DisentangledRelativeBias

# Their weight path prefix -> ours (`{i}`: the layer index). The weights
# under each prefix have the same names and shapes on both sides, but
# the attention's output kernel, `(hidden, hidden)` there and `(heads,
# head_dim, hidden)` here (`transform_weight`). The relative table and its
# layer norm (`rel_embedding/...`) go to the one `DisentangledRelativeBias`
# (`RELATIVE_WEIGHTS`).
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    ("embeddings_layer_norm", "embeddings_layer_norm"),
    (
        "disentangled_attention_encoder_layer_{i}/self_attention_layer",
        "transformer_layer_{i}/self_attention",
    ),
    (
        "disentangled_attention_encoder_layer_{i}/self_attention_layer_norm",
        "transformer_layer_{i}/self_attention_norm",
    ),
    (
        "disentangled_attention_encoder_layer_{i}/"
        "feedforward_intermediate_dense",
        "transformer_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "disentangled_attention_encoder_layer_{i}/feedforward_output_dense",
        "transformer_layer_{i}/feed_forward/output_dense",
    ),
    (
        "disentangled_attention_encoder_layer_{i}/feedforward_layer_norm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
)

# Their relative table and its layer norm -> the attribute path of the
# weight in our `DisentangledRelativeBias`.
RELATIVE_WEIGHTS = {
    "rel_embedding/rel_embedding": ("embeddings",),
    "rel_embedding/rel_embeddings_layer_norm/gamma": ("layer_norm", "gamma"),
    "rel_embedding/rel_embeddings_layer_norm/beta": ("layer_norm", "beta"),
}

CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "max_sequence_length",
    "bucket_size",
)


def transform_weight(path, value, heads):
    """The attention's output kernel `(hidden, hidden)` as ours
    `(heads, head_dim, hidden)`; other weights unchanged."""
    if path.endswith("self_attention_layer/attention_output/kernel"):
        return value.reshape((heads, -1) + value.shape[1:])
    return value


def _weight_pairs(backbone, model, bias, heads):
    """`(their weight, our weight, value)` for every weight of
    `backbone` (`_common.copy_pairs`): the relative table and its norm
    into `bias`, the others by `WEIGHT_TABLE`."""
    ours = {w.path: w for w in model.weights}
    prefixes = _common.layer_prefixes(
        WEIGHT_TABLE, len(backbone.transformer_layers)
    )
    pairs = []
    for weight in backbone.weights:
        if weight.path in RELATIVE_WEIGHTS:
            target = bias
            for name in RELATIVE_WEIGHTS[weight.path]:
                target = getattr(target, name)
        else:
            target = ours.get(_common.our_path(weight.path, prefixes))
            if target is None:
                continue  # reported by `copy_pairs` as without a place
        value = transform_weight(
            weight.path, _common.numpy_value(weight), heads
        )
        pairs.append((weight, target, value))
    return pairs


def convert_deberta_v3(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `DebertaV3Backbone`, holding a copy of its weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`); output the
    hidden states `(batch, T, hidden)`, as the backbone's. A token
    embedding, layer norm and dropout, then post-norm
    `TransformerEncoderBlock`s (layer norms of epsilon 1e-7, read from the
    backbone), each of a `DisentangledSelfAttention` (DeBERTa's
    disentangled attention: content-to-content, content-to-position and
    position-to-content scores, scaled by `1 / sqrt(3 head_dim)`) and a
    `FeedForward` with the exact GELU. The relative embedding table of
    `2 * bucket_size` rows and its layer norm are one
    `scores.DisentangledRelativeBias` (log buckets of `bucket_size` up to
    `max_sequence_length`, keras-hub's `max_position_embeddings`), shared
    by every layer's attention as keras-hub shares its
    `rel_embedding`; each layer projects it with its own query and key
    projections, as DeBERTa-v3 does.

    Args:
        backbone: a built `keras_hub.models.DebertaV3Backbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.deberta_v3 import convert_deberta_v3
    >>> backbone = keras_hub.models.DebertaV3Backbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=16, bucket_size=4)
    >>> model = convert_deberta_v3(backbone)
    >>> model.get_layer("transformer_layer_0").self_attention.score_mod.name
    'rel_embedding'

    References:
        - He et al., 2023, "DeBERTaV3: Improving DeBERTa using
          ELECTRA-Style Pre-Training with Gradient-Disentangled Embedding
          Sharing".
    """
    config = {name: _common.config_value(backbone, name) for name in CONFIG}
    dropout = float(backbone.get_config().get("dropout", 0.0))
    dtype = backbone.dtype_policy
    heads, hidden = config["num_heads"], config["hidden_dim"]
    relative = backbone.relative_embeddings
    inputs = _common.token_inputs("token_ids", "padding_mask")
    x = keras.layers.ReversibleEmbedding(
        config["vocabulary_size"], hidden, dtype=dtype, name="token_embedding"
    )(inputs["token_ids"])
    x = keras.layers.LayerNormalization(
        epsilon=float(backbone.embeddings_layer_norm.epsilon),
        dtype=dtype,
        name="embeddings_layer_norm",
    )(x)
    x = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")(x)
    bias = DisentangledRelativeBias(
        hidden,
        bucket_size=config["bucket_size"],
        max_distance=config["max_sequence_length"],
        layer_norm_epsilon=float(relative.layer_norm_epsilon),
        dtype=dtype,
        name="rel_embedding",
    )
    for i, layer in enumerate(backbone.transformer_layers):
        x = _common.encoder_block(
            f"transformer_layer_{i}",
            self_attention=DisentangledSelfAttention(
                heads,
                hidden // heads,
                score_mod=bias,
                dropout=dropout,
                dtype=dtype,
                name="self_attention",
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"], activation="gelu", dtype=dtype
            ),
            dropout=dropout,
            layer_norm_epsilon=float(layer.layer_norm_epsilon),
            dtype=dtype,
        )(x, padding_mask=inputs["padding_mask"])
    model = keras.Model(inputs=inputs, outputs=x, name=backbone.name)
    pairs = _weight_pairs(backbone, model, bias, heads)
    _common.copy_pairs(backbone, model, pairs)
    return model
