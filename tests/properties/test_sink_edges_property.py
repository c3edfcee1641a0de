"""Learned sinks and `merge_attention` at their edges, under Hypothesis.

Draws (shapes fixed: JAX compiles per shape, so draws reuse programs):

- sink logits, one per head, over the whole float32 range: `-inf` (no
  sink), `+inf` (all the mass), values far beyond the scores either way
  and ordinary ones; key padding that may leave rows empty, `causal`;
  the path (dense, blockwise with its tiles drawn, fused, and the banded
  `local_attention` over a window);
- parts of a merge over disjoint key sets, each possibly given another
  shape (another batch, query length, head count or dim; an lse in `(b,
  i, h)` layout, with an extra axis, or of another batch), and sinks
  possibly of another shape.

Properties: with sinks, the output and the lse equal float64 NumPy
(`sink_reference.py`), infinities of the same sign, never NaN; a merge
either is refused (`ValueError` naming the part) when any part's shape
disagrees, or equals one call over all the keys (and NumPy).

Cost: small fixed shapes; on JAX half the profile's draws.
"""

import re

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops
from sink_reference import band_mask
from sink_reference import sink_attention

import keras_attention as ka

BACKEND = keras.backend.backend()
B, TQ, TK, H, G, D = 2, 5, 6, 4, 2, 3
DRAWS = settings(
    max_examples=max(
        2, settings.default.max_examples // (2 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)
F32_MAX = float(np.finfo("float32").max)
SINK = st.one_of(
    st.sampled_from([-np.inf, np.inf, 0.0]),
    st.floats(-F32_MAX, F32_MAX, width=32),  # Mostly far from the scores.
    st.floats(-40.0, 40.0, width=32),
)
PATHS = ["dense", "blockwise", "fused", "banded"]


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def assert_lse_equal(lse, want, atol=3e-5):
    lse = np_(lse)
    assert not np.isnan(lse).any(), lse
    np.testing.assert_array_equal(np.isposinf(lse), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(lse[finite], want[finite], atol=atol, rtol=1e-6)


@st.composite
def sink_problems(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    padding = rng.random((B, TK)) < 0.8
    if draw(st.booleans()):
        padding[draw(st.integers(0, B - 1))] = False  # Rows see nothing.
    return dict(
        q=(rng.normal(size=(B, TQ, H, D)) * 2).astype("float32"),
        k=rng.normal(size=(B, TK, G, D)).astype("float32"),
        v=rng.normal(size=(B, TK, G, D)).astype("float32"),
        padding=padding,
        causal=draw(st.booleans()),
        sinks=np.array(draw(st.lists(SINK, min_size=H, max_size=H)), "float32"),
        path=draw(st.sampled_from(PATHS)),
        tiles=draw(st.sampled_from([{}, dict(query_block=2, key_block=4)])),
    )


@DRAWS
@given(sink_problems())
def test_sinks_over_the_float_range_equal_numpy(p):
    q, k, v, sinks = p["q"], p["k"], p["v"], p["sinks"]
    if p["path"] == "banded":  # Self-attention lengths, a window of 2.
        k, v, padding = k[:, :TQ], v[:, :TQ], p["padding"][:, :TQ]
        out, lse = ka.ops.local_attention(
            q, k, v, 2, causal=p["causal"], key_mask=padding,
            return_lse=True, sink_logits=sinks,
        )  # fmt: skip
        mask = band_mask(TQ, 2, 0 if p["causal"] else 2)
    else:
        padding = p["padding"]
        options = p["tiles"] if p["path"] == "blockwise" else {}
        with ka.ops.implementation_scope(p["path"], **options):
            out, lse = ka.ops.dot_product_attention(
                q, k, v, causal=p["causal"], key_mask=padding,
                return_lse=True, sink_logits=sinks,
            )  # fmt: skip
        i, j = np.arange(TQ)[:, None], np.arange(TK)[None, :]
        mask = (j <= i) if p["causal"] else np.ones((TQ, TK), bool)
    mask = mask & padding[:, None, None, :]
    want_out, want_lse = sink_attention(q, k, v, mask, sinks)
    out = np_(out)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, want_out, atol=3e-5)
    assert_lse_equal(lse, want_lse)


# Merging parts of random shapes ---------------------------------------------

# How a part may be reshaped (None: as computed): outputs (b, i, h, e) and
# lses (b, h, i) with TQ != H, so that a transposed lse is told apart.
OUTPUT_CHANGES = {
    "batch": lambda o: o[:1],
    "queries": lambda o: o[:, :-1],
    "heads": lambda o: o[:, :, :-1],
    "dim": lambda o: o[..., :-1],
    "rank": lambda o: o[..., 0],
}
LSE_CHANGES = {
    "layout": lambda x: ops.transpose(x, (0, 2, 1)),
    "extra_axis": lambda x: x[..., None],
    "batch": lambda x: x[:1],
    "heads": lambda x: x[:, :-1],
}


def _changes(draw, parts, names):
    """A change (a name of `names`) or None for each of `parts` parts."""
    return [
        draw(st.one_of(st.none(), st.sampled_from(sorted(names))))
        for _ in range(parts)
    ]


@st.composite
def merge_problems(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    parts = draw(st.integers(1, 3))
    output_changes = lse_changes = [None] * parts
    sinks = draw(st.sampled_from([None, H]))
    if not draw(st.booleans()):  # Half the draws: something disagrees.
        # outputs[0] sets the shape the others must have: only a change
        # of its rank is wrong by itself.
        output_changes = _changes(draw, 1, ["rank"])
        output_changes += _changes(draw, parts - 1, OUTPUT_CHANGES)
        lse_changes = _changes(draw, parts, LSE_CHANGES)
        sinks = draw(st.sampled_from([None, H, 1, H + 1]))
    return dict(
        q=rng.normal(size=(B, TQ, H, D)).astype("float32"),
        k=rng.normal(size=(B, TK, G, D)).astype("float32"),
        v=rng.normal(size=(B, TK, G, D)).astype("float32"),
        labels=rng.integers(0, parts, size=(B, TK)),
        padding=rng.random((B, TK)) < 0.8,
        output_changes=output_changes,
        lse_changes=lse_changes,
        sinks=sinks,
    )


@DRAWS
@given(merge_problems())
def test_merging_parts_of_random_shapes_is_refused_or_exact(p):
    outs, lses = [], []
    for part, (oc, lc) in enumerate(zip(p["output_changes"], p["lse_changes"])):
        out, lse = ka.ops.dot_product_attention(
            p["q"], p["k"], p["v"], return_lse=True,
            key_mask=p["padding"] & (p["labels"] == part),
        )  # fmt: skip
        outs.append(out if oc is None else OUTPUT_CHANGES[oc](out))
        lses.append(lse if lc is None else LSE_CHANGES[lc](lse))
    sinks = None
    if p["sinks"] is not None:
        sinks = np.linspace(-3.0, 3.0, p["sinks"]).astype("float32")
    bad = [f"outputs[{i}]" for i, c in enumerate(p["output_changes"]) if c]
    bad += [f"lses[{i}]" for i, c in enumerate(p["lse_changes"]) if c]
    bad += ["sink_logits"] if p["sinks"] not in (None, H) else []
    if p["output_changes"][0] is not None:  # The others then disagree.
        bad += [f"outputs[{i}]" for i in range(len(outs))]
        bad += [f"lses[{i}]" for i in range(len(outs))]
    if bad:
        named = "|".join(re.escape(f"`{name}`") for name in bad)
        with pytest.raises(ValueError, match=named):
            ka.ops.merge_attention(outs, lses, sink_logits=sinks)
        return
    out, lse = ka.ops.merge_attention(outs, lses, sink_logits=sinks)
    whole_out, whole_lse = ka.ops.dot_product_attention(
        p["q"], p["k"], p["v"], return_lse=True, key_mask=p["padding"],
        sink_logits=sinks,
    )  # fmt: skip
    np.testing.assert_allclose(np_(out), np_(whole_out), atol=3e-5)
    assert_lse_equal(lse, np_(whole_lse).astype("float64"))
    mask = p["padding"][:, None, None, :]
    want_out, want_lse = sink_attention(p["q"], p["k"], p["v"], mask, sinks)
    np.testing.assert_allclose(np_(out), want_out, atol=3e-5)
    assert_lse_equal(lse, want_lse)
