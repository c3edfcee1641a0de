import re

import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import TokenAndPositionEmbedding


def test_harness_token_and_position_embedding():
    ids = np.random.default_rng(0).integers(0, 20, size=(2, 5)).astype("int32")
    run_layer_test(
        TokenAndPositionEmbedding,
        dict(
            vocabulary_size=20,
            sequence_length=8,
            embedding_dim=6,
            mask_zero=True,
        ),
        dict(inputs=ids),
        expected_output_shape=(2, 5, 6),
        expected_num_trainable_weights=2,
    )


def test_sum_of_tables_and_mask():
    layer = TokenAndPositionEmbedding(20, 10, 4, mask_zero=True)
    ids = np.array([[3, 7, 0], [1, 0, 0]], "int32")
    out = to_numpy(layer(ids, start_index=2))
    tokens = to_numpy(layer.token_embedding.embeddings)
    positions = to_numpy(layer.position_embedding.position_embeddings)
    np.testing.assert_allclose(
        out, tokens[ids] + positions[2:5][None], atol=1e-6
    )
    np.testing.assert_array_equal(to_numpy(layer.compute_mask(ids)), ids != 0)
    assert TokenAndPositionEmbedding(20, 10, 4).compute_mask(ids) is None


def test_mask_reaches_the_next_layer():
    ids = keras.Input((None,), dtype="int32")
    x = TokenAndPositionEmbedding(20, 10, 4, mask_zero=True)(ids)
    assert getattr(x, "_keras_mask", None) is not None


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (
            dict(vocabulary_size=0, sequence_length=4, embedding_dim=2),
            "vocabulary_size=0",
        ),
        (
            dict(vocabulary_size=5, sequence_length=-1, embedding_dim=2),
            "sequence_length=-1",
        ),
        (
            dict(vocabulary_size=5, sequence_length=4, embedding_dim=1.5),
            "embedding_dim=1.5",
        ),
    ],
)
def test_constructor_errors(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TokenAndPositionEmbedding(**kwargs)


def test_build_error():
    with pytest.raises(ValueError, match="inputs_shape"):
        TokenAndPositionEmbedding(5, 4, 2)(np.zeros((1, 1, 1, 2, 3), "int32"))


@pytest.mark.parametrize("value", ["False", 0, None])
def test_mask_zero_refuses_non_bools(value):
    with pytest.raises(ValueError, match=re.escape(f"mask_zero={value!r}")):
        TokenAndPositionEmbedding(5, 4, 2, mask_zero=value)


# `positions=` (issue 36, defect 7): the position table's checks.


@pytest.mark.parametrize(
    "positions, shown",
    [([[-1, 0, 1]], "-1"), ([[0, 1, 4]], "4"), ([0, 1], "(2,)")],
)
def test_positions_outside_the_table_or_of_another_shape_are_refused(
    positions, shown
):
    layer = TokenAndPositionEmbedding(5, 4, 2)
    ids = np.array([[1, 2, 3]], "int32")
    with pytest.raises(ValueError, match="`positions`") as info:
        layer(ids, positions=np.array(positions))
    assert shown in str(info.value)
    out = to_numpy(layer(ids, positions=np.array([[3, 0, 3]])))
    tokens = to_numpy(layer.token_embedding.embeddings)
    table = to_numpy(layer.position_embedding.position_embeddings)
    np.testing.assert_allclose(
        out, tokens[ids] + table[[3, 0, 3]][None], atol=1e-6
    )
