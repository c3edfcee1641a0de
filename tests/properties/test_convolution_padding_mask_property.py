"""`ConvolutionPaddingMask` under Hypothesis.

Draws: one to three convolutions (kernels 1 to 9, strides 1 to 4), the
batch, the input length (up to 80) and each row's number of real steps
(0 to the length, right padding).

Property: an output is real exactly when no padded input step reaches it
through the convolutions: the layer's mask equals the padding indicator
max-pooled by the same kernels and strides (the windows of unpadded
convolutions), negated, on the convolutions' output length.
"""

import keras
import numpy as np
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from keras_attention.layers import ConvolutionPaddingMask

BACKEND = keras.backend.backend()
DRAWS = settings(
    max_examples=max(
        3, settings.default.max_examples // (2 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)


def windows_with_padding(padded, kernel_sizes, strides):
    """NumPy: for each output of the convolutions, whether a padded step
    is in its window (the padding indicator max-pooled)."""
    x = padded
    for k, s in zip(kernel_sizes, strides):
        steps = (x.shape[1] - k) // s + 1 if x.shape[1] >= k else 0
        windows = [x[:, i * s : i * s + k].max(axis=1) for i in range(steps)]
        x = np.stack(windows, axis=1) if steps else np.zeros((len(x), 0))
    return x


@DRAWS
@given(st.data())
def test_an_output_is_real_when_no_padded_step_reaches_it(data):
    convolutions = data.draw(st.integers(1, 3))
    kernel_sizes = data.draw(
        st.lists(
            st.integers(1, 9), min_size=convolutions, max_size=convolutions
        )
    )
    strides = data.draw(
        st.lists(
            st.integers(1, 4), min_size=convolutions, max_size=convolutions
        )
    )
    batch = data.draw(st.integers(1, 3))
    length = data.draw(st.integers(1, 80))
    real = np.array(
        data.draw(
            st.lists(st.integers(0, length), min_size=batch, max_size=batch)
        )
    )
    mask = np.arange(length)[None] < real[:, None]
    padded = windows_with_padding(
        (~mask).astype("float32"), kernel_sizes, strides
    )
    frames = np.zeros(padded.shape + (2,), "float32")
    got = ops.convert_to_numpy(
        ConvolutionPaddingMask(kernel_sizes, strides)(frames, padding_mask=mask)
    )
    np.testing.assert_array_equal(got, padded == 0)
