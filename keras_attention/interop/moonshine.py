"""keras-hub's `MoonshineBackbone` rebuilt from `keras_attention` blocks."""

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.layers.convolution_padding_mask import (
    ConvolutionPaddingMask,
)
from keras_attention.layers.rotary_embedding import check_rotary_fraction
from keras_attention.layers.rotary_embedding import inverse_frequencies

# Moonshine's audio frontend: unpadded convolutions of these kernels and
# strides (fixed in keras-hub), then layer norms of epsilon 1e-5.
KERNEL_SIZES, STRIDES = (127, 7, 3), (64, 3, 2)
LAYER_NORM_EPSILON = 1e-5

# Their weight (attribute of the backbone, or of its `encoder_blocks[i]`
# / `decoder_blocks[i]`) -> ours. keras-hub names the decoder blocks'
# sublayers automatically (`layer_normalization_1`, ...), so the table
# maps attributes. On the way: the rotated query and key features of the
# self-attention are reordered (Moonshine rotates interleaved pairs
# `(2k, 2k + 1)` of the first `rotary_dim` features, ours the halves `(k,
# k + rotary_dim / 2)`: the same scores); a SwiGLU `dense_1` is split into
# its linear half (our `intermediate_dense`) and its gate (our
# `gate_dense`); our blocks' layer norms have a bias where Moonshine's
# have none: it holds zeros (see `convert_moonshine`).
WEIGHT_TABLE = (
    ("conv1, group_norm, conv2, conv3", "the same (Keras layers)"),
    ("token_embedding", "token_embedding"),
    ("encoder_rotary_embedding.inv_freq", "recomputed (checked)"),
    ("decoder_rotary_embedding.inv_freq", "recomputed (checked)"),
    (
        "encoder_blocks[i].self_attention_layer",
        "encoder_block_{i}/self_attention (rotated features reordered)",
    ),
    (
        "encoder_blocks[i].self_attention_layer_norm",
        "encoder_block_{i}/self_attention_norm (+ zero beta)",
    ),
    (
        "encoder_blocks[i].feedforward_layer_norm",
        "encoder_block_{i}/feed_forward_norm (+ zero beta)",
    ),
    ("encoder_blocks[i].feedforward", "encoder_block_{i}/feed_forward"),
    (
        "decoder_blocks[i].self_attention",
        "decoder_block_{i}/self_attention (rotated features reordered)",
    ),
    ("decoder_blocks[i].cross_attention", "decoder_block_{i}/cross_attention"),
    ("decoder_blocks[i].norm1", "decoder_block_{i}/self_attention_norm"),
    ("decoder_blocks[i].norm2", "decoder_block_{i}/cross_attention_norm"),
    ("decoder_blocks[i].norm3", "decoder_block_{i}/feed_forward_norm"),
    ("decoder_blocks[i].ff", "decoder_block_{i}/feed_forward"),
    ("encoder_final_layer_norm", "encoder_final_layer_norm"),
    ("decoder_post_norm", "decoder_post_norm"),
)

_PROJECTIONS = (
    ("_query_dense", "query_dense"),
    ("_key_dense", "key_dense"),
    ("_value_dense", "value_dense"),
    ("_output_dense", "output_dense"),
)


def _config(backbone):
    """The backbone's config, with each stack's head size."""
    config = backbone.get_config()
    if config["filter_dim"] != config["hidden_dim"]:
        raise ValueError(
            "Moonshine's frontend must give `hidden_dim` features "
            "(`filter_dim == hidden_dim`, as keras-hub's blocks need). "
            f"Received: filter_dim={config['filter_dim']!r}, "
            f"hidden_dim={config['hidden_dim']!r}"
        )
    multiple = config["pad_head_dim_to_multiple_of"]
    for stack in ("encoder", "decoder"):
        size = config["hidden_dim"] // config[f"{stack}_num_heads"]
        if multiple:
            size = -(-size // multiple) * multiple
        config[f"{stack}_head_dim"] = size
    return config


def _rotary_order(head_dim, fraction):
    """Our feature order of a head: Moonshine's interleaved rotated pairs
    `(2k, 2k + 1)` as our halves, the other features as they are."""
    _, rotated = check_rotary_fraction(fraction, 1.0, head_dim)
    return np.concatenate(
        [
            np.arange(0, rotated, 2),
            np.arange(1, rotated, 2),
            np.arange(rotated, head_dim),
        ]
    )


def _attention_pairs(theirs, ours, order=None):
    """`(their variable, our variable, value)` of an attention layer; the
    query and key features in `order` when given (rotary)."""
    pairs = []
    for their_name, our_name in _PROJECTIONS:
        their_dense = getattr(theirs, their_name)
        our_dense = getattr(ours, our_name)
        for kind in ("kernel", "bias"):
            weight = getattr(their_dense, kind, None)
            if weight is None:
                continue
            value = None
            if order is not None and our_name in ("query_dense", "key_dense"):
                value = _common.numpy_value(weight)[..., order]
            pairs.append((weight, getattr(our_dense, kind), value))
    return pairs


def _norm_pairs(theirs, ours):
    """A scale-only layer norm into one of our blocks' (whose bias holds
    zeros)."""
    zeros = np.zeros(tuple(ours.beta.shape), ours.beta.dtype)
    return [(theirs.gamma, ours.gamma, None), (theirs.gamma, ours.beta, zeros)]


def _feed_forward_pairs(theirs, ours, swiglu):
    """A `MoonshineMLP` into our `FeedForward` (SwiGLU: `dense_1` split)."""
    first, second = theirs.dense_1, theirs.dense_2
    pairs = [
        (second.kernel, ours.output_dense.kernel, None),
        (second.bias, ours.output_dense.bias, None),
    ]
    if not swiglu:
        return pairs + [
            (first.kernel, ours.intermediate_dense.kernel, None),
            (first.bias, ours.intermediate_dense.bias, None),
        ]
    kernel, bias = (
        _common.numpy_value(first.kernel),
        _common.numpy_value(first.bias),
    )
    half = kernel.shape[-1] // 2
    return pairs + [
        (first.kernel, ours.intermediate_dense.kernel, kernel[:, :half]),
        (first.kernel, ours.gate_dense.kernel, kernel[:, half:]),
        (first.bias, ours.intermediate_dense.bias, bias[:half]),
        (first.bias, ours.gate_dense.bias, bias[half:]),
    ]


def _inverse_frequencies(backbone, config):
    """keras-hub's stored RoPE inverse frequencies, checked against ours
    (`rope_theta` over the rotated features); returns their variables."""
    variables = []
    for stack in ("encoder", "decoder"):
        variable = getattr(backbone, f"{stack}_rotary_embedding").inv_freq
        _, rotated = check_rotary_fraction(
            config["partial_rotary_factor"], 1.0, config[f"{stack}_head_dim"]
        )
        expected = inverse_frequencies(rotated, config["rope_theta"])
        stored = _common.numpy_value(variable)
        if stored.shape != expected.shape or not np.allclose(
            stored, expected, rtol=1e-5
        ):
            raise ValueError(
                f"The {stack}'s stored RoPE inverse frequencies "
                f"(`inv_freq`) are not those of rope_theta="
                f"{config['rope_theta']!r} over {rotated} features. "
                f"Received: {stored!r}"
            )
        variables.append(variable)
    return variables


def _weight_pairs(backbone, model, config):
    """Every `(their variable, our variable, value)` of the conversion."""
    pairs = []
    for name in ("conv1", "group_norm", "conv2", "conv3", "token_embedding"):
        theirs, ours = getattr(backbone, name), model.get_layer(name)
        pairs += [(t, o, None) for t, o in zip(theirs.weights, ours.weights)]
    for name in ("encoder_final_layer_norm", "decoder_post_norm"):
        pairs.append(
            (getattr(backbone, name).gamma, model.get_layer(name).gamma, None)
        )
    for stack in ("encoder", "decoder"):
        order = _rotary_order(
            config[f"{stack}_head_dim"], config["partial_rotary_factor"]
        )
        swiglu = config[f"{stack}_use_swiglu_activation"]
        for i, theirs in enumerate(getattr(backbone, f"{stack}_blocks")):
            ours = model.get_layer(f"{stack}_block_{i}")
            if stack == "encoder":
                attention, ff = theirs.self_attention_layer, theirs.feedforward
                norms = (
                    (theirs.self_attention_layer_norm, "self_attention_norm"),
                    (theirs.feedforward_layer_norm, "feed_forward_norm"),
                )
            else:
                attention, ff = theirs.self_attention, theirs.ff
                norms = (
                    (theirs.norm1, "self_attention_norm"),
                    (theirs.norm2, "cross_attention_norm"),
                    (theirs.norm3, "feed_forward_norm"),
                )
                pairs += _attention_pairs(
                    theirs.cross_attention, ours.cross_attention_layer
                )
            pairs += _attention_pairs(attention, ours.self_attention, order)
            pairs += _feed_forward_pairs(ff, ours.feed_forward, swiglu)
            for norm, name in norms:
                pairs += _norm_pairs(norm, getattr(ours, name))
    return pairs


def _frontend(values, config, dtype):
    """Moonshine's convolutions over the raw audio as Keras layers."""
    filters = config["filter_dim"]
    x = keras.layers.Conv1D(
        filters, 127, strides=64, use_bias=False, dtype=dtype, name="conv1"
    )(values)
    x = keras.layers.Activation("tanh", dtype=dtype, name="tanh_after_conv1")(x)
    x = keras.layers.GroupNormalization(
        groups=1, epsilon=1e-5, dtype=dtype, name="group_norm"
    )(x)
    x = keras.layers.Conv1D(
        2 * filters, 7, strides=3, dtype=dtype, name="conv2"
    )(x)
    x = keras.layers.Activation("gelu", dtype=dtype, name="gelu_after_conv2")(x)
    x = keras.layers.Conv1D(filters, 3, strides=2, dtype=dtype, name="conv3")(x)
    return keras.layers.Activation(
        "gelu", dtype=dtype, name="gelu_after_conv3"
    )(x)


def _layers(config, stack, dtype):
    """`(attention options, feed-forward factory)` of a stack."""
    attention = dict(
        num_heads=config[f"{stack}_num_heads"],
        key_dim=config[f"{stack}_head_dim"],
        use_bias=bool(config["attention_bias"]),
        dropout=config["attention_dropout"],
        dtype=dtype,
    )
    swiglu = config[f"{stack}_use_swiglu_activation"]
    width = int(config["hidden_dim"] * config["feedforward_expansion_factor"])

    def feed_forward():
        return _common.feed_forward(
            width,
            activation="silu" if swiglu else "gelu",
            gated=bool(swiglu),
            dtype=dtype,
        )

    return attention, feed_forward


def convert_moonshine(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `MoonshineBackbone`, holding a copy of its weights.

    Inputs `encoder_input_values` (float `(batch, samples, 1)`, raw 16 kHz
    audio), `encoder_padding_mask` (bool `(batch, samples)`, right
    padding), `decoder_token_ids` (int) and `decoder_padding_mask` (bool,
    `(batch, T)`); outputs `{"encoder_sequence_output",
    "decoder_sequence_output", "encoder_attention_mask"}`, as keras-hub's.
    The audio frontend is part of the backbone and stays Keras layers:
    `Conv1D(127, stride 64, no bias)`, tanh, `GroupNormalization(groups=1)`,
    `Conv1D(7, stride 3)`, GELU, `Conv1D(3, stride 2)`, GELU; the mask of
    its frames is a `ConvolutionPaddingMask` (keras-hub's
    `compute_output_lengths`). Pre-norm `TransformerEncoderBlock`s and
    `TransformerDecoderBlock`s (with a `CrossAttention`, no rotary
    positions) with layer norms of epsilon 1e-5, self-attention with
    rotary positions of wavelength `rope_theta` on the first
    `partial_rotary_factor` of each head (`rotary_fraction`; Moonshine's
    interleaved pairs by reordering the query and key features),
    `use_bias=attention_bias`, heads of `hidden_dim // num_heads` (padded
    to `pad_head_dim_to_multiple_of`); a `FeedForward` of `hidden_dim *
    feedforward_expansion_factor` with biases, SwiGLU (`gated=True`,
    `silu`) or the exact GELU as each stack's `use_swiglu_activation`. The
    token table (`ReversibleEmbedding`) gives the logits. Final layer
    norms without bias (`center=False`), as Moonshine's.

    Moonshine's layer norms have no bias; our blocks' have one, which holds
    zeros: equal outputs, but fine-tuning would train it (one vector per
    block norm more than keras-hub's weights). keras-hub's stored RoPE
    inverse frequencies are checked against `rope_theta`, not copied.

    Args:
        backbone: a built `keras_hub.models.MoonshineBackbone`.

    Returns:
        The converted `keras.Model`.

    Raises:
        ValueError: when `filter_dim != hidden_dim`, or the stored RoPE
            frequencies are not those of `rope_theta`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.moonshine import convert_moonshine
    >>> backbone = keras_hub.models.MoonshineBackbone(
    ...     vocabulary_size=20, filter_dim=8, encoder_num_layers=1,
    ...     decoder_num_layers=1, hidden_dim=8, intermediate_dim=16,
    ...     encoder_num_heads=2, decoder_num_heads=2)
    >>> outputs = convert_moonshine(backbone).output
    >>> sorted(outputs)[1]
    'encoder_attention_mask'

    References:
        - Jeffries et al., 2024, "Moonshine: Speech Recognition for Live
          Transcription and Voice Commands".
    """
    config = _config(backbone)
    dtype = backbone.dtype_policy
    inputs = {
        "encoder_input_values": keras.Input(
            (None, 1),
            dtype=backbone.input["encoder_input_values"].dtype,
            name="encoder_input_values",
        ),
        "encoder_padding_mask": keras.Input(
            (None,), dtype="bool", name="encoder_padding_mask"
        ),
        "decoder_token_ids": keras.Input(
            (None,), dtype="int32", name="decoder_token_ids"
        ),
        "decoder_padding_mask": keras.Input(
            (None,), dtype="bool", name="decoder_padding_mask"
        ),
    }
    x = _frontend(inputs["encoder_input_values"], config, dtype)
    frames = ConvolutionPaddingMask(
        KERNEL_SIZES, STRIDES, name="compute_attention_mask"
    )(x, padding_mask=inputs["encoder_padding_mask"])
    rotary = dict(
        rotary_max_wavelength=config["rope_theta"],
        rotary_fraction=config["partial_rotary_factor"],
    )
    block_options = dict(
        norm_first=True, layer_norm_epsilon=LAYER_NORM_EPSILON, dtype=dtype
    )
    x = keras.layers.Dropout(
        config["dropout"], dtype=dtype, name="encoder_dropout"
    )(x)
    attention, feed_forward = _layers(config, "encoder", dtype)
    for i in range(config["encoder_num_layers"]):
        x = _common.encoder_block(
            f"encoder_block_{i}",
            _common.self_attention(causal=False, **attention, **rotary),
            feed_forward(),
            **block_options,
        )(x, padding_mask=frames)
    encoder_output = keras.layers.LayerNormalization(
        epsilon=LAYER_NORM_EPSILON,
        center=False,
        dtype=dtype,
        name="encoder_final_layer_norm",
    )(x)
    x = keras.layers.ReversibleEmbedding(
        config["vocabulary_size"],
        config["hidden_dim"],
        dtype=dtype,
        name="token_embedding",
    )(inputs["decoder_token_ids"])
    x = keras.layers.Dropout(
        config["dropout"], dtype=dtype, name="decoder_dropout"
    )(x)
    attention, feed_forward = _layers(config, "decoder", dtype)
    for i in range(config["decoder_num_layers"]):
        x = _common.decoder_block(
            f"decoder_block_{i}",
            _common.self_attention(causal=True, **attention, **rotary),
            feed_forward(),
            cross_attention=_common.cross_attention(**attention),
            **block_options,
        )(
            x,
            encoder_output,
            padding_mask=inputs["decoder_padding_mask"],
            context_padding_mask=frames,
        )
    decoder_output = keras.layers.LayerNormalization(
        epsilon=LAYER_NORM_EPSILON,
        center=False,
        dtype=dtype,
        name="decoder_post_norm",
    )(x)
    model = keras.Model(
        inputs=inputs,
        outputs={
            "encoder_sequence_output": encoder_output,
            "decoder_sequence_output": decoder_output,
            "encoder_attention_mask": frames,
        },
        name=backbone.name,
    )
    _common.copy_pairs(
        backbone,
        model,
        _weight_pairs(backbone, model, config),
        recomputed=_inverse_frequencies(backbone, config),
    )
    return model
