import keras
import numpy as np
from keras import ops

from keras_attention.utils import validation


def _check_inputs(shape):
    validation.check_sequence_shape(
        "inputs",
        shape,
        ranks=(3, 4, 5),
        layout="(batch, steps, ..., features)",
    )
    if shape[-1] % 2:
        raise ValueError(
            "`inputs` must have an even (rotated) feature size. "
            f"Received: inputs_shape={tuple(shape)!r}"
        )


@keras.saving.register_keras_serializable(package="keras_attention")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoPE), applied to queries and keys.

    Splits the last axis of `x` (size `d`, even) into halves `x1, x2` and
    rotates each pair `(x1[k], x2[k])` by the angle `m * theta_k` of its
    absolute position `m`:

        theta_k = max_wavelength ** (-2k / d),   k = 0 .. d/2 - 1
        y1 = x1 cos(m theta) - x2 sin(m theta)
        y2 = x2 cos(m theta) + x1 sin(m theta)

    A rotation keeps norms, and `rope(q, m) . rope(k, n)` depends on the
    positions only through `m - n`, which makes attention scores relative.
    The maths runs in float32 and the result is cast back to the input's
    dtype. The layer has no weights.

    Args:
        max_wavelength: finite number >= 1, the longest wavelength `10000`
            of the paper (below 1 the frequencies grow with the feature
            index, and tiny values overflow float32 into NaN angles).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, T, ..., d)`: the sequence axis is 1, the rotated
            features the last axis (e.g. projected heads `(b, T, h, d)`).
        start_index: int or scalar int tensor, absolute position of
            `inputs[:, 0]` (the cache index in incremental decoding).

    Returns:
        A tensor shaped like `inputs`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> rope = keras_attention.layers.RotaryEmbedding()
    >>> q = np.ones((1, 4, 2, 8), "float32")
    >>> tuple(rope(q, start_index=3).shape)
    (1, 4, 2, 8)

    References:
        - Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary
          Position Embedding".
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = validation.check_positive_number(
            "max_wavelength", max_wavelength, minimum=1
        )
        self.supports_masking = True

    def build(self, inputs_shape):
        _check_inputs(inputs_shape)
        self.built = True

    def _cos_sin(self, length, dim, rank, start_index):
        # m - absolute positions, k - frequency index
        m = ops.cast(ops.arange(length), "float32") + ops.cast(
            start_index, "float32"
        )
        # Frequencies in float64 on the host, then float32: a huge
        # `max_wavelength` (1e300) has no float32 value, its powers do.
        theta = np.power(
            float(self.max_wavelength), -2.0 * np.arange(dim // 2) / dim
        )
        theta = ops.convert_to_tensor(theta.astype("float32"))
        angles = ops.einsum("m,k->mk", m, theta)  # (T, d/2)
        shape = (1, length) + (1,) * (rank - 3) + (dim // 2,)
        return ops.reshape(ops.cos(angles), shape), ops.reshape(
            ops.sin(angles), shape
        )

    def call(self, inputs, start_index=0):
        _check_inputs(inputs.shape)
        validation.check_numeric_input("inputs", inputs)
        start_index = validation.check_index(
            "start_index", start_index, allow_negative=True
        )
        dim = inputs.shape[-1]
        cos, sin = self._cos_sin(
            ops.shape(inputs)[1], dim, len(inputs.shape), start_index
        )
        x = ops.cast(inputs, "float32")
        x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
        y = ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return ops.cast(y, inputs.dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config["max_wavelength"] = self.max_wavelength
        return config
