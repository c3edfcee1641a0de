"""Biases broadcast as NumPy does on every backend.

`keras.ops.add` on TensorFlow (Keras 3.15) adds an operand with one
dimension larger than 1 along the other's axis 1 or last axis when the
sizes match (`tf.nn.bias_add`), whatever broadcasting says, and
`keras.layers.EinsumDense` adds its bias with it: the `(heads, 1)` bias of
`key_dim=1` heads landed on the time axis when `T == heads` (found by the
thorough Hypothesis run of `test_multi_head_attention`). The layers'
projections add their bias with `keras_attention.ops.broadcast_add`.
"""

import keras
import numpy as np
import pytest

import keras_attention as ka


@pytest.mark.parametrize(
    "x_shape, y_shape",
    [
        ((1, 3, 3, 1), (3, 1)),  # heads == T, head size 1
        ((2, 3, 4, 3), (3, 1, 1)),  # along axis 1, last axis of size 3 too
        ((2, 5, 2), (5, 1)),
        ((2, 3, 4), (4,)),  # an ordinary bias
    ],
)
def test_broadcast_add_broadcasts_as_numpy(x_shape, y_shape):
    rng = np.random.default_rng(0)
    x = rng.normal(size=x_shape).astype("float32")
    y = rng.normal(size=y_shape).astype("float32")
    got = keras.ops.convert_to_numpy(ka.ops.broadcast_add(x, y))
    np.testing.assert_allclose(got, x + y, rtol=1e-6)


def _randomize_biases(layer, rng):
    for weight in layer.weights:
        if "bias" in weight.path:
            weight.assign(rng.normal(size=weight.shape).astype("float32"))


def _projection(dense, x):
    """An `EinsumDense` in NumPy: its equation, kernel and bias."""
    kernel = keras.ops.convert_to_numpy(dense.kernel)
    y = np.einsum(dense.equation, x, kernel)
    if dense.bias is not None:
        y = y + keras.ops.convert_to_numpy(dense.bias)
    return y


def test_multi_head_attention_heads_of_size_one():
    # 3 heads of size 1, 3 keys: the key and value biases are (3, 1).
    rng = np.random.default_rng(1)
    layer = ka.layers.MultiHeadAttention(num_heads=3, key_dim=1)
    query = rng.normal(size=(1, 2, 4)).astype("float32")
    value = rng.normal(size=(1, 3, 3)).astype("float32")
    layer(query, value)
    _randomize_biases(layer, rng)
    q = _projection(layer.query_dense, query)
    k = _projection(layer.key_dense, value)
    v = _projection(layer.value_dense, value)
    scores = np.einsum("bihk,bjhk->bhij", q, k)  # / sqrt(1)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads = np.einsum("bhij,bjhe->bihe", weights, v)
    want = _projection(layer.output_dense, heads)
    got = keras.ops.convert_to_numpy(layer(query, value))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_linear_attention_projections_of_heads_of_size_one():
    rng = np.random.default_rng(2)
    layer = ka.layers.LinearAttention(num_heads=3, key_dim=1)
    x = rng.normal(size=(1, 3, 4)).astype("float32")
    layer(x)
    _randomize_biases(layer, rng)
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense):
        got = keras.ops.convert_to_numpy(dense(x))
        np.testing.assert_allclose(got, _projection(dense, x), rtol=1e-5)
