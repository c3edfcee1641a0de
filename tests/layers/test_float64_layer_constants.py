"""float64 layers keep their constants in float64: a layer built with
`dtype="float64"` equals a float64 NumPy reference of its weights to
1e-12. The constants that went through float32 (`ops.cast(<python
float>, "float64")` on TensorFlow, 1e-8 relative): `MultiHeadAttention`'s
`attention_scale` (times `sqrt(key_dim)`) and its RMS QK-norm's
`qk_norm_epsilon` (whose mean square Keras's JAX and torch `ops.mean`
computed in float32 too), `LuongAttention`'s `scale=True` factor `1 /
sqrt(d)`. Dimensions whose square roots are no float32 (8, 6), an
epsilon comparable to the mean squares (0.1)."""

import keras
import numpy as np
import pytest
import references
from keras import ops

from keras_attention.layers import LuongAttention
from keras_attention.layers import MultiHeadAttention

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(64)
X = RNG.normal(size=(2, 5, 6))
CTX = RNG.normal(size=(2, 7, 6))
TOL = 1e-12


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


@pytest.fixture(autouse=True)
def x64():
    """JAX computes in float64 only with x64 enabled."""
    if BACKEND != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


def test_multi_head_attention_attention_scale():
    layer = MultiHeadAttention(2, 8, attention_scale=0.3, dtype="float64")
    out, weights = layer(X, CTX, return_attention_scores=True)
    want, want_w = references.multi_head_attention(layer, X, CTX, scale=0.3)
    assert np_(out).dtype == np.float64
    np.testing.assert_allclose(np_(weights), want_w, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(np_(out), want, rtol=TOL, atol=TOL)


def test_multi_head_attention_rms_qk_norm_epsilon():
    layer = MultiHeadAttention(
        2, 8, qk_norm="rms", qk_norm_epsilon=0.1, dtype="float64"
    )
    small = 0.1 * X  # mean squares near the epsilon
    out = layer(small, 0.1 * CTX)
    want, _ = references.qk_norm_sinks_attention(layer, small, 0.1 * CTX)
    np.testing.assert_allclose(np_(out), want, rtol=TOL, atol=TOL)


def test_luong_attention_scale():
    # "dot": the "general" score's Keras `Dense` computes float64 in
    # float32 on torch (Keras's `matmul` there).
    layer = LuongAttention("dot", scale=True, dtype="float64")
    query_mask = np.ones((2, 5), bool)
    value_mask = np.ones((2, 7), bool)
    value_mask[1, 5:] = False
    context, weights = layer(
        X,
        CTX,
        query_mask=query_mask,
        value_mask=value_mask,
        return_attention_scores=True,
    )
    want_c, want_w = references.luong(layer, X, CTX, value_mask, query_mask)
    np.testing.assert_allclose(np_(weights), want_w, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(np_(context), want_c, rtol=TOL, atol=TOL)
