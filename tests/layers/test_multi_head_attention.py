import re

import keras
import numpy as np
import pytest
from harness import run_layer_test
from harness import run_mask_test
from keras import ops
from references import multi_head_attention as np_mha

from keras_attention.layers import MultiHeadAttention

RNG = np.random.default_rng(0)
Q = RNG.normal(size=(2, 5, 8)).astype("float32")
V = RNG.normal(size=(2, 7, 6)).astype("float32")


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def test_harness():
    run_layer_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4),
        dict(query=Q, value=V),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 5, 8), (2, 2, 5, 7)),
        expected_num_trainable_weights=8,
    )


def test_harness_with_attention_scale():
    # Config round trip, `.keras`, SavedModel, fit and the mask checks of
    # the shared harness with a scale that is not 1 / sqrt(key_dim).
    run_layer_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4, attention_scale=1.0),
        dict(query=Q, value=V),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 5, 8), (2, 2, 5, 7)),
        expected_num_trainable_weights=8,
    )


def test_harness_grouped_query_with_key_and_causal():
    run_layer_test(
        MultiHeadAttention,
        dict(
            num_heads=4,
            key_dim=4,
            value_dim=3,
            num_key_value_heads=2,
            output_shape=5,
            dropout=0.1,
        ),
        dict(query=Q, value=Q, key=Q),
        call_kwargs=dict(use_causal_mask=True),
        expected_output_shape=(2, 5, 5),
        expected_num_trainable_weights=8,
    )


def test_harness_keras_options_gate_and_sliding_window():
    # Keras 3.15's options through config, .keras, SavedModel, fit and mixed
    # precision; self-attention shapes without scores take the banded path.
    run_layer_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4, use_gate=True, sliding_window=3),
        dict(query=Q, value=Q),
        call_kwargs=dict(use_causal_mask=True),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=10,
    )


def test_masks_through_harness():
    run_mask_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4),
        ("query", "value"),
        ("query_mask", "value_mask"),
    )
    run_mask_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4),
        ("query", "value"),
        ("query_mask", "value_mask"),
        call_kwargs=dict(use_causal_mask=True),
        causal=True,
    )


@pytest.mark.parametrize("kv_heads", [None, 2, 1])
def test_matches_numpy_reference(kv_heads):
    layer = MultiHeadAttention(4, 3, num_key_value_heads=kv_heads)
    mask = RNG.random((2, 5, 7)) > 0.3
    out, scores = layer(Q, V, attention_mask=mask, return_attention_scores=True)
    ref, ref_w = np_mha(layer, Q, V, mask=mask[:, None])
    np.testing.assert_allclose(np_(out), ref, atol=1e-5)
    np.testing.assert_allclose(np_(scores), ref_w, atol=1e-6)
    if kv_heads:
        assert layer.key_dense.kernel.shape == (6, kv_heads, 3)


@pytest.mark.parametrize("scale", [1.0, 0.05])
def test_attention_scale_matches_numpy_reference(scale):
    layer = MultiHeadAttention(
        4, 3, num_key_value_heads=2, attention_scale=scale
    )
    mask = RNG.random((2, 5, 7)) > 0.3
    out, scores = layer(Q, V, attention_mask=mask, return_attention_scores=True)
    ref, ref_w = np_mha(layer, Q, V, mask=mask[:, None], scale=scale)
    np.testing.assert_allclose(np_(out), ref, atol=1e-5)
    np.testing.assert_allclose(np_(scores), ref_w, atol=1e-6)
    default, _ = np_mha(layer, Q, V, mask=mask[:, None])
    assert np.abs(default - ref).max() > 1e-3  # the scale matters here


@pytest.mark.parametrize(
    "options",
    [
        {},  # causal: blockwise (T * T > 32768) vs dense
        {"sliding_window": 16},  # banded vs dense
        {"rotary_max_wavelength": 100},
    ],
)
def test_attention_scale_is_the_same_on_every_path(options):
    x = RNG.normal(size=(1, 200, 8)).astype("float32")
    kwargs = dict(num_heads=2, key_dim=4, attention_scale=0.9, **options)
    auto = MultiHeadAttention(**kwargs)
    dense = MultiHeadAttention(flash_attention=False, **kwargs)
    auto.build(x.shape, x.shape)
    dense.build(x.shape, x.shape)
    dense.set_weights(auto.get_weights())
    got = auto(x, x, use_causal_mask=True)
    want, weights = dense(
        x, x, use_causal_mask=True, return_attention_scores=True
    )
    np.testing.assert_allclose(np_(got), np_(want), atol=2e-5)
    # Cached decoding, one position at a time, gives the same outputs.
    cache = ops.zeros((1, 2, 200, 2, 4))
    steps = []
    for t in range(0, 200, 50):
        y, cache = auto(
            x[:, t : t + 50],
            x[:, t : t + 50],
            cache=cache,
            cache_update_index=t,
            use_causal_mask=True,
        )
        steps.append(np_(y))
    np.testing.assert_allclose(np.concatenate(steps, 1), np_(want), atol=2e-5)


def test_attention_scale_config():
    layer = MultiHeadAttention(2, 4, attention_scale=1.0)
    config = layer.get_config()
    assert config["attention_scale"] == 1.0
    assert MultiHeadAttention.from_config(config).attention_scale == 1.0
    # Unset, the config keeps Keras's keys only.
    assert "attention_scale" not in MultiHeadAttention(2, 4).get_config()


def test_drop_in_for_keras_multi_head_attention():
    theirs = keras.layers.MultiHeadAttention(
        num_heads=2, key_dim=4, value_dim=3
    )
    ours = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=3)
    mask = np.ones((2, 5, 7), bool)
    mask[:, :, -2:] = False
    a, sa = theirs(Q, V, attention_mask=mask, return_attention_scores=True)
    ours(Q, V)
    assert [w.shape for w in ours.weights] == [w.shape for w in theirs.weights]
    ours.set_weights(theirs.get_weights())
    b, sb = ours(Q, V, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(np_(a), np_(b), atol=1e-5)
    np.testing.assert_allclose(np_(sa), np_(sb), atol=1e-6)
    # Causal, with a key tensor.
    theirs = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    ours = MultiHeadAttention(num_heads=2, key_dim=4)
    a = theirs(Q, Q, key=Q, use_causal_mask=True)
    ours(Q, Q, key=Q)
    ours.set_weights(theirs.get_weights())
    b = ours(Q, Q, key=Q, use_causal_mask=True)
    np.testing.assert_allclose(np_(a), np_(b), atol=1e-5)


def test_fully_masked_rows_give_zero_result_not_nan():
    layer = MultiHeadAttention(2, 4, dropout=0.5, use_bias=False)
    mask = np.ones((2, 5, 7), bool)
    mask[0, 2] = False
    for training in (False, True):
        out, w = layer(
            Q,
            V,
            attention_mask=mask,
            return_attention_scores=True,
            training=training,
        )
        assert np.all(np.isfinite(np_(out)))
        assert np.all(np_(out)[0, 2] == 0) and np.all(np_(w)[0, :, 2] == 0)
        out = layer(Q, V, attention_mask=mask, training=training)
        assert np.all(np_(out)[0, 2] == 0)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_fully_masked_rows_under_mixed_precision(policy):
    layer = MultiHeadAttention(2, 4, use_bias=False, dtype=policy)
    mask = np.ones((2, 5, 7), bool)
    mask[1, 0] = False
    out, w = layer(Q, V, attention_mask=mask, return_attention_scores=True)
    assert np.all(np.isfinite(np_(out))) and np.all(np_(out)[1, 0] == 0)
    np.testing.assert_allclose(np_(w)[0].sum(-1), 1.0, atol=2e-2)


def test_explicit_mask_shapes_are_equivalent():
    layer = MultiHeadAttention(2, 4)
    base = RNG.random((5, 7)) > 0.3
    results = [
        np_(layer(Q, V, attention_mask=m))
        for m in (
            base,
            np.broadcast_to(base, (2, 5, 7)),
            np.broadcast_to(base, (2, 2, 5, 7)),
        )
    ]
    for r in results[1:]:
        np.testing.assert_allclose(r, results[0], atol=1e-6)
    keras_mask = np.array([[1, 1, 1, 1, 1, 0, 0], [1] * 7], bool)
    explicit = np.broadcast_to(keras_mask[:, None, :], (2, 5, 7))
    np.testing.assert_allclose(
        np_(layer(Q, V, value_mask=keras_mask)),
        np_(layer(Q, V, attention_mask=explicit)),
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "shape", [(5, 6), (2, 5), (3, 5, 7), (2, 3, 5, 7), (7,)]
)
def test_bad_mask_shape_raises(shape):
    layer = MultiHeadAttention(2, 4)
    with pytest.raises(ValueError, match="attention_mask"):
        layer(Q, V, attention_mask=np.ones(shape, bool))


def test_symbolic_scores_shape_when_tq_differs_from_tv():
    layer = MultiHeadAttention(2, 4)
    out, scores = layer(
        keras.Input((5, 8)), keras.Input((7, 6)), return_attention_scores=True
    )
    assert tuple(scores.shape) == (None, 2, 5, 7)
    assert tuple(out.shape) == (None, 5, 8)


def test_keras_mask_survives_reuse_by_several_layers():
    ids = keras.Input((None,), dtype="int32")
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    x = embedding(ids)
    first, second = MultiHeadAttention(2, 4), MultiHeadAttention(2, 4)
    a, b = first(x, x), second(x, x)
    assert x._keras_mask is not None
    assert a._keras_mask is not None and b._keras_mask is not None
    model = keras.Model(ids, [a, b])
    tokens = np.array([[3, 4, 0, 0], [5, 6, 7, 8]])
    valid = tokens != 0
    emb = np_(embedding(tokens))
    out_a, out_b = model(tokens)
    for layer, out in ((first, out_a), (second, out_b)):
        expected = layer(emb, emb, query_mask=valid, value_mask=valid)
        np.testing.assert_allclose(
            np_(out)[valid], np_(expected)[valid], atol=1e-5
        )
        unmasked = layer(emb, emb)
        assert not np.allclose(np_(unmasked)[0, :2], np_(out)[0, :2], atol=1e-4)


def test_cache_matches_full_causal_pass():
    layer = MultiHeadAttention(2, 4, num_key_value_heads=1)
    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    full = np_(layer(x, x, use_causal_mask=True))
    cache = np.zeros((2, 2, 6, 1, 4), "float32")
    steps = []
    for t in range(6):
        xt = x[:, t : t + 1]
        out, cache = layer(
            xt, xt, cache=cache, cache_update_index=t, use_causal_mask=True
        )
        steps.append(np_(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)
    # Precomputed memory (cross-attention) equals recomputing it.
    memory = layer.compute_cache(V[:, :, :8] if V.shape[-1] == 8 else x)
    np.testing.assert_allclose(
        np_(layer(Q, x, cache=memory)[0]), np_(layer(Q, x)), atol=1e-5
    )


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_heads=0, key_dim=4), "num_heads"),
        (dict(num_heads=2.0, key_dim=4), "num_heads"),
        (dict(num_heads=2, key_dim=-1), "key_dim"),
        (dict(num_heads=2, key_dim=4, value_dim=0), "value_dim"),
        (
            dict(num_heads=4, key_dim=4, num_key_value_heads=3),
            "num_key_value_heads",
        ),
        (
            dict(num_heads=4, key_dim=4, num_key_value_heads=0),
            "num_key_value_heads",
        ),
        (dict(num_heads=2, key_dim=4, dropout=-0.1), "dropout"),
        (dict(num_heads=2, key_dim=4, dropout=1.0), "dropout"),
        (dict(num_heads=2, key_dim=4, output_shape=(3, 0)), "output_shape"),
        (dict(num_heads=2, key_dim=4, output_shape=8.0), "output_shape"),
        (dict(num_heads=2, key_dim=4, use_bias="False"), "use_bias"),
        (dict(num_heads=2, key_dim=4, use_gate="False"), "use_gate"),
        (
            dict(num_heads=2, key_dim=4, flash_attention="True"),
            "flash_attention",
        ),
        (dict(num_heads=2, key_dim=4, sliding_window=0), "sliding_window"),
        (dict(num_heads=2, key_dim=4, attention_axes="1"), "attention_axes"),
        (
            dict(num_heads=2, key_dim=4, rotary_max_wavelength=0),
            "rotary_max_wavelength",
        ),
        (
            dict(num_heads=2, key_dim=4, rotary_max_wavelength=-1.0),
            "rotary_max_wavelength",
        ),
        (
            dict(num_heads=2, key_dim=4, rotary_max_wavelength="1e4"),
            "rotary_max_wavelength",
        ),
        (dict(num_heads=2, key_dim=5, rotary_max_wavelength=10000), "key_dim"),
        (dict(num_heads=2, key_dim=4, attention_scale=0.0), "attention_scale"),
        (
            dict(num_heads=2, key_dim=4, attention_scale=float("nan")),
            "attention_scale",
        ),
        (dict(num_heads=2, key_dim=4, attention_scale="1"), "attention_scale"),
    ],
)
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"{name}.*Received"):
        MultiHeadAttention(**kwargs)


def test_bad_input_shapes():
    with pytest.raises(ValueError, match="query_shape"):
        MultiHeadAttention(2, 4)(np.ones((2, 8), "float32"), V)
    with pytest.raises(ValueError, match="key_shape"):
        MultiHeadAttention(2, 4)(Q, V, key=np.ones((2, 6, 6), "float32"))


def test_bool_flag_strings_are_refused_with_repr():
    with pytest.raises(ValueError, match="use_bias='False'"):
        MultiHeadAttention(2, 4, use_bias="False")


def test_odd_key_dim_with_rotary_names_both_arguments_at_construction():
    with pytest.raises(ValueError) as info:
        MultiHeadAttention(2, 5, rotary_max_wavelength=10000)
    assert "rotary_max_wavelength" in str(info.value)
    assert "key_dim=5" in str(info.value)


def test_fourth_positional_argument_is_dropout_as_in_keras():
    layer = MultiHeadAttention(8, 64, None, 0.1)
    assert layer.dropout == 0.1 and layer.num_key_value_heads is None
    with pytest.raises(TypeError):
        MultiHeadAttention(
            8,
            64,
            None,
            0.1,
            True,
            None,
            None,
            None,
            None,
            "glorot_uniform",
            "zeros",
            None,
            None,
            None,
            None,
            None,
            False,
            None,
            2,
        )


@pytest.mark.parametrize(
    "name, shape",
    [
        ("query_mask", (2, 4)),
        ("value_mask", (2, 5)),
        ("key_mask", (1, 7)),
        ("value_mask", (2, 7, 1)),
    ],
)
def test_wrongly_sized_padding_masks_raise_value_error(name, shape):
    layer = MultiHeadAttention(2, 4)
    with pytest.raises(ValueError, match=f"{name}.*{shape[0]}, {shape[1]}"):
        layer(Q, V, **{name: np.ones(shape, bool)})


def test_key_value_length_checked_at_call_time_after_symbolic_build():
    layer = MultiHeadAttention(2, 4)
    layer(
        keras.Input((None, 8)),
        keras.Input((None, 6)),
        key=keras.Input((None, 6)),
    )
    with pytest.raises(ValueError, match="must be equal.*key_shape"):
        layer(Q, V, key=np.ones((2, 6, 6), "float32"))


def test_compute_output_shape_matches_outputs():
    layer = MultiHeadAttention(2, 4, output_shape=(3, 2))
    out = layer(Q, V)
    assert layer.compute_output_shape(Q.shape, V.shape) == tuple(out.shape)
    assert tuple(out.shape) == (2, 5, 3, 2)


@pytest.mark.parametrize(
    "kwargs, shape",
    [
        (dict(sliding_window=2), (None, 8)),
        (dict(attention_axes=2, use_gate=True), (None, 4, 8)),
        (dict(attention_axes=(1, 2), output_shape=(3, 2)), (None, 4, 8)),
    ],
)
def test_new_options_in_a_functional_model_with_unknown_lengths(kwargs, shape):
    layer = MultiHeadAttention(2, 4, **kwargs)
    x = keras.Input(shape)
    model = keras.Model(x, layer(x, x, use_causal_mask=True))
    data = RNG.normal(size=(2, 5) + shape[1:]).astype("float32")
    np.testing.assert_allclose(
        model.predict(data, verbose=0),
        np_(layer(data, data, use_causal_mask=True)),
        atol=1e-5,
    )


# Issue 23, item 11: on rank-3 inputs a wrong `attention_axes` was silently
# ignored (attention ran over the time axis), while the same mistakes on
# rank-4 inputs raised.
@pytest.mark.parametrize("axes", [(0,), (2,), (5,), (1, 1), -1, (-3,), (1, 2)])
def test_attention_axes_are_checked_on_rank_3_inputs(axes):
    layer = MultiHeadAttention(2, 4, attention_axes=axes)
    with pytest.raises(
        ValueError,
        match=re.escape(f"attention_axes={layer.attention_axes!r}")
        + ".*rank 3",
    ):
        layer(Q, Q)
    with pytest.raises(ValueError, match="attention_axes"):
        MultiHeadAttention(2, 4, attention_axes=axes)(
            keras.KerasTensor((None, 5, 8)), keras.KerasTensor((None, 7, 8))
        )


@pytest.mark.parametrize("axes", [1, (1,), -2, (-2,)])
def test_time_axis_is_the_rank_3_attention_axis(axes):
    layer = MultiHeadAttention(2, 4, attention_axes=axes)
    out = layer(Q, V)
    plain = MultiHeadAttention(2, 4)
    plain(Q, V)
    plain.set_weights(layer.get_weights())
    np.testing.assert_allclose(np_(out), np_(plain(Q, V)), atol=1e-6)


# A cache written past its end (issue 36): refused eagerly, naming the index.


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("index, steps", [(6, 1), (4, 1), (3, 2), (-1, 1)])
def test_cache_written_past_its_end_is_refused(grouped, index, steps):
    from keras_attention.layers import GroupQueryAttention

    if grouped:
        layer = GroupQueryAttention(4, 2, 1)
    else:
        layer = MultiHeadAttention(2, 4, num_key_value_heads=1)
    x = RNG.normal(size=(2, steps, 8)).astype("float32")
    cache = np.zeros((2, 2, 4, 1, 4), "float32")
    with pytest.raises(
        ValueError, match=rf"4 positions.*cache_update_index={index}\b"
    ):
        layer(x, x, cache=cache, cache_update_index=index)
    # The last slot is valid.
    out, _ = layer(x[:, :1], x[:, :1], cache=cache, cache_update_index=3)
    assert tuple(out.shape) == (2, 1, 8)


@pytest.mark.parametrize("index", [1.0, True, "1", np.array([1])])
def test_cache_update_index_must_be_a_scalar_integer(index):
    layer = MultiHeadAttention(2, 4)
    x = Q[:, :1]
    cache = np.zeros((2, 2, 4, 2, 4), "float32")
    with pytest.raises(ValueError, match="cache_update_index"):
        layer(x, x, cache=cache, cache_update_index=index)


def test_symbolic_cache_index_is_not_read():
    # In a functional model the index has no value yet: the layer builds
    # (the docs say a compiled call clamps or fails by backend).
    layer = MultiHeadAttention(2, 4)
    x = keras.Input((1, 8), batch_size=1)
    index = keras.Input((), dtype="int32", batch_size=1)
    cache = keras.Input((2, 4, 2, 4), batch_size=1)
    out, new_cache = layer(x, x, cache=cache, cache_update_index=index[0])
    assert tuple(out.shape) == (1, 1, 8)
    assert tuple(new_cache.shape) == (1, 2, 4, 2, 4)


# `positions=` (issue 36): rotary positions of queries and keys.


@pytest.mark.parametrize("kv_heads", [None, 1])
def test_positions_set_the_rotary_positions(kv_heads):
    # Rotary scores depend on m - n only: one position for every token
    # cancels them; positions arange(T) are the default ones.
    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    rotary = MultiHeadAttention(
        2, 4, num_key_value_heads=kv_heads, rotary_max_wavelength=100
    )
    plain = MultiHeadAttention(2, 4, num_key_value_heads=kv_heads)
    rotary(x, x), plain(x, x)
    plain.set_weights(rotary.get_weights())
    same = np.full((5,), 3, "int32")
    np.testing.assert_allclose(
        np_(rotary(x, x, positions=same)), np_(plain(x, x)), atol=1e-5
    )
    np.testing.assert_allclose(
        np_(rotary(x, x, positions=np.arange(5)[None])),
        np_(rotary(x, x)),
        atol=1e-5,
    )


def test_positions_are_checked():
    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    with pytest.raises(ValueError, match="`positions`.*rotary"):
        MultiHeadAttention(2, 4)(x, x, positions=np.arange(5))
    layer = MultiHeadAttention(2, 4, rotary_max_wavelength=100)
    with pytest.raises(ValueError, match="`positions`.*key"):
        layer(x, x[:, :3], positions=np.arange(5))
    fresh = MultiHeadAttention(2, 4, rotary_max_wavelength=100)
    with pytest.raises(
        ValueError, match=r"`positions`.*\(batch, T, features\)"
    ):
        fresh(x[:, None], x[:, None], positions=np.arange(5))
