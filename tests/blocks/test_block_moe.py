"""Transformer blocks with a mixture-of-experts feed-forward (`moe=`):
the block's feed-forward is a `MixtureOfExperts` equal to the same layer
called on its own, its load-balancing loss reaches the block in training
(padded tokens left out), the config round trips, bad options are refused."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka

B, T, F = 2, 5, 8
X = np.random.default_rng(48).normal(size=(B, T, F)).astype("float32")
MOE = dict(
    num_experts=4,
    top_k=2,
    routing="topk_softmax",
    router_aux_loss_coef=0.01,
)


def block(**kwargs):
    layer = ka.blocks.TransformerDecoderBlock(
        num_heads=2,
        intermediate_dim=6,
        cross_attention=False,
        norm_first=True,
        moe=MOE,
        **kwargs,
    )
    layer(X)
    return layer


def test_the_feed_forward_is_the_mixture_of_experts():
    layer = block()
    moe = layer.feed_forward
    assert isinstance(moe, ka.layers.MixtureOfExperts)
    assert moe.intermediate_dim == 6 and moe.num_experts == 4
    # Pre-norm: x + moe(norm(x + attention(norm(x)))).
    x, _ = layer._self_attention_residual(
        ops.convert_to_tensor(X), training=False
    )
    x = ops.convert_to_numpy(x)
    normed = layer.feed_forward_norm(ops.convert_to_tensor(x))
    want = x + ops.convert_to_numpy(moe(normed))
    got = ops.convert_to_numpy(layer(X))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_load_balancing_loss_in_training_only():
    layer = block()
    layer(X, training=False)
    assert not layer.losses
    layer(X, training=True)
    (loss,) = layer.losses
    assert float(ops.convert_to_numpy(loss)) > 0


@pytest.mark.parametrize("how", ["padding_mask", "keras_mask"])
def test_padded_tokens_are_left_out_of_the_loss(how):
    """The loss of a padded sequence equals the loss of its real tokens
    alone (padded keys are masked, so the real tokens' inputs to the
    experts are the same)."""
    layer = block()
    real = X[:1, :3]
    layer(real, training=True)
    (want,) = layer.losses
    padding = np.array([[True] * 3 + [False] * 2])
    if how == "padding_mask":
        layer(X[:1], padding_mask=padding, training=True)
    else:
        masking = keras.layers.Masking()
        x = np.where(padding[..., None], X[:1], 0.0).astype("float32")
        layer(masking(x), training=True)
    (got,) = layer.losses
    np.testing.assert_allclose(
        ops.convert_to_numpy(got), ops.convert_to_numpy(want), rtol=1e-5
    )


def test_config_round_trip():
    layer = block()
    config = layer.get_config()
    assert config["moe"]["num_experts"] == 4
    clone = type(layer).from_config(config)
    clone(X)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        ops.convert_to_numpy(clone(X)), ops.convert_to_numpy(layer(X)), 1e-6
    )
    assert (
        keras.saving.deserialize_keras_object(
            keras.saving.serialize_keras_object(layer)
        ).moe
        == layer.moe
    )


@pytest.mark.parametrize(
    "moe, error, match",
    [
        ([4, 2], TypeError, r"moe=\[4, 2\]"),
        (dict(MOE, name="x"), ValueError, "'name'"),
        (dict(num_experts=2, top_k=3), ValueError, "top_k=3"),
    ],
)
def test_refusals(moe, error, match):
    with pytest.raises(error, match=match):
        ka.blocks.TransformerEncoderBlock(
            num_heads=2, intermediate_dim=6, moe=moe
        )
