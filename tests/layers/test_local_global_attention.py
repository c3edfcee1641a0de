"""Global tokens on local attention (Longformer): `LocalSelfAttention(...,
global_mask=...)`, `keras_attention.ops.global_local_attention` and the
blocks' pass-through, against an independent NumPy reference (forward
and backward) of dense attention with the combined mask

    (window(i, j) or global[i] or global[j]) and causal and padding.
"""

import os

import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras import ops
from references import masked_softmax as np_masked_softmax

from keras_attention import masks
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import SelfAttention
from keras_attention.layers import TransformerEncoderBlock
from keras_attention.ops import global_local_attention

BACKEND = keras.backend.backend()


def np_(x):
    return ops.convert_to_numpy(x)


# NumPy reference ------------------------------------------------------------


def combined_mask(t, window, causal, is_global, valid):
    """Dense `(b, t, t)` mask: (window or global row or global column),
    causal, padding."""
    left, right = window if isinstance(window, tuple) else (window, window)
    right = 0 if causal else right
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    mask = ((j >= i - left) & (j <= i + right))[None]
    mask = mask | is_global[:, :, None] | is_global[:, None, :]
    if causal:
        mask = mask & (j <= i)[None]
    return mask & valid[:, :, None] & valid[:, None, :]


def _attention(q, k, v, mask):
    scale = 1.0 / np.sqrt(q.shape[-1])
    scores = np.einsum("bihd,bjhd->bhij", q, k) * scale
    p = np_masked_softmax(scores, mask[:, None])
    return np.einsum("bhij,bjhe->bihe", p, v), p


def _attention_backward(q, k, v, p, d_out):
    scale = 1.0 / np.sqrt(q.shape[-1])
    d_v = np.einsum("bhij,bihe->bjhe", p, d_out)
    d_p = np.einsum("bihe,bjhe->bhij", d_out, v)
    d_s = p * (d_p - np.sum(d_p * p, axis=-1, keepdims=True))
    d_q = np.einsum("bhij,bjhd->bihd", d_s, k) * scale
    d_k = np.einsum("bhij,bihd->bjhd", d_s, q) * scale
    return d_q, d_k, d_v


def np_layer(layer, x, mask, is_global, d_y):
    """Output, dense weights and gradients (w.r.t. `x` and each weight,
    by path) of `sum(layer(x) * d_y)`, from the formulas; global rows use
    the `*_global` projections when the layer has them."""
    w = {
        v.path.split("/", 1)[1]: np.asarray(v, "float64") for v in layer.weights
    }
    x = x.astype("float64")
    separate = layer.global_projections
    names = ("query", "key", "value")
    global_names = tuple(f"{n}_global" for n in names) if separate else names
    proj = {
        n: np.einsum("btc,chd->bthd", x, w[f"{n}/kernel"]) + w[f"{n}/bias"]
        for n in set(names + global_names)
    }
    r = layer.num_heads // proj["key"].shape[2]

    def rep(a):
        return np.repeat(a, r, axis=2)

    def unrep(a):
        b, t, h, d = a.shape
        return a.reshape(b, t, h // r, r, d).sum(3)

    rows = is_global[:, :, None, None]
    parts = []
    for which, (qn, kn, vn) in ((~rows, names), (rows, global_names)):
        q, k, v = proj[qn], rep(proj[kn]), rep(proj[vn])
        out, p = _attention(q, k, v, mask)
        parts.append((which, (qn, kn, vn), (q, k, v), out, p))
    out = np.where(rows, parts[1][3], parts[0][3])
    weights = np.where(is_global[:, None, :, None], parts[1][4], parts[0][4])
    wo = w["attention_output/kernel"]
    y = np.einsum("bthe,heo->bto", out, wo) + w["attention_output/bias"]
    grads = {
        "attention_output/kernel": np.einsum("bthe,bto->heo", out, d_y),
        "attention_output/bias": d_y.sum((0, 1)),
    }
    d_out = np.einsum("bto,heo->bthe", d_y, wo)
    d_proj = {n: 0.0 for n in proj}
    for which, pnames, (q, k, v), _, p in parts:
        dq, dk, dv = _attention_backward(q, k, v, p, d_out * which)
        for n, g in zip(pnames, (dq, unrep(dk), unrep(dv))):
            d_proj[n] = d_proj[n] + g
    d_x = 0.0
    for n, g in d_proj.items():
        grads[f"{n}/kernel"] = np.einsum("btc,bthd->chd", x, g)
        grads[f"{n}/bias"] = g.sum((0, 1))
        d_x = d_x + np.einsum("bthd,chd->btc", g, w[f"{n}/kernel"])
    return y, weights, d_x, grads


# Backend gradients ------------------------------------------------------------


def layer_grads(layer, x, d_y, **kwargs):
    """Output and gradients of `sum(layer(x, **kwargs) * d_y)` w.r.t. `x`
    and the trainable weights (by path); one `jax.jit` on JAX."""
    paths = [v.path.split("/", 1)[1] for v in layer.trainable_variables]
    if BACKEND == "jax":
        import jax

        frozen = [v.value for v in layer.non_trainable_variables]

        def loss(trainable, x):
            y = layer.stateless_call(trainable, frozen, x, **kwargs)[0]
            return (y.astype("float32") * d_y).sum(), y

        (_, y), (gw, gx) = jax.jit(
            jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
        )([v.value for v in layer.trainable_variables], x)
    elif BACKEND == "torch":
        import torch

        x = ops.convert_to_tensor(x).requires_grad_(True)
        y = layer(x, **kwargs)
        loss = torch.sum(y.float() * ops.convert_to_tensor(d_y))
        weights = [v.value for v in layer.trainable_variables]
        gx, *gw = torch.autograd.grad(loss, [x] + weights)
        y = y.detach()
    else:
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, **kwargs)
            loss = tf.reduce_sum(tf.cast(y, "float32") * d_y)
        gx, *gw = tape.gradient(loss, [x] + layer.trainable_variables)
    return np_(y), np_(gx), {p: np_(g) for p, g in zip(paths, gw)}


def _call(layer, x, **kwargs):
    """`layer(x, **kwargs)`; on JAX one `jax.jit` compilation (eager JAX
    compiles every op for every new shape)."""
    if BACKEND != "jax":
        return layer(x, **kwargs)
    import jax

    def run(trainable, frozen, x):
        return layer.stateless_call(trainable, frozen, x, **kwargs)[0]

    return jax.jit(run)(
        [v.value for v in layer.trainable_variables],
        [v.value for v in layer.non_trainable_variables],
        x,
    )


def _dense_scores(layer, x, **kwargs):
    """Dense `(b, h, t, t)` weights of `layer(x, **kwargs)`: the dict of
    scores, checked and expanded with `scores_to_dense` (one jit on JAX)."""
    kwargs = dict(kwargs, return_attention_scores=True)

    def run(trainable, frozen, x):
        if BACKEND == "jax":
            outputs = layer.stateless_call(trainable, frozen, x, **kwargs)[0]
        else:
            outputs = layer(x, **kwargs)
        scores = outputs[1]
        assert set(scores) == {
            "local",
            "global_keys",
            "global_queries",
            "global_indices",
        }
        return layer.scores_to_dense(scores)

    args = (
        [v.value for v in layer.trainable_variables],
        [v.value for v in layer.non_trainable_variables],
        x,
    )
    if BACKEND != "jax":
        return run(*args)
    import jax

    return jax.jit(run)(*args)


def _globals(batch, t, rows):
    """`(batch, t)` bool with the given global positions per row."""
    is_global = np.zeros((batch, t), bool)
    for b, positions in enumerate(rows):
        is_global[b, list(positions)] = True
    return is_global


# (T, window, causal, kv heads, separate projections, global positions per
# row, padded tail per row): 0 / 1 / several global tokens, different
# counts per row, a padded global token, a fully padded row, GQA.
CASES = [
    (13, 2, False, 2, False, ([0], [3, 7, 12], []), (0, 2, 0)),
    (14, 3, True, 1, True, ([0, 5], [], [13]), (0, 14, 3)),
    (11, (1, 2), False, 2, True, ([10], [0, 1, 2, 3], [4]), (2, 0, 0)),
]


@pytest.mark.parametrize("t,window,causal,groups,separate,rows,pads", CASES)
def test_outputs_weights_and_gradients_match_numpy(
    t, window, causal, groups, separate, rows, pads
):
    rng = np.random.default_rng(t)
    batch = len(rows)
    x = rng.normal(size=(batch, t, 8)).astype("float32")
    valid = np.ones((batch, t), bool)
    for b, pad in enumerate(pads):
        valid[b, t - pad :] = False
    is_global = _globals(batch, t, rows)
    layer = LocalSelfAttention(
        num_heads=2,
        key_dim=4,
        num_key_value_heads=groups,
        window_size=window,
        causal=causal,
        block_size=4,
        global_projections=separate,
        max_global_tokens=4,
        bias_initializer="random_normal",
    )
    layer(x[:, :5])
    assert len(layer.trainable_weights) == (14 if separate else 8)
    d_y = rng.normal(size=(batch, t, 8)).astype("float32")
    mask = combined_mask(t, window, causal, is_global, valid)
    want_y, want_w, want_dx, want_grads = np_layer(
        layer, x, mask, is_global & valid, d_y
    )
    kwargs = dict(mask=valid, global_mask=is_global)
    y, dx, grads = layer_grads(layer, x, d_y, **kwargs)
    np.testing.assert_allclose(y, want_y, atol=2e-5)
    np.testing.assert_allclose(dx, want_dx, atol=5e-5)
    assert set(grads) == set(want_grads)
    for path, g in grads.items():
        np.testing.assert_allclose(g, want_grads[path], atol=5e-5, err_msg=path)
    dense = np_(_dense_scores(layer, x, **kwargs))
    np.testing.assert_allclose(dense, want_w, atol=1e-6)
    bias = np_(layer.output_dense.bias)
    np.testing.assert_allclose(
        y[~valid], np.broadcast_to(bias, y[~valid].shape)
    )


def test_same_as_dense_self_attention_with_rotary_positions():
    """Package-level check: equals `SelfAttention` with the combined mask
    as `attention_mask` (rotary positions on, mask read eagerly)."""
    t = 10
    x = np.random.default_rng(1).normal(size=(2, t, 8)).astype("float32")
    kwargs = dict(num_heads=2, key_dim=4, rotary_max_wavelength=100)
    local = LocalSelfAttention(
        window_size=1, block_size=4, max_global_tokens=2, **kwargs
    )
    local(x)
    dense = SelfAttention(**kwargs)
    dense(x)
    dense.set_weights(local.get_weights())
    is_global = _globals(2, t, ([2], [0, 9]))
    valid = np.ones((2, t), bool)
    mask = combined_mask(t, 1, False, is_global, valid)
    np.testing.assert_allclose(
        np_(_call(local, x, global_mask=is_global)),
        np_(_call(dense, x, attention_mask=mask)),
        atol=2e-5,
    )


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy):
    """Softmax in float32: close to float32, padded rows zero, finite."""
    t = 12
    x = np.random.default_rng(2).normal(size=(2, t, 8)).astype("float32")
    kwargs = dict(num_heads=2, key_dim=4, window_size=2, max_global_tokens=2)
    full = LocalSelfAttention(**kwargs)
    full(x)
    mixed = LocalSelfAttention(dtype=policy, **kwargs)
    mixed(x)
    mixed.set_weights(full.get_weights())
    valid = np.ones((2, t), bool)
    valid[1] = False  # a fully masked row
    is_global = _globals(2, t, ([0, 6], [3]))
    y = np_(ops.cast(mixed(x, mask=valid, global_mask=is_global), "float32"))
    want = np_(full(x, mask=valid, global_mask=is_global))
    assert np.all(np.isfinite(y))
    bias = np_(ops.cast(mixed.output_dense.bias, "float32"))
    np.testing.assert_allclose(y[1], np.broadcast_to(bias, y[1].shape))
    np.testing.assert_allclose(y, want, atol=5e-2)


def test_dropout():
    t = 9
    x = np.random.default_rng(3).normal(size=(1, t, 8)).astype("float32")
    layer = LocalSelfAttention(
        num_heads=2,
        key_dim=4,
        window_size=1,
        dropout=0.5,
        seed=1,
        max_global_tokens=1,
    )
    is_global = _globals(1, t, ([4],))
    base = LocalSelfAttention(
        num_heads=2, key_dim=4, window_size=1, max_global_tokens=1
    )
    base(x)
    layer(x)
    layer.set_weights(base.get_weights())
    off = np_(_call(layer, x, global_mask=is_global, training=False))
    np.testing.assert_allclose(
        off, np_(_call(base, x, global_mask=is_global)), atol=1e-6
    )
    on = np_(_call(layer, x, global_mask=is_global, training=True))
    assert np.all(np.isfinite(on)) and not np.allclose(on, off)


def test_more_global_tokens_than_slots_stay_local():
    """Only the first `max_global_tokens` global positions are global."""
    t = 10
    rng = np.random.default_rng(4)
    q = rng.normal(size=(1, t, 1, 4)).astype("float32")
    is_global = _globals(1, t, ([1, 5, 8],))
    first_two = _globals(1, t, ([1, 5],))
    np.testing.assert_allclose(
        np_(global_local_attention(q, q, q, 1, is_global, max_global=2)),
        np_(global_local_attention(q, q, q, 1, first_two)),
        atol=1e-6,
    )


@pytest.mark.tf_only(reason="config and .keras round trip, backend-free")
def test_config_and_keras_round_trip(tmp_path):
    t = 8
    layer = LocalSelfAttention(
        num_heads=2,
        key_dim=4,
        window_size=(2, 1),
        global_projections=True,
        max_global_tokens=3,
    )
    config = layer.get_config()
    assert config["global_projections"] is True
    assert config["max_global_tokens"] == 3
    clone = LocalSelfAttention.from_config(config)
    assert clone.global_projections and clone.max_global_tokens == 3
    inputs = keras.Input((t, 8))
    flags = keras.Input((t,), dtype="bool")
    model = keras.Model([inputs, flags], layer(inputs, global_mask=flags))
    paths = sorted(v.path for v in model.weights)
    assert any("/query_global/kernel" in p for p in paths)
    assert any("/value_global/bias" in p for p in paths)
    x = np.random.default_rng(5).normal(size=(2, t, 8)).astype("float32")
    is_global = _globals(2, t, ([0], [2, 7]))
    path = os.path.join(tmp_path, "global.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(
        np_(loaded([x, is_global])), np_(model([x, is_global])), atol=1e-6
    )
    # Without the option no global weights exist.
    plain = LocalSelfAttention(num_heads=2, key_dim=4, window_size=2)
    plain(x)
    assert not any("global" in v.path for v in plain.weights)


@pytest.mark.tf_only(reason="inspects a TensorFlow graph")
def test_no_quadratic_tensor_and_compiled_needs_max_global():
    """Forward and backward graphs hold no tensor of T x T elements
    (T = 512, window 4, 8 global slots); inside `tf.function` the number
    of slots must be given."""
    import tensorflow as tf

    t = 512
    spec = tf.TensorSpec((1, t, 1, 4), tf.float32)
    flags = tf.TensorSpec((1, t), tf.bool)

    def loss_and_grads(q, k, v, g, max_global=8):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = global_local_attention(
                q, k, v, 4, g, max_global=max_global, block_size=8
            )
            loss = tf.reduce_sum(out**2)
        return loss, tape.gradient(loss, [q, k, v])

    graph = (
        tf.function(loss_and_grads)
        .get_concrete_function(spec, spec, spec, flags)
        .graph
    )
    largest = max(
        int(np.prod(out.shape.as_list()))
        for op in graph.get_operations()
        for out in op.outputs
    )
    assert t * 4 <= largest < t * t // 8, largest
    with pytest.raises(ValueError, match="max_global"):
        tf.function(
            lambda q, g: loss_and_grads(q, q, q, g, None)
        ).get_concrete_function(spec, flags)


def test_bad_global_mask():
    x = np.zeros((2, 6, 8), "float32")
    layer = LocalSelfAttention(num_heads=2, key_dim=4, window_size=1)
    layer(x)
    for bad in (
        np.zeros((2, 5), bool),
        np.zeros((2, 6, 1), bool),
        np.zeros((2, 6), "int32"),
    ):
        with pytest.raises(ValueError, match="global_mask"):
            layer(x, global_mask=bad)
    with pytest.raises(ValueError, match="attention_mask"):
        layer(
            x,
            global_mask=np.zeros((2, 6), bool),
            attention_mask=np.ones((6, 6), bool),
        )
    with pytest.raises(ValueError, match="max_global_tokens=0"):
        LocalSelfAttention(2, 4, window_size=1, max_global_tokens=0)
    with pytest.raises(ValueError, match="global_projections"):
        LocalSelfAttention(2, 4, window_size=1, global_projections="yes")


def test_encoder_block_passes_global_mask():
    """The block with `window_size` and a global mask equals the same block
    with full attention and the combined mask."""
    t = 9
    x = np.random.default_rng(6).normal(size=(2, t, 8)).astype("float32")
    kwargs = dict(num_heads=2, intermediate_dim=16)
    local = TransformerEncoderBlock(
        window_size=1, max_global_tokens=2, **kwargs
    )
    local(x)
    assert local.get_config()["max_global_tokens"] == 2
    full = TransformerEncoderBlock(**kwargs)
    full(x)
    full.set_weights(local.get_weights())
    is_global = _globals(2, t, ([0], [3, 8]))
    valid = np.ones((2, t), bool)
    valid[0, -2:] = False
    mask = combined_mask(t, 1, False, is_global, valid)
    y, scores = local(
        x,
        padding_mask=valid,
        global_mask=is_global,
        return_attention_scores=True,
    )
    want = full(x, padding_mask=valid, attention_mask=mask)
    np.testing.assert_allclose(np_(y), np_(want), atol=2e-5)
    assert "global_keys" in scores
    with pytest.raises(ValueError, match="global_mask"):
        full(x, global_mask=is_global)
    with pytest.raises(ValueError, match="max_global_tokens"):
        TransformerEncoderBlock(max_global_tokens=2, **kwargs)


def test_sliding_window_mask_helper_agrees():
    """The reference's window equals the package's `sliding_window_mask`."""
    t = 7
    none = np.zeros((1, t), bool)
    np.testing.assert_array_equal(
        combined_mask(t, (2, 1), False, none, np.ones((1, t), bool))[0],
        np_(masks.sliding_window_mask(t, (2, 1))).reshape(t, t),
    )


def test_harness_with_global_tokens():
    """The shared harness (config, .keras, SavedModel, fit, mixed
    precision) with global tokens and separate global projections."""
    is_global = np.zeros((2, 9), bool)
    is_global[:, 0] = True
    is_global[1, 4] = True
    run_layer_test(
        LocalSelfAttention,
        dict(
            num_heads=2,
            key_dim=4,
            window_size=1,
            max_global_tokens=2,
            global_projections=True,
        ),
        dict(
            inputs=np.random.default_rng(3)
            .normal(size=(2, 9, 8))
            .astype("float32"),
            global_mask=is_global,
        ),
        expected_output_shape=(2, 9, 8),
        vary_sequence_length=False,
    )
