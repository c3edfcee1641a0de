"""Chunked-cache decoding equals a full pass (issue 56): an attention
layer holding `mods.ChunkedCausalMask(c)`, fed its tokens in pieces of
any sizes over its own cache of one chunk (`init_cache(...,
sink_tokens=0)`: `c` slots), gives the uncached pass's outputs at every
real position, whatever the chunk size, the pieces (across boundaries,
longer than a chunk) and the right padding. Layers built once per chunk
size."""

import functools

import numpy as np
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from keras_attention import mods
from keras_attention.layers import SelfAttention

LENGTH = 9
X = np.random.default_rng(3).normal(size=(2, LENGTH, 8)).astype("float32")


@functools.cache
def layer(chunk):
    attention = SelfAttention(
        2,
        4,
        causal=True,
        num_key_value_heads=1,
        rotary_max_wavelength=50.0,
        mask_mod=mods.ChunkedCausalMask(chunk),
    )
    attention(X[:, :1])
    return attention


@st.composite
def draws(draw):
    chunk = draw(st.integers(1, 4))
    pieces, left = [], LENGTH
    while left:
        size = draw(st.integers(1, left))
        pieces.append(size)
        left -= size
    real = draw(st.integers(1, LENGTH))
    return chunk, pieces, real


@settings(max_examples=max(3, settings.default.max_examples // 8))
@given(draws())
def test_chunked_cache_decoding_equals_a_full_pass(draw):
    chunk, pieces, real = draw
    attention = layer(chunk)
    mask = np.ones((2, LENGTH), bool)
    mask[1, real:] = False
    want = ops.convert_to_numpy(attention(X, mask=mask))
    cache = attention.init_cache(2, LENGTH, sink_tokens=0)
    assert cache["keys_values"].shape[2] == chunk
    got, start = [], 0
    for size in pieces:
        part = slice(start, start + size)
        out, cache = attention(
            X[:, part],
            padding_mask=mask[:, part],
            cache=cache,
            cache_update_index=start,
        )
        got.append(ops.convert_to_numpy(out))
        start += size
    got = np.concatenate(got, axis=1)
    np.testing.assert_allclose(got[mask], want[mask], atol=1e-5)
