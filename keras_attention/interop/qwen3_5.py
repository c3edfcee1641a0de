"""keras-hub's `Qwen3_5Backbone` (text) rebuilt from `keras_attention`
blocks: gated delta net layers and gated attention layers."""

import numpy as np

from keras_attention.interop import _common
from keras_attention.interop.llama import linear_rotary_scaling
from keras_attention.interop.qwen3 import attention_epsilon

# Their weight path prefix -> ours (`{i}`: the layer index). Under
# `linear_attn` (a `Qwen3_5GatedDeltaNet`) the weights have our
# `GatedDeltaNet`'s names and shapes; under `self_attention` the query
# kernel `(hidden, heads, 2 * head_dim)` holds each head's query and
# output gate side by side (`QUERY_AND_GATE`).
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    (
        "transformer_layer_{i}/linear_attn",
        "transformer_layer_{i}/self_attention",
    ),
    (
        "transformer_layer_{i}/self_attention",
        "transformer_layer_{i}/self_attention",
    ),
    (
        "transformer_layer_{i}/input_layernorm",
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
        "transformer_layer_{i}/post_attention_layernorm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
    ("sequence_output_layernorm", "sequence_output_layernorm"),
)

# keras-hub's `Qwen3_5LayerNorm`s scale by `1 + scale` (zero-centred);
# ours (Keras's `RMSNormalization`, the QK-norms) by `scale`. The gated
# delta net's output norm (`linear_attn/norm`) scales by `scale` on both
# sides.
ZERO_CENTRED = (
    "input_layernorm/scale",
    "post_attention_layernorm/scale",
    "sequence_output_layernorm/scale",
    "self_attention/query_norm/scale",
    "self_attention/key_norm/scale",
)

QUERY_AND_GATE = "self_attention/query/kernel"

# The backbone's arguments each kind of layer takes.
LAYER_TYPES = ("full_attention", "linear_attention")
GATED_DELTA_OPTIONS = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


def _check_text_only(backbone, get):
    """Refuses what does not convert: a vision encoder, layer types other
    than keras-hub's two, a partial rotary share that keras-hub rounds
    to an odd number of features."""
    if get.get("vision_encoder") is not None:
        raise ValueError(
            "Only Qwen 3.5's text decoder converts: the backbone must have "
            "no vision encoder (`vision_encoder=None`). Received: "
            f"vision_encoder={type(backbone.vision_encoder).__name__}"
        )
    unknown = sorted(set(get["layer_types"]) - set(LAYER_TYPES))
    if unknown:
        raise ValueError(
            f"`layer_types` must hold only {LAYER_TYPES!r}. Received: "
            f"layer_types={get['layer_types']!r}"
        )
    head_dim = int(get["head_dim"])
    rotary = int(head_dim * float(get["partial_rotary_factor"]))
    if rotary % 2 or rotary < 2:
        raise ValueError(
            "keras-hub rotates `int(head_dim * partial_rotary_factor)` "
            "features of each head, which must be even and at least 2. "
            f"Received: head_dim={head_dim!r}, partial_rotary_factor="
            f"{get['partial_rotary_factor']!r}"
        )


def _self_attention(config, dtype, i):
    """The self-attention of layer `i`: a `GatedDeltaNet`, or gated
    attention with QK-norm and partial rotary positions."""
    hidden_dim = int(config["hidden_dim"])
    if config["layer_types"][i] == "linear_attention":
        options = {name: int(config[name]) for name in GATED_DELTA_OPTIONS}
        return _common.gated_delta_net(
            hidden_dim,
            hidden_activation=config.get("hidden_activation", "silu"),
            layer_norm_epsilon=float(config["layer_norm_epsilon"]),
            dtype=dtype,
            **options,
        )
    window = config.get("sliding_window_size")
    return _common.self_attention(
        int(config["num_query_heads"]),
        int(config["head_dim"]),
        causal=True,
        window_size=None if not window else int(window) - 1,
        num_key_value_heads=int(config["num_key_value_heads"]),
        dropout=float(config.get("dropout", 0.0)),
        use_bias=False,
        use_gate=True,
        rotary_max_wavelength=config["rope_max_wavelength"],
        rotary_scaling=config.get("rotary_scaling"),
        rotary_fraction=float(config["partial_rotary_factor"]),
        qk_norm="rms",
        qk_norm_epsilon=float(config["qk_norm_epsilon"]),
        dtype=dtype,
    )


def qwen3_5_style_model(config, dtype, name, layer_feed_forward=None):
    """The Qwen 3.5 model of its config alone (the builder that the
    keras-hub converters `convert_qwen3_5`, `convert_qwen3_5_moe` and
    `from_huggingface`'s `qwen3_next` share): a token embedding
    (`ReversibleEmbedding`, tied or not), pre-norm
    `TransformerDecoderBlock`s with RMS norms named
    `transformer_layer_{i}`, whose self-attention is, as `layer_types`
    says, a `GatedDeltaNet` ("linear_attention") or gated attention
    ("full_attention": a `SelfAttention` with `use_gate=True`,
    grouped-query, QK-norm, partial rotary positions, causal, windowed
    with `sliding_window_size`), and whose feed-forward is a SwiGLU
    `FeedForward` without biases or `layer_feed_forward(i)`; then a final
    RMS norm `sequence_output_layernorm`. Its weights are the layers'
    initial ones: the caller fills them.

    Args:
        config: dict of keras-hub's `Qwen3_5Backbone` names:
            `vocabulary_size`, `num_layers`, `hidden_dim`,
            `intermediate_dim`, `layer_norm_epsilon`, `layer_types`, the
            `linear_*` sizes (`GATED_DELTA_OPTIONS`), `num_query_heads`,
            `num_key_value_heads`, `head_dim`, `rope_max_wavelength`,
            `partial_rotary_factor`; `qk_norm_epsilon` (the QK-norms');
            optionally `dropout`, `tie_word_embeddings`,
            `sliding_window_size`, `rotary_scaling` (the attention's
            `rotary_scaling` dict) and `hidden_activation` (the gated
            delta nets' activation after their convolution, "silu").
        dtype: the layers' dtype policy.
        name: the model's name.
        layer_feed_forward: optional `layer_feed_forward(i)` -> the
            feed-forward layer of layer `i` (a `MixtureOfExperts`), or
            None for the SwiGLU `FeedForward` of `intermediate_dim`.

    Returns:
        A `keras.Model` with inputs `token_ids`, `padding_mask` and the
        final norm's output.
    """
    dropout = float(config.get("dropout", 0.0))

    def sublayers(i):
        ff = layer_feed_forward(i) if layer_feed_forward else None
        if ff is None:
            ff = _common.feed_forward(
                int(config["intermediate_dim"]),
                activation="silu",
                dropout=dropout,
                use_bias=False,
                gated=True,
                dtype=dtype,
            )
        return _self_attention(config, dtype, i), ff

    return _common.rms_decoder_model(
        int(config["num_layers"]),
        sublayers,
        vocabulary_size=int(config["vocabulary_size"]),
        hidden_dim=int(config["hidden_dim"]),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        epsilon=float(config["layer_norm_epsilon"]),
        dtype=dtype,
        name=name,
        dropout=dropout,
    )


def hub_config(backbone, get):
    """`qwen3_5_style_model`'s `config` of a keras-hub Qwen 3.5 (or
    Qwen 3.5-MoE) backbone whose `get_config()` is `get`."""
    return dict(
        get,
        num_layers=int(_common.config_value(backbone, "num_layers")),
        hidden_dim=int(_common.config_value(backbone, "hidden_dim")),
        layer_norm_epsilon=float(
            _common.config_value(backbone, "layer_norm_epsilon")
        ),
        qk_norm_epsilon=attention_epsilon(
            backbone, {"layer_norm_epsilon": get["layer_norm_epsilon"]}
        ),
        rotary_scaling=linear_rotary_scaling(get.get("rope_scaling_factor")),
        hidden_activation="silu",  # keras-hub's, whatever its argument
    )


def _copy_weights(backbone, model, num_layers, head_dim):
    """Copies the backbone's weights into `model` by `WEIGHT_TABLE`: the
    query kernel split into our query and gate kernels, the zero-centred
    scales plus 1."""
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, num_layers)
    ours = {w.path: w for w in model.weights}
    pairs = []
    for weight in backbone.weights:
        path = _common.our_path(weight.path, prefixes)
        if path not in ours:
            continue  # reported by `copy_pairs` as without a place
        value = _common.numpy_value(weight)
        if weight.path.endswith(QUERY_AND_GATE):
            gate = path[: -len("query/kernel")] + "gate/kernel"
            pairs.append((weight, ours[path], value[..., :head_dim]))
            if gate in ours:
                pairs.append((weight, ours[gate], value[..., head_dim:]))
            continue
        if weight.path.endswith(ZERO_CENTRED):
            value = value + np.asarray(1.0, value.dtype)
        pairs.append((weight, ours[path], value))
    _common.copy_pairs(backbone, model, pairs)


def convert_qwen3_5(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `Qwen3_5Backbone` without vision encoder (text), holding a copy of
    its weights.

    Pre-norm `TransformerDecoderBlock`s with RMS norms and a SwiGLU
    `FeedForward` without biases, whose self-attention is of two kinds as
    the backbone's `layer_types` says: on `"linear_attention"` layers a
    `keras_attention.layers.GatedDeltaNet` (with the backbone's
    `linear_*` sizes, its convolution width and norm epsilon; keras-hub's
    `Qwen3_5GatedDeltaNet` weights as they are), on `"full_attention"`
    layers gated attention, a `SelfAttention` with `use_gate=True`
    (keras-hub's query kernel, each head's query then its gate, split
    into our `query` and `gate` kernels), grouped-query
    (`key_dim=head_dim`), QK-norm (`qk_norm="rms"`), partial rotary
    positions (`rotary_fraction=partial_rotary_factor`), its
    `rope_scaling_factor` as `rotary_scaling` and its window as a causal
    `LocalSelfAttention`'s `window_size = sliding_window_size - 1`
    (keras-hub 0.32 applies it
    only where Keras has no fused attention op, on TensorFlow); then the
    final norm. keras-hub's norms scale by `1 + scale` (zero-centred):
    the copied scales are `scale + 1`, except the gated delta net's
    output norm, which scales by `scale` on both sides.

    `mrope_section` (M-RoPE) is accepted: on text alone every position
    channel holds the token's position, and keras-hub's backbone passes
    no position ids, so its rotary positions are plain RoPE, as ours.
    A vision encoder is refused.

    Generation (`interop.causal_lm_generator`) differs from keras-hub's
    `Qwen3_5CausalLM.generate` on padded prompts: ours runs the gated
    delta rule and its convolution over each prompt's real tokens only,
    keras-hub's prefill runs them over the whole padded buffer (its
    tokens then differ from greedy decoding of its own forward pass).

    Args:
        backbone: a built `keras_hub.models.Qwen3_5Backbone` (text only).

    Returns:
        The converted `keras.Model`.

    Raises:
        ValueError: a vision encoder, unknown `layer_types`, or a partial
            rotary share that rotates an odd number of features.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.qwen3_5 import convert_qwen3_5
    >>> backbone = keras_hub.models.Qwen3_5Backbone(
    ...     vocabulary_size=20, num_layers=2, num_query_heads=2,
    ...     num_key_value_heads=1, head_dim=8, hidden_dim=8,
    ...     intermediate_dim=16, layer_types=["linear_attention",
    ...     "full_attention"], linear_num_key_heads=1,
    ...     linear_num_value_heads=2, linear_key_head_dim=4,
    ...     linear_value_head_dim=4)
    >>> model = convert_qwen3_5(backbone)
    >>> type(model.get_layer("transformer_layer_0").self_attention).__name__
    'GatedDeltaNet'
    >>> model.output.shape
    (None, None, 8)

    References:
        - Qwen Team, 2026, "Qwen3.5" (model release).
        - Yang, Kautz & Hatamizadeh, 2025, "Gated Delta Networks:
          Improving Mamba2 with Delta Rule".
        - Qiu et al., 2025, "Gated Attention for Large Language Models".
    """
    get = backbone.get_config()
    _check_text_only(backbone, get)
    config = hub_config(backbone, get)
    model = qwen3_5_style_model(config, backbone.dtype_policy, backbone.name)
    _copy_weights(backbone, model, config["num_layers"], int(get["head_dim"]))
    return model
