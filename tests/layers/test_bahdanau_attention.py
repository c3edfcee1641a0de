import keras
import numpy as np
import pytest
import references
from harness import run_layer_test
from harness import run_mask_test
from keras import ops
from references import masked_softmax

from keras_attention.layers import BahdanauAttention

RNG = np.random.default_rng(3)
Q = RNG.normal(size=(2, 4, 8)).astype("float32")
V = RNG.normal(size=(2, 7, 6)).astype("float32")
VALUE_MASK = np.array([[1] * 4 + [0] * 3, [1] * 7], bool)
QUERY_MASK = np.array([[1, 1, 1, 0], [1] * 4], bool)


def np_(x):
    return ops.convert_to_numpy(x)


def test_harness_sequence_normalized():
    run_layer_test(
        BahdanauAttention,
        dict(units=5, normalize=True),
        dict(query=Q, value=V),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 4, 6), (2, 4, 7)),
        expected_num_trainable_weights=5,
    )


def test_harness_single_step():
    run_layer_test(
        BahdanauAttention,
        dict(units=5, use_bias=False, dropout=0.1),
        dict(query=Q[:, 0], value=V),
        expected_output_shape=(2, 6),
        expected_num_trainable_weights=3,
    )


def test_masks():
    run_mask_test(
        BahdanauAttention,
        dict(units=4),
        ("query", "value"),
        ("query_mask", "value_mask"),
    )


@pytest.mark.parametrize(
    "normalize,use_bias", [(False, True), (True, True), (False, False)]
)
def test_reference(normalize, use_bias):
    layer = BahdanauAttention(
        5, normalize=normalize, use_bias=use_bias, bias_initializer="normal"
    )
    context, weights = layer(
        Q,
        V,
        query_mask=QUERY_MASK,
        value_mask=VALUE_MASK,
        return_attention_scores=True,
    )
    ref_c, ref_w = references.bahdanau(layer, Q, V, VALUE_MASK, QUERY_MASK)
    np.testing.assert_allclose(np_(weights), ref_w, atol=1e-6)
    np.testing.assert_allclose(np_(context), ref_c, atol=1e-5)
    # Weights sum to 1 over unmasked keys; padded queries get zeros.
    sums = np_(weights).sum(-1)
    np.testing.assert_allclose(sums, QUERY_MASK.astype("float32"), atol=1e-6)
    assert np.all(
        np_(weights)[~np.broadcast_to(VALUE_MASK[:, None], (2, 4, 7))] == 0
    )


def test_single_step_equals_sequence_row():
    layer = BahdanauAttention(5)
    seq_c, seq_w = layer(
        Q, V, value_mask=VALUE_MASK, return_attention_scores=True
    )
    for t in range(Q.shape[1]):
        c, w = layer(
            Q[:, t], V, value_mask=VALUE_MASK, return_attention_scores=True
        )
        np.testing.assert_allclose(np_(c), np_(seq_c)[:, t], atol=1e-6)
        np.testing.assert_allclose(np_(w), np_(seq_w)[:, t], atol=1e-6)


def test_separate_key():
    layer = BahdanauAttention(5)
    key = RNG.normal(size=(2, 7, 3)).astype("float32")
    context = layer(Q, V, key=key)
    wq, wk, v = (
        np_(w)
        for w in (
            layer.query_dense.kernel,
            layer.key_dense.kernel,
            layer.attention_v,
        )
    )
    scores = np.tanh((Q @ wq)[:, :, None] + (key @ wk)[:, None]) @ v
    ref = masked_softmax(scores, np.ones(scores.shape, bool)) @ V
    np.testing.assert_allclose(np_(context), ref, atol=1e-5)


@pytest.mark.parametrize(
    "policy", ["float32", "mixed_float16", "mixed_bfloat16"]
)
def test_fully_padded_source_is_zero_not_nan(policy):
    layer = BahdanauAttention(5, dtype=policy)
    q, v = ops.convert_to_tensor(Q), ops.convert_to_tensor(V)
    mask = np.zeros((2, 7), bool)
    mask[1] = True  # example 0 has no source at all

    def loss(q, v):
        c, w = layer(q, v, value_mask=mask, return_attention_scores=True)
        return ops.sum(ops.cast(c, "float32")), c, w

    if keras.backend.backend() == "jax":
        import jax

        layer(q, v)  # build outside the trace

        def split(q, v):
            total, c, w = loss(q, v)
            return total, (c, w)

        (_, (c, w)), grads = jax.value_and_grad(
            split, argnums=(0, 1), has_aux=True
        )(q, v)
    elif keras.backend.backend() == "torch":
        import torch

        q, v = (x.detach().requires_grad_(True) for x in (q, v))
        total, c, w = loss(q, v)
        grads = torch.autograd.grad(total, [q, v])
    else:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch([q, v])
            total, c, w = loss(q, v)
        grads = tape.gradient(total, [q, v])
    c, w = np_(ops.cast(c, "float32")), np_(ops.cast(w, "float32"))
    assert np.all(c[0] == 0) and np.all(w[0] == 0)
    assert np.all(np.isfinite(c)) and np.all(np.isfinite(w))
    for g in grads:
        assert np.all(np.isfinite(np_(ops.cast(g, "float32"))))


def test_errors():
    with pytest.raises(ValueError, match="units=0"):
        BahdanauAttention(0)
    with pytest.raises(ValueError, match="normalize='yes'"):
        BahdanauAttention(4, normalize="yes")
    with pytest.raises(ValueError, match="dropout=1.5"):
        BahdanauAttention(4, dropout=1.5)
    with pytest.raises(ValueError, match="query_shape"):
        BahdanauAttention(4)(np.ones((2, 3, 4, 5), "float32"), V)
    with pytest.raises(ValueError, match="value_shape"):
        BahdanauAttention(4)(Q, np.ones((2, 6), "float32"))
    with pytest.raises(ValueError, match="same number of steps"):
        BahdanauAttention(4)(Q, V, key=np.ones((2, 5, 6), "float32"))


def variable_grads(layer, *args, **kwargs):
    """Gradients of `sum(output)` w.r.t. the layer's trainable weights."""
    if keras.backend.backend() == "jax":
        import jax
        import jax.numpy as jnp

        trainable = [v.value for v in layer.trainable_variables]
        frozen = [v.value for v in layer.non_trainable_variables]

        def total(trainable):
            out, _ = layer.stateless_call(trainable, frozen, *args, **kwargs)
            return jnp.sum(out.astype("float32"))

        return jax.grad(total)(trainable)
    if keras.backend.backend() == "torch":
        import torch

        total = ops.sum(ops.cast(layer(*args, **kwargs), "float32"))
        return torch.autograd.grad(
            total, [v.value for v in layer.trainable_variables]
        )
    import tensorflow as tf

    with tf.GradientTape() as tape:
        total = ops.sum(ops.cast(layer(*args, **kwargs), "float32"))
    return tape.gradient(total, layer.trainable_variables)


def test_integer_memory_is_computed_in_float():
    # Defect 8: int memory cast the weights to int32 and returned zeros.
    memory = np.arange(2 * 5 * 3).reshape(2, 5, 3).astype("int32") % 4
    layer = BahdanauAttention(4, bias_initializer="normal")
    context, weights = layer(Q, memory, return_attention_scores=True)
    assert keras.backend.standardize_dtype(context.dtype) == "float32"
    ref_c, ref_w = references.bahdanau(
        layer,
        Q,
        memory.astype("float32"),
        np.ones((2, 5), bool),
        np.ones((2, 4), bool),
    )
    np.testing.assert_allclose(np_(weights), ref_w, atol=1e-6)
    np.testing.assert_allclose(np_(context), ref_c, atol=1e-5)
    assert np.abs(np_(context)).sum() > 0


def test_normalize_with_zero_v_is_uniform_and_finite():
    # Defect 8: g * v / ||v|| was 0/0 = NaN for v = 0.
    layer = BahdanauAttention(
        4, normalize=True, kernel_initializer="zeros", bias_initializer="ones"
    )
    context, weights = layer(
        Q, V, value_mask=VALUE_MASK, return_attention_scores=True
    )
    ref_w = np.broadcast_to(
        VALUE_MASK[:, None] / VALUE_MASK.sum(-1)[:, None, None], (2, 4, 7)
    )
    np.testing.assert_allclose(np_(weights), ref_w, atol=1e-6)
    np.testing.assert_allclose(np_(context), ref_w @ V, atol=1e-5)
    grads = variable_grads(layer, Q, V, value_mask=VALUE_MASK)
    assert len(grads) == 5
    for g in grads:
        assert np.all(np.isfinite(np_(g)))
    # A non-zero v still gets exactly g * v / ||v||.
    layer.attention_v.assign(np.array([3.0, 0.0, 4.0, 0.0], "float32"))
    expected = np.sqrt(1 / 4) * np.array([0.6, 0.0, 0.8, 0.0], "float32")
    np.testing.assert_allclose(np_(layer.score_vector()), expected, atol=1e-7)


@pytest.mark.parametrize(
    "policy,factor", [("mixed_float16", 1e3), ("mixed_bfloat16", 1e4)]
)
def test_mixed_precision_large_inputs(policy, factor):
    # The additive score is bounded by ||v||_1: it cannot overflow. In
    # float16 it stays close to float32; in bfloat16 (8-bit mantissa) the
    # rounding of large projections that nearly cancel in `tanh` is too
    # coarse for closeness, so there only finiteness and normalization.
    layer = BahdanauAttention(5, dtype=policy)
    c, w = layer(
        Q * factor,
        V * factor,
        value_mask=VALUE_MASK,
        return_attention_scores=True,
    )
    c, w = np_(ops.cast(c, "float32")), np_(ops.cast(w, "float32"))
    assert np.all(np.isfinite(c)) and np.all(np.isfinite(w))
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=0.02)
    assert np.all(w[~np.broadcast_to(VALUE_MASK[:, None], w.shape)] == 0)
    if policy == "mixed_float16":
        # float32 reference on the same (rounded) inputs, same weights.
        q, v = (
            np_(ops.cast(ops.cast(x * factor, "float16"), "float32"))
            for x in (Q, V)
        )
        reference = BahdanauAttention(5)
        reference(q, v)
        reference.set_weights(layer.get_weights())
        ref_c, ref_w = reference(
            q, v, value_mask=VALUE_MASK, return_attention_scores=True
        )
        np.testing.assert_allclose(w, np_(ref_w), atol=0.05)
        np.testing.assert_allclose(c / factor, np_(ref_c) / factor, atol=0.05)


def test_wrongly_sized_masks_name_the_argument():
    # Defect 8: these ended in an opaque SelectV2 broadcasting error.
    layer = BahdanauAttention(4)
    with pytest.raises(ValueError, match=r"value_mask.*\(2, 7, 6\).*\(2, 6\)"):
        layer(Q, V, value_mask=np.ones((2, 6), bool))
    with pytest.raises(ValueError, match=r"query_mask.*\(2, 4, 8\).*\(2, 3\)"):
        layer(Q, V, query_mask=np.ones((2, 3), bool))
    with pytest.raises(ValueError, match=r"query_mask.*one-step.*\(2, 1\)"):
        layer(Q[:, 0], V, query_mask=np.ones((2, 1), bool))
    # A one-step query takes a (batch,) mask.
    c = layer(Q[:, 0], V, query_mask=np.array([True, False]))
    assert np.all(np_(c)[1] == 0) and np.any(np_(c)[0] != 0)


def test_string_flags_are_refused():
    # Defect 8: "False" from a CLI or YAML must not read as True.
    with pytest.raises(ValueError, match="normalize='False'"):
        BahdanauAttention(4, normalize="False")
    with pytest.raises(ValueError, match="use_bias='False'"):
        BahdanauAttention(4, use_bias="False")


def test_key_value_lengths_checked_at_call_after_symbolic_build():
    # Built on `keras.Input((None, d))`, the build could not compare them.
    layer = BahdanauAttention(4)
    q, v, k = (
        keras.Input((None, 8)),
        keras.Input((None, 6)),
        keras.Input((None, 3)),
    )
    layer(q, v, key=k)
    with pytest.raises(
        ValueError, match=r"key_shape=\(2, 5, 3\), value_shape=\(2, 7, 6\)"
    ):
        layer(Q, V, key=np.ones((2, 5, 3), "float32"))
