"""Activations by name: `gelu_approximate` (GELU with the tanh
approximation) and `quick_gelu` (its sigmoid approximation)."""

import keras

from keras_attention.utils import keras_utils


@keras.saving.register_keras_serializable(package="keras_attention")
def gelu_approximate(x):
    """GELU with the tanh approximation (the activation of BERT and GPT-2).

    `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`, which is
    `keras.activations.gelu(x, approximate=True)`. Keras's `"gelu"` is the
    exact (erf) one; this function gives the approximate one a registered
    name, so that a layer taking `activation=` (`FeedForward`, the
    transformer blocks) saves and reloads it, also with `safe_mode=True`:
    pass `activation=keras_attention.layers.gelu_approximate` or
    `activation="keras_attention>gelu_approximate"`.

    Args:
        x: float tensor.

    Returns:
        A tensor of `x`'s shape and dtype.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> y = keras_attention.layers.gelu_approximate(np.array([1.0], "float32"))
    >>> round(float(y[0]), 4)
    0.8412

    References:
        - Hendrycks and Gimpel, 2016, "Gaussian Error Linear Units
          (GELUs)".
    """
    return keras.activations.gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="keras_attention")
def quick_gelu(x):
    """The sigmoid approximation of GELU (the activation of OpenAI's CLIP).

    `x * sigmoid(1.702 x)`. A registered function, so that a layer taking
    `activation=` (`FeedForward`, the transformer blocks) saves and
    reloads it, also with `safe_mode=True`: pass
    `activation=keras_attention.layers.quick_gelu` or
    `activation="keras_attention>quick_gelu"`.

    Args:
        x: float tensor.

    Returns:
        A tensor of `x`'s shape and dtype.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> y = keras_attention.layers.quick_gelu(np.array([1.0], "float32"))
    >>> round(float(y[0]), 4)
    0.8458

    References:
        - Hendrycks and Gimpel, 2016, "Gaussian Error Linear Units
          (GELUs)", section 2 (`x sigmoid(1.702 x)`).
        - Radford et al., 2021, "Learning Transferable Visual Models From
          Natural Language Supervision" (CLIP).
    """
    x = keras.ops.convert_to_tensor(x)
    return x * keras.ops.sigmoid(keras_utils.constant(1.702, x.dtype) * x)
