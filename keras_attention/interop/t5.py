"""keras-hub's `T5Backbone` rebuilt from `keras_attention` blocks."""

import keras

from keras_attention.interop import _common
from keras_attention.scores.t5_relative_bias import T5RelativeBias

# keras-hub's T5 layer norms have automatic names (their paths change with
# the number of layers created before), so the table maps attributes:
# their attribute path -> our weight path (`{i}`: the layer index,
# `{stack}`: `encoder` or `decoder`). Kernels `(hidden, heads * kv_dim)`
# and `(heads * kv_dim, hidden)` become `(hidden, heads, kv_dim)` and
# `(heads, kv_dim, hidden)`; with `use_gated_activation`, their activated
# `input_projector` is our `gate_dense` (the activated branch) and their
# linear `gate_projector` our `intermediate_dense`.
WEIGHT_TABLE = (
    ("token_embedding.embeddings", "token_embedding/embeddings"),
    (
        "token_embedding.reverse_embeddings",
        "token_embedding/reverse_embeddings",
    ),
    (
        "{stack}_transformer_layers[0].self_attention.relative_attention_bias",
        "{stack}_relative_bias/embeddings",
    ),
    (
        "{stack}_transformer_layers[{i}].self_attention_layer_norm.weight",
        "transformer_{stack}_layer_{i}/self_attention_norm/scale",
    ),
    (
        "{stack}_transformer_layers[{i}].self_attention.query_projector.kernel",
        "transformer_{stack}_layer_{i}/self_attention/query/kernel",
    ),
    (
        "{stack}_transformer_layers[{i}].self_attention.key_projector.kernel",
        "transformer_{stack}_layer_{i}/self_attention/key/kernel",
    ),
    (
        "{stack}_transformer_layers[{i}].self_attention.value_projector.kernel",
        "transformer_{stack}_layer_{i}/self_attention/value/kernel",
    ),
    (
        "{stack}_transformer_layers[{i}].self_attention.output_projector"
        ".kernel",
        "transformer_{stack}_layer_{i}/self_attention/attention_output/kernel",
    ),
    (
        "decoder_transformer_layers[{i}].cross_attention_layer_norm.weight",
        "transformer_decoder_layer_{i}/cross_attention_norm/scale",
    ),
    (
        "decoder_transformer_layers[{i}].cross_attention.{projector}.kernel",
        "transformer_decoder_layer_{i}/cross_attention/{ours}/kernel",
    ),
    (
        "{stack}_transformer_layers[{i}].layer_norm.weight",
        "transformer_{stack}_layer_{i}/feed_forward_norm/scale",
    ),
    (
        "{stack}_transformer_layers[{i}].input_projector.kernel",
        "transformer_{stack}_layer_{i}/feed_forward/gate_dense/kernel "
        "(gated; else intermediate_dense)",
    ),
    (
        "{stack}_transformer_layers[{i}].gate_projector.kernel",
        "transformer_{stack}_layer_{i}/feed_forward/intermediate_dense/kernel",
    ),
    (
        "{stack}_transformer_layers[{i}].output_projector.kernel",
        "transformer_{stack}_layer_{i}/feed_forward/output_dense/kernel",
    ),
    ("{stack}_layer_norm.weight", "{stack}_output_layer_norm/scale"),
)

# keras-hub's `T5MultiHeadAttention` buckets (not arguments there).
NUM_BUCKETS, MAX_DISTANCE = 32, 128

# Their projection -> our `MultiHeadAttention` projection (its public
# properties).
_PROJECTIONS = (
    ("query_projector", "query_dense"),
    ("key_projector", "key_dense"),
    ("value_projector", "value_dense"),
    ("output_projector", "output_dense"),
)


def _attention_pairs(theirs, ours, heads, head_dim):
    """`(their variable, our variable, value)` of one attention layer."""
    pairs = []
    for their_name, our_name in _PROJECTIONS:
        kernel = getattr(theirs, their_name).kernel
        value = _common.numpy_value(kernel)
        if our_name == "output_dense":
            value = value.reshape(heads, head_dim, -1)
        else:
            value = value.reshape(value.shape[0], heads, head_dim)
        pairs.append((kernel, getattr(ours, our_name).kernel, value))
    return pairs


def _feed_forward_pairs(theirs, ours, gated):
    """`(their variable, our variable, None)` of one feed-forward."""
    ff = ours.feed_forward
    if gated:
        return [
            (theirs.input_projector.kernel, ff.gate_dense.kernel, None),
            (theirs.gate_projector.kernel, ff.intermediate_dense.kernel, None),
            (theirs.output_projector.kernel, ff.output_dense.kernel, None),
        ]
    return [
        (theirs.input_projector.kernel, ff.intermediate_dense.kernel, None),
        (theirs.output_projector.kernel, ff.output_dense.kernel, None),
    ]


def _weight_pairs(backbone, model, embedding, biases, blocks, heads, gated):
    """`(their variable, our variable, reshape)` of every weight of a
    `T5Backbone` and its conversion (`heads`: `(num_heads, head_dim)`)."""
    heads, head_dim = heads
    their_embedding = backbone.token_embedding
    pairs = [(their_embedding.embeddings, embedding.embeddings, None)]
    if not embedding.tie_weights:
        pairs.append(
            (
                their_embedding.reverse_embeddings,
                embedding.reverse_embeddings,
                None,
            )
        )
    for stack in ("encoder", "decoder"):
        layers = getattr(backbone, f"{stack}_transformer_layers")
        pairs.append(
            (
                layers[0].self_attention.relative_attention_bias,
                biases[stack].embeddings,
                None,
            )
        )
        for theirs, ours in zip(layers, blocks[stack]):
            pairs.append(
                (
                    theirs.self_attention_layer_norm.weight,
                    ours.self_attention_norm.scale,
                    None,
                )
            )
            pairs += _attention_pairs(
                theirs.self_attention, ours.self_attention, heads, head_dim
            )
            if stack == "decoder":
                pairs.append(
                    (
                        theirs.cross_attention_layer_norm.weight,
                        ours.cross_attention_norm.scale,
                        None,
                    )
                )
                pairs += _attention_pairs(
                    theirs.cross_attention,
                    ours.cross_attention_layer,
                    heads,
                    head_dim,
                )
            pairs.append(
                (theirs.layer_norm.weight, ours.feed_forward_norm.scale, None)
            )
            pairs += _feed_forward_pairs(theirs, ours, gated)
        final = getattr(backbone, f"{stack}_layer_norm").weight
        norm = model.get_layer(f"{stack}_output_layer_norm")
        pairs.append((final, norm.scale, None))
    return pairs


def _feed_forward(config, dtype):
    """A block's `FeedForward` without biases, gated as the backbone's
    `use_gated_activation`."""
    return _common.feed_forward(
        config["intermediate_dim"],
        activation=config["activation"],
        dropout=config["dropout"],
        use_bias=False,
        gated=bool(config["use_gated_activation"]),
        dtype=dtype,
    )


def convert_t5(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `T5Backbone` (T5 and T5 1.1: gated or plain feed-forward), holding a
    copy of its weights.

    Inputs `encoder_token_ids`, `encoder_padding_mask`,
    `decoder_token_ids`, `decoder_padding_mask` (int `(batch, T)`);
    outputs `{"encoder_sequence_output", "decoder_sequence_output"}`. One
    token embedding (`ReversibleEmbedding`, tied or not) for both stacks;
    pre-norm `TransformerEncoderBlock`s and `TransformerDecoderBlock`s
    with `normalization="rms_norm"`, composed of a `SelfAttention` (and
    in the decoder a `CrossAttention`) without biases, with
    `key_dim=key_value_dim` and unscaled scores (`attention_scale=1.0`),
    and a `FeedForward` without biases, gated (`gated=...`) as the
    backbone's `use_gated_activation`. T5's
    relative position bias, which keras-hub's first layer of each stack
    computes and passes on, is one `T5RelativeBias` per stack
    (bidirectional in the encoder, causal in the decoder; 32 buckets,
    maximum distance 128) shared by the self-attention of every block of
    that stack: one table, trained once, saved once. The cross-attention
    has no bias. A final RMS norm per stack.

    Args:
        backbone: a built `keras_hub.models.T5Backbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.t5 import convert_t5
    >>> backbone = keras_hub.models.T5Backbone(
    ...     vocabulary_size=20, num_layers=2, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16)
    >>> model = convert_t5(backbone)
    >>> sorted(model.output)
    ['decoder_sequence_output', 'encoder_sequence_output']

    References:
        - Raffel et al., 2020, "Exploring the Limits of Transfer Learning
          with a Unified Text-to-Text Transformer" (T5).
        - Shazeer, 2020, "GLU Variants Improve Transformer" (T5 1.1's
          gated feed-forward).
    """
    config = {
        name: _common.config_value(backbone, name)
        for name in (
            "vocabulary_size",
            "num_layers",
            "num_heads",
            "hidden_dim",
            "intermediate_dim",
            "activation",
            "dropout",
            "use_gated_activation",
            "layer_norm_epsilon",
            "tie_embedding_weights",
        )
    }
    heads = config["num_heads"]
    head_dim = backbone.key_value_dim or config["hidden_dim"] // heads
    gated = bool(config["use_gated_activation"])
    epsilon = config["layer_norm_epsilon"]
    dtype = backbone.dtype_policy
    inputs = _common.token_inputs(
        "encoder_token_ids",
        "encoder_padding_mask",
        "decoder_token_ids",
        "decoder_padding_mask",
    )
    embedding = keras.layers.ReversibleEmbedding(
        config["vocabulary_size"],
        config["hidden_dim"],
        tie_weights=config["tie_embedding_weights"],
        dtype=dtype,
        name="token_embedding",
    )
    attention = dict(
        num_heads=heads,
        key_dim=head_dim,
        dropout=config["dropout"],
        use_bias=False,
        attention_scale=1.0,
        dtype=dtype,
    )
    block_options = dict(
        dropout=config["dropout"],
        norm_first=True,
        layer_norm_epsilon=epsilon,
        normalization="rms_norm",
        dtype=dtype,
    )

    biases = {
        stack: T5RelativeBias(
            num_buckets=NUM_BUCKETS,
            max_distance=MAX_DISTANCE,
            bidirectional=stack == "encoder",
            num_heads=heads,
            dtype=dtype,
            name=f"{stack}_relative_bias",
        )
        for stack in ("encoder", "decoder")
    }
    blocks = {"encoder": [], "decoder": []}
    x = embedding(inputs["encoder_token_ids"])
    for i in range(config["num_layers"]):
        block = _common.encoder_block(
            f"transformer_encoder_layer_{i}",
            _common.self_attention(
                causal=False, score_mod=biases["encoder"], **attention
            ),
            _feed_forward(config, dtype),
            **block_options,
        )
        x = block(x, padding_mask=inputs["encoder_padding_mask"])
        blocks["encoder"].append(block)
    encoder_output = keras.layers.RMSNormalization(
        epsilon=epsilon, dtype=dtype, name="encoder_output_layer_norm"
    )(x)
    x = embedding(inputs["decoder_token_ids"])
    for i in range(config["num_layers"]):
        block = _common.decoder_block(
            f"transformer_decoder_layer_{i}",
            _common.self_attention(
                causal=True, score_mod=biases["decoder"], **attention
            ),
            _feed_forward(config, dtype),
            cross_attention=_common.cross_attention(**attention),
            **block_options,
        )
        x = block(
            x,
            encoder_output,
            padding_mask=inputs["decoder_padding_mask"],
            context_padding_mask=inputs["encoder_padding_mask"],
        )
        blocks["decoder"].append(block)
    decoder_output = keras.layers.RMSNormalization(
        epsilon=epsilon, dtype=dtype, name="decoder_output_layer_norm"
    )(x)
    model = keras.Model(
        inputs=inputs,
        outputs={
            "encoder_sequence_output": encoder_output,
            "decoder_sequence_output": decoder_output,
        },
        name=backbone.name,
    )

    pairs = _weight_pairs(
        backbone, model, embedding, biases, blocks, (heads, head_dim), gated
    )
    _common.copy_pairs(backbone, model, pairs)
    return model
