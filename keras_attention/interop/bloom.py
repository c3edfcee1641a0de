"""keras-hub's `BloomBackbone` rebuilt from `keras_attention` blocks."""

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.layers.activations import gelu_approximate
from keras_attention.scores.alibi import ALiBi

# Their weight path prefix -> ours (`{i}`: the layer index). keras-hub's
# attention output is a `Dense` `(hidden, hidden)`; ours is `(heads,
# head_dim, hidden)`: `transform_weight` reshapes it.
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    ("embedding_layernorm", "embedding_layernorm"),
    (
        "transformer_layer_{i}/pre_attention_layernorm",
        "transformer_layer_{i}/self_attention_norm",
    ),
    (
        "transformer_layer_{i}/self_attention/query_dense",
        "transformer_layer_{i}/self_attention/query",
    ),
    (
        "transformer_layer_{i}/self_attention/key_dense",
        "transformer_layer_{i}/self_attention/key",
    ),
    (
        "transformer_layer_{i}/self_attention/value_dense",
        "transformer_layer_{i}/self_attention/value",
    ),
    (
        "transformer_layer_{i}/self_attention/output_dense",
        "transformer_layer_{i}/self_attention/attention_output",
    ),
    (
        "transformer_layer_{i}/post_attention_layernorm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
    (
        "transformer_layer_{i}/mlp_intermediate_dense",
        "transformer_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "transformer_layer_{i}/mlp_output_dense",
        "transformer_layer_{i}/feed_forward/output_dense",
    ),
    ("final_layernorm", "final_layernorm"),
)


def convert_bloom(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `BloomBackbone`, holding a copy of its weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`); output the
    sequence output `(batch, T, hidden)`. The tied token embedding and an
    embedding layer norm, then pre-norm `TransformerDecoderBlock`s with
    biases, `gelu_approximate` and ALiBi position biases
    (`score_mod=keras_attention.scores.ALiBi(num_heads)`, keras-hub's
    slopes; no position embeddings), then a final layer norm. keras-hub
    adds `slope * j` where ALiBi adds `-slope * (i - j)`: the same
    softmax (they differ by a constant per query row).

    Args:
        backbone: a built `keras_hub.models.BloomBackbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.bloom import convert_bloom
    >>> backbone = keras_hub.models.BloomBackbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=4, hidden_dim=16,
    ...     intermediate_dim=32)
    >>> convert_bloom(backbone).output.shape
    (None, None, 16)

    References:
        - BigScience Workshop, 2022, "BLOOM: A 176B-Parameter Open-Access
          Multilingual Language Model".
        - Press et al., 2022, "Train Short, Test Long: Attention with
          Linear Biases Enables Input Length Extrapolation".
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
            "layer_norm_epsilon",
        )
    }
    heads, hidden = config["num_heads"], config["hidden_dim"]
    dtype = backbone.dtype_policy
    inputs = _common.token_inputs("token_ids", "padding_mask")
    x = keras.layers.ReversibleEmbedding(
        config["vocabulary_size"], hidden, dtype=dtype, name="token_embedding"
    )(inputs["token_ids"])
    x = keras.layers.LayerNormalization(
        epsilon=config["layer_norm_epsilon"],
        dtype=dtype,
        name="embedding_layernorm",
    )(x)
    for i in range(config["num_layers"]):
        x = _common.decoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads,
                hidden // heads,
                causal=True,
                dropout=config["dropout"],
                score_mod=ALiBi(heads),
                dtype=dtype,
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"],
                activation=gelu_approximate,
                dropout=config["dropout"],
                dtype=dtype,
            ),
            dropout=config["dropout"],
            norm_first=True,
            layer_norm_epsilon=config["layer_norm_epsilon"],
            dtype=dtype,
        )(x, padding_mask=inputs["padding_mask"])
    x = keras.layers.LayerNormalization(
        epsilon=config["layer_norm_epsilon"],
        dtype=dtype,
        name="final_layernorm",
    )(x)
    model = keras.Model(inputs=inputs, outputs=x, name=backbone.name)

    def transform_weight(path, value):
        if path.endswith("self_attention/output_dense/kernel"):
            return np.reshape(value, (heads, hidden // heads, hidden))
        return value

    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    _common.copy_weights(backbone, model, prefixes, transform_weight)
    return model
