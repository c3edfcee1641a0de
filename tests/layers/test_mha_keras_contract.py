"""Keras 3.15's own `MultiHeadAttention` scenarios, as a drop-in contract.

Every scenario of `keras/src/layers/attention/multi_head_attention_test.py`
(Keras 3.15.1) is restated here for `keras_attention.layers.MultiHeadAttention`
(except those about the private `_compute_attention` hook). Where numbers are
involved, our layer is compared with `keras.layers.MultiHeadAttention`
carrying the same weights (`set_weights`). Known, documented differences:
padded queries give zero results (Keras: uniform weights), so such rows are
left out of the comparisons.
"""

import os
import warnings

import keras
import numpy as np
import pytest
from keras import ops
from keras.src.testing.test_case import get_seed_generators

from keras_attention.layers import MultiHeadAttention

RNG = np.random.default_rng(7)


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def normal(*shape):
    return RNG.normal(size=shape).astype("float32")


def pair(**kwargs):
    """Keras's layer and ours, same arguments (ours not built yet)."""
    return keras.layers.MultiHeadAttention(**kwargs), MultiHeadAttention(
        **kwargs
    )


def _weight_names(layer):
    return [w.path.split("/", 1)[1] for w in layer.weights]


def copy_weights(theirs, ours, *args, **kwargs):
    """Builds both by a call and gives ours Keras's weights (same layout)."""
    if not theirs.built:
        theirs(*args, **kwargs)
    ours(*args, **kwargs)
    assert [w.shape for w in ours.weights] == [w.shape for w in theirs.weights]
    assert _weight_names(ours) == _weight_names(theirs)
    ours.set_weights(theirs.get_weights())


def assert_same(a, b, atol=1e-5):
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert tuple(x.shape) == tuple(y.shape)
        np.testing.assert_allclose(np_(x), np_(y), atol=atol)


@pytest.fixture
def no_flash():
    keras.config.disable_flash_attention()
    yield
    keras.config.enable_flash_attention()


# test_basics ------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, n_weights, n_seeds",
    [
        (dict(num_heads=2, key_dim=2), 8, 0),
        (
            dict(
                num_heads=2, key_dim=2, value_dim=4, use_bias=False, dropout=0.5
            ),
            4,
            1,
        ),
        (dict(num_heads=2, key_dim=2, use_gate=True), 10, 0),
        (
            dict(
                num_heads=2,
                key_dim=2,
                value_dim=4,
                use_bias=False,
                dropout=0.5,
                use_gate=True,
            ),
            5,
            1,
        ),
    ],
)
def test_basics(kwargs, n_weights, n_seeds):
    q, v = normal(2, 8, 16), normal(2, 4, 16)
    theirs, ours = pair(**kwargs)
    expected = theirs(q, v)
    copy_weights(theirs, ours, q, v)
    assert ours.supports_masking
    assert len(ours.trainable_weights) == n_weights
    assert len(ours.non_trainable_weights) == 0
    assert len(get_seed_generators(ours)) == n_seeds
    assert len(ours.losses) == 0
    assert_same(expected, ours(q, v))
    symbolic = ours(keras.Input((8, 16)), keras.Input((4, 16)))
    assert tuple(symbolic.shape) == (None, 8, 16)
    # Training with dropout runs and changes the result.
    if kwargs.get("dropout"):
        assert not np.allclose(np_(ours(q, v, training=True)), np_(expected))


# test_basics_with_flash_attention / test_correctness --------------------------


@pytest.mark.parametrize("flash", [False, True])
def test_correctness_float16_identity_weights(flash):
    # Keras's scenario: identity projections, float16, 8 heads of size 8.
    heads = dim = 8
    query = np.identity(dim)[None].astype("float32")
    key = np.identity(dim)[None].astype("float32")
    value = (np.arange(dim * dim).reshape(1, dim, dim) / 100.0).astype(
        "float32"
    )
    kernel = np.repeat(np.identity(dim)[:, None, :], heads, axis=1)
    weights = [kernel, np.zeros((heads, dim))] * 3 + [kernel, np.zeros(dim)]
    theirs = keras.layers.MultiHeadAttention(heads, dim, dtype="float16")
    theirs.build(query.shape, value.shape, key.shape)
    theirs.set_weights(weights)
    ours = MultiHeadAttention(
        heads, dim, dtype="float16", flash_attention=flash
    )
    ours.build(query.shape, value.shape, key.shape)
    ours.set_weights(weights)
    expected, expected_scores = theirs(
        query, value, key=key, return_attention_scores=True
    )
    # Independent NumPy reference: softmax(q k^T / sqrt(8)) v, every head alike.
    logits = query[0] @ key[0].T / np.sqrt(dim)
    w = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    ref = (w @ value[0]) @ np.ones((dim, dim)) * heads / dim
    np.testing.assert_allclose(np_(expected)[0], ref, atol=1e-2)
    if flash:
        out = ours(query, value, key=key)
        assert_same(expected, out, atol=1e-2)
        with pytest.raises(ValueError, match="Returning attention scores"):
            ours(query, value, key=key, return_attention_scores=True)
    else:
        out, scores = ours(query, value, key=key, return_attention_scores=True)
        assert_same((expected, expected_scores), (out, scores), atol=1e-2)
        np.testing.assert_allclose(np_(scores)[0, 0], w, atol=1e-3)


def test_flash_attention_errors_like_keras():
    with pytest.raises(ValueError, match="Dropout is not supported when flash"):
        MultiHeadAttention(
            num_heads=2, key_dim=2, flash_attention=True, dropout=0.1
        )
    layer = MultiHeadAttention(num_heads=2, key_dim=2, flash_attention=True)
    assert layer._flash_attention
    q, v = normal(2, 4, 8), normal(2, 4, 8)
    with pytest.raises(ValueError, match="Returning attention scores is not"):
        layer(q, v, return_attention_scores=True)
    with pytest.raises(ValueError, match="Returning attention scores is not"):
        layer(
            keras.Input((4, 8)),
            keras.Input((4, 8)),
            return_attention_scores=True,
        )


def test_global_flash_switch_is_read_when_flash_attention_is_none(no_flash):
    layer = MultiHeadAttention(2, 4)
    assert layer._flash_attention is False
    q = normal(2, 5, 8)
    theirs = keras.layers.MultiHeadAttention(2, 4)
    copy_weights(theirs, layer, q, q)
    assert_same(
        theirs(q, q, use_causal_mask=True), layer(q, q, use_causal_mask=True)
    )


# test_high_dim_attention / test_attention_axes_negative_indexing -------------

HIGH_DIM = [
    # (query dims, value dims, attention_axes)
    ((3, 4), (3, 2), (2,)),
    ((3, 4), (3, 2), (1, 2)),
    ((5, 3, 4), (5, 3, 2), (2, 3)),
    ((3, 4), (5, 2), None),
    ((3, 4), (3, 2), -2),
]


@pytest.mark.parametrize("use_gate", [False, True])
@pytest.mark.parametrize("q_dims, v_dims, axes", HIGH_DIM)
def test_high_dim_attention(q_dims, v_dims, axes, use_gate):
    q, v = normal(3, *q_dims, 8), normal(3, *v_dims, 8)
    theirs, ours = pair(
        num_heads=2, key_dim=2, attention_axes=axes, use_gate=use_gate
    )
    expected = theirs(q, v)
    copy_weights(theirs, ours, q, v)
    assert len(ours.trainable_weights) == (10 if use_gate else 8)
    out = ours(q, v)
    assert tuple(out.shape) == q.shape
    assert_same(expected, out)
    # Scores in Keras's layout (only a final reshape may exceed rank 5).
    expected, expected_scores = theirs(q, v, return_attention_scores=True)
    assert_same(
        (expected, expected_scores), ours(q, v, return_attention_scores=True)
    )
    symbolic = ours(
        keras.Input(q.shape[1:]),
        keras.Input(v.shape[1:]),
        return_attention_scores=True,
    )
    assert tuple(symbolic[1].shape)[1:] == tuple(expected_scores.shape)[1:]


@pytest.mark.parametrize("mask_lead", [(), (3,), (3, 3), (3, 3, 2), (1,)])
def test_high_dim_attention_masks_as_keras(mask_lead):
    # Query (3, 3, 4, 8) attending over axis 2: scores (3, 3, heads, 4, 2);
    # Keras broadcasts a mask's leading axes against (batch, 3, heads).
    q, v = normal(3, 3, 4, 8), normal(3, 3, 2, 8)
    mask = RNG.random(mask_lead + (4, 2)) > 0.3
    mask[..., 0] = True  # No empty row (Keras would give uniform weights).
    theirs, ours = pair(num_heads=2, key_dim=2, attention_axes=(2,))
    expected = theirs(q, v, attention_mask=mask, return_attention_scores=True)
    copy_weights(theirs, ours, q, v)
    assert_same(
        expected, ours(q, v, attention_mask=mask, return_attention_scores=True)
    )


def test_attention_axes_negative_indexing():
    x = normal(2, 3, 8, 4)
    for use_gate in (False, True):
        pos = MultiHeadAttention(
            num_heads=2, key_dim=4, attention_axes=2, use_gate=use_gate
        )
        neg = MultiHeadAttention(
            num_heads=2, key_dim=4, attention_axes=-2, use_gate=use_gate
        )
        pos(x, x)
        neg(x, x)
        neg.set_weights(pos.get_weights())
        assert_same(
            pos(x, x, return_attention_scores=True),
            neg(x, x, return_attention_scores=True),
        )


def test_attention_axes_validation():
    with pytest.raises(ValueError, match="attention_axes"):
        MultiHeadAttention(2, 2, attention_axes=1.5)
    with pytest.raises(ValueError, match="attention_axes"):
        MultiHeadAttention(2, 2, attention_axes=3)(
            normal(2, 3, 4, 8), normal(2, 3, 4, 8)
        )


# test_compute_output_shape / test_shape_mismatch_error ------------------------


@pytest.mark.parametrize(
    "query_dims, value_dims, key_dims, output_shape",
    [
        ((4, 8), (2, 8), None, None),
        ((4, 8), (2, 8), (2, 3), None),
        ((4, 8), (2, 8), None, (3, 4)),
        ((4, 8), (2, 8), (2, 3), (1, 5)),
        ((4, 2, 3, 8), (1, 1, 5, 8), (1, 1, 5, 2), None),
        ((4, 2, 3, 8), (1, 1, 5, 8), (1, 1, 5, 2), (3, 2)),
        ((4, 2, 3, 8), (4, 2, 3, 7), (4, 2, 3, 8), None),
    ],
)
def test_compute_output_shape(query_dims, value_dims, key_dims, output_shape):
    kwargs = dict(
        num_heads=2, key_dim=2, value_dim=2, output_shape=output_shape
    )
    theirs, ours = pair(**kwargs)
    q, v = np.ones((7,) + query_dims), np.ones((7,) + value_dims)
    k = np.ones((7,) + key_dims) if key_dims else None
    out = ours(query=q, value=v, key=k)
    k_shape = k.shape if key_dims else None
    assert ours.compute_output_shape(q.shape, v.shape, k_shape) == tuple(
        out.shape
    )
    assert ours.compute_output_shape(
        list(q.shape), list(v.shape), list(k_shape) if key_dims else None
    ) == tuple(out.shape)
    assert tuple(out.shape) == theirs.compute_output_shape(
        q.shape, v.shape, k_shape
    )
    expected = theirs(query=q, value=v, key=k)
    copy_weights(theirs, ours, q, v, key=k)
    assert_same(expected, ours(query=q, value=v, key=k))


@pytest.mark.parametrize(
    "query_shape, value_shape, key_shape",
    [
        ((2, 4, 8), (2, 2, 7), (2,)),
        ((2, 4, 8), (2, 2, 8), (2, 1, 7)),
        ((2, 4, 2, 3, 8), (2, 1, 1, 5, 8), (2, 1, 15, 5, 2)),
    ],
)
def test_shape_mismatch_error(query_shape, value_shape, key_shape):
    layer = MultiHeadAttention(num_heads=4, key_dim=2, value_dim=2)
    with pytest.raises(ValueError, match="must be equal"):
        layer.compute_output_shape(query_shape, value_shape, key_shape)
    with pytest.raises(ValueError, match="must be equal"):
        layer(np.ones(query_shape), np.ones(value_shape), np.ones(key_shape))


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_invalid_scalar_args_rejected(bad):
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(num_heads=bad, key_dim=4)
    with pytest.raises(ValueError, match="key_dim"):
        MultiHeadAttention(num_heads=4, key_dim=bad)
    with pytest.raises(ValueError, match="value_dim"):
        MultiHeadAttention(num_heads=4, key_dim=4, value_dim=bad)
    assert (
        MultiHeadAttention(num_heads=4, key_dim=4, value_dim=None).value_dim
        == 4
    )


# test_initializer / test_mha_constraints --------------------------------------


def test_initializer_gives_each_sublayer_its_own_values():
    layer = MultiHeadAttention(
        num_heads=12,
        key_dim=64,
        use_gate=True,
        kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
    )
    layer.build((2, 4, 8), (2, 4, 8))
    q = np_(layer._query_dense.kernel)
    for other in (layer._key_dense, layer._value_dense, layer._gate_dense):
        assert not np.allclose(q, np_(other.kernel))
    assert not np.allclose(
        q[..., :8].ravel()[:64], np_(layer._output_dense.kernel).ravel()[:64]
    )


@pytest.mark.parametrize("which", ["kernel", "bias"])
def test_constraints_reach_every_sublayer(which):
    layer = MultiHeadAttention(
        num_heads=2,
        key_dim=2,
        use_gate=True,
        **{f"{which}_constraint": "non_neg"},
    )
    layer.build((1, 2, 2), (1, 2, 2), (1, 2, 2))
    for sub in (
        layer._query_dense,
        layer._key_dense,
        layer._value_dense,
        layer._gate_dense,
        layer._output_dense,
    ):
        assert isinstance(
            getattr(sub, which).constraint, keras.constraints.NonNeg
        )


# Masks: propagation, Keras masks, shapes, causal -----------------------------


def _masked_inputs():
    query = np.array([[1, 2, 3, 0, 0], [3, 3, 1, 1, 2], [1, 0, 0, 0, 0]])
    value = np.array([[5, 4, 0], [3, 0, 0], [2, 1, 1]])
    q = keras.layers.Embedding(4, 8, mask_zero=True)(query)
    v = keras.layers.Embedding(6, 8, mask_zero=True)(value)
    return q, v, query != 0, value != 0


def test_query_mask_propagation():
    layer = MultiHeadAttention(num_heads=2, key_dim=2)
    q, _, q_valid, _ = _masked_inputs()
    out = layer(query=q, value=normal(3, 3, 8))
    np.testing.assert_array_equal(np_(out._keras_mask), q_valid)


@pytest.mark.parametrize("use_causal_mask", [True, False])
def test_keras_masks_equal_explicit_mask_and_keras(use_causal_mask):
    theirs, ours = pair(num_heads=2, key_dim=2)
    q, v, q_valid, v_valid = _masked_inputs()
    copy_weights(theirs, ours, np_(q), np_(v))
    out = ours(query=q, value=v, use_causal_mask=use_causal_mask)
    # Keras's layer deletes the inputs' Keras masks: call it last.
    assert q._keras_mask is not None and v._keras_mask is not None
    expected = theirs(query=q, value=v, use_causal_mask=use_causal_mask)
    mask = q_valid[:, :, None] & v_valid[:, None, :]
    if use_causal_mask:
        mask = mask & np.tril(np.ones((5, 3), bool))[None]
    manual = ours(query=np_(q), value=np_(v), attention_mask=mask)
    # Rows with at least one key: ours equals Keras and the manual mask.
    rows = mask.any(-1)
    np.testing.assert_allclose(np_(out)[rows], np_(expected)[rows], atol=1e-5)
    np.testing.assert_allclose(np_(out), np_(manual), atol=1e-6)
    # Rows with nothing to attend to: zero result (then the output bias).
    bias = np_(ours._output_dense.bias)
    np.testing.assert_allclose(
        np_(out)[~rows],
        np.broadcast_to(bias, (int((~rows).sum()), 8)),
        atol=1e-6,
    )


def test_masking_with_different_shapes():
    x = normal(2, 5, 8)
    base = np.tril(np.ones((5, 5), "float32"))
    theirs, ours = pair(num_heads=2, key_dim=4)
    copy_weights(theirs, ours, x, x)
    for mask in (
        base,
        np.tile(base[None], (2, 1, 1)),
        np.tile(base[None, None], (2, 2, 1, 1)),
    ):
        assert_same(
            theirs(query=x, value=x, attention_mask=mask),
            ours(query=x, value=x, attention_mask=mask),
        )


def test_key_mask_and_value_mask_are_read():
    q, v, k = normal(2, 4, 8), normal(2, 5, 8), normal(2, 5, 6)
    key_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    theirs, ours = pair(num_heads=2, key_dim=4)
    expected = theirs(q, v, key=k, key_mask=key_mask, value_mask=key_mask[::-1])
    copy_weights(theirs, ours, q, v, key=k)
    assert_same(
        expected,
        ours(q, v, key=k, key_mask=key_mask, value_mask=key_mask[::-1]),
    )


def test_no_warning_with_keras_mask():
    layer = MultiHeadAttention(num_heads=2, key_dim=2)
    q, v, _, _ = _masked_inputs()
    with warnings.catch_warnings(record=True) as logs:
        warnings.simplefilter("always")
        layer(query=q, value=v)
    assert not logs


def test_causal_mask_equals_explicit_and_keras():
    x = normal(2, 5, 8)
    theirs, ours = pair(num_heads=2, key_dim=4)
    copy_weights(theirs, ours, x, x)
    causal = np.tril(np.ones((1, 5, 5), bool))
    fast = ours(x, x, use_causal_mask=True)
    assert_same(fast, ours(x, x, attention_mask=causal))
    assert_same(fast, theirs(x, x, use_causal_mask=True))


def test_causal_combined_with_other_mask():
    x = normal(2, 5, 8)
    theirs, ours = pair(num_heads=2, key_dim=4)
    copy_weights(theirs, ours, x, x)
    extra = np.ones((2, 5, 5), bool)
    extra[:, 2, 3] = False
    extra[:, 4, 1] = False
    merged = extra & np.tril(np.ones((5, 5), bool))
    out = ours(x, x, attention_mask=extra, use_causal_mask=True)
    assert tuple(out.shape) == (2, 5, 8)
    assert_same(out, ours(x, x, attention_mask=merged))
    assert_same(out, theirs(x, x, attention_mask=extra, use_causal_mask=True))


@pytest.mark.parametrize(
    "dropout, scores", [(0.0, True), (0.1, False), (0.1, True)]
)
def test_causal_mask_when_fused_path_disabled(dropout, scores):
    t = 6
    future = np.triu(np.ones((t, t)), k=1).astype(bool)
    x = normal(1, t, 8)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dropout=dropout)
    if scores:
        _, w = layer(
            x,
            x,
            use_causal_mask=True,
            return_attention_scores=True,
            training=False,
        )
        assert np_(w)[..., future].sum() < 1e-6
        _, w = layer(
            x,
            x,
            use_causal_mask=True,
            return_attention_scores=True,
            training=True,
        )
        assert np_(w)[..., future].sum() < 1e-6
    else:
        assert_same(
            layer(x, x, use_causal_mask=True, training=False),
            layer(x, x, attention_mask=~future[None], training=False),
        )


def test_causal_mask_with_attention_axes():
    t = 5
    future = np.triu(np.ones((t, t)), k=1).astype(bool)
    x = normal(1, t, 3, 8)
    theirs, ours = pair(num_heads=2, key_dim=4, attention_axes=1)
    copy_weights(theirs, ours, x, x)
    out, scores = ours(x, x, use_causal_mask=True, return_attention_scores=True)
    assert np_(scores)[..., future].sum() < 1e-6
    assert_same(
        (out, scores),
        theirs(x, x, use_causal_mask=True, return_attention_scores=True),
    )


# sliding_window ---------------------------------------------------------------


def test_sliding_window_pattern():
    x = normal(1, 6, 8)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=3)
    _, w = layer(x, x, use_causal_mask=True, return_attention_scores=True)
    i, j = np.indices((6, 6))
    inside = (j <= i) & (i - j < 3)
    assert np.all(np_(w)[0, 0][inside] > 0) and np.all(
        np_(w)[0, 0][~inside] == 0
    )
    _, w = layer(x, x, return_attention_scores=True)
    inside = np.abs(i - j) < 3
    assert np.all(np_(w)[0, 0][inside] > 0) and np.all(
        np_(w)[0, 0][~inside] == 0
    )


@pytest.mark.parametrize("window", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("flash", [None, False, True])
def test_sliding_window_matches_keras(window, causal, flash):
    x = normal(2, 7, 8)
    mask = np.ones((2, 7), bool)
    mask[0, -2:] = False
    theirs = keras.layers.MultiHeadAttention(2, 4, sliding_window=window)
    ours = MultiHeadAttention(
        2, 4, sliding_window=window, flash_attention=flash
    )
    copy_weights(theirs, ours, x, x)
    expected = theirs(x, x, value_mask=mask, use_causal_mask=causal)
    out = ours(x, x, value_mask=mask, use_causal_mask=causal)  # banded path
    # Queries whose whole window is padding: zero here, uniform in Keras.
    i, j = np.indices((7, 7))
    allowed = (np.abs(i - j) < window) & ((j <= i) | (not causal))
    rows = (allowed[None] & mask[:, None, :]).any(-1)
    np.testing.assert_allclose(np_(out)[rows], np_(expected)[rows], atol=1e-5)
    assert np.all(np_(out)[~rows] == 0)
    cross = normal(2, 9, 8)
    assert_same(
        theirs(x, cross, use_causal_mask=causal),
        ours(x, cross, use_causal_mask=causal),
    )  # window as a mask


def test_sliding_window_validation_and_serialization():
    for bad in (0, -3):
        with pytest.raises(ValueError, match="sliding_window"):
            MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=bad)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=5)
    config = layer.get_config()
    assert config["sliding_window"] == 5
    assert MultiHeadAttention.from_config(config)._sliding_window == 5


# LoRA, dtype policy map, quantization ----------------------------------------


def test_lora(tmp_path):
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    key = np.array([[[0.0, 1.0], [1.0, 0.0]]])
    value = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    kwargs = dict(num_heads=3, key_dim=8, use_bias=False, use_gate=True)
    layer = MultiHeadAttention(**kwargs)
    layer.build(query.shape, key.shape, value.shape)
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense):
        dense.enable_lora(2)
    assert len(layer.trainable_variables) == 8
    assert len(layer.non_trainable_variables) == 3
    x = {"query": query, "key": key, "value": value}
    layer(**x)

    def model_of(mha):
        inputs = {n: keras.Input((2, 2)) for n in ("query", "key", "value")}
        outputs = mha(inputs["query"], inputs["key"], inputs["value"])
        return keras.Model(inputs, outputs)

    model = model_of(layer)
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, np.random.default_rng(0).random((1, 2, 2)), verbose=0)
    path = os.path.join(tmp_path, "lora_model.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    np.testing.assert_allclose(
        model.predict(x, verbose=0), reloaded.predict(x, verbose=0), atol=1e-6
    )
    path = os.path.join(tmp_path, "lora_model.weights.h5")
    model.save_weights(path)
    plain = model_of(MultiHeadAttention(**kwargs))
    plain.load_weights(path)
    np.testing.assert_allclose(
        model.predict(x, verbose=0), plain.predict(x, verbose=0), atol=1e-6
    )
    plain.save_weights(path)
    model.load_weights(path)
    np.testing.assert_allclose(
        model.predict(x, verbose=0), plain.predict(x, verbose=0), atol=1e-6
    )


def test_dtype_policy_map_quantizes_sublayers():
    policy = keras.dtype_policies.QuantizedDTypePolicy("int8", "float32")
    policy_map = keras.dtype_policies.DTypePolicyMap()
    for name in ("query", "key", "value"):
        policy_map[f"mha/{name}"] = policy
    layer = MultiHeadAttention(
        num_heads=3, key_dim=8, use_bias=False, dtype=policy_map, name="mha"
    )
    layer.build((1, 2, 2), (1, 2, 2), (1, 2, 2))
    for dense in (layer._query_dense, layer._key_dense, layer._value_dense):
        assert keras.backend.standardize_dtype(dense._kernel.dtype) == "int8"


@pytest.mark.parametrize("use_gate", [False, True])
def test_quantize_int8(use_gate):
    query = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    key = np.array([[[0.0, 1.0], [1.0, 0.0]]])
    value = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    layer = MultiHeadAttention(
        num_heads=3, key_dim=8, use_bias=False, use_gate=use_gate
    )
    layer.build(query.shape, value.shape, key.shape)
    before = np_(layer(query, key, value))
    for sub in layer._flatten_layers():
        if isinstance(sub, keras.layers.EinsumDense):
            sub.quantize("int8")
    subs = [
        layer._query_dense,
        layer._key_dense,
        layer._value_dense,
        layer._output_dense,
    ] + ([layer._gate_dense] if use_gate else [])
    for sub in subs:
        assert keras.backend.standardize_dtype(sub._kernel.dtype) == "int8"
    after = np_(layer(query, key, value))
    assert np.mean((before - after) ** 2) < 1e-2


# Symbolic scores, output_shape ---------------------------------------------


@pytest.mark.parametrize("shape", [(1, 2, 3), (2, 3, 5)])
def test_symbolic_return_attention_scores(shape):
    layer = MultiHeadAttention(num_heads=4, key_dim=2)
    symbolic = layer(
        keras.Input(batch_shape=shape),
        keras.Input(batch_shape=shape),
        return_attention_scores=True,
    )
    assert len(symbolic) == 2
    eager = layer(normal(*shape), normal(*shape), return_attention_scores=True)
    assert len(eager) == 2
    assert tuple(symbolic[0].shape) == tuple(eager[0].shape)
    assert tuple(symbolic[1].shape) == tuple(eager[1].shape)


def test_output_shape_as_int_and_tuple():
    q, v = normal(2, 4, 16), normal(2, 4, 16)
    for output_shape, expected in ((8, (2, 4, 8)), ((8, 8), (2, 4, 8, 8))):
        theirs, ours = pair(num_heads=2, key_dim=16, output_shape=output_shape)
        out = theirs(query=q, value=v)
        copy_weights(theirs, ours, q, v)
        assert tuple(ours(query=q, value=v).shape) == expected
        assert_same(out, ours(query=q, value=v))
    with pytest.raises(ValueError, match="Invalid `output_shape`"):
        MultiHeadAttention(num_heads=2, key_dim=16, output_shape=8.0)


# Config and serialization: Keras's configs and models load ------------------


def test_positional_arguments_mean_what_they_mean_in_keras():
    args = (8, 64, None, 0.1, False, (3, 2), (1,), 4)
    theirs = keras.layers.MultiHeadAttention(*args)
    ours = MultiHeadAttention(*args)
    for name in (
        "dropout",
        "use_bias",
        "output_shape",
        "attention_axes",
        "sliding_window",
    ):
        assert ours.get_config()[name] == theirs.get_config()[name], name


def test_keras_config_loads_with_from_config():
    theirs = keras.layers.MultiHeadAttention(
        4,
        2,
        value_dim=3,
        dropout=0.1,
        use_bias=False,
        output_shape=(5, 2),
        attention_axes=(1,),
        sliding_window=3,
        use_gate=True,
        seed=3,
        kernel_initializer="he_normal",
        name="mha",
    )
    config = keras.saving.serialize_keras_object(theirs)["config"]
    ours = MultiHeadAttention.from_config(config)
    mine = ours.get_config()
    for name, value in theirs.get_config().items():
        assert mine[name] == value, name
    x = normal(2, 3, 4, 8)
    theirs.build(x.shape, x.shape)
    ours.build(x.shape, x.shape)
    ours.set_weights(theirs.get_weights())
    assert_same(theirs(x, x), ours(x, x))
    again = MultiHeadAttention.from_config(ours.get_config())
    assert again.get_config() == mine


def _swap_keras_mha(layer):
    if type(layer) is keras.layers.MultiHeadAttention:
        return MultiHeadAttention.from_config(layer.get_config())
    return layer.__class__.from_config(layer.get_config())


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(use_gate=True, sliding_window=2, output_shape=(3, 2))],
)
def test_keras_model_with_keras_mha_swaps_to_our_class(tmp_path, kwargs):
    # Keras 3.15 resolves its built-in classes before `custom_objects`
    # (their `registered_name` is None), so a saved model's Keras layer is
    # swapped by cloning: our class reads Keras's config and weights.
    inputs = keras.Input((6, 8))
    outputs = keras.layers.MultiHeadAttention(2, 4, **kwargs)(
        inputs, inputs, use_causal_mask=True
    )
    model = keras.Model(inputs, outputs)
    path = os.path.join(tmp_path, "keras_mha.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    swapped = keras.models.clone_model(loaded, clone_function=_swap_keras_mha)
    swapped.set_weights(loaded.get_weights())
    assert isinstance(swapped.layers[-1], MultiHeadAttention)
    x = normal(3, 6, 8)
    np.testing.assert_allclose(np_(model(x)), np_(swapped(x)), atol=1e-5)
    ours_path = os.path.join(tmp_path, "ours.keras")
    swapped.save(ours_path)
    again = keras.saving.load_model(ours_path)
    assert isinstance(again.layers[-1], MultiHeadAttention)
    np.testing.assert_allclose(np_(again(x)), np_(swapped(x)), atol=1e-6)


def test_activity_regularizer_losses_match_keras():
    x = normal(2, 5, 8)
    theirs, ours = pair(num_heads=2, key_dim=4, activity_regularizer="l2")
    theirs(x, x)
    copy_weights(theirs, ours, x, x)
    ours(x, x)
    theirs(x, x)
    np.testing.assert_allclose(
        sum(np_(loss) for loss in ours.losses),
        sum(np_(loss) for loss in theirs.losses),
        rtol=1e-5,
    )
