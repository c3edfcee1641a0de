"""Call inputs a built layer was not built for (found by the layer
properties of issue 23): other feature sizes, other ranks, strings,
positions past a table, and huge wavelengths. Each is a `ValueError` or
`TypeError` naming the argument; before, most crashed inside an op
(InvalidArgumentError from a reshape, broadcast, matmul or slice) or
returned garbage (a `(2, 4)` query gave a `(2, 4)` MultiHeadAttention
output)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import layers as ka
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock

X = np.ones((2, 3, 4), "float32")


def _self(layer, x):
    return layer(x)


def _pair(layer, x):
    return layer(x, x)


LAYERS = {
    "MultiHeadAttention": (lambda: ka.MultiHeadAttention(2, 2), _pair),
    "SelfAttention": (lambda: ka.SelfAttention(2, 2), _self),
    "LocalSelfAttention": (
        lambda: ka.LocalSelfAttention(2, 2, window_size=1),
        _self,
    ),
    "CrossAttention": (lambda: ka.CrossAttention(2, 2), _pair),
    "BahdanauAttention": (lambda: ka.BahdanauAttention(2), _pair),
    "LuongAttention": (lambda: ka.LuongAttention("general"), _pair),
    "AttentionPooling": (lambda: ka.AttentionPooling(2), _self),
    "FeedForward": (lambda: ka.FeedForward(3), _self),
    "PositionEmbedding": (lambda: ka.PositionEmbedding(5), _self),
    "TransformerEncoderBlock": (lambda: TransformerEncoderBlock(2, 3), _self),
    "TransformerDecoderBlock": (
        lambda: TransformerDecoderBlock(2, 3, cross_attention=False),
        _self,
    ),
    "AttentionRNNDecoder": (
        lambda: ka.AttentionRNNDecoder(3, ka.BahdanauAttention(2)),
        _pair,
    ),
}
NAMES = ("inputs", "query", "value", "memory")


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_other_feature_size_than_the_build(name):
    make, call = LAYERS[name]
    layer = make()
    call(layer, X)
    with pytest.raises(ValueError, match=r"must have 4 features.*=\(2, 3, 6\)"):
        call(layer, np.ones((2, 3, 6), "float32"))


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("shape", [(2, 4), (2, 3, 1, 4)])
def test_other_rank_than_the_build(name, shape):
    make, call = LAYERS[name]
    layer = make()
    call(layer, X)
    if name == "FeedForward" or (  # any rank from 2 to 5
        name == "PositionEmbedding" and len(shape) > 3  # keras-hub's
    ):  # `(batch, ..., T, d)`, rank 3 to 5
        assert tuple(call(layer, np.ones(shape, "float32")).shape) == shape
        return
    with pytest.raises(ValueError) as info:
        call(layer, np.ones(shape, "float32"))
    assert any(f"`{n}`" in str(info.value) for n in NAMES), info.value


@pytest.mark.tf_only("strings reach call() as tf.string tensors only")
@pytest.mark.parametrize(
    "name", sorted(set(LAYERS) - {"PositionEmbedding"})
)  # PositionEmbedding reads only the shape
def test_strings_are_refused(name):
    make, call = LAYERS[name]
    layer = make()
    call(layer, X)
    with pytest.raises(TypeError, match=r"must hold numbers"):
        call(layer, np.full((2, 3, 4), "a"))


def test_seq2seq_value_of_another_rank_after_the_build():
    # The shapes were checked again at call time only with an explicit key.
    layer = ka.BahdanauAttention(2)
    layer(X, X)
    with pytest.raises(ValueError, match=r"`value`.*value_shape=\(2, 4\)"):
        layer(X, X[:, 0])
    # Built with keys of 4 features, called without keys: `key` defaults
    # to the 3-feature value.
    layer = ka.BahdanauAttention(2)
    layer(X, X[..., :3], key=X)
    with pytest.raises(ValueError, match=r"`key`.*value_shape=\(2, 3, 3\)"):
        layer(X, X[..., :3])


def test_encoder_bridge_states_of_another_size():
    bridge = ka.EncoderBridge(3)
    bridge(X[:, 0], X[:, 0])
    with pytest.raises(ValueError, match=r"`backward_h` must have 4"):
        bridge(X[:, 0], np.ones((2, 5), "float32"))


def test_integer_inputs_of_a_block():
    # The residual sum mixed int32 and float32 (InvalidArgumentError).
    block = TransformerEncoderBlock(2, 3)
    ints = np.arange(24, dtype="int32").reshape(2, 3, 4) % 3
    want = block(ints.astype("float32"))
    np.testing.assert_allclose(
        ops.convert_to_numpy(block(ints)), ops.convert_to_numpy(want)
    )


def test_positions_past_the_table():
    # TensorFlow's slice failed, JAX's clamped into the wrong rows.
    layer = ka.PositionEmbedding(5)
    layer(X)
    with pytest.raises(ValueError, match=r"start_index=3, steps=3"):
        layer(X, start_index=3)
    with pytest.raises(ValueError, match=r"start_index=3, steps=3"):
        layer(X, start_index=np.int64(3))  # a tensor by the time of call
    with pytest.raises(ValueError, match=r"start_index=-1"):
        layer(X, start_index=-1)
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer(X, start_index=np.int64(2)))[0],
        ops.convert_to_numpy(layer.position_embeddings)[2:5],
    )


@pytest.mark.parametrize(
    "cls", [ka.RotaryEmbedding, ka.SinusoidalPositionEncoding]
)
def test_fractional_positions_are_refused(cls):
    x = np.ones((2, 3, 2, 4), "float32") if cls is ka.RotaryEmbedding else X
    with pytest.raises(ValueError, match=r"start_index=1.5"):
        cls()(x, start_index=1.5)
    # Negative positions are positions too (angles of either sign).
    assert tuple(cls()(x, start_index=-2).shape) == x.shape


@pytest.mark.parametrize(
    "cls", [ka.RotaryEmbedding, ka.SinusoidalPositionEncoding]
)
def test_huge_wavelength(cls):
    # 1e300 is finite but has no float32 value: the cast failed.
    x = np.ones((1, 3, 2, 4), "float32") if cls is ka.RotaryEmbedding else X
    got = ops.convert_to_numpy(cls(max_wavelength=1e300)(x))
    assert np.all(np.isfinite(got))
    # Every frequency but the first underflows to 0: angle m for k = 0.
    positions = np.arange(3, dtype="float32")
    if cls is ka.RotaryEmbedding:
        want = np.cos(positions) - np.sin(positions)
        np.testing.assert_allclose(got[0, :, 0, 0], want, atol=1e-6)
    else:
        np.testing.assert_allclose(got[0, :, 0], np.sin(positions), atol=1e-6)
        np.testing.assert_allclose(got[0, :, 3], 1.0, atol=1e-6)
    keras.backend.clear_session()
