"""`gelu_approximate`: GELU with the tanh approximation, by name."""

import keras


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
