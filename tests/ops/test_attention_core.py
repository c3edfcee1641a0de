import keras
import ml_dtypes
import numpy as np
import pytest
from keras import ops
from references import masked_softmax as np_masked_softmax

from keras_attention.ops import dot_product_attention
from keras_attention.ops import mask_fill_value
from keras_attention.ops import masked_softmax


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def test_masked_softmax_matches_reference_and_zero_rows():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(2, 3, 4)).astype("float32")
    mask = rng.random((2, 3, 4)) > 0.4
    mask[0, 1] = False  # a fully masked row
    out = np_(masked_softmax(scores, mask))
    np.testing.assert_allclose(out, np_masked_softmax(scores, mask), atol=1e-6)
    assert np.all(out[0, 1] == 0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fully_masked_rows_are_zero_in_every_dtype(dtype):
    q = ops.cast(np.random.randn(1, 3, 2, 4), dtype)
    k = ops.cast(np.random.randn(1, 5, 2, 4), dtype)
    mask = np.ones((1, 1, 3, 5), bool)
    mask[..., 1, :] = False
    out, w = dot_product_attention(q, k, k, mask=mask, return_weights=True)
    out, w = np_(out), np_(w)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(w))
    assert np.all(out[:, 1] == 0) and np.all(w[:, :, 1] == 0)
    np.testing.assert_allclose(w[:, :, [0, 2]].sum(-1), 1.0, atol=1e-2)


def test_mask_fill_value_is_finite_per_dtype():
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        v = mask_fill_value(dtype)
        np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
        as_dtype = np.asarray(v, dtype=np_dtype).astype("float64")
        assert np.isfinite(as_dtype) and v < -1e4


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_grouped_query_matches_repeated_heads(kv_heads):
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 3, 4, 8)).astype("float32")
    k = rng.normal(size=(2, 5, kv_heads, 8)).astype("float32")
    v = rng.normal(size=(2, 5, kv_heads, 6)).astype("float32")
    out, w = dot_product_attention(q, k, v, return_weights=True)
    kr, vr = np.repeat(k, 4 // kv_heads, 2), np.repeat(v, 4 // kv_heads, 2)
    scores = np.einsum("bihd,bjhd->bhij", q, kr) / np.sqrt(8)
    ref_w = np_masked_softmax(scores, np.ones(scores.shape, bool))
    ref = np.einsum("bhij,bjhe->bihe", ref_w, vr)
    np.testing.assert_allclose(np_(out), ref, atol=1e-5)
    np.testing.assert_allclose(np_(w), ref_w, atol=1e-6)


def test_gradients_finite_with_fully_masked_rows():
    import tensorflow as tf

    if keras.backend.backend() != "tensorflow":
        pytest.skip("gradient check written with tf.GradientTape")
    q = tf.Variable(np.random.randn(1, 2, 1, 4).astype("float32"))
    k = tf.Variable(np.random.randn(1, 3, 1, 4).astype("float32"))
    mask = np.zeros((1, 1, 2, 3), bool)
    mask[..., 0, :2] = True
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(dot_product_attention(q, k, k, mask=mask) ** 2)
    grads = tape.gradient(loss, [q, k])
    for g in grads:
        assert np.all(np.isfinite(g.numpy()))


# Issue 23 (the harness's length-0 check): on TensorFlow the grouped-query
# einsum of empty sequences mixed up its batch axes (InvalidArgumentError:
# "[4,2,0,4] vs. [2,2,4,0]").
@pytest.mark.parametrize("tq,tk", [(0, 0), (0, 3), (3, 0)])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_empty_sequences(tq, tk, groups):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, tq, 4, 8)).astype("float32")
    k = rng.normal(size=(2, tk, groups, 8)).astype("float32")
    v = rng.normal(size=(2, tk, groups, 3)).astype("float32")
    out, w = dot_product_attention(q, k, v, causal=True, return_weights=True)
    assert tuple(out.shape) == (2, tq, 4, 3)
    assert tuple(w.shape) == (2, 4, tq, tk)
    assert np.all(np_(out) == 0)  # nothing to attend to: zeros


@pytest.mark.parametrize(
    "heads, kv_heads, dtype",
    [
        (4, 4, "float32"),
        (4, 2, "float32"),
        (6, 3, "bfloat16"),
        (4, 1, "float16"),
    ],
)
def test_one_query_matches_reference_and_keeps_each_heads_block(
    heads, kv_heads, dtype, monkeypatch
):
    """A decoding step (one query): where the backend takes its products
    as matmuls over every key/value head (`single_query_by_matmul`), only
    each head's own block may reach the result: masks (a batch row with
    nothing to attend), grouped heads, a score function and low precision
    as the dense path."""
    from keras_attention.ops import _backend
    from keras_attention.ops import dense

    calls = []
    original = dense._single_query_scores
    monkeypatch.setattr(
        dense,
        "_single_query_scores",
        lambda *a: calls.append(1) or original(*a),
    )
    rng = np.random.default_rng(3)
    q = rng.normal(size=(2, 1, heads, 8)).astype("float32")
    k = rng.normal(size=(2, 7, kv_heads, 8)).astype("float32")
    v = rng.normal(size=(2, 7, kv_heads, 5)).astype("float32")
    mask = rng.random((2, 1, 1, 7)) > 0.3
    mask[1] = False  # nothing to attend: zeros
    out = dot_product_attention(
        ops.cast(q, dtype),
        ops.cast(k, dtype),
        ops.cast(v, dtype),
        mask=mask,
        score_mod=lambda s, b, h, i, j: s + 0.1 * ops.cast(h - j, s.dtype),
        implementation="dense",
    )
    group = heads // kv_heads
    kr, vr = np.repeat(k, group, 2), np.repeat(v, group, 2)
    scores = np.einsum("bihd,bjhd->bhij", q, kr) / np.sqrt(8)
    scores += 0.1 * (np.arange(heads)[:, None, None] - np.arange(7))
    weights = np_masked_softmax(scores, np.broadcast_to(mask, scores.shape))
    ref = np.einsum("bhij,bjhe->bihe", weights, vr)
    atol = 1e-5 if dtype == "float32" else 3e-2
    np.testing.assert_allclose(np_(out), ref, atol=atol)
    assert np.all(np_(out)[1] == 0)
    assert bool(calls) == _backend.single_query_by_matmul(kv_heads)
