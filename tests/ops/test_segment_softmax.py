"""keras_attention.ops.segment_softmax against NumPy: sums, masks, empty
segments, huge scores, gradients."""

import keras
import numpy as np
from keras import ops

from keras_attention.ops import segment_softmax

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(5)
IDS = np.array([3, 0, 3, 1, 0, 3, 1, 1], "int32")  # segment 2 is empty
SCORES = RNG.normal(size=(len(IDS), 2)).astype("float32")


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def np_segment_softmax(scores, ids, mask=None):
    mask = np.ones(len(ids), bool) if mask is None else mask
    out = np.zeros(scores.shape, "float64")
    for k in np.unique(ids):
        rows = (ids == k) & mask
        if rows.any():
            s = scores[rows].astype("float64")
            e = np.exp(s - s.max(axis=0))
            out[rows] = e / e.sum(axis=0)
    return out


def test_matches_numpy_and_sums_to_one():
    w = np_(segment_softmax(SCORES, IDS, 4))
    np.testing.assert_allclose(w, np_segment_softmax(SCORES, IDS), atol=1e-6)
    sums = np.zeros((4, 2))
    np.add.at(sums, IDS, w)
    np.testing.assert_allclose(sums, [[1, 1], [1, 1], [0, 0], [1, 1]], 1e-6)


def test_mask_and_fully_masked_segment():
    mask = np.array([True, False, False, True, False, True, True, True])
    w = np_(segment_softmax(SCORES, IDS, 4, mask=mask))
    np.testing.assert_allclose(
        w, np_segment_softmax(SCORES, IDS, mask), atol=1e-6
    )
    assert np.all(w[~mask] == 0)  # segment 0 only masked: all zeros


def test_huge_scores_and_float16_inputs_stay_finite():
    scores = np.array([[1e4], [1e4 - 1], [-1e4], [3e4]], "float32")
    w = np_(segment_softmax(scores, np.array([0, 0, 0, 1]), 2))
    assert w.dtype == np.float32 and np.all(np.isfinite(w))
    np.testing.assert_allclose(w[:, 0], [0.7311, 0.2689, 0, 1], atol=1e-4)
    w16 = segment_softmax(SCORES.astype("float16"), IDS, 4)
    assert keras.backend.standardize_dtype(w16.dtype) == "float32"


def test_gradients_are_finite_with_masked_and_empty_segments():
    mask = np.array([True, False, False, True, False, True, True, True])
    upstream = RNG.normal(size=SCORES.shape).astype("float32")

    def loss(scores):
        w = segment_softmax(scores, IDS, 4, mask=mask)
        return ops.sum(w * ops.convert_to_tensor(upstream))

    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.constant(SCORES)
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(x)
        grad = tape.gradient(value, x)
    elif BACKEND == "jax":
        import jax

        grad = jax.grad(loss)(ops.convert_to_tensor(SCORES))
    else:
        import torch

        x = torch.tensor(SCORES, requires_grad=True)
        loss(x).backward()
        grad = x.grad
    grad = np_(grad)
    assert np.all(np.isfinite(grad)) and np.all(grad[~mask] == 0)
    # Softmax Jacobian per segment: w * (g - sum(w * g)).
    w = np_segment_softmax(SCORES, IDS, mask)
    expected = np.zeros_like(w)
    for k in range(4):
        rows = (IDS == k) & mask
        inner = (w[rows] * upstream[rows]).sum(axis=0)
        expected[rows] = w[rows] * (upstream[rows] - inner)
    np.testing.assert_allclose(grad, expected, atol=1e-6)
