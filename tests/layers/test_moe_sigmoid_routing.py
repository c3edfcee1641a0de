"""`MixtureOfExperts(routing="sigmoid_topk", ...)`: DeepSeek-V3's routing
(`transformers`' `DeepseekV3TopkRouter`): sigmoid scores, the choice by
the scores plus the non-trainable `score_correction_bias` within the
`top_k_groups` best of `num_groups` groups, the weights the chosen
scores (renormalized with `normalize_top_k`) times
`routed_scaling_factor`, and the ungated shared expert. Against a NumPy
reference written from transformers' code; weights, config and `.keras`
round trips; refusals. Backend-neutral."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import MixtureOfExperts

B, T, D, E, F, S = 2, 5, 8, 8, 6, 4
GROUPS, TOP_GROUPS, TOP_K = 4, 2, 3
X = np.random.default_rng(0).normal(size=(B, T, D)).astype("float32")
DEEPSEEK = dict(
    routing="sigmoid_topk",
    normalize_top_k=True,
    num_groups=GROUPS,
    top_k_groups=TOP_GROUPS,
    score_correction_bias=True,
    routed_scaling_factor=2.5,
    shared_expert_dim=S,
)


def _layer(**kwargs):
    options = dict(DEEPSEEK, **kwargs)
    layer = MixtureOfExperts(E, TOP_K, F, **options)
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


def numpy_moe(x, w, groups, top_groups, normalize, factor, bias=True):
    """transformers' `DeepseekV3MoE`, token by token: sigmoid scores,
    groups scored by their two best corrected scores, the `TOP_K` best
    corrected scores within the best groups, weights from the
    uncorrected scores, SwiGLU experts, plus the shared expert."""
    x = x.reshape(-1, D).astype("float64")
    names = ["router_kernel", "gate_up_kernel", "down_kernel"]
    names += ["shared_gate_up_kernel", "shared_down_kernel"]
    names += ["score_correction_bias"] if bias else []
    w = dict(zip(names, w))
    scores = 1.0 / (1.0 + np.exp(-(x @ w["router_kernel"])))
    correction = w.get("score_correction_bias", np.zeros(E))
    out = np.zeros_like(x)
    for n in range(len(x)):
        choice = scores[n] + correction
        if groups > 1:
            grouped = choice.reshape(groups, -1)
            group_scores = np.sort(grouped, axis=-1)[:, -2:].sum(-1)
            kept = np.zeros(groups, bool)
            kept[np.argsort(-group_scores)[:top_groups]] = True
            choice = np.where(np.repeat(kept, E // groups), choice, -np.inf)
        chosen = np.argsort(-choice)[:TOP_K]
        weights = scores[n, chosen]
        if normalize:
            weights = weights / (weights.sum() + 1e-20)
        for e, p in zip(chosen, weights * factor):
            h = x[n] @ w["gate_up_kernel"][e]
            out[n] += p * (_silu(h[:F]) * h[F:]) @ w["down_kernel"][e]
    h = x @ w["shared_gate_up_kernel"]
    out += (_silu(h[:, :S]) * h[:, S:]) @ w["shared_down_kernel"]
    return out.reshape(B, T, D)


@pytest.mark.parametrize(
    "groups, top_groups, normalize, factor",
    [(GROUPS, TOP_GROUPS, True, 2.5), (1, 1, False, 1.0)],
    ids=["deepseek_v3", "no_groups"],
)
def test_equals_the_numpy_reference(groups, top_groups, normalize, factor):
    layer = _layer(
        num_groups=groups,
        top_k_groups=top_groups,
        normalize_top_k=normalize,
        routed_scaling_factor=factor,
    )
    weights = [to_numpy(w) for w in layer.weights]
    want = numpy_moe(X, weights, groups, top_groups, normalize, factor)
    np.testing.assert_allclose(to_numpy(layer(X)), want, atol=1e-4)


def test_groups_and_correction_bias_change_the_choice():
    """Each option bites on these weights: without the group limit, or
    without the correction bias, other experts are chosen."""
    layer = _layer()
    weights = [to_numpy(w) for w in layer.weights]
    ours = to_numpy(layer(X))
    ungrouped = numpy_moe(X, weights, 1, 1, True, 2.5)
    assert np.abs(ours - ungrouped).max() > 1e-2
    uncorrected = numpy_moe(
        X, weights[:-1], GROUPS, TOP_GROUPS, True, 2.5, False
    )
    assert np.abs(ours - uncorrected).max() > 1e-2


def test_the_correction_bias_is_set_not_trained():
    layer = _layer()
    names = [w.path.split("/")[-1] for w in layer.weights]
    assert names[-1] == "score_correction_bias"
    assert [w.path.split("/")[-1] for w in layer.trainable_weights] == (
        names[:-1]
    )
    mixed = MixtureOfExperts(E, TOP_K, F, **DEEPSEEK, dtype="mixed_float16")
    mixed.build((None, None, D))
    assert mixed.score_correction.dtype == "float32"
    np.testing.assert_array_equal(to_numpy(mixed.score_correction), 0.0)


def test_config_and_keras_file_round_trips(tmp_path):
    layer = _layer()
    clone = MixtureOfExperts.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    inputs = keras.Input((None, D))
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "sigmoid_routing.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        to_numpy(reloaded(X)), to_numpy(model(X)), atol=1e-6
    )


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(routing="softmax_topk"), "num_groups"),
        (
            dict(routing="topk_softmax", num_groups=1, top_k_groups=1),
            "score_correction_bias",
        ),
        (dict(num_groups=3), "num_groups"),
        (dict(num_groups=8, top_k_groups=1), "num_groups"),
        (dict(top_k_groups=1), "top_k_groups"),
        (dict(top_k_groups=5), "top_k_groups"),
        (dict(router_aux_loss_coef=0.01), "router_aux_loss_coef"),
        (dict(routed_scaling_factor=0.0), "routed_scaling_factor"),
        (dict(score_correction_bias="yes"), "score_correction_bias"),
    ],
)
def test_refusals_name_the_argument(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=name):
        MixtureOfExperts(E, TOP_K, F, **dict(DEEPSEEK, **kwargs))
