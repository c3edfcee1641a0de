"""Banded local attention (`keras_attention.ops.sliding_window`) against
the dense masked computation and an independent NumPy reference."""

import keras
import numpy as np
import pytest
from keras import ops
from references import masked_softmax as np_masked_softmax

from keras_attention.masks import sliding_window_mask
from keras_attention.ops.attention import dot_product_attention
from keras_attention.ops.global_local import global_local_attention
from keras_attention.ops.sliding_window import banded_to_dense
from keras_attention.ops.sliding_window import dense_to_banded
from keras_attention.ops.sliding_window import effective_window
from keras_attention.ops.sliding_window import local_attention

BACKEND = keras.backend.backend()


def _np(x):
    return ops.convert_to_numpy(x)


def _compiled(fn, *args):
    """Runs `fn(*args)` eagerly on TensorFlow and under `jax.jit` on JAX
    (one compilation instead of one per op and shape: much faster)."""
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)(*args)
    return fn(*args)


def _window(t, left, right):
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    return (j >= i - left) & (j <= i + right)


def _bounds(window, causal):
    left, right = window if isinstance(window, tuple) else (window, window)
    return left, 0 if causal else right


def _np_local(q, k, v, left, right, valid):
    """softmax over the window, from the formula (no package code)."""
    h, g = q.shape[2], k.shape[2]
    k, v = np.repeat(k, h // g, axis=2), np.repeat(v, h // g, axis=2)
    scores = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    mask = _window(q.shape[1], left, right)[None, None]
    mask = mask & valid[:, None, :, None] & valid[:, None, None, :]
    weights = np_masked_softmax(scores, mask)
    return np.einsum("bhij,bjhe->bihe", weights, v), weights


def _inputs(t, heads=2, groups=2, batch=2, seed=0, padded=2):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, t, heads, 4)).astype("float32")
    k = rng.normal(size=(batch, t, groups, 4)).astype("float32")
    v = rng.normal(size=(batch, t, groups, 3)).astype("float32")
    valid = np.ones((batch, t), bool)
    valid[-1, max(t - padded, 0) :] = False  # last example: padded tail
    return q, k, v, valid


# (T, window_size, causal, block_size, kv heads): T not a multiple of the
# block, T smaller than the window, one-sided and zero windows, GQA.
GRID = [
    (1, 3, False, None, 2),
    (5, 9, False, None, 2),
    (5, 9, True, 4, 1),
    (13, (3, 1), False, 4, 1),
    (17, 2, True, 4, 2),
    (33, (0, 4), False, 8, 2),
    (40, 0, False, 16, 1),
    (37, (7, 5), False, 3, 2),
    (64, 8, False, 16, 2),
]


@pytest.mark.parametrize("t,window,causal,block,groups", GRID)
def test_matches_reference_and_dense(t, window, causal, block, groups):
    q, k, v, valid = _inputs(t, groups=groups)
    mask = _window(t, *_bounds(window, causal))[None, None]
    mask = mask & valid[:, None, :, None] & valid[:, None, None, :]

    def run(q, k, v, valid, mask):
        out, banded = local_attention(
            q,
            k,
            v,
            window,
            causal,
            query_mask=valid,
            key_mask=valid,
            block_size=block,
            return_weights=True,
        )
        dense_out = dot_product_attention(q, k, v, mask=mask)
        return out, banded, banded_to_dense(banded, window, causal), dense_out

    out, banded, dense_w, dense_out = _compiled(run, q, k, v, valid, mask)
    left, right = _bounds(window, causal)
    ref_out, ref_w = _np_local(q, k, v, left, right, valid)
    np.testing.assert_allclose(_np(out), ref_out, atol=1e-5)
    np.testing.assert_allclose(_np(dense_w), ref_w, atol=1e-6)
    # The window is capped at the sequence (issue 23, item 12).
    assert banded.shape[-1] == min(left, t - 1) + min(right, t - 1) + 1
    np.testing.assert_allclose(_np(out), _np(dense_out), atol=1e-5)


def test_fully_padded_rows_are_zero():
    q, k, v, valid = _inputs(11, padded=11)  # last example entirely padded

    def run(q, k, v, valid):
        out, banded = local_attention(
            q,
            k,
            v,
            3,
            query_mask=valid,
            key_mask=valid,
            block_size=4,
            return_weights=True,
        )
        # Keys all padded but queries valid: zero rows as well.
        keys_only = local_attention(q, k, v, 3, key_mask=valid, block_size=4)
        return out, banded, keys_only

    out, banded, keys_only = (_np(x) for x in _compiled(run, q, k, v, valid))
    assert np.all(np.isfinite(out)) and np.all(out[-1] == 0)
    assert np.all(banded[-1] == 0)
    assert np.all(keys_only[-1] == 0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_padded_rows_finite(dtype):
    q, k, v, valid = _inputs(9, padded=9)
    q, k, v = (ops.cast(x * 30, dtype) for x in (q, k, v))
    out = _compiled(
        lambda q, k, v, valid: local_attention(
            q, k, v, (2, 1), query_mask=valid, key_mask=valid
        ),
        q,
        k,
        v,
        valid,
    )
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    out = _np(ops.cast(out, "float32"))
    assert np.all(np.isfinite(out)) and np.all(out[-1] == 0)


def test_attention_mask_combines_with_window():
    t = 14
    q, k, v, valid = _inputs(t)
    rng = np.random.default_rng(3)
    for shape in [(t, t), (2, t, t), (2, 2, t, t), (1, 1, t, t)]:
        extra = rng.random(shape) > 0.3
        as_4d = extra[:, None] if extra.ndim == 3 else extra  # (b, h, i, j)
        full = _window(t, 2, 3)[None, None] & as_4d

        def run(q, k, v, extra, full):
            return (
                local_attention(
                    q, k, v, (2, 3), attention_mask=extra, block_size=4
                ),
                dot_product_attention(q, k, v, mask=full),
            )

        out, expected = _compiled(run, q, k, v, extra, full)
        np.testing.assert_allclose(_np(out), _np(expected), atol=1e-5)


def test_block_size_does_not_change_results():
    q, k, v, valid = _inputs(29)

    def run(q, k, v, valid):
        return [
            local_attention(
                q, k, v, 5, query_mask=valid, key_mask=valid, block_size=b
            )
            for b in (1, 2, 7, 16, 64)
        ]

    outs = [_np(o) for o in _compiled(run, q, k, v, valid)]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], atol=1e-5)


def test_banded_dense_round_trip():
    rng = np.random.default_rng(1)
    t, left, right = 9, 2, 3
    dense = rng.normal(size=(2, 3, t, t)).astype("float32")
    inside = np.where(_window(t, left, right), dense, 0.0)
    banded = _np(dense_to_banded(dense, (left, right)))
    for i in range(t):
        for kk in range(left + right + 1):
            j = i - left + kk
            expected = dense[..., i, j] if 0 <= j < t else 0.0
            np.testing.assert_array_equal(banded[..., i, kk], expected)
    np.testing.assert_array_equal(
        _np(banded_to_dense(banded, (left, right))), inside
    )


def test_bad_arguments():
    q, k, v, _ = _inputs(6)
    with pytest.raises(ValueError, match="block_size=0"):
        local_attention(q, k, v, 2, block_size=0)
    with pytest.raises(ValueError, match="window_size"):
        local_attention(q, k, v, -1)
    with pytest.raises(ValueError, match="window_size"):
        local_attention(q, k, v, (1, 2, 3))
    with pytest.raises(ValueError, match="weights.shape"):
        banded_to_dense(np.zeros((6, 4), "float32"), 2)


def _grads(fn, args):
    """Gradients of sum(fn(*args) * cotangent) w.r.t. args."""
    q, v = args[0], args[2]
    shape = q.shape[:3] + v.shape[-1:]  # (b, t, h, e)
    cot = np.random.default_rng(7).normal(size=shape).astype("float32")
    if BACKEND == "jax":
        import jax

        grad = jax.grad(
            lambda *a: (fn(*a) * cot).sum(), argnums=tuple(range(len(args)))
        )
        return [np.asarray(g) for g in jax.jit(grad)(*args)]
    if BACKEND == "torch":
        import torch

        args = [
            keras.ops.convert_to_tensor(a).requires_grad_(True) for a in args
        ]
        loss = keras.ops.sum(fn(*args) * keras.ops.convert_to_tensor(cot))
        grads = torch.autograd.grad(loss, args)
        return [keras.ops.convert_to_numpy(g) for g in grads]
    import tensorflow as tf

    args = [tf.Variable(a) for a in args]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(fn(*args) * cot)
    return [g.numpy() for g in tape.gradient(loss, args)]


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize(
    "window,causal,groups", [(3, False, 2), ((4, 1), True, 1)]
)
def test_gradients_match_dense(window, causal, groups, chunked):
    # chunked: one block per chunk (several chunks, run one by one).
    chunk_blocks = 1 if chunked else None
    t = 19
    q, k, v, valid = _inputs(
        t, groups=groups, padded=19
    )  # one fully padded row
    mask = np.asarray(sliding_window_mask(t, window, causal))[:, None]
    mask = mask & valid[:, None, :, None] & valid[:, None, None, :]

    def local(q, k, v):
        return local_attention(
            q,
            k,
            v,
            window,
            causal,
            query_mask=valid,
            key_mask=valid,
            block_size=4,
            chunk_blocks=chunk_blocks,
        )

    def dense(q, k, v):
        return dot_product_attention(q, k, v, attention_mask=mask)

    np.testing.assert_allclose(
        ops.convert_to_numpy(local(q, k, v)),
        ops.convert_to_numpy(dense(q, k, v)),
        atol=1e-5,
    )
    for a, b in zip(_grads(local, [q, k, v]), _grads(dense, [q, k, v])):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.tf_only
def test_no_quadratic_tensor_and_dynamic_length():
    """Forward and backward graphs hold no tensor of T x T elements (here
    T = 512, window 4), and one graph traced with an unknown length serves
    any length."""
    import tensorflow as tf

    t = 512

    def loss_and_grads(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(local_attention(q, k, v, 4, block_size=8) ** 2)
        return loss, tape.gradient(loss, [q, k, v])

    static = tf.TensorSpec((1, t, 1, 4), tf.float32)
    graph = (
        tf.function(loss_and_grads)
        .get_concrete_function(static, static, static)
        .graph
    )
    largest = 0
    for op in graph.get_operations():
        for out in op.outputs:
            dims = out.shape.as_list() if out.shape.rank is not None else [None]
            assert None not in dims, (op.name, out.shape)
            largest = max(largest, int(np.prod(dims)))
    assert t * 4 <= largest < t * t // 8, largest

    dynamic = tf.TensorSpec((1, None, 1, 4), tf.float32)
    fn = tf.function(loss_and_grads, input_signature=[dynamic] * 3)
    x = np.random.default_rng(0).normal(size=(1, 700, 1, 4)).astype("float32")
    for other in (1, 3, 700):
        y = x[:, :other]
        loss, grads = fn(y, y, y)
        expected = local_attention(y, y, y, 4, block_size=8)
        np.testing.assert_allclose(
            loss.numpy(), np.sum(_np(expected) ** 2), rtol=1e-5
        )
        assert all(np.all(np.isfinite(g.numpy())) for g in grads)


# Issue 23, item 12: the window is capped at the sequence inside the ops,
# so a huge window costs O(T^2) at most (it was O(T * window)).
@pytest.mark.parametrize("causal", [False, True])
def test_huge_window_is_capped_at_the_sequence(causal):
    q, k, v, valid = _inputs(5)
    assert effective_window(10**9, 5, causal) == (4, 0 if causal else 4)
    assert effective_window((10**9, 1), None) == (10**9, 1)
    assert effective_window(3, 0) == (0, 0)
    out, banded = local_attention(
        q, k, v, 10**9, causal, key_mask=valid, return_weights=True
    )
    want, want_banded = local_attention(
        q, k, v, 4, causal, key_mask=valid, return_weights=True
    )
    assert tuple(banded.shape) == (2, 2, 5, 5 if causal else 9)
    np.testing.assert_allclose(_np(out), _np(want), atol=1e-6)
    np.testing.assert_allclose(_np(banded), _np(want_banded), atol=1e-6)
    dense = banded_to_dense(banded, 10**9, causal)
    np.testing.assert_allclose(
        _np(dense), _np(banded_to_dense(want_banded, 4, causal)), atol=1e-6
    )
    again = dense_to_banded(dense, 10**9, causal)
    np.testing.assert_allclose(_np(again), _np(banded), atol=1e-6)


def test_empty_sequence():
    q, k, v, valid = _inputs(0)
    out, banded = local_attention(q, k, v, 3, return_weights=True)
    assert tuple(out.shape) == (2, 0, 2, 3)
    assert tuple(banded.shape) == (2, 2, 0, 1)
    out, weights = global_local_attention(
        q, k, v, 3, np.zeros((2, 0), bool), max_global=2, return_weights=True
    )
    assert tuple(out.shape) == (2, 0, 2, 3)
    assert {k: tuple(w.shape) for k, w in weights.items()} == {
        "local": (2, 2, 0, 1),
        "global_keys": (2, 2, 0, 2),
        "global_queries": (2, 2, 2, 0),
        "global_indices": (2, 2),
    }


def test_block_larger_than_the_sequence_is_capped():
    # Found by the layer properties (issue 23): block_size=10**6 on T=2
    # built a (10**6, 10**6 + 1) band mask with NumPy before any op ran.
    q, k, v, valid = _inputs(3)
    got = local_attention(q, k, v, 1, key_mask=valid, block_size=10**6)
    want = local_attention(q, k, v, 1, key_mask=valid, block_size=3)
    np.testing.assert_allclose(_np(got), _np(want), atol=1e-6)
