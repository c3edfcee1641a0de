"""`MultiHeadAttention(rotary_fraction=...)`: partial rotary positions;
and `RotaryEmbedding(rope_type="longrope")` (Phi-3's LongRoPE).
The first `2 * floor(key_dim * fraction / 2)` features of each head are
rotated (NumPy's RoPE over them, frequencies over them), the others pass
as they are; cached decoding equals the whole sequence; refusals."""

import numpy as np
import pytest
from keras import ops

import keras_attention as ka

B, T, HIDDEN, HEADS, KEY_DIM = 2, 5, 12, 2, 6
X = np.random.default_rng(5).normal(size=(B, T, HIDDEN)).astype("float32")


def numpy_rope(x, start, wavelength):
    """RoPE over the last axis (halves), positions `start ..`."""
    d = x.shape[-1]
    theta = wavelength ** (-np.arange(0, d, 2) / d)
    angles = (start + np.arange(x.shape[1]))[:, None] * theta[None]
    cos, sin = np.cos(angles)[None, :, None], np.sin(angles)[None, :, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def layer(fraction=0.5):
    mha = ka.layers.MultiHeadAttention(
        HEADS,
        KEY_DIM,
        rotary_max_wavelength=100.0,
        rotary_fraction=fraction,
    )
    mha.build(X.shape, X.shape)
    return mha


@pytest.mark.parametrize("fraction, rotated", [(0.5, 2), (0.7, 4), (1.0, 6)])
def test_the_first_features_are_rotated_the_rest_pass(fraction, rotated):
    mha = layer(fraction)
    q = ops.convert_to_numpy(mha._query_dense(X))
    got = ops.convert_to_numpy(mha._rotate(q, 3))
    want = numpy_rope(q[..., :rotated], 3, 100.0)
    np.testing.assert_allclose(got[..., :rotated], want, atol=1e-5)
    np.testing.assert_array_equal(got[..., rotated:], q[..., rotated:])


def test_cached_decoding_equals_the_whole_sequence():
    mha = layer(0.5)
    whole = ops.convert_to_numpy(mha(X, X, use_causal_mask=True))
    cache = np.zeros((B, 2, T, HEADS, KEY_DIM), "float32")
    steps = []
    for t in range(T):
        x = X[:, t : t + 1]
        out, cache = mha(
            x, x, cache=cache, cache_update_index=t, use_causal_mask=True
        )
        steps.append(ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), whole, atol=2e-5)


def test_config_round_trip():
    mha = layer(0.5)
    config = mha.get_config()
    assert config["rotary_fraction"] == 0.5
    clone = ka.layers.MultiHeadAttention.from_config(config)
    assert clone.rotary_fraction == 0.5 and clone._rotary_dims == 2
    assert "rotary_fraction" not in layer(1.0).get_config()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rotary_fraction=0.5), "rotary_max_wavelength=None"),
        (dict(rotary_fraction=1.5, rotary_max_wavelength=10.0), "1.5"),
        (dict(rotary_fraction=0.1, rotary_max_wavelength=10.0), "0.1"),
    ],
)
def test_refusals(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ka.layers.MultiHeadAttention(HEADS, KEY_DIM, **kwargs)


def test_blocks_pass_it_to_their_self_attention():
    block = ka.blocks.TransformerDecoderBlock(
        num_heads=HEADS,
        intermediate_dim=8,
        key_dim=KEY_DIM,
        cross_attention=False,
        rotary_max_wavelength=100.0,
        rotary_fraction=0.5,
    )
    block(X)
    assert block.self_attention._rotary_dims == 2
    config = block.get_config()
    assert config["rotary_fraction"] == 0.5
    assert type(block).from_config(config).rotary_fraction == 0.5


@pytest.mark.parametrize("start, length", [(0, 6), (0, 10), (5, 1), (8, 1)])
def test_longrope_equals_keras_hub_phi3_rotary(start, length):
    """`rope_type="longrope"` against keras-hub's Phi-3 "su" rotary: the
    short factors up to the pretraining length (8), the long ones past
    it (`start + length > 8`), cos and sin scaled by the attention
    factor of `max / pretraining = 8`."""
    from keras_hub.src.models.phi3.phi3_rotary_embedding import (
        Phi3SuScaledRotaryEmbedding,
    )

    x = np.random.default_rng(6).normal(size=(2, 10, 3, 4)).astype("float32")
    short, long = [1.0, 1.5], [2.0, 3.0]
    hub = Phi3SuScaledRotaryEmbedding(
        short, long, max_sequence_length=64, pretraining_sequence_length=8
    )
    ours = ka.layers.RotaryEmbedding(
        rope_type="longrope",
        short_factor=short,
        long_factor=long,
        original_max_position_embeddings=8,
        scaling_factor=8.0,
    )
    want = ops.convert_to_numpy(hub(x[:, :length], start_index=start))
    got = ops.convert_to_numpy(ours(x[:, :length], start_index=start))
    np.testing.assert_allclose(got, want, atol=1e-5)
    clone = ka.layers.RotaryEmbedding.from_config(ours.get_config())
    assert clone.long_factor == (2.0, 3.0)


def test_longrope_refusals():
    with pytest.raises(ValueError, match="short_factor=None"):
        ka.layers.RotaryEmbedding(rope_type="longrope", long_factor=[1.0])
    with pytest.raises(ValueError, match="longrope"):
        ka.layers.RotaryEmbedding(short_factor=[1.0], long_factor=[1.0])
    layer = ka.layers.RotaryEmbedding(
        rope_type="longrope", short_factor=[1.0], long_factor=[1.0]
    )
    with pytest.raises(ValueError, match="one factor per rotated pair"):
        layer(np.zeros((1, 3, 2, 8), "float32"))
