"""keras-hub's `RoformerV2Backbone` rebuilt from `keras_attention`
blocks; also the pieces ESM shares with it (its attention is RoFormer's
`RoformerAttention`): the projections' weight layout, the activation by
name and the padding mask read from the token ids."""

import keras
import numpy as np

from keras_attention.interop import _common

# Their weight path prefix -> ours (`{i}`: the layer index). The
# attention's `Dense` projections `(hidden, heads * head_size)` become
# our `(hidden, heads, head_size)` (`transform_weight`); the other
# weights have the same names and shapes on both sides.
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    ("segment_embedding", "segment_embedding"),
    ("embeddings_layer_norm", "embeddings_layer_norm"),
    (
        "transformer_layer_{i}/attention_layer/q_dense_layer",
        "transformer_layer_{i}/self_attention/query",
    ),
    (
        "transformer_layer_{i}/attention_layer/k_dense_layer",
        "transformer_layer_{i}/self_attention/key",
    ),
    (
        "transformer_layer_{i}/attention_layer/v_dense_layer",
        "transformer_layer_{i}/self_attention/value",
    ),
    (
        "transformer_layer_{i}/attention_layer/o_dense_layer",
        "transformer_layer_{i}/self_attention/attention_output",
    ),
    (
        "transformer_layer_{i}/attention_norm",
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
        "transformer_layer_{i}/feedforward_norm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
)

CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "head_size",
    "max_wavelength",
    "num_segments",
)


def interleaved_to_halves(head_size):
    """The order of a head's features that turns RoFormer's rotary
    embedding (features `2i` and `2i + 1` rotated together) into ours
    (features `i` and `i + head_size / 2`): even features, then odd ones.
    The same order on queries and keys leaves every score `q . k` as it
    was."""
    return np.concatenate(
        [np.arange(0, head_size, 2), np.arange(1, head_size, 2)]
    )


def projection_transform(heads, head_size, order=None):
    """`transform(their_path, value)` for `_common.copy_weights`: the
    `Dense` weights of a keras-hub `RoformerAttention` (RoFormer-v2, ESM)
    in our layout. Queries and keys, `(hidden, heads * head_size)` and
    their biases, become `(hidden, heads, head_size)` with each head's
    features in `order` (None: unchanged); values likewise, unordered;
    the output projection `(heads * head_size, out)` becomes `(heads,
    head_size, out)`. Other weights are unchanged."""

    def transform(path, value):
        layer = path.rsplit("/", 2)[-2]
        if layer in ("q_dense_layer", "k_dense_layer", "v_dense_layer"):
            value = value.reshape(value.shape[:-1] + (heads, head_size))
            if order is not None and layer != "v_dense_layer":
                value = value[..., order]
        elif layer == "o_dense_layer" and path.endswith("kernel"):
            value = value.reshape((heads, head_size) + value.shape[1:])
        return value

    return transform


def activation_name(backbone, function):
    """The name of a keras-hub layer's activation `function` that Keras
    resolves to the same function (so that the converted model reloads
    with `safe_mode=True`); `ValueError` naming `activation` for one
    without such a name."""
    name = getattr(function, "__name__", None)
    try:
        known = name is not None and keras.activations.get(name) is function
    except ValueError:  # not a Keras activation's name
        known = False
    if not known:
        raise ValueError(
            f"The `activation` of {type(backbone).__name__} is not a Keras "
            f"activation; it cannot be converted. Received: "
            f"activation={function!r}"
        )
    return name


def token_padding_mask(token_ids, pad_token_id):
    """The padding mask keras-hub's RoFormer-v2 and ESM read from their
    token ids: True where `token_ids != pad_token_id`."""
    return keras.ops.not_equal(token_ids, pad_token_id)


def convert_roformer_v2(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `RoformerV2Backbone`, holding a copy of its weights.

    Inputs `token_ids`, `segment_ids` (int `(batch, T)`), as the
    backbone's: the padding mask is `token_ids != 0`, as keras-hub reads
    it. Output the hidden states `(batch, T, hidden)`. Token plus segment
    embeddings, RoFormer's scale-only RMS norm (`RMSNormalization`, its
    epsilon read from the backbone), dropout; post-norm
    `TransformerEncoderBlock`s with `normalization="rms_norm"`, each of a
    `SelfAttention` with heads of `head_size`, rotary positions
    (`rotary_max_wavelength=max_wavelength`) and the backbone's
    `use_bias`, and a `FeedForward` of its `activation`.

    RoFormer rotates features `2i` and `2i + 1` of a head together, this
    library features `i` and `i + head_size / 2`: the query and key
    projections are copied with each head's features reordered (even ones,
    then odd ones: `interleaved_to_halves`), which leaves the scores as
    they were.

    Padding: our attention masks padded keys. keras-hub 0.32's
    `RoformerAttention` masks padded *queries* instead on TensorFlow and
    JAX (its real tokens attend to the padding; on PyTorch it masks the
    keys), so the outputs are equal on every backend for inputs without
    padding (token id 0), and with padding on PyTorch only.

    Args:
        backbone: a built `keras_hub.models.RoformerV2Backbone`.

    Returns:
        The converted `keras.Model`.

    Raises:
        ValueError: an `activation` without a Keras name.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.roformer_v2 import convert_roformer_v2
    >>> backbone = keras_hub.models.RoformerV2Backbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, head_size=4)
    >>> sorted(convert_roformer_v2(backbone).input)
    ['segment_ids', 'token_ids']

    References:
        - Su et al., 2024, "RoFormer: Enhanced Transformer with Rotary
          Position Embedding".
        - Su et al., 2022, "RoFormerV2: A Faster and Better RoFormer"
          (ZhuiyiTechnology).
    """
    config = {name: _common.config_value(backbone, name) for name in CONFIG}
    get = backbone.get_config()
    use_bias = bool(get.get("use_bias", False))
    dropout = float(get.get("dropout", 0.0))
    activation = activation_name(backbone, backbone.activation)
    dtype = backbone.dtype_policy
    heads, head_size = config["num_heads"], config["head_size"]
    inputs = _common.token_inputs("token_ids", "segment_ids")
    padding_mask = token_padding_mask(inputs["token_ids"], 0)
    tokens = keras.layers.ReversibleEmbedding(
        config["vocabulary_size"],
        config["hidden_dim"],
        dtype=dtype,
        name="token_embedding",
    )(inputs["token_ids"])
    segments = keras.layers.Embedding(
        config["num_segments"],
        config["hidden_dim"],
        dtype=dtype,
        name="segment_embedding",
    )(inputs["segment_ids"])
    x = keras.layers.Add(dtype=dtype, name="embeddings_add")([tokens, segments])
    x = keras.layers.RMSNormalization(
        epsilon=float(backbone.embeddings_layer_norm.epsilon),
        dtype=dtype,
        name="embeddings_layer_norm",
    )(x)
    x = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")(x)
    for i, layer in enumerate(backbone.transformer_layers):
        x = _common.encoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads,
                head_size,
                causal=False,
                use_bias=use_bias,
                rotary_max_wavelength=config["max_wavelength"],
                dtype=dtype,
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"],
                activation=activation,
                use_bias=use_bias,
                dtype=dtype,
            ),
            dropout=dropout,
            normalization="rms_norm",
            layer_norm_epsilon=float(layer.attention_norm.epsilon),
            dtype=dtype,
        )(x, padding_mask=padding_mask)
    model = keras.Model(inputs=inputs, outputs=x, name=backbone.name)
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    _common.copy_weights(
        backbone,
        model,
        prefixes,
        projection_transform(
            heads, head_size, interleaved_to_halves(head_size)
        ),
    )
    return model
