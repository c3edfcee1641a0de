"""`ConvolutionPaddingMask`: the real outputs of a stack of unpadded
strided convolutions, against a NumPy reference of the output-length
rule, against the convolutions themselves (an output is real exactly
when its window holds real steps only), against keras-hub's Moonshine
rule, in a functional model saved and reloaded, and its argument checks.
Backend-neutral."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import ConvolutionPaddingMask


def reference_lengths(lengths, kernel_sizes, strides):
    """floor((n - k) / s) + 1 per convolution (0 once n < k), in Python."""
    out = []
    for n in lengths:
        for k, s in zip(kernel_sizes, strides):
            n = (n - k) // s + 1 if n >= k else 0
        out.append(n)
    return np.array(out)


STACKS = [
    ((3,), (1,)),
    ((3, 2), (2, 2)),
    ((127, 7, 3), (64, 3, 2)),  # Moonshine's frontend
    ((10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2)),  # wav2vec 2.0's
]


@pytest.mark.parametrize("kernel_sizes,strides", STACKS)
def test_equals_the_output_length_rule(kernel_sizes, strides):
    rng = np.random.default_rng(0)
    steps = 3000
    lengths = np.concatenate(
        [[0, 1, kernel_sizes[0] - 1, kernel_sizes[0], steps]],
        axis=None,
    )
    lengths = np.concatenate([lengths, rng.integers(0, steps, 11)])
    mask = np.arange(steps)[None] < lengths[:, None]
    expected = reference_lengths(lengths, kernel_sizes, strides)
    out_steps = int(reference_lengths([steps], kernel_sizes, strides)[0])
    frames = np.zeros((len(lengths), out_steps, 2), "float32")
    layer = ConvolutionPaddingMask(kernel_sizes, strides)
    got = to_numpy(layer(frames, padding_mask=mask))
    assert got.dtype == bool and got.shape == (len(lengths), out_steps)
    np.testing.assert_array_equal(got.sum(-1), expected)
    np.testing.assert_array_equal(
        got, np.arange(out_steps)[None] < expected[:, None]
    )


def test_an_output_is_real_when_its_window_holds_real_steps_only():
    """Run the convolutions on the padding indicator: an output is real
    exactly where no padded step reached it."""
    kernel_sizes, strides = (5, 3), (2, 2)
    lengths = np.array([40, 23, 9, 4])
    mask = np.arange(40)[None] < lengths[:, None]
    x = (~mask).astype("float32")[..., None]
    for k, s in zip(kernel_sizes, strides):
        x = keras.layers.MaxPooling1D(k, s, padding="valid")(x)
    touched = to_numpy(x)[..., 0] > 0
    got = to_numpy(
        ConvolutionPaddingMask(kernel_sizes, strides)(x, padding_mask=mask)
    )
    np.testing.assert_array_equal(got, ~touched)


def test_equals_keras_hub_moonshine():
    backbone = pytest.importorskip(
        "keras_hub.src.models.moonshine.moonshine_backbone"
    )
    lengths = np.array([0, 126, 127, 500, 2047, 2048, 16000])
    theirs = to_numpy(backbone.compute_output_lengths(lengths))
    layer = ConvolutionPaddingMask((127, 7, 3), (64, 3, 2))
    np.testing.assert_array_equal(
        to_numpy(layer.output_lengths(lengths)), theirs
    )


def test_integer_masks_and_a_functional_model_round_trip(tmp_path):
    features = keras.Input((None, 3))
    mask = keras.Input((None,), dtype="int32")
    layer = ConvolutionPaddingMask([4, 2], [2, 1], name="frames_mask")
    model = keras.Model([features, mask], layer(features, padding_mask=mask))
    path = str(tmp_path / "mask.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    frames = np.zeros((2, 6, 3), "float32")
    padding = (np.arange(14)[None] < np.array([[14], [8]])).astype("int32")
    want = [[True] * 5 + [False], [True] * 2 + [False] * 4]
    for m in (model, reloaded):
        np.testing.assert_array_equal(to_numpy(m([frames, padding])), want)
    assert reloaded.get_layer("frames_mask").kernel_sizes == (4, 2)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(kernel_sizes=[3, 0], strides=[1, 1]), "kernel_sizes"),
        (dict(kernel_sizes=[], strides=[]), "kernel_sizes"),
        (dict(kernel_sizes=3, strides=[1]), "kernel_sizes"),
        (dict(kernel_sizes=[3], strides=[1.5]), "strides"),
        (dict(kernel_sizes=[3], strides=[True]), "strides"),
        (dict(kernel_sizes=[3, 2], strides=[1]), "one value per"),
    ],
)
def test_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConvolutionPaddingMask(**kwargs)


def test_array_likes_and_a_bad_mask():
    layer = ConvolutionPaddingMask(np.array([3]), (2,))
    assert layer.kernel_sizes == (3,) and layer.strides == (2,)
    with pytest.raises(ValueError, match="padding_mask"):
        layer(np.zeros((1, 2, 3), "float32"), padding_mask=np.ones((1, 2, 5)))
