"""Score functions returning `-inf`, and float64 inputs, under Hypothesis.

Draws: sequence lengths (queries at the end of a longer key sequence: a
cache offset), heads and key/value heads, `causal=`, the blockwise
path's tuning (tile sizes, whether the backward pass keeps the
probabilities), and

- a score function returning `-inf` on a random pattern of rectangles of
  positions (their sizes drawn: they straddle the tiles or cover whole
  ones) and on random whole rows, optionally with a mask function;
- float64 inputs with key padding and optionally a float64 score
  function (a distance bias), on the dense, blockwise, fused and (for
  self-attention) banded paths.

Properties:

- every path equals a NumPy reference of the rule (a row left without a
  finite score gets zeros), never NaN; the blockwise input gradients
  are finite and equal the dense path's, whatever the tiles;
- float64 results equal a float64 NumPy reference to 1e-10 (float32
  scores or softmax are 1e-7 off), in float64.

Cost: small shapes; on JAX (every op compiles for every new shape) a
third of the profile's draws, at least 3, each call and its gradient
compiled once (`jax.jit`).
"""

import functools

import keras
import numpy as np
from harness import float64_enabled
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

import keras_attention as ka
from keras_attention import mods
from keras_attention.ops import attention as attention_lib

BACKEND = keras.backend.backend()
DRAWS = settings(
    max_examples=max(
        3, settings.default.max_examples // (3 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)
D = 4
NEG_INF = float("-inf")


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def np_attention(q, k, v, scores_fn, allowed):
    """softmax over the `allowed` pairs of `scores_fn(q k^T / sqrt(d))`,
    float64; rows with no allowed key get zeros."""
    r = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    s = scores_fn(s.astype("float64"))
    mask = np.broadcast_to(allowed, s.shape)
    s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.where(mask, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    total = e.sum(-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return np.einsum("bhij,bjhe->bihe", w, v.astype("float64"))


@st.composite
def shapes(draw, max_length=20):
    batch = draw(st.sampled_from([1, 2]))
    kv_heads = draw(st.sampled_from([1, 2]))
    heads = kv_heads * draw(st.sampled_from([1, 2]))
    tk = draw(st.integers(1, max_length))
    tq = draw(st.integers(1, tk))
    return dict(
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        tq=tq,
        tk=tk,
        offset=tk - tq,  # the queries are the last `tq` positions
        causal=draw(st.booleans()),
        tiles=(draw(st.integers(1, 12)), draw(st.integers(1, 12))),
        keep=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def qkv(p, dtype):
    rng = np.random.default_rng(p["seed"])
    q = rng.normal(size=(p["batch"], p["tq"], p["heads"], D))
    k = rng.normal(size=(p["batch"], p["tk"], p["kv_heads"], D))
    v = rng.normal(size=(p["batch"], p["tk"], p["kv_heads"], D))
    return tuple(x.astype(dtype) for x in (q, k, v))


def positions(p):
    """Absolute query positions `(tq, 1)` and key positions `(1, tk)`."""
    q_pos = (p["offset"] + np.arange(p["tq"]))[:, None]
    return q_pos, np.arange(p["tk"])[None, :]


def options(p, path):
    if path != "blockwise":
        return {}
    return dict(
        query_block=p["tiles"][0],
        key_block=p["tiles"][1],
        keep_probabilities=p["keep"],
    )


# -inf on random tiles --------------------------------------------------------


@st.composite
def minus_inf_problems(draw):
    p = draw(shapes())
    rng = np.random.default_rng(p["seed"] + 1)
    tk = p["tk"]
    # -inf on rectangles of `a` queries x `c` keys (absolute positions),
    # each with probability `density`; and on whole rows.
    a, c = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    density = draw(st.sampled_from([0.3, 0.6, 0.9]))
    cells = rng.random((-(-tk // a), -(-tk // c))) < density
    rows = rng.random((p["batch"], tk)) < draw(st.sampled_from([0.0, 0.2]))
    p.update(cells=cells, cell=(a, c), rows=rows)
    p["window"] = draw(st.sampled_from([None, 2, 6]))  # a mask function
    return p


def minus_inf_score_mod(p):
    a, c = p["cell"]
    cells = p["cells"].astype("float32").reshape(-1)
    columns = p["cells"].shape[1]
    rows = p["rows"].astype("float32").reshape(-1)
    tk = p["tk"]

    def score_mod(score, batch, head, q_idx, kv_idx):
        cell = (q_idx // a) * columns + kv_idx // c
        hidden = ops.take(ops.convert_to_tensor(cells), cell) > 0.5
        row = ops.take(ops.convert_to_tensor(rows), batch * tk + q_idx)
        hidden = ops.logical_or(hidden, row > 0.5)
        return ops.where(hidden, NEG_INF, score)

    return score_mod


def minus_inf_allowed(p):
    """`(b, 1, i, j)`: True where the score is finite and allowed."""
    q_pos, k_pos = positions(p)
    a, c = p["cell"]
    hidden = p["cells"][q_pos // a, k_pos // c][None]
    hidden = hidden | p["rows"][:, p["offset"] :, None]
    allowed = ~hidden
    if p["causal"]:
        allowed = allowed & (k_pos <= q_pos)
    if p["window"] is not None:
        allowed = allowed & (np.abs(q_pos - k_pos) <= p["window"])
    return allowed[:, None]


def attend_minus_inf(p, path, q, k, v):
    window = p["window"]
    with attention_lib.implementation_scope(path, **options(p, path)):
        return attention_lib.dot_product_attention(
            q,
            k,
            v,
            causal=p["causal"],
            query_offset=p["offset"],
            score_mod=minus_inf_score_mod(p),
            mask_mod=None if window is None else mods.SlidingWindowMask(window),
        )


def _value_and_gradients(fn, args):
    """`fn(*args)` and the gradients of sum(out * sin(out)) w.r.t. `args`
    (on JAX one `jax.jit` of both: eager JAX compiles every op for each
    drawn shape, one compiled function per draw is several times
    cheaper)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        args = [tf.constant(a) for a in args]
        with tf.GradientTape() as tape:
            tape.watch(args)
            out = fn(*args)
            loss = tf.reduce_sum(out * tf.sin(out))
        grads = tape.gradient(
            loss, args, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        return np_(out), [np_(g) for g in grads]
    if BACKEND == "jax":
        import jax
        import jax.numpy as jnp

        def loss(*a):
            out = fn(*a)
            return jnp.sum(out * jnp.sin(out)), out

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))
        grads, out = grad(*args)
        return np_(out), [np_(g) for g in grads]
    import torch

    args = [torch.tensor(a, requires_grad=True) for a in args]
    out = fn(*args)
    loss = torch.sum(out * torch.sin(out))
    if loss.requires_grad:  # else: no key visible anywhere
        loss.backward()
    grads = [np.zeros(a.shape) if a.grad is None else np_(a.grad) for a in args]
    return np_(out.detach()), grads


@DRAWS
@given(minus_inf_problems())
def test_minus_inf_scores_on_every_path_equal_numpy(p):
    q, k, v = qkv(p, "float32")
    expected = np_attention(q, k, v, lambda s: s, minus_inf_allowed(p))
    grads = {}
    for path in ("dense", "blockwise"):
        out, grads[path] = _value_and_gradients(
            lambda *a, path=path: attend_minus_inf(p, path, *a), (q, k, v)
        )
        assert np.all(np.isfinite(out)), f"{path}: {np.isnan(out).sum()} NaN"
        np.testing.assert_allclose(out, expected, atol=2e-5, err_msg=path)
    for name, a, b in zip("qkv", grads["dense"], grads["blockwise"]):
        assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)), name
        np.testing.assert_allclose(b, a, atol=2e-5, err_msg=name)


# float64 ---------------------------------------------------------------------


@st.composite
def float64_problems(draw):
    p = draw(shapes())
    rng = np.random.default_rng(p["seed"] + 2)
    p["key_mask"] = rng.random((p["batch"], p["tk"])) < 0.8
    p["bias"] = draw(st.booleans())  # a float64 distance bias
    paths = ["dense", "blockwise", "fused"]
    if p["tq"] == p["tk"]:
        paths.append("banded")
    p["path"] = draw(st.sampled_from(paths))
    p["window"] = draw(st.integers(0, 6))
    return p


def distance_bias(score, batch, head, q_idx, kv_idx):
    return score - 0.25 * ops.cast(ops.abs(q_idx - kv_idx), score.dtype)


def attend_float64(p, q, k, v):
    path = p["path"]
    score_mod = distance_bias if p["bias"] else None
    if path == "banded":
        return ka.ops.local_attention(
            q,
            k,
            v,
            window_size=p["window"],
            causal=p["causal"],
            key_mask=p["key_mask"],
            block_size=p["tiles"][0],
            score_mod=score_mod,
        )
    if path == "fused" and score_mod is not None:
        path = "dense"  # the fused kernels take no score function
    with attention_lib.implementation_scope(path, **options(p, path)):
        return attention_lib.dot_product_attention(
            q,
            k,
            v,
            causal=p["causal"],
            query_offset=p["offset"],
            key_mask=p["key_mask"],
            score_mod=score_mod,
        )


@DRAWS
@given(float64_problems())
def test_float64_inputs_equal_a_float64_reference(p):
    q_pos, k_pos = positions(p)
    allowed = p["key_mask"][:, None, None, :]
    if p["causal"]:
        allowed = allowed & (k_pos <= q_pos)
    if p["path"] == "banded":
        allowed = allowed & (np.abs(q_pos - k_pos) <= p["window"])

    def bias(s):
        return s - 0.25 * np.abs(q_pos - k_pos) if p["bias"] else s

    with float64_enabled():
        q, k, v = qkv(p, "float64")
        fn = functools.partial(attend_float64, p)
        if BACKEND == "jax":  # One compiled call per draw.
            import jax

            fn = jax.jit(fn)
        out = np_(fn(q, k, v))
    assert out.dtype == np.float64, out.dtype
    expected = np_attention(q, k, v, bias, allowed)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-10)
