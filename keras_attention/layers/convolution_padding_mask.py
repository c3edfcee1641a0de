import keras
from keras import ops

from keras_attention.utils import validation


def _check_sizes(name, values):
    """`values` (a sequence of positive ints, array-likes accepted) as a
    tuple of Python ints."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(
            f"`{name}` must be a non-empty sequence of positive integers. "
            f"Received: {name}={values!r}"
        )
    values = list(getattr(values, "tolist", lambda: values)())
    if not values or not all(
        validation.is_int(v) and not isinstance(v, bool) and v > 0
        for v in values
    ):
        raise ValueError(
            f"`{name}` must be a non-empty sequence of positive integers. "
            f"Received: {name}={values!r}"
        )
    return tuple(int(v) for v in values)


@keras.saving.register_keras_serializable(package="keras_attention")
class ConvolutionPaddingMask(keras.layers.Layer):
    """The padding mask of the outputs of a stack of unpadded (`"valid"`)
    strided convolutions, from the padding mask of their input: an audio
    frontend's frames that come from real samples only.

    A sequence of `n` real steps (the sum of its `padding_mask`: the
    real steps first, right padding) gives, through a convolution of
    kernel `k` and stride `s`, `floor((n - k) / s) + 1` outputs made of
    real steps only (none when `n < k`); the layer applies that rule for
    each convolution in turn and marks the first outputs of the count
    real. The rule of keras-hub's Moonshine (`compute_output_lengths`)
    and of the Hugging Face audio encoders (`_get_feat_extract_output_
    lengths`).

    Args:
        kernel_sizes: sequence of positive ints, each convolution's kernel
            size, in the order they run.
        strides: sequence of positive ints, their strides (as many).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: the convolutions' output `(batch, T_out, ...)`; only its
            shape is read (`T_out`).
        padding_mask: boolean or integer `(batch, T_in)`, nonzero on the
            input's real steps.

    Returns:
        Boolean `(batch, T_out)`: True on the first `n_out` positions of
        each sequence.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.ConvolutionPaddingMask([3, 2], [2, 2])
    >>> frames = np.zeros((2, 4, 8), "float32")  # 10 steps: 4, then 2
    >>> mask = np.arange(10)[None] < np.array([[10], [6]])
    >>> np.asarray(layer(frames, padding_mask=mask)).tolist()
    [[True, True, False, False], [True, False, False, False]]
    """

    def __init__(self, kernel_sizes, strides, **kwargs):
        super().__init__(**kwargs)
        self.kernel_sizes = _check_sizes("kernel_sizes", kernel_sizes)
        self.strides = _check_sizes("strides", strides)
        if len(self.kernel_sizes) != len(self.strides):
            raise ValueError(
                "`kernel_sizes` and `strides` must give one value per "
                f"convolution. Received: kernel_sizes={kernel_sizes!r}, "
                f"strides={strides!r}"
            )

    def output_lengths(self, lengths):
        """The convolutions' output lengths (int32) of inputs of
        `lengths` real steps."""
        lengths = ops.cast(lengths, "int32")
        for kernel, stride in zip(self.kernel_sizes, self.strides):
            fits = ops.greater_equal(lengths, kernel)
            out = ops.floor_divide(ops.maximum(lengths - kernel, 0), stride)
            lengths = ops.where(fits, out + 1, ops.zeros_like(lengths))
        return lengths

    def call(self, inputs, padding_mask):
        validation.check_sequence_shape(
            "inputs",
            inputs.shape,
            ranks=(2, 3, 4, 5),
            layout="(batch, steps, ...)",
        )
        mask = ops.convert_to_tensor(padding_mask)
        if len(mask.shape) != 2:
            raise ValueError(
                "`padding_mask` must be `(batch, T_in)`. Received: "
                f"padding_mask.shape={tuple(mask.shape)!r}"
            )
        real = ops.not_equal(mask, ops.zeros_like(mask))
        lengths = ops.sum(ops.cast(real, "int32"), axis=1)
        lengths = self.output_lengths(lengths)
        steps = ops.arange(ops.shape(inputs)[1], dtype="int32")
        return ops.less(steps[None, :], lengths[:, None])

    def compute_output_spec(self, inputs, padding_mask):
        return keras.KerasTensor(inputs.shape[:2], dtype="bool")

    def compute_mask(self, inputs, padding_mask=None, mask=None):
        return None

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "kernel_sizes": list(self.kernel_sizes),
                "strides": list(self.strides),
            }
        )
        return config
