"""keras-hub's `DINOV2Backbone` rebuilt from `keras_attention` blocks."""

import keras
import numpy as np

from keras_attention.interop import _common
from keras_attention.interop import _vision

# Their weight path prefix (after the backbone's name prefix, if any) ->
# ours; `{i}` is the layer index (both from 0). `weights_in` of the SwiGLU
# feed-forward is split in two (`split_swiglu`).
WEIGHT_TABLE = (
    ("embeddings/cls_token", "class_token/embeddings"),
    ("embeddings/register_tokens", "register_tokens/embeddings"),
    (
        "embeddings/interpolated_position_embeddings",
        "position_embedding/embeddings",
    ),
    ("embeddings/patch_embeddings/projection", "patch_embedding"),
    ("encoder/layers_{i}/norm1", "transformer_layer_{i}/self_attention_norm"),
    (
        "encoder/layers_{i}/attention/attention",
        "transformer_layer_{i}/self_attention",
    ),
    (
        "encoder/layers_{i}/layer_scale1/lambda1",
        "transformer_layer_{i}/self_attention/layer_scale",
    ),
    ("encoder/layers_{i}/norm2", "transformer_layer_{i}/feed_forward_norm"),
    (
        "encoder/layers_{i}/mlp/fc1",
        "transformer_layer_{i}/feed_forward/intermediate_dense",
    ),
    (
        "encoder/layers_{i}/mlp/fc2",
        "transformer_layer_{i}/feed_forward/output_dense",
    ),
    (
        "encoder/layers_{i}/mlp/weights_out",
        "transformer_layer_{i}/feed_forward/output_dense",
    ),
    (
        "encoder/layers_{i}/layer_scale2/lambda1",
        "transformer_layer_{i}/feed_forward/layer_scale",
    ),
    ("layernorm", "layer_norm"),
)

# Their weights with no place in the converted model: the mask token
# (used only by DINOv2's masked pretraining, never by the backbone's
# forward pass) and the position table of `position_embedding_shape`,
# whose interpolation to the image size (`interpolated_position_
# embeddings`, what the forward pass adds) is copied instead.
UNUSED = ("embeddings/mask_token", "embeddings/position_embeddings")


def _name_prefix(backbone):
    """The prefix keras-hub puts before its layer names (`"<name>_"` for a
    backbone built with a `name`), read from the class token's path."""
    for weight in backbone.weights:
        if weight.path.endswith("embeddings/cls_token"):
            return weight.path[: -len("embeddings/cls_token")]
    raise ValueError(
        f"{type(backbone).__name__} has no `embeddings/cls_token` weight; "
        f"this keras-hub version is not supported. Received: "
        f"backbone={backbone.name!r}"
    )


def _check(backbone):
    _vision.check_options(
        backbone, {"data_format": "channels_last", "drop_path_rate": 0.0}
    )


def _block(i, config, dtype):
    hidden, heads = config["hidden_dim"], config["num_heads"]
    scale = config["layer_scale_init_value"]
    scale = scale if scale > 0 else 1.0  # only the initial value
    intermediate = config["intermediate_dim"]
    if config["use_swiglu_ffn"]:  # keras-hub's width for SwiGLU
        intermediate = (int(intermediate * 2 / 3) + 7) // 8 * 8
    return _common.encoder_block(
        f"transformer_layer_{i}",
        self_attention=_common.self_attention(
            heads,
            hidden // heads,
            causal=False,
            dropout=config["dropout_rate"],
            layer_scale=scale,
            dtype=dtype,
        ),
        feed_forward=_common.feed_forward(
            intermediate,
            activation="silu" if config["use_swiglu_ffn"] else "gelu",
            gated=config["use_swiglu_ffn"],
            layer_scale=scale,
            dtype=dtype,
        ),
        dropout=config["dropout_rate"],
        norm_first=True,
        layer_norm_epsilon=1e-6,
        dtype=dtype,
    )


def _pairs(backbone, model, num_layers):
    """`(their weight, our weight, value)` for `_common.copy_pairs`, and
    their weights left out (`UNUSED`)."""
    prefix = _name_prefix(backbone)
    prefixes = {
        prefix + theirs: ours
        for theirs, ours in _common.layer_prefixes(
            WEIGHT_TABLE, num_layers
        ).items()
    }
    ours = {w.path: w for w in model.weights}
    pairs, unused = [], []
    for weight in backbone.weights:
        local = weight.path[len(prefix) :]
        if local in UNUSED:
            unused.append(weight)
            continue
        value = _common.numpy_value(weight)
        if local.startswith("embeddings/") and value.ndim == 3:
            value = np.reshape(value, value.shape[1:])  # tables (n, d)
        if "/mlp/weights_in/" in weight.path:
            block = "transformer_layer_" + local.split("/")[1][len("layers_") :]
            name = weight.path.rsplit("/", 1)[1]
            gate, linear = np.split(value, 2, axis=-1)
            for dense, part in (
                ("gate_dense", gate),
                ("intermediate_dense", linear),
            ):
                target = ours.get(f"{block}/feed_forward/{dense}/{name}")
                if target is not None:
                    pairs.append((weight, target, part))
            continue
        target = ours.get(_common.our_path(weight.path, prefixes))
        if target is not None:
            pairs.append((weight, target, value))
    return pairs, unused


def convert_dinov2(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `DINOV2Backbone` (channels-last images), holding a copy of its
    weights.

    Input `images` `(batch, H, W, C)` (a dict `{"images": ...}`, as the
    backbone's); output `(batch, 1 + registers + patches, hidden)` as the
    backbone's: the class token plus its position, the register tokens
    (no position), then the patches (a `Conv2D` of stride `patch_size`)
    plus theirs; then pre-norm `TransformerEncoderBlock`s, each a
    `SelfAttention` and a `FeedForward` (exact GELU, or SwiGLU with
    `use_swiglu_ffn`), both with DINOv2's layer scale (`layer_scale`),
    and a final layer norm (epsilon 1e-6).

    The image size is fixed: the position table is the backbone's
    `interpolated_position_embeddings`, the positions its forward pass
    adds at `image_shape` (interpolated from `position_embedding_shape`),
    copied as they are. keras-hub recomputes that table from the stored
    one when it reloads a backbone (so a backbone whose interpolated
    table was trained reloads different); the converted model stores the
    table it uses, and reloads equal.

    Args:
        backbone: a built `keras_hub.models.DINOV2Backbone`,
            channels-last, with `drop_path_rate=0` (stochastic depth is
            not converted); otherwise `ValueError` naming the option.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.dinov2 import convert_dinov2
    >>> backbone = keras_hub.models.DINOV2Backbone(
    ...     patch_size=4, num_layers=1, hidden_dim=8, num_heads=2,
    ...     intermediate_dim=16, image_shape=(8, 8, 3),
    ...     position_embedding_shape=(8, 8, 3), num_register_tokens=2)
    >>> convert_dinov2(backbone).output.shape
    (None, 7, 8)

    References:
        - Oquab et al., 2024, "DINOv2: Learning Robust Visual Features
          without Supervision".
        - Darcet et al., 2024, "Vision Transformers Need Registers".
    """
    _check(backbone)
    config = {
        name: _common.config_value(backbone, name)
        for name in (
            "image_shape",
            "patch_size",
            "num_layers",
            "num_heads",
            "hidden_dim",
            "intermediate_dim",
            "layer_scale_init_value",
            "num_register_tokens",
            "use_swiglu_ffn",
            "dropout_rate",
        )
    }
    hidden, dtype = config["hidden_dim"], backbone.dtype_policy
    images = _vision.image_input(config["image_shape"])
    patches = _vision.patch_embedding(
        images, hidden, config["patch_size"], True, dtype
    )
    token = _vision.learned_tokens(images, 1, hidden, dtype, "class_token")
    x = keras.layers.Concatenate(axis=1, dtype=dtype)([token, patches])
    x = _vision.add_positions(x, dtype)
    if config["num_register_tokens"]:
        registers = _vision.learned_tokens(
            images,
            config["num_register_tokens"],
            hidden,
            dtype,
            "register_tokens",
        )
        x = keras.layers.Concatenate(axis=1, dtype=dtype)(
            [x[:, :1], registers, x[:, 1:]]
        )
    x = keras.layers.Dropout(config["dropout_rate"], dtype=dtype)(x)
    for i in range(config["num_layers"]):
        x = _block(i, config, dtype)(x)
    x = keras.layers.LayerNormalization(
        epsilon=1e-6, dtype=dtype, name="layer_norm"
    )(x)
    model = keras.Model(
        inputs={"images": images}, outputs=x, name=backbone.name
    )
    pairs, unused = _pairs(backbone, model, config["num_layers"])
    _common.copy_pairs(backbone, model, pairs, recomputed=unused)
    return model
