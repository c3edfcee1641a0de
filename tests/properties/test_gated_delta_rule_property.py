"""The gated delta rule and `GatedDeltaNet` under Hypothesis.

Draws (shapes fixed: JAX compiles per shape, so the draws reuse the
same programs; on JAX the op runs under one `jax.jit` per chunk size):
the values, the chunk size (dividing the length or not, longer than
it), a layout of packed documents, padding anywhere (a fully padded row
at times) and an initial state.

Properties: the chunked form, the recurrent form and the NumPy
recurrence (`tests/gated_delta_reference.py`) agree, outputs and final
state; padded tokens give zeros; no NaN. The layer: its outputs at real
tokens equal the NumPy layer run with the padded tokens taken out of the
row (convolution and state skip them), documents restarting both.
"""

import functools

import gated_delta_reference as ref
import keras
import numpy as np
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

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


@st.composite
def layouts(draw, batch=B, length=T):
    """`(segment_ids, mask)`: documents starting at random positions,
    padding anywhere (sometimes a whole row)."""
    seed = draw(st.integers(0, 2**16), label="layout seed")
    rng = np.random.default_rng(seed)
    starts = rng.random((batch, length)) < draw(st.sampled_from([0, 0.2, 0.5]))
    segment_ids = np.cumsum(starts, axis=1).astype("int32")
    mask = rng.random((batch, length)) < draw(st.sampled_from([1.0, 0.8, 0.5]))
    if draw(st.integers(0, 5)) == 0:
        mask[draw(st.integers(0, batch - 1))] = False
    return segment_ids, mask


@DRAWS
@given(
    seed=st.integers(0, 2**16),
    chunk_size=st.sampled_from(CHUNKS),
    layout=layouts(),
    with_state=st.booleans(),
)
def test_chunked_recurrent_and_numpy_agree(
    seed, chunk_size, layout, with_state
):
    rng = np.random.default_rng(seed)
    q = _unit(rng.normal(size=(B, T, HK, D))).astype("float32")
    k = _unit(rng.normal(size=(B, T, HK, D))).astype("float32")
    v = rng.normal(size=(B, T, HV, E)).astype("float32")
    g = np.log(rng.uniform(0.05, 1.0, size=(B, T, HV))).astype("float32")
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


CONFIG = dict(
    hidden_size=6,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=3,
    linear_value_head_dim=2,
    linear_conv_kernel_dim=3,
)


@functools.lru_cache(maxsize=None)
def _layer(chunk_size, packed):
    """`(layer, call)`: a built layer with random weights and its call
    on `(x, mask, segment_ids)` (one `jax.jit` per layer on JAX)."""
    layer = ka.layers.GatedDeltaNet(**CONFIG, chunk_size=chunk_size)
    layer.build((None, None, 5))
    rng = np.random.default_rng(0)
    layer.set_weights(
        [rng.normal(size=w.shape).astype("float32") for w in layer.weights]
    )

    def call(x, mask, segment_ids):
        return layer(x, mask=mask, segment_ids=segment_ids if packed else None)

    if BACKEND == "jax":
        call = jax.jit(call)
    return layer, call


@DRAWS
@given(
    seed=st.integers(0, 2**16),
    chunk_size=st.sampled_from([2, 64]),
    layout=layouts(),
    packed=st.booleans(),
)
def test_layer_skips_padding_and_restarts_documents(
    seed, chunk_size, layout, packed
):
    layer, call = _layer(chunk_size, packed)
    x = np.random.default_rng(seed).normal(size=(B, T, 5)).astype("float32")
    segment_ids, mask = layout
    out = np_(call(x, mask, segment_ids))
    want, _, _ = ref.layer(
        ref.layer_weights(layer),
        CONFIG,
        x,
        mask,
        segment_ids if packed else None,
    )
    assert np.all(np.isfinite(out))
    # float32 against the float64 reference: an absolute error relative
    # to the outputs' scale (seed 10326 drew outputs of ~2 and an error of
    # 1.6e-5, on 292214a as now).
    scale = max(1.0, float(np.abs(want[mask]).max(initial=0.0)))
    np.testing.assert_allclose(
        out[mask], want[mask], rtol=1e-4, atol=1e-5 * scale
    )
    assert np.all(out[~mask] == 0.0)
