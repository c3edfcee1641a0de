import keras
import numpy as np
import pytest
import references
from harness import run_layer_test
from harness import run_mask_test
from keras import ops

from keras_attention.layers import LuongAttention

RNG = np.random.default_rng(4)
Q = RNG.normal(size=(2, 5, 6)).astype("float32")
V = RNG.normal(size=(2, 9, 6)).astype("float32")
VALUE_MASK = np.array([[1] * 6 + [0] * 3, [1] * 9], bool)
QUERY_MASK = np.array([[1, 1, 1, 1, 0], [1] * 5], bool)


def np_(x):
    return ops.convert_to_numpy(x)


def test_harness_general_global():
    run_layer_test(
        LuongAttention,
        dict(score_mode="general", scale=True),
        dict(query=Q, value=V),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 5, 6), (2, 5, 9)),
        expected_num_trainable_weights=1,
    )


def test_harness_concat_local_p():
    run_layer_test(
        LuongAttention,
        dict(
            score_mode="concat",
            units=4,
            scale="learned",
            alignment="local-p",
            window=2,
            dropout=0.1,
        ),
        dict(query=Q, value=V),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 5, 6), (2, 5, 9)),
        expected_num_trainable_weights=5,
    )


def test_harness_dot_local_m_single_step():
    run_layer_test(
        LuongAttention,
        dict(score_mode="dot", alignment="local-m", window=1),
        dict(query=Q[:, 0], value=V),
        call_kwargs=dict(positions=3),
        expected_output_shape=(2, 6),
        expected_num_trainable_weights=0,
        run_fit=False,  # no weights to train
    )


@pytest.mark.parametrize("alignment", ["global", "local-p"])
def test_masks(alignment):
    window = None if alignment == "global" else 2
    run_mask_test(
        LuongAttention,
        dict(alignment=alignment, window=window),
        ("query", "value"),
        ("query_mask", "value_mask"),
    )


@pytest.mark.parametrize(
    "score_mode,scale",
    [
        ("dot", False),
        ("dot", True),
        ("general", "learned"),
        ("concat", True),
    ],
)
@pytest.mark.parametrize("alignment", ["global", "local-m", "local-p"])
def test_reference(score_mode, scale, alignment):
    units = 4 if score_mode == "concat" else None
    window = None if alignment == "global" else 2
    layer = LuongAttention(
        score_mode, units=units, scale=scale, alignment=alignment, window=window
    )
    context, weights = layer(
        Q,
        V,
        query_mask=QUERY_MASK,
        value_mask=VALUE_MASK,
        return_attention_scores=True,
    )
    ref_c, ref_w = references.luong(layer, Q, V, VALUE_MASK, QUERY_MASK)
    np.testing.assert_allclose(np_(weights), ref_w, atol=1e-6)
    np.testing.assert_allclose(np_(context), ref_c, atol=1e-5)
    sums = np_(weights).sum(-1)
    if alignment == "local-p":
        assert np.all(sums <= 1 + 1e-6)
    else:
        np.testing.assert_allclose(
            sums, QUERY_MASK.astype("float32"), atol=1e-6
        )


def test_local_m_window_and_positions():
    layer = LuongAttention("dot", alignment="local-m", window=1)
    _, weights = layer(Q, V, return_attention_scores=True)
    w = np_(weights)
    for t in range(Q.shape[1]):
        inside = np.abs(np.arange(9) - t) <= 1
        assert np.all(w[:, t, ~inside] == 0) and np.all(w[:, t, inside] > 0)
    # One step at position t equals row t of the sequence call.
    for t in range(Q.shape[1]):
        c, wt = layer(Q[:, t], V, positions=t, return_attention_scores=True)
        np.testing.assert_allclose(np_(wt), w[:, t], atol=1e-6)
    # Per-example positions, and a window past the end of the source.
    positions = np.array([2, 20], "int32")
    c, wt = layer(Q[:, 0], V, positions=positions, return_attention_scores=True)
    ref_c, ref_w = references.luong(
        layer,
        Q[:, :1],
        V,
        np.ones((2, 9), bool),
        np.ones((2, 1), bool),
        positions[:, None],
    )
    np.testing.assert_allclose(np_(wt), ref_w[:, 0], atol=1e-6)
    assert np.all(np_(c)[1] == 0)  # nothing to attend to: zero context


def test_local_p_gaussian_and_fully_padded_source():
    layer = LuongAttention("general", alignment="local-p", window=3)
    mask = VALUE_MASK.copy()
    mask[0] = False
    context, weights = layer(
        Q, V, value_mask=mask, return_attention_scores=True
    )
    c, w = np_(context), np_(weights)
    assert np.all(np.isfinite(c)) and np.all(c[0] == 0) and np.all(w[0] == 0)
    ref_c, ref_w = references.luong(layer, Q, V, mask, np.ones((2, 5), bool))
    np.testing.assert_allclose(w, ref_w, atol=1e-6)


def test_errors():
    with pytest.raises(ValueError, match="score_mode='cosine'"):
        LuongAttention("cosine")
    with pytest.raises(ValueError, match="units=None"):
        LuongAttention("concat")
    with pytest.raises(ValueError, match="units=3"):
        LuongAttention("general", units=3)
    with pytest.raises(ValueError, match="scale=2"):
        LuongAttention(scale=2.0)
    with pytest.raises(ValueError, match="alignment='local'"):
        LuongAttention(alignment="local")
    with pytest.raises(ValueError, match="window=None"):
        LuongAttention(alignment="local-m")
    with pytest.raises(ValueError, match="window=-1"):
        LuongAttention(alignment="local-p", window=-1)
    with pytest.raises(ValueError, match="window=2"):
        LuongAttention(alignment="global", window=2)
    with pytest.raises(ValueError, match="key_shape"):
        LuongAttention("dot")(Q, np.ones((2, 9, 5), "float32"))
    with pytest.raises(ValueError, match="query_shape"):
        LuongAttention()(np.ones((2,), "float32"), V)


def make_layer(score_mode, alignment, **kwargs):
    units = 4 if score_mode == "concat" else None
    window = None if alignment == "global" else 2
    return LuongAttention(
        score_mode, units=units, alignment=alignment, window=window, **kwargs
    )


@pytest.mark.parametrize("alignment", ["global", "local-m", "local-p"])
def test_integer_memory_is_computed_in_float(alignment):
    # Defect 8: int memory cast the weights to int32 and returned zeros.
    memory = (np.arange(2 * 9 * 6).reshape(2, 9, 6) % 5).astype("int32")
    layer = make_layer("general", alignment)
    context, weights = layer(Q, memory, return_attention_scores=True)
    assert keras.backend.standardize_dtype(context.dtype) == "float32"
    ref_c, ref_w = references.luong(
        layer,
        Q,
        memory.astype("float32"),
        np.ones((2, 9), bool),
        np.ones((2, 5), bool),
    )
    np.testing.assert_allclose(np_(weights), ref_w, atol=1e-5)
    np.testing.assert_allclose(np_(context), ref_c, atol=1e-4)


@pytest.mark.parametrize("score_mode", ["dot", "concat"])
@pytest.mark.parametrize("alignment", ["global", "local-m", "local-p"])
def test_empty_memory_gives_zeros(score_mode, alignment):
    # Defect 8: local alignments gathered index 0 of an empty memory.
    layer = make_layer(score_mode, alignment)
    empty = np.zeros((2, 0, 6), "float32")
    for query in (Q, Q[:, 0]):
        context, weights = layer(query, empty, return_attention_scores=True)
        c, w = np_(context), np_(weights)
        assert c.shape == query.shape and w.shape == query.shape[:-1] + (0,)
        assert np.all(c == 0)


@pytest.mark.tf_only
@pytest.mark.parametrize("alignment", ["local-m", "local-p"])
def test_empty_memory_of_unknown_length_in_a_graph(alignment):
    import tensorflow as tf

    layer = make_layer("general", alignment)
    layer(Q, V)  # build
    fn = tf.function(
        lambda q, v: layer(q, v, return_attention_scores=True),
        input_signature=[
            tf.TensorSpec((None, None, 6)),
            tf.TensorSpec((None, None, 6)),
        ],
    )
    c, w = fn(Q, np.zeros((2, 0, 6), "float32"))
    assert np.all(np_(c) == 0) and np_(w).shape == (2, 5, 0)
    c, w = fn(Q, V)  # the padded path gives the same numbers as the static one
    ref_c, ref_w = layer(Q, V, return_attention_scores=True)
    np.testing.assert_allclose(np_(c), np_(ref_c), atol=1e-6)
    np.testing.assert_allclose(np_(w), np_(ref_w), atol=1e-6)


@pytest.mark.parametrize(
    "policy,factor", [("mixed_float16", 1e3), ("mixed_bfloat16", 1e4)]
)
@pytest.mark.parametrize(
    "score_mode,scale",
    [
        ("dot", False),
        ("dot", True),
        ("general", "learned"),
        ("concat", False),
    ],
)
@pytest.mark.parametrize("alignment", ["global", "local-m"])
def test_mixed_precision_large_inputs(
    policy, factor, score_mode, scale, alignment
):
    # Defect 8: `dot` scores of float16 states overflowed (NaN at x100).
    layer = make_layer(score_mode, alignment, scale=scale, dtype=policy)
    c, w = layer(Q * factor, V * factor, return_attention_scores=True)
    # float32 reference on the same (rounded) inputs, with the same weights.
    compute = "float16" if policy == "mixed_float16" else "bfloat16"
    q, v = (
        np_(ops.cast(ops.cast(x * factor, compute), "float32")) for x in (Q, V)
    )
    reference = make_layer(score_mode, alignment, scale=scale)
    reference(q, v)
    reference.set_weights(layer.get_weights())
    ref_c, ref_w = reference(q, v, return_attention_scores=True)
    c, w = np_(ops.cast(c, "float32")), np_(ops.cast(w, "float32"))
    assert np.all(np.isfinite(c)) and np.all(np.isfinite(w))
    np.testing.assert_allclose(w, np_(ref_w), atol=0.05)
    np.testing.assert_allclose(c / factor, np_(ref_c) / factor, atol=0.05)


def test_wrongly_sized_masks_name_the_argument():
    # Defect 8: these ended in an opaque SelectV2 broadcasting error.
    for alignment in ("global", "local-m"):
        layer = make_layer("dot", alignment)
        with pytest.raises(
            ValueError, match=r"value_mask.*\(2, 9, 6\).*\(2, 8\)"
        ):
            layer(Q, V, value_mask=np.ones((2, 8), bool))
        with pytest.raises(
            ValueError, match=r"query_mask.*\(2, 5, 6\).*\(3, 5\)"
        ):
            layer(Q, V, query_mask=np.ones((3, 5), bool))


def test_error_messages_show_values_with_repr():
    with pytest.raises(ValueError, match="units='3'"):
        LuongAttention("general", units="3")
    with pytest.raises(ValueError, match="window='2'"):
        LuongAttention(alignment="local-m", window="2")
    with pytest.raises(ValueError, match="scale='True'"):
        LuongAttention(scale="True")


# Issue 23 (item 12's family): a local window wider than the source was
# not capped: window=10**9 gathered 2 * 10**9 + 1 slots per query.
@pytest.mark.parametrize("alignment", ["local-m", "local-p"])
def test_window_wider_than_the_source_is_capped(alignment):
    rng = np.random.default_rng(4)
    query = rng.normal(size=(2, 4, 6)).astype("float32")
    value = rng.normal(size=(2, 5, 6)).astype("float32")
    # A window covering the source (and a flat Gaussian, sigma = 5e8) is
    # global attention.
    wide = LuongAttention("dot", alignment=alignment, window=10**9)
    dense = LuongAttention("dot", alignment="global")
    value_mask = np.array([[1, 1, 1, 0, 0], [1] * 5], bool)
    kwargs = dict(value_mask=value_mask, return_attention_scores=True)
    got = wide(query, value, **kwargs)
    want = dense(query, value, **kwargs)
    for a, b in zip(got, want):
        np.testing.assert_allclose(
            ops.convert_to_numpy(a), ops.convert_to_numpy(b), atol=1e-6
        )
