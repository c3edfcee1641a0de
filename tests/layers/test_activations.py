"""The activations by name: `quick_gelu` (CLIP's) against NumPy, in
float64, and saved by name in a `FeedForward` under `safe_mode=True`."""

import contextlib

import keras
import numpy as np
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import FeedForward
from keras_attention.layers import quick_gelu

X = np.linspace(-6.0, 6.0, 25)


@contextlib.contextmanager
def x64():
    """JAX computes in float64 only with x64 enabled."""
    if keras.backend.backend() != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


def test_quick_gelu_is_x_sigmoid_1702_x():
    with x64():
        want = X / (1.0 + np.exp(-1.702 * X))
        out = to_numpy(quick_gelu(X.astype("float32")))
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)
        out64 = to_numpy(quick_gelu(keras.ops.convert_to_tensor(X, "float64")))
        assert out64.dtype == np.float64
        np.testing.assert_allclose(out64, want, rtol=1e-14)


def test_quick_gelu_saves_by_name_in_a_feed_forward(tmp_path):
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")
    inputs = keras.Input((3, 4))
    layer = FeedForward(8, activation=quick_gelu)
    model = keras.Model(inputs, layer(inputs))
    config = layer.get_config()["activation"]
    assert config["config"] == "keras_attention>quick_gelu"
    path = str(tmp_path / "ffn.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(to_numpy(reloaded(x)), to_numpy(model(x)))
    hidden = x @ to_numpy(layer.intermediate_dense.kernel)
    hidden = hidden + to_numpy(layer.intermediate_dense.bias)
    hidden = hidden / (1.0 + np.exp(-1.702 * hidden))
    want = hidden @ to_numpy(layer.output_dense.kernel)
    want = want + to_numpy(layer.output_dense.bias)
    np.testing.assert_allclose(to_numpy(model(x)), want, atol=1e-5)
