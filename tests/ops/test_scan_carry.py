"""`keras_attention.ops.scan_carry`: a scan whose outputs are its carry
(on TensorFlow a bounded `tf.while_loop`, so XLA can differentiate it)."""

import keras
import numpy as np
import pytest

from keras_attention.ops import scan_carry


def _body(carry, x):
    h, total = carry
    h = keras.ops.tanh(h * 0.5 + x)
    new = (h, total + keras.ops.sum(h, axis=-1))
    return new, new


def _numpy_scan(h, xs):
    total = np.zeros(h.shape[0], "float32")
    hs, totals = [], []
    for x in xs:
        h = np.tanh(h * 0.5 + x)
        total = total + h.sum(-1)
        hs.append(h)
        totals.append(total)
    return (h, total), (np.stack(hs), np.stack(totals))


def test_scan_carry_matches_a_python_loop():
    rng = np.random.default_rng(0)
    h0 = rng.normal(size=(2, 3)).astype("float32")
    xs = rng.normal(size=(4, 2, 3)).astype("float32")
    init = (h0, np.zeros(2, "float32"))
    (h, total), (hs, totals) = scan_carry(_body, init, xs)
    (want_h, want_total), (want_hs, want_totals) = _numpy_scan(h0, xs)
    np.testing.assert_allclose(h, want_h, atol=1e-6)
    np.testing.assert_allclose(total, want_total, atol=1e-5)
    np.testing.assert_allclose(hs, want_hs, atol=1e-6)
    np.testing.assert_allclose(totals, want_totals, atol=1e-5)


@pytest.mark.tf_only
@pytest.mark.parametrize("unrolled", [True, False])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_tensorflow_loop_unrolled_or_while_and_gradients(
    unrolled, jit_compile, monkeypatch
):
    """Short static loops are unrolled, others are a `tf.while_loop`: both
    give the same values and gradients (against a NumPy finite difference
    of the loop) inside `tf.function`, with XLA too; an unknown step count
    runs as a while loop."""
    import tensorflow as tf

    from keras_attention.ops import _backend

    if not unrolled:
        monkeypatch.setattr(_backend, "_UNROLL_MAX_STEPS", 0)
    rng = np.random.default_rng(1)
    h0 = rng.normal(size=(2, 3)).astype("float32")
    xs = rng.normal(size=(5, 2, 3)).astype("float32")

    @tf.function(jit_compile=jit_compile)
    def run(h0, xs):
        with tf.GradientTape() as tape:
            tape.watch([h0, xs])
            (h, total), (hs, _) = scan_carry(
                _body, (h0, tf.zeros((2,), "float32")), xs
            )
            loss = tf.reduce_sum(hs**2) + tf.reduce_sum(total)
        return (h, hs, loss), tape.gradient(loss, [h0, xs])

    (h, hs, loss), (dh0, dxs) = run(tf.constant(h0), tf.constant(xs))
    graph = run.get_concrete_function(
        tf.TensorSpec(h0.shape), tf.TensorSpec(xs.shape)
    ).graph
    loops = [op for op in graph.get_operations() if op.type == "StatelessWhile"]
    loops += [op for op in graph.get_operations() if op.type == "While"]
    assert bool(loops) == (not unrolled)
    (want_h, _), (want_hs, _) = _numpy_scan(h0, xs)
    np.testing.assert_allclose(h.numpy(), want_h, atol=1e-6)
    np.testing.assert_allclose(hs.numpy(), want_hs, atol=1e-6)

    def np_loss(h0, xs):
        (_, total), (hs, _) = _numpy_scan(h0.astype("float64"), xs)
        return float((hs**2).sum() + total.sum())

    eps = 1e-3
    for i in [(0, 0), (1, 2)]:
        up, down = h0.copy(), h0.copy()
        up[i] += eps
        down[i] -= eps
        fd = (np_loss(up, xs) - np_loss(down, xs)) / (2 * eps)
        np.testing.assert_allclose(dh0.numpy()[i], fd, rtol=1e-2, atol=1e-3)
    assert np.all(np.isfinite(dxs.numpy()))

    # Unknown number of steps: a while loop whatever the limit.
    dynamic = tf.function(
        lambda h0, xs: scan_carry(_body, (h0, tf.zeros((2,), "float32")), xs)[
            0
        ][0]
    )
    concrete = dynamic.get_concrete_function(
        tf.TensorSpec(h0.shape), tf.TensorSpec((None, 2, 3))
    )
    kinds = {op.type for op in concrete.graph.get_operations()}
    assert kinds & {"While", "StatelessWhile"}
    np.testing.assert_allclose(
        concrete(tf.constant(h0), tf.constant(xs)).numpy(), want_h, atol=1e-6
    )


def test_scan_carry_of_zero_steps():
    # Found by the layer properties (issue 23): on PyTorch keras.ops.scan
    # cannot stack no step ("Must provide at least one structure"), so an
    # AttentionRNNDecoder on a target of 0 steps crashed.
    h0 = np.ones((2, 3), "float32")
    init = (h0, np.zeros(2, "float32"))
    (h, total), (hs, totals) = scan_carry(
        _body, init, np.zeros((0, 2, 3), "float32")
    )
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(h), h0)
    assert tuple(hs.shape) == (0, 2, 3) and tuple(totals.shape) == (0, 2)
