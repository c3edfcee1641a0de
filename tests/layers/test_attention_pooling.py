import keras
import numpy as np
import pytest
from harness import run_layer_test
from harness import run_mask_test
from keras import ops
from references import masked_softmax

from keras_attention.layers import AttentionPooling

X = np.random.default_rng(3).normal(size=(3, 5, 6)).astype("float32")


def np_(x):
    return ops.convert_to_numpy(x)


@pytest.mark.parametrize("units", [None, 4])
def test_harness(units):
    run_layer_test(
        AttentionPooling,
        dict(units=units),
        dict(inputs=X),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((3, 6), (3, 5)),
        expected_num_trainable_weights=1 if units is None else 3,
        run_saved_model=units is not None,
    )


def test_masks():
    run_mask_test(AttentionPooling, dict(units=4), ("inputs",), ("mask",))


def test_numpy_reference_and_padding():
    layer = AttentionPooling(units=4)
    mask = np.array([[1, 1, 1, 0, 0], [1] * 5, [0] * 5], bool)
    pooled, w = layer(X, mask=mask, return_attention_scores=True)
    wh, bh, v = (np.asarray(a) for a in layer.get_weights())
    scores = (np.tanh(X @ wh + bh) @ v)[..., 0]
    ref_w = masked_softmax(scores, mask)
    np.testing.assert_allclose(np_(w), ref_w, atol=1e-6)
    np.testing.assert_allclose(
        np_(pooled), np.einsum("bt,btd->bd", ref_w, X), atol=1e-5
    )
    assert np.all(np_(w)[0, 3:] == 0)
    assert np.all(np_(pooled)[2] == 0) and np.all(np_(w)[2] == 0)


def test_errors():
    with pytest.raises(ValueError, match="units.*Received"):
        AttentionPooling(units=0)
    with pytest.raises(ValueError, match="inputs_shape"):
        AttentionPooling()(np.ones((2, 3), "float32"))


@pytest.mark.parametrize("units", [None, 3])
def test_integer_inputs_are_pooled_in_float(units):
    # Defect 8: the float32 weights were cast to int32 (all zeros).
    x = np.arange(40).reshape(2, 5, 4).astype("int32") % 7
    layer = AttentionPooling(units=units)
    pooled, w = layer(x, return_attention_scores=True)
    assert keras.backend.standardize_dtype(pooled.dtype) == "float32"
    xf = x.astype("float32")
    weights = [np.asarray(a) for a in layer.get_weights()]
    if units is None:
        scores = (xf @ weights[0])[..., 0]
    else:
        wh, bh, v = weights
        scores = (np.tanh(xf @ wh + bh) @ v)[..., 0]
    ref_w = masked_softmax(scores, np.ones(scores.shape, bool))
    np.testing.assert_allclose(np_(w), ref_w, atol=1e-5)
    np.testing.assert_allclose(
        np_(pooled), np.einsum("bt,btd->bd", ref_w, xf), atol=1e-4
    )


def test_wrongly_sized_mask_names_the_argument():
    # Defect 8: this ended in an opaque SelectV2 broadcasting error.
    with pytest.raises(ValueError, match=r"`mask`.*\(3, 5, 6\).*\(3, 4\)"):
        AttentionPooling()(X, mask=np.ones((3, 4), bool))


def test_string_flags_are_refused():
    with pytest.raises(ValueError, match="use_bias='False'"):
        AttentionPooling(units=4, use_bias="False")
    with pytest.raises(ValueError, match="units='4'"):
        AttentionPooling(units="4")
