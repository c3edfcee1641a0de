import numpy as np
import pytest
from harness import run_layer_test

from keras_attention.layers import SinusoidalPositionEncoding


def sinusoid_reference(positions, d, max_wavelength=10000):
    pe = np.zeros((len(positions), d))
    for p, pos in enumerate(positions):
        for i in range(d):
            angle = pos / max_wavelength ** (2 * (i // 2) / d)
            pe[p, i] = np.sin(angle) if i % 2 == 0 else np.cos(angle)
    return pe


def test_harness_sinusoidal():
    x = np.random.default_rng(0).normal(size=(2, 5, 6)).astype("float32")
    run_layer_test(
        SinusoidalPositionEncoding,
        dict(max_wavelength=1000),
        dict(inputs=x),
        expected_output_shape=(2, 5, 6),
        expected_num_trainable_weights=0,
        run_fit=False,  # no weights to train
    )


def test_known_values():
    pe = np.asarray(
        SinusoidalPositionEncoding()(np.zeros((1, 3, 4), "float32"))
    )
    # Position 0: sin(0) = 0 on even features, cos(0) = 1 on odd ones.
    np.testing.assert_allclose(pe[0, 0], [0, 1, 0, 1], atol=1e-7)
    # Position 1, features 0/1: sin(1), cos(1); features 2/3: 1 / 10000^(2/4).
    np.testing.assert_allclose(
        pe[0, 1], [np.sin(1), np.cos(1), np.sin(0.01), np.cos(0.01)], atol=1e-6
    )


def test_matches_reference_with_start_index_and_odd_dim():
    x = np.zeros((2, 4, 7), "float32")
    pe = np.asarray(
        SinusoidalPositionEncoding(max_wavelength=500)(x, start_index=30)
    )
    np.testing.assert_allclose(
        pe[1], sinusoid_reference(np.arange(30, 34), 7, 500), atol=1e-5
    )


def test_errors():
    with pytest.raises(ValueError, match="max_wavelength=-1"):
        SinusoidalPositionEncoding(max_wavelength=-1)
    with pytest.raises(ValueError, match="inputs_shape"):
        SinusoidalPositionEncoding()(np.zeros((2, 4), "float32"))


# `positions=` (issue 36, defect 7): shapes other than the inputs' are
# refused naming `positions` and both shapes.


@pytest.mark.parametrize("shape", [(3,), (5,), (3, 4), (2, 5), (1, 1, 4), ()])
@pytest.mark.parametrize("rank", [3, 4])
def test_positions_of_another_shape_are_refused(shape, rank):
    x = np.zeros((2, 4, 6) if rank == 3 else (2, 3, 4, 6), "float32")
    with pytest.raises(ValueError, match="positions") as info:
        SinusoidalPositionEncoding()(x, positions=np.zeros(shape, "int32"))
    message = str(info.value)
    assert repr(shape) in message and repr(x.shape) in message


def test_positions_of_each_accepted_shape_match_the_reference():
    x = np.zeros((2, 3, 4, 6), "float32")  # keras-hub's (batch, ..., T, d)
    layer = SinusoidalPositionEncoding(max_wavelength=100)
    for positions in (
        np.array([-3.0, 0.5, 2.0, 1e3]),
        np.array([[2, 0, 1, 3]]),
        np.array([[0, 1, 2, 3], [9, -9, 4, 4]]),
    ):
        rows = np.broadcast_to(np.atleast_2d(positions), (2, 4))
        want = np.stack([sinusoid_reference(r, 6, 100) for r in rows])
        want = np.broadcast_to(want[:, None], x.shape)
        got = np.asarray(layer(x, positions=positions))
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-5)
