"""The `window_size` option of the Transformer blocks (local attention)."""

import numpy as np
import pytest
from harness import run_layer_test
from harness import run_mask_test
from keras import ops

from keras_attention import masks
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import TransformerDecoderBlock
from keras_attention.layers import TransformerEncoderBlock

RNG = np.random.default_rng(0)


def np_(x):
    return ops.convert_to_numpy(x)


def _pair(cls, kwargs, *inputs):
    """The block with `window_size` and the same block without, same weights."""
    local = cls(**kwargs)
    local(*inputs)
    kwargs = dict(kwargs)
    kwargs.pop("window_size")
    full = cls(**kwargs)
    full(*inputs)
    full.set_weights(local.get_weights())
    return local, full


def test_harness_encoder_block():
    run_layer_test(
        TransformerEncoderBlock,
        dict(num_heads=2, intermediate_dim=16, window_size=(2, 1), dropout=0.1),
        dict(inputs=RNG.normal(size=(2, 7, 8)).astype("float32")),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 7, 8), (2, 2, 7, 4)),
        expected_num_trainable_weights=16,
    )


def test_harness_decoder_block():
    run_layer_test(
        TransformerDecoderBlock,
        dict(num_heads=2, intermediate_dim=16, window_size=3),
        dict(
            inputs=RNG.normal(size=(2, 5, 8)).astype("float32"),
            context=RNG.normal(size=(2, 6, 4)).astype("float32"),
        ),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 5, 8), (2, 2, 5, 4), (2, 2, 5, 6)),
        expected_num_trainable_weights=26,
    )


def test_masks_local_decoder_only():
    run_mask_test(
        TransformerDecoderBlock,
        dict(
            num_heads=2,
            intermediate_dim=16,
            cross_attention=False,
            window_size=2,
        ),
        ("inputs",),
        ("padding_mask",),
        causal=True,
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_equals_full_block_with_sliding_window_mask(norm_first):
    x = RNG.normal(size=(2, 11, 8)).astype("float32")
    valid = np.ones((2, 11), bool)
    valid[1, 6:] = False
    local, full = _pair(
        TransformerEncoderBlock,
        dict(
            num_heads=2,
            intermediate_dim=16,
            window_size=(3, 2),
            norm_first=norm_first,
        ),
        x,
    )
    assert isinstance(local.self_attention, LocalSelfAttention)
    out, scores = local(x, padding_mask=valid, return_attention_scores=True)
    ref, ref_scores = full(
        x,
        padding_mask=valid,
        attention_mask=masks.sliding_window_mask(11, (3, 2)),
        return_attention_scores=True,
    )
    np.testing.assert_allclose(np_(out)[valid], np_(ref)[valid], atol=1e-5)
    np.testing.assert_allclose(
        np_(local.self_attention.scores_to_dense(scores)),
        np_(ref_scores),
        atol=1e-6,
    )


def test_decoder_block_equals_full_block_and_cached_decoding():
    x = RNG.normal(size=(2, 7, 8)).astype("float32")
    context = RNG.normal(size=(2, 5, 6)).astype("float32")
    local, full = _pair(
        TransformerDecoderBlock,
        dict(
            num_heads=4,
            intermediate_dim=16,
            window_size=2,
            num_key_value_heads=2,
            rotary_max_wavelength=100,
        ),
        x,
        context,
    )
    out = np_(local(x, context))
    window = masks.sliding_window_mask(7, 2, causal=True)
    np.testing.assert_allclose(
        out, np_(full(x, context, attention_mask=window)), atol=1e-5
    )

    # Step-by-step decoding with a cache (the window as a mask over it).
    memory = local.compute_cross_attention_cache(context)
    cache = np.zeros((2, 2, 7, 2, 2), "float32")
    steps = []
    for i in range(7):
        y, cache = local(
            x[:, i : i + 1],
            cross_attention_cache=memory,
            self_attention_cache=cache,
            self_attention_cache_update_index=i,
        )
        steps.append(np_(y))
    np.testing.assert_allclose(np.concatenate(steps, 1), out, atol=1e-5)


def test_config_and_bad_window():
    block = TransformerDecoderBlock(
        2, 16, window_size=[4, 0], cross_attention=False
    )
    config = block.get_config()
    assert config["window_size"] == (4, 0)
    assert TransformerDecoderBlock.from_config(config).window_size == (4, 0)
    assert TransformerEncoderBlock(2, 16).get_config()["window_size"] is None
    with pytest.raises(ValueError, match="window_size.*Received"):
        TransformerEncoderBlock(2, 16, window_size=-2)
    with pytest.raises(ValueError, match="window_size.*Received"):
        TransformerDecoderBlock(2, 16, window_size=(1, 2, 3))
