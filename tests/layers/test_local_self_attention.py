import re

import keras
import numpy as np
import pytest
from harness import run_layer_test
from harness import run_mask_test
from keras import ops
from references import multi_head_attention as np_mha

from keras_attention import masks
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import SelfAttention

RNG = np.random.default_rng(0)
BACKEND = keras.backend.backend()


def np_(x):
    return ops.convert_to_numpy(x)


def _pair(local_kwargs, x):
    """A built LocalSelfAttention and a dense SelfAttention, same weights."""
    kwargs = dict(local_kwargs)
    kwargs.pop("window_size")
    kwargs.pop("block_size", None)
    local = LocalSelfAttention(**local_kwargs)
    local(x)
    dense = SelfAttention(**kwargs)
    dense(x)
    dense.set_weights(local.get_weights())
    return local, dense


def _call(layer, x, **kwargs):
    """`layer(x, **kwargs)` eagerly on TensorFlow; on JAX one `jax.jit`
    compilation (eager JAX compiles every op for every new shape)."""
    if BACKEND != "jax":
        return layer(x, **kwargs)
    import jax

    def run(trainable, non_trainable, x):
        return layer.stateless_call(trainable, non_trainable, x, **kwargs)[0]

    return jax.jit(run)(
        [v.value for v in layer.trainable_variables],
        [v.value for v in layer.non_trainable_variables],
        x,
    )


def test_harness():
    run_layer_test(
        LocalSelfAttention,
        dict(num_heads=2, key_dim=4, window_size=(2, 1), block_size=4),
        dict(inputs=RNG.normal(size=(2, 7, 8)).astype("float32")),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 7, 8), (2, 2, 7, 4)),
        expected_num_trainable_weights=8,
    )


def test_harness_causal_grouped_query():
    run_layer_test(
        LocalSelfAttention,
        dict(
            num_heads=4,
            key_dim=4,
            window_size=3,
            causal=True,
            num_key_value_heads=2,
            dropout=0.1,
            output_shape=6,
        ),
        dict(inputs=RNG.normal(size=(2, 9, 8)).astype("float32")),
        expected_output_shape=(2, 9, 6),
        expected_num_trainable_weights=8,
    )


def test_masks_through_harness():
    run_mask_test(
        LocalSelfAttention,
        dict(num_heads=2, key_dim=4, window_size=2),
        ("inputs",),
        ("mask",),
    )
    run_mask_test(
        LocalSelfAttention,
        dict(num_heads=2, key_dim=4, window_size=2, causal=True),
        ("inputs",),
        ("mask",),
        causal=True,
    )


# (T, window_size, causal, block_size, padded steps of the last example):
# T not a multiple of the block, T smaller than the window, a fully padded
# example, one-sided windows.
# (More shapes in tests/ops/test_local.py.)
CASES = [
    (5, 9, False, None, 2),
    (11, (3, 1), False, 4, 11),
    (23, 2, True, 4, 5),
]


@pytest.mark.parametrize("t,window,causal,block,padded", CASES)
def test_equals_dense_self_attention_with_sliding_window_mask(
    t, window, causal, block, padded
):
    x = RNG.normal(size=(2, t, 8)).astype("float32")
    valid = np.ones((2, t), bool)
    valid[1, t - padded :] = False
    local, dense = _pair(
        dict(
            num_heads=2,
            key_dim=4,
            window_size=window,
            causal=causal,
            block_size=block,
            num_key_value_heads=1,
        ),
        x,
    )
    out, scores = _call(local, x, mask=valid, return_attention_scores=True)
    window_mask = masks.sliding_window_mask(t, window, causal)
    ref_out, ref_scores = _call(
        dense,
        x,
        mask=valid,
        attention_mask=window_mask,
        return_attention_scores=True,
    )
    np.testing.assert_allclose(np_(out), np_(ref_out), atol=1e-5)
    np.testing.assert_allclose(
        np_(local.scores_to_dense(scores)), np_(ref_scores), atol=1e-6
    )
    assert np.all(np.isfinite(np_(out)))
    if padded == t:  # fully padded example: zero weights, output = bias
        assert np.all(np_(scores)[1] == 0)


def test_matches_numpy_reference():
    x = RNG.normal(size=(2, 10, 8)).astype("float32")
    layer = LocalSelfAttention(
        2, 4, window_size=(2, 3), block_size=4, bias_initializer="random_normal"
    )
    layer(x[:, :1])
    out, scores = _call(layer, x, return_attention_scores=True)
    window = np.asarray(masks.sliding_window_mask(10, (2, 3)))[:, None]
    ref_out, ref_weights = np_mha(layer, x, x, mask=window)
    np.testing.assert_allclose(np_(out), ref_out, atol=1e-5)
    np.testing.assert_allclose(
        np_(layer.scores_to_dense(scores)), ref_weights, atol=1e-6
    )


def test_explicit_attention_mask_combines_with_window():
    t = 9
    x = RNG.normal(size=(2, t, 8)).astype("float32")
    local, dense = _pair(
        dict(num_heads=2, key_dim=4, window_size=2, block_size=4), x
    )
    extra = RNG.random((2, t, t)) > 0.4
    window = masks.sliding_window_mask(t, 2)
    np.testing.assert_allclose(
        np_(_call(local, x, attention_mask=extra)),
        np_(_call(dense, x, attention_mask=masks.combine_masks(window, extra))),
        atol=1e-5,
    )


def test_rotary_positions_match_dense():
    x = RNG.normal(size=(1, 12, 8)).astype("float32")
    local, dense = _pair(
        dict(num_heads=2, key_dim=4, window_size=3, rotary_max_wavelength=100),
        x,
    )
    np.testing.assert_allclose(
        np_(_call(local, x)),
        np_(_call(dense, x, attention_mask=masks.sliding_window_mask(12, 3))),
        atol=1e-5,
    )


def test_cache_decoding_matches_full_pass():
    layer = LocalSelfAttention(
        2, 4, window_size=2, causal=True, num_key_value_heads=1
    )
    x = RNG.normal(size=(2, 7, 8)).astype("float32")
    full = np_(layer(x))
    cache = np.zeros((2, 2, 7, 1, 4), "float32")
    steps = []
    for t in range(7):
        out, cache = layer(x[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(np_(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_padded_rows_finite_under_mixed_precision(policy):
    layer = LocalSelfAttention(2, 4, window_size=2, dtype=policy)
    x = RNG.normal(size=(2, 6, 8)).astype("float32") * 20
    valid = np.ones((2, 6), bool)
    valid[1] = False
    out = np_(ops.cast(layer(x, mask=valid), "float32"))
    assert np.all(np.isfinite(out))


@pytest.mark.tf_only
def test_weight_gradients_equal_dense():
    import tensorflow as tf

    t = 13
    x = RNG.normal(size=(2, t, 8)).astype("float32")
    valid = np.ones((2, t), bool)
    valid[1, 4:] = False
    local, dense = _pair(
        dict(num_heads=2, key_dim=4, window_size=(3, 2), block_size=4), x
    )
    window = masks.sliding_window_mask(t, (3, 2))
    cot = RNG.normal(size=(2, t, 8)).astype("float32")

    def grads(layer, **kwargs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x, mask=valid, **kwargs) * cot)
        return tape.gradient(loss, layer.trainable_weights)

    for a, b in zip(grads(local), grads(dense, attention_mask=window)):
        np.testing.assert_allclose(np_(a), np_(b), atol=1e-5)


def test_config_keeps_window_and_block():
    layer = LocalSelfAttention(
        2, 4, window_size=(5, 1), block_size=8, causal=True
    )
    config = layer.get_config()
    assert config["window_size"] == (5, 1) and config["block_size"] == 8
    revived = LocalSelfAttention.from_config(config)
    assert revived.window_bounds == (5, 0)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(window_size=-1), "window_size"),
        (dict(window_size=(1, 2, 3)), "window_size"),
        (dict(window_size=2.5), "window_size"),
        (dict(window_size=2, block_size=0), "block_size"),
        (dict(window_size=2, block_size=4.0), "block_size"),
        (dict(window_size=2, dropout=1.5), "dropout"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"{name}.*Received"):
        LocalSelfAttention(2, 4, **kwargs)


def test_bad_shapes():
    layer = LocalSelfAttention(2, 4, window_size=2)
    with pytest.raises(ValueError, match="query_shape"):
        layer(np.ones((2, 8), "float32"))
    layer = LocalSelfAttention(2, 4, window_size=2)
    with pytest.raises(ValueError, match="attention_mask"):
        layer(
            np.ones((2, 5, 8), "float32"), attention_mask=np.ones((5, 4), bool)
        )


@pytest.mark.parametrize("value", ["2", (2, "1"), True])
def test_window_size_message_shows_the_value_with_repr(value):
    with pytest.raises(ValueError, match=re.escape(f"window_size={value!r}")):
        LocalSelfAttention(2, 4, window_size=value)


def test_block_size_message_shows_the_value_with_repr():
    with pytest.raises(ValueError, match=re.escape("block_size='4'")):
        LocalSelfAttention(2, 4, window_size=2, block_size="4")


def test_causal_must_be_a_bool():
    with pytest.raises(ValueError, match=re.escape("causal='False'")):
        LocalSelfAttention(2, 4, window_size=2, causal="False")


# Issue 10, defect 2: the Keras mask was dropped as soon as `attention_mask`
# was passed (Keras then fills `inputs_mask`, not `mask`).


@pytest.mark.parametrize("causal", [False, True])
def test_keras_mask_is_kept_when_attention_mask_is_given(causal):
    t = 7
    x = RNG.normal(size=(2, t, 8)).astype("float32")
    valid = np.ones((2, t), bool)
    valid[0, :2] = False  # left padding: seen by causal queries too
    extra = RNG.random((2, t, t)) > 0.3
    layer = LocalSelfAttention(2, 4, window_size=2, causal=causal, block_size=4)
    masked = keras.layers.Masking()(x * valid[..., None])
    out = layer(masked, attention_mask=extra)
    window = np_(masks.sliding_window_mask(t, 2, causal))[:, None]
    xz = x * valid[..., None]
    full = (
        valid[:, None, :, None] & valid[:, None, None] & window & extra[:, None]
    )
    ref, _ = np_mha(layer, xz, xz, mask=full)
    np.testing.assert_allclose(np_(out)[valid], ref[valid], atol=1e-5)
    from keras.src.backend import get_keras_mask

    np.testing.assert_array_equal(np_(get_keras_mask(out)), valid)


def test_padding_mask_shape_is_checked():
    layer = LocalSelfAttention(2, 4, window_size=2)
    with pytest.raises(ValueError, match=r"`mask`.*mask.shape=\(2, 4\)"):
        layer(np.ones((2, 5, 8), "float32"), mask=np.ones((2, 4), bool))


def test_gated_attention_matches_dense():
    # `use_gate` (a MultiHeadAttention option) gates each head's result as in
    # SelfAttention; before, the gate weights were created and never used.
    x = RNG.normal(size=(2, 11, 8)).astype("float32")
    local, dense = _pair(
        dict(num_heads=2, key_dim=4, window_size=2, use_gate=True), x
    )
    plain = SelfAttention(num_heads=2, key_dim=4)
    plain(x)
    plain.set_weights(
        [
            w
            for w, v in zip(local.get_weights(), local.weights)
            if "gate" not in v.path
        ]
    )
    window = masks.sliding_window_mask(11, 2)
    want = np_(_call(dense, x, attention_mask=window))
    np.testing.assert_allclose(np_(_call(local, x)), want, atol=1e-5)
    ungated = np_(_call(plain, x, attention_mask=window))
    assert np.abs(want - ungated).max() > 1e-3  # the gate does something


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(sliding_window=3), "sliding_window"),
        (dict(attention_axes=(1,)), "attention_axes"),
        (dict(output_shape=(4, 2)), "output_shape"),
    ],
)
def test_multi_head_options_without_meaning_here_are_refused(kwargs, name):
    with pytest.raises(ValueError, match=re.escape(f"{name}=")):
        LocalSelfAttention(2, 4, window_size=2, **kwargs)


# Issue 23, item 12: a window wider than the sequence was not capped: on
# T=8, `window_size=100_000` computed and returned banded scores of shape
# (1, 1, 8, 200001) (~288 MiB more than window_size=8).
@pytest.mark.parametrize(
    "window,causal,band",
    [
        (100_000, False, 15),
        ((100_000, 2), False, 10),
        ((1, 100_000), False, 9),
        (100_000, True, 8),
        (7, False, 15),
        (3, False, 7),
    ],
)
def test_window_is_capped_at_the_sequence_length(window, causal, band):
    x = RNG.normal(size=(1, 8, 4)).astype("float32")
    layer = LocalSelfAttention(1, 2, window_size=window, causal=causal)
    out, scores = layer(x, return_attention_scores=True)
    assert tuple(scores.shape) == (1, 1, 8, band)
    spec = layer.compute_output_spec(
        keras.KerasTensor((1, 8, 4)), return_attention_scores=True
    )[1]
    assert tuple(spec.shape) == (1, 1, 8, band)
    # The same results as the window capped by hand.
    left, right = masks.window_bounds(window, causal)
    capped = LocalSelfAttention(
        1, 2, window_size=(min(left, 7), min(right, 7)), causal=causal
    )
    capped(x)
    capped.set_weights(layer.get_weights())
    want_out, want_scores = capped(x, return_attention_scores=True)
    np.testing.assert_allclose(np_(out), np_(want_out), atol=1e-6)
    np.testing.assert_allclose(
        np_(layer.scores_to_dense(scores)),
        np_(capped.scores_to_dense(want_scores)),
        atol=1e-6,
    )
    dense = np_(layer.scores_to_dense(scores))
    np.testing.assert_allclose(dense.sum(-1), 1.0, atol=1e-5)


def test_capped_window_with_global_tokens():
    x = RNG.normal(size=(1, 8, 4)).astype("float32")
    is_global = np.zeros((1, 8), bool)
    is_global[0, 3] = True
    layer = LocalSelfAttention(1, 2, window_size=100_000)
    out, scores = layer(x, global_mask=is_global, return_attention_scores=True)
    assert tuple(scores["local"].shape) == (1, 1, 8, 15)
    full = SelfAttention(1, 2)
    full(x)
    full.set_weights(layer.get_weights())
    want, want_scores = full(x, return_attention_scores=True)
    np.testing.assert_allclose(np_(out), np_(want), atol=1e-5)
    np.testing.assert_allclose(
        np_(layer.scores_to_dense(scores)), np_(want_scores), atol=1e-5
    )


def test_multi_head_sliding_window_wider_than_the_sequence():
    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    wide = MultiHeadAttention(2, 4, sliding_window=10**12)
    plain = MultiHeadAttention(2, 4)
    wide(x, x)
    plain(x, x)
    plain.set_weights(wide.get_weights())
    np.testing.assert_allclose(np_(wide(x, x)), np_(plain(x, x)), atol=1e-5)
    # The dense path (scores requested) with the window as a mask.
    got = wide(x, x, return_attention_scores=True, use_causal_mask=True)
    want = plain(x, x, return_attention_scores=True, use_causal_mask=True)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np_(a), np_(b), atol=1e-5)
