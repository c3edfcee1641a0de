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
    np.testing.assert_array_equal(per_example[0], np.tril(np.ones((4, 4), bool)))
    assert per_example[1, 0, 2] and not per_example[1, 0, 3]


def test_sliding_window_mask():
    m = np_(masks.sliding_window_mask(6, 1))[0]
    expected = np.abs(np.arange(6)[:, None] - np.arange(6)[None]) <= 1
    np.testing.assert_array_equal(m, expected)
    m = np_(masks.sliding_window_mask(6, (2, 0)))[0]
    i, j = np.arange(6)[:, None], np.arange(6)[None]
    np.testing.assert_array_equal(m, (j <= i) & (j >= i - 2))
    np.testing.assert_array_equal(np_(masks.sliding_window_mask(6, 2, causal=True))[0], m)
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
    np.testing.assert_array_equal(m[0], np.tril(np.ones((3, 3), bool)) & [1, 1, 0])


def test_negative_lengths_rejected():
    with pytest.raises(ValueError, match="query_length"):
        masks.causal_mask(-1)
