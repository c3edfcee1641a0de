"""Mask and score objects under Hypothesis: every path equals NumPy.

Draws: sequence lengths (queries at the end of a longer key sequence:
a cache offset), heads and key/value heads, a mask object of
`keras_attention.mods` (causal, both window rules, chunked causal,
prefix-LM with one or per-example lengths, documents from random segment
ids, and their `and_masks` / `or_masks`), an optional score function (a
per-head distance bias, Gemma 2's soft-cap) or score object of
`keras_attention.scores` with drawn arguments (`ALiBi`, `T5RelativeBias`
with a random table, `SoftCap`), `causal=`, and the blockwise
path's tuning (tile sizes, whether the backward pass keeps the
probabilities).

Properties:

- the dense and blockwise paths equal a NumPy reference of the mask's
  rule (positions absolute: the offset is applied), whatever the tiles;
- queries that can attend to nothing get zeros, never NaN;
- the blockwise input gradients equal the dense path's, whatever the
  tiles and whether probabilities are kept.
"""

import keras
import numpy as np
import references
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from keras_attention import mods
from keras_attention import scores
from keras_attention.ops import attention as attention_lib

BACKEND = keras.backend.backend()
DRAWS = settings(
    max_examples=max(
        1, settings.default.max_examples // (2 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)
D = 4


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


@st.composite
def problems(draw):
    batch = draw(st.sampled_from([1, 2]))
    kv_heads = draw(st.sampled_from([1, 2]))
    heads = kv_heads * draw(st.sampled_from([1, 2]))
    tk = draw(st.integers(1, 24))
    tq = draw(st.integers(1, tk))
    offset = tk - tq  # the queries are the last `tq` positions
    kind = draw(
        st.sampled_from(
            [
                "causal",
                "window",
                "keras_window",
                "chunked",
                "prefix",
                "prefix_per_example",
                "documents",
                "and",
                "or",
            ]
        )
    )
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    q_pos = (offset + np.arange(tq))[:, None]
    k_pos = np.arange(tk)[None, :]
    inputs = {}
    if kind == "causal":
        mod, rule = mods.CausalMask(), k_pos <= q_pos
    elif kind == "window":
        left, right = draw(st.integers(0, 5)), draw(st.integers(0, 5))
        mod = mods.SlidingWindowMask((left, right))
        rule = (k_pos >= q_pos - left) & (k_pos <= q_pos + right)
    elif kind == "keras_window":
        w = draw(st.integers(1, 6))
        mod, rule = mods.KerasSlidingWindowMask(w), np.abs(q_pos - k_pos) < w
    elif kind == "chunked":
        c = draw(st.integers(1, 8))
        mod = mods.ChunkedCausalMask(c)
        rule = (k_pos <= q_pos) & (k_pos // c == q_pos // c)
    elif kind == "prefix":
        n = draw(st.integers(0, tk))
        mod, rule = mods.PrefixLMMask(n), (k_pos <= q_pos) | (k_pos < n)
    elif kind == "prefix_per_example":
        n = rng.integers(0, tk + 1, size=batch)
        mod, inputs = mods.PrefixLMMask(), {"prefix_length": n}
        rule = (k_pos <= q_pos)[None] | (k_pos[None] < n[:, None, None])
    elif kind == "documents":
        ids = np.sort(rng.integers(0, 4, size=(batch, tk)), axis=1)
        mod, inputs = mods.DocumentMask(), {"segment_ids": ids}
        q_ids = ids[:, offset:]
        rule = q_ids[:, :, None] == ids[:, None, :]
    elif kind == "and":
        c = draw(st.integers(1, 8))
        mod = mods.and_masks(mods.CausalMask(), mods.ChunkedCausalMask(c))
        rule = (k_pos <= q_pos) & (k_pos // c == q_pos // c)
    else:
        w = draw(st.integers(0, 3))
        mod = mods.or_masks(mods.SlidingWindowMask(w), mods.PrefixLMMask(2))
        rule = (np.abs(q_pos - k_pos) <= w) | (k_pos <= q_pos) | (k_pos < 2)
    causal = draw(st.booleans())
    rule = np.broadcast_to(rule, (batch, tq, tk))
    if causal:
        rule = rule & (k_pos <= q_pos)
    score = draw(
        st.sampled_from([None, "distance", "softcap", "alibi", "t5", "cap"])
    )
    score_args = {}
    if score == "alibi":
        score_args = dict(
            bidirectional=draw(st.booleans()),
            alibi_bias_max=draw(st.integers(1, 8)),
        )
    elif score == "t5":
        bidirectional = draw(st.booleans())
        buckets = draw(st.integers(4 if bidirectional else 2, 12))
        exact = buckets // (4 if bidirectional else 2)
        score_args = dict(
            bidirectional=bidirectional,
            num_buckets=buckets,
            max_distance=draw(st.integers(exact + 1, 30)),
            table=rng.normal(size=(buckets, heads)).astype("float32"),
        )
    elif score == "cap":
        score_args = dict(cap=draw(st.floats(0.25, 20.0)))
    tiles = (draw(st.integers(1, 12)), draw(st.integers(1, 12)))
    keep = draw(st.booleans())
    q = rng.normal(size=(batch, tq, heads, D)).astype("float32")
    k = rng.normal(size=(batch, tk, kv_heads, D)).astype("float32")
    v = rng.normal(size=(batch, tk, kv_heads, D)).astype("float32")
    return dict(
        q=q,
        k=k,
        v=v,
        mod=mod.bind(**inputs),
        rule=rule[:, None],
        causal=causal,
        offset=offset,
        score=score,
        score_args=score_args,
        tiles=tiles,
        keep=keep,
    )


SLOPES = np.array([0.1, 0.3, 0.5, 0.9], "float32")


def distance_bias(score, batch, head, q_idx, kv_idx):
    distance = ops.cast(ops.abs(q_idx - kv_idx), "float32")
    return score - ops.take(SLOPES, head) * distance


def softcap(score, batch, head, q_idx, kv_idx):
    return 2.0 * ops.tanh(score / 2.0)


SCORES = {None: None, "distance": distance_bias, "softcap": softcap}


def score_object(p, heads):
    """The score function or object of problem `p` (a new object)."""
    args = dict(p["score_args"])
    if p["score"] == "alibi":
        return scores.ALiBi(num_heads=heads, **args)
    if p["score"] == "t5":
        table = args.pop("table")
        bias = scores.T5RelativeBias(**args)
        bias.build(heads)
        bias.weights[0].assign(table)
        return bias
    if p["score"] == "cap":
        return scores.SoftCap(**args)
    return SCORES[p["score"]]


def np_reference(p):
    q, k, v = p["q"], p["k"], p["v"]
    r = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(D)
    heads = q.shape[2]
    q_pos = p["offset"] + np.arange(q.shape[1])[:, None]
    k_pos = np.arange(k.shape[1])[None, :]
    if p["score"] == "distance":
        s = s - SLOPES[:heads, None, None] * np.abs(q_pos - k_pos)
    elif p["score"] == "softcap":
        s = 2.0 * np.tanh(s / 2.0)
    elif p["score"] == "alibi":  # the paper's slopes, 2^(-8 i / n) for 2^k
        args = p["score_args"]
        slopes = np.asarray(scores.alibi_slopes(heads, args["alibi_bias_max"]))
        if (heads & (heads - 1)) == 0:
            n = np.arange(1, heads + 1)
            want = 2.0 ** (-args["alibi_bias_max"] * n / heads)
            np.testing.assert_allclose(slopes, want, rtol=1e-12)
        distance = q_pos - k_pos
        if args["bidirectional"]:
            distance = np.abs(distance)
        s = s - slopes[:, None, None] * distance
    elif p["score"] == "t5":  # T5's bucket function, ported to NumPy
        args = p["score_args"]
        bucket = references.t5_bucket(
            k_pos - q_pos,
            args["bidirectional"],
            args["num_buckets"],
            args["max_distance"],
        )
        s = s + np.moveaxis(args["table"][bucket], -1, 0)
    elif p["score"] == "cap":
        cap = p["score_args"]["cap"]
        s = cap * np.tanh(s / cap)
    mask = np.broadcast_to(p["rule"], s.shape)
    s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    e = np.where(mask, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    w = e / np.maximum(e.sum(-1, keepdims=True), 1e-30)
    return np.einsum("bhij,bjhe->bihe", w, v)


def attend(p, path, q=None, k=None, v=None):
    options = {}
    if path == "blockwise":
        options = dict(
            query_block=p["tiles"][0],
            key_block=p["tiles"][1],
            keep_probabilities=p["keep"],
        )
    with attention_lib.implementation_scope(path, **options):
        return attention_lib.dot_product_attention(
            p["q"] if q is None else q,
            p["k"] if k is None else k,
            p["v"] if v is None else v,
            causal=p["causal"],
            query_offset=p["offset"],
            score_mod=score_object(p, p["q"].shape[2]),
            mask_mod=p["mod"],
        )


def _attend_compiled(p, path):
    """`attend(p, path)`; on JAX one `jax.jit` of the whole call: eager JAX
    compiles every op (and loop body) for each drawn shape, one compiled
    function per draw is several times cheaper (same computation)."""
    if BACKEND != "jax":
        return attend(p, path)
    import jax

    return jax.jit(lambda q, k, v: attend(p, path, q, k, v))(
        p["q"], p["k"], p["v"]
    )


@DRAWS
@given(problems())
def test_every_path_equals_the_rule_in_numpy(p):
    expected = np_reference(p)
    for path in ("dense", "blockwise"):
        out = np_(_attend_compiled(p, path))
        assert np.all(np.isfinite(out)), path
        np.testing.assert_allclose(out, expected, atol=2e-5, err_msg=path)


def _input_gradients(p, path):
    """Gradients of sum(out * sin(out)) w.r.t. q, k and v."""
    args = [p["q"], p["k"], p["v"]]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        args = [tf.constant(a) for a in args]
        with tf.GradientTape() as tape:
            tape.watch(args)
            out = attend(p, path, *args)
            loss = tf.reduce_sum(out * tf.sin(out))
        grads = tape.gradient(
            loss, args, unconnected_gradients=tf.UnconnectedGradients.ZERO
        )
        return [np_(g) for g in grads]
    if BACKEND == "jax":
        import jax

        def loss(*a):
            out = attend(p, path, *a)
            return ops.sum(out * ops.sin(out))

        # One compiled gradient per draw (see `_attend_compiled`).
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        return [np_(g) for g in grad(*args)]
    import torch

    args = [torch.tensor(a, requires_grad=True) for a in args]
    out = attend(p, path, *args)
    loss = torch.sum(out * torch.sin(out))
    if loss.requires_grad:  # else: no key visible anywhere
        loss.backward()
    return [np.zeros(a.shape) if a.grad is None else np_(a.grad) for a in args]


@DRAWS
@given(problems())
def test_blockwise_gradients_equal_the_dense_path(p):
    dense = _input_gradients(p, "dense")
    blockwise = _input_gradients(p, "blockwise")
    for name, a, b in zip("qkv", dense, blockwise):
        assert np.all(np.isfinite(b)), name
        np.testing.assert_allclose(b, a, atol=2e-5, err_msg=name)
