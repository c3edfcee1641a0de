"""Cache indices under Hypothesis (issue 36): every layer and block with a
key/value cache, at indices before, at and past the cache's end.

Draws: the layer (`MultiHeadAttention`, `GroupQueryAttention`,
`CausalSelfAttention`, `LocalSelfAttention`, `TransformerDecoderBlock`),
the cache's positions `L`, the call's steps `T`, and the index: any
integer from well below 0 to past `L` (huge ones too), as a Python int, a
NumPy integer or an eager tensor.

Properties:

- `0 <= index` and `index + T <= L`: the call returns the uncached
  causal pass's rows `index .. index + T - 1` (the cache filled at every
  position by one uncached-equivalent write at index 0, so later slots
  are masked by causality, and this call rewrites its own slots with the
  same keys);
- otherwise: `ValueError` naming the index argument (the block's own
  name, `self_attention_cache_update_index`), with its value and `L`;
- a rolling cache (`cache_sink_tokens`) wraps around by design: any
  index `>= 0` runs (outputs finite, of the documented shape), a
  negative one (or positions past int32's) raises naming the index.

Cost: five tiny layers built once, two cache lengths and two step counts
(few shapes, which JAX compiles once each); 25 draws ("ci" profile) per
property, fewer on JAX.
"""

import functools

import keras
import numpy as np
import pytest
from hypothesis import event
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from keras_attention import layers as ka
from keras_attention.blocks import TransformerDecoderBlock

BACKEND = keras.backend.backend()
DRAWS = settings(
    max_examples=max(
        5, settings.default.max_examples // (2 if BACKEND == "jax" else 1)
    )
)
LENGTHS = (2, 4)  # the cache's positions
STEPS = (1, 2)  # this call's positions
X = np.random.default_rng(36).normal(size=(1, 4, 8)).astype("float32")


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def _attention(layer):
    return lambda x, **kw: layer(x, x, use_causal_mask=True, **kw)


def _self(layer):
    return lambda x, **kw: layer(x, **kw)


def _block(block):
    def call(x, cache, cache_update_index, **kw):
        return block(
            x,
            self_attention_cache=cache,
            self_attention_cache_update_index=cache_update_index,
            **{f"self_attention_{k}": v for k, v in kw.items()},
        )

    return call


# name: (make, wrap, kv_heads, index argument's name)
LAYERS = {
    "mha": (
        lambda: ka.MultiHeadAttention(2, 4, num_key_value_heads=1),
        _attention,
        1,
        "cache_update_index",
    ),
    "gqa": (
        lambda: ka.GroupQueryAttention(4, 2, 1),
        _attention,
        1,
        "cache_update_index",
    ),
    "causal_self": (
        lambda: ka.CausalSelfAttention(2, 4),
        _self,
        2,
        "cache_update_index",
    ),
    "local": (
        lambda: ka.LocalSelfAttention(2, 4, window_size=1, causal=True),
        _self,
        2,
        "cache_update_index",
    ),
    "decoder_block": (
        lambda: TransformerDecoderBlock(
            2, 16, cross_attention=False, rotary_max_wavelength=100
        ),
        _block,
        2,
        "self_attention_cache_update_index",
    ),
    "windowed_block": (  # (rolling caches need a window)
        lambda: TransformerDecoderBlock(
            2,
            16,
            cross_attention=False,
            window_size=1,
            rotary_max_wavelength=100,
        ),
        _block,
        2,
        "self_attention_cache_update_index",
    ),
}
FULL_CACHE_LAYERS = ("mha", "gqa", "causal_self", "local", "decoder_block")


@functools.cache
def _layer(name):
    make, wrap, _, _ = LAYERS[name]
    layer = make()
    call = wrap(layer)
    if isinstance(layer, TransformerDecoderBlock):
        layer(X)
    else:
        call(X)  # build
    return call


@functools.cache
def _filled(name, length):
    """`(cache filled at positions 0 .. length - 1, uncached causal
    output of those positions)`."""
    call = _layer(name)
    kv_heads = LAYERS[name][2]
    empty = np.zeros((1, 2, length, kv_heads, 4), "float32")
    full, cache = call(X[:, :length], cache=empty, cache_update_index=0)
    return np_(cache), np_(full)


# The index: `("end", d)` is `L - T + d` (d = 0: the last valid index),
# `("at", i)` is `i` (huge ones).
INDICES = st.sampled_from(
    [("end", d) for d in (-4, -3, -2, -1, -1, 0, 0, 0, 1, 2, 3)]
    + [("at", i) for i in (-(2**31), 2**31 - 1, 10**6)]
)


def _index(where, length, steps):
    kind, value = where
    return length - steps + value if kind == "end" else value


INDEX_TYPES = st.sampled_from(["int", "int64", "int32", "tensor"])


def _as(kind, index):
    if kind == "int":
        return index
    if kind == "tensor":
        return ops.convert_to_tensor(index, "int32")
    if kind == "int32" and not -(2**31) <= index < 2**31:
        return np.int64(index)
    return getattr(np, kind)(index)


@DRAWS
@given(
    name=st.sampled_from(FULL_CACHE_LAYERS),
    length=st.sampled_from(LENGTHS),
    steps=st.sampled_from(STEPS),
    where=INDICES,
    kind=INDEX_TYPES,
)
def test_cache_index_is_refused_past_the_end_or_gives_the_full_pass(
    name, length, steps, where, kind
):
    index = _index(where, length, steps)
    call = _layer(name)
    argument = LAYERS[name][3]
    cache, full = _filled(name, length)
    fits = 0 <= index and index + steps <= length
    x = X[:, index : index + steps] if fits else X[:, :steps]
    if not fits:
        event("refused")
        with pytest.raises(ValueError, match=f"`{argument}`") as error:
            call(x, cache=cache, cache_update_index=_as(kind, index))
        message = str(error.value)
        assert f"{argument}={index!r}" in message
        assert f"{length} positions" in message
        return
    event("at the end" if index + steps == length else "inside")
    out, new_cache = call(x, cache=cache, cache_update_index=_as(kind, index))
    np.testing.assert_allclose(
        np_(out), full[:, index : index + steps], atol=1e-5
    )
    np.testing.assert_allclose(np_(new_cache), cache, atol=1e-5)


@DRAWS
@given(
    name=st.sampled_from(["local", "windowed_block"]),
    steps=st.sampled_from(STEPS),
    where=INDICES,
    kind=INDEX_TYPES,
)
def test_rolling_cache_wraps_around_and_refuses_negative_indices(
    name, steps, where, kind
):
    index = _index(where, 3, steps)
    call = _layer(name)
    argument = LAYERS[name][3]
    cache = np.zeros((1, 2, 3, 2, 4), "float32")  # sinks + window + 1
    kwargs = dict(
        cache=cache, cache_update_index=_as(kind, index), cache_sink_tokens=1
    )
    if index < 0 or index + steps > 2**31:  # (positions are int32)
        event("refused")
        with pytest.raises(ValueError, match=f"{argument}={index!r}"):
            call(X[:, :steps], **kwargs)
        return
    event("past the slots" if index + steps > 3 else "within the slots")
    out, new_cache = call(X[:, :steps], **kwargs)
    assert tuple(out.shape) == (1, steps, 8)
    assert tuple(new_cache.shape) == cache.shape
    assert np.all(np.isfinite(np_(out)))
