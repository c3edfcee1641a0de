import numpy as np
import pytest
from keras import ops

from keras_attention import masks


def np_(x):
    return ops.convert_to_numpy(x)


def test_causal_mask():
    m = np_(masks.causal_mask(3))
    np.testing.assert_array_equal(m[0], np.tril(np.ones((3, 3), bool)))
    m = np_(masks.causal_mask(2, 5, offset=3))
    assert m.shape == (1, 2, 5)
    np.testing.assert_array_equal(m[0], [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


def test_padding_mask_from_lengths_and_masks():
    m = np_(masks.padding_mask(np.array([2, 4]), max_length=4))
    np.testing.assert_array_equal(m[:, 0], [[1, 1, 0, 0], [1, 1, 1, 1]])
    assert m.shape == (2, 1, 4)
    m2 = np_(masks.padding_mask(np.array([[1, 1, 0, 0], [1, 1, 1, 1]])))
    np.testing.assert_array_equal(m, m2)
    q = np.array([[True, False], [True, True]])
    m3 = np_(masks.padding_mask(np.array([2, 4]), max_length=4, query_mask=q))
    assert m3.shape == (2, 2, 4)
    assert not m3[0, 1].any()


def test_padding_mask_errors():
    with pytest.raises(ValueError, match="max_length"):
        masks.padding_mask(np.array([2, 4]))
    with pytest.raises(ValueError, match="lengths_or_mask"):
        masks.padding_mask(np.ones((2, 3, 4)))


def test_prefix_lm_mask():
    m = np_(masks.prefix_lm_mask(5, 2))[0]
    for i in range(5):
        for j in range(5):
            assert m[i, j] == (j <= i or j < 2)
    # Bidirectional inside the prefix: position 0 sees position 1.
    assert m[0, 1] and not m[0, 2]
    per_example = np_(masks.prefix_lm_mask(4, np.array([0, 3])))
    assert per_example.shape == (2, 4, 4)
    np.testing.assert_array_equal(
        per_example[0], np.tril(np.ones((4, 4), bool))
    )
    assert per_example[1, 0, 2] and not per_example[1, 0, 3]


def test_sliding_window_mask():
    m = np_(masks.sliding_window_mask(6, 1))[0]
    expected = np.abs(np.arange(6)[:, None] - np.arange(6)[None]) <= 1
    np.testing.assert_array_equal(m, expected)
    m = np_(masks.sliding_window_mask(6, (2, 0)))[0]
    i, j = np.arange(6)[:, None], np.arange(6)[None]
    np.testing.assert_array_equal(m, (j <= i) & (j >= i - 2))
    np.testing.assert_array_equal(
        np_(masks.sliding_window_mask(6, 2, causal=True))[0], m
    )
    assert np_(masks.sliding_window_mask(2, 1, key_length=5)).shape == (1, 2, 5)


@pytest.mark.parametrize("bad", [-1, (1, 2, 3), (1, -2), 1.5])
def test_sliding_window_errors(bad):
    with pytest.raises(ValueError, match="window_size"):
        masks.sliding_window_mask(4, bad)


def test_combine_masks():
    assert masks.combine_masks(None, None) is None
    a = masks.causal_mask(3)
    b = masks.padding_mask(np.array([2]), max_length=3)
    m = np_(masks.combine_masks(a, None, b))
    np.testing.assert_array_equal(
        m[0], np.tril(np.ones((3, 3), bool)) & [1, 1, 0]
    )


def test_negative_lengths_rejected():
    with pytest.raises(ValueError, match="query_length"):
        masks.causal_mask(-1)


# Bad arguments known at call time raise a ValueError naming them (with the
# value's repr); symbolic tensors inside a compiled function are left alone.


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: masks.sliding_window_mask(-1, 1), "query_length=-1"),
        (
            lambda: masks.sliding_window_mask(3, 1, key_length=-1),
            "key_length=-1",
        ),
        (lambda: masks.sliding_window_mask(3, 1, offset=1.5), "offset=1.5"),
        (
            lambda: masks.sliding_window_mask(3, 1, causal="False"),
            "causal='False'",
        ),
        (lambda: masks.sliding_window_mask(3, "2"), "window_size='2'"),
        (
            lambda: masks.sliding_window_mask(3, (1, 2.5)),
            r"window_size=\(1, 2.5\)",
        ),
        (lambda: masks.sliding_window_mask(3, True), "window_size=True"),
        (lambda: masks.causal_mask("3"), "query_length='3'"),
        (lambda: masks.causal_mask(3.0), "query_length=3.0"),
        (lambda: masks.causal_mask(3, key_length=-2), "key_length=-2"),
        (lambda: masks.causal_mask(np.int64(-1)), "query_length"),
        (
            lambda: masks.padding_mask(np.array([2, 3]), max_length=-1),
            "max_length=-1",
        ),
        (
            lambda: masks.padding_mask(np.array([2, 3]), max_length="4"),
            "max_length='4'",
        ),
        (
            lambda: masks.padding_mask(np.array([-1, 3]), 4),
            r"lengths_or_mask=.*-1",
        ),
        (
            lambda: masks.padding_mask(ops.convert_to_tensor([3, -2]), 4),
            r"lengths_or_mask=.*-2",
        ),
        (
            lambda: masks.padding_mask(np.array([2.0, 3.0]), 4),
            "lengths_or_mask",
        ),
        (
            lambda: masks.padding_mask(np.array([True, False]), 4),
            "lengths_or_mask",
        ),
        (lambda: masks.prefix_lm_mask(4, -1), "prefix_length=-1"),
        (
            lambda: masks.prefix_lm_mask(4, np.array([1, -2])),
            r"prefix_length=.*-2",
        ),
        (lambda: masks.prefix_lm_mask(-4, 1), "length=-4"),
        (lambda: masks.window_bounds(2, causal="True"), "causal='True'"),
    ],
)
def test_bad_concrete_arguments_raise(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_valid_numpy_and_tensor_arguments_accepted():
    m = np_(masks.causal_mask(np.int64(3), key_length=np.int32(4)))
    np.testing.assert_array_equal(
        m[0], np.arange(4)[None] <= np.arange(3)[:, None]
    )
    lengths = ops.convert_to_tensor(np.array([0, 3], "int32"))
    m = np_(masks.padding_mask(lengths, 3))[:, 0]
    np.testing.assert_array_equal(m, [[0, 0, 0], [1, 1, 1]])
    m = np_(masks.sliding_window_mask(3, 1, causal=np.bool_(True), offset=-1))[
        0
    ]
    i, j = np.arange(3)[:, None] - 1, np.arange(3)[None]
    np.testing.assert_array_equal(m, (j <= i) & (j >= i - 1))


def _compiled(fn, *args):
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)(*args)
    if keras.backend.backend() == "torch":
        import torch

        # Dynamo traces with fake tensors; the "eager" backend skips
        # inductor's C++ code generation (seconds, not a minute).
        args = [keras.ops.convert_to_tensor(a) for a in args]
        return torch.compile(fn, backend="eager", dynamic=True)(*args)
    import tensorflow as tf

    return tf.function(fn)(*args)


def test_symbolic_tensors_are_not_checked():
    """Inside a compiled function the values are unknown: no error, and the
    masks are still right."""

    def build(lengths, prefix, offset):
        return (
            masks.padding_mask(lengths, 4),
            masks.prefix_lm_mask(4, prefix),
            masks.causal_mask(2, 4, offset=offset),
            masks.sliding_window_mask(2, 1, key_length=4, offset=offset),
        )

    pad, prefix, causal, window = (
        np_(x)
        for x in _compiled(
            build,
            np.array([1, 4], "int32"),
            np.array([2, 0], "int32"),
            np.array(2, "int32"),
        )
    )
    np.testing.assert_array_equal(pad[:, 0], [[1, 0, 0, 0], [1, 1, 1, 1]])
    i, j = np.arange(4)[:, None], np.arange(4)[None]
    np.testing.assert_array_equal(prefix[0], (j <= i) | (j < 2))
    np.testing.assert_array_equal(prefix[1], j <= i)
    q = np.arange(2)[:, None] + 2
    np.testing.assert_array_equal(causal[0], j <= q)
    np.testing.assert_array_equal(window[0], (j >= q - 1) & (j <= q + 1))
