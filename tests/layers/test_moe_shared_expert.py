"""`MixtureOfExperts(shared_expert_dim=..., shared_expert_gate=...)`: a
SwiGLU expert every token goes through, added to the routed experts'
output, optionally scaled by `sigmoid(x w_g)` (Qwen-MoE, Qwen 3.5-MoE).
Against a NumPy reference; weights, config and `.keras` round trips,
training; keras-hub 0.32's `QwenSparseMoeBlock` and `Qwen3_5MoeSparseMoeBlock`
copied by `from_keras_hub`; refusals. Backend-neutral."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import MixtureOfExperts

B, T, D, E, F, S = 2, 5, 8, 4, 6, 10
X = np.random.default_rng(0).normal(size=(B, T, D)).astype("float32")


def _layer(gate=True, **kwargs):
    layer = MixtureOfExperts(
        E,
        2,
        F,
        normalize_top_k=True,
        shared_expert_dim=S,
        shared_expert_gate=gate,
        **kwargs,
    )
    layer.build((None, None, D))
    rng = np.random.default_rng(1)
    layer.set_weights(
        [
            rng.normal(size=w.shape).astype("float32") * 0.5
            for w in layer.weights
        ]
    )
    return layer


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_moe(x, w, gate):
    """Softmax routing, top 2 renormalized, SwiGLU experts, plus the
    (gated) shared SwiGLU expert."""
    x = x.reshape(-1, D).astype("float64")
    names = [
        "router_kernel",
        "gate_up_kernel",
        "down_kernel",
        "shared_gate_up_kernel",
        "shared_down_kernel",
    ] + (["shared_gate_kernel"] if gate else [])
    w = dict(zip(names, w))
    logits = x @ w["router_kernel"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1)[:, :2]
    out = np.zeros_like(x)
    for n in range(len(x)):
        kept = probs[n, top[n]] / probs[n, top[n]].sum()
        for e, p in zip(top[n], kept):
            h = x[n] @ w["gate_up_kernel"][e]
            g, u = h[:F], h[F:]
            out[n] += p * (_silu(g) * u) @ w["down_kernel"][e]
    h = x @ w["shared_gate_up_kernel"]
    shared = (_silu(h[:, :S]) * h[:, S:]) @ w["shared_down_kernel"]
    if gate:
        shared = shared * _sigmoid(x @ w["shared_gate_kernel"])
    return (out + shared).reshape(B, T, D)


@pytest.mark.parametrize("gate", [True, False])
def test_equals_the_numpy_reference(gate):
    layer = _layer(gate)
    weights = [to_numpy(w) for w in layer.weights]
    want = numpy_moe(X, weights, gate)
    np.testing.assert_allclose(to_numpy(layer(X)), want, atol=1e-4)
    # Without the shared expert: another output (it is added).
    routed = MixtureOfExperts(E, 2, F, normalize_top_k=True)
    routed.build((None, None, D))
    routed.set_weights(weights[:3])
    assert np.abs(to_numpy(routed(X)) - want).max() > 1e-2


def test_weights_after_the_routed_experts():
    layer = _layer()
    assert [(w.path.split("/")[-1], tuple(w.shape)) for w in layer.weights] == [
        ("router_kernel", (D, E)),
        ("gate_up_kernel", (E, D, 2 * F)),
        ("down_kernel", (E, F, D)),
        ("shared_gate_up_kernel", (D, 2 * S)),
        ("shared_down_kernel", (S, D)),
        ("shared_gate_kernel", (D, 1)),
    ]


def test_config_and_keras_file_round_trips(tmp_path):
    layer = _layer()
    clone = MixtureOfExperts.from_config(layer.get_config())
    assert (clone.shared_expert_dim, clone.shared_expert_gate) == (S, True)
    inputs = keras.Input((None, D))
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "shared_expert.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        to_numpy(reloaded(X)), to_numpy(model(X)), atol=1e-6
    )


def test_training_moves_the_shared_weights():
    layer = _layer()
    inputs = keras.Input((None, D))
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [to_numpy(w) for w in layer.weights[3:]]
    model.fit(X, np.zeros_like(X), epochs=1, batch_size=B, verbose=0)
    for old, new in zip(before, layer.weights[3:]):
        assert np.abs(to_numpy(new) - old).max() > 0


@pytest.mark.parametrize("family", ["qwen_moe", "qwen3_5_moe"])
def test_from_keras_hub_equals_their_block(family):
    decoders = {
        "qwen_moe": "keras_hub.src.models.qwen_moe.qwen_moe_decoder",
        "qwen3_5_moe": "keras_hub.src.models.qwen3_5_moe.qwen3_5_moe_decoder",
    }
    module = pytest.importorskip(decoders[family])
    if family == "qwen_moe":
        block = module.QwenSparseMoeBlock(
            hidden_dim=D,
            moe_intermediate_dim=F,
            shared_expert_intermediate_dim=S,
            num_experts=E,
            top_k=2,
            norm_top_k_prob=False,
        )
    else:
        block = module.Qwen3_5MoeSparseMoeBlock(
            hidden_dim=D,
            moe_intermediate_dim=F,
            shared_expert_intermediate_size=S,
            num_experts=E,
            top_k=2,
        )
    block.build((None, None, D))
    rng = np.random.default_rng(2)
    for weight in block.weights:
        weight.assign(rng.normal(size=weight.shape) * 0.5)
    ours = MixtureOfExperts.from_keras_hub(block)
    assert ours.shared_expert_dim == S and ours.shared_expert_gate
    assert ours.normalize_top_k == (family == "qwen3_5_moe")
    want, _ = block(keras.ops.convert_to_tensor(X))
    np.testing.assert_allclose(to_numpy(ours(X)), to_numpy(want), atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(shared_expert_gate=True), "shared_expert_gate"),
        (dict(shared_expert_dim=0), "shared_expert_dim"),
        (
            dict(shared_expert_dim=S, shared_expert_gate="yes"),
            "shared_expert_gate",
        ),
        (dict(shared_expert_dim=S, expert_bias=True), "expert_bias"),
    ],
)
def test_refusals_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MixtureOfExperts(E, 2, F, **kwargs)
