"""Every implementation of `dot_product_attention` (dense, blockwise, fused)
against a NumPy reference and against each other: outputs, gradients,
grouped-query attention, structural and dense masks, fully masked rows."""

import functools

import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras import ops
from references import masked_softmax as np_masked_softmax

from keras_attention.layers import MultiHeadAttention
from keras_attention.ops import blockwise
from keras_attention.ops.attention import dot_product_attention
from keras_attention.ops.attention import implementation_scope
from keras_attention.ops.blockwise import _Plan
from keras_attention.ops.blockwise import blockwise_attention
from keras_attention.ops.paths import blockwise_tiles

# "blockwise-recompute": the blockwise path with its backward recomputing
# the probabilities (long sequences) instead of reusing the forward's.
PATHS = ["dense", "blockwise", "blockwise-recompute", "fused"]
RNG = np.random.default_rng(0)


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


@pytest.fixture
def use_path():
    """`use_path(path)` -> the `implementation` name to pass (the
    recomputing blockwise path is forced by an `implementation_scope`
    option for the rest of the test)."""
    scopes = []

    def use(path):
        if path == "blockwise-recompute":
            scope = implementation_scope(None, keep_probabilities=False)
            scope.__enter__()
            scopes.append(scope)
            return "blockwise"
        return path

    yield use
    for scope in scopes:
        scope.__exit__(None, None, None)


def np_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d)) v; q (b,i,h,d), k/v (b,j,g,.), mask
    (b,h,i,j)."""
    h, g = q.shape[2], k.shape[2]
    k = np.repeat(k, h // g, axis=2)
    v = np.repeat(v, h // g, axis=2)
    scores = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    weights = np_masked_softmax(scores, np.broadcast_to(mask, scores.shape))
    return np.einsum("bhij,bjhe->bihe", weights, v)


def inputs(b=2, tq=13, tk=17, h=4, g=2, d=8, e=6):
    q = RNG.normal(size=(b, tq, h, d)).astype("float32")
    k = RNG.normal(size=(b, tk, g, d)).astype("float32")
    v = RNG.normal(size=(b, tk, g, e)).astype("float32")
    return q, k, v


def structural_masks(b, tq, tk, offset, causal):
    """Structural masks and the same mask as a dense (b, 1, i, j) array."""
    key_padding = np.ones((b, tk), bool)
    key_padding[0, -4:] = False
    key_padding[1, :2] = False
    query_padding = np.ones((b, tq), bool)
    query_padding[1, -3:] = False
    dense = key_padding[:, None, None, :] & query_padding[:, None, :, None]
    if causal:
        dense = dense & (
            np.arange(tk)[None, :] <= np.arange(tq)[:, None] + offset
        )
    kwargs = dict(
        is_causal=causal,
        causal_offset=offset,
        key_padding=key_padding,
        query_padding=query_padding,
    )
    return kwargs, dense


@functools.lru_cache(maxsize=None)
def dense_structural(causal, offset):
    """The dense path under `structural_masks(2, 13, 17, offset, causal)`:
    one function per mask, so that JAX compiles its reference values and
    gradients once for every test and path comparing with it."""
    kwargs, _ = structural_masks(2, 13, 17, offset, causal)
    return lambda a, b, c: dot_product_attention(
        a, b, c, implementation="dense", **kwargs
    )


@functools.lru_cache(maxsize=16)
def _jax_value_and_grads(fn):
    """`fn`'s value and gradients, as one jitted JAX function (eager JAX
    compiles every op of both passes for every shape and dtype); cached,
    so that a function shared by several tests compiles once."""
    import jax
    import jax.numpy as jnp

    def loss(*a):
        y = fn(*a)
        y32 = y.astype("float32")
        return jnp.sum(jnp.sin(y32) * y32), y

    return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))


def grads(fn, args, compiled=True):
    """Value of `fn(*args)` and gradients of `sum(sin(fn) * fn)` w.r.t. args
    (on JAX jitted, or eagerly if not `compiled`)."""
    if keras.backend.backend() == "jax":
        import jax
        import jax.numpy as jnp

        if compiled:
            (_, y), g = _jax_value_and_grads(fn)(*args)
            return np_(y), [np_(x) for x in g]

        def loss(*a):
            y = fn(*a).astype("float32")
            return jnp.sum(jnp.sin(y) * y)

        return np_(fn(*args)), [
            np_(x) for x in jax.grad(loss, (0, 1, 2))(*args)
        ]
    if keras.backend.backend() == "torch":
        import torch

        args = [
            ops.convert_to_tensor(a).detach().requires_grad_(True) for a in args
        ]
        y = fn(*args)
        y32 = y.float()
        torch.sum(torch.sin(y32) * y32).backward()
        return np_(y.detach()), [np_(a.grad) for a in args]
    import tensorflow as tf

    args = [tf.constant(a) for a in args]
    with tf.GradientTape() as tape:
        tape.watch(args)
        y = fn(*args)
        y32 = tf.cast(y, "float32")
        loss = tf.reduce_sum(tf.sin(y32) * y32)
    return np_(y), [np_(x) for x in tape.gradient(loss, args)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "causal,offset", [(False, 0), (True, 0), (True, 4), (True, -3)]
)
def test_structural_masks_match_numpy_and_dense_gradients(
    path, causal, offset, use_path
):
    path = use_path(path)
    q, k, v = inputs()
    kwargs, dense = structural_masks(2, 13, 17, offset, causal)

    def run(impl):
        return lambda a, b, c: dot_product_attention(
            a, b, c, implementation=impl, **kwargs
        )

    out, g = grads(run(path), (q, k, v))
    np.testing.assert_allclose(out, np_attention(q, k, v, dense), atol=1e-5)
    ref_out, ref_g = grads(dense_structural(causal, offset), (q, k, v))
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    for got, want in zip(g, ref_g):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_dense_mask_and_grouped_query(path, heads, use_path):
    path = use_path(path)
    h, g = heads
    q, k, v = inputs(h=h, g=g)
    mask = RNG.random((2, h, 13, 17)) > 0.5
    mask[0, 0, 3] = False  # a fully masked row
    out, grad = grads(
        lambda a, b, c: dot_product_attention(
            a, b, c, mask=mask, implementation=path
        ),
        (q, k, v),
    )
    np.testing.assert_allclose(out, np_attention(q, k, v, mask), atol=1e-5)
    np.testing.assert_array_equal(out[0, 3, 0], 0.0)
    _, ref = grads(
        lambda a, b, c: dot_product_attention(
            a, b, c, mask=mask, implementation="dense"
        ),
        (q, k, v),
    )
    for got, want in zip(grad, ref):
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fully_masked_rows_are_zero_with_finite_gradients(
    path, dtype, use_path
):
    path = use_path(path)
    # The shapes of the other tests (their compiled ops reused on JAX).
    q, k, v = (ops.cast(x, dtype) for x in inputs())
    # JAX's fused path in float16 runs eagerly only on CPU: jitted, XLA
    # refuses its F16_F16_F32 dot_general.
    compiled = not (path == "fused" and dtype == "float16")
    key_padding = np.zeros((2, 17), bool)  # no key at all: every row empty
    out, g = grads(
        lambda a, b, c: dot_product_attention(
            a, b, c, key_padding=key_padding, implementation=path
        ),
        (q, k, v),
        compiled,
    )
    np.testing.assert_array_equal(out, 0.0)
    for x in g:
        np.testing.assert_array_equal(x, 0.0)
    # Causal with a negative offset: the first queries see nothing.
    out, g = grads(
        lambda a, b, c: dot_product_attention(
            a, b, c, is_causal=True, causal_offset=-2, implementation=path
        ),
        (q, k, v),
        compiled,
    )
    np.testing.assert_array_equal(out[:, :2], 0.0)
    assert np.all(np.abs(out[:, 2:]) > 0)
    assert all(np.all(np.isfinite(x)) for x in g)


@pytest.mark.parametrize(
    "blocks", [(4, 8), (8, 4), (5, 7), (64, 64)], ids=lambda b: f"{b[0]}x{b[1]}"
)
@pytest.mark.parametrize("offset_kind", ["int", "tensor"])
@pytest.mark.parametrize("keep", [True, False], ids=["kept", "recomputed"])
def test_blockwise_tiles_and_online_softmax(blocks, offset_kind, keep):
    """Several key tiles per row (online softmax), ragged last tiles, causal
    offsets known statically (tiles skipped) or only at run time; one-tile
    rows' probabilities kept for the backward pass or recomputed."""
    # The shapes of the other tests (their compiled ops reused on JAX):
    # 13 queries, 17 keys, tiles that do not divide them.
    q, k, v = inputs()
    kwargs, dense = structural_masks(2, 13, 17, 4, True)
    if offset_kind == "tensor":
        kwargs["causal_offset"] = ops.convert_to_tensor(4)
    qb, kb = blocks
    scale = 1.0 / np.sqrt(q.shape[-1])

    def fn(a, b, c):
        return blockwise_attention(
            a * scale,
            b,
            c,
            query_block=qb,
            key_block=kb,
            keep_probabilities=keep,
            **kwargs,
        )

    out, g = grads(fn, (q, k, v))
    np.testing.assert_allclose(out, np_attention(q, k, v, dense), atol=1e-5)
    _, ref = grads(dense_structural(True, 4), (q, k, v))
    for got, want in zip(g, ref):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_causal_plan_skips_tiles_above_the_diagonal():
    full = _Plan(1024, 1024, False, 0, 128, 128)
    causal = _Plan(1024, 1024, True, 0, 128, 128)

    def pairs(plan):
        return sum(len(chunks) for _, _, chunks in plan.rows)

    assert pairs(full) == 64
    assert pairs(causal) == 36  # (n + 1) n / 2 with n = 8
    masked = sum(c[3] for _, _, chunks in causal.rows for c in chunks)
    assert masked == 8  # only diagonal tiles build a mask
    dynamic = _Plan(1024, 1024, True, ops.convert_to_tensor(0), 128, 128)
    assert pairs(dynamic) == 64


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [1, 8])
@pytest.mark.parametrize("t", [512, 2048, 4096, 32768])
def test_blockwise_tiles_follow_their_rules(t, heads, causal):
    """The rules of `blockwise_tiles` (not its numbers, which are tuned):
    every key in one tile up to the key-tile limit; a query tile within
    the score budget unless at its floor; a causal call keeps at least
    four rows of tiles; at most 128 rows of tiles (tracing time)."""
    from keras_attention.ops import paths as attention_lib

    qb, kb = blockwise_tiles(t, t, heads, causal=causal)
    assert kb == min(t, attention_lib.MAX_KEY_BLOCK)
    kept = blockwise.keeps_probabilities(t * kb, heads)
    budget = (
        attention_lib.KEPT_TILE_ELEMENTS
        if kept
        else attention_lib.TILE_ELEMENTS
    )
    floor = max(64, -(-t // 128))
    assert heads * qb * kb <= budget or qb == floor
    assert -(-t // qb) <= 128
    if causal and t >= 4 * 64:
        assert -(-t // qb) >= 4 or qb == floor
    qs, ks = blockwise_tiles(t, t, heads, sparse=True)
    assert ks < kb or t <= ks  # Smaller key tiles: something to skip.


def test_plan_keeps_probabilities_only_when_asked_or_small():
    plan = _Plan(256, 256, True, 0, 64, 256, heads=2)
    assert plan.keep_probabilities
    assert not _Plan(
        256, 256, True, 0, 64, 256, heads=2, keep_probabilities=False
    ).keep_probabilities
    big = blockwise._KEEP_ELEMENTS + 1
    assert not blockwise.keeps_probabilities(big, 1)


def test_automatic_choice_and_errors():
    q, k, v = inputs()
    out, w = dot_product_attention(q, k, v, return_weights=True)
    assert tuple(w.shape) == (2, 4, 13, 17)
    with pytest.raises(ValueError, match="implementation='sparse'"):
        dot_product_attention(q, k, v, implementation="sparse")
    with pytest.raises(ValueError, match="return_weights=True"):
        dot_product_attention(
            q, k, v, return_weights=True, implementation="blockwise"
        )
    with pytest.raises(ValueError, match="implementation='flash'"):
        with implementation_scope("flash"):
            pass
    with implementation_scope("blockwise"):
        forced = dot_product_attention(q, k, v)
    np.testing.assert_allclose(np_(forced), np_(out), atol=1e-5)


@pytest.mark.tf_only
def test_blockwise_under_jit_compile():
    import tensorflow as tf

    q, k, v = inputs()
    kwargs, dense = structural_masks(2, 13, 17, 0, True)

    @tf.function(jit_compile=True)
    def step(a, b, c):
        with tf.GradientTape() as tape:
            tape.watch([a, b, c])
            y = dot_product_attention(
                a, b, c, implementation="blockwise", **kwargs
            )
            loss = tf.reduce_sum(y * y)
        return y, tape.gradient(loss, [a, b, c])

    y, g = step(q, k, v)
    np.testing.assert_allclose(
        y.numpy(), np_attention(q, k, v, dense), atol=1e-5
    )
    assert all(np.all(np.isfinite(x.numpy())) for x in g)


def test_layer_paths_agree_with_keras_masks_and_causal():
    layer = MultiHeadAttention(num_heads=4, key_dim=8, num_key_value_heads=2)
    x = RNG.normal(size=(2, 11, 16)).astype("float32")
    mask = np.ones((2, 11), bool)
    mask[1, 7:] = False
    results = {}
    for path in ("dense", "blockwise", "fused"):
        with implementation_scope(path):
            results[path] = np_(
                layer(
                    x, x, query_mask=mask, value_mask=mask, use_causal_mask=True
                )
            )
    np.testing.assert_allclose(
        results["blockwise"], results["dense"], atol=1e-5
    )
    np.testing.assert_allclose(results["fused"], results["dense"], atol=1e-5)


def test_harness_on_the_blockwise_path():
    q = RNG.normal(size=(2, 9, 8)).astype("float32")
    with implementation_scope("blockwise"):
        run_layer_test(
            MultiHeadAttention,
            dict(num_heads=2, key_dim=4, num_key_value_heads=1),
            dict(query=q, value=q),
            call_kwargs=dict(use_causal_mask=True),
            expected_output_shape=(2, 9, 8),
            expected_num_trainable_weights=8,
        )
