"""Chunk-size independence of `linear_attention` and `gated_delta_rule`
under decays drawn down to -1e4, under Hypothesis.

Draws (shapes fixed: JAX compiles per shape; there each chunk size is
one `jax.jit`): the chunk size (1 to longer than the sequence, dividing
it or not), mild log decays and, at a drawn density, strong ones whose
magnitude is log-uniform in [1, 1e4] (per step and head), padding
(padded keys neither write nor decay), the values.

Property: every chunk size gives the NumPy recurrence
(`tests/linear_attention_reference.py`, `tests/gated_delta_reference.py`)
to 1e-5 of the largest output, in float32: the in-chunk decays are
summed over their own segment, never as the difference of two
cumulative sums that cancel (1e-3 off after a -1e4).
`tests/ops/test_strong_decay_chunks.py` has the fixed cases.
"""

import functools

import gated_delta_reference as gdr
import keras
import linear_attention_reference as lar
import numpy as np
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

import keras_attention as ka

BACKEND = keras.backend.backend()
B, T, H, D, E = 2, 20, 2, 3, 2
CHUNKS = [1, 3, 4, 7, 8, 16, 20, 64]
DRAWS = settings(
    max_examples=max(
        2, settings.default.max_examples // (3 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)


def np_(x):
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def _jit(fn):
    if BACKEND != "jax":
        return fn
    import jax

    return jax.jit(fn, static_argnames=("chunk_size",))


@_jit
def _linear(q, k, v, a, mask, chunk_size):
    return ka.ops.linear_attention(
        q,
        k,
        v,
        feature_map="identity",
        decay=a,
        key_mask=mask,
        chunk_size=chunk_size,
        return_state=True,
    )


@_jit
def _delta(q, k, v, g, beta, mask, chunk_size):
    return ka.ops.gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        key_mask=mask,
        chunk_size=chunk_size,
        return_state=True,
    )


@st.composite
def problems(draw):
    """`(rng, log decays (B, T, H) <= 0, key mask (B, T))`."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mild = -rng.uniform(0, draw(st.sampled_from([0.01, 0.3])), (B, T, H))
    density = draw(st.sampled_from([0.05, 0.2, 0.5]), label="density")
    strong = rng.random((B, T, H)) < density
    magnitude = 10.0 ** rng.uniform(0, draw(st.integers(1, 4)), (B, T, H))
    a = np.where(strong, -magnitude, mild).astype("float32")
    mask = rng.random((B, T)) < draw(st.sampled_from([1.0, 0.8]))
    return rng, a, mask


def close(got, want):
    assert np.all(np.isfinite(got))
    scale = max(1e-6, float(np.max(np.abs(want))))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


@DRAWS
@given(problems(), st.sampled_from(CHUNKS))
def test_linear_attention(problem, chunk_size):
    rng, a, mask = problem
    q, k = rng.normal(size=(2, B, T, H, D)).astype("float32")
    v = rng.normal(size=(B, T, H, E)).astype("float32")
    out, state = _linear(q, k, v, a, mask, chunk_size=chunk_size)
    want, want_state, _ = lar.linear_attention(
        q, k, v, feature_map="identity", decay=a, key_mask=mask
    )
    close(np_(out), want)
    close(np_(state), want_state)


@functools.lru_cache(maxsize=None)
def _unit_keys(seed):
    k = np.random.default_rng(seed).normal(size=(B, T, H, D))
    return (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype("float32")


@DRAWS
@given(problems(), st.sampled_from(CHUNKS), st.integers(0, 3))
def test_gated_delta_rule(problem, chunk_size, key_seed):
    rng, g, mask = problem
    q = rng.normal(size=(B, T, H, D)).astype("float32")
    k = _unit_keys(key_seed)
    v = rng.normal(size=(B, T, H, E)).astype("float32")
    beta = rng.uniform(0.05, 0.95, size=(B, T, H)).astype("float32")
    out, state = _delta(q, k, v, g, beta, mask, chunk_size=chunk_size)
    want, want_state = gdr.gated_delta_rule(q, k, v, g, beta, key_mask=mask)
    close(np_(out), want)
    close(np_(state), want_state)
