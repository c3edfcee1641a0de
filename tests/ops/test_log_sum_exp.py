"""`dot_product_attention(..., return_lse=True, sink_logits=...)` and
`merge_attention`: outputs, log-sum-exps and gradients (through both
outputs and into the sinks) on every path, against NumPy (forward) and
against the sinks written as keras-hub's gpt-oss does them (an extra
score column, softmax, column dropped; gradients by autodiff).

Shapes are fixed for the whole module (JAX compiles per shape); each case
runs its forward and gradient as one compiled program on JAX.
"""

import functools

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka

BACKEND = keras.backend.backend()
B, T, TK, H, G, D, E = 2, 6, 7, 4, 2, 4, 3
SCALE = 1.0 / np.sqrt(D)
RNG = np.random.default_rng(2024)
Q = RNG.normal(size=(B, T, H, D)).astype("float32")
K = RNG.normal(size=(B, TK, G, D)).astype("float32")
V = RNG.normal(size=(B, TK, G, E)).astype("float32")
SINKS = np.array([0.5, -1.0, 2.0, 0.0], "float32")
W_OUT = RNG.normal(size=(B, T, H, E)).astype("float32")
W_LSE = RNG.normal(size=(B, H, T)).astype("float32")

KEY_MASK = np.ones((B, TK), bool)
KEY_MASK[1, :] = False  # Example 1 attends to nothing.
KEY_MASK[0, 2] = False
QUERY_MASK = np.ones((B, T), bool)
QUERY_MASK[0, 4] = False
DENSE_MASK = RNG.random((B, 1, T, TK)) < 0.6
DENSE_MASK[0, 0, 3, :] = False  # An empty row.


def _first_queries_see_nothing(score, batch, head, q_idx, kv_idx):
    return ops.where(q_idx < 2, float("-inf"), score)


# name -> (op keyword arguments, the dense NumPy mask (b|1, 1, i, j)).
def _causal_mask(offset):
    i = np.arange(T)[:, None] + offset
    return (np.arange(TK)[None, :] <= i)[None, None]


CASES = {
    "causal": (dict(causal=True, query_offset=1), _causal_mask(1)),
    "padded": (
        dict(key_mask=KEY_MASK, query_mask=QUERY_MASK),
        KEY_MASK[:, None, None, :] & QUERY_MASK[:, None, :, None],
    ),
    "dense_mask": (dict(attention_mask=DENSE_MASK), DENSE_MASK),
    "score_mod": (
        dict(score_mod=_first_queries_see_nothing),
        np.broadcast_to(np.arange(T)[:, None] >= 2, (T, TK))[None, None],
    ),
}
# Every case without and with sinks would double the compiled programs:
# the first two cases run both ways, the others with sinks.
CASE_SINKS = [
    ("causal", False),
    ("causal", True),
    ("padded", False),
    ("padded", True),
    ("dense_mask", True),
    ("score_mod", True),
]
# path name -> implementation_scope arguments (blockwise: one key tile
# per row, and small tiles that run the online softmax).
PATHS = {
    "dense": ("dense", {}),
    "blockwise": ("blockwise", {}),
    "blockwise_tiles": ("blockwise", dict(query_block=4, key_block=3)),
    "fused": ("fused", {}),
}


def numpy_attention(q, k, v, mask, sinks=None):
    """Output `(b, i, h, e)` and lse `(b, h, i)` as the module docstring
    of `log_sum_exp.py` defines them, in float64."""
    r = H // G
    k = np.repeat(k.astype("float64"), r, axis=2)
    v = np.repeat(v.astype("float64"), r, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q.astype("float64"), k) * SCALE
    s = np.where(np.broadcast_to(mask, s.shape), s, -np.inf)
    if sinks is not None:
        column = np.broadcast_to(sinks[None, :, None, None], s.shape[:3] + (1,))
        s = np.concatenate([s, column], axis=-1)
    m = s.max(-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    total = np.exp(s - m_safe).sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, m_safe + np.log(total), -np.inf)
    p = np.where(total > 0, np.exp(s - m_safe) / np.maximum(total, 1e-300), 0)
    out = np.einsum("bhij,bjhe->bihe", p[..., : k.shape[1]], v)
    return out, lse[..., 0]


def hub_style(q, k, v, mask, sinks=None):
    """The sinks as keras-hub's `GptOssAttention` computes them (a score
    column, softmax, column dropped), masked rows zeroed; in keras ops,
    so that autodiff gives the reference gradients. Returns the output
    and the lse (0 on rows that attend to nothing)."""
    r = H // G
    k = ops.repeat(k, r, axis=2)
    v = ops.repeat(v, r, axis=2)
    s = ops.einsum("bihd,bjhd->bhij", q, k) * SCALE
    full = ops.broadcast_to(ops.convert_to_tensor(mask), ops.shape(s))
    s = ops.where(full, s, -1e9)
    if sinks is not None:
        column = ops.broadcast_to(
            ops.reshape(sinks, (1, H, 1, 1)), (B, H, T, 1)
        )
        s = ops.concatenate([s, column], axis=-1)
        full = ops.concatenate([full, ops.ones((B, H, T, 1), "bool")], -1)
    p = ops.softmax(s, axis=-1)
    valid = ops.any(full, axis=-1, keepdims=True)
    p = ops.where(valid, p, 0.0)
    m = ops.max(s, axis=-1, keepdims=True)
    lse = m + ops.log(ops.sum(ops.exp(s - m), axis=-1, keepdims=True))
    lse = ops.where(valid, lse, 0.0)[..., 0]
    out = ops.einsum("bhij,bjhe->bihe", p[..., :TK], v)
    return out, lse


def loss_of(out, lse):
    """A loss reading both outputs (the lse on its finite rows only)."""
    finite = ops.logical_not(ops.isinf(lse))
    lse = ops.where(finite, lse, 0.0)
    return ops.sum(ops.multiply(out, W_OUT)) + ops.sum(ops.multiply(lse, W_LSE))


def value_and_grads(fn, args):
    """`fn(*args) -> (loss, aux)`: `(aux, gradients w.r.t. args)`, as NumPy
    (one compiled program on JAX)."""
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

    def to_np(x):
        if x is None:  # No gradient (an argument the loss does not read).
            return None
        if BACKEND == "torch":
            x = x.detach()
        return ops.convert_to_numpy(x)

    return [to_np(x) for x in aux], [to_np(g) for g in grads]


@functools.lru_cache(maxsize=None)
def reference_grads(case, sinks):
    mask = CASES[case][1]

    def fn(q, k, v, z):
        out, lse = hub_style(q, k, v, mask, z if sinks else None)
        return loss_of(out, lse), (out, lse)

    return value_and_grads(fn, (Q, K, V, SINKS))[1]


@pytest.mark.parametrize("case,sinks", CASE_SINKS)
@pytest.mark.parametrize("path", sorted(PATHS))
def test_lse_sinks_and_gradients_on_every_path(path, case, sinks):
    kwargs, mask = CASES[case]
    name, options = PATHS[path]
    if name == "fused" and "score_mod" in kwargs:
        pytest.skip("the fused path takes no score function (refused)")

    def fn(q, k, v, z):
        with ka.ops.implementation_scope(name, **options):
            out, lse = ka.ops.dot_product_attention(
                q,
                k,
                v,
                return_lse=True,
                sink_logits=z if sinks else None,
                **kwargs,
            )
        return loss_of(out, lse), (out, lse)

    (out, lse), grads = value_and_grads(fn, (Q, K, V, SINKS))
    want_out, want_lse = numpy_attention(
        Q, K, V, mask, SINKS if sinks else None
    )
    assert lse.dtype == np.float32 and lse.shape == (B, H, T)
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], atol=2e-5)
    assert np.all(lse[~finite] == -np.inf)
    for got, want, label in zip(grads, reference_grads(case, sinks), "qkvz"):
        if label == "z" and not sinks:  # No sinks: no gradient.
            assert got is None or not np.any(got)
            continue
        np.testing.assert_allclose(got, want, atol=5e-5, err_msg=label)


def test_an_empty_row_with_sinks_gives_zeros_and_the_sink_logit():
    out, lse = ka.ops.dot_product_attention(
        Q, K, V, key_mask=KEY_MASK, sink_logits=SINKS, return_lse=True
    )
    np.testing.assert_array_equal(ops.convert_to_numpy(out)[1], 0.0)
    lse = ops.convert_to_numpy(lse)
    np.testing.assert_allclose(lse[1], np.broadcast_to(SINKS[:, None], (H, T)))


def test_weights_with_sinks_sum_to_one_minus_the_sink_share():
    out, weights, lse = ka.ops.dot_product_attention(
        Q,
        K,
        V,
        causal=True,
        sink_logits=SINKS,
        return_weights=True,
        return_lse=True,
    )
    weights, lse = ops.convert_to_numpy(weights), ops.convert_to_numpy(lse)
    sink_share = np.exp(SINKS[None, :, None] - lse)
    np.testing.assert_allclose(weights.sum(-1) + sink_share, 1.0, atol=1e-5)
    want, _ = numpy_attention(Q, K, V, _causal_mask(0), SINKS)
    np.testing.assert_allclose(ops.convert_to_numpy(out), want, atol=2e-5)


@pytest.mark.parametrize("sinks", [False, True])
def test_banded_path_lse_and_sinks(sinks):
    """`local_attention(..., return_lse=True)` (the banded path) and the
    sinks applied through it, against NumPy with the window's mask."""
    window = 2
    keys, values = K[:, :T], V[:, :T]  # Self-attention lengths.
    request = ka.ops.paths.AttentionRequest(
        Q,
        keys,
        values,
        causal=True,
        key_mask=KEY_MASK[:, :T],
        window=window,
        same_sequence=True,
        return_lse=True,
        sink_logits=SINKS if sinks else None,
    )
    out, lse = ka.ops.paths.run_path("banded", request)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    mask = ((j <= i) & (j >= i - window))[None, None]
    mask = mask & KEY_MASK[:, None, None, :T]
    want_out, want_lse = numpy_attention(
        Q, keys, values, mask, SINKS if sinks else None
    )
    np.testing.assert_allclose(ops.convert_to_numpy(out), want_out, atol=2e-5)
    lse = ops.convert_to_numpy(lse)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], atol=2e-5)


# Merging ------------------------------------------------------------------

SPLITS = {
    "halves": [(0, 3), (3, 7)],
    "three": [(0, 2), (2, 3), (3, 7)],
}


@pytest.mark.parametrize("split", sorted(SPLITS))
@pytest.mark.parametrize("case", ["causal", "padded"])
def test_merge_equals_one_call_over_all_keys(split, case):
    """Parts over disjoint key ranges (a part may leave rows empty; with
    padding, example 1 is empty in every part), merged, equal one call:
    outputs, lse and gradients; sinks given once to the merge."""
    kwargs, _ = CASES[case]

    def parts(q, k, v):
        outs, lses = [], []
        for a, b in SPLITS[split]:
            part = dict(kwargs)
            if "key_mask" in part:
                part["key_mask"] = part["key_mask"][:, a:b]
            if part.get("causal"):
                # Keys a..b-1: query i sees key j <= i + offset - a.
                part["query_offset"] = part["query_offset"] - a
            out, lse = ka.ops.dot_product_attention(
                q, k[:, a:b], v[:, a:b], return_lse=True, **part
            )
            outs.append(out)
            lses.append(lse)
        return outs, lses

    def merged(q, k, v, z):
        out, lse = ka.ops.merge_attention(*parts(q, k, v), sink_logits=z)
        return loss_of(out, lse), (out, lse)

    def whole(q, k, v, z):
        out, lse = ka.ops.dot_product_attention(
            q, k, v, return_lse=True, sink_logits=z, **kwargs
        )
        return loss_of(out, lse), (out, lse)

    (out, lse), grads = value_and_grads(merged, (Q, K, V, SINKS))
    (want_out, want_lse), want_grads = value_and_grads(whole, (Q, K, V, SINKS))
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], atol=2e-5)
    for got, want in zip(grads, want_grads):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=5e-5)


def test_merge_of_parts_that_are_all_empty():
    empty = np.full((B, H, T), -np.inf, "float32")
    zeros = np.zeros((B, T, H, E), "float32")
    out, lse = ka.ops.merge_attention([zeros, zeros + 1.0], [empty, empty])
    np.testing.assert_array_equal(ops.convert_to_numpy(out), 0.0)
    assert np.all(ops.convert_to_numpy(lse) == -np.inf)


def test_merge_and_sinks_refuse_bad_arguments():
    with pytest.raises(ValueError, match=r"len\(outputs\)=2, len\(lses\)=1"):
        ka.ops.merge_attention([W_OUT, W_OUT], [W_LSE])
    with pytest.raises(ValueError, match=r"sink_logits.shape=\(3,\)"):
        ka.ops.dot_product_attention(Q, K, V, sink_logits=SINKS[:3])


def test_lse_of_empty_sequences():
    out, lse = ka.ops.dot_product_attention(
        Q, K[:, :0], V[:, :0], return_lse=True, sink_logits=SINKS
    )
    np.testing.assert_array_equal(ops.convert_to_numpy(out), 0.0)
    lse = ops.convert_to_numpy(lse)
    np.testing.assert_allclose(lse, np.broadcast_to(SINKS[:, None], (B, H, T)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_inputs_give_a_float32_lse(dtype):
    out, lse = ka.ops.dot_product_attention(
        ops.cast(Q * 30.0, dtype),
        ops.cast(K * 30.0, dtype),
        ops.cast(V, dtype),
        return_lse=True,
        sink_logits=SINKS,
        implementation="dense",
    )
    assert ops.convert_to_numpy(lse).dtype == np.float32
    assert np.all(np.isfinite(ops.convert_to_numpy(lse)))
    assert keras.backend.standardize_dtype(out.dtype) == dtype
