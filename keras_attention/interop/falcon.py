"""keras-hub's `FalconBackbone` rebuilt from `keras_attention` blocks."""

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.scores.alibi import ALiBi

# Their weight path prefix -> ours (`{i}`: the layer index). keras-hub's
# attention output is a `Dense` `(hidden, hidden)`; ours is `(heads,
# head_dim, hidden)`: `convert_falcon` reshapes it.
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    (
        "transformer_layer_{i}/input_layernorm",
        "transformer_layer_{i}/self_attention_norm",
    ),
    (
        "transformer_layer_{i}/attention/query_dense",
        "transformer_layer_{i}/self_attention/query",
    ),
    (
        "transformer_layer_{i}/attention/key_dense",
        "transformer_layer_{i}/self_attention/key",
    ),
    (
        "transformer_layer_{i}/attention/value_dense",
        "transformer_layer_{i}/self_attention/value",
    ),
    (
        "transformer_layer_{i}/attention/output_dense",
        "transformer_layer_{i}/self_attention/attention_output",
    ),
    (
        "transformer_layer_{i}/post_attention_layernorm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
    (
        "transformer_layer_{i}/dense_h_to_4h",
        "transformer_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "transformer_layer_{i}/dense_4h_to_h",
        "transformer_layer_{i}/feed_forward/output_dense",
    ),
    ("final_layernorm", "final_layernorm"),
)


def _dropout(backbone):
    """The one residual dropout rate of our blocks: keras-hub's attention
    and feed-forward rates, which must then be equal."""
    attention = float(_common.config_value(backbone, "attention_dropout_rate"))
    feed_forward = float(
        _common.config_value(backbone, "feedforward_dropout_rate")
    )
    if attention != feed_forward:
        raise ValueError(
            "Falcon converts with one dropout rate after both sublayers: "
            "`attention_dropout_rate` and `feedforward_dropout_rate` must "
            f"be equal. Received: attention_dropout_rate={attention!r}, "
            f"feedforward_dropout_rate={feed_forward!r}"
        )
    return attention


def convert_falcon(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `FalconBackbone`, holding a copy of its weights.

    keras-hub 0.32's Falcon is Falcon-RW (1B): sequential pre-norm
    decoder layers (attention, then the feed-forward, each with its
    residual), full multi-head attention with biases and ALiBi, the exact
    GELU. Inputs `token_ids`, `padding_mask` (int `(batch, T)`); output
    the sequence output `(batch, T, hidden)`. The tied token embedding,
    then pre-norm `TransformerDecoderBlock`s with biases, the exact GELU
    (`activation="gelu"`) and ALiBi (`score_mod=ALiBi(num_heads,
    slope_scale=head_dim ** -0.5)`: keras-hub adds its biases before
    scaling the scores by `1 / sqrt(head_dim)`), then the final layer
    norm. keras-hub adds `slope * p_j`, `p_j` the count of real tokens
    before key `j`, where ALiBi adds `-slope * (i - j)`: with contiguous
    padding the two differ by a constant per query row, which the
    softmax cancels. The decoder layers' norm epsilon is read from them
    (keras-hub 0.32's backbone does not pass its `layer_norm_epsilon` on
    to them: they keep 1e-5; the final norm has the backbone's).

    keras-hub's Falcon has no parallel attention and feed-forward,
    multi-query attention or rotary positions (Falcon-7B's and -40B's):
    none of them reaches this converter.

    Args:
        backbone: a built `keras_hub.models.FalconBackbone`.

    Returns:
        The converted `keras.Model`.

    Raises:
        ValueError: `attention_dropout_rate` and
            `feedforward_dropout_rate` differ (our blocks have one
            residual dropout rate).

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.falcon import convert_falcon
    >>> backbone = keras_hub.models.FalconBackbone(
    ...     vocabulary_size=20, num_layers=1, num_attention_heads=4,
    ...     hidden_dim=16, intermediate_dim=32)
    >>> model = convert_falcon(backbone)
    >>> alibi = model.get_layer("transformer_layer_0").self_attention.score_mod
    >>> type(alibi).__name__, alibi.slope_scale
    ('ALiBi', 0.5)

    References:
        - Penedo et al., 2023, "The RefinedWeb Dataset for Falcon LLM"
          (Falcon-RW).
        - Press et al., 2022, "Train Short, Test Long: Attention with
          Linear Biases Enables Input Length Extrapolation".
    """
    config = {
        name: _common.config_value(backbone, name)
        for name in (
            "vocabulary_size",
            "num_layers",
            "num_attention_heads",
            "hidden_dim",
            "intermediate_dim",
            "layer_norm_epsilon",
        )
    }
    dropout = _dropout(backbone)
    heads, hidden = config["num_attention_heads"], config["hidden_dim"]
    head_dim = hidden // heads
    dtype = backbone.dtype_policy
    inputs = _common.token_inputs("token_ids", "padding_mask")
    x = keras.layers.ReversibleEmbedding(
        config["vocabulary_size"], hidden, dtype=dtype, name="token_embedding"
    )(inputs["token_ids"])
    for i, layer in enumerate(backbone.transformer_layers):
        x = _common.decoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads,
                head_dim,
                causal=True,
                dropout=dropout,
                score_mod=ALiBi(heads, slope_scale=head_dim**-0.5),
                dtype=dtype,
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"], activation="gelu", dtype=dtype
            ),
            dropout=dropout,
            norm_first=True,
            layer_norm_epsilon=float(layer.layer_norm_epsilon),
            dtype=dtype,
        )(x, padding_mask=inputs["padding_mask"])
    x = keras.layers.LayerNormalization(
        epsilon=config["layer_norm_epsilon"],
        dtype=dtype,
        name="final_layernorm",
    )(x)
    model = keras.Model(inputs=inputs, outputs=x, name=backbone.name)

    def transform_weight(path, value):
        if path.endswith("attention/output_dense/kernel"):
            return np.reshape(value, (heads, head_dim, hidden))
        return value

    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    _common.copy_weights(backbone, model, prefixes, transform_weight)
    return model
