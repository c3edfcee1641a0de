import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.ops.additive import additive_scores
from keras_attention.ops.window_gather import gather_windows
from keras_attention.ops.window_gather import scatter_windows
from keras_attention.ops.window_gather import window_indices

RNG = np.random.default_rng(7)
Q = RNG.normal(size=(2, 7, 5)).astype("float32")
K = RNG.normal(size=(2, 6, 5)).astype("float32")
V = RNG.normal(size=(5,)).astype("float32")
G = RNG.normal(size=(2, 7, 6)).astype("float32")  # upstream gradient


def np_(x):
    return ops.convert_to_numpy(x)


def np_scores_and_grads(q, k, v, g):
    """e_ij = v . tanh(q_i + k_j) and the gradients of sum(g * e)."""
    t = np.tanh(q[:, :, None] + k[:, None])  # b i j u
    dt = g[..., None] * v * (1 - t**2)
    return t @ v, dt.sum(2), dt.sum(1), np.einsum("bij,biju->u", g, t)


def value_and_grads(fn, q, k, v, g):
    if keras.backend.backend() == "jax":
        import jax

        def loss(q, k, v):
            s = fn(q, k, v)
            return (s * g).sum(), s

        (_, s), grads = jax.value_and_grad(
            loss, argnums=(0, 1, 2), has_aux=True
        )(q, k, v)
        return [s, *grads]
    if keras.backend.backend() == "torch":
        import torch

        q, k, v = (
            ops.convert_to_tensor(x).requires_grad_(True) for x in (q, k, v)
        )
        s = fn(q, k, v)
        loss = ops.sum(s * ops.convert_to_tensor(g))
        return [s.detach(), *torch.autograd.grad(loss, [q, k, v])]
    import tensorflow as tf

    q, k, v = (tf.convert_to_tensor(x) for x in (q, k, v))
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        s = fn(q, k, v)
        loss = tf.reduce_sum(s * g)
    return [s, *tape.gradient(loss, [q, k, v])]


@pytest.mark.parametrize("max_chunk_elements", [None, 1, 60, 150])
def test_chunked_scores_and_gradients_match_reference(max_chunk_elements):
    # 60 -> 1 query per chunk (7 chunks), 150 -> 2 per chunk (padded last).
    got = value_and_grads(
        lambda q, k, v: additive_scores(q, k, v, max_chunk_elements), Q, K, V, G
    )
    for a, e in zip(got, np_scores_and_grads(Q, K, V, G)):
        np.testing.assert_allclose(np_(a), e, atol=1e-5)


@pytest.mark.tf_only
@pytest.mark.parametrize("jit_compile", [False, True])
def test_dynamic_shapes_in_tf_function(jit_compile):
    import tensorflow as tf

    spec = [
        tf.TensorSpec((None, None, 5)),
        tf.TensorSpec((None, None, 5)),
        tf.TensorSpec((5,)),
        tf.TensorSpec((None, None, None)),
    ]

    @tf.function(input_signature=spec, jit_compile=jit_compile)
    def run(q, k, v, g):
        return value_and_grads(
            lambda q, k, v: additive_scores(q, k, v, 60), q, k, v, g
        )

    for cut in (7, 4):
        got = run(Q[:, :cut], K, V, G[:, :cut])
        for a, e in zip(got, np_scores_and_grads(Q[:, :cut], K, V, G[:, :cut])):
            np.testing.assert_allclose(np_(a), e, atol=1e-5)


def test_window_gather_and_scatter():
    x = RNG.normal(size=(2, 6, 3)).astype("float32")
    start = np.array([[-2, 0, 3], [4, 1, 5]], "int32")
    positions, clipped, in_range = (np_(t) for t in window_indices(start, 3, 6))
    np.testing.assert_array_equal(positions, start[..., None] + np.arange(3))
    np.testing.assert_array_equal(in_range, (positions >= 0) & (positions < 6))
    gathered = np_(gather_windows(x, clipped))
    for b in range(2):
        for i in range(3):
            np.testing.assert_allclose(
                gathered[b, i], x[b, np.clip(positions[b, i], 0, 5)]
            )
    w = RNG.uniform(size=(2, 3, 3)).astype("float32") * in_range
    dense = np_(scatter_windows(w, start, 6))
    expected = np.zeros((2, 3, 6), "float32")
    for b, i, s in np.ndindex(2, 3, 3):
        if in_range[b, i, s]:
            expected[b, i, positions[b, i, s]] = w[b, i, s]
    np.testing.assert_allclose(dense, expected)
