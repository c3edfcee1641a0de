"""`MixtureOfExperts(scale_expert_inputs=True)` (Llama 4's experts, each
fed the token times its routing weight) against a NumPy reference with
sigmoid top-k routing and a shared expert; refused beside expert biases;
kept in the config."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.layers import MixtureOfExperts

X = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")


def silu(x):
    return x / (1 + np.exp(-x))


def np_llama4_moe(layer, x):
    w = {v.path.split("/")[-1]: ops.convert_to_numpy(v) for v in layer.weights}
    flat = x.reshape(-1, x.shape[-1]).astype("float64")
    logits = flat @ w["router_kernel"]
    top = np.argsort(-logits, axis=-1)[:, : layer.top_k]
    out = np.zeros_like(flat)
    for n in range(flat.shape[0]):
        for e in top[n]:
            xe = flat[n] / (1 + np.exp(-logits[n, e]))  # input * sigmoid
            gate, up = np.split(xe @ w["gate_up_kernel"][e], 2)
            out[n] += (silu(gate) * up) @ w["down_kernel"][e]
    gate, up = np.split(flat @ w["shared_gate_up_kernel"], 2, axis=-1)
    out += (silu(gate) * up) @ w["shared_down_kernel"]
    return out.reshape(x.shape)


def test_scaled_inputs_equal_numpy():
    layer = MixtureOfExperts(
        4,
        2,
        6,
        routing="sigmoid_topk",
        shared_expert_dim=6,
        scale_expert_inputs=True,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.5),
    )
    got = ops.convert_to_numpy(layer(X))
    np.testing.assert_allclose(got, np_llama4_moe(layer, X), atol=1e-5)
    # Not the output-weighted mixture: the option changes the result.
    plain = MixtureOfExperts.from_config(
        dict(layer.get_config(), scale_expert_inputs=False)
    )
    plain(X)
    plain.set_weights(layer.get_weights())
    assert np.abs(ops.convert_to_numpy(plain(X)) - got).max() > 1e-3
    assert layer.get_config()["scale_expert_inputs"] is True


def test_refused_with_expert_biases():
    with pytest.raises(ValueError, match="scale_expert_inputs"):
        MixtureOfExperts(4, 2, 6, expert_bias=True, scale_expert_inputs=True)
    with pytest.raises(ValueError, match="scale_expert_inputs"):
        MixtureOfExperts(4, 2, 6, scale_expert_inputs="yes")
