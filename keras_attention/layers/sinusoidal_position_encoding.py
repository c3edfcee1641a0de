import keras
import numpy as np
from keras import ops

from keras_attention.utils import validation

# Ranks of `inputs`: `(batch, T, d)` and keras-hub's `(batch, ..., T, d)`,
# up to 5 (oneDNN's kernels take rank <= 5).
_RANKS = (3, 4, 5)


@keras.saving.register_keras_serializable(package="keras_attention")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Fixed sinusoidal position encoding of "Attention Is All You Need".

    For position `pos` and feature `i` of `d`:

        PE(pos, 2k)     = sin(pos / max_wavelength ** (2k / d))
        PE(pos, 2k + 1) = cos(pos / max_wavelength ** (2k / d))

    The layer returns the encoding (not the sum), broadcast to the shape of
    `inputs`; add it to the embeddings yourself: `x + layer(x)`. It has no
    weights and works for any sequence length. Computed in float32, returned
    in the compute dtype.

    Args:
        max_wavelength: finite number >= 1, `10000` in the paper (below 1
            the rates grow with the feature index, and tiny values overflow
            float32 into NaN angles).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, T, d)`, or `(batch, ..., T, d)` up to rank 5
            (keras-hub's layout: positions on the second-to-last axis);
            only its shape is used.
        start_index: int or scalar int tensor, position of `inputs[:, 0]`
            (the cache index in incremental decoding).
        positions: optional positions `(T,)` or `(batch, T)` (batch 1
            or the inputs'; any real numbers) instead of `start_index +
            arange(T)` (keras-hub's argument): positions that restart in
            each packed document
            (`keras_attention.masks.segment_positions`). `T` is the
            inputs' second-to-last axis; another shape raises
            `ValueError` naming `positions` and both shapes (eagerly,
            and when traced for the sizes known then; a size unknown when
            traced fails in the backend's broadcast).

    Returns:
        encodings of the shape of `inputs`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> x = np.zeros((2, 5, 8), "float32")
    >>> pe = keras_attention.layers.SinusoidalPositionEncoding()(x)
    >>> tuple(pe.shape), float(pe[0, 0, 1])  # cos(0)
    ((2, 5, 8), 1.0)

    References:
        - Vaswani et al., 2017, "Attention Is All You Need", section 3.5.
    """

    def __init__(self, max_wavelength=10000, **kwargs):
        super().__init__(**kwargs)
        self.max_wavelength = validation.check_positive_number(
            "max_wavelength", max_wavelength, minimum=1
        )
        self.supports_masking = True

    def build(self, inputs_shape):
        validation.check_sequence_shape("inputs", inputs_shape, _RANKS)
        self.built = True

    def call(self, inputs, start_index=0, positions=None):
        validation.check_sequence_shape("inputs", inputs.shape, _RANKS)
        start_index = validation.check_index(
            "start_index", start_index, allow_negative=True
        )
        d = inputs.shape[-1]
        length = ops.shape(inputs)[-2]
        # pos - positions (b|1, T), i - features
        if positions is None:
            pos = ops.cast(ops.arange(length), "float32") + ops.cast(
                start_index, "float32"
            )
            pos = pos[None]
        else:
            pos = _positions_2d(positions, tuple(inputs.shape))
        i = ops.arange(d)
        # Rates in float64 on the host, then float32: a huge
        # `max_wavelength` (1e300) has no float32 value, its powers do.
        even = 2 * (np.arange(d) // 2)
        rate = np.power(float(self.max_wavelength), -even / d)
        rate = ops.convert_to_tensor(rate.astype("float32"))
        angle = pos[:, :, None] * rate
        pe = ops.where(i % 2 == 0, ops.sin(angle), ops.cos(angle))
        for _ in range(len(inputs.shape) - 3):  # (batch, ..., T, d)
            pe = ops.expand_dims(pe, 1)
        pe = ops.broadcast_to(pe, ops.shape(inputs))
        return ops.cast(pe, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config["max_wavelength"] = self.max_wavelength
        return config


def _positions_2d(positions, inputs_shape):
    """`positions` `(T,)` or `(batch, T)` of inputs `(batch, ..., T, d)`
    (checked: `validation.check_positions`) as float32 `(b|1, T)`."""
    validation.check_numeric_input("positions", positions)
    positions = ops.convert_to_tensor(positions)
    validation.check_positions("positions", positions.shape, inputs_shape, -2)
    positions = ops.cast(positions, "float32")
    return positions[None] if len(positions.shape) == 1 else positions
