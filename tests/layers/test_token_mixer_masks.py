"""A token mixer's `padding_mask` (the `TokenMixer` protocol's name) and
its own mask argument (`mask`, which Keras fills from the inputs' Keras
mask, or `query_mask`) given together are and-ed: before, the protocol's
silently replaced the layer's. Masks of two shapes are refused, naming
both. Every backend."""

import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import GatedDeltaNet
from keras_attention.layers import LinearAttention
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import MultiHeadLatentAttention

FEATURES = 8
LAYERS = {
    "gated_delta": (lambda: GatedDeltaNet(FEATURES, 2, 2, 4, 4), "mask"),
    "linear": (lambda: LinearAttention(2, 4), "query_mask"),
    "local": (lambda: LocalSelfAttention(2, 4, 2, causal=True), "mask"),
    "latent": (
        lambda: MultiHeadLatentAttention(2, 4, 4, 4, 4),
        "query_mask",
    ),
}


def masks():
    ones = np.ones((2, 6), bool)
    first, second = ones.copy(), ones.copy()
    first[0, 4:] = False  # row 0: padded from 4 by one mask...
    second[1, :2] = False  # ...row 1 by the other (left padding)
    return first, second


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_padding_mask_and_the_layers_mask_are_anded(name):
    make, argument = LAYERS[name]
    layer = make()
    x = np.random.default_rng(0).normal(size=(2, 6, FEATURES))
    x = x.astype("float32")
    first, second = masks()
    both = to_numpy(layer(x, padding_mask=first, **{argument: second}))
    want = to_numpy(layer(x, **{argument: first & second}))
    real = first & second
    np.testing.assert_allclose(both[real], want[real], atol=1e-6)
    # The protocol's alone and the layer's alone still apply as before.
    alone = to_numpy(layer(x, padding_mask=first.tolist()))
    own = to_numpy(layer(x, **{argument: first}))
    np.testing.assert_allclose(alone[first], own[first], atol=1e-6)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_masks_of_two_shapes_are_refused_naming_both(name):
    make, argument = LAYERS[name]
    x = np.zeros((2, 6, FEATURES), "float32")
    with pytest.raises(ValueError, match=rf"padding_mask.*{argument}.shape"):
        make()(
            x,
            padding_mask=np.ones((2, 6), bool),
            **{argument: np.ones((2, 5), bool)},
        )
