"""What the converters of keras-hub's vision transformers share (private
to `interop`): the image input, the patch embedding, the learned tokens
put before the patches (class, distillation, register tokens) and the
learned positions, built from Keras layers and the library's
`PositionEmbedding`, named as the weight tables of `deit`, `dinov2`,
`clip` and `siglip` name them."""

import keras

from keras_attention.layers.position_embedding import PositionEmbedding


def check_options(backbone, expected):
    """`ValueError` naming the first option of `backbone` (an attribute,
    else its config) whose value is not the converted one (`expected`:
    name -> value)."""
    config = backbone.get_config()
    for name, converted in expected.items():
        value = getattr(backbone, name, config.get(name, converted))
        if isinstance(value, list):
            value = tuple(value)
        if value != converted:
            raise ValueError(
                f"{type(backbone).__name__} with `{name}` other than "
                f"{converted!r} is not supported yet. Received: "
                f"{name}={value!r}"
            )


def image_input(image_shape):
    """The channels-last image input `(batch, H, W, C)`, named `images`."""
    return keras.Input(shape=tuple(image_shape), name="images")


def patch_embedding(
    images, hidden_dim, patch_size, use_bias, dtype, name="patch_embedding"
):
    """The patches of `images` as `(batch, patches, hidden_dim)`: a
    `Conv2D` of stride `patch_size` (named `name`), flattened row by
    row."""
    patch = (patch_size,) * 2 if isinstance(patch_size, int) else patch_size
    x = keras.layers.Conv2D(
        hidden_dim,
        kernel_size=tuple(patch),
        strides=tuple(patch),
        padding="valid",
        use_bias=use_bias,
        dtype=dtype,
        name=name,
    )(images)
    patches = x.shape[1] * x.shape[2]
    return keras.layers.Reshape((patches, hidden_dim), dtype=dtype)(x)


def learned_tokens(images, count, hidden_dim, dtype, name):
    """`count` learned vectors `(batch, count, hidden_dim)`, the same for
    every image: the rows of an `Embedding(count, hidden_dim)` named
    `name`, looked up at `0 .. count - 1`."""
    column = keras.ops.ones_like(images[:, :1, 0, 0], dtype="int32")
    ids = keras.ops.cumsum(keras.ops.repeat(column, count, axis=1), axis=1)
    table = keras.layers.Embedding(count, hidden_dim, dtype=dtype, name=name)
    return table(ids - 1)


def add_positions(x, dtype, name="position_embedding"):
    """`x + positions`: a learned `PositionEmbedding` of `x`'s length."""
    positions = PositionEmbedding(x.shape[1], dtype=dtype, name=name)
    return keras.layers.Add(dtype=dtype)([x, positions(x)])
