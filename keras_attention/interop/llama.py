"""keras-hub's `LlamaBackbone` rebuilt from `keras_attention` blocks."""

from keras_attention.interop import _common

# Their weight path prefix -> ours (`{i}`: the layer index); the weights
# under each prefix have the same names and shapes on both sides (the
# attention projections have no biases; `query` is `(hidden, heads,
# head_dim)`, `key`/`value` `(hidden, kv_heads, head_dim)`).
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    (
        "transformer_layer_{i}/self_attention",
        "transformer_layer_{i}/self_attention",
    ),
    (
        "transformer_layer_{i}/self_attention_layernorm",
        "transformer_layer_{i}/self_attention_norm",
    ),
    (
        "transformer_layer_{i}/feedforward_intermediate_dense",
        "transformer_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "transformer_layer_{i}/feedforward_gate_dense",
        "transformer_layer_{i}/feed_forward/gate_dense",
    ),
    (
        "transformer_layer_{i}/feedforward_output_dense",
        "transformer_layer_{i}/feed_forward/output_dense",
    ),
    (
        "transformer_layer_{i}/feedforward_layernorm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
    ("sequence_output_layernorm", "sequence_output_layernorm"),
)


# The config entries every Llama-style backbone has (`llama_style_config`).
LLAMA_STYLE_CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_query_heads",
    "num_key_value_heads",
    "hidden_dim",
    "intermediate_dim",
    "rope_max_wavelength",
    "layer_norm_epsilon",
)


def llama_style_config(backbone, tie_word_embeddings=False):
    """The `config` of `build_llama_style` for a Llama-style keras-hub
    backbone: `LLAMA_STYLE_CONFIG` (each required), its `dropout` (0 when
    absent) and `tie_word_embeddings`."""
    config = {
        name: _common.config_value(backbone, name)
        for name in LLAMA_STYLE_CONFIG
    }
    config["dropout"] = backbone.get_config().get("dropout", 0.0)
    config["tie_word_embeddings"] = bool(tie_word_embeddings)
    return config


def linear_rotary_scaling(factor):
    """The self-attention's `rotary_scaling` for keras-hub's
    `rope_scaling_factor` (position interpolation: the frequencies divided by
    it), or None when it is unset or 1."""
    if factor is None or float(factor) == 1.0:
        return None
    return {"scaling_factor": float(factor)}


# Llama 3.1's RoPE arguments: all set, or none.
LLAMA3_ROPE_ARGUMENTS = (
    "rope_frequency_adjustment_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_pretraining_sequence_length",
)


def llama_rotary_scaling(backbone):
    """The self-attention's `rotary_scaling` equal to a keras-hub Llama
    backbone's rotary embedding (`LlamaRotaryEmbedding`), or None.

    Llama 3.1's frequency adjustment (`rope_frequency_adjustment_factor`,
    `rope_low_freq_factor`, `rope_high_freq_factor`,
    `rope_pretraining_sequence_length`) is `rope_type="llama3"`. keras-hub's
    `rope_position_scaling_factor` has no effect on its Llama models
    (`LlamaRotaryEmbedding` computes the frequencies without it), so it is
    not carried over either: the converted model stays equal.

    Args:
        backbone: a keras-hub `LlamaBackbone` (or `Llama3Backbone`).

    Returns:
        A dict for the self-attention's `rotary_scaling`, or None.

    Raises:
        ValueError: only some of Llama 3.1's arguments are set (naming
            them).

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.llama import llama_rotary_scaling
    >>> backbone = keras_hub.models.Llama3Backbone(
    ...     vocabulary_size=20, num_layers=1, num_query_heads=2,
    ...     num_key_value_heads=1, hidden_dim=8, intermediate_dim=16,
    ...     rope_frequency_adjustment_factor=8.0, rope_low_freq_factor=1.0,
    ...     rope_high_freq_factor=4.0, rope_pretraining_sequence_length=8192)
    >>> llama_rotary_scaling(backbone)["rope_type"]
    'llama3'
    """
    config = backbone.get_config()
    values = {name: config.get(name) for name in LLAMA3_ROPE_ARGUMENTS}
    if all(value is None for value in values.values()):
        return None
    if any(value is None for value in values.values()):
        raise ValueError(
            f"{type(backbone).__name__}: Llama 3.1's RoPE arguments "
            f"{LLAMA3_ROPE_ARGUMENTS} must be all set or all None. "
            f"Received: {values!r}"
        )
    return {
        "rope_type": "llama3",
        "scaling_factor": float(values["rope_frequency_adjustment_factor"]),
        "low_freq_factor": float(values["rope_low_freq_factor"]),
        "high_freq_factor": float(values["rope_high_freq_factor"]),
        "original_max_position_embeddings": int(
            values["rope_pretraining_sequence_length"]
        ),
    }


def build_llama_style(
    backbone,
    config,
    window_size=None,
    key_dim=None,
    rotary_scaling=None,
    qk_norm=None,
    table=WEIGHT_TABLE,
    qk_norm_epsilon=None,
    layer_attention=None,
    layer_feed_forward=None,
):
    """`llama_style_model` of a keras-hub backbone (its dtype policy and
    name), with the backbone's weights copied in by `table`.

    Args:
        backbone: the keras-hub backbone.
        config: `llama_style_model`'s `config`.
        window_size, key_dim, rotary_scaling, qk_norm, qk_norm_epsilon,
        layer_attention, layer_feed_forward: `llama_style_model`'s.
        table: the weight table (theirs -> ours); `WEIGHT_TABLE` unless
            the family names more weights; None: the caller copies the
            weights (SmolLM3, whose weight paths are not unique).

    Returns:
        The converted `keras.Model`.
    """
    model = llama_style_model(
        config,
        dtype=backbone.dtype_policy,
        name=backbone.name,
        window_size=window_size,
        key_dim=key_dim,
        rotary_scaling=rotary_scaling,
        qk_norm=qk_norm,
        qk_norm_epsilon=qk_norm_epsilon,
        layer_attention=layer_attention,
        layer_feed_forward=layer_feed_forward,
    )
    if table is not None:
        prefixes = _common.layer_prefixes(table, config["num_layers"])
        _common.copy_weights(backbone, model, prefixes)
    return model


def llama_style_model(
    config,
    dtype,
    name,
    window_size=None,
    key_dim=None,
    rotary_scaling=None,
    qk_norm=None,
    qk_norm_epsilon=None,
    layer_attention=None,
    layer_feed_forward=None,
    sandwich_norm=False,
):
    """The Llama-style model, of its config alone (the builder that the
    keras-hub converters and `from_huggingface` share): a token embedding
    (`ReversibleEmbedding`, tied or not), pre-norm
    `TransformerDecoderBlock`s with RMS norms named
    `transformer_layer_{i}`, each composed of a causal `SelfAttention`
    (grouped-query, rotary positions; `LocalSelfAttention` with a
    window) and a gated `FeedForward` (SwiGLU unless `activation`), then
    a final RMS norm `sequence_output_layernorm`. Its weights are the
    layers' initial ones: the caller fills them.

    Args:
        config: dict with `vocabulary_size`, `num_layers`,
            `num_query_heads`, `num_key_value_heads`, `hidden_dim`,
            `intermediate_dim`, `rope_max_wavelength`,
            `layer_norm_epsilon`, `dropout`, `tie_word_embeddings`, and
            optionally `attention_bias` (the self-attention's `use_bias`:
            biases on the four attention projections, or "qkv"; default
            False), `mlp_bias` (on the
            feed-forward's; default False), `activation` (the gate's;
            default "silu") and `rotary_fraction` (default 1.0).
        dtype: the layers' dtype policy (or its name).
        name: the model's name.
        window_size: optional int, the self-attention's causal
            `window_size` (position `i` sees `i - window_size .. i`).
        key_dim: optional int, the head size (default `hidden_dim //
            num_query_heads`).
        rotary_scaling: optional dict, the self-attention's
            `rotary_scaling` (RoPE context extension; None: none).
        qk_norm: optional, the self-attention's `qk_norm` (Qwen 3: "rms").
        qk_norm_epsilon: optional, the QK-norms' epsilon (None:
            `layer_norm_epsilon`).
        layer_attention: optional `layer_attention(i)` -> self-attention
            arguments of layer `i` overriding the shared ones (SmolLM3's
            layers without rotary positions: `rotary_max_wavelength=None`;
            gpt-oss's windows, sinks and biases; Qwen 2's windowed
            layers).
        layer_feed_forward: optional `layer_feed_forward(i)` -> the
            feed-forward layer of layer `i` (a `MixtureOfExperts`), or
            None for the gated `FeedForward`.
        sandwich_norm: the blocks' `sandwich_norm` (OLMo 2's `"post"`:
            the sublayers' outputs normalized, not their inputs).

    Returns:
        A `keras.Model` with inputs `token_ids`, `padding_mask` and the
        final norm's output.
    """
    attention = dict(
        num_heads=config["num_query_heads"],
        key_dim=key_dim or config["hidden_dim"] // config["num_query_heads"],
        causal=True,
        num_key_value_heads=config["num_key_value_heads"],
        dropout=config["dropout"],
        use_bias=config.get("attention_bias", False),
        rotary_max_wavelength=config["rope_max_wavelength"],
        rotary_scaling=rotary_scaling,
        window_size=window_size,
        dtype=dtype,
    )
    if config.get("rotary_fraction", 1.0) != 1.0:
        attention["rotary_fraction"] = config["rotary_fraction"]
    if qk_norm is not None:
        attention["qk_norm"] = qk_norm
        attention["qk_norm_epsilon"] = (
            qk_norm_epsilon or config["layer_norm_epsilon"]
        )

    def sublayers(i):
        own = layer_attention(i) if layer_attention else {}
        ff = layer_feed_forward(i) if layer_feed_forward else None
        if ff is None:
            ff = _common.feed_forward(
                config["intermediate_dim"],
                activation=config.get("activation", "silu"),
                dropout=config["dropout"],
                use_bias=bool(config.get("mlp_bias", False)),
                gated=True,
                dtype=dtype,
            )
        return _common.self_attention(**{**attention, **own}), ff

    return _common.rms_decoder_model(
        config["num_layers"],
        sublayers,
        vocabulary_size=config["vocabulary_size"],
        hidden_dim=config["hidden_dim"],
        tie_word_embeddings=config["tie_word_embeddings"],
        epsilon=config["layer_norm_epsilon"],
        dtype=dtype,
        name=name,
        dropout=config["dropout"],
        sandwich_norm=sandwich_norm,
    )


def convert_llama(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `LlamaBackbone` (and `Llama3Backbone`), holding a copy of its weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`); output the
    sequence output `(batch, T, hidden)`. Pre-norm decoder blocks with
    `normalization="rms_norm"`, composed of a causal `SelfAttention`
    without biases, grouped-query (`num_key_value_heads`), with rotary
    positions (`rotary_max_wavelength`), and a `FeedForward(gated=True)`
    without biases, with `activation="silu"` (SwiGLU). Llama
    3.1's RoPE frequency adjustment becomes the self-attention's
    `rotary_scaling={"rope_type": "llama3", ...}`
    (`llama_rotary_scaling`); `rope_position_scaling_factor`, which
    keras-hub's Llama rotary embedding ignores, is ignored too.

    Args:
        backbone: a built `keras_hub.models.LlamaBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.llama import convert_llama
    >>> backbone = keras_hub.models.LlamaBackbone(
    ...     vocabulary_size=20, num_layers=1, num_query_heads=4,
    ...     num_key_value_heads=2, hidden_dim=8, intermediate_dim=16)
    >>> convert_llama(backbone).output.shape
    (None, None, 8)

    References:
        - Touvron et al., 2023, "LLaMA: Open and Efficient Foundation
          Language Models".
    """
    config = llama_style_config(
        backbone, _common.config_value(backbone, "tie_word_embeddings")
    )
    config["dropout"] = _common.config_value(backbone, "dropout")
    return build_llama_style(
        backbone, config, rotary_scaling=llama_rotary_scaling(backbone)
    )
