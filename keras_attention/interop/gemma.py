"""keras-hub's `GemmaBackbone` (Gemma 1) rebuilt from `keras_attention`
blocks."""

import math

import keras
import numpy as np

from keras_attention.blocks.transformer_decoder_block import (
    TransformerDecoderBlock,
)
from keras_attention.interop import _common
from keras_attention.layers.activations import gelu_approximate

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
    ("final_normalization", "final_normalization"),
)

# Gemma 2 options, not converted yet: (config key, its Gemma 1 value).
GEMMA_1 = (
    ("query_head_dim_normalize", True),
    ("use_post_ffw_norm", False),
    ("use_post_attention_norm", False),
    ("attention_logit_soft_cap", None),
    ("final_logit_soft_cap", None),
    ("use_sliding_window_attention", False),
)


def transform_weight(path, value):
    """A Gemma weight as our layers hold it: q/k/v kernels transposed to
    `(hidden, heads, head_dim)`, RMS norm scales `1 + scale`."""
    parts = path.split("/")
    if parts[-1] == "scale":
        return value + np.asarray(1, value.dtype)
    if (
        len(parts) >= 3
        and parts[-3] == "attention"
        and parts[-2] in ("query", "key", "value")
    ):
        return np.transpose(value, (1, 0, 2))
    return value


def convert_gemma(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `GemmaBackbone` (Gemma 1), holding a copy of its weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`); output the
    sequence output `(batch, T, hidden)`. The tied token embedding scaled
    by `sqrt(hidden_dim)`; pre-norm decoder blocks with
    `normalization="rms_norm"`, `use_bias=False`, grouped-query attention
    with `key_dim=head_dim`, rotary positions (wavelength 10000) and a
    GeGLU feed-forward (`gated_feed_forward=True`, `gelu_approximate`,
    `intermediate_dim // 2` as keras-hub's); a final RMS norm. Gemma 2's
    options (soft-capping, sliding windows, post-norms, query scaling by
    `hidden_dim // num_query_heads`) are not converted yet: `ValueError`
    naming the option.

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
    """
    get = backbone.get_config()
    for name, gemma_1 in GEMMA_1:
        if name in get and get[name] != gemma_1:
            raise ValueError(
                f"{type(backbone).__name__} with `{name}` other than "
                f"{gemma_1!r} (Gemma 2) is not supported yet. Received: "
                f"{name}={get[name]!r}"
            )
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
    dtype = backbone.dtype_policy
    inputs = _common.token_inputs("token_ids", "padding_mask")
    x = keras.layers.ReversibleEmbedding(
        config["vocabulary_size"],
        config["hidden_dim"],
        dtype=dtype,
        name="token_embedding",
    )(inputs["token_ids"])
    x = keras.layers.Rescaling(
        math.sqrt(config["hidden_dim"]), dtype=dtype, name="embedding_scale"
    )(x)
    for i in range(config["num_layers"]):
        x = TransformerDecoderBlock(
            num_heads=config["num_query_heads"],
            intermediate_dim=config["intermediate_dim"] // 2,
            cross_attention=False,
            key_dim=config["head_dim"],
            num_key_value_heads=config["num_key_value_heads"],
            dropout=get.get("dropout", 0.0),
            activation=gelu_approximate,
            norm_first=True,
            layer_norm_epsilon=config["layer_norm_epsilon"],
            rotary_max_wavelength=ROPE_MAX_WAVELENGTH,
            normalization="rms_norm",
            use_bias=False,
            gated_feed_forward=True,
            dtype=dtype,
            name=f"decoder_block_{i}",
        )(x, padding_mask=inputs["padding_mask"])
    x = keras.layers.RMSNormalization(
        epsilon=config["layer_norm_epsilon"],
        dtype=dtype,
        name="final_normalization",
    )(x)
    model = keras.Model(inputs=inputs, outputs=x, name=backbone.name)
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    _common.copy_weights(backbone, model, prefixes, transform_weight)
    return model
