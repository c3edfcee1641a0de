"""keras-hub's `DeiTBackbone` rebuilt from `keras_attention` blocks."""

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.interop import _vision

_EMBEDDING, _ENCODER = "deit_patching_and_embedding", "deit_encoder"

# Their weight path prefix -> ours; `{n}` is keras-hub's layer number
# (from 1), `{i}` ours (from 0).
WEIGHT_TABLE = (
    (f"{_EMBEDDING}/class_token", "class_token/embeddings"),
    (f"{_EMBEDDING}/distillation_token", "distillation_token/embeddings"),
    (f"{_EMBEDDING}/position_embedding", "position_embedding/embeddings"),
    (f"{_EMBEDDING}/patch_embedding", "patch_embedding"),
    (f"{_ENCODER}/transformer_block_{{n}}/ln_1", "{i}/self_attention_norm"),
    (f"{_ENCODER}/transformer_block_{{n}}/mha", "{i}/self_attention"),
    (f"{_ENCODER}/transformer_block_{{n}}/ln_2", "{i}/feed_forward_norm"),
    (
        f"{_ENCODER}/transformer_block_{{n}}/mlp/dense",
        "{i}/feed_forward/intermediate_dense",
    ),
    (
        f"{_ENCODER}/transformer_block_{{n}}/output_layer/output",
        "{i}/feed_forward/output_dense",
    ),
    (f"{_ENCODER}/ln", "layer_norm"),
)


def weight_prefixes(num_layers):
    """`WEIGHT_TABLE` for layers `0 .. num_layers - 1`: `{their prefix:
    our prefix}` (our blocks are `transformer_layer_{i}`)."""
    out = {}
    for theirs, ours in WEIGHT_TABLE:
        if "{n}" not in theirs:
            out[theirs] = ours
            continue
        for i in range(num_layers):
            block = f"transformer_layer_{i}"
            out[theirs.format(n=i + 1)] = ours.format(i=block)
    return out


def transform_weight(path, value):
    """Their `(1, 1, d)` tokens and `(1, positions, d)` position table as
    embedding tables `(1, d)` and `(positions, d)`."""
    if path.startswith(f"{_EMBEDDING}/") and value.ndim == 3:
        return np.reshape(value, value.shape[1:])
    return value


def convert_deit(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `DeiTBackbone` (channels-last images), holding a copy of its weights.

    Input `images` `(batch, H, W, C)`; output `(batch, 2 + patches,
    hidden)` as the backbone's: the class token, the distillation token,
    then the patches (a `Conv2D` of stride `patch_size`, flattened), plus
    learned positions (a `PositionEmbedding`); then pre-norm
    `TransformerEncoderBlock`s, each a `SelfAttention` (biases as
    `use_mha_bias`) and a `FeedForward` with the exact GELU, and a final
    layer norm. Each token is the one row of an `Embedding` (named
    `class_token`, `distillation_token`).

    Args:
        backbone: a built `keras_hub.models.DeiTBackbone`, channels-last;
            otherwise `ValueError` naming `data_format`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.deit import convert_deit
    >>> backbone = keras_hub.models.DeiTBackbone(
    ...     image_shape=(8, 8, 3), patch_size=4, num_layers=1, num_heads=2,
    ...     hidden_dim=8, intermediate_dim=16)
    >>> convert_deit(backbone).output.shape
    (None, 6, 8)

    References:
        - Touvron et al., 2021, "Training data-efficient image transformers
          & distillation through attention".
    """
    _vision.check_options(backbone, {"data_format": "channels_last"})
    config = {
        name: _common.config_value(backbone, name)
        for name in (
            "image_shape",
            "patch_size",
            "num_layers",
            "num_heads",
            "hidden_dim",
            "intermediate_dim",
            "layer_norm_epsilon",
        )
    }
    get = backbone.get_config()
    dropout = get.get("dropout_rate", 0.0)
    hidden, dtype = config["hidden_dim"], backbone.dtype_policy
    images = _vision.image_input(config["image_shape"])
    patches = _vision.patch_embedding(
        images, hidden, config["patch_size"], True, dtype
    )
    tokens = [
        _vision.learned_tokens(images, 1, hidden, dtype, name)
        for name in ("class_token", "distillation_token")
    ]
    x = keras.layers.Concatenate(axis=1, dtype=dtype)([*tokens, patches])
    x = _vision.add_positions(x, dtype)
    x = keras.layers.Dropout(dropout, dtype=dtype)(x)
    heads = config["num_heads"]
    for i in range(config["num_layers"]):
        x = _common.encoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads,
                hidden // heads,
                causal=False,
                dropout=get.get("attention_dropout", 0.0),
                use_bias=get.get("use_mha_bias", True),
                dtype=dtype,
            ),
            feed_forward=_common.feed_forward(
                config["intermediate_dim"], activation="gelu", dtype=dtype
            ),
            dropout=dropout,
            norm_first=True,
            layer_norm_epsilon=config["layer_norm_epsilon"],
            dtype=dtype,
        )(x)
    x = keras.layers.LayerNormalization(
        epsilon=config["layer_norm_epsilon"], dtype=dtype, name="layer_norm"
    )(x)
    model = keras.Model(inputs=images, outputs=x, name=backbone.name)
    _common.copy_weights(
        backbone,
        model,
        weight_prefixes(config["num_layers"]),
        transform_weight,
    )
    return model
