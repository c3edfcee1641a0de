import re

import numpy as np
import pytest
from harness import run_layer_test
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import PositionEmbedding


def test_harness_position_embedding():
    x = np.random.default_rng(0).normal(size=(2, 5, 6)).astype("float32")
    run_layer_test(
        PositionEmbedding,
        dict(sequence_length=8),
        dict(inputs=x),
        expected_output_shape=(2, 5, 6),
        expected_num_trainable_weights=1,
    )


def test_rows_of_the_table_from_start_index():
    layer = PositionEmbedding(sequence_length=10)
    x = np.zeros((3, 4, 6), "float32")
    out = to_numpy(layer(x, start_index=5))
    table = to_numpy(layer.position_embeddings)
    for b in range(3):
        np.testing.assert_array_equal(out[b], table[5:9])


def test_errors():
    with pytest.raises(ValueError, match="sequence_length=0"):
        PositionEmbedding(sequence_length=0)
    with pytest.raises(ValueError, match="sequence_length=3"):
        PositionEmbedding(sequence_length=3)(np.zeros((1, 4, 2), "float32"))
    with pytest.raises(ValueError, match="inputs_shape"):
        PositionEmbedding(sequence_length=3)(np.zeros((1, 2), "float32"))


def test_errors_show_values_with_repr():
    with pytest.raises(ValueError, match=re.escape("sequence_length='4'")):
        PositionEmbedding(sequence_length="4")
