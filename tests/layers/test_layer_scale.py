"""`layer_scale` of `FeedForward` and `SelfAttention` (CaiT's and
DINOv2's learned per-feature scale of a sublayer's output): the output
equals the unscaled layer's times the learned vector (NumPy references),
the attention weights and a decoding cache are unchanged, the option
saves and reloads, and bad values are refused by name."""

import contextlib
import re

import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import CausalSelfAttention
from keras_attention.layers import FeedForward
from keras_attention.layers import SelfAttention

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 5, 6)).astype("float32")
SCALE = RNG.normal(size=(6,)).astype("float32")
VALID = np.array([[True] * 3 + [False] * 2, [True] * 5])


@contextlib.contextmanager
def x64():
    """JAX computes in float64 only with x64 enabled."""
    if keras.backend.backend() != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


def with_scale(layer, values=SCALE):
    layer.layer_scale_weight.assign(values)
    return layer


def test_feed_forward_output_times_the_scale():
    layer = FeedForward(8, layer_scale=1e-3)
    layer.build(X.shape)
    assert layer.layer_scale_weight.path.endswith("/layer_scale")
    np.testing.assert_allclose(to_numpy(layer.layer_scale_weight), 1e-3)
    with_scale(layer)
    w1, b1 = [to_numpy(w) for w in layer.intermediate_dense.weights]
    w2, b2 = [to_numpy(w) for w in layer.output_dense.weights]
    expected = (np.maximum(X @ w1 + b1, 0) @ w2 + b2) * SCALE
    np.testing.assert_allclose(to_numpy(layer(X)), expected, atol=1e-5)


def test_self_attention_output_times_the_scale_weights_unchanged():
    scaled = SelfAttention(2, 3, layer_scale=0.5)
    plain = SelfAttention(2, 3)
    scaled.build(X.shape)
    plain.build(X.shape)
    sources = {w.path.split("/", 1)[1]: w for w in scaled.weights}
    for weight in plain.weights:  # the same projections
        weight.assign(sources[weight.path.split("/", 1)[1]])
    with_scale(scaled)
    out, scores = scaled(X, mask=VALID, return_attention_scores=True)
    want, want_scores = plain(X, mask=VALID, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(out), to_numpy(want) * SCALE, atol=1e-6)
    np.testing.assert_array_equal(to_numpy(scores), to_numpy(want_scores))
    assert len(scaled.trainable_weights) == len(plain.trainable_weights) + 1


def test_self_attention_scale_of_the_output_shape():
    layer = SelfAttention(2, 3, layer_scale=2.0, output_shape=(4,))
    layer.build(X.shape)
    assert tuple(layer.layer_scale_weight.shape) == (4,)
    np.testing.assert_allclose(to_numpy(layer.layer_scale_weight), 2.0)


def test_cached_decoding_is_scaled_as_the_uncached_call():
    layer = CausalSelfAttention(2, 3, layer_scale=0.5)
    layer.build(X.shape)
    with_scale(layer)
    full = to_numpy(layer(X))
    cache = layer.init_cache(2, 5)
    steps = []
    for i in range(5):
        out, cache = layer(X[:, i : i + 1], cache=cache, cache_update_index=i)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("cls", [FeedForward, SelfAttention])
def test_config_and_keras_round_trip(cls, tmp_path):
    args = (8,) if cls is FeedForward else (2, 3)
    assert "layer_scale" not in cls(*args).get_config()
    layer = cls(*args, layer_scale=0.25)
    assert layer.get_config()["layer_scale"] == 0.25
    inputs = keras.Input((5, 6))
    model = keras.Model(inputs, layer(inputs))
    with_scale(layer)
    path = str(tmp_path / "scaled.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        to_numpy(reloaded(X)), to_numpy(model(X)), atol=1e-6
    )
    weight = reloaded.layers[-1].layer_scale_weight
    np.testing.assert_array_equal(to_numpy(weight), SCALE)


@pytest.mark.parametrize("cls", [FeedForward, SelfAttention])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "1", True])
def test_bad_values_are_refused_by_name(cls, value):
    args = (8,) if cls is FeedForward else (2, 3)
    with pytest.raises(ValueError, match=re.escape(f"layer_scale={value!r}")):
        cls(*args, layer_scale=value)


def test_harness_feed_forward_with_layer_scale():
    run_layer_test(
        FeedForward,
        dict(intermediate_dim=12, activation="gelu", layer_scale=0.1),
        dict(inputs=X),
        expected_output_shape=(2, 5, 6),
        expected_num_trainable_weights=5,
        run_saved_model=False,
    )


@pytest.mark.parametrize("cls", [FeedForward, SelfAttention])
def test_float64_initial_value_is_exact(cls):
    with x64():
        args = (8,) if cls is FeedForward else (2, 3)
        layer = cls(*args, layer_scale=0.1, dtype="float64")
        layer.build(X.shape)
        values = to_numpy(layer.layer_scale_weight)
        assert values.dtype == np.float64
        np.testing.assert_array_equal(values, np.float64(0.1))
