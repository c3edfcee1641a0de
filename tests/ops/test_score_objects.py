"""The score objects of `keras_attention.scores` against NumPy and
keras-hub: ALiBi (slopes and weights equal keras-hub's `AlibiBias`), T5's
relative position bias (buckets from an independent NumPy port of T5's
function; the table's gradient on the blockwise path equals the dense
path's), soft-capping (values and gradients); on the dense and blockwise
paths (tile sizes varied, none pinned), in layers through the harness
(config, `.keras`, SavedModel in a fresh process, fit, mixed precision).
"""

import keras
import numpy as np
import pytest
import references
from harness import run_layer_test
from keras import ops

from keras_attention import layers as ka
from keras_attention import scores
from keras_attention.ops import attention as attention_lib

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(5)
B, T, H, D = 2, 24, 6, 8
Q = RNG.normal(size=(B, T, H, D)).astype("float32")
K = RNG.normal(size=(B, T, H, D)).astype("float32")
V = RNG.normal(size=(B, T, H, D)).astype("float32")
QI, KJ = np.arange(T)[:, None], np.arange(T)[None, :]
CAUSAL = KJ <= QI
PATHS = [
    ("dense", {}),
    ("blockwise", dict(query_block=8, key_block=8)),
    ("blockwise", dict(query_block=5, key_block=24, keep_probabilities=True)),
]


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def np_attention(bias, mask, q=Q, k=K, v=V, cap=None):
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    if cap is not None:
        s = cap * np.tanh(s / cap)
    s = s + bias
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhe->bihe", p, v)


def _attend(score_mod, path, options, causal=True, q=Q, k=K, v=V):
    with attention_lib.implementation_scope(path, **options):
        return attention_lib.dot_product_attention(
            q, k, v, causal=causal, score_mod=score_mod
        )


def attend(score_mod, path, options, causal=True, q=Q, k=K, v=V):
    """`_attend`, jitted on JAX (eager JAX compiles every op for every
    shape: one compiled program instead)."""
    if BACKEND == "jax":
        import jax

        return jax.jit(
            lambda *a: _attend(score_mod, path, options, causal, *a)
        )(q, k, v)
    return _attend(score_mod, path, options, causal, q, k, v)


# ALiBi ------------------------------------------------------------------


@pytest.mark.parametrize("heads", [1, 2, 6, 8, 12])
def test_alibi_slopes_equal_keras_hubs(heads):
    keras_hub = pytest.importorskip("keras_hub")
    hub = keras_hub.layers.AlibiBias()._get_slopes(heads)
    np.testing.assert_allclose(scores.alibi_slopes(heads), hub, rtol=1e-12)
    if heads == 8:  # the paper's: 1/2, 1/4, ..., 1/256
        assert scores.alibi_slopes(8) == [2.0**-i for i in range(1, 9)]


@pytest.mark.parametrize("path,options", PATHS)
def test_alibi_weights_equal_keras_hub_alibi_bias(path, options):
    keras_hub = pytest.importorskip("keras_hub")
    raw = np.einsum("bihd,bjhd->bhij", Q, K) / np.sqrt(D)
    hub_scores = np_(keras_hub.layers.AlibiBias()(raw))
    want = np_attention(hub_scores - raw, CAUSAL)
    out = attend(scores.ALiBi(num_heads=H), path, options)
    np.testing.assert_allclose(np_(out), want, atol=2e-5)


@pytest.mark.parametrize("path,options", PATHS)
def test_bidirectional_alibi_uses_the_distance(path, options):
    slopes = np.array(scores.alibi_slopes(H))[:, None, None]
    want = np_attention(-slopes * np.abs(QI - KJ), True)
    out = attend(
        scores.ALiBi(num_heads=H, bidirectional=True),
        path,
        options,
        causal=False,
    )
    np.testing.assert_allclose(np_(out), want, atol=2e-5)


def test_alibi_refuses_another_head_count():
    with pytest.raises(ValueError, match="num_heads"):
        ka.SelfAttention(4, 8, score_mod=scores.ALiBi(num_heads=2))(
            np.ones((1, 3, 8), "float32")
        )
    with pytest.raises(ValueError, match="alibi_bias_max"):
        scores.ALiBi(alibi_bias_max=0)


# T5 relative position bias ------------------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets,distance", [(32, 128), (8, 20), (6, 9)])
def test_t5_buckets_equal_t5s_function(bidirectional, buckets, distance):
    relative = np.arange(-300, 301, dtype="int32")
    got = np_(
        scores.relative_position_bucket(
            relative, bidirectional, buckets, distance
        )
    )
    want = references.t5_bucket(relative, bidirectional, buckets, distance)
    np.testing.assert_array_equal(got, want)


def _t5(bidirectional=False):
    bias = scores.T5RelativeBias(
        num_buckets=8,
        max_distance=16,
        bidirectional=bidirectional,
        embeddings_initializer=keras.initializers.RandomNormal(seed=1),
    )
    bias.build(H)
    return bias


@pytest.mark.parametrize("path,options", PATHS)
def test_t5_bias_matches_numpy(path, options):
    bias = _t5()
    table = np_(bias.embeddings)
    bucket = references.t5_bucket((KJ - QI).astype("int32"), False, 8, 16)
    want = np_attention(np.transpose(table[bucket], (2, 0, 1)), CAUSAL)
    np.testing.assert_allclose(
        np_(attend(bias, path, options)), want, atol=2e-5
    )


def _gradients(score_mod, path, options, variable):
    """Gradients of sum(out * sin(out)) w.r.t. q, k, v and `variable`."""
    args = [Q, K, V]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        args = [tf.constant(a) for a in args]
        with tf.GradientTape() as tape:
            tape.watch(args)
            out = attend(score_mod, path, options, True, *args)
            loss = tf.reduce_sum(out * tf.sin(out))
        targets = args + ([variable.value] if variable is not None else [])
        return [np_(g) for g in tape.gradient(loss, targets)]
    if BACKEND == "jax":
        import jax

        def loss(value, *a):
            mapping = [(variable, value)] if variable is not None else []
            with keras.StatelessScope(state_mapping=mapping):
                out = _attend(score_mod, path, options, True, *a)
            return ops.sum(out * ops.sin(out))

        value = ops.convert_to_tensor(
            variable.value if variable is not None else 0.0
        )
        # One compiled program (eager JAX compiles every op of both passes).
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
        grads = grad(value, *args)
        grads = [np_(g) for g in grads]
        return grads[1:] + (grads[:1] if variable is not None else [])
    import torch

    args = [torch.tensor(a, requires_grad=True) for a in args]
    out = attend(score_mod, path, options, True, *args)
    torch.sum(out * torch.sin(out)).backward()
    grads = [np_(a.grad) for a in args]
    if variable is not None:
        grads.append(np_(variable.value.grad))
        variable.value.grad = None
    return grads


@pytest.mark.parametrize("path,options", PATHS[1:])
def test_t5_table_gradient_on_the_blockwise_path(path, options):
    bias = _t5()
    dense = _gradients(bias, "dense", {}, bias.embeddings)
    blockwise = _gradients(bias, path, options, bias.embeddings)
    for name, a, b in zip(["q", "k", "v", "table"], dense, blockwise):
        np.testing.assert_allclose(b, a, atol=2e-5, err_msg=name)
    assert np.abs(dense[3]).max() > 0


def test_t5_arguments_are_checked():
    with pytest.raises(ValueError, match="num_buckets"):
        scores.T5RelativeBias(num_buckets=2)
    with pytest.raises(ValueError, match="max_distance"):
        scores.T5RelativeBias(num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match="num_heads"):
        scores.T5RelativeBias().build()


# Soft-capping -----------------------------------------------------------


@pytest.mark.parametrize("path,options", PATHS)
def test_soft_cap_matches_numpy_with_its_gradient(path, options):
    cap = 0.7  # small: most scores saturate
    want = np_attention(0.0, CAUSAL, cap=cap)
    np.testing.assert_allclose(
        np_(attend(scores.SoftCap(cap), path, options)), want, atol=2e-5
    )
    if path == "blockwise":
        dense = _gradients(scores.SoftCap(cap), "dense", {}, None)
        blockwise = _gradients(scores.SoftCap(cap), path, options, None)
        for name, a, b in zip("qkv", dense, blockwise):
            np.testing.assert_allclose(b, a, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("cap", [0, -1.0, float("inf"), float("nan"), "1"])
def test_soft_cap_refuses_bad_caps(cap):
    with pytest.raises((ValueError, TypeError), match="cap"):
        scores.SoftCap(cap)


# In layers, through the harness ------------------------------------------


HELD = {
    "alibi": (lambda: scores.ALiBi(), 8),
    "t5": (lambda: scores.T5RelativeBias(num_buckets=8, max_distance=16), 9),
    "softcap": (lambda: scores.SoftCap(5.0), 8),
}


@pytest.mark.parametrize("name", sorted(HELD))
def test_layers_holding_score_objects_pass_the_harness(name):
    make, weights = HELD[name]
    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    run_layer_test(
        ka.SelfAttention,
        dict(num_heads=2, key_dim=4, causal=True, score_mod=make()),
        dict(inputs=x),
        expected_output_shape=(2, 6, 8),
        expected_num_trainable_weights=weights,
        run_mixed_precision=True,
        run_fit=True,
        run_saved_model=name != "softcap",
    )


def test_one_t5_table_shared_by_every_block_trains_saves_and_loads(tmp_path):
    # T5 shares one bias table across a stack's blocks: one object given
    # to every block is one weight, reaches the gradient through each
    # block, is saved once and loads as one object with the same outputs.
    from keras_attention.blocks import TransformerEncoderBlock

    bias = scores.T5RelativeBias(num_buckets=8, max_distance=16)
    inputs = keras.Input((6, 16))
    x = inputs
    blocks = [
        TransformerEncoderBlock(2, 32, score_mod=bias, name=f"block_{i}")
        for i in range(3)
    ]
    for block in blocks:
        x = block(x)
    model = keras.Model(inputs, x)
    tables = [w for w in model.weights if "t5_relative_bias" in w.path]
    assert len(tables) == 1 and tuple(tables[0].shape) == (8, 2)
    data = RNG.normal(size=(2, 6, 16)).astype("float32")
    expected = np_(model(data))
    path = str(tmp_path / "shared.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    held = [layer.score_mod for layer in loaded.layers[1:]]
    assert all(h is held[0] for h in held)
    np.testing.assert_allclose(np_(loaded(data)), expected, atol=1e-6)
    # Each block adds the same table: zeroing it changes every block.
    assert len([w for w in loaded.weights if "t5_relative_bias" in w.path]) == 1
    model.compile("sgd", "mse")
    before = np.array(np_(tables[0]), copy=True)  # torch: shared memory
    # (Not zeros: a post-norm block's |y|^2 is constant at init.)
    targets = RNG.normal(size=data.shape).astype("float32")
    model.fit(data, targets, epochs=1, verbose=0)
    assert np.abs(np_(tables[0]) - before).max() > 0


# The relative-bias fast path ----------------------------------------------
# ALiBi and T5 declare `relative_bias(distance)`: the blockwise path forms
# each tile's bias from its Bq + Bk - 1 distances and sums the table's
# gradient along the tile's diagonals. A subclass that overrides the score
# function takes the general path (a per-score function and its vjp); the
# two must agree, forward and backward, whatever the tiles.


class _GeneralT5(scores.T5RelativeBias):
    def score_fn(self, score, batch, head, q_idx, kv_idx):
        return super().score_fn(score, batch, head, q_idx, kv_idx)


class _GeneralALiBi(scores.ALiBi):
    def score_fn(self, score, batch, head, q_idx, kv_idx):
        return super().score_fn(score, batch, head, q_idx, kv_idx)


def test_relative_bias_is_used_only_when_one_class_defines_both():
    from keras_attention.ops import scoring

    assert scoring.split_relative_bias(scores.ALiBi(num_heads=2)) is not None
    assert scoring.split_relative_bias(_t5()) is not None
    assert scoring.split_relative_bias(_GeneralALiBi(num_heads=2)) is None
    assert scoring.split_relative_bias(scores.SoftCap(5.0)) is None


@pytest.mark.parametrize(
    "blocks,keep",
    [((8, 8), None), ((5, 24), True), ((7, 10), False), ((24, 9), None)],
)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_t5_relative_path_equals_the_general_path(blocks, keep, bidirectional):
    fast = _t5(bidirectional)
    general = _GeneralT5(
        num_buckets=8, max_distance=16, bidirectional=bidirectional
    )
    general.build(H)
    general.embeddings.assign(fast.embeddings)
    options = dict(
        query_block=blocks[0], key_block=blocks[1], keep_probabilities=keep
    )
    for causal in (True, False):
        np.testing.assert_allclose(
            np_(attend(fast, "blockwise", options, causal)),
            np_(attend(general, "blockwise", options, causal)),
            atol=2e-6,
        )
    want = _gradients(general, "blockwise", options, general.embeddings)
    got = _gradients(fast, "blockwise", options, fast.embeddings)
    for name, a, b in zip(["q", "k", "v", "table"], want, got):
        np.testing.assert_allclose(b, a, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_alibi_relative_path_gradients_equal_the_general_path(bidirectional):
    options = dict(query_block=7, key_block=10, keep_probabilities=False)
    want = _gradients(
        _GeneralALiBi(num_heads=H, bidirectional=bidirectional),
        "blockwise",
        options,
        None,
    )
    got = _gradients(
        scores.ALiBi(num_heads=H, bidirectional=bidirectional),
        "blockwise",
        options,
        None,
    )
    for name, a, b in zip("qkv", want, got):
        np.testing.assert_allclose(b, a, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("path,options", PATHS)
def test_a_frozen_t5_table_is_read_not_trained(path, options):
    # `trainable=False` (fine-tuning with frozen layers): its weight is
    # still read on every path (TensorFlow's custom gradient refused a
    # variable it was not given); the inputs' gradients are unchanged.
    bias = _t5()
    want = _gradients(bias, path, options, None)
    bias.trainable = False
    got = _gradients(bias, path, options, None)
    for name, a, b in zip("qkv", want, got):
        np.testing.assert_allclose(b, a, atol=1e-6, err_msg=name)
    frozen = scores.T5RelativeBias(num_buckets=8, max_distance=16)
    inputs = keras.Input((6, 8))
    model = keras.Model(
        inputs, ka.SelfAttention(2, 4, causal=True, score_mod=frozen)(inputs)
    )
    frozen.trainable = False
    assert len(model.trainable_weights) == 8  # q, k, v, o: not the table
    before = np.array(np_(frozen.embeddings), copy=True)
    model.compile("sgd", "mse")
    x = RNG.normal(size=(4, 6, 8)).astype("float32")
    model.fit(x, x, epochs=2, verbose=0)
    np.testing.assert_array_equal(np_(frozen.embeddings), before)


class _GeneralSoftCap(scores.SoftCap):
    def __call__(self, score, batch, head, q_idx, kv_idx):
        return super().__call__(score, batch, head, q_idx, kv_idx)


def test_soft_cap_fast_path_only_for_the_class_defining_it():
    from keras_attention.ops import scoring

    assert scoring.split_soft_cap(scores.SoftCap(3.0)) == 3.0
    assert scoring.split_soft_cap(_GeneralSoftCap(3.0)) is None
    assert scoring.split_soft_cap(scores.ALiBi(num_heads=2)) is None


@pytest.mark.parametrize(
    "blocks,keep", [((8, 8), None), ((5, 24), True), ((7, 10), False)]
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_soft_cap_fast_path_equals_the_general_path(blocks, keep, dtype):
    # The blockwise path scales the tile's queries by 1 / cap (float32) or
    # its scores (other dtypes), keeps tanh for the derivative.
    options = dict(
        query_block=blocks[0], key_block=blocks[1], keep_probabilities=keep
    )
    q, k, v = (ops.cast(x * 4.0, dtype) for x in (Q, K, V))
    tol = 2e-5 if dtype == "float32" else 3e-2
    for causal in (True, False):
        np.testing.assert_allclose(
            np_(
                ops.cast(
                    attend(
                        scores.SoftCap(2.0),
                        "blockwise",
                        options,
                        causal,
                        q,
                        k,
                        v,
                    ),
                    "float32",
                )
            ),
            np_(
                ops.cast(
                    attend(
                        _GeneralSoftCap(2.0),
                        "blockwise",
                        options,
                        causal,
                        q,
                        k,
                        v,
                    ),
                    "float32",
                )
            ),
            atol=tol,
        )
    if dtype == "float32":
        want = _gradients(_GeneralSoftCap(2.0), "blockwise", options, None)
        got = _gradients(scores.SoftCap(2.0), "blockwise", options, None)
        for name, a, b in zip("qkv", want, got):
            np.testing.assert_allclose(b, a, atol=2e-5, err_msg=name)
