"""keras-hub's `ESMBackbone` (also exported as `ESM2Backbone`: the same
class) rebuilt from `keras_attention` blocks."""

import keras

from keras_attention.interop import _common
from keras_attention.interop import roformer_v2
from keras_attention.layers.position_embedding import PositionEmbedding

# Their weight path prefix -> ours (`{i}`: the layer index). The
# attention's `Dense` projections become our `(hidden, heads, head_size)`
# (`roformer_v2.projection_transform`); the other weights have the same
# names and shapes on both sides.
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    ("position_embedding", "position_embedding"),
    ("emb_layer_norm", "emb_layer_norm"),
    ("output_layer_norm", "output_layer_norm"),
    *(
        (f"transformer_layer_{{i}}/attention_layer/{theirs}", ours)
        for theirs, ours in (
            ("q_dense_layer", "transformer_layer_{i}/self_attention/query"),
            ("k_dense_layer", "transformer_layer_{i}/self_attention/key"),
            ("v_dense_layer", "transformer_layer_{i}/self_attention/value"),
            (
                "o_dense_layer",
                "transformer_layer_{i}/self_attention/attention_output",
            ),
        )
    ),
    (
        "transformer_layer_{i}/attention_norm",
        "transformer_layer_{i}/self_attention_norm",
    ),
    (
        "transformer_layer_{i}/feedforward_intermediate_dense",
        "transformer_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "transformer_layer_{i}/feedforward_output_dense",
        "transformer_layer_{i}/feed_forward/output_dense",
    ),
    (
        "transformer_layer_{i}/ffn_norm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
)

CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "max_wavelength",
    "layer_norm_eps",
    "position_embedding_type",
    "max_sequence_length",
)


def convert_esm(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `ESMBackbone` (`ESM2Backbone` is the same class), holding a copy of
    its weights.

    Input `token_ids` (int `(batch, T)`), as the backbone's: the padding
    mask is `token_ids != pad_token_id`, as keras-hub reads it. Output the
    hidden states `(batch, T, hidden)` after the final layer norm. A token
    embedding, with ESM-1's learned positions
    (`position_embedding_type="absolute"`: a `PositionEmbedding` read from
    row `pad_token_id` on, as keras-hub reads it) or ESM-2's rotary ones
    (`"rotary"`: the self-attention's `rotary_max_wavelength`), the layer
    norm of `use_pre_layer_norm`, then pre-norm `TransformerEncoderBlock`s
    (layer norms of `layer_norm_eps`), each of a `SelfAttention` with the
    backbone's `use_bias` and a `FeedForward` of its `activation`, and the
    final layer norm.

    Padding: our attention masks padded keys. keras-hub 0.32's
    `EsmSelfAttention` masks padded *queries* instead on TensorFlow and
    JAX (its real tokens attend to the padding; on PyTorch it masks the
    keys), so the outputs are equal on every backend for inputs without
    padding (`pad_token_id`), and with padding on PyTorch only.

    Args:
        backbone: a built `keras_hub.models.ESMBackbone`.

    Returns:
        The converted `keras.Model`.

    Raises:
        ValueError: an `activation` without a Keras name.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.esm import convert_esm
    >>> backbone = keras_hub.models.ESM2Backbone(
    ...     vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
    ...     intermediate_dim=16)
    >>> convert_esm(backbone).get_layer(
    ...     "transformer_layer_0").self_attention.rotary_max_wavelength
    10000

    References:
        - Rives et al., 2021, "Biological structure and function emerge
          from scaling unsupervised learning to 250 million protein
          sequences" (ESM-1b).
        - Lin et al., 2023, "Evolutionary-scale prediction of atomic-level
          protein structure with a language model" (ESM-2).
    """
    config = {name: _common.config_value(backbone, name) for name in CONFIG}
    get = backbone.get_config()
    use_bias = bool(get.get("use_bias", True))
    dropout = float(get.get("dropout", 0.0))
    pad_token_id = int(get.get("pad_token_id", 0))
    rotary = config["position_embedding_type"] == "rotary"
    activation = roformer_v2.activation_name(backbone, backbone.activation)
    epsilon = float(config["layer_norm_eps"])
    dtype = backbone.dtype_policy
    heads, hidden = config["num_heads"], config["hidden_dim"]
    inputs = _common.token_inputs("token_ids")
    token_ids = inputs["token_ids"]
    padding_mask = roformer_v2.token_padding_mask(token_ids, pad_token_id)
    x = keras.layers.Embedding(
        config["vocabulary_size"], hidden, dtype=dtype, name="token_embedding"
    )(token_ids)
    if not rotary:
        positions = PositionEmbedding(
            config["max_sequence_length"],
            dtype=dtype,
            name="position_embedding",
        )(x, start_index=pad_token_id)
        x = keras.layers.Add(dtype=dtype, name="embeddings_add")([x, positions])
    if get.get("use_pre_layer_norm", False):
        x = keras.layers.LayerNormalization(
            epsilon=epsilon, dtype=dtype, name="emb_layer_norm"
        )(x)
    for i in range(config["num_layers"]):
        x = _common.encoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads,
                hidden // heads,
                causal=False,
                use_bias=use_bias,
                rotary_max_wavelength=(
                    config["max_wavelength"] if rotary else None
                ),
                dtype=dtype,
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"],
                activation=activation,
                use_bias=use_bias,
                dtype=dtype,
            ),
            dropout=dropout,
            norm_first=True,
            layer_norm_epsilon=epsilon,
            dtype=dtype,
        )(x, padding_mask=padding_mask)
    x = keras.layers.LayerNormalization(
        epsilon=epsilon, dtype=dtype, name="output_layer_norm"
    )(x)
    model = keras.Model(inputs=inputs, outputs=x, name=backbone.name)
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    _common.copy_weights(
        backbone,
        model,
        prefixes,
        roformer_v2.projection_transform(heads, hidden // heads),
    )
    return model
