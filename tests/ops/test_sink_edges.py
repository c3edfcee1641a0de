"""Learned sinks at the edges of the float range: a sink logit of `-inf`
is no sink (no NaN), one of `-1e4` leaves the log-sum-exp exact, one of
`+1e4` takes all the mass; on every op-level path, the banded path and
in `merge_attention`, against float64 NumPy (`sink_reference.py`), and
their gradients against the sinks written as a score column (keras ops,
autodiff).

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
B, T, TK, H, G, D, E = 2, 5, 6, 4, 2, 4, 3
SCALE = 1.0 / np.sqrt(D)
RNG = np.random.default_rng(53)
Q = RNG.normal(size=(B, T, H, D)).astype("float32")
K = RNG.normal(size=(B, TK, G, D)).astype("float32")
V = RNG.normal(size=(B, TK, G, E)).astype("float32")
W_OUT = RNG.normal(size=(B, T, H, E)).astype("float32")
W_LSE = RNG.normal(size=(B, H, T)).astype("float32")
# No sink, an ordinary one, one far below the scores, one far above.
EDGES = np.array([-np.inf, 0.7, -1e4, 1e4], "float32")
NO_SINKS = np.full((H,), -np.inf, "float32")
FAR_BELOW = np.array([-1e4, -3e4, -1e5, -1e30], "float32")
SINKS = {"edges": EDGES, "far_below": FAR_BELOW, "no_sinks": NO_SINKS}

KEY_MASK = np.ones((B, TK), bool)
KEY_MASK[0, 2] = False
QUERY_MASK = np.ones((B, T), bool)
QUERY_MASK[1, 3] = False  # An empty row.
MASK = KEY_MASK[:, None, None, :] & QUERY_MASK[:, None, :, None]
CAUSAL = (np.arange(TK)[None, :] <= np.arange(T)[:, None] + 1)[None, None]

PATHS = {
    "dense": ("dense", {}),
    "blockwise": ("blockwise", {}),
    "blockwise_tiles": ("blockwise", dict(query_block=2, key_block=3)),
    "fused": ("fused", {}),
}


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def assert_lse_equal(lse, want, atol=2e-5):
    """Equal lse, infinities included (same sign), and no NaN."""
    lse = np_(lse)
    assert not np.isnan(lse).any(), lse
    np.testing.assert_array_equal(np.isposinf(lse), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(lse[finite], want[finite], atol=atol, rtol=1e-6)


def attend(path, sinks, **kwargs):
    name, options = PATHS[path]
    with ka.ops.implementation_scope(name, **options):
        return ka.ops.dot_product_attention(
            Q, K, V, return_lse=True, sink_logits=sinks, **kwargs
        )


@pytest.mark.parametrize("sinks", sorted(SINKS))
@pytest.mark.parametrize("path", sorted(PATHS))
def test_sinks_at_the_edges_equal_numpy(path, sinks):
    out, lse = attend(
        path, SINKS[sinks], key_mask=KEY_MASK, query_mask=QUERY_MASK
    )
    want_out, want_lse = sink_attention(Q, K, V, MASK, SINKS[sinks])
    assert not np.isnan(np_(out)).any()
    np.testing.assert_allclose(np_(out), want_out, atol=2e-5)
    assert_lse_equal(lse, want_lse)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_a_sink_of_minus_inf_is_no_sink(path):
    kwargs = dict(key_mask=KEY_MASK, query_mask=QUERY_MASK)
    out, lse = attend(path, NO_SINKS, **kwargs)
    plain_out, plain_lse = attend(path, None, **kwargs)
    np.testing.assert_allclose(np_(out), np_(plain_out), atol=1e-6)
    assert_lse_equal(lse, np_(plain_lse).astype("float64"), atol=1e-6)


def test_banded_path_sinks_at_the_edges():
    """The banded path (`MultiHeadAttention(sliding_window=...)`'s) with
    the sinks applied through its lse."""
    request = ka.ops.paths.AttentionRequest(
        Q,
        K[:, :T],
        V[:, :T],
        causal=True,
        key_mask=KEY_MASK[:, :T],
        query_mask=QUERY_MASK,
        window=2,
        same_sequence=True,
        return_lse=True,
        sink_logits=EDGES,
    )
    out, lse = ka.ops.paths.run_path("banded", request)
    mask = band_mask(T, 2, 0) & MASK[..., :T]
    want_out, want_lse = sink_attention(Q, K[:, :T], V[:, :T], mask, EDGES)
    np.testing.assert_allclose(np_(out), want_out, atol=2e-5)
    assert_lse_equal(lse, want_lse)


def column_reference(q, k, v, z):
    """The sinks as a score column (softmax, column dropped), causal with
    offset 1 (no empty row); differentiable by autodiff."""
    k = ops.repeat(k, H // G, axis=2)
    v = ops.repeat(v, H // G, axis=2)
    s = ops.einsum("bihd,bjhd->bhij", q, k) * SCALE
    s = ops.where(ops.convert_to_tensor(CAUSAL), s, -1e9)
    column = ops.broadcast_to(ops.reshape(z, (1, H, 1, 1)), (B, H, T, 1))
    s = ops.concatenate([s, column], axis=-1)
    out = ops.einsum("bhij,bjhe->bihe", ops.softmax(s, axis=-1)[..., :TK], v)
    return out, ops.logsumexp(s, axis=-1)


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
        grads = [a.grad for a in args]
    else:
        import tensorflow as tf

        args = [tf.constant(a) for a in args]
        with tf.GradientTape() as tape:
            tape.watch(args)
            loss, aux = fn(*args)
        grads = tape.gradient(loss, args)
    if BACKEND == "torch":
        aux = [x.detach() for x in aux]
        grads = [g.detach() for g in grads]
    return [np_(x) for x in aux], [np_(g) for g in grads]


@pytest.mark.parametrize("path", sorted(PATHS))
def test_gradients_with_sinks_at_the_edges(path):
    name, options = PATHS[path]

    def fn(q, k, v, z):
        with ka.ops.implementation_scope(name, **options):
            out, lse = ka.ops.dot_product_attention(
                q,
                k,
                v,
                causal=True,
                query_offset=1,
                return_lse=True,
                sink_logits=z,
            )
        return loss_of(out, lse), (out, lse)

    def reference(q, k, v, z):
        out, lse = column_reference(q, k, v, z)
        return loss_of(out, lse), (out, lse)

    (out, lse), grads = value_and_grads(fn, (Q, K, V, EDGES))
    (want_out, want_lse), want_grads = value_and_grads(
        reference, (Q, K, V, EDGES)
    )
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    assert_lse_equal(lse, want_lse.astype("float64"))
    for got, want, label in zip(grads, want_grads, "qkvz"):
        assert np.all(np.isfinite(got)), label
        np.testing.assert_allclose(got, want, atol=5e-5, err_msg=label)


def test_merge_with_sinks_at_the_edges():
    """Parts without sinks over disjoint keys, merged with the sinks:
    equal to NumPy and to one call; gradients finite."""
    outs, lses = [], []
    for a, b in ((0, 2), (2, 6)):
        out, lse = ka.ops.dot_product_attention(
            Q,
            K[:, a:b],
            V[:, a:b],
            key_mask=KEY_MASK[:, a:b],
            query_mask=QUERY_MASK,
            return_lse=True,
        )
        outs.append(out)
        lses.append(lse)
    out, lse = ka.ops.merge_attention(outs, lses, sink_logits=EDGES)
    want_out, want_lse = sink_attention(Q, K, V, MASK, EDGES)
    np.testing.assert_allclose(np_(out), want_out, atol=2e-5)
    assert_lse_equal(lse, want_lse)
    # The sink of -inf everywhere: the merge without sinks.
    out, lse = ka.ops.merge_attention(outs, lses, sink_logits=NO_SINKS)
    want_out, want_lse = sink_attention(Q, K, V, MASK)
    np.testing.assert_allclose(np_(out), want_out, atol=2e-5)
    assert_lse_equal(lse, want_lse)


def test_merge_gradients_into_sinks_of_minus_inf_are_finite():
    def fn(o1, o2, l1, l2, z):
        out, lse = ka.ops.merge_attention([o1, o2], [l1, l2], sink_logits=z)
        return loss_of(out, lse), (out, lse)

    o1, o2 = W_OUT, W_OUT[::-1].copy()
    l1 = RNG.normal(size=(B, H, T)).astype("float32")
    l2 = np.where(np.arange(T) == 1, -np.inf, l1[::-1]).astype("float32")
    (out, lse), grads = value_and_grads(fn, (o1, o2, l1, l2, EDGES))
    for g, label in zip(grads, ("o1", "o2", "l1", "l2", "z")):
        assert np.all(np.isfinite(g)), label
    # No mass on the sink of -inf (head 0), nor on -1e4 (head 2).
    np.testing.assert_array_equal(grads[-1][[0, 2]], 0.0)
    lse_parts = np.logaddexp(l1.astype("float64"), l2)
    want = np.logaddexp(lse_parts, EDGES[None, :, None].astype("float64"))
    assert_lse_equal(lse, want)
