"""`merge_attention` and the log-sum-exp under Hypothesis: attention over
any partition of the keys into disjoint sets, merged, equals one call
over all of them, on every op-level path, with or without learned sinks.

Draws (shapes fixed: JAX compiles per shape, so each draw reuses the same
programs): a partition of the keys into 1-3 sets (a random label per
key, each set given as a `key_mask`: some sets are empty, some rows see
none of a set's keys), padding of the keys, `causal` with an offset, the
path of each part and of the whole call, and sink logits or none.

Properties: the merged output and lse equal the whole call's (NumPy's
for the output, as a third opinion); rows that attend to nothing give a
zero output and `lse = -inf` (the sink's logit with sinks); no NaN.
"""

import keras
import numpy as np
import references
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

import keras_attention as ka

BACKEND = keras.backend.backend()
B, TQ, TK, H, G, D = 2, 4, 6, 4, 2, 4
PATHS = ["dense", "blockwise", "fused"]
DRAWS = settings(
    max_examples=max(
        1, settings.default.max_examples // (2 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


@st.composite
def problems(draw):
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    parts = draw(st.integers(1, 3))
    labels = rng.integers(0, parts, size=(B, TK))
    padding = rng.random((B, TK)) < 0.8
    if draw(st.booleans()):
        padding[draw(st.integers(0, B - 1))] = False  # A row sees nothing.
    causal = draw(st.booleans())
    offset = draw(st.integers(-1, TK - TQ)) if causal else 0
    return dict(
        q=rng.normal(size=(B, TQ, H, D)).astype("float32"),
        k=rng.normal(size=(B, TK, G, D)).astype("float32"),
        v=rng.normal(size=(B, TK, G, D)).astype("float32"),
        labels=labels,
        parts=parts,
        padding=padding,
        causal=causal,
        offset=offset,
        sinks=(
            rng.normal(size=(H,)).astype("float32")
            if draw(st.booleans())
            else None
        ),
        part_paths=[draw(st.sampled_from(PATHS)) for _ in range(parts)],
        whole_path=draw(st.sampled_from(PATHS)),
    )


def _attend(p, key_mask, path, sinks=None):
    return ka.ops.dot_product_attention(
        p["q"],
        p["k"],
        p["v"],
        key_mask=key_mask,
        causal=p["causal"],
        query_offset=p["offset"],
        return_lse=True,
        sink_logits=sinks,
        implementation=path,
    )


@DRAWS
@given(problems())
def test_merged_parts_equal_one_call(p):
    outs, lses = [], []
    for part, path in enumerate(p["part_paths"]):
        out, lse = _attend(p, p["padding"] & (p["labels"] == part), path)
        outs.append(out)
        lses.append(lse)
    out, lse = ka.ops.merge_attention(outs, lses, sink_logits=p["sinks"])
    want_out, want_lse = _attend(p, p["padding"], p["whole_path"], p["sinks"])
    out, lse, want_lse = np_(out), np_(lse), np_(want_lse)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    np.testing.assert_allclose(out, np_(want_out), atol=3e-5)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], atol=3e-5)
    # NumPy, without sinks, as a third opinion on the output.
    if p["sinks"] is None:
        i = np.arange(TQ)[:, None] + p["offset"]
        mask = p["padding"][:, None, None, :]
        if p["causal"]:
            mask = mask & (np.arange(TK)[None, :] <= i)[None, None]
        k = np.repeat(p["k"], H // G, axis=2)
        v = np.repeat(p["v"], H // G, axis=2)
        scores = np.einsum("bihd,bjhd->bhij", p["q"], k) / np.sqrt(D)
        weights = references.masked_softmax(
            scores, np.broadcast_to(mask, scores.shape)
        )
        want = np.einsum("bhij,bjhd->bihd", weights, v)
        np.testing.assert_allclose(out, want, atol=3e-5)
