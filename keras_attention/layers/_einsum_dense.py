"""`EinsumDense` (private to `layers`): Keras's projection with its bias
added by `keras_attention.ops.broadcast_add`.

`keras.layers.EinsumDense` adds its bias with `keras.ops.add`, which on
TensorFlow (Keras 3.15) adds a bias of one dimension larger than 1 along
the input's axis 1 when that axis has the same size: the `(heads, 1)`
bias of a head of size 1 (`key_dim=1`, `value_dim=1`), or an output
shape ending in 1, lands on the time axis of `(batch, T, heads, 1)` when
`T == heads`, silently. The layers build their projections from this
class instead; the float path is Keras's otherwise (LoRA included: its
kernel is `self.kernel`). Quantized calls are Keras's own. `Dense`:
Keras's, whose float64 calls stay float64 on PyTorch too (Keras's torch
matmul returns float32 for them).
"""

import keras
from keras import ops

from keras_attention.ops import broadcast_add


class _KerasQuantized:
    """What both projections share: the bias added as NumPy broadcasts it,
    the activation, and Keras's own quantized paths."""

    def _bias_and_activation(self, x):
        if self.bias is not None:
            x = broadcast_add(x, ops.cast(self.bias, x.dtype))
        if self.activation is not None:
            x = self.activation(x)
        return x

    def quantize(self, mode=None, **kwargs):
        # Keras refuses to quantize subclasses (`type_check`): the float
        # path is the only one changed here, the quantized ones are its.
        kwargs["type_check"] = False
        return super().quantize(mode, **kwargs)


class EinsumDense(_KerasQuantized, keras.layers.EinsumDense):
    """`keras.layers.EinsumDense` whose bias broadcasts as NumPy does."""

    def call(self, inputs, training=None):
        x = ops.einsum(self.equation, inputs, self.kernel)
        return self._bias_and_activation(x)


class Dense(_KerasQuantized, keras.layers.Dense):
    """`keras.layers.Dense` whose float64 calls stay float64 (on
    PyTorch too): the weights and their paths are Keras's."""

    def call(self, inputs, training=None):
        dtype = keras.backend.standardize_dtype(inputs.dtype)
        if dtype != "float64" or self.quantization_mode is not None:
            return super().call(inputs, training=training)
        x = ops.einsum("...i,ij->...j", inputs, ops.cast(self.kernel, dtype))
        return self._bias_and_activation(x)
