"""`LocalSelfAttention(learned_sinks=True)`: the sinks on the band
(`local_attention(..., sink_logits=...)`), equal to NumPy (a softmax over
the window's scores and one sink logit per head) and to
`MultiHeadAttention(sliding_window=..., learned_sinks=True)` with the
same weights (its banded path), sinks of `-inf` and far below the scores
included; the layer's harness (serialization, `.keras` round trip,
`fit`, mixed precision) with the sinks.
"""

import numpy as np
import pytest
from harness import run_layer_test
from keras import ops
from references import qk_norm_sinks_attention
from sink_reference import band_mask

import keras_attention as ka

B, T, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2, 7, 8, 4, 2, 4
W = 3  # MultiHeadAttention's sliding_window: LocalSelfAttention's W - 1.
RNG = np.random.default_rng(111)
X = RNG.normal(size=(B, T, HIDDEN)).astype("float32")
PADDING = np.ones((B, T), bool)
PADDING[1, :2] = False  # Left padding.
SINKS = np.array([-np.inf, 0.5, -1e4, 2.0], "float32")


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def pair(causal):
    """`LocalSelfAttention` with learned sinks and `MultiHeadAttention`
    with the window and learned sinks, the same (random) weights."""
    kwargs = dict(
        num_heads=HEADS,
        key_dim=HEAD_DIM,
        num_key_value_heads=KV_HEADS,
        learned_sinks=True,
    )
    local = ka.layers.LocalSelfAttention(
        window_size=W - 1, causal=causal, **kwargs
    )
    mha = ka.layers.MultiHeadAttention(sliding_window=W, **kwargs)
    local.build(X.shape)
    mha.build(X.shape, X.shape)
    theirs = {w.path.split("/", 1)[1]: w for w in mha.weights}
    assert sorted(theirs) == sorted(
        w.path.split("/", 1)[1] for w in local.weights
    )
    for w in local.weights:
        name = w.path.split("/", 1)[1]
        value = RNG.normal(size=w.shape).astype("float32") * 0.5
        if name == "sinks":
            value = SINKS
        w.assign(value)
        theirs[name].assign(value)
    return local, mha


@pytest.mark.parametrize("causal", [True, False])
def test_equal_to_numpy_and_to_multi_head_attention(causal):
    local, mha = pair(causal)
    got = local(X, mask=PADDING)
    want = mha(
        X,
        X,
        query_mask=PADDING,
        value_mask=PADDING,
        use_causal_mask=causal,
    )
    left, right = (W - 1, 0) if causal else (W - 1, W - 1)
    mask = band_mask(T, left, right) & PADDING[:, None, None, :]
    mask = mask & PADDING[:, None, :, None]
    reference, weights = qk_norm_sinks_attention(local, X, X, mask)
    np.testing.assert_allclose(np_(got), reference, atol=2e-5)
    np.testing.assert_allclose(np_(got), np_(want), atol=2e-5)
    # The banded weights leave out the sinks' share (heads 1 and 3).
    _, banded = local(X, mask=PADDING, return_attention_scores=True)
    dense = np_(local.scores_to_dense(banded))
    np.testing.assert_allclose(dense, weights, atol=2e-5)
    sums = dense.sum(-1)[0]
    np.testing.assert_allclose(sums[[0, 2]], 1.0, atol=1e-5)
    assert np.all(sums[[1, 3]] < 1 - 1e-5)


def test_harness_with_learned_sinks():
    outputs = run_layer_test(
        ka.layers.LocalSelfAttention,
        dict(
            num_heads=2,
            key_dim=4,
            window_size=2,
            causal=True,
            learned_sinks=True,
        ),  # fmt: skip
        dict(inputs=X),
        expected_output_shape=(B, T, HIDDEN),
        expected_num_trainable_weights=9,  # 4 kernels, 4 biases, sinks.
        run_saved_model=False,  # test_local_self_attention.py exports.
    )
    assert np.all(np.isfinite(outputs[0]))
    layer = ka.layers.LocalSelfAttention(
        num_heads=2, key_dim=4, window_size=2, learned_sinks=True
    )
    assert layer.get_config()["learned_sinks"] is True
    revived = ka.layers.LocalSelfAttention.from_config(layer.get_config())
    assert revived.learned_sinks and revived.window_size == 2
