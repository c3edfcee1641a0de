"""`topk_attention` under Hypothesis: attention of each query on the keys
its `indices` name equals dense attention (`dot_product_attention`, and
NumPy's) under the mask "key `j` is in `indices[i]`", and-ed with the
other masks.

Draws (shapes fixed: JAX compiles per shape, so each draw reuses the same
programs): the indices (distinct per row, some -1 or past the end, a row
with none), `causal` with an offset, query and key padding, an index
mask, the query tile and the scale.

Properties: the outputs and log-sum-exps agree (`-inf` on the same rows),
rows with nothing to attend to are zero, and nothing is NaN. And
`LightningIndexer`'s choice (`select_top_k`) on scores with many exact
ties: the best allowed keys, equal scores lowest position first.
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
B, TQ, TK, H, G, D, K = 2, 5, 7, 4, 2, 4, 4
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
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    indices = np.stack(
        [
            np.stack([rng.permutation(TK)[:K] for _ in range(TQ)])
            for _ in range(B)
        ]
    )
    holes = rng.random(indices.shape) < draw(st.sampled_from([0.0, 0.3]))
    indices[holes] = rng.choice([-1, TK, TK + 5], size=int(holes.sum()))
    if draw(st.booleans()):
        indices[rng.integers(B), rng.integers(TQ)] = -1  # a row with none
    causal = draw(st.booleans())
    return dict(
        q=rng.normal(size=(B, TQ, H, D)).astype("float32"),
        k=rng.normal(size=(B, TK, G, D)).astype("float32"),
        v=rng.normal(size=(B, TK, G, 3)).astype("float32"),
        indices=indices.astype("int32"),
        causal=causal,
        offset=draw(st.integers(-1, TK - TQ)) if causal else 0,
        query_mask=rng.random((B, TQ)) < 0.85,
        key_mask=rng.random((B, TK)) < 0.8,
        index_mask=(
            rng.random((B, TQ, K)) < 0.85 if draw(st.booleans()) else None
        ),
        query_block=draw(st.sampled_from([None, 2, 8])),
        scale=draw(st.sampled_from([None, 0.7])),
    )


def _dense_mask(p):
    """Bool `(b, 1, i, j)`: key `j` is among `indices[b, i]`'s entries
    the index mask allows (entries past the end name no key)."""
    mask = np.zeros((B, TQ, TK), bool)
    for n, i, slot in zip(*np.nonzero((p["indices"] >= 0))):
        j = p["indices"][n, i, slot]
        allowed = p["index_mask"] is None or p["index_mask"][n, i, slot]
        if j < TK and allowed:
            mask[n, i, j] = True
    return mask[:, None]


@DRAWS
@given(problems())
def test_topk_equals_dense_under_the_index_mask(p):
    out, lse = ka.ops.topk_attention(
        p["q"],
        p["k"],
        p["v"],
        p["indices"],
        scale=p["scale"],
        causal=p["causal"],
        query_offset=p["offset"],
        query_mask=p["query_mask"],
        key_mask=p["key_mask"],
        index_mask=p["index_mask"],
        return_lse=True,
        query_block=p["query_block"],
    )
    mask = _dense_mask(p)
    dense, dense_lse = ka.ops.dot_product_attention(
        p["q"],
        p["k"],
        p["v"],
        attention_mask=mask,
        scale=p["scale"],
        causal=p["causal"],
        query_offset=p["offset"],
        query_mask=p["query_mask"],
        key_mask=p["key_mask"],
        return_lse=True,
        implementation="dense",
    )
    out, lse = np_(out), np_(lse)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    np.testing.assert_allclose(out, np_(dense), atol=2e-5)
    finite = np.isfinite(np_(dense_lse))
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], np_(dense_lse)[finite], atol=2e-5)
    # NumPy's opinion, from the formula.
    j, i = np.arange(TK)[None], np.arange(TQ)[:, None] + p["offset"]
    allowed = mask[:, 0] & p["key_mask"][:, None] & p["query_mask"][..., None]
    if p["causal"]:
        allowed &= (j <= i)[None]
    scale = p["scale"] or 1 / np.sqrt(D)
    k = np.repeat(p["k"], H // G, axis=2).astype("float64")
    v = np.repeat(p["v"], H // G, axis=2).astype("float64")
    scores = np.einsum("bihd,bjhd->bhij", p["q"], k) * scale
    weights = references.masked_softmax(scores, allowed[:, None])
    want = np.einsum("bhij,bjhe->bihe", weights, v)
    np.testing.assert_allclose(out, want, atol=2e-5)
    empty = ~allowed.any(-1)
    assert np.all(out[empty] == 0)


@st.composite
def selections(draw):
    """Index scores with many exact ties (small integers) and the keys
    each query may select, some queries with fewer than `top_k`."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    scores = rng.integers(0, draw(st.sampled_from([2, 4, 50])), (B, TQ, TK))
    allowed = rng.random((B, TQ, TK)) < draw(st.sampled_from([0.3, 0.9]))
    return scores.astype("float32"), allowed, draw(st.integers(1, TK + 2))


@DRAWS
@given(selections())
def test_the_indexer_keeps_the_best_keys_lowest_position_first(problem):
    """`LightningIndexer`'s choice: the `top_k` best allowed keys, equal
    scores the lowest positions first, every allowed key when there are
    fewer; positions in increasing order, -1 after them."""
    from keras_attention.layers.lightning_indexer import select_top_k

    scores, allowed, top_k = problem
    indices, kept = select_top_k(
        ops.convert_to_tensor(scores), ops.convert_to_tensor(allowed), top_k
    )
    indices, kept = np_(indices), np_(kept)
    for n in range(B):
        for i in range(TQ):
            keys = np.flatnonzero(allowed[n, i])
            best = sorted(keys, key=lambda s: (-scores[n, i, s], s))[:top_k]
            want = sorted(best) + [-1] * (top_k - len(best))
            np.testing.assert_array_equal(indices[n, i], want)
            np.testing.assert_array_equal(
                np.flatnonzero(kept[n, i]), sorted(best)
            )
