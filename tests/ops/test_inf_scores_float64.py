"""Score functions that mask with `-inf`, and float64 computed in float64.

- A score function returning `-inf` (FlexAttention's way to mask) on
  whole key tiles, on whole rows, and with a mask function: every path
  (dense, blockwise with several tilings given as options, the banded
  path of local attention) equals NumPy, rows left with no finite score
  are empty (zero result, finite gradients), and the gradients equal
  those of the same rule given as a mask on the dense path.

Small shapes: eager JAX compiles every op for every new shape and
dtype.
- float64 inputs and float64 layers: results equal a float64 NumPy
  reference to 1e-12 on every path (dense, blockwise, fused, banded,
  global-local), and the layers' input gradients equal central finite
  differences (eps 1e-6) to 1e-8 (float32 scores or softmax are off by
  1e-3 .. 0.3 there).
"""

import functools

import keras
import numpy as np
import pytest
import references
from harness import float64_enabled
from keras import ops
from references import masked_softmax as np_masked_softmax

import keras_attention as ka
from keras_attention.ops.attention import dot_product_attention
from keras_attention.ops.attention import implementation_scope

BACKEND = keras.backend.backend()
NEG_INF = float("-inf")
RNG = np.random.default_rng(36)
B, T, TK, H, G, D = 2, 16, 20, 4, 2, 4

# (implementation, options): the blockwise path under several tilings
# (none pinned: results must not depend on them): rows of several key
# tiles (online softmax) and rows of one, with kept and recomputed
# probabilities; query tiles that do not divide the T queries, and
# T != TK keys (not self-attention).
PATHS = [
    ("dense", {}),
    ("blockwise", dict(query_block=4, key_block=4)),
    ("blockwise", dict(query_block=8, key_block=8, keep_probabilities=False)),
    ("blockwise", dict(query_block=3, key_block=TK)),
    ("blockwise", dict(query_block=5, key_block=TK, keep_probabilities=False)),
]
PATH_IDS = ["dense", "tiles4", "tiles8-recompute", "one-tile", "one-recompute"]


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


@pytest.fixture
def x64():
    with float64_enabled():
        yield


def value_and_grads(fn, args, dtype="float32"):
    """`fn(*args)` and the gradients of `sum(sin(y) * y)` w.r.t. `args`."""
    if BACKEND == "jax":
        import jax
        import jax.numpy as jnp

        def loss(*a):
            y = fn(*a)
            return jnp.sum(jnp.sin(y) * y), y

        # One compiled call (eager JAX compiles every op for every shape).
        grad = jax.grad(loss, tuple(range(len(args))), has_aux=True)
        grads, y = jax.jit(grad)(*args)
        return np_(y), [np_(g) for g in grads]
    if BACKEND == "torch":
        import torch

        args = [torch.tensor(a, requires_grad=True) for a in args]
        y = fn(*args)
        torch.sum(torch.sin(y) * y).backward()
        return np_(y.detach()), [np_(a.grad) for a in args]
    import tensorflow as tf

    args = [tf.constant(a) for a in args]
    with tf.GradientTape() as tape:
        tape.watch(args)
        y = fn(*args)
        loss = tf.reduce_sum(tf.sin(y) * y)
    return np_(y), [np_(g) for g in tape.gradient(loss, args)]


def inputs(dtype="float32", tk=TK, rng=RNG):
    """Queries `(B, T, H, D)`; keys and values `(B, tk, G, D)`."""
    q = rng.normal(size=(B, T, H, D)).astype(dtype)
    k = rng.normal(size=(B, tk, G, D)).astype(dtype)
    v = rng.normal(size=(B, tk, G, D)).astype(dtype)
    return q, k, v


@functools.lru_cache(maxsize=None)
def shared_inputs(dtype="float32", tk=TK):
    """`inputs(dtype, tk)` drawn once (its own seed) for every
    parametrization of a test, so that the dense path's reference
    gradients are computed (on JAX: compiled) once, not once per path."""
    return inputs(dtype, tk, rng=np.random.default_rng(3636))


def np_attention(q, k, v, allowed):
    """softmax(q k^T / sqrt(d)) v over the `allowed` pairs `(b|1, h|1,
    i, j)`, in float64; rows with no allowed key get zeros."""
    r = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
    scores = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    weights = np_masked_softmax(scores, np.broadcast_to(allowed, scores.shape))
    return np.einsum("bhij,bjhe->bihe", weights, v.astype("float64"))


# Rules on (batch, query, key) positions: NumPy, as a score function
# returning -inf where they are False, and as a mask function.


def ahead(b, qi, kj):
    """Keys `i <= j <= i + 4`, except for query 3 of every example and
    the last 2 queries of example 1, which see nothing: whole key tiles
    left of the diagonal are -inf (the tiles the online softmax starts
    from) and so are those far right of it."""
    empty = (qi == 3) | ((b == 1) & (qi >= T - 2))
    return (kj >= qi) & (kj <= qi + 4) & ~empty


def causal(b, qi, kj):
    return kj <= qi + 0 * b


def band(b, qi, kj):
    return abs(qi - kj) <= 3 + 0 * b


def as_score_mod(rule):
    def score_mod(score, batch, head, q_idx, kv_idx):
        return ops.where(rule(batch, q_idx, kv_idx), score, NEG_INF)

    return score_mod


def as_mask_mod(rule):
    def mask_mod(batch, head, q_idx, kv_idx):
        return rule(batch, q_idx, kv_idx)

    return mask_mod


def np_rule(rule, tk=TK):
    b = np.arange(B)[:, None, None, None]
    return rule(b, np.arange(T)[:, None], np.arange(tk)[None, :])


def dense_with_mask(rule, **kwargs):
    """The rule as a mask on the dense path (right before the fixes):
    the reference gradients of a score function returning -inf."""

    def attend(q, k, v):
        with implementation_scope("dense"):
            return dot_product_attention(
                q, k, v, mask_mod=as_mask_mod(rule), **kwargs
            )

    return attend


@functools.lru_cache(maxsize=None)
def dense_reference(rule, tk=TK):
    """`value_and_grads` of `dense_with_mask(rule)` on `shared_inputs`,
    once per rule."""
    return value_and_grads(dense_with_mask(rule), shared_inputs(tk=tk))


@pytest.mark.parametrize("path,options", PATHS, ids=PATH_IDS)
def test_minus_inf_scores_equal_numpy_with_finite_gradients(path, options):
    q, k, v = shared_inputs()

    def attend(q, k, v):
        with implementation_scope(path, **options):
            return dot_product_attention(q, k, v, score_mod=as_score_mod(ahead))

    out, grads = value_and_grads(attend, (q, k, v))
    assert np.isfinite(out).all(), f"{np.isnan(out).sum()} NaN"
    np.testing.assert_allclose(
        out, np_attention(q, k, v, np_rule(ahead)), atol=2e-5
    )
    _, want = dense_reference(ahead)
    for got, expected in zip(grads, want):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, expected, atol=2e-5)


@pytest.mark.parametrize("path,options", PATHS, ids=PATH_IDS)
def test_minus_inf_scores_with_a_mask_function(path, options):
    """-inf tiles next to tiles a static mask function skips: the causal
    mask with a score function keeping only the 3 latest keys."""
    q, k, v = inputs()

    def recent(b, qi, kj):
        return qi - kj < 3 + 0 * b

    with implementation_scope(path, **options):
        out = dot_product_attention(
            q,
            k,
            v,
            mask_mod=ka.mods.CausalMask(),
            score_mod=as_score_mod(recent),
        )
    out = np_(out)
    allowed = np_rule(recent) & np_rule(causal)
    assert np.isfinite(out).all(), f"{np.isnan(out).sum()} NaN"
    np.testing.assert_allclose(out, np_attention(q, k, v, allowed), atol=2e-5)


def ahead_in_band(b, qi, kj):
    return ahead(b, qi, kj) & band(b, qi, kj)


@pytest.mark.parametrize("chunk_blocks", [None, 1])
def test_minus_inf_scores_on_the_banded_path(chunk_blocks):
    """`local_attention` (window 3) with a score function emptying rows."""
    q, k, v = shared_inputs(tk=T)

    def attend(q, k, v):
        return ka.ops.local_attention(
            q,
            k,
            v,
            window_size=3,
            block_size=4,
            chunk_blocks=chunk_blocks,
            score_mod=as_score_mod(ahead),
        )

    out, grads = value_and_grads(attend, (q, k, v))
    allowed = np_rule(ahead, T) & np_rule(band, T)
    assert np.isfinite(out).all(), f"{np.isnan(out).sum()} NaN"
    np.testing.assert_allclose(out, np_attention(q, k, v, allowed), atol=2e-5)
    _, want = dense_reference(ahead_in_band, T)
    for got, expected in zip(grads, want):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, expected, atol=2e-5)


# float64 ---------------------------------------------------------------------


FLOAT64_PATHS = PATHS + [("fused", {})]
FLOAT64_IDS = PATH_IDS + ["fused"]
FLOAT64_KEY_MASK = np.ones((B, TK), bool)
FLOAT64_KEY_MASK[1, :5] = False  # rows of example 1 left empty


def float64_dense(q, k, v):
    with implementation_scope("dense"):
        return dot_product_attention(
            q, k, v, causal=True, key_mask=FLOAT64_KEY_MASK
        )


@functools.lru_cache(maxsize=None)
def float64_dense_reference():
    """`value_and_grads(float64_dense)` on the float64 `shared_inputs`, once
    for every path (called with float64 enabled)."""
    return value_and_grads(float64_dense, shared_inputs("float64"))


@pytest.mark.parametrize("path,options", FLOAT64_PATHS, ids=FLOAT64_IDS)
def test_float64_inputs_compute_in_float64(x64, path, options):
    """Causal, with key padding that leaves rows of example 1 empty."""
    q, k, v = shared_inputs("float64")
    key_mask = FLOAT64_KEY_MASK

    def attend(q, k, v):
        with implementation_scope(path, **options):
            return dot_product_attention(
                q, k, v, causal=True, key_mask=key_mask
            )

    out, grads = value_and_grads(attend, (q, k, v))
    allowed = key_mask[:, None, None, :] & np_rule(causal)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, np_attention(q, k, v, allowed), atol=1e-12)
    # The gradients of the dense path in float64 (float32 scores on the
    # blockwise backward pass: 1e-7 apart).
    if path != "dense":
        _, want = float64_dense_reference()
        for got, expected in zip(grads, want):
            assert got.dtype == np.float64
            np.testing.assert_allclose(got, expected, atol=1e-11)


def test_float64_local_and_global_local_attention(x64):
    """The banded path (its hand-written backward pass too: the
    gradients of the dense path with the band as a mask) and the global
    tokens, in float64."""
    q, k, v = inputs("float64", tk=T)

    def local(q, k, v):
        return ka.ops.local_attention(q, k, v, window_size=3, block_size=4)

    out, grads = value_and_grads(local, (q, k, v))
    assert out.dtype == np.float64
    np.testing.assert_allclose(
        out, np_attention(q, k, v, np_rule(band, T)), atol=1e-12
    )
    _, want = value_and_grads(dense_with_mask(band), (q, k, v))
    for got, expected in zip(grads, want):
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, expected, atol=1e-11)
    is_global = np.zeros((B, T), bool)
    is_global[:, 0] = True
    is_global[1, 9] = True
    out = np_(
        ka.ops.global_local_attention(
            q, k, v, window_size=3, global_mask=is_global, block_size=4
        )
    )
    g = is_global[:, None, :, None] | is_global[:, None, None, :]
    assert out.dtype == np.float64
    np.testing.assert_allclose(
        out, np_attention(q, k, v, np_rule(band, T) | g), atol=1e-12
    )


def test_float64_segment_softmax(x64):
    scores = RNG.normal(size=(7, 2)) * 1e-3
    ids = np.array([0, 0, 1, 1, 1, 3, 3])
    got = np_(ka.ops.segment_softmax(scores, ids, num_segments=4))
    assert got.dtype == np.float64
    for k in range(4):
        rows = ids == k
        if rows.any():
            e = np.exp(scores[rows] - scores[rows].max(0))
            np.testing.assert_allclose(got[rows], e / e.sum(0), atol=1e-15)


def test_float64_masked_softmax_and_fill_value(x64):
    scores = RNG.normal(size=(2, 5)) * 1e-3
    mask = np.array([[True] * 3 + [False] * 2, [False] * 5])
    got = np_(ka.ops.masked_softmax(scores, mask))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np_masked_softmax(scores, mask), atol=1e-15)
    # Scores beyond float32's range are scores, not -inf (fill values by
    # dtype: float64's is -9e307).
    scores = np.array([[-1e300, -1e300 - 1e290, -1e300]])
    got = np_(ka.ops.masked_softmax(scores, np.array([[True, True, False]])))
    np.testing.assert_array_equal(got, [[1.0, 0.0, 0.0]])


# float64 layers: input gradients against central finite differences.


def input_gradient(fn, x, weights):
    """The gradient of `sum(fn(x) * weights)` w.r.t. `x`."""

    def loss_of(y):
        return ops.sum(y * ops.convert_to_tensor(weights))

    if BACKEND == "jax":
        import jax

        return np_(jax.jit(jax.grad(lambda a: loss_of(fn(a))))(x))
    if BACKEND == "torch":
        import torch

        x = torch.tensor(x, requires_grad=True)
        loss_of(fn(x)).backward()
        return np_(x.grad)
    import tensorflow as tf

    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = loss_of(fn(x))
    return np_(tape.gradient(loss, x))


def check_finite_differences(fn, x, eps=1e-6, atol=1e-8, directions=2):
    """`fn`'s output is float64 and its input gradient equals central
    finite differences along random directions `u`: `grad . u` against
    `(f(x + eps u) - f(x - eps u)) / (2 eps)` (float32 scores or softmax
    are 1e-3 .. 0.3 off there; float64: about 1e-10)."""
    y = np_(fn(x))
    assert y.dtype == np.float64, y.dtype
    rng = np.random.default_rng(1)
    weights = rng.normal(size=y.shape)
    grad = input_gradient(fn, x, weights)
    for _ in range(directions):
        u = rng.normal(size=x.shape)
        up = np.sum(np_(fn(x + eps * u)) * weights)
        down = np.sum(np_(fn(x - eps * u)) * weights)
        np.testing.assert_allclose(
            np.sum(grad * u), (up - down) / (2 * eps), rtol=0, atol=atol
        )


def test_float64_multi_head_attention_gradient(x64):
    x = RNG.normal(size=(1, 5, 6))
    layer = ka.layers.MultiHeadAttention(
        num_heads=2, key_dim=3, dtype="float64"
    )
    mask = np.tril(np.ones((1, 5, 5), bool))
    check_finite_differences(lambda a: layer(a, a, attention_mask=mask), x)


@pytest.mark.parametrize("version,form", [("v1", "edges"), ("v2", "dense")])
def test_float64_graph_attention_gradient(x64, version, form):
    """Both versions and both call forms (an edge list: the segment
    softmax and sums; a dense adjacency: the masked softmax)."""
    x = RNG.normal(size=(4, 3))
    senders = np.array([0, 1, 2, 3, 1], "int32")
    receivers = np.array([1, 2, 0, 0, 0], "int32")
    edges = (senders, receivers)
    if form == "dense":
        edges = np.zeros((4, 4), bool)
        edges[receivers, senders] = True
    layer = ka.layers.GraphAttention(
        num_heads=2, units_per_head=2, version=version, dtype="float64"
    )
    check_finite_differences(lambda a: layer(a, edges=edges), x)


def test_float64_local_self_attention_gradient(x64):
    x = RNG.normal(size=(1, 6, 4))
    layer = ka.layers.LocalSelfAttention(
        num_heads=2, key_dim=2, window_size=2, dtype="float64"
    )
    check_finite_differences(layer, x)


def test_float64_luong_dot_gradient(x64):
    """The dot score on a local-m window (gathered windows, positions)."""
    query = RNG.normal(size=(1, 3, 4))
    value = RNG.normal(size=(1, 5, 4))
    luong = ka.layers.LuongAttention(
        "dot", alignment="local-m", window=1, dtype="float64"
    )
    check_finite_differences(lambda a: luong(a, value), query)


@pytest.mark.tf_only(
    "Keras's own type promotion maps float64 to float32 off TensorFlow "
    "(`keras.backend.result_type('float64', 'float64')` is 'float32' on "
    "JAX and torch: BIT64_TO_BIT32_DTYPE in keras/src/backend/common/"
    "dtypes.py), so `ops.matmul` (hence `Dense`) on torch and `ops.tanh` "
    "on JAX, which these layers' projections use, compute float64 in "
    "float32"
)
def test_float64_dense_based_layers(x64):
    """AttentionPooling, Bahdanau and Luong (general, concat, local-p):
    finite differences and float64 NumPy references."""
    query = RNG.normal(size=(1, 3, 4))
    value = RNG.normal(size=(1, 5, 4))
    pool = ka.layers.AttentionPooling(units=3, dtype="float64")
    check_finite_differences(pool, value)
    bahdanau = ka.layers.BahdanauAttention(3, normalize=True, dtype="float64")
    check_finite_differences(lambda a: bahdanau(a, value), query)
    for mode, alignment in (
        ("general", "global"),
        ("concat", "global"),
        ("general", "local-p"),
    ):
        luong = ka.layers.LuongAttention(
            mode,
            units=3 if mode == "concat" else None,
            alignment=alignment,
            window=None if alignment == "global" else 2,
            dtype="float64",
        )
        check_finite_differences(lambda a: luong(a, value), query)
    mask = np.ones((1, 5), bool)
    want, _ = references.bahdanau(
        bahdanau, query, value, mask, np.ones((1, 3), bool)
    )
    np.testing.assert_allclose(np_(bahdanau(query, value)), want, atol=1e-12)
    np.testing.assert_allclose(
        np_(pool(value)),
        references.attention_pooling(pool, value, mask)[0],
        atol=1e-12,
    )
