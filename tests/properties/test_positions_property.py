"""The position layers' `positions=` under Hypothesis (issue 36, defect 7).

Draws: a position layer (`RotaryEmbedding`, `SinusoidalPositionEncoding`,
`PositionEmbedding`, `TokenAndPositionEmbedding`), batch 1 or 2, 0, 1 or
3 steps, and positions of shape `(T,)`, `(1, T)` or `(batch, T)` or of a
wrong one (another length, another batch, rank 3), as a NumPy array or an
eager tensor, of int32, int64 or float32 values: for the tables, rows
inside them, at their edges, negative, past the end, or fractional; for
the rotations, any sign, fractional ones too.

Properties (eager calls, where the values can be read):

- positions of a wrong shape, and for the tables values that are no row
  (negative, `>= sequence_length`, fractional), raise `ValueError`
  naming `positions` (never a backend's gather or broadcast error, never
  a silent read of the last row);
- any other draw equals a NumPy reference of the layer at those
  positions (the rotation of `(x1, x2)` by `position * theta`, the
  sinusoids, the table's rows).

Cost (ci profile, halved on JAX): four tiny layers built once, a few
fixed shapes, no compilation.
"""

import keras
import numpy as np
import pytest
from hypothesis import event
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from keras_attention import layers as ka

BACKEND = keras.backend.backend()
DRAWS = settings(
    max_examples=max(
        1, settings.default.max_examples // (2 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)
KINDS = ("rotary", "sinusoidal", "learned", "tokens")
SEQUENCE_LENGTH = 5  # rows of the tables
VOCABULARY = 6
FEATURES = 4
WAVELENGTH = 100.0


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32")).astype("float64")


_LAYERS = {}


def _layer(kind):
    """One layer per kind, built once (the tables keep their values)."""
    if kind not in _LAYERS:
        if kind == "rotary":
            layer = ka.RotaryEmbedding(WAVELENGTH)
            layer.build((1, 1, 2, FEATURES))
        elif kind == "sinusoidal":
            layer = ka.SinusoidalPositionEncoding(WAVELENGTH)
            layer.build((1, 1, FEATURES))
        elif kind == "learned":
            layer = ka.PositionEmbedding(SEQUENCE_LENGTH)
            layer.build((1, 1, FEATURES))
        else:
            layer = ka.TokenAndPositionEmbedding(
                VOCABULARY, SEQUENCE_LENGTH, FEATURES
            )
            layer.build((1, 1))
        _LAYERS[kind] = layer
    return _LAYERS[kind]


@st.composite
def position_draws(draw, kind, batch, t):
    """`(positions, wrong)`: a NumPy array of positions for `batch`
    sequences of `t` steps and whether the layer must refuse it."""
    form = draw(
        st.sampled_from(
            ["1d", "1d", "one", "batch", "batch"]
            + ["length", "batches", "rank3"]
        )
    )
    shape = {
        "1d": (t,),
        "one": (1, t),
        "batch": (batch, t),
        "length": draw(st.sampled_from([(t + 1,), (batch, t + 1)])),
        "batches": (batch + 1, t),  # neither 1 nor batch
        "rank3": (1, 1, t),
    }[form]
    wrong = form in ("length", "batches", "rank3")
    table = kind in ("learned", "tokens")
    if table:
        where = draw(
            st.sampled_from(
                ["inside"] * 4 + ["edges", "negative", "past", "fraction"]
            )
        )
    else:
        where = draw(st.sampled_from(["inside", "negative", "fraction"]))
    seed = draw(st.integers(0, 3))
    rng = np.random.default_rng(seed)
    values = rng.integers(0, SEQUENCE_LENGTH, size=shape).astype("float64")
    size = int(np.prod(shape))
    if size and where != "inside":
        flat = values.reshape(-1)
        at = draw(st.integers(0, size - 1))
        flat[at] = {
            "edges": draw(st.sampled_from([0, SEQUENCE_LENGTH - 1])),
            "negative": draw(st.sampled_from([-1, -SEQUENCE_LENGTH, -40])),
            "past": draw(st.sampled_from([SEQUENCE_LENGTH, 6, 1000])),
            "fraction": draw(st.sampled_from([0.5, 2.25])),
        }[where]
        if table:
            wrong = wrong or where in ("negative", "past", "fraction")
    if where == "fraction":
        dtype = "float32"
    else:
        dtype = draw(st.sampled_from(["int32", "int64", "float32"]))
    event(f"{kind}: {form}, {where}")
    return values.astype(dtype), wrong


def _rotary_reference(x, positions):
    """`x` `(b, T, h, d)` rotated at `positions` `(b|1, T)`, float64."""
    d = x.shape[-1]
    theta = WAVELENGTH ** (-2.0 * np.arange(d // 2) / d)
    angle = positions[:, :, None, None] * theta  # (b|1, T, 1, d/2)
    cos, sin = np.cos(angle), np.sin(angle)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _sinusoid_reference(positions, shape):
    """The encodings at `positions` `(b|1, T)` broadcast to `shape`."""
    d = shape[-1]
    i = np.arange(d)
    rate = WAVELENGTH ** (-(2 * (i // 2)) / d)
    angle = positions[:, :, None] * rate
    return np.broadcast_to(
        np.where(i % 2 == 0, np.sin(angle), np.cos(angle)), shape
    )


@DRAWS
@given(st.data())
def test_positions_are_checked_eagerly_or_equal_numpy(data):
    kind = data.draw(st.sampled_from(KINDS), label="kind")
    batch = data.draw(st.sampled_from([1, 2]), label="batch")
    t = data.draw(st.sampled_from([0, 1, 3]), label="t")
    positions, wrong = data.draw(position_draws(kind, batch, t))
    rng = np.random.default_rng(data.draw(st.integers(0, 3)))
    if kind == "tokens":
        x = rng.integers(0, VOCABULARY, size=(batch, t)).astype("int32")
    elif kind == "rotary":
        x = rng.normal(size=(batch, t, 2, FEATURES)).astype("float32")
    else:
        x = rng.normal(size=(batch, t, FEATURES)).astype("float32")
    given_positions = positions
    if data.draw(st.booleans(), label="as tensor"):
        given_positions = ops.convert_to_tensor(positions)
    layer = _layer(kind)
    if wrong:
        event("refused")
        with pytest.raises(ValueError, match="`positions`"):
            layer(x, positions=given_positions)
        return
    event("compared")
    out = np_(layer(x, positions=given_positions))
    rows = np.atleast_2d(positions.astype("float64"))  # (b|1, T)
    if kind == "rotary":
        want = _rotary_reference(x.astype("float64"), rows)
    elif kind == "sinusoidal":
        want = _sinusoid_reference(rows, x.shape)
    elif kind == "learned":
        table = np_(layer.position_embeddings)
        want = np.broadcast_to(table[rows.astype(int)], x.shape)
    else:
        tokens = np_(layer.token_embedding.embeddings)[x]
        table = np_(layer.position_embedding.position_embeddings)
        want = tokens + table[rows.astype(int)]
    assert out.shape == want.shape
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=1e-5)
