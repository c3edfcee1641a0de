"""Blocks with `learned_sinks` and `window_size` (gpt-oss's windowed
layers): the self-attention is `SelfAttention(sliding_window=left + 1)`,
equal to the same block windowed by a mask object instead; the rolling
cache sees its window; windows it cannot express are refused."""

import numpy as np
import pytest
from keras import ops

import keras_attention as ka

B, T, F = 2, 7, 16
X = np.random.default_rng(52).normal(size=(B, T, F)).astype("float32")
PADDING = np.ones((B, T), bool)
PADDING[1, :2] = False  # Left padding.


def decoder(**kwargs):
    layer = ka.blocks.TransformerDecoderBlock(
        num_heads=4,
        intermediate_dim=8,
        cross_attention=False,
        num_key_value_heads=2,
        norm_first=True,
        rotary_max_wavelength=100,
        learned_sinks=True,
        **kwargs,
    )
    layer(X)
    return layer


@pytest.mark.parametrize("window", [2, (2, 5)])
def test_windowed_block_equals_the_block_with_a_window_mask(window):
    layer = decoder(window_size=window)
    attention = layer.self_attention
    assert type(attention) is ka.layers.SelfAttention
    assert attention.sliding_window == 3 and attention.cache_window() == 2
    reference = decoder(mask_mod=ka.mods.SlidingWindowMask(2, causal=True))
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=w.shape) * 0.5 for w in layer.get_weights()]
    layer.set_weights(weights)
    reference.set_weights(weights)
    got = ops.convert_to_numpy(layer(X, padding_mask=PADDING))
    want = ops.convert_to_numpy(reference(X, padding_mask=PADDING))
    np.testing.assert_allclose(got[PADDING], want[PADDING], atol=2e-5)


def test_config_round_trip_keeps_the_sliding_window():
    layer = decoder(window_size=3)
    clone = type(layer).from_config(layer.get_config())
    clone(X)
    assert clone.self_attention.sliding_window == 4


def test_uneven_windows_without_causal_are_refused():
    block = ka.blocks.TransformerEncoderBlock(
        num_heads=4, intermediate_dim=8, window_size=(2, 1), learned_sinks=True
    )
    with pytest.raises(ValueError, match=r"window_size=\(2, 1\)"):
        block(X)
    even = ka.blocks.TransformerEncoderBlock(
        num_heads=4, intermediate_dim=8, window_size=2, learned_sinks=True
    )
    even(X)
    assert even.self_attention.sliding_window == 3
