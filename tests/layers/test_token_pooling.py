"""`TokenPooling`: the hidden state of one token per sequence (first,
last real, end token), against NumPy indexing; masks, refusals, the
shared harness."""

import re

import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import TokenPooling

RNG = np.random.default_rng(0)
X = RNG.normal(size=(3, 5, 4)).astype("float32")
IDS = np.array([[4, 9, 2, 0, 0], [2, 7, 7, 3, 2], [5, 6, 8, 1, 3]], "int32")
RIGHT = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)


def test_first_is_position_zero():
    np.testing.assert_array_equal(to_numpy(TokenPooling()(X)), X[:, 0])


def test_last_without_mask_is_the_last_column():
    np.testing.assert_array_equal(to_numpy(TokenPooling("last")(X)), X[:, -1])


@pytest.mark.parametrize("left", [False, True])
def test_last_real_token_right_and_left_padding(left):
    mask = RIGHT[:, ::-1] if left else RIGHT
    out = to_numpy(TokenPooling("last")(X, padding_mask=mask))
    last = [max(np.flatnonzero(row)) for row in mask]
    np.testing.assert_array_equal(out, X[np.arange(3), last])


def test_last_reads_the_keras_mask_and_pools_zeros_without_real_tokens():
    mask = RIGHT.copy()
    mask[2] = False
    layer = TokenPooling("last")
    inputs = keras.Input((5, 4))
    masked = keras.layers.Masking(mask_value=0.0)(inputs)
    model = keras.Model(inputs, layer(masked))
    x = X * mask[..., None]
    out = to_numpy(model(x))
    np.testing.assert_array_equal(out[:2], X[[0, 1], [2, 4]])
    np.testing.assert_array_equal(out[2], np.zeros(4, "float32"))


def test_eos_first_occurrence_else_position_zero():
    out = to_numpy(TokenPooling("eos", eos_token_id=2)(X, token_ids=IDS))
    # Row 0: the 2 at position 2; row 1: the first of two; row 2: none.
    np.testing.assert_array_equal(out, X[np.arange(3), [2, 0, 0]])


def test_eos_without_an_id_is_the_largest_id():
    out = to_numpy(TokenPooling("eos")(X, token_ids=IDS.tolist()))
    np.testing.assert_array_equal(out, X[np.arange(3), IDS.argmax(-1)])


def test_under_jit_and_in_a_functional_model():
    inputs = keras.Input((5, 4))
    ids = keras.Input((5,), dtype="int32")
    pooled = TokenPooling("eos", eos_token_id=3)(inputs, token_ids=ids)
    model = keras.Model([inputs, ids], pooled)
    out = to_numpy(model.predict([X, IDS], verbose=0))
    np.testing.assert_array_equal(out, X[np.arange(3), [0, 3, 4]])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(position="middle"), "position='middle'"),
        (dict(position="first", eos_token_id=2), "eos_token_id=2"),
        (dict(position="eos", eos_token_id=-1), "eos_token_id=-1"),
        (dict(position="eos", eos_token_id=True), "eos_token_id=True"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        TokenPooling(**kwargs)


def test_bad_calls_are_refused_by_name():
    with pytest.raises(ValueError, match="token_ids=None"):
        TokenPooling("eos")(X)
    with pytest.raises(ValueError, match="token_ids"):
        TokenPooling("first")(X, token_ids=IDS)
    with pytest.raises(ValueError, match="padding_mask"):
        TokenPooling("eos")(X, token_ids=IDS, padding_mask=RIGHT)
    with pytest.raises(ValueError, match="token_ids"):
        TokenPooling("eos")(X, token_ids=IDS[:, :4])
    with pytest.raises(TypeError, match="token_ids.dtype='float32'"):
        TokenPooling("eos")(X, token_ids=IDS.astype("float32"))
    with pytest.raises(ValueError, match="padding_mask"):
        TokenPooling("last")(X, padding_mask=RIGHT[:, :4])


@pytest.mark.parametrize("position", ["first", "last"])
def test_harness(position):
    run_layer_test(
        TokenPooling,
        dict(position=position),
        dict(inputs=X),
        expected_output_shape=(3, 4),
        expected_num_trainable_weights=0,
        run_fit=False,
    )
