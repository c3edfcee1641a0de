"""`local_attention(..., sink_logits=...)`: learned sinks on the banded
path, applied through its log-sum-exp; output, banded weights and lse
equal to float64 NumPy (`sink_reference.py`: a softmax over the window's
scores and one sink logit per head), whatever the block size, with a
score function too; gradients equal to the dense path's under the
window's mask.

Shapes are fixed for the whole module (JAX compiles per shape).
"""

import keras
import numpy as np
import pytest
from keras import ops
from sink_reference import band_mask
from sink_reference import sink_attention

import keras_attention as ka

BACKEND = keras.backend.backend()
B, T, H, G, D, E = 2, 9, 4, 2, 4, 3
RNG = np.random.default_rng(11)
Q = RNG.normal(size=(B, T, H, D)).astype("float32")
K = RNG.normal(size=(B, T, G, D)).astype("float32")
V = RNG.normal(size=(B, T, G, E)).astype("float32")
W_OUT = RNG.normal(size=(B, T, H, E)).astype("float32")
W_LSE = RNG.normal(size=(B, H, T)).astype("float32")
SINKS = {
    "plain": RNG.normal(size=(H,)).astype("float32"),
    "edges": np.array([-np.inf, 0.7, -1e4, 1e4], "float32"),
}
KEY_MASK = np.ones((B, T), bool)
KEY_MASK[0, 3] = False
QUERY_MASK = np.ones((B, T), bool)
QUERY_MASK[1, 4] = False  # An empty row.
MASK = KEY_MASK[:, None, None, :] & QUERY_MASK[:, None, :, None]
# name -> (window_size, causal, (left, right)).
WINDOWS = {"causal": (2, True, (2, 0)), "two_sided": ((2, 1), False, (2, 1))}


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def assert_lse_equal(lse, want):
    lse = np_(lse)
    assert not np.isnan(lse).any()
    np.testing.assert_array_equal(np.isposinf(lse), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(lse[finite], want[finite], atol=2e-5, rtol=1e-6)


@pytest.mark.parametrize("block_size", [None, 2])
@pytest.mark.parametrize("sinks", sorted(SINKS))
@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_local_attention_with_sinks_equals_numpy(window, sinks, block_size):
    size, causal, (left, right) = WINDOWS[window]
    out, banded, lse = ka.ops.local_attention(
        Q,
        K,
        V,
        size,
        causal=causal,
        key_mask=KEY_MASK,
        query_mask=QUERY_MASK,
        block_size=block_size,
        return_weights=True,
        return_lse=True,
        sink_logits=SINKS[sinks],
    )
    mask = band_mask(T, left, right) & MASK
    want_out, want_lse, want_weights = sink_attention(
        Q, K, V, mask, SINKS[sinks], return_weights=True
    )
    np.testing.assert_allclose(np_(out), want_out, atol=2e-5)
    dense = ka.ops.banded_to_dense(banded, (left, right))
    np.testing.assert_allclose(np_(dense), want_weights, atol=2e-5)
    assert_lse_equal(lse, want_lse)
    # The output alone (the banded kernel's fast path without sinks).
    alone = ka.ops.local_attention(
        Q,
        K,
        V,
        size,
        causal=causal,
        key_mask=KEY_MASK,
        query_mask=QUERY_MASK,
        block_size=block_size,
        sink_logits=SINKS[sinks],
    )
    np.testing.assert_allclose(np_(alone), want_out, atol=2e-5)


def _head_bias(score, batch, head, q_idx, kv_idx):
    return score + 0.25 * ops.cast(head, score.dtype)


def test_local_attention_with_sinks_and_a_score_function():
    out, lse = ka.ops.local_attention(
        Q,
        K,
        V,
        2,
        causal=True,
        key_mask=KEY_MASK,
        score_mod=_head_bias,
        return_lse=True,
        sink_logits=SINKS["plain"],
    )
    want_out, want_lse = ka.ops.dot_product_attention(
        Q,
        K,
        V,
        attention_mask=band_mask(T, 2, 0),
        key_mask=KEY_MASK,
        score_mod=_head_bias,
        return_lse=True,
        sink_logits=SINKS["plain"],
        implementation="dense",
    )
    np.testing.assert_allclose(np_(out), np_(want_out), atol=2e-5)
    assert_lse_equal(lse, np_(want_lse).astype("float64"))


def loss_of(out, lse):
    finite = ops.logical_not(ops.isinf(lse))
    lse = ops.where(finite, lse, 0.0)
    return ops.sum(ops.multiply(out, W_OUT)) + ops.sum(ops.multiply(lse, W_LSE))


def value_and_grads(fn, args):
    """`fn(*args) -> (loss, aux)`: `(aux, gradients)` as NumPy."""
    if BACKEND == "jax":
        import jax

        grad = jax.value_and_grad(fn, tuple(range(len(args))), has_aux=True)
        (_, aux), grads = jax.jit(grad)(*args)
    elif BACKEND == "torch":
        import torch

        args = [torch.tensor(a, requires_grad=True) for a in args]
        loss, aux = fn(*args)
        loss.backward()
        aux = [x.detach() for x in aux]
        grads = [a.grad for a in args]
    else:
        import tensorflow as tf

        args = [tf.constant(a) for a in args]
        with tf.GradientTape() as tape:
            tape.watch(args)
            loss, aux = fn(*args)
        grads = tape.gradient(loss, args)
    return [np_(x) for x in aux], [np_(g) for g in grads]


def test_gradients_equal_the_dense_path_under_the_window():
    def banded(q, k, v, z):
        out, lse = ka.ops.local_attention(
            q, k, v, 2, causal=True, key_mask=KEY_MASK, query_mask=QUERY_MASK,
            return_lse=True, sink_logits=z,
        )  # fmt: skip
        return loss_of(out, lse), (out, lse)

    def dense(q, k, v, z):
        out, lse = ka.ops.dot_product_attention(
            q, k, v, attention_mask=band_mask(T, 2, 0), key_mask=KEY_MASK,
            query_mask=QUERY_MASK, return_lse=True, sink_logits=z,
            implementation="dense",
        )  # fmt: skip
        return loss_of(out, lse), (out, lse)

    args = (Q, K, V, SINKS["edges"])
    (out, lse), grads = value_and_grads(banded, args)
    (want_out, want_lse), want_grads = value_and_grads(dense, args)
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    assert_lse_equal(lse, want_lse.astype("float64"))
    for got, want, label in zip(grads, want_grads, "qkvz"):
        assert np.all(np.isfinite(got)), label
        np.testing.assert_allclose(got, want, atol=5e-5, err_msg=label)


def test_sink_logits_of_another_shape_are_refused():
    with pytest.raises(ValueError, match=r"sink_logits\.shape=\(3,\)"):
        ka.ops.local_attention(Q, K, V, 2, sink_logits=SINKS["plain"][:3])


def test_an_empty_sequence_with_sinks():
    out, lse = ka.ops.local_attention(
        Q[:, :0], K[:, :0], V[:, :0], 2, return_lse=True,
        sink_logits=SINKS["plain"],
    )  # fmt: skip
    assert tuple(out.shape) == (B, 0, H, E)
    assert tuple(lse.shape) == (B, H, 0)
