"""Keras's `LayerNormalization` and `RMSNormalization` whose float64
stays float64 (the norms of `layers` and `blocks`).

Keras's `layer_normalization` and `rms_normalization` take `ops.mean`,
which its JAX and PyTorch backends compute in float32 for float64
(Keras 3.15): a float64 model's norms were float32-precise there. Here a
float64 call over the last axis takes its moments as sums over the size
(the rule `HeadRMSNorm` follows); any other call is Keras's own, and the
weights and their paths are Keras's.
"""

import keras
from keras import ops

from keras_attention.utils import keras_utils


def _float64_last_axis(layer, inputs):
    axis = layer.axis
    last = axis in (-1, len(inputs.shape) - 1) or axis in (
        [-1],
        [len(inputs.shape) - 1],
    )
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    return dtype == "float64" and last


def _mean(x):
    return ops.sum(x, axis=-1, keepdims=True) / x.shape[-1]


class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` whose float64 calls over the last
    axis stay float64 (on JAX and PyTorch too)."""

    def call(self, inputs):
        if not _float64_last_axis(self, inputs) or self.rms_scaling:
            return super().call(inputs)
        centered = inputs - _mean(inputs)
        variance = _mean(ops.square(centered))
        epsilon = keras_utils.constant(self.epsilon, "float64")
        outputs = centered * ops.rsqrt(variance + epsilon)
        if self.scale:
            outputs = outputs * ops.cast(self.gamma, "float64")
        if self.center:
            outputs = outputs + ops.cast(self.beta, "float64")
        return outputs


class RMSNormalization(keras.layers.RMSNormalization):
    """`keras.layers.RMSNormalization` whose float64 calls over the last
    axis stay float64 (on JAX and PyTorch too)."""

    def call(self, x):
        if not _float64_last_axis(self, x):
            return super().call(x)
        epsilon = keras_utils.constant(self.epsilon, "float64")
        outputs = x * ops.rsqrt(_mean(ops.square(x)) + epsilon)
        return outputs * ops.cast(self.scale, "float64")
