import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras import ops

from keras_attention.layers import EncoderBridge

RNG = np.random.default_rng(6)
HF, HB, CF, CB = (RNG.normal(size=(3, 4)).astype("float32") for _ in range(4))


def np_(x):
    return ops.convert_to_numpy(x)


def test_harness_gru():
    run_layer_test(
        EncoderBridge,
        dict(units=6),
        dict(forward_h=HF, backward_h=HB),
        expected_output_shape=(3, 6),
        expected_num_trainable_weights=2,
        vary_sequence_length=False,
    )


def test_harness_lstm():
    run_layer_test(
        EncoderBridge,
        dict(units=6, cell="lstm"),
        dict(forward_h=HF, backward_h=HB, forward_c=CF, backward_c=CB),
        expected_output_shape=((3, 6), (3, 6)),
        expected_num_trainable_weights=4,
        vary_sequence_length=False,
        run_mixed_precision=False,  # covered by the GRU case
    )


def test_reference_and_bidirectional_states():
    # s_0 = tanh(W [h_fwd_T; h_bwd_1] + b), for h and (LSTM) c.
    bridge = EncoderBridge(5, cell="lstm", bias_initializer="normal")
    h0, c0 = bridge(HF, HB, CF, CB)
    w, b = (np_(x) for x in bridge.state_dense.weights)
    np.testing.assert_allclose(
        np_(h0), np.tanh(np.concatenate([HF, HB], -1) @ w + b), atol=1e-6
    )
    w, b = (np_(x) for x in bridge.carry_dense.weights)
    np.testing.assert_allclose(
        np_(c0), np.tanh(np.concatenate([CF, CB], -1) @ w + b), atol=1e-6
    )
    # The states Bidirectional returns: forward's last step, backward's first.
    x = RNG.normal(size=(2, 5, 3)).astype("float32")
    encoder = keras.layers.Bidirectional(
        keras.layers.GRU(4, return_sequences=True, return_state=True)
    )
    seq, fh, bh = encoder(x)
    np.testing.assert_allclose(np_(fh), np_(seq)[:, -1, :4], atol=1e-6)
    np.testing.assert_allclose(np_(bh), np_(seq)[:, 0, 4:], atol=1e-6)
    s0 = EncoderBridge(7)(fh, bh)
    assert tuple(s0.shape) == (2, 7)


def test_errors():
    with pytest.raises(ValueError, match="units=0"):
        EncoderBridge(0)
    with pytest.raises(ValueError, match="cell='rnn'"):
        EncoderBridge(4, cell="rnn")
    with pytest.raises(ValueError, match="forward_c_shape=None"):
        EncoderBridge(4, cell="lstm")(HF, HB)
    with pytest.raises(ValueError, match="forward_h_shape"):
        EncoderBridge(4)(np.ones((2, 3, 4), "float32"), HB)
