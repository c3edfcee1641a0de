"""Attention logits of float16 / bfloat16 inputs cannot overflow.

`q . k` of float16 inputs of magnitude ~1e3 exceeds float16's range (65504)
long before the float32 softmax: the scores must be formed in float32. Each
test compares with a float64 NumPy reference computed from the same
(rounded) low-precision inputs, or with the float32 layer of the same
weights.
"""

import keras
import numpy as np
import pytest
from keras import ops
from references import masked_softmax as np_masked_softmax

import keras_attention
from keras_attention.ops.attention import dot_product_attention
from keras_attention.ops.attention import implementation_scope
from keras_attention.ops.sliding_window import local_attention

PATHS = ["dense", "blockwise", "fused"]


def _np(x):
    return ops.convert_to_numpy(ops.cast(x, "float32")).astype("float64")


def _np_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d)) v in float64; q (b,i,h,d), k/v (b,j,g,.)."""
    h, g = q.shape[2], k.shape[2]
    k, v = np.repeat(k, h // g, axis=2), np.repeat(v, h // g, axis=2)
    scores = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    weights = np_masked_softmax(scores, np.broadcast_to(mask, scores.shape))
    return np.einsum("bhij,bjhe->bihe", weights, v)


def _large_inputs(dtype, magnitude, b=2, t=9, h=4, g=2, d=8, e=6, seed=0):
    """q and k of `magnitude` (scores ~ magnitude^2), v of order 1, in
    `dtype`; also their values as float64 NumPy arrays."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, t, h, d)) * magnitude
    k = rng.normal(size=(b, t, g, d)) * magnitude
    v = rng.normal(size=(b, t, g, e))
    low = [ops.cast(x.astype("float32"), dtype) for x in (q, k, v)]
    return low, [_np(x) for x in low]


def _padding(b=2, t=9):
    valid = np.ones((b, t), bool)
    valid[1, -3:] = False
    return valid


@pytest.mark.parametrize(
    "dtype,magnitude", [("float16", 1e3), ("bfloat16", 1e4)]
)
@pytest.mark.parametrize("path", PATHS)
def test_dot_product_attention_large_low_precision_inputs(
    dtype, magnitude, path
):
    (q, k, v), (q64, k64, v64) = _large_inputs(dtype, magnitude)
    valid = _padding()
    causal = np.tril(np.ones((9, 9), bool))
    mask = (
        causal[None, None] & valid[:, None, None, :] & valid[:, None, :, None]
    )
    with implementation_scope(path):
        out = dot_product_attention(
            q, k, v, is_causal=True, key_padding=valid, query_padding=valid
        )
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    out = _np(out)
    assert np.all(np.isfinite(out))
    expected = _np_attention(q64, k64, v64, mask)
    # Near one-hot weights: the output is a value row, up to v's rounding.
    tol = 2e-2 if dtype == "bfloat16" else 3e-3
    np.testing.assert_allclose(out, expected, atol=tol * np.abs(v64).max())


def test_dense_weights_of_large_float16_inputs():
    (q, k, v), (q64, k64, v64) = _large_inputs("float16", 1e3)
    valid = _padding()
    mask = valid[:, None, None, :] & np.ones((1, 1, 9, 1), bool)
    out, weights = dot_product_attention(
        q, k, v, mask=mask, return_weights=True, implementation="dense"
    )
    h = q.shape[2]
    scores = np.einsum(
        "bihd,bjhd->bhij", q64, np.repeat(k64, h // k.shape[2], axis=2)
    ) / np.sqrt(8)
    expected = np_masked_softmax(scores, np.broadcast_to(mask, scores.shape))
    np.testing.assert_allclose(_np(weights), expected, atol=2e-3)
    assert np.all(np.isfinite(_np(out)))


@pytest.mark.parametrize(
    "dtype,magnitude", [("float16", 1e3), ("bfloat16", 1e4)]
)
def test_local_attention_large_low_precision_inputs(dtype, magnitude):
    (q, k, v), (q64, k64, v64) = _large_inputs(dtype, magnitude)
    valid = _padding()
    i, j = np.arange(9)[:, None], np.arange(9)[None, :]
    mask = ((j >= i - 2) & (j <= i + 1))[None, None]
    mask = mask & valid[:, None, None, :] & valid[:, None, :, None]
    out = local_attention(
        q, k, v, (2, 1), query_mask=valid, key_mask=valid, block_size=4
    )
    out = _np(out)
    assert np.all(np.isfinite(out))
    tol = 2e-2 if dtype == "bfloat16" else 3e-3
    np.testing.assert_allclose(
        out, _np_attention(q64, k64, v64, mask), atol=tol * np.abs(v64).max()
    )


def _mha_pair(policy, **kwargs):
    """The same MultiHeadAttention in float32 and under `policy`."""
    x = np.random.default_rng(1).normal(size=(2, 7, 16)).astype("float32")
    reference = keras_attention.layers.MultiHeadAttention(2, 8, **kwargs)
    reference(x, x)
    keras.config.set_dtype_policy(policy)
    low = keras_attention.layers.MultiHeadAttention(2, 8, **kwargs)
    low(x, x)
    low.set_weights(reference.get_weights())
    return reference, low, x


@pytest.mark.parametrize(
    "policy,magnitude", [("mixed_float16", 1e3), ("mixed_bfloat16", 1e4)]
)
@pytest.mark.parametrize("path", ["dense", "blockwise"])
def test_multi_head_attention_mixed_precision_large_inputs(
    policy, magnitude, path
):
    reference, low, x = _mha_pair(policy)
    x = x * magnitude
    valid = np.ones((2, 7), bool)
    valid[0, -2:] = False
    with implementation_scope(path):
        out = low(
            x, x, query_mask=valid, value_mask=valid, use_causal_mask=True
        )
        expected = reference(
            x, x, query_mask=valid, value_mask=valid, use_causal_mask=True
        )
    out, expected = _np(out), _np(expected)
    assert np.all(np.isfinite(out))
    # Scores ~1e5+: the weights are near one-hot in both; low-precision
    # projections shift the output by about their rounding.
    tol = 3e-2 if policy == "mixed_bfloat16" else 5e-3
    np.testing.assert_allclose(out, expected, atol=tol * np.abs(expected).max())
