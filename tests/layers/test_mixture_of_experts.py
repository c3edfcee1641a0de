import contextlib
import re

import keras
import numpy as np
import pytest
import references
from harness import run_layer_test
from harness import run_mask_test
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import MixtureOfExperts

# One shape throughout (JAX compiles per shape).
# F: each expert's intermediate width.
B, T, D, E, F = 2, 5, 8, 4, 6
RNG = np.random.default_rng(0)
X = RNG.normal(size=(B, T, D)).astype("float32")
VALID = np.ones((B, T), bool)
VALID[1, 3:] = False

CONFIGS = {
    "mixtral": dict(routing="softmax_topk", normalize_top_k=True),
    "qwen3_moe": dict(routing="softmax_topk"),
    "gpt_oss": dict(
        routing="topk_softmax",
        router_bias=True,
        activation="gpt_oss_glu",
        expert_bias=True,
        glu_limit=1.5,
    ),
}


def _randomize(layer, seed, scale=0.5):
    """Normal weights (biases too, which initialize at zero)."""
    rng = np.random.default_rng(seed)
    layer.set_weights(
        [
            rng.normal(size=w.shape).astype(w.dtype) * scale
            for w in layer.weights
        ]
    )


def _layer(weights_seed=1, dtype=None, **kwargs):
    layer = MixtureOfExperts(E, 2, F, dtype=dtype, **kwargs)
    layer.build((None, None, D))
    _randomize(layer, weights_seed)
    return layer


def _losses(layer):
    return [float(to_numpy(loss)) for loss in layer.losses]


def test_harness_mixture_of_experts():
    run_layer_test(
        MixtureOfExperts,
        dict(
            num_experts=E,
            top_k=2,
            intermediate_dim=F,
            router_aux_loss_coef=0.01,
        ),
        dict(inputs=X),
        expected_output_shape=(B, T, D),
        expected_num_trainable_weights=3,
    )


def test_masks():
    run_mask_test(
        MixtureOfExperts,
        dict(num_experts=E, top_k=2, intermediate_dim=F),
        ("inputs",),
        ("mask",),
        features=D,
    )


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_matches_numpy_reference(family):
    layer = _layer(**CONFIGS[family], router_aux_loss_coef=0.5)
    out = to_numpy(layer(X, mask=VALID, training=True))
    expected, aux = references.mixture_of_experts(layer, X, VALID)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_losses(layer), [0.5 * aux], rtol=1e-5)
    # Padded tokens leave the loss; without a mask all count.
    layer(X, training=True)
    _, aux_all = references.mixture_of_experts(layer, X)
    np.testing.assert_allclose(_losses(layer), [0.5 * aux_all], rtol=1e-5)
    assert not np.isclose(aux, aux_all)


def _hub_block(family):
    """A keras-hub block, its `attention_mask` and the matching Keras
    mask of `MixtureOfExperts`."""
    from keras_hub.src.models.gpt_oss import gpt_oss_decoder as gpt_oss
    from keras_hub.src.models.mixtral import mixtral_decoder as mixtral
    from keras_hub.src.models.qwen3_moe import qwen3_moe_decoder as qwen

    if family == "mixtral":
        return mixtral.MixtralSparseMoeBlock(D, F, E, top_k=2), VALID, VALID
    if family == "qwen3_moe":
        # The decoder's (b, T, T) attention mask: rows with any True count.
        mask = VALID[:, :, None] & VALID[:, None, :]
        return qwen.Qwen3SparseMoeBlock(D, F, E, 2, False), mask, VALID
    if family == "qwen3_moe_norm":
        return qwen.Qwen3SparseMoeBlock(D, F, E, 2, True), None, None
    return gpt_oss.GptOssSparseMoeBlock(D, F, E, top_k=2), None, None


@pytest.mark.parametrize(
    "family", ["mixtral", "qwen3_moe", "qwen3_moe_norm", "gpt_oss"]
)
def test_matches_keras_hub(family):
    block, hub_mask, mask = _hub_block(family)
    block.build((B, T, D))
    _randomize(block, 2)
    x = 3.0 * X  # gpt-oss's clamps reached
    if family == "gpt_oss":
        expected = block(x)[0]
    else:
        expected = block(x, attention_mask=hub_mask, training=True)[0]
    layer = MixtureOfExperts.from_keras_hub(block)
    out = layer(x, mask=mask, training=True)
    np.testing.assert_allclose(
        to_numpy(out), to_numpy(expected), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(_losses(layer), _losses(block), rtol=1e-6)
    assert len(layer.losses) == (family != "gpt_oss")


def test_aux_loss_only_in_training_and_scaled():
    layer = _layer(router_aux_loss_coef=0.5)
    layer(X, training=False)
    assert layer.losses == []
    layer(X)
    assert layer.losses == []
    layer(X, training=True)
    (half,) = _losses(layer)
    double = _layer(router_aux_loss_coef=1.0)
    double(X, training=True)
    np.testing.assert_allclose(_losses(double), [2 * half], rtol=1e-6)
    for coef in (None, 0, 0.0):
        off = _layer(router_aux_loss_coef=coef)
        off(X, training=True)
        assert off.losses == []


def test_loss_reaches_fit_gradients():
    layer = MixtureOfExperts(E, 2, F, router_aux_loss_coef=1.0)
    inputs = keras.Input((T, D))
    model = keras.Model(inputs, layer(inputs))
    model.compile("sgd", lambda y, p: 0.0 * keras.ops.sum(p))
    before = to_numpy(layer.router_kernel).copy()
    model.fit(X, X, epochs=1, verbose=0)
    assert not np.allclose(to_numpy(layer.router_kernel), before)


def test_jitter_noise_only_in_training():
    layer = _layer(router_jitter_noise=0.2, seed=3)
    plain = _layer()
    np.testing.assert_allclose(
        to_numpy(layer(X)), to_numpy(plain(X)), rtol=1e-6
    )
    assert not np.allclose(
        to_numpy(layer(X, training=True)), to_numpy(plain(X))
    )


def test_other_ranks_are_per_token():
    layer = _layer(**CONFIGS["gpt_oss"])
    tokens = to_numpy(layer(X))
    np.testing.assert_allclose(
        to_numpy(layer(X.reshape(B * T, D))),
        tokens.reshape(B * T, D),
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        to_numpy(layer(X.reshape(B, 1, T, D))),
        tokens[:, None],
        rtol=1e-5,
        atol=1e-6,
    )


@contextlib.contextmanager
def _x64():
    """JAX computes in float64 only with x64 enabled (the other backends
    always do)."""
    if keras.backend.backend() != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


def test_float64():
    with _x64():
        layer = _layer(
            dtype="float64", **CONFIGS["gpt_oss"], router_aux_loss_coef=1.0
        )
        x = X.astype("float64")
        out = layer(x, mask=VALID, training=True)
        assert keras.backend.standardize_dtype(out.dtype) == "float64"
        loss = layer.losses[0]
        assert keras.backend.standardize_dtype(loss.dtype) == "float64"
        expected, aux = references.mixture_of_experts(layer, x, VALID)
        np.testing.assert_allclose(
            to_numpy(out), expected, rtol=1e-12, atol=1e-12
        )
        np.testing.assert_allclose(to_numpy(loss), aux, rtol=1e-12)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_routes_in_float32(policy):
    """Two experts whose logits differ by less than a half-precision step:
    the router (its float32 weights read as they are) picks the second,
    the only one with an output."""
    layer = MixtureOfExperts(2, 1, F, dtype=policy, router_aux_loss_coef=1.0)
    layer.build((None, None, D))
    step = 1e-4  # below float16's (1e-3) and bfloat16's (8e-3) precision
    kernel = np.full((D, 2), 1.0 / D, "float32")
    kernel[:, 1] *= 1.0 + step
    layer.router_kernel.assign(kernel)
    layer.gate_up_kernel.assign(np.full((2, D, 2 * F), 0.25, "float32"))
    down = np.zeros((2, F, D), "float32")
    down[1] = 1.0
    layer.down_kernel.assign(down)
    x = np.ones((B, T, D), "float32")
    out = layer(x, training=True)
    assert keras.backend.standardize_dtype(out.dtype) == layer.compute_dtype
    assert keras.backend.standardize_dtype(layer.losses[0].dtype) == "float32"
    reference = MixtureOfExperts(2, 1, F)
    reference.build((None, None, D))
    reference.set_weights([kernel, to_numpy(layer.gate_up_kernel), down])
    expected = to_numpy(reference(x))
    assert np.all(expected > 1.0)  # expert 1 is the only non-zero one
    np.testing.assert_allclose(
        to_numpy(keras.ops.cast(out, "float32")), expected, rtol=2e-2
    )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision(dtype):
    layer = _layer(dtype=dtype, **CONFIGS["mixtral"], router_aux_loss_coef=1.0)
    out = layer(X, mask=VALID, training=True)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    assert keras.backend.standardize_dtype(layer.losses[0].dtype) == "float32"
    expected, aux = references.mixture_of_experts(layer, X, VALID)
    out = to_numpy(keras.ops.cast(out, "float32"))
    scale = np.abs(expected).max()
    np.testing.assert_allclose(out, expected, atol=0.05 * scale)
    np.testing.assert_allclose(_losses(layer), [aux], rtol=0.05)


@pytest.mark.parametrize(
    "kwargs,name,value",
    [
        (dict(top_k=5), "top_k", 5),
        (dict(top_k=0), "top_k", 0),
        (dict(num_experts=2.0), "num_experts", 2.0),
        (dict(intermediate_dim="6"), "intermediate_dim", "6"),
        (dict(routing="topk"), "routing", "topk"),
        (dict(activation="silu"), "activation", "silu"),
        (dict(normalize_top_k="True"), "normalize_top_k", "True"),
        (dict(router_bias=1), "router_bias", 1),
        (dict(expert_bias=None), "expert_bias", None),
        (dict(glu_alpha=0.0), "glu_alpha", 0.0),
        (dict(glu_limit=float("inf")), "glu_limit", float("inf")),
        (dict(router_aux_loss_coef=-0.1), "router_aux_loss_coef", -0.1),
        (dict(router_aux_loss_coef="0.1"), "router_aux_loss_coef", "0.1"),
        (dict(router_jitter_noise=1.0), "router_jitter_noise", 1.0),
        (dict(seed=1.5), "seed", 1.5),
    ],
)
def test_argument_errors(kwargs, name, value):
    args = dict(num_experts=E, top_k=2, intermediate_dim=F)
    args.update(kwargs)
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r}")):
        MixtureOfExperts(**args)


def test_input_errors():
    layer = MixtureOfExperts(E, 2, F)
    with pytest.raises(ValueError, match="inputs_shape"):
        layer(np.zeros((D,), "float32"))
    layer(X)
    with pytest.raises(ValueError, match="inputs_shape"):
        layer(np.zeros((B, T, D + 1), "float32"))
    with pytest.raises(ValueError, match="mask"):
        layer(X, mask=np.ones((B, T + 1), bool))
    with pytest.raises(TypeError, match="block="):
        MixtureOfExperts.from_keras_hub(keras.layers.Dense(2))
