import re

import numpy as np
import pytest
from harness import run_layer_test
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import FeedForward


def test_harness_feed_forward():
    x = np.random.default_rng(0).normal(size=(2, 5, 6)).astype("float32")
    run_layer_test(
        FeedForward,
        dict(intermediate_dim=12, activation="gelu", dropout=0.1),
        dict(inputs=x),
        expected_output_shape=(2, 5, 6),
        expected_num_trainable_weights=4,
    )


def test_matches_reference():
    x = np.random.default_rng(1).normal(size=(2, 3, 4)).astype("float32")
    layer = FeedForward(intermediate_dim=8)
    out = to_numpy(layer(x))
    w1, b1, w2, b2 = [to_numpy(w) for w in layer.get_weights()]
    expected = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="intermediate_dim=0"):
        FeedForward(intermediate_dim=0)
    with pytest.raises(ValueError, match="dropout=1.0"):
        FeedForward(intermediate_dim=4, dropout=1.0)
    with pytest.raises(ValueError, match="inputs_shape"):
        FeedForward(intermediate_dim=4)(np.zeros((3,), "float32"))


@pytest.mark.parametrize("value", ["False", 0, None])
def test_use_bias_refuses_non_bools(value):
    with pytest.raises(ValueError, match=re.escape(f"use_bias={value!r}")):
        FeedForward(intermediate_dim=4, use_bias=value)


def test_errors_show_values_with_repr():
    with pytest.raises(ValueError, match=re.escape("intermediate_dim='4'")):
        FeedForward(intermediate_dim="4")
