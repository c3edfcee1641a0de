"""keras-hub's `WhisperBackbone` rebuilt from `keras_attention` blocks."""

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.layers.position_embedding import PositionEmbedding
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)

# keras-hub's Whisper: pre-norm encoder and decoder layers with the exact
# GELU, layer norms with epsilon 1e-5, a final layer norm per stack.
LAYER_NORM_EPSILON = 1e-5

# Their weight path prefix -> ours (`{i}`: the layer index, `{stack}`:
# `encoder` or `decoder`). The weights under each prefix have the same
# names and shapes on both sides, but one: Whisper's key projections have
# no bias, ours have one, which holds zeros (see `convert_whisper`).
WEIGHT_TABLE = (
    (
        "encoder_token_embedding_conv_layer_1",
        "encoder_token_embedding_conv_layer_1",
    ),
    (
        "encoder_token_embedding_conv_layer_2",
        "encoder_token_embedding_conv_layer_2",
    ),
    ("encoder_position_embedding", "encoder_position_embedding"),
    (
        "transformer_encoder_layer_{i}/self_attention_layer",
        "transformer_encoder_layer_{i}/self_attention",
    ),
    (
        "transformer_decoder_layer_{i}/self_attention",
        "transformer_decoder_layer_{i}/self_attention",
    ),
    (
        "transformer_decoder_layer_{i}/cross_attention",
        "transformer_decoder_layer_{i}/cross_attention",
    ),
    (
        "transformer_{stack}_layer_{i}/self_attention_layer_norm",
        "transformer_{stack}_layer_{i}/self_attention_norm",
    ),
    (
        "transformer_decoder_layer_{i}/cross_attention_layer_norm",
        "transformer_decoder_layer_{i}/cross_attention_norm",
    ),
    (
        "transformer_{stack}_layer_{i}/feedforward_intermediate_dense",
        "transformer_{stack}_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "transformer_{stack}_layer_{i}/feedforward_output_dense",
        "transformer_{stack}_layer_{i}/feed_forward/output_dense",
    ),
    (
        "transformer_{stack}_layer_{i}/feedforward_layer_norm",
        "transformer_{stack}_layer_{i}/feed_forward_norm",
    ),
    ("encoder_layer_norm", "encoder_layer_norm"),
    (
        "decoder_token_and_position_embedding",
        "decoder_token_and_position_embedding",
    ),
    ("decoder_layer_norm", "decoder_layer_norm"),
)


def _weight_pairs(backbone, model, prefixes):
    """`(their variable, our variable, value)` of every weight: each of
    theirs at its place by the table, and each of our key biases (which
    Whisper has not) set to zeros, paired with the key kernel it goes
    with."""
    ours = {w.path: w for w in model.weights}
    pairs, kernels = [], {}
    for weight in backbone.weights:
        path = _common.our_path(weight.path, prefixes)
        if path in ours:
            pairs.append((weight, ours[path], None))
        if path is not None and path.endswith("/key/kernel"):
            kernels[path] = weight
    for path, weight in ours.items():
        if path.endswith("/key/bias"):
            kernel = kernels.get(path[: -len("bias")] + "kernel")
            if kernel is not None:
                zeros = np.zeros(tuple(weight.shape), weight.dtype)
                pairs.append((kernel, weight, zeros))
    return pairs


def _audio_frontend(features, config, dtype):
    """Whisper's convolutions over the log-mel frames as Keras layers: a
    `Conv1D` of width 3 (`"same"` padding), the exact GELU, a
    `ZeroPadding1D` of one frame each side and a `Conv1D` of width 3 and
    stride 2, the exact GELU: `(batch, frames, mels)` -> `(batch,
    ceil(frames / 2), hidden)`."""
    hidden = config["hidden_dim"]
    x = keras.layers.Conv1D(
        hidden,
        3,
        padding="same",
        activation="gelu",  # the exact GELU
        dtype=dtype,
        name="encoder_token_embedding_conv_layer_1",
    )(features)
    x = keras.layers.ZeroPadding1D(1, dtype=dtype, name="encoder_padder")(x)
    return keras.layers.Conv1D(
        hidden,
        3,
        strides=2,
        padding="valid",
        activation="gelu",
        dtype=dtype,
        name="encoder_token_embedding_conv_layer_2",
    )(x)


def convert_whisper(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `WhisperBackbone`, holding a copy of its weights.

    Inputs `encoder_features` (float `(batch, frames, num_mels)`, log-mel
    frames), `decoder_token_ids`, `decoder_padding_mask` (int `(batch,
    T)`); outputs `{"encoder_sequence_output", "decoder_sequence_output"}`.
    The encoder: Whisper's two convolutions (Keras `Conv1D`s with the exact
    GELU, `ZeroPadding1D`), its fixed position table (a non-trainable
    `PositionEmbedding` of `max_encoder_sequence_length // 2` rows: the
    checkpoints' sinusoids, copied) added, pre-norm
    `TransformerEncoderBlock`s, a final layer norm; every frame is real
    (no padding mask, as keras-hub's). The decoder: token plus learned
    position embeddings (`TokenAndPositionEmbedding`, its token table the
    logits' as in Whisper), pre-norm `TransformerDecoderBlock`s with a
    `CrossAttention`, a final layer norm. Biases everywhere but on the key
    projections, where Whisper has none: ours hold zeros (a key bias adds
    `q . b` to every score of a query's row, which the softmax ignores,
    and gets no gradient), the weights keras-hub has plus one key bias per
    attention layer.

    Args:
        backbone: a built `keras_hub.models.WhisperBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.whisper import convert_whisper
    >>> backbone = keras_hub.models.WhisperBackbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, num_mels=4, max_encoder_sequence_length=16,
    ...     max_decoder_sequence_length=8)
    >>> sorted(convert_whisper(backbone).input)
    ['decoder_padding_mask', 'decoder_token_ids', 'encoder_features']

    References:
        - Radford et al., 2022, "Robust Speech Recognition via Large-Scale
          Weak Supervision" (Whisper).
    """
    config = {
        name: _common.config_value(backbone, name)
        for name in (
            "vocabulary_size",
            "num_layers",
            "num_heads",
            "hidden_dim",
            "intermediate_dim",
            "num_mels",
            "dropout",
            "max_encoder_sequence_length",
            "max_decoder_sequence_length",
        )
    }
    dtype = backbone.dtype_policy
    inputs = {
        "encoder_features": keras.Input(
            shape=(None, config["num_mels"]),
            dtype="float32",
            name="encoder_features",
        ),
        **_common.token_inputs("decoder_token_ids", "decoder_padding_mask"),
    }
    heads, hidden = config["num_heads"], config["hidden_dim"]
    attention = dict(
        num_heads=heads,
        key_dim=hidden // heads,
        dropout=config["dropout"],
        dtype=dtype,
    )
    block_options = dict(
        dropout=config["dropout"],
        norm_first=True,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        dtype=dtype,
    )

    def feed_forward():
        return _common.feed_forward(
            config["intermediate_dim"],
            activation="gelu",
            dropout=config["dropout"],
            dtype=dtype,
        )

    x = _audio_frontend(inputs["encoder_features"], config, dtype)
    positions = PositionEmbedding(
        config["max_encoder_sequence_length"] // 2,
        trainable=False,
        dtype=dtype,
        name="encoder_position_embedding",
    )(x)
    x = keras.layers.Add(dtype=dtype, name="encoder_embeddings_add")(
        [x, positions]
    )
    x = keras.layers.Dropout(
        config["dropout"], dtype=dtype, name="encoder_embeddings_dropout"
    )(x)
    for i in range(config["num_layers"]):
        x = _common.encoder_block(
            f"transformer_encoder_layer_{i}",
            _common.self_attention(causal=False, **attention),
            feed_forward(),
            **block_options,
        )(x)
    encoder_output = keras.layers.LayerNormalization(
        epsilon=LAYER_NORM_EPSILON, dtype=dtype, name="encoder_layer_norm"
    )(x)
    x = TokenAndPositionEmbedding(
        config["vocabulary_size"],
        config["max_decoder_sequence_length"],
        hidden,
        dtype=dtype,
        name="decoder_token_and_position_embedding",
    )(inputs["decoder_token_ids"])
    x = keras.layers.Dropout(
        config["dropout"], dtype=dtype, name="decoder_embeddings_dropout"
    )(x)
    for i in range(config["num_layers"]):
        x = _common.decoder_block(
            f"transformer_decoder_layer_{i}",
            _common.self_attention(causal=True, **attention),
            feed_forward(),
            cross_attention=_common.cross_attention(**attention),
            **block_options,
        )(x, encoder_output, padding_mask=inputs["decoder_padding_mask"])
    decoder_output = keras.layers.LayerNormalization(
        epsilon=LAYER_NORM_EPSILON, dtype=dtype, name="decoder_layer_norm"
    )(x)
    model = keras.Model(
        inputs=inputs,
        outputs={
            "encoder_sequence_output": encoder_output,
            "decoder_sequence_output": decoder_output,
        },
        name=backbone.name,
    )
    prefixes = _common.stack_prefixes(WEIGHT_TABLE, config["num_layers"])
    _common.copy_pairs(
        backbone, model, _weight_pairs(backbone, model, prefixes)
    )
    return model
