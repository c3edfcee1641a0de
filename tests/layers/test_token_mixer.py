"""The cache protocol (`TokenMixer`, issue 54) of every library token
mixer: `init_cache` then cached calls in chunks, given only each chunk's
padding mask, give the uncached causal call's outputs at the real
tokens, with left and right padding; the cache keeps its structure and
shapes (every backend)."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import GatedDeltaNet
from keras_attention.layers import KimiDeltaAttention
from keras_attention.layers import LinearAttention
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import MultiHeadLatentAttention
from keras_attention.layers import SelfAttention
from keras_attention.layers import TokenMixer

STEPS, FEATURES = 9, 8


def make(kind):
    """`(layer, uncached call)` of a token mixer of `kind`."""
    if kind == "attention":
        layer = SelfAttention(2, 4, causal=True, num_key_value_heads=1)
        return layer, lambda x, mask: layer(x, mask=mask)
    if kind in ("window", "ring"):
        layer = LocalSelfAttention(2, 4, window_size=3, causal=True)
        return layer, lambda x, mask: layer(x, mask=mask)
    if kind == "latent":
        layer = MultiHeadLatentAttention(2, 6, 4, 2, 4)
        return layer, lambda x, mask: layer(
            x, query_mask=mask, use_causal_mask=True
        )
    if kind == "kda":
        layer = KimiDeltaAttention(FEATURES, 2, 4, chunk_size=4)
        return layer, lambda x, mask: layer(x, mask=mask)
    if kind == "linear":
        layer = LinearAttention(2, 4, decay="retention")
        return layer, lambda x, mask: layer(
            x, query_mask=mask, use_causal_mask=True
        )
    layer = GatedDeltaNet(
        hidden_size=FEATURES,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=4,
        linear_value_head_dim=4,
    )
    return layer, lambda x, mask: layer(x, mask=mask)


def inputs():
    rng = np.random.default_rng(54)
    x = rng.normal(size=(2, STEPS, FEATURES)).astype("float32")
    mask = np.ones((2, STEPS), bool)
    mask[0, :3] = False  # left padding
    mask[1, 7:] = False  # right padding
    return x, mask


@pytest.mark.parametrize(
    "kind",
    ["attention", "window", "ring", "latent", "linear", "gated_delta", "kda"],
)
def test_cached_chunks_equal_the_uncached_call(kind):
    keras.utils.set_random_seed(1)
    layer, uncached = make(kind)
    assert isinstance(layer, TokenMixer)
    x, mask = inputs()
    want = to_numpy(uncached(x, mask))
    options = dict(sink_tokens=0) if kind == "ring" else {}
    cache = layer.init_cache(2, STEPS, **options)
    shapes = [tuple(t.shape) for t in keras.tree.flatten(cache)]
    outputs = []
    for start, stop in ((0, 4), (4, 5), (5, STEPS)):
        y, cache = layer(
            x[:, start:stop],
            cache=cache,
            cache_update_index=start,
            padding_mask=mask[:, start:stop],
        )
        outputs.append(to_numpy(y))
    assert [tuple(t.shape) for t in keras.tree.flatten(cache)] == shapes
    np.testing.assert_allclose(
        np.concatenate(outputs, 1)[mask], want[mask], atol=2e-5
    )


def test_the_ring_holds_the_window_and_the_sinks():
    layer, _ = make("ring")
    layer(np.zeros((1, 2, FEATURES), "float32"))  # build
    cache = layer.init_cache(3, 1000, sink_tokens=2)
    # 2 sinks + a window of 3 earlier positions + the query's own.
    assert tuple(cache["keys_values"].shape) == (3, 2, 6, 2, 4)
    assert tuple(cache["slot_mask"].shape) == (3, 6)


def test_options_that_cannot_apply_are_refused():
    layer, _ = make("attention")
    x = np.zeros((1, 2, FEATURES), "float32")
    layer(x)  # build
    with pytest.raises(ValueError, match=r"sink_tokens=1.*window=None"):
        layer.init_cache(1, 4, sink_tokens=1)
    cache = layer.init_cache(1, 4)
    with pytest.raises(ValueError, match="cache_update_index=None"):
        layer(x, cache=cache)
    with pytest.raises(ValueError, match=r"4 positions.*index=3"):
        layer(x, cache=cache, cache_update_index=3)
    with pytest.raises(ValueError, match="built layer"):
        make("latent")[0].init_cache(1, 4)
