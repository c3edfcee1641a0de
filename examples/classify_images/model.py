"""The models of the `classify_images` example.

`vit` (default): a vision transformer (Dosovitskiy et al., 2021). A Conv2D
with stride = kernel = patch size cuts the image into non-overlapping
patches and embeds each (the same as flattening the patches and applying
one Dense layer); a learned `[CLS]` token is prepended (`pooling="cls"`);
positions are learned (`keras_attention.layers.PositionEmbedding`) or a
fixed 2-D sine-cosine encoding (`SinCosPositionEncoding2D`); pre-norm
`TransformerEncoderBlock`s mix the tokens; the class comes from the final
`[CLS]` vector or from `AttentionPooling` over the patches.

`feature_map`: a small convolutional stem gives a `(batch, H, W, C)` feature
map, and `keras_attention.layers.MultiHeadAttention(attention_axes=(1, 2))`
runs self-attention over both spatial axes of that rank-4 tensor directly
(every position attends to every position, as in the non-local blocks of
Wang et al., 2018): no reshape to a sequence in the model. The layer merges
the attention axes into one sequence internally (no tensor of rank above 5,
TensorFlow's oneDNN limit). `AttentionPooling` then pools the positions.
"""

import keras
import numpy as np
from keras import ops

from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.layers import AttentionPooling
from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import PositionEmbedding

MODELS = ("vit", "feature_map")
POOLINGS = ("cls", "attention")
POSITIONS = ("learned", "sincos")


def sincos_2d(grid_height, grid_width, dim, max_wavelength=10000.0):
    """Fixed 2-D sine-cosine position encoding, NumPy float32
    `(grid_height * grid_width, dim)`, rows in row-major patch order.

    Half the features encode the row, half the column, each as in Vaswani
    et al. (2017): `sin(p / m^(2i / (dim/2)))`, `cos(...)` for position
    `p` and `m = max_wavelength` (MAE's and "Simple ViT"'s encoding).
    """
    if dim % 4:
        raise ValueError(
            "`dim` must be a multiple of 4 (sin and cos of rows and "
            f"columns). Received: dim={dim!r}"
        )
    quarter = dim // 4
    frequencies = 1.0 / max_wavelength ** (np.arange(quarter) / quarter)
    rows, cols = np.meshgrid(
        np.arange(grid_height), np.arange(grid_width), indexing="ij"
    )
    # p - patches, f - frequencies
    angles_r = rows.reshape(-1, 1) * frequencies[None]
    angles_c = cols.reshape(-1, 1) * frequencies[None]
    table = np.concatenate(
        [
            np.sin(angles_r),
            np.cos(angles_r),
            np.sin(angles_c),
            np.cos(angles_c),
        ],
        axis=1,
    )
    return table.astype("float32")


@keras.saving.register_keras_serializable(package="classify_images")
class SinCosPositionEncoding2D(keras.layers.Layer):
    """The fixed `sincos_2d` encoding of a `grid` of patches, broadcast to
    the inputs `(batch, extra + H * W, d)` (the first `extra` tokens, e.g.
    `[CLS]`, get zeros) or `(batch, H, W, d)`. Add it: `x + layer(x)`."""

    def __init__(self, grid, extra_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.grid = tuple(int(g) for g in grid)
        self.extra_tokens = int(extra_tokens)

    def build(self, inputs_shape):
        height, width = self.grid
        table = sincos_2d(height, width, inputs_shape[-1])
        if len(inputs_shape) == 4:
            table = table.reshape(height, width, -1)
        else:
            zeros = np.zeros((self.extra_tokens, table.shape[-1]), "float32")
            table = np.concatenate([zeros, table])
        self._table = table
        self.built = True

    def call(self, inputs):
        table = ops.cast(ops.convert_to_tensor(self._table), self.compute_dtype)
        return ops.broadcast_to(table[None], ops.shape(inputs))

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(grid=self.grid, extra_tokens=self.extra_tokens)
        return config


@keras.saving.register_keras_serializable(package="classify_images")
class ClassToken(keras.layers.Layer):
    """Prepends one learned `[CLS]` vector: `(batch, T, d)` ->
    `(batch, 1 + T, d)`."""

    def build(self, inputs_shape):
        self.token = self.add_weight(
            name="token",
            shape=(1, 1, inputs_shape[-1]),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        )
        self.built = True

    def call(self, inputs):
        batch = ops.shape(inputs)[0]
        token = ops.cast(self.token, inputs.dtype)
        token = ops.broadcast_to(token, (batch, 1, ops.shape(inputs)[-1]))
        return ops.concatenate([token, inputs], axis=1)

    def compute_output_shape(self, inputs_shape):
        batch, steps, features = inputs_shape
        return (batch, None if steps is None else steps + 1, features)


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(
            f"`{name}` must be one of {choices}. Received: {name}={value!r}"
        )


def _add_positions(x, position, grid, extra_tokens):
    if position == "learned":
        length = int(np.prod(grid)) + extra_tokens
        if len(x.shape) == 4:  # (b, H, W, d): learned per flattened cell
            flat = keras.layers.Reshape((length, x.shape[-1]))(x)
            table = PositionEmbedding(length, name="position_embedding")(flat)
            table = keras.layers.Reshape(x.shape[1:])(table)
        else:
            table = PositionEmbedding(length, name="position_embedding")(x)
    else:
        table = SinCosPositionEncoding2D(
            grid, extra_tokens, name="position_encoding"
        )(x)
    return keras.layers.Add(name="add_positions")([x, table])


def _augment(images, augment):
    """Random shifts of up to 1/16 of the image (training only)."""
    if not augment:
        return images
    return keras.layers.RandomTranslation(
        1 / 16, 1 / 16, fill_mode="constant", name="augment"
    )(images)


def _head(x, num_classes, dropout):
    x = keras.layers.Dropout(dropout)(x)
    return keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)


def build_vit(
    image_size,
    num_classes,
    patch_size=4,
    hidden_dim=64,
    num_layers=4,
    num_heads=4,
    pooling="cls",
    position="learned",
    dropout=0.1,
    channels=1,
    augment=False,
):
    """A vision transformer: images `(batch, S, S, channels)` -> logits.

    The encoder blocks are named `encoder_block_{i}`, the pooling (when
    `pooling="attention"`) `pooling`: `collect_attention` reports their
    weights under those names. Tokens: `[CLS]` first (when `pooling="cls"`),
    then the patches in row-major order. `augment`: random shifts of the
    images in training (`keras.layers.RandomTranslation`, 1/16 of the
    size).
    """
    _check_choice("pooling", pooling, POOLINGS)
    _check_choice("position", position, POSITIONS)
    if image_size % patch_size:
        raise ValueError(
            "`image_size` must be a multiple of `patch_size`. Received: "
            f"image_size={image_size!r}, patch_size={patch_size!r}"
        )
    grid = (image_size // patch_size,) * 2
    # b - batch, p - patches (+ [CLS]), d - features
    images = keras.Input((image_size, image_size, channels), name="images")
    x = keras.layers.Conv2D(
        hidden_dim, patch_size, strides=patch_size, name="patch_embedding"
    )(_augment(images, augment))  # (b, H/P, W/P, d)
    x = keras.layers.Reshape((grid[0] * grid[1], hidden_dim))(x)  # (b, p, d)
    extra = 0
    if pooling == "cls":
        x = ClassToken(name="class_token")(x)
        extra = 1
    x = _add_positions(x, position, grid, extra)
    x = keras.layers.Dropout(dropout)(x)
    for i in range(num_layers):
        x = TransformerEncoderBlock(
            num_heads=num_heads,
            intermediate_dim=2 * hidden_dim,
            dropout=dropout,
            activation="gelu",
            norm_first=True,
            name=f"encoder_block_{i}",
        )(x)
    x = keras.layers.LayerNormalization(name="final_norm")(x)
    if pooling == "cls":
        x = x[:, 0, :]  # (b, d): the [CLS] token
    else:
        x = AttentionPooling(units=hidden_dim, name="pooling")(x)
    logits = _head(x, num_classes, dropout)
    return keras.Model(images, logits, name=f"vit_{pooling}")


def spatial_attention_block(x, index, num_heads, dropout):
    """Pre-norm block over a feature map `(batch, H, W, C)`:
    `x + MHA(LN(x))` with attention over axes 1 and 2 together, then
    `x + MLP(LN(x))` (Dense layers act on the channels)."""
    channels = x.shape[-1]
    name = f"spatial_block_{index}"
    h = keras.layers.LayerNormalization(name=f"{name}_norm_1")(x)
    h = MultiHeadAttention(
        num_heads,
        channels // num_heads,
        dropout=dropout,
        attention_axes=(1, 2),
        name=f"{name}_attention",
    )(h, h)  # (b, H, W, C): every (i, j) attends to every (k, l)
    x = keras.layers.Add()([x, keras.layers.Dropout(dropout)(h)])
    h = keras.layers.LayerNormalization(name=f"{name}_norm_2")(x)
    h = keras.layers.Dense(2 * channels, activation="gelu")(h)
    h = keras.layers.Dense(channels)(keras.layers.Dropout(dropout)(h))
    return keras.layers.Add()([x, keras.layers.Dropout(dropout)(h)])


def build_feature_map_model(
    image_size,
    num_classes,
    patch_size=4,
    hidden_dim=64,
    num_layers=2,
    num_heads=4,
    position="learned",
    dropout=0.1,
    channels=1,
    augment=False,
):
    """Conv stem -> 2-D attention blocks over the `(batch, H, W, C)` feature
    map (`MultiHeadAttention(attention_axes=(1, 2))`, named
    `spatial_block_{i}_attention`) -> `AttentionPooling` -> logits.

    The stem downsamples by `patch_size` (a power of 2) with stride-2 3×3
    convolutions, so the feature map has the ViT's patch grid.
    """
    _check_choice("position", position, POSITIONS)
    steps = int(np.log2(patch_size))
    if 2**steps != patch_size or image_size % patch_size:
        raise ValueError(
            "`patch_size` must be a power of 2 dividing `image_size` "
            f"(the stem halves the image). Received: patch_size="
            f"{patch_size!r}, image_size={image_size!r}"
        )
    grid = (image_size // patch_size,) * 2
    # b - batch, h/w - feature map rows/columns, c - channels
    images = keras.Input((image_size, image_size, channels), name="images")
    x = _augment(images, augment)
    for i in range(steps):
        width = hidden_dim // 2 ** (steps - 1 - i)
        x = keras.layers.Conv2D(
            width, 3, strides=2, padding="same", name=f"stem_{i}"
        )(x)
        x = keras.layers.Activation("gelu")(x)
    x = keras.layers.Conv2D(hidden_dim, 1, name="stem_projection")(x)
    x = _add_positions(x, position, grid, 0)  # (b, h, w, c)
    for i in range(num_layers):
        x = spatial_attention_block(x, i, num_heads, dropout)
    x = keras.layers.LayerNormalization(name="final_norm")(x)
    x = keras.layers.Reshape((grid[0] * grid[1], hidden_dim))(x)
    x = AttentionPooling(units=hidden_dim, name="pooling")(x)
    logits = _head(x, num_classes, dropout)
    return keras.Model(images, logits, name="feature_map_attention")


def build_model(model="vit", pooling="cls", **kwargs):
    """`build_vit` or `build_feature_map_model` (`model`); the feature-map
    model pools with attention only."""
    _check_choice("model", model, MODELS)
    if model == "vit":
        return build_vit(pooling=pooling, **kwargs)
    if pooling != "attention":
        raise ValueError(
            "model='feature_map' has no [CLS] token: it pools with "
            "`AttentionPooling` (pooling='attention'). Received: "
            f"pooling={pooling!r}"
        )
    return build_feature_map_model(**kwargs)
