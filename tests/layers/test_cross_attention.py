import numpy as np
from harness import run_layer_test
from harness import run_mask_test
from keras import ops
from references import multi_head_attention as np_mha

from keras_attention.layers import CrossAttention
from keras_attention.layers import MultiHeadAttention

RNG = np.random.default_rng(2)
Q = RNG.normal(size=(2, 4, 8)).astype("float32")
C = RNG.normal(size=(2, 7, 6)).astype("float32")


def np_(x):
    return ops.convert_to_numpy(x)


def test_harness():
    run_layer_test(
        CrossAttention,
        dict(num_heads=2, key_dim=4),
        dict(query=Q, context=C),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 4, 8), (2, 2, 4, 7)),
        expected_num_trainable_weights=8,
    )


def test_masks():
    run_mask_test(
        CrossAttention,
        dict(num_heads=2, key_dim=4),
        ("query", "context"),
        ("query_mask", "context_mask"),
    )


def test_reference_and_context_mask_and_cache():
    layer = CrossAttention(2, 4)
    context_mask = np.array([[1, 1, 1, 0, 0, 0, 0], [1] * 7], bool)
    out, w = layer(
        Q, C, context_mask=context_mask, return_attention_scores=True
    )
    ref, ref_w = np_mha(layer, Q, C, mask=context_mask[:, None, None, :])
    np.testing.assert_allclose(np_(out), ref, atol=1e-5)
    np.testing.assert_allclose(np_(w), ref_w, atol=1e-6)
    memory = layer.compute_cache(C)
    cached, _ = layer(Q, C, context_mask=context_mask, cache=memory)
    np.testing.assert_allclose(np_(cached), np_(out), atol=1e-6)
    mha = MultiHeadAttention(2, 4)
    mha(Q, C)
    mha.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        np_(mha(Q, C, value_mask=context_mask)), np_(out), atol=1e-6
    )


def test_keras_masks_are_read_with_attention_mask_given():
    import keras

    layer = CrossAttention(2, 4)
    query_valid = np.array([[1, 1, 1, 0], [1] * 4], bool)
    context_valid = np.array([[1] * 3 + [0] * 4, [1] * 5 + [0] * 2], bool)
    attention_mask = RNG.random((2, 4, 7)) < 0.7
    q = keras.layers.Masking()(Q * query_valid[..., None])
    c = keras.layers.Masking()(C * context_valid[..., None])
    out = layer(q, c, attention_mask=attention_mask)
    mask = (
        query_valid[:, None, :, None]
        & context_valid[:, None, None]
        & attention_mask[:, None]
    )
    ref, _ = np_mha(
        layer,
        Q * query_valid[..., None],
        C * context_valid[..., None],
        mask=mask,
    )
    np.testing.assert_allclose(
        np_(out)[query_valid], ref[query_valid], atol=1e-5
    )
    np.testing.assert_array_equal(
        np_(keras.src.backend.get_keras_mask(out)), query_valid
    )


def test_padding_mask_shapes_are_checked():
    import pytest

    layer = CrossAttention(2, 4)
    with pytest.raises(ValueError, match=r"`context_mask`.*\(2, 7\).*\(2, 4\)"):
        layer(Q, C, context_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match=r"`query_mask`.*\(2, 4\).*\(2, 7\)"):
        layer(Q, C, query_mask=np.ones((2, 7), bool))
