"""`MultiHeadAttention(rotary_fraction=...)`: partial rotary positions.
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
