"""`keras_attention.ops.assign_slice`: a slice of a variable written in
place (what `from_huggingface` loads checkpoints with, chunk by chunk),
against NumPy's slice assignment, on every axis, cast to the variable's
dtype (bfloat16 included), the variable still the same one; a value that
does not fit is refused naming the shapes."""

import keras
import ml_dtypes
import numpy as np
import pytest

from keras_attention.ops import assign_slice


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_writes_the_slice_and_nothing_else(axis):
    rng = np.random.default_rng(0)
    start = rng.standard_normal((4, 5, 6)).astype("float32")
    variable = keras.Variable(start)
    want = start.copy()
    length = want.shape[axis]
    for a, b in ((1, 3), (3, length)):
        shape = list(want.shape)
        shape[axis] = b - a
        piece = rng.standard_normal(shape).astype("float32")
        index = [slice(None)] * 3
        index[axis] = slice(a, b)
        want[tuple(index)] = piece
        assign_slice(variable, piece, a, axis)
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(variable), want
        )
    assert variable.dtype == "float32" and tuple(variable.shape) == (4, 5, 6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_casts_to_the_variable_dtype(dtype):
    variable = keras.Variable(np.zeros((3, 4), "float32"), dtype=dtype)
    piece = np.array([[0.1, 0.2, 0.3, 0.4]] * 2, "float32")
    assign_slice(variable, piece, 1)
    got = keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32"))
    np_dtype = np.dtype(getattr(ml_dtypes, dtype, dtype))
    want = np.zeros((3, 4), "float32")
    want[1:] = piece.astype(np_dtype).astype("float32")
    np.testing.assert_array_equal(got, want)
    assert variable.dtype == dtype
    # A bfloat16 NumPy piece as it is.
    assign_slice(variable, piece[:1].astype(np_dtype), 0)
    got = keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32"))
    np.testing.assert_array_equal(got[0], want[1])


def test_a_list_is_a_value():
    variable = keras.Variable(np.zeros((2, 2), "float32"))
    assign_slice(variable, [[1.0, 2.0]], start=1)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(variable), [[0.0, 0.0], [1.0, 2.0]]
    )


@pytest.mark.parametrize(
    "shape, start, axis",
    [((2, 3), 3, 0), ((1, 4), 0, 0), ((1, 3), 0, 2), ((3,), 0, 0)],
)
def test_a_value_that_does_not_fit_is_refused(shape, start, axis):
    variable = keras.Variable(np.zeros((4, 3), "float32"))
    with pytest.raises(ValueError, match=r"\(4, 3\)") as error:
        assign_slice(variable, np.ones(shape, "float32"), start, axis)
    assert f"start={start!r}" in str(error.value)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), 0.0)
