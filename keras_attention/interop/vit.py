"""keras-hub's `ViTBackbone` rebuilt from `keras_attention` blocks."""

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.layers.position_embedding import PositionEmbedding

_PATCHING = "vit_patching_and_embedding"


def weight_prefixes(num_layers):
    """Their weight path prefix -> ours. keras-hub numbers its encoder
    layers from 1 (`transformer_block_1`); the class token `(1, 1, d)` is
    the one row `(1, d)` of an `Embedding` here (`transform_weight`)."""
    prefixes = {
        f"{_PATCHING}/class_token": "class_token/embeddings",
        f"{_PATCHING}/patch_embedding": "patch_embedding",
        f"{_PATCHING}/position_embedding": "position_embedding",
        "vit_encoder/ln": "layer_norm",
    }
    for i in range(num_layers):
        theirs = f"vit_encoder/transformer_block_{i + 1}"
        ours = f"transformer_layer_{i}"
        prefixes.update(
            {
                f"{theirs}/ln_1": f"{ours}/self_attention_norm",
                f"{theirs}/mha": f"{ours}/self_attention",
                f"{theirs}/ln_2": f"{ours}/feed_forward_norm",
                f"{theirs}/mlp/dense_1": f"{ours}/feed_forward/"
                "intermediate_dense",
                f"{theirs}/mlp/dense_2": f"{ours}/feed_forward/output_dense",
            }
        )
    return prefixes


def transform_weight(path, value):
    """The class token `(1, 1, d)` as an embedding table `(1, d)`."""
    if path.endswith("/class_token"):
        return np.reshape(value, value.shape[1:])
    return value


def convert_vit(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `ViTBackbone` (channels-last images), holding a copy of its weights.

    Input `images` `(batch, H, W, C)`; output `(batch, 1 + patches,
    hidden)` as the backbone's. The patches are a `Conv2D` of stride
    `patch_size`, flattened; the class token is the one row of an
    `Embedding` (named `class_token`) put first; learned positions are a
    `PositionEmbedding`; then pre-norm `TransformerEncoderBlock`s with the
    exact GELU (`activation="gelu"`) and a final layer norm.

    Args:
        backbone: a built `keras_hub.models.ViTBackbone` with
            `use_class_token=True`, channels-last, and the same
            `use_mha_bias` and `use_mlp_bias` (the blocks have one
            `use_bias`); otherwise `ValueError` naming the option.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.vit import convert_vit
    >>> backbone = keras_hub.models.ViTBackbone(
    ...     image_shape=(8, 8, 3), patch_size=4, num_layers=1, num_heads=2,
    ...     hidden_dim=8, mlp_dim=16)
    >>> convert_vit(backbone).output.shape
    (None, 5, 8)

    References:
        - Dosovitskiy et al., 2021, "An Image is Worth 16x16 Words:
          Transformers for Image Recognition at Scale".
    """
    get = backbone.get_config()
    for name, converted in (
        ("use_class_token", True),
        ("data_format", "channels_last"),
    ):
        if get.get(name, converted) != converted:
            raise ValueError(
                f"{type(backbone).__name__} with `{name}` other than "
                f"{converted!r} is not supported yet. Received: "
                f"{name}={get[name]!r}"
            )
    if get.get("use_mha_bias", True) != get.get("use_mlp_bias", True):
        raise ValueError(
            "`use_mha_bias` and `use_mlp_bias` must be equal (not converted "
            f"yet). Received: use_mha_bias={get['use_mha_bias']!r}, "
            f"use_mlp_bias={get['use_mlp_bias']!r}"
        )
    config = {
        name: _common.config_value(backbone, name)
        for name in (
            "image_shape",
            "patch_size",
            "num_layers",
            "num_heads",
            "hidden_dim",
            "mlp_dim",
            "layer_norm_epsilon",
        )
    }
    height, width, channels = config["image_shape"]
    patch = tuple(config["patch_size"])
    hidden, dtype = config["hidden_dim"], backbone.dtype_policy
    positions = (height // patch[0]) * (width // patch[1]) + 1
    images = keras.Input(shape=(height, width, channels), name="images")
    x = keras.layers.Conv2D(
        hidden,
        kernel_size=patch,
        strides=patch,
        padding="valid",
        use_bias=get.get("use_patch_bias", True),
        dtype=dtype,
        name="patch_embedding",
    )(images)
    x = keras.layers.Reshape((positions - 1, hidden), dtype=dtype)(x)
    zeros = keras.ops.zeros_like(images[:, :1, 0, 0], dtype="int32")
    token = keras.layers.Embedding(1, hidden, dtype=dtype, name="class_token")(
        zeros
    )
    x = keras.layers.Concatenate(axis=1, dtype=dtype)([token, x])
    position_embedding = PositionEmbedding(
        positions, dtype=dtype, name="position_embedding"
    )
    x = keras.layers.Add(dtype=dtype)([x, position_embedding(x)])
    x = keras.layers.Dropout(get.get("dropout_rate", 0.0), dtype=dtype)(x)
    dropout, use_bias = (
        get.get("dropout_rate", 0.0),
        get.get("use_mha_bias", True),
    )
    heads = config["num_heads"]
    for i in range(config["num_layers"]):
        x = _common.encoder_block(
            f"transformer_layer_{i}",
            self_attention=_common.self_attention(
                heads,
                hidden // heads,
                causal=False,
                dropout=dropout,
                use_bias=use_bias,
                dtype=dtype,
            ),
            feed_forward=_common.feed_forward(
                config["mlp_dim"],
                activation="gelu",
                dropout=dropout,
                use_bias=use_bias,
                dtype=dtype,
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
