"""`scores.DisentangledRelativeBias` (DeBERTa's content-to-position and
position-to-content terms) and `scores.log_bucket_index` against an
independent NumPy port of DeBERTa's attention (Hugging Face's
`DisentangledSelfAttention`, scalar log buckets), on the dense and
blockwise paths: relative positions past the buckets' saturation,
grouped keys, causal masks; the blockwise gradients into the query, key,
value and both position projections equal the dense path's; the buckets
equal keras-hub's; the refusals name their argument."""

import disentangled_reference as reference
import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention.scores import DisentangledRelativeBias
from keras_attention.scores import log_bucket_index

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(11)
# T = 24 is past the saturation (10) of 4 buckets up to distance 10: the
# exact, log-spaced and clipped rows are all read.
B, T, H, KV_H, D = 2, 24, 2, 1, 4
BUCKETS, MAX_DISTANCE, ROWS = 4, 10, 8
Q = RNG.normal(size=(B, T, H, D)).astype("float32")
K = RNG.normal(size=(B, T, KV_H, D)).astype("float32")
V = RNG.normal(size=(B, T, KV_H, D)).astype("float32")
PQ = RNG.normal(size=(ROWS, H, D)).astype("float32")
PK = RNG.normal(size=(ROWS, KV_H, D)).astype("float32")
PATHS = [
    ("dense", {}),
    ("blockwise", dict(query_block=8, key_block=8)),
]


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def np_disentangled(q, k, v, pq, pk, causal=False):
    """DeBERTa's scores (`disentangled_reference.scores`) divided by
    `sqrt(head_dim)` as the content scores, then softmax and values."""
    s = reference.scores(q, k, pq, pk, BUCKETS, MAX_DISTANCE)
    s /= np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    v = np.repeat(v, q.shape[2] // v.shape[2], 2)
    return np.einsum("bhij,bjhe->bihe", p, v)


def make_bias():
    return DisentangledRelativeBias(
        embedding_dim=8, bucket_size=BUCKETS, max_distance=MAX_DISTANCE
    )


def _attend(q, k, v, pq, pk, path, options, causal=False):
    scores = make_bias().bind(
        query=q, key=k, position_query=pq, position_key=pk
    )
    with ka.ops.implementation_scope(path, **options):
        return ka.ops.dot_product_attention(
            q, k, v, score_mod=scores, causal=causal
        )


def attend(q, k, v, pq, pk, path, options, causal=False):
    """`_attend`, jitted on JAX (eager JAX compiles every op for every
    shape: one compiled program instead)."""
    if BACKEND == "jax":
        import jax

        return jax.jit(lambda *a: _attend(*a, path, options, causal=causal))(
            q, k, v, pq, pk
        )
    return _attend(q, k, v, pq, pk, path, options, causal=causal)


@pytest.mark.parametrize(
    "bucket_size, max_distance", [(4, 10), (6, 16), (256, 512), (5, 7)]
)
def test_log_bucket_index_equals_the_reference_and_keras_hub(
    bucket_size, max_distance
):
    relative = np.arange(-3000, 3001)
    got = np_(log_bucket_index(relative, bucket_size, max_distance))
    want = [reference.bucket(r, bucket_size, max_distance) for r in relative]
    want = np.array(want)
    want = np.clip(want + bucket_size, 0, 2 * bucket_size - 1)
    np.testing.assert_array_equal(got, want)
    keras_hub = pytest.importorskip("keras_hub")
    layer = keras_hub.src.models.deberta_v3.disentangled_self_attention
    theirs = layer.DisentangledSelfAttention(
        2, 8, max_position_embeddings=max_distance, bucket_size=bucket_size
    )._make_log_bucket_position(ops.convert_to_tensor(relative, "int32"))
    theirs = np.clip(np_(theirs) + bucket_size, 0, 2 * bucket_size - 1)
    np.testing.assert_array_equal(got, theirs)


@pytest.mark.parametrize("path, options", PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_equals_the_numpy_reference(path, options, causal):
    want = np_disentangled(Q, K, V, PQ, PK, causal=causal)
    got = attend(Q, K, V, PQ, PK, path, options, causal=causal)
    np.testing.assert_allclose(np_(got), want, atol=2e-5)


@pytest.fixture
def x64():
    """JAX computes in float64 only with x64 enabled (the other backends
    always do)."""
    if BACKEND != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


def test_float64_stays_float64(x64):
    args = [a.astype("float64") for a in (Q, K, V, PQ, PK)]
    got = attend(*args, "dense", {})
    assert ops.convert_to_numpy(got).dtype == np.float64
    np.testing.assert_allclose(np_(got), np_disentangled(*args), atol=1e-12)


def _gradients(path, options):
    """Gradients of `sum(out * sin(out))` w.r.t. q, k, v, the position
    queries and keys (the bound tensors)."""
    arrays = (Q, K, V, PQ, PK)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(a) for a in arrays]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            out = attend(*tensors, path, options)
            loss = tf.reduce_sum(out * tf.sin(out))
        return [np_(g) for g in tape.gradient(loss, tensors)]
    if BACKEND == "jax":
        import jax

        def loss(*tensors):
            out = _attend(*tensors, path, options)
            return ops.sum(out * ops.sin(out))

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))
        return [np_(g) for g in grad(*arrays)]
    import torch

    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = attend(*tensors, path, options)
    torch.sum(out * torch.sin(out)).backward()
    return [np_(t.grad) for t in tensors]


# JAX compiles the blockwise backward for about 5 s: slow tier there;
# TensorFlow and PyTorch run it in the fast tier.
JAX_SLOW = [pytest.mark.slow("JAX compiles the blockwise backward (5 s)")]


@pytest.mark.parametrize(
    "path",
    [pytest.param("blockwise", marks=JAX_SLOW if BACKEND == "jax" else [])],
)
def test_blockwise_gradients_equal_the_dense_ones(path):
    want = _gradients("dense", {})
    got = _gradients(path, dict(query_block=8, key_block=8))
    for name, a, b in zip(("q", "k", "v", "pq", "pk"), got, want):
        assert np.abs(b).max() > 1e-3, name  # each one has a gradient
        np.testing.assert_allclose(a, b, atol=2e-5, err_msg=name)


def test_config_round_trip_and_table():
    bias = DisentangledRelativeBias(
        embedding_dim=8, bucket_size=4, max_distance=16, layer_norm_epsilon=None
    )
    config = keras.saving.serialize_keras_object(bias)
    again = keras.saving.deserialize_keras_object(config)
    assert again.get_config() == bias.get_config()
    assert again.layer_norm is None
    again.build()
    np.testing.assert_array_equal(
        np_(again.position_embeddings()), np_(again.embeddings)
    )


@pytest.mark.parametrize(
    "arguments, name",
    [
        (dict(bucket_size=1), "bucket_size"),
        (dict(bucket_size=8, max_distance=5), "max_distance"),
        (dict(embedding_dim=0), "embedding_dim"),
        (dict(layer_norm_epsilon=-1.0), "layer_norm_epsilon"),
    ],
)
def test_bad_arguments_are_refused_by_name(arguments, name):
    with pytest.raises(ValueError, match=name):
        DisentangledRelativeBias(**{"embedding_dim": 8, **arguments})


def test_bad_bindings_are_refused_by_name():
    bias = make_bias()
    with pytest.raises(ValueError, match="position_key"):
        bias.bind(query=Q, key=K, position_query=PQ)
    with pytest.raises(ValueError, match="position_query"):
        bias.bind(query=Q, key=K, position_query=PQ[:4], position_key=PK)
    with pytest.raises(ValueError, match="query"):
        bias.bind(query=Q[0], key=K, position_query=PQ, position_key=PK)
    with pytest.raises(ValueError, match="position_query"):
        bias.bind(query=Q, key=K, position_query=PK, position_key=PK)
    with pytest.raises(ValueError, match="position_key"):
        bias.bind(query=Q, key=K, position_query=PQ, position_key=PQ)
    with pytest.raises(ValueError, match="key"):
        bias.bind(query=Q[:, :, :1], key=Q, position_query=PQ, position_key=PK)
    with pytest.raises(ValueError, match="bind"):
        ka.ops.dot_product_attention(Q, Q, Q, score_mod=bias)
