"""The mixture-of-experts families of `from_keras_hub` (Mixtral,
Qwen3-MoE): each keras-hub sparse MoE block becomes our blocks' `moe`
with its routing options, Qwen3-MoE's dense layers stay dense, and the
load-balancing loss added in training equals keras-hub's. The shared
checks (padding, weights, attention maps, `.keras`) are in
test_from_keras_hub.py. Backend-neutral."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier

import keras_attention
from keras_attention.interop import from_keras_hub

keras_hub = pytest.importorskip("keras_hub")
pytestmark = family_tier()

VOCAB, LENGTH = 20, 8
COMMON = dict(
    vocabulary_size=VOCAB,
    hidden_dim=16,
    intermediate_dim=16,
    num_query_heads=4,
    num_key_value_heads=2,
    num_experts=4,
    top_k=2,
)


def perturbed(backbone):
    rng = np.random.default_rng(7)
    for weight in backbone.weights:
        noise = rng.normal(scale=0.1, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)
    return backbone


def mixtral():
    return keras_hub.models.MixtralBackbone(
        num_layers=2, sliding_window=None, **COMMON
    )


def qwen3_moe():
    # Layers 1 and 3 sparse (`decoder_sparse_step=2`), 3 dense as well
    # (`mlp_only_layers`); renormalized top-k.
    return keras_hub.models.Qwen3MoeBackbone(
        num_layers=4,
        moe_intermediate_dim=8,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
        norm_top_k_prob=True,
        sliding_window_size=None,
        **COMMON,
    )


@pytest.fixture(scope="module", params=["mixtral", "qwen3_moe"])
def converted(request):
    keras.utils.set_random_seed(4)
    backbone = perturbed(globals()[request.param]())
    return backbone, from_keras_hub(backbone)


def test_sparse_layers_and_their_options(converted):
    backbone, model = converted
    for i, layer in enumerate(backbone.transformer_layers):
        ours = model.get_layer(f"transformer_layer_{i}").feed_forward
        theirs = getattr(layer, "_sparse_moe_block", None)
        if theirs is None:  # Qwen3-MoE: `mlp`, sparse or dense
            theirs = layer.mlp if layer.is_sparse_mlp else None
        if theirs is None:
            assert isinstance(ours, keras_attention.layers.FeedForward)
            continue
        assert isinstance(ours, keras_attention.layers.MixtureOfExperts)
        assert (ours.num_experts, ours.top_k) == (4, 2)
        assert ours.intermediate_dim == theirs.intermediate_dim
        assert ours.routing == "softmax_topk" and ours.normalize_top_k
        coefficient = getattr(theirs, "router_aux_loss_coef", None)
        if coefficient is None:
            coefficient = theirs.router_aux_loss_coefficient
        assert ours.router_aux_loss_coef == coefficient
    kinds = [
        type(model.get_layer(f"transformer_layer_{i}").feed_forward).__name__
        for i in range(len(backbone.transformer_layers))
    ]
    if len(kinds) == 4:  # Qwen3-MoE's sparse step and MLP-only layer
        assert (
            kinds == ["FeedForward", "MixtureOfExperts"] + ["FeedForward"] * 2
        )


def test_equal_outputs_and_training_loss(converted):
    """Hidden states equal; the load-balancing loss of a training call
    equal, layer by layer, on unpadded inputs (with padding, our blocks
    do not hand the padding mask to their experts: padded tokens count)."""
    backbone, model = converted
    rng = np.random.default_rng(0)
    inputs = {
        "token_ids": rng.integers(1, VOCAB, (2, LENGTH)).astype("int32"),
        "padding_mask": np.ones((2, LENGTH), "int32"),
    }
    np.testing.assert_allclose(
        to_numpy(model(inputs)), to_numpy(backbone(inputs)), atol=1e-5
    )
    backbone(inputs, training=True)
    model(inputs, training=True)
    theirs = [float(to_numpy(loss)) for loss in backbone.losses]
    ours = [float(to_numpy(loss)) for loss in model.losses]
    assert len(ours) == len(theirs) >= 1  # one per sparse layer
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    assert min(ours) > 0
    model(inputs)
    assert not model.losses  # inference: none
