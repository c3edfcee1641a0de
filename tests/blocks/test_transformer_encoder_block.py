import re

import keras
import numpy as np
import pytest
import references
from harness import run_layer_test
from harness import run_mask_test
from keras.ops import convert_to_numpy as to_numpy

from keras_attention import masks
from keras_attention.blocks import TransformerEncoderBlock


def padding_4d(valid):
    return valid[:, None, :, None] & valid[:, None, None, :]


def test_harness_post_norm_with_scores():
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    run_layer_test(
        TransformerEncoderBlock,
        dict(num_heads=2, intermediate_dim=16, dropout=0.1),
        dict(inputs=x),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 5, 8), (2, 2, 5, 5)),
        expected_num_trainable_weights=16,
    )


def test_harness_pre_norm_causal_rotary_gqa():
    x = np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32")
    run_layer_test(
        TransformerEncoderBlock,
        dict(
            num_heads=4,
            intermediate_dim=16,
            num_key_value_heads=2,
            norm_first=True,
            causal=True,
            rotary_max_wavelength=100,
            activation="gelu",
        ),
        dict(inputs=x),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=16,
    )


def test_masks():
    run_mask_test(
        TransformerEncoderBlock,
        dict(num_heads=2, intermediate_dim=16),
        ("inputs",),
        ("padding_mask",),
    )


def test_masks_causal():
    run_mask_test(
        TransformerEncoderBlock,
        dict(num_heads=2, intermediate_dim=16, causal=True, norm_first=True),
        ("inputs",),
        ("padding_mask",),
        causal=True,
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_matches_numpy_reference(norm_first):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    valid = np.ones((2, 6), bool)
    valid[1, 4:] = False
    block = TransformerEncoderBlock(
        num_heads=2, intermediate_dim=16, norm_first=norm_first
    )
    out = to_numpy(block(x, padding_mask=valid))
    expected = references.encoder_block(
        block, x.astype("float64"), padding_4d(valid)
    )
    np.testing.assert_allclose(out[valid], expected[valid], atol=1e-4)


def test_prefix_lm_mask_bidirectional_in_prefix_causal_after():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 7, 8)).astype("float32")
    prefix = 3
    block = TransformerEncoderBlock(num_heads=2, intermediate_dim=16)
    mask = masks.prefix_lm_mask(7, prefix)
    out, w = block(x, attention_mask=mask, return_attention_scores=True)
    w = to_numpy(w)
    i, j = np.meshgrid(np.arange(7), np.arange(7), indexing="ij")
    assert np.all(w[..., j > np.maximum(i, prefix - 1)] == 0)
    assert np.all(w[..., (j < prefix) | (j <= i)] > 0)
    expected = references.encoder_block(
        block, x.astype("float64"), (j <= np.maximum(i, prefix - 1))[None, None]
    )
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-4)
    # A later prefix token reaches the first position; tokens after it don't.
    changed = x.copy()
    changed[:, 2] += 1.0
    changed_out = to_numpy(block(changed, attention_mask=mask))
    assert not np.allclose(changed_out[:, 0], to_numpy(out)[:, 0])
    future = x.copy()
    future[:, 5:] += 1.0
    future_out = to_numpy(block(future, attention_mask=mask))
    np.testing.assert_allclose(
        future_out[:, :5], to_numpy(out)[:, :5], atol=1e-6
    )


def test_causal_leaks_nothing_from_the_future():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    block = TransformerEncoderBlock(
        num_heads=2, intermediate_dim=16, causal=True, rotary_max_wavelength=100
    )
    base = to_numpy(block(x))
    for t in range(1, 6):
        changed = x.copy()
        changed[:, t:] = rng.normal(size=changed[:, t:].shape)
        np.testing.assert_array_equal(
            to_numpy(block(changed))[:, :t], base[:, :t]
        )


@pytest.mark.tf_only
def test_scores_are_tensors_inside_tf_function():
    import tensorflow as tf

    x = np.random.default_rng(5).normal(size=(2, 4, 8)).astype("float32")
    block = TransformerEncoderBlock(num_heads=2, intermediate_dim=16)
    eager = block(x, return_attention_scores=True)
    graph = tf.function(lambda t: block(t, return_attention_scores=True))(x)
    for e, g in zip(eager, graph):
        assert isinstance(g, tf.Tensor)
        np.testing.assert_allclose(g.numpy(), to_numpy(e), atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=0, intermediate_dim=4), "num_heads=0"),
        (dict(num_heads=2, intermediate_dim=-4), "intermediate_dim=-4"),
        (dict(num_heads=2, intermediate_dim=4, key_dim=0), "key_dim=0"),
        (
            dict(num_heads=4, intermediate_dim=4, num_key_value_heads=3),
            "num_key_value_heads=3",
        ),
        (dict(num_heads=2, intermediate_dim=4, dropout=1.5), "dropout=1.5"),
        (
            dict(num_heads=2, intermediate_dim=4, layer_norm_epsilon=0),
            "layer_norm_epsilon=0",
        ),
    ],
)
def test_constructor_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TransformerEncoderBlock(**kwargs)


def test_build_errors():
    with pytest.raises(ValueError, match="features=7"):
        TransformerEncoderBlock(num_heads=2, intermediate_dim=4)(
            np.zeros((1, 3, 7), "float32")
        )
    with pytest.raises(ValueError, match="inputs_shape"):
        TransformerEncoderBlock(num_heads=2, intermediate_dim=4)(
            np.zeros((3, 8), "float32")
        )
    # An explicit key_dim lifts the divisibility requirement.
    out = TransformerEncoderBlock(num_heads=2, intermediate_dim=4, key_dim=3)(
        np.zeros((1, 3, 7), "float32")
    )
    assert tuple(out.shape) == (1, 3, 7)


def test_keras_mask_flows_through_a_stack():
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, 8, mask_zero=True)(ids)
    for _ in range(2):
        x = TransformerEncoderBlock(num_heads=2, intermediate_dim=8)(x)
    assert getattr(x, "_keras_mask", None) is not None


@pytest.mark.parametrize("name", ["norm_first", "causal"])
@pytest.mark.parametrize("value", ["False", 0, None])
def test_bool_flags_refuse_non_bools(name, value):
    # "False" from a command line or YAML file used to be taken as True.
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r}")):
        TransformerEncoderBlock(
            num_heads=2, intermediate_dim=4, **{name: value}
        )


@pytest.mark.parametrize("value", [0, -1, "10000"])
def test_rotary_max_wavelength_checked_at_construction(value):
    # Used to pass until build, then name `max_wavelength` (not the argument).
    with pytest.raises(
        ValueError, match=re.escape(f"rotary_max_wavelength={value!r}")
    ):
        TransformerEncoderBlock(
            num_heads=2, intermediate_dim=4, rotary_max_wavelength=value
        )


def test_rotary_needs_an_even_head_size():
    with pytest.raises(
        ValueError, match=r"key_dim=5.*rotary_max_wavelength=100"
    ):
        TransformerEncoderBlock(
            num_heads=2,
            intermediate_dim=4,
            key_dim=5,
            rotary_max_wavelength=100,
        )
    block = TransformerEncoderBlock(
        num_heads=2, intermediate_dim=4, rotary_max_wavelength=100
    )
    with pytest.raises(ValueError, match=r"= 5.*rotary_max_wavelength=100"):
        block(np.zeros((1, 3, 10), "float32"))  # head size 10 // 2 = 5


def _masked_embedding_inputs():
    ids = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]], "int32")
    return ids, keras.layers.Embedding(10, 8, mask_zero=True)


@pytest.mark.parametrize("norm_first", [False, True])
def test_keras_mask_kept_when_attention_mask_is_passed(norm_first):
    # With two tensor arguments Keras fills `inputs_mask`, not `mask`: the
    # padding must still be read (eager, functional and tf.function alike).
    ids, embedding = _masked_embedding_inputs()
    valid = (ids != 0)[..., None]
    attention_mask = np.ones((5, 5), bool)
    attention_mask[:, 1] = False
    block = TransformerEncoderBlock(
        num_heads=2, intermediate_dim=8, norm_first=norm_first
    )
    x = embedding(ids)
    plain = keras.ops.convert_to_tensor(to_numpy(x))  # no Keras mask
    expected = block(
        plain, padding_mask=ids != 0, attention_mask=attention_mask
    )
    unpadded = block(plain, attention_mask=attention_mask)
    assert (
        np.abs((to_numpy(expected) - to_numpy(unpadded)) * valid).max() > 1e-3
    )

    eager = block(x, attention_mask=attention_mask)
    inp = keras.Input((5,), dtype="int32")
    model = keras.Model(
        inp, block(embedding(inp), attention_mask=attention_mask)
    )
    outputs = [eager, model(ids)]
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        outputs.append(
            tf.function(
                lambda t: block(embedding(t), attention_mask=attention_mask)
            )(ids)
        )
    for got in outputs:
        np.testing.assert_allclose(
            to_numpy(got) * valid, to_numpy(expected) * valid, atol=1e-5
        )


# `positions=` (issue 36): the rotary positions of the self-attention.


def _packed_documents():
    """Two documents (3 and 2 tokens) packed in one row, their positions
    restarting at each, and the mask keeping each token in its document."""
    x = np.random.default_rng(9).normal(size=(1, 5, 8)).astype("float32")
    ids = np.array([[0, 0, 0, 1, 1]], "int32")
    positions = np.array([[0, 1, 2, 0, 1]], "int32")
    return x, ids, positions, ids[:, :, None] == ids[:, None, :]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_size", [None, 1])
def test_packed_positions_and_document_mask_equal_documents_one_by_one(
    causal, window_size
):
    block = TransformerEncoderBlock(
        2,
        16,
        causal=causal,
        window_size=window_size,
        rotary_max_wavelength=100,
    )
    x, ids, positions, same_document = _packed_documents()
    alone = np.concatenate(
        [to_numpy(block(x[:, :3])), to_numpy(block(x[:, 3:]))], axis=1
    )
    packed = block(x, positions=positions, attention_mask=same_document)
    np.testing.assert_allclose(to_numpy(packed), alone, atol=1e-5)
    packed = block(x, positions=positions, segment_ids=ids)
    np.testing.assert_allclose(to_numpy(packed), alone, atol=1e-5)


@pytest.mark.parametrize("window_size", [None, 1])
def test_positions_reach_the_rotary_positions(window_size):
    # Rotary scores depend on m - n only: one position for every token
    # cancels them, which leaves the block without rotary positions.
    x = np.random.default_rng(10).normal(size=(2, 5, 8)).astype("float32")
    rotary = TransformerEncoderBlock(
        2, 16, window_size=window_size, rotary_max_wavelength=100
    )
    plain = TransformerEncoderBlock(2, 16, window_size=window_size)
    rotary(x), plain(x)
    plain.set_weights(rotary.get_weights())
    same = np.full((2, 5), 7, "int32")
    np.testing.assert_allclose(
        to_numpy(rotary(x, positions=same)), to_numpy(plain(x)), atol=1e-5
    )
    assert not np.allclose(to_numpy(rotary(x)), to_numpy(plain(x)), atol=1e-3)


def test_positions_need_rotary_positions():
    x = np.ones((1, 3, 8), "float32")
    with pytest.raises(ValueError, match="`positions`.*rotary"):
        TransformerEncoderBlock(2, 16)(x, positions=np.zeros((1, 3), "int32"))


# Score and mask objects with `window_size` (issue 36: the docs said they
# did not work together; they do).


@pytest.mark.parametrize("causal", [False, True])
def test_score_and_mask_objects_work_with_window_size(causal):
    # The windowed block with ALiBi and a prefix-LM mask equals the full
    # block with the same objects and the window as one more mask object.
    from keras_attention import mods
    from keras_attention import scores

    x = np.random.default_rng(13).normal(size=(2, 6, 8)).astype("float32")
    window = (2, 0) if causal else (2, 1)
    common = dict(
        causal=causal,
        score_mod=scores.ALiBi(num_heads=2),
        rotary_max_wavelength=100,
    )
    local = TransformerEncoderBlock(
        2, 16, window_size=window, mask_mod=mods.PrefixLMMask(2), **common
    )
    full = TransformerEncoderBlock(
        2,
        16,
        mask_mod=mods.and_masks(
            mods.PrefixLMMask(2), mods.SlidingWindowMask(window)
        ),
        **common,
    )
    local(x), full(x)
    full.set_weights(local.get_weights())
    np.testing.assert_allclose(to_numpy(local(x)), to_numpy(full(x)), atol=1e-5)
    bare = TransformerEncoderBlock(
        2, 16, window_size=window, causal=causal, rotary_max_wavelength=100
    )
    bare(x)
    bare.set_weights(local.get_weights())
    assert not np.allclose(to_numpy(bare(x)), to_numpy(local(x)), atol=1e-3)
