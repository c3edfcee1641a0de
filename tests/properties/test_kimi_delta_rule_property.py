"""Kimi delta attention (the gated delta rule with a decay per key
channel) and `KimiDeltaAttention` under Hypothesis.

Draws (shapes fixed: JAX compiles per shape, so the draws reuse the
same programs; on JAX the op runs under one `jax.jit` per chunk size):
the values, decays per channel from none to strong (some channels
forgetting at once beside others that keep), the chunk size (dividing
the length or not, longer than it), a layout of packed documents,
padding anywhere (a fully padded row at times) and an initial state.

Properties: the chunked form equals the recurrent form and the NumPy
recurrence (`tests/gated_delta_reference.py`), outputs and final state;
padded tokens give zeros; no NaN. The layer: the uncached chunked call
equals the same tokens fed through its cache in random pieces (the
recurrent form for pieces of one token), at the real tokens.
"""

import functools

import gated_delta_reference as ref
import keras
import numpy as np
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops
from test_gated_delta_rule_property import layouts

import keras_attention as ka

BACKEND = keras.backend.backend()
B, T, HK, HV, D, E = 2, 9, 1, 2, 3, 2
CHUNKS = [1, 2, 3, 4, 5, 8, 9, 16]
DRAWS = settings(
    max_examples=max(
        1, settings.default.max_examples // (2 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def _op(q, k, v, g, beta, state, segment_ids, key_mask, chunk_size):
    return ka.ops.gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        chunk_size=chunk_size,
        initial_state=state,
        return_state=True,
        segment_ids=segment_ids,
        key_mask=key_mask,
    )


if BACKEND == "jax":
    import jax

    _op = jax.jit(_op, static_argnames=("chunk_size",))


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@DRAWS
@given(
    seed=st.integers(0, 2**16),
    chunk_size=st.sampled_from(CHUNKS),
    layout=layouts(),
    with_state=st.booleans(),
    strongest=st.sampled_from([0.0, 5.0, 1e4]),
)
def test_chunked_recurrent_and_numpy_agree(
    seed, chunk_size, layout, with_state, strongest
):
    rng = np.random.default_rng(seed)
    q = _unit(rng.normal(size=(B, T, HK, D))).astype("float32")
    k = _unit(rng.normal(size=(B, T, HK, D))).astype("float32")
    v = rng.normal(size=(B, T, HV, E)).astype("float32")
    g = np.log(rng.uniform(0.05, 1.0, size=(B, T, HV, D)))
    # Some channels forget strongly (down to -1e4, all at once), the
    # others as drawn.
    strong = rng.random((B, T, HV, D)) < 0.2
    g = np.where(strong, -strongest, g).astype("float32")
    beta = rng.uniform(0.0, 1.0, size=(B, T, HV)).astype("float32")
    state = np.zeros((B, HV, D, E), "float32")
    if with_state:
        state = rng.normal(size=state.shape).astype("float32")
    segment_ids, mask = layout
    args = (q, k, v, g, beta, state, segment_ids, mask)
    want, want_state = ref.gated_delta_rule(
        q, k, v, g, beta, state, segment_ids, mask
    )
    for form in (chunk_size, None):
        out, final = (np_(x) for x in _op(*args, chunk_size=form))
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(final))
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(final, want_state, rtol=1e-5, atol=1e-5)
        assert np.all(out[~mask] == 0.0)


CONFIG = dict(hidden_size=6, num_heads=2, head_dim=3, conv_kernel_size=3)


@functools.lru_cache(maxsize=None)
def _layer(chunk_size):
    """`(layer, call)`: a built layer with random weights and its call
    on `(x, mask, cache)` (one `jax.jit` per layer on JAX)."""
    layer = ka.layers.KimiDeltaAttention(**CONFIG, chunk_size=chunk_size)
    layer.build((None, None, 5))
    rng = np.random.default_rng(0)
    layer.set_weights(
        [rng.normal(size=w.shape).astype("float32") for w in layer.weights]
    )

    def call(x, mask, cache):
        return layer(x, mask=mask, cache=cache)

    if BACKEND == "jax":
        call = jax.jit(call)
    return layer, call


@DRAWS
@given(
    seed=st.integers(0, 2**16),
    chunk_size=st.sampled_from([2, 4, 64]),
    layout=layouts(),
    cuts=st.sets(st.integers(1, T - 1), max_size=4),
)
def test_layer_cached_pieces_equal_the_uncached_call(
    seed, chunk_size, layout, cuts
):
    layer, call = _layer(chunk_size)
    x = np.random.default_rng(seed).normal(size=(B, T, 5)).astype("float32")
    _, mask = layout
    whole, _ = call(x, mask, layer.init_cache(B))
    whole = np_(whole)
    cache, pieces = layer.init_cache(B), []
    bounds = [0] + sorted(cuts) + [T]
    for a, b in zip(bounds[:-1], bounds[1:]):
        out, cache = call(x[:, a:b], mask[:, a:b], cache)
        pieces.append(np_(out))
    got = np.concatenate(pieces, axis=1)
    assert np.all(np.isfinite(got))
    scale = max(1.0, float(np.abs(whole[mask]).max(initial=0.0)))
    np.testing.assert_allclose(
        got[mask], whole[mask], rtol=1e-4, atol=1e-5 * scale
    )
    assert np.all(got[~mask] == 0.0)
