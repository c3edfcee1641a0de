import re

import numpy as np
import pytest
import references
from harness import run_layer_test
from harness import run_mask_test
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.blocks import TransformerDecoderBlock


def decoder_reference(block, x, context, valid, context_valid):
    """The block in NumPy: causal self-attention, cross-attention, FFN."""
    t = x.shape[1]
    causal = np.tril(np.ones((t, t), bool))
    self_mask = valid[:, None, :, None] & valid[:, None, None, :] & causal
    cross_mask = valid[:, None, :, None] & context_valid[:, None, None, :]
    return references.decoder_block(block, x, context, self_mask, cross_mask)


def decode_step_by_step(block, x, valid, **kwargs):
    """Feeds `x` one position at a time through the block's cache; padded
    positions of the prompt are masked as keys with `attention_mask`."""
    b, t, _ = x.shape
    attention = block.self_attention
    kv_heads = attention.num_key_value_heads or attention.num_heads
    cache = np.zeros((b, 2, t, kv_heads, attention.key_dim), "float32")
    outputs = []
    for i in range(t):
        y, cache = block(
            x[:, i : i + 1],
            padding_mask=valid[:, i : i + 1],
            attention_mask=valid[:, None, :],  # keys: (b, 1, max_length)
            self_attention_cache=cache,
            self_attention_cache_update_index=i,
            **kwargs,
        )
        outputs.append(to_numpy(y))
    return np.concatenate(outputs, axis=1)


def test_harness_encoder_decoder_with_scores():
    rng = np.random.default_rng(0)
    run_layer_test(
        TransformerDecoderBlock,
        dict(num_heads=2, intermediate_dim=16, dropout=0.1),
        dict(
            inputs=rng.normal(size=(2, 5, 8)).astype("float32"),
            context=rng.normal(size=(2, 6, 4)).astype("float32"),
        ),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 5, 8), (2, 2, 5, 5), (2, 2, 5, 6)),
        expected_num_trainable_weights=26,
    )


def test_harness_decoder_only_pre_norm_rotary():
    x = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")
    run_layer_test(
        TransformerDecoderBlock,
        dict(
            num_heads=4,
            intermediate_dim=16,
            num_key_value_heads=1,
            cross_attention=False,
            norm_first=True,
            rotary_max_wavelength=100,
        ),
        dict(inputs=x),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 5, 8), (2, 4, 5, 5)),
        expected_num_trainable_weights=16,
    )


def test_masks_decoder_only_causal():
    run_mask_test(
        TransformerDecoderBlock,
        dict(num_heads=2, intermediate_dim=16, cross_attention=False),
        ("inputs",),
        ("padding_mask",),
        causal=True,
    )


def test_masks_encoder_decoder():
    run_mask_test(
        TransformerDecoderBlock,
        dict(num_heads=2, intermediate_dim=16),
        ("inputs", "context"),
        ("padding_mask", "context_padding_mask"),
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_matches_numpy_reference(norm_first):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    context = rng.normal(size=(2, 4, 6)).astype("float32")
    valid = np.ones((2, 5), bool)
    valid[0, 3:] = False
    context_valid = np.ones((2, 4), bool)
    context_valid[1, 2:] = False
    block = TransformerDecoderBlock(
        num_heads=2, intermediate_dim=16, norm_first=norm_first
    )
    out = block(
        x,
        context,
        padding_mask=valid,
        context_padding_mask=context_valid,
        return_attention_scores=True,
    )
    expected = decoder_reference(
        block,
        x.astype("float64"),
        context.astype("float64"),
        valid,
        context_valid,
    )
    np.testing.assert_allclose(
        to_numpy(out[0])[valid], expected[valid], atol=1e-4
    )
    cross = to_numpy(out[2])
    assert np.all(cross[1][..., 2:] == 0)  # padded context gets no weight


def test_cache_matches_full_pass_decoder_only_with_padding():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 6, 8)).astype("float32")
    valid = np.ones((3, 6), bool)
    valid[0, :2] = False  # left padding
    valid[1, 4:] = False  # right padding
    block = TransformerDecoderBlock(
        num_heads=4,
        intermediate_dim=16,
        num_key_value_heads=2,
        cross_attention=False,
        rotary_max_wavelength=100,
    )
    full = to_numpy(block(x, padding_mask=valid))
    cached = decode_step_by_step(block, x, valid)
    np.testing.assert_allclose(cached[valid], full[valid], atol=1e-5)


def test_cache_matches_full_pass_encoder_decoder_with_padding():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    context = rng.normal(size=(2, 7, 8)).astype("float32")
    valid = np.ones((2, 5), bool)
    valid[1, :1] = False
    context_valid = np.ones((2, 7), bool)
    context_valid[0, 5:] = False
    block = TransformerDecoderBlock(
        num_heads=2, intermediate_dim=16, norm_first=True
    )
    full = to_numpy(
        block(
            x, context, padding_mask=valid, context_padding_mask=context_valid
        )
    )
    cross_cache = block.compute_cross_attention_cache(context)
    cached = decode_step_by_step(
        block,
        x,
        valid,
        cross_attention_cache=cross_cache,
        context_padding_mask=context_valid,
    )
    np.testing.assert_allclose(cached[valid], full[valid], atol=1e-5)


def test_cached_step_returns_scores_and_cache():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 1, 8)).astype("float32")
    context = rng.normal(size=(2, 3, 8)).astype("float32")
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    block(np.concatenate([x, x], axis=1), context)
    cache = np.zeros((2, 2, 4, 2, 4), "float32")
    out, w_self, w_cross, new_cache = block(
        x,
        cross_attention_cache=block.compute_cross_attention_cache(context),
        self_attention_cache=cache,
        self_attention_cache_update_index=2,
        return_attention_scores=True,
    )
    assert tuple(w_self.shape) == (2, 2, 1, 4) and tuple(w_cross.shape) == (
        2,
        2,
        1,
        3,
    )
    assert np.all(to_numpy(w_self)[..., 3] == 0)  # causal: no later slot
    new_cache = to_numpy(new_cache)
    assert np.any(new_cache[:, :, 2] != 0) and np.all(
        new_cache[:, :, [0, 1, 3]] == 0
    )


def test_no_leak_from_future_decoder_tokens():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    context = rng.normal(size=(2, 4, 8)).astype("float32")
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=16)
    base = to_numpy(block(x, context))
    changed = x.copy()
    changed[:, 3:] = rng.normal(size=changed[:, 3:].shape)
    out = to_numpy(block(changed, context))
    np.testing.assert_array_equal(out[:, :3], base[:, :3])
    assert not np.allclose(out[:, 3:], base[:, 3:])


def test_errors():
    x = np.zeros((1, 3, 8), "float32")
    with pytest.raises(ValueError, match="causal=False"):
        TransformerDecoderBlock(num_heads=2, intermediate_dim=4, causal=False)
    with pytest.raises(ValueError, match="context_shape=None"):
        TransformerDecoderBlock(num_heads=2, intermediate_dim=4)(x)  # unbuilt
    built = TransformerDecoderBlock(num_heads=2, intermediate_dim=4)
    built(x, x)
    with pytest.raises(ValueError, match="context=None"):
        built(x)
    with pytest.raises(ValueError, match="cross_attention=False"):
        TransformerDecoderBlock(
            num_heads=2, intermediate_dim=4, cross_attention=False
        )(x, x)
    block = TransformerDecoderBlock(
        num_heads=2, intermediate_dim=4, cross_attention=False
    )
    with pytest.raises(
        ValueError, match="self_attention_cache_update_index=None"
    ):
        block(x, self_attention_cache=np.zeros((1, 2, 3, 2, 4), "float32"))
    with pytest.raises(ValueError, match="context_shape"):
        TransformerDecoderBlock(num_heads=2, intermediate_dim=4)(
            x, np.zeros((1, 3), "float32")
        )


def test_functional_encoder_decoder_without_scores():
    import keras

    inputs, context = keras.Input((None, 8)), keras.Input((None, 6))
    out = TransformerDecoderBlock(num_heads=2, intermediate_dim=8)(
        inputs, context
    )
    assert tuple(out.shape) == (None, None, 8)
    model = keras.Model([inputs, context], out)
    y = model([np.ones((2, 3, 8), "float32"), np.ones((2, 4, 6), "float32")])
    assert tuple(y.shape) == (2, 3, 8)


@pytest.mark.parametrize("name", ["cross_attention", "norm_first"])
@pytest.mark.parametrize("value", ["False", 1])
def test_bool_flags_refuse_non_bools(name, value):
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r}")):
        TransformerDecoderBlock(
            num_heads=2, intermediate_dim=4, **{name: value}
        )


@pytest.mark.parametrize("value", [0, -1])
def test_rotary_max_wavelength_checked_at_construction(value):
    with pytest.raises(
        ValueError, match=re.escape(f"rotary_max_wavelength={value!r}")
    ):
        TransformerDecoderBlock(
            num_heads=2,
            intermediate_dim=4,
            cross_attention=False,
            rotary_max_wavelength=value,
        )
    with pytest.raises(ValueError, match="key_dim=3"):
        TransformerDecoderBlock(
            num_heads=2,
            intermediate_dim=4,
            key_dim=3,
            rotary_max_wavelength=100,
        )


def test_keras_masks_kept_with_context_and_mask_keywords():
    # Three tensor arguments: Keras fills `inputs_mask` and `context_mask`;
    # both paddings must be read, whether `context` is positional or keyword.
    import keras

    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    ids = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]], "int32")
    context_ids = np.array([[1, 2, 3, 4, 0, 0], [5, 0, 0, 0, 0, 0]], "int32")
    valid = (ids != 0)[..., None]
    attention_mask = np.ones((5, 5), bool)
    attention_mask[:, 1] = False
    block = TransformerDecoderBlock(num_heads=2, intermediate_dim=8)
    x, context = embedding(ids), embedding(context_ids)
    plain_x = keras.ops.convert_to_tensor(to_numpy(x))
    plain_context = keras.ops.convert_to_tensor(to_numpy(context))
    expected = block(
        plain_x,
        plain_context,
        padding_mask=ids != 0,
        context_padding_mask=context_ids != 0,
        attention_mask=attention_mask,
    )
    unpadded = block(plain_x, plain_context, attention_mask=attention_mask)
    assert (
        np.abs((to_numpy(expected) - to_numpy(unpadded)) * valid).max() > 1e-3
    )

    ids_in = keras.Input((5,), dtype="int32")
    context_in = keras.Input((6,), dtype="int32")
    functional = keras.Model(
        [ids_in, context_in],
        block(
            embedding(ids_in),
            context=embedding(context_in),
            attention_mask=attention_mask,
        ),
    )
    outputs = [
        block(x, context=context, attention_mask=attention_mask),
        block(x, context, attention_mask=attention_mask),
        functional([ids, context_ids]),
    ]
    for got in outputs:
        np.testing.assert_allclose(
            to_numpy(got) * valid, to_numpy(expected) * valid, atol=1e-5
        )


def test_cross_attention_cache_needs_a_built_block_with_cross_attention():
    context = np.ones((2, 6, 16), "float32")
    with pytest.raises(ValueError, match="needs a built block"):
        TransformerDecoderBlock(2, 8).compute_cross_attention_cache(context)
    block = TransformerDecoderBlock(2, 8, cross_attention=False)
    block(np.ones((2, 5, 16), "float32"))
    with pytest.raises(ValueError, match="no cross-attention"):
        block.compute_cross_attention_cache(context)


# A cache written past its end (issue 36): refused eagerly, naming the
# block's argument.


@pytest.mark.parametrize("index, steps", [(4, 1), (6, 1), (3, 2), (-1, 1)])
def test_cache_written_past_its_end_is_refused(index, steps):
    block = TransformerDecoderBlock(2, 16, cross_attention=False)
    x = np.random.default_rng(6).normal(size=(2, steps, 8)).astype("float32")
    cache = np.zeros((2, 2, 4, 2, 4), "float32")
    name = "self_attention_cache_update_index"
    with pytest.raises(
        ValueError, match=rf"`{name}`.*4 positions.*{name}={index}\b"
    ):
        block(x, self_attention_cache=cache, **{name: index})
    y, _ = block(x[:, :1], self_attention_cache=cache, **{name: 3})
    assert tuple(y.shape) == (2, 1, 8)


def test_rolling_cache_wraps_around_but_refuses_a_negative_index():
    block = TransformerDecoderBlock(2, 16, cross_attention=False, window_size=2)
    x = np.ones((1, 1, 8), "float32")
    cache = np.zeros((1, 2, 3, 2, 4), "float32")
    kwargs = dict(
        self_attention_cache=cache, self_attention_cache_sink_tokens=0
    )
    y, _ = block(x, self_attention_cache_update_index=9, **kwargs)
    assert tuple(y.shape) == (1, 1, 8)
    with pytest.raises(
        ValueError, match=r"self_attention_cache_update_index=-1\b"
    ):
        block(x, self_attention_cache_update_index=-1, **kwargs)


# `positions=` (issue 36): the rotary positions of the self-attention.


def test_packed_positions_and_document_mask_equal_documents_one_by_one():
    x = np.random.default_rng(11).normal(size=(1, 5, 8)).astype("float32")
    ids = np.array([[0, 0, 0, 1, 1]], "int32")
    positions = np.array([[0, 1, 2, 0, 1]], "int32")
    block = TransformerDecoderBlock(
        2, 16, cross_attention=False, rotary_max_wavelength=100
    )
    alone = np.concatenate(
        [to_numpy(block(x[:, :3])), to_numpy(block(x[:, 3:]))], axis=1
    )
    same_document = ids[:, :, None] == ids[:, None, :]
    packed = block(x, positions=positions, attention_mask=same_document)
    np.testing.assert_allclose(to_numpy(packed), alone, atol=1e-5)
    packed = block(x, positions=positions, segment_ids=ids)
    np.testing.assert_allclose(to_numpy(packed), alone, atol=1e-5)


def test_positions_reach_the_rotary_positions_with_a_cache():
    # One position for every token cancels rotary positions (scores depend
    # on m - n only): cached steps at position 0 equal the block without
    # them; steps at their own positions equal the full rotary pass.
    x = np.random.default_rng(12).normal(size=(2, 4, 8)).astype("float32")
    rotary = TransformerDecoderBlock(
        2, 16, cross_attention=False, rotary_max_wavelength=100
    )
    plain = TransformerDecoderBlock(2, 16, cross_attention=False)
    rotary(x), plain(x)
    plain.set_weights(rotary.get_weights())
    valid = np.ones((2, 4), bool)
    for step_positions, full in (
        (lambda i: np.zeros((2, 1), "int32"), plain(x)),
        (lambda i: np.full((2, 1), i, "int32"), rotary(x)),
    ):
        cache = np.zeros((2, 2, 4, 2, 4), "float32")
        steps = []
        for i in range(4):
            y, cache = rotary(
                x[:, i : i + 1],
                attention_mask=valid[:, None, :],
                self_attention_cache=cache,
                self_attention_cache_update_index=i,
                positions=step_positions(i),
            )
            steps.append(to_numpy(y))
        np.testing.assert_allclose(
            np.concatenate(steps, 1), to_numpy(full), atol=1e-5
        )


def test_positions_are_refused_with_a_rolling_cache():
    block = TransformerDecoderBlock(
        2,
        16,
        cross_attention=False,
        window_size=2,
        rotary_max_wavelength=100,
    )
    x = np.ones((1, 1, 8), "float32")
    with pytest.raises(ValueError, match="`positions`.*rolling"):
        block(
            x,
            self_attention_cache=np.zeros((1, 2, 3, 2, 4), "float32"),
            self_attention_cache_update_index=0,
            self_attention_cache_sink_tokens=0,
            positions=np.zeros((1, 1), "int32"),
        )
