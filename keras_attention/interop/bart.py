"""keras-hub's `BartBackbone` rebuilt from `keras_attention` blocks."""

import keras

from keras_attention.interop import _common
from keras_attention.layers.position_embedding import PositionEmbedding

# keras-hub's BART: layer norms with epsilon 1e-5, post-norm encoder and
# decoder layers with the exact GELU.
LAYER_NORM_EPSILON = 1e-5

# Their weight path prefix -> ours (`{i}`: the layer index). The weights
# under each prefix have the same names and shapes on both sides (Keras's
# `MultiHeadAttention` and ours share their layout).
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    ("encoder_position_embedding", "encoder_position_embedding"),
    ("encoder_embeddings_layer_norm", "encoder_embeddings_layer_norm"),
    ("decoder_position_embedding", "decoder_position_embedding"),
    ("decoder_embeddings_layer_norm", "decoder_embeddings_layer_norm"),
    (
        "transformer_encoder_layer_{i}/self_attention_layer",
        "transformer_encoder_layer_{i}/self_attention",
    ),
    (
        "transformer_{stack}_layer_{i}/self_attention_layer_norm",
        "transformer_{stack}_layer_{i}/self_attention_norm",
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
)


def _embed(ids, tokens, stack, config, dtype):
    """The shared token table plus `stack`'s learned positions, its layer
    norm and dropout."""
    x = tokens(ids)
    positions = PositionEmbedding(
        config["max_sequence_length"],
        dtype=dtype,
        name=f"{stack}_position_embedding",
    )(x)
    x = keras.layers.Add(dtype=dtype, name=f"{stack}_embeddings_add")(
        [x, positions]
    )
    x = keras.layers.LayerNormalization(
        epsilon=LAYER_NORM_EPSILON,
        dtype=dtype,
        name=f"{stack}_embeddings_layer_norm",
    )(x)
    return keras.layers.Dropout(
        config["dropout"], dtype=dtype, name=f"{stack}_embeddings_dropout"
    )(x)


def convert_bart(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `BartBackbone`, holding a copy of its weights.

    Inputs `encoder_token_ids`, `encoder_padding_mask`,
    `decoder_token_ids`, `decoder_padding_mask` (int `(batch, T)`);
    outputs `{"encoder_sequence_output", "decoder_sequence_output"}`. One
    token table (`ReversibleEmbedding`, tied to the logits as
    `BartSeq2SeqLM`'s) for both stacks, each stack's own learned positions
    (`PositionEmbedding`, counted from 0: keras-hub's converter drops the
    two offset rows of the Hugging Face checkpoints) added, then a layer
    norm (BART's `layernorm_embedding`) and dropout; post-norm
    `TransformerEncoderBlock`s and `TransformerDecoderBlock`s (with
    `CrossAttention`) with biases, the exact GELU and layer norms of
    epsilon 1e-5; no final norm.

    Args:
        backbone: a built `keras_hub.models.BartBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.bart import convert_bart
    >>> backbone = keras_hub.models.BartBackbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16, max_sequence_length=6)
    >>> sorted(convert_bart(backbone).output)
    ['decoder_sequence_output', 'encoder_sequence_output']

    References:
        - Lewis et al., 2020, "BART: Denoising Sequence-to-Sequence
          Pre-training for Natural Language Generation, Translation, and
          Comprehension".
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
    inputs = _common.token_inputs(
        "encoder_token_ids",
        "encoder_padding_mask",
        "decoder_token_ids",
        "decoder_padding_mask",
    )
    tokens = keras.layers.ReversibleEmbedding(
        config["vocabulary_size"],
        config["hidden_dim"],
        dtype=dtype,
        name="token_embedding",
    )
    heads, hidden = config["num_heads"], config["hidden_dim"]
    attention = dict(
        num_heads=heads,
        key_dim=hidden // heads,
        dropout=config["dropout"],
        dtype=dtype,
    )
    block_options = dict(
        dropout=config["dropout"],
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        dtype=dtype,
    )

    def feed_forward():
        return _common.feed_forward(
            config["intermediate_dim"],
            activation="gelu",  # the exact GELU
            dropout=config["dropout"],
            dtype=dtype,
        )

    x = _embed(inputs["encoder_token_ids"], tokens, "encoder", config, dtype)
    for i in range(config["num_layers"]):
        x = _common.encoder_block(
            f"transformer_encoder_layer_{i}",
            _common.self_attention(causal=False, **attention),
            feed_forward(),
            **block_options,
        )(x, padding_mask=inputs["encoder_padding_mask"])
    encoder_output = x
    x = _embed(inputs["decoder_token_ids"], tokens, "decoder", config, dtype)
    for i in range(config["num_layers"]):
        x = _common.decoder_block(
            f"transformer_decoder_layer_{i}",
            _common.self_attention(causal=True, **attention),
            feed_forward(),
            cross_attention=_common.cross_attention(**attention),
            **block_options,
        )(
            x,
            encoder_output,
            padding_mask=inputs["decoder_padding_mask"],
            context_padding_mask=inputs["encoder_padding_mask"],
        )
    model = keras.Model(
        inputs=inputs,
        outputs={
            "encoder_sequence_output": encoder_output,
            "decoder_sequence_output": x,
        },
        name=backbone.name,
    )
    _common.copy_weights(
        backbone,
        model,
        _common.stack_prefixes(WEIGHT_TABLE, config["num_layers"]),
    )
    return model
