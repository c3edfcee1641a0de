"""keras-hub's `GemmaBackbone` (Gemma 1 and 2) rebuilt from
`keras_attention` blocks."""

import math

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.layers.activations import gelu_approximate
from keras_attention.mods.masks import KerasSlidingWindowMask
from keras_attention.scores.soft_cap import SoftCap

# Gemma's rotary embeddings (fixed in keras-hub's `GemmaAttention`).
ROPE_MAX_WAVELENGTH = 10000.0

# Their weight path prefix -> ours (`{i}`: the layer index). Two weights
# change on the way (`transform_weight`): the query/key/value kernels are
# `(heads, hidden, head_dim)` in keras-hub and `(hidden, heads, head_dim)`
# here, and Gemma's RMS norms scale by `1 + scale` where Keras's
# `RMSNormalization` scales by `scale`.
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    ("decoder_block_{i}/attention", "decoder_block_{i}/self_attention"),
    (
        "decoder_block_{i}/pre_attention_norm",
        "decoder_block_{i}/self_attention_norm",
    ),
    (
        "decoder_block_{i}/ffw_gating",
        "decoder_block_{i}/feed_forward/gate_dense",
    ),
    (
        "decoder_block_{i}/ffw_gating_2",
        "decoder_block_{i}/feed_forward/intermediate_dense",
    ),
    (
        "decoder_block_{i}/ffw_linear",
        "decoder_block_{i}/feed_forward/output_dense",
    ),
    ("decoder_block_{i}/pre_ffw_norm", "decoder_block_{i}/feed_forward_norm"),
    (
        "decoder_block_{i}/post_attention_norm",
        "decoder_block_{i}/self_attention_post_norm",
    ),
    (
        "decoder_block_{i}/post_ffw_norm",
        "decoder_block_{i}/feed_forward_post_norm",
    ),
    ("final_normalization", "final_normalization"),
)


def transform_weight(path, value):
    """A Gemma weight as our layers hold it: q/k/v kernels transposed to
    `(hidden, heads, head_dim)`, RMS norm scales `1 + scale`."""
    if path.split("/")[-1] == "scale":
        return value + np.asarray(1, value.dtype)
    return transpose_qkv(path, value)


def transpose_qkv(path, value):
    """A keras-hub Gemma query/key/value kernel `(heads, hidden,
    head_dim)` as ours, `(hidden, heads, head_dim)`; any other weight as
    it is (Gemma 1 to 4)."""
    parts = path.split("/")
    if (
        len(parts) >= 3
        and parts[-3] == "attention"
        and parts[-2] in ("query", "key", "value")
    ):
        return np.transpose(value, (1, 0, 2))
    return value


def _attention_scale(backbone, i, config):
    """Layer `i`'s query scaling as the self-attention's `attention_scale`: None
    (`head_dim ** -0.5`, our default), or `(hidden_dim // num_query_heads)
    ** -0.5` where its attention has `query_head_dim_normalize=False`.

    Read from the attention layer, which is what keras-hub computes with:
    keras-hub 0.32's `GemmaDecoderBlock` builds its attention with
    `query_head_dim_normalize=True` whatever the backbone's config says."""
    layers = getattr(backbone, "transformer_layers", None)
    attention = getattr(layers[i], "attention", None) if layers else None
    if getattr(attention, "query_head_dim_normalize", True):
        return None
    return (config["hidden_dim"] // config["num_query_heads"]) ** -0.5


def convert_gemma(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `GemmaBackbone` (Gemma 1 and 2), holding a copy of its weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`); output the sequence
    output `(batch, T, hidden)`. The tied token embedding scaled by
    `sqrt(hidden_dim)`; pre-norm decoder blocks with `normalization="rms_norm"`,
    `use_bias=False`, grouped-query attention with `key_dim=head_dim`, rotary
    positions (wavelength 10000) and a GeGLU feed-forward
    (`FeedForward(gated=True)`, `gelu_approximate`, `intermediate_dim // 2` as
    keras-hub's); a final RMS norm. Gemma 2's options:
    `attention_logit_soft_cap` is the self-attention's `score_mod=SoftCap`, the
    alternating sliding windows (`use_sliding_window_attention`: layers 0, 2, 4,
    ...) a `mask_mod=KerasSlidingWindowMask(sliding_window_size)`, the
    post-attention and post-feed-forward norms the blocks' `sandwich_norm=True`,
    and `final_logit_soft_cap` the token embedding's `logit_soft_cap` (its
    reverse projection, the logits), and the query scaling by `(hidden_dim //
    num_query_heads) ** -0.5` instead of `head_dim ** -0.5`
    (`query_head_dim_normalize=False` in a layer's attention, Gemma 2 27B) the
    self-attention's `attention_scale`.

    Args:
        backbone: a built `keras_hub.models.GemmaBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.gemma import convert_gemma
    >>> backbone = keras_hub.models.GemmaBackbone(
    ...     vocabulary_size=20, num_layers=1, num_query_heads=4,
    ...     num_key_value_heads=2, hidden_dim=16, intermediate_dim=32,
    ...     head_dim=4)
    >>> convert_gemma(backbone).output.shape
    (None, None, 16)

    References:
        - Gemma Team, 2024, "Gemma: Open Models Based on Gemini Research
          and Technology".
        - Gemma Team, 2024, "Gemma 2: Improving Open Language Models at a
          Practical Size".
    """
    get = backbone.get_config()
    sandwich = sandwich_norm(get)
    soft_cap = get.get("attention_logit_soft_cap")
    window = None
    if get.get("use_sliding_window_attention"):
        window = int(get["sliding_window_size"])
    config = gemma_config(backbone)
    config["intermediate_dim"] //= 2  # GeGLU halves (`gate_dim_reduction`)

    def layer_attention(i):
        kwargs = dict(
            rotary_max_wavelength=ROPE_MAX_WAVELENGTH,
            attention_scale=_attention_scale(backbone, i, config),
        )
        if soft_cap is not None:
            kwargs["score_mod"] = SoftCap(soft_cap)
        if window is not None and i % 2 == 0:
            kwargs["mask_mod"] = KerasSlidingWindowMask(window)
        return kwargs

    return build_gemma_style(
        backbone, config, layer_attention, sandwich_norm=sandwich
    )


def sandwich_norm(get):
    """The blocks' `sandwich_norm` from a Gemma config `get`: its post-
    attention and post-feed-forward norms, both or neither."""
    post_norms = (
        bool(get.get("use_post_attention_norm")),
        bool(get.get("use_post_ffw_norm")),
    )
    if post_norms[0] != post_norms[1]:
        raise ValueError(
            "`use_post_attention_norm` and `use_post_ffw_norm` must be "
            "both True or both False (the blocks' `sandwich_norm`). "
            f"Received: use_post_attention_norm={post_norms[0]!r}, "
            f"use_post_ffw_norm={post_norms[1]!r}"
        )
    return post_norms[0]


def gemma_config(backbone):
    """The config entries of a Gemma backbone that every layer shares."""
    config = {
        name: _common.config_value(backbone, name)
        for name in (
            "vocabulary_size",
            "num_layers",
            "num_query_heads",
            "num_key_value_heads",
            "hidden_dim",
            "intermediate_dim",
            "head_dim",
            "layer_norm_epsilon",
        )
    }
    get = backbone.get_config()
    config["dropout"] = get.get("dropout", 0.0)
    config["final_logit_soft_cap"] = get.get("final_logit_soft_cap")
    return config


def build_gemma_style(
    backbone, config, layer_attention, sandwich_norm=False, table=WEIGHT_TABLE
):
    """`gemma_style_model` of a keras-hub backbone (its dtype policy and
    name), the backbone's weights copied in by `table` with
    `transform_weight`.

    Args:
        backbone: the keras-hub backbone.
        config: `gemma_config(backbone)` (with the feed-forward's width).
        layer_attention: `layer_attention(i)` -> the self-attention
            arguments of layer `i` (rotary positions, windows, soft-caps,
            QK-norms, query scaling).
        sandwich_norm: bool, the blocks' post-attention and
            post-feed-forward norms (Gemma 2 and 3).
        table: the weight table (theirs -> ours).

    Returns:
        The converted `keras.Model`.
    """
    model = gemma_style_model(
        config,
        backbone.dtype_policy,
        backbone.name,
        layer_attention,
        sandwich_norm=sandwich_norm,
    )
    prefixes = _common.layer_prefixes(table, config["num_layers"])
    _common.copy_weights(backbone, model, prefixes, transform_weight)
    return model


def gemma_style_model(
    config, dtype, name, layer_attention, sandwich_norm=False
):
    """The Gemma-style model, of its config alone (the builder that the
    keras-hub converters and `from_huggingface` share): the tied token
    embedding scaled by `sqrt(hidden_dim)`, pre-norm decoder blocks (RMS
    norms) named `decoder_block_{i}`, composed of a causal
    `SelfAttention` (grouped-query with `key_dim=head_dim`) and a gated
    `FeedForward` of `config["intermediate_dim"]` (GeGLU unless
    `activation`), a final RMS norm `final_normalization`. Its weights
    are the layers' initial ones: the caller fills them.

    Args:
        config: dict with `vocabulary_size`, `num_layers`,
            `num_query_heads`, `num_key_value_heads`, `hidden_dim`,
            `intermediate_dim`, `head_dim`, `layer_norm_epsilon`,
            `dropout`, `final_logit_soft_cap` (None: none), and
            optionally `activation` (default the tanh-approximate GELU)
            and `attention_bias` (default False).
        dtype: the layers' dtype policy (or its name).
        name: the model's name.
        layer_attention: `layer_attention(i)` -> the self-attention
            arguments of layer `i` (rotary positions, windows, soft-caps,
            QK-norms, query scaling).
        sandwich_norm: bool, the blocks' post-attention and
            post-feed-forward norms (Gemma 2 and 3).

    Returns:
        A `keras.Model` with inputs `token_ids`, `padding_mask` and the
        final norm's output.
    """
    inputs = _common.token_inputs("token_ids", "padding_mask")
    x = scaled_token_embedding(config, dtype, inputs["token_ids"])
    for i in range(config["num_layers"]):
        attention = _common.self_attention(
            config["num_query_heads"],
            config["head_dim"],
            causal=True,
            num_key_value_heads=config["num_key_value_heads"],
            dropout=config["dropout"],
            use_bias=config.get("attention_bias", False),
            dtype=dtype,
            **layer_attention(i),
        )
        feed_forward = _common.feed_forward(
            config["intermediate_dim"],
            activation=config.get("activation", gelu_approximate),
            dropout=config["dropout"],
            use_bias=False,
            gated=True,
            dtype=dtype,
        )
        x = _common.decoder_block(
            f"decoder_block_{i}",
            attention,
            feed_forward,
            dropout=config["dropout"],
            norm_first=True,
            layer_norm_epsilon=config["layer_norm_epsilon"],
            normalization="rms_norm",
            sandwich_norm=sandwich_norm,
            dtype=dtype,
        )(x, padding_mask=inputs["padding_mask"])
    return final_norm_model(config, dtype, name, inputs, x)


def scaled_token_embedding(config, dtype, token_ids):
    """Gemma's tied token embedding of `token_ids` (`token_embedding`,
    its reverse projection soft-capped by `config["final_logit_soft_cap"]`)
    scaled by `sqrt(hidden_dim)` (`embedding_scale`); Gemma 1 to 4."""
    x = keras.layers.ReversibleEmbedding(
        config["vocabulary_size"],
        config["hidden_dim"],
        logit_soft_cap=config["final_logit_soft_cap"],
        dtype=dtype,
        name="token_embedding",
    )(token_ids)
    return keras.layers.Rescaling(
        math.sqrt(config["hidden_dim"]), dtype=dtype, name="embedding_scale"
    )(x)


def final_norm_model(config, dtype, name, inputs, x):
    """The `keras.Model` `name` of `inputs` and the final RMS norm
    (`final_normalization`) of the last block's output `x`; Gemma 1 to
    4."""
    x = keras.layers.RMSNormalization(
        epsilon=config["layer_norm_epsilon"],
        dtype=dtype,
        name="final_normalization",
    )(x)
    return keras.Model(inputs=inputs, outputs=x, name=name)
