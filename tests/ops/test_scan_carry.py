"""`keras_attention.ops.scan_carry`: a scan whose outputs are its carry
(on TensorFlow a bounded `tf.while_loop`, so XLA can differentiate it)."""

import keras
import numpy as np

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
