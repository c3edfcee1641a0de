"""keras-hub's `T5GemmaBackbone` rebuilt from `keras_attention` blocks."""

import math

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.layers.activations import gelu_approximate
from keras_attention.scores.soft_cap import SoftCap

# Their weight path prefix -> ours (`{i}`: the layer index, `{stack}`:
# `encoder` or `decoder`; keras-hub names the decoder's norms
# `decoder_pre_...`). The final norms have automatic names in keras-hub
# (`rms_normalization`, `rms_normalization_1`): they are matched by
# attribute (`backbone.encoder_norm`, `backbone.decoder_norm`). Gemma's RMS
# norms scale by `1 + scale`, Keras's by `scale`: the scales are copied
# plus one. The projections' kernels have our layout.
WEIGHT_TABLE = (
    ("encoder_token_embedding", "encoder_token_embedding"),
    ("decoder_token_embedding", "decoder_token_embedding"),
    ("{stack}_layer_{i}/self_attention", "{stack}_layer_{i}/self_attention"),
    ("decoder_layer_{i}/cross_attention", "decoder_layer_{i}/cross_attention"),
    (
        "{stack}_layer_{i}/mlp/gate_proj",
        "{stack}_layer_{i}/feed_forward/gate_dense",
    ),
    (
        "{stack}_layer_{i}/mlp/up_proj",
        "{stack}_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "{stack}_layer_{i}/mlp/down_proj",
        "{stack}_layer_{i}/feed_forward/output_dense",
    ),
    (
        "encoder_layer_{i}/pre_self_attention_layernorm",
        "encoder_layer_{i}/self_attention_norm",
    ),
    (
        "encoder_layer_{i}/post_self_attention_layernorm",
        "encoder_layer_{i}/self_attention_post_norm",
    ),
    (
        "encoder_layer_{i}/pre_feedforward_layernorm",
        "encoder_layer_{i}/feed_forward_norm",
    ),
    (
        "encoder_layer_{i}/post_feedforward_layernorm",
        "encoder_layer_{i}/feed_forward_post_norm",
    ),
    (
        "decoder_layer_{i}/decoder_pre_self_attention_layernorm",
        "decoder_layer_{i}/self_attention_norm",
    ),
    (
        "decoder_layer_{i}/decoder_post_self_attention_layernorm",
        "decoder_layer_{i}/self_attention_post_norm",
    ),
    (
        "decoder_layer_{i}/decoder_pre_cross_attention_layernorm",
        "decoder_layer_{i}/cross_attention_norm",
    ),
    (
        "decoder_layer_{i}/decoder_post_cross_attention_layernorm",
        "decoder_layer_{i}/cross_attention_post_norm",
    ),
    (
        "decoder_layer_{i}/decoder_pre_feedforward_layernorm",
        "decoder_layer_{i}/feed_forward_norm",
    ),
    (
        "decoder_layer_{i}/decoder_post_feedforward_layernorm",
        "decoder_layer_{i}/feed_forward_post_norm",
    ),
    ("encoder_norm (attribute)", "encoder_norm"),
    ("decoder_norm (attribute)", "decoder_norm"),
)

LAYER_TYPES = ("full_attention", "sliding_attention")


def _config(backbone):
    """The backbone's config, its layer types checked."""
    config = backbone.get_config()
    for stack in ("encoder", "decoder"):
        types = config[f"{stack}_layer_types"]
        unknown = [t for t in types if t not in LAYER_TYPES]
        if unknown or len(types) != config[f"{stack}_num_layers"]:
            raise ValueError(
                f"`{stack}_layer_types` must give one of {LAYER_TYPES!r} per "
                f"layer ({config[f'{stack}_num_layers']!r}). Received: "
                f"{stack}_layer_types={types!r}"
            )
    return config


def _weight_pairs(backbone, model, num_layers):
    """`(their variable, our variable, value)` of every weight: by the
    table's prefixes, the final norms by attribute; norm scales plus
    one."""
    prefixes = _common.stack_prefixes(WEIGHT_TABLE[:-2], max(num_layers))
    ours = {w.path: w for w in model.weights}
    final = {
        id(backbone.encoder_norm.scale): model.get_layer("encoder_norm").scale,
        id(backbone.decoder_norm.scale): model.get_layer("decoder_norm").scale,
    }
    pairs = []
    for weight in backbone.weights:
        target = final.get(id(weight))
        if target is None:
            target = ours.get(_common.our_path(weight.path, prefixes))
        if target is None:
            continue  # reported by `copy_pairs` as without a place
        value = None
        if weight.path.endswith("/scale"):
            value = _common.numpy_value(weight) + np.asarray(1, weight.dtype)
        pairs.append((weight, target, value))
    return pairs


def _activation(name):
    """keras-hub's `hidden_activation` as our feed-forward's."""
    if name == "gelu_approximate":
        return gelu_approximate
    return keras.activations.get(name)


def _stack(inputs, config, stack, dtype, context=None):
    """One stack: the scaled token embedding, its blocks, its final norm
    and dropout. `context`: the encoder's output (the decoder's)."""
    hidden = config[f"{stack}_hidden_dim"]
    dropout = config["dropout_rate"]
    ids = inputs[f"{stack}_token_ids"]
    if stack == "encoder":
        embedding = keras.layers.Embedding(
            config["vocabulary_size"],
            hidden,
            dtype=dtype,
            name="encoder_token_embedding",
        )
    else:
        embedding = keras.layers.ReversibleEmbedding(
            config["vocabulary_size"],
            hidden,
            tie_weights=config["tie_word_embeddings"],
            logit_soft_cap=config["final_logit_softcapping"],
            dtype=dtype,
            name="decoder_token_embedding",
        )
    x = embedding(ids)
    x = keras.layers.Rescaling(
        math.sqrt(hidden), dtype=dtype, name=f"{stack}_embedding_scale"
    )(x)
    x = keras.layers.Dropout(
        dropout, dtype=dtype, name=f"{stack}_embedding_dropout"
    )(x)
    attention = dict(
        num_heads=config[f"{stack}_num_attention_heads"],
        key_dim=config[f"{stack}_head_dim"],
        num_key_value_heads=config[f"{stack}_num_key_value_heads"],
        use_bias=bool(config["attention_bias"]),
        dropout=config["attention_dropout"],
        attention_scale=config["query_pre_attn_scalar"] ** -0.5,
        dtype=dtype,
    )
    if config["attn_logit_softcapping"] is not None:
        attention["score_mod"] = SoftCap(config["attn_logit_softcapping"])
    block_options = dict(
        dropout=dropout,
        norm_first=True,
        normalization="rms_norm",
        layer_norm_epsilon=config["rms_norm_eps"],
        sandwich_norm=True,
        dtype=dtype,
    )
    padding = inputs[f"{stack}_padding_mask"]
    for i, kind in enumerate(config[f"{stack}_layer_types"]):
        feed_forward = _common.feed_forward(
            config[f"{stack}_intermediate_dim"],
            activation=_activation(config["hidden_activation"]),
            dropout=dropout,
            use_bias=False,
            gated=True,
            dtype=dtype,
        )
        rotary = config["rope_max_wavelength"]
        if stack == "encoder":  # keras-hub's encoder layers: no window
            x = _common.encoder_block(
                f"encoder_layer_{i}",
                _common.self_attention(
                    causal=False, rotary_max_wavelength=rotary, **attention
                ),
                feed_forward,
                **block_options,
            )(x, padding_mask=padding)
            continue
        window = (
            config["sliding_window"] if kind == "sliding_attention" else None
        )
        x = _common.decoder_block(
            f"decoder_layer_{i}",
            _common.self_attention(
                causal=True,
                window_size=window,
                rotary_max_wavelength=rotary,
                **attention,
            ),
            feed_forward,
            cross_attention=_common.cross_attention(**attention),
            **block_options,
        )(
            x,
            context,
            padding_mask=padding,
            context_padding_mask=inputs["encoder_padding_mask"],
        )
    x = keras.layers.RMSNormalization(
        epsilon=config["rms_norm_eps"], dtype=dtype, name=f"{stack}_norm"
    )(x)
    return keras.layers.Dropout(dropout, dtype=dtype, name=f"{stack}_dropout")(
        x
    )


def convert_t5gemma(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `T5GemmaBackbone`, holding a copy of its weights.

    Inputs `encoder_token_ids`, `encoder_padding_mask`,
    `decoder_token_ids`, `decoder_padding_mask` (int `(batch, T)`);
    outputs `{"encoder_sequence_output", "decoder_sequence_output"}`. Each
    stack: its token table (the encoder's an `Embedding`, the decoder's a
    `ReversibleEmbedding`, tied or not, whose `logit_soft_cap` is
    `final_logit_softcapping`) scaled by `sqrt(hidden_dim)` (a
    `Rescaling`), Gemma 2's blocks (pre- and post-norms: RMS norms with
    `sandwich_norm=True`), a final RMS norm. The attention: grouped-query,
    `key_dim=head_dim`, rotary positions of `rope_max_wavelength` in the
    self-attention, `attention_scale=query_pre_attn_scalar ** -0.5`,
    `score_mod=SoftCap(attn_logit_softcapping)`, `use_bias` as
    `attention_bias`; the decoder's `"sliding_attention"` layers a banded
    `LocalSelfAttention` of `window_size=sliding_window` (keras-hub lets a
    query see the `sliding_window` keys before it); the encoder's layers
    attend to every key whatever their type, as keras-hub's. A
    `CrossAttention` (no rotary positions) in each decoder block; a GeGLU
    `FeedForward` (`gated=True`, `hidden_activation`) without biases.

    Args:
        backbone: a built `keras_hub.models.T5GemmaBackbone`.

    Returns:
        The converted `keras.Model`.

    Raises:
        ValueError: for a `*_layer_types` entry other than
            `"full_attention"` and `"sliding_attention"`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.t5gemma import convert_t5gemma
    >>> stack = dict(hidden_dim=8, intermediate_dim=16, num_layers=1,
    ...     num_attention_heads=2, num_key_value_heads=1, head_dim=4,
    ...     layer_types=["full_attention"])
    >>> backbone = keras_hub.models.T5GemmaBackbone(vocabulary_size=20,
    ...     **{f"{s}_{k}": v for s in ("encoder", "decoder")
    ...        for k, v in stack.items()})
    >>> sorted(convert_t5gemma(backbone).output)
    ['decoder_sequence_output', 'encoder_sequence_output']

    References:
        - Zhang et al., 2025, "Encoder-Decoder Gemma: Improving the
          Quality-Efficiency Trade-Off via Adaptation" (T5Gemma).
    """
    config = _config(backbone)
    dtype = backbone.dtype_policy
    inputs = _common.token_inputs(
        "encoder_token_ids",
        "encoder_padding_mask",
        "decoder_token_ids",
        "decoder_padding_mask",
    )
    encoder_output = _stack(inputs, config, "encoder", dtype)
    decoder_output = _stack(inputs, config, "decoder", dtype, encoder_output)
    model = keras.Model(
        inputs=inputs,
        outputs={
            "encoder_sequence_output": encoder_output,
            "decoder_sequence_output": decoder_output,
        },
        name=backbone.name,
    )
    num_layers = (config["encoder_num_layers"], config["decoder_num_layers"])
    _common.copy_pairs(
        backbone, model, _weight_pairs(backbone, model, num_layers)
    )
    return model
