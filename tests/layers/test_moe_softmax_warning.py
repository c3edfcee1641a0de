"""`MixtureOfExperts` with one expert or one routed logit
(`top_k=1, routing="topk_softmax"`, `num_experts=1`) warns nothing: its
softmax over a size-1 axis (the right answer there, 1) used to make Keras
warn "Did you mean to use a sigmoid instead?" on every call, which a user
cannot act on. The outputs and the load-balancing loss still equal the
NumPy reference (float64: to 1e-12)."""

import contextlib
import warnings

import keras
import numpy as np
import pytest
import references
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import MixtureOfExperts

B, T, D, F = 2, 5, 8, 6
RNG = np.random.default_rng(3)
X = RNG.normal(size=(B, T, D))
VALID = np.ones((B, T), bool)
VALID[1, 3:] = False


@contextlib.contextmanager
def _x64(dtype):
    """JAX computes in float64 only with x64 enabled."""
    if dtype != "float64" or keras.backend.backend() != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "num_experts,top_k,routing",
    [
        (4, 1, "topk_softmax"),
        (1, 1, "softmax_topk"),
        (1, 1, "topk_softmax"),
    ],
    ids=["top1-topk_softmax", "one-expert", "one-expert-topk_softmax"],
)
def test_no_softmax_warning_and_equal_to_numpy(
    num_experts, top_k, routing, dtype, capsys
):
    with _x64(dtype):
        layer = MixtureOfExperts(
            num_experts,
            top_k,
            F,
            routing=routing,
            router_bias=True,
            router_aux_loss_coef=0.5,
            dtype=dtype,
        )
        layer.build((None, None, D))
        rng = np.random.default_rng(1)
        layer.set_weights(
            [rng.normal(size=w.shape) * 0.5 for w in layer.weights]
        )
        x = X.astype(dtype)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = layer(x, mask=VALID, training=True)
            loss = to_numpy(layer.losses[0])
        printed = capsys.readouterr()
        said = [str(w.message) for w in caught] + [printed.out, printed.err]
        assert not [m for m in said if "softmax" in m or "sigmoid" in m]
        expected, aux = references.mixture_of_experts(layer, x, VALID)
    tol = 1e-12 if dtype == "float64" else 1e-5
    np.testing.assert_allclose(to_numpy(out), expected, rtol=tol, atol=tol)
    np.testing.assert_allclose(loss, 0.5 * aux, rtol=tol, atol=tol)
