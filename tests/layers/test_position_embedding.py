import re

import keras
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


# `positions=` (issue 36, defect 7): eagerly, rows outside the table and
# shapes other than the inputs' are refused naming `positions`; compiled,
# the positions are clamped into the table.


def _layer_and_inputs(sequence_length=8):
    layer = PositionEmbedding(sequence_length=sequence_length)
    x = np.zeros((2, 4, 3), "float32")
    layer(x)
    return layer, x, to_numpy(layer.position_embeddings)


@pytest.mark.parametrize(
    "positions, shown",
    [
        ([-1, 0, 1, 2], "-1"),  # read the last row
        ([0, 1, 2, 8], "8"),  # past the table (GatherV2 error, XLA clamps)
        ([[0, 1, 2, 3], [0, 9, 2, 3]], "9"),
        ([0.0, 1.5, 2.0, 3.0], "1.5"),  # no row 1.5
    ],
)
def test_positions_outside_the_table_are_refused(positions, shown):
    layer, x, _ = _layer_and_inputs()
    with pytest.raises(ValueError, match="`positions`") as info:
        layer(x, positions=np.array(positions))
    assert shown in str(info.value) and "sequence_length=8" in str(info.value)


@pytest.mark.parametrize("shape", [(3,), (5,), (3, 4), (2, 5), (1, 1, 4), ()])
def test_positions_of_another_shape_are_refused(shape):
    layer, x, _ = _layer_and_inputs()
    with pytest.raises(ValueError, match="positions") as info:
        layer(x, positions=np.zeros(shape, "int32"))
    assert repr(shape) in str(info.value)


def test_positions_at_the_edges_and_broadcast_batch():
    layer, x, table = _layer_and_inputs()
    for positions in ([0, 7, 7, 0], [[7, 6, 5, 4]], [[0, 1, 2, 3], [7] * 4]):
        positions = np.array(positions)
        want = table[positions]
        want = np.broadcast_to(want if want.ndim == 3 else want[None], x.shape)
        np.testing.assert_array_equal(
            to_numpy(layer(x, positions=positions)), want
        )
    # An eager integer tensor is read as well.
    with pytest.raises(ValueError, match="positions"):
        layer(x, positions=keras.ops.convert_to_tensor([0, 1, 2, 8]))


def compiled(fn):
    """`fn` under the backend's compiler: `tf.function` (the graph Keras
    runs in `fit`/`predict`), `jax.jit`; PyTorch runs eagerly."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)
    if backend == "jax":
        import jax

        return jax.jit(fn)
    pytest.skip("PyTorch runs eagerly: the eager check refuses")


def test_compiled_positions_are_clamped_into_the_table():
    # The documented behaviour where the values cannot be read: a
    # negative position reads row 0, one past the end the last row, on
    # every backend (not the backend's gather: TensorFlow raises on CPU,
    # XLA clamps, JAX's `take` fills NaN).
    layer, x, table = _layer_and_inputs()
    run = compiled(lambda x, p: layer(x, positions=p))
    out = to_numpy(run(x, np.array([-3, 0, 8, 100], "int32")))
    np.testing.assert_array_equal(out[1], table[[0, 0, 7, 7]])
