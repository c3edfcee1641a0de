"""`keras_attention.ops.linear_attention`: the chunked and recurrent forms
against the NumPy recurrence (`tests/linear_attention_reference.py`),
for chunk sizes that do and do not divide the length; packed documents
equal to the documents run one by one; padded keys leaving the state
unchanged; fully padded rows; continuation from a returned state; equal,
finite gradients of the two forms; low and double precision; strong
decays; a TensorFlow graph of unknown length; the implied attention
matrix; argument errors. Random layouts: the properties in
`tests/properties/test_linear_attention_property.py`."""

import keras
import linear_attention_reference as ref
import numpy as np
import pytest
from keras import ops

from keras_attention.ops import linear_attention
from keras_attention.ops.linear_attention import linear_attention_weights

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(39)
B, T, H, D, E = 2, 11, 2, 4, 3
Q, K = RNG.normal(size=(2, B, T, H, D)).astype("float32")
V = RNG.normal(size=(B, T, H, E)).astype("float32")
PER_HEAD = np.log([0.8, 0.97]).astype("float32")
PER_STEP = np.log(RNG.uniform(0.3, 1.0, size=(B, T, H))).astype("float32")
MASK = np.ones((B, T), bool)
MASK[0, 3] = MASK[1, 8:] = False
SEGMENTS = np.array([[0] * 4 + [1] * 5 + [2] * 2, [3] * 6 + [5] * 5])
DECAYS = {"none": None, "per_head": PER_HEAD, "per_step": PER_STEP}
CHUNKS = [None, 3, 64]  # recurrent; not dividing T; > T (one chunk)


def once_on_jax(values):
    """`parametrize` values: on JAX all but the first in the slow tier
    (each case compiles anew there, ~0.4 s per jitted call); TensorFlow
    and PyTorch run them all."""
    if BACKEND != "jax":
        return values
    slow = pytest.mark.slow(
        "JAX compiles every case anew; the first case runs on JAX, all "
        "of them on TensorFlow and PyTorch"
    )
    rest = [
        pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=slow)
        for v in values[1:]
    ]
    return values[:1] + rest


def np_(x):
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def attend(*args, fn=linear_attention, **kwargs):
    """`fn(*args, **kwargs)` (`linear_attention`); on JAX as one jitted
    function (eager JAX compiles each op for each new shape: 3-5x slower
    here)."""
    if BACKEND != "jax":
        return fn(*args, **kwargs)
    import jax

    arrays = {
        name: value
        for name, value in kwargs.items()
        if isinstance(value, (np.ndarray, tuple)) or hasattr(value, "shape")
    }
    static = {n: x for n, x in kwargs.items() if n not in arrays}
    return jax.jit(lambda args, arrays: fn(*args, **arrays, **static))(
        args, arrays
    )


CASES = [
    ("relu", True, "per_step"),
    ("elu_plus_one", False, "none"),
    ("elu_plus_one", True, "per_head"),
    ("identity", False, "per_step"),
    ("identity", False, "per_head"),
]


@pytest.mark.parametrize("feature_map,normalize,decay", once_on_jax(CASES))
def test_both_forms_match_the_recurrence(feature_map, normalize, decay):
    kwargs = dict(
        feature_map=feature_map,
        decay=DECAYS[decay],
        segment_ids=SEGMENTS,
        key_mask=MASK,
        normalize=normalize,
    )
    expected, s, z = ref.linear_attention(Q, K, V, **kwargs)
    for chunk_size in CHUNKS:
        out, state = attend(
            Q, K, V, chunk_size=chunk_size, return_state=True, **kwargs
        )
        np.testing.assert_allclose(np_(out), expected, atol=2e-5, rtol=1e-5)
        if normalize:
            np.testing.assert_allclose(np_(state[1]), z, atol=2e-5)
            state = state[0]
        np.testing.assert_allclose(np_(state), s, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "normalize,segments",
    once_on_jax([(True, True), (False, True), (True, False), (False, False)]),
)
def test_non_causal_reads_the_document_sum(normalize, segments):
    kwargs = dict(
        causal=False,
        key_mask=MASK,
        normalize=normalize,
        segment_ids=SEGMENTS if segments else None,
    )
    expected, _, _ = ref.linear_attention(Q, K, V, **kwargs)
    for chunk_size in (None, 4):
        out = attend(Q, K, V, chunk_size=chunk_size, **kwargs)
        np.testing.assert_allclose(np_(out), expected, atol=2e-5, rtol=1e-5)


def test_packed_documents_equal_documents_one_by_one():
    cut = 4
    packed, state = attend(
        Q[:1],
        K[:1],
        V[:1],
        decay=PER_STEP[:1],
        segment_ids=np.array([[7] * cut + [2] * (T - cut)]),
        chunk_size=3,
        return_state=True,
    )
    parts = [slice(0, cut), slice(cut, T)]
    alone = [
        attend(
            Q[:1, p],
            K[:1, p],
            V[:1, p],
            decay=PER_STEP[:1, p],
            chunk_size=3,
            return_state=True,
        )
        for p in parts
    ]
    np.testing.assert_allclose(
        np_(packed), np.concatenate([np_(o) for o, _ in alone], 1), atol=1e-5
    )
    # The final state is the last document's alone.
    np.testing.assert_allclose(np_(state), np_(alone[1][1]), atol=1e-5)


@pytest.mark.parametrize("chunk_size", once_on_jax([3, None]))
def test_padded_keys_neither_write_nor_decay(chunk_size):
    """Padded steps with wild values, inserted anywhere: the valid
    outputs and the final state are those of the sequence without them."""
    keep = np.array([True, False, False, True, True, False, True] * 2)[:T]
    q, k, v = Q[:1], K[:1], V[:1] * 1.0
    k[0, ~keep] = 50.0
    v[0, ~keep] = -1e4
    kwargs = dict(decay=PER_STEP[:1], chunk_size=chunk_size, normalize=True)
    out, state = attend(
        q, k, v, key_mask=keep[None], return_state=True, **kwargs
    )
    kwargs["decay"] = PER_STEP[:1, keep]
    short, short_state = attend(
        q[:, keep], k[:, keep], v[:, keep], return_state=True, **kwargs
    )
    np.testing.assert_allclose(np_(out)[:, keep], np_(short), atol=1e-5)
    for a, b in zip(state, short_state):
        np.testing.assert_allclose(np_(a), np_(b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalize", once_on_jax([True, False]))
def test_fully_padded_rows_give_zeros_and_finite_gradients(normalize):
    mask = MASK.copy()
    mask[1] = False

    def fn(q, k, v):
        return linear_attention(
            q,
            k,
            v,
            decay=PER_STEP,
            key_mask=mask,
            normalize=normalize,
            chunk_size=4,
        )

    out, grads = value_and_grads(fn, (Q, K, V))
    assert np.all(out[1] == 0.0)
    for g in grads:
        assert np.all(np.isfinite(g))
        assert np.all(g[1] == 0.0)


@pytest.mark.parametrize("normalize", once_on_jax([True, False]))
def test_two_halves_continue_as_one_call(normalize):
    kwargs = dict(decay=PER_STEP, key_mask=MASK, normalize=normalize)
    whole, final = attend(Q, K, V, chunk_size=4, return_state=True, **kwargs)
    cut = 5
    first = {k: v[:, :cut] for k, v in kwargs.items() if k != "normalize"}
    second = {k: v[:, cut:] for k, v in kwargs.items() if k != "normalize"}
    a, state = attend(
        Q[:, :cut],
        K[:, :cut],
        V[:, :cut],
        chunk_size=2,
        return_state=True,
        normalize=normalize,
        **first,
    )
    b, state = attend(
        Q[:, cut:],
        K[:, cut:],
        V[:, cut:],
        initial_state=state,
        chunk_size=None,
        return_state=True,
        normalize=normalize,
        **second,
    )
    # Relative too: unnormalised outputs reach the hundreds (float32
    # rounding there is ~1e-5 absolute; failed with oneDNN off).
    np.testing.assert_allclose(
        np.concatenate([np_(a), np_(b)], 1), np_(whole), atol=2e-5, rtol=1e-5
    )
    for x, y in zip(keras.tree.flatten(state), keras.tree.flatten(final)):
        np.testing.assert_allclose(np_(x), np_(y), atol=2e-5, rtol=1e-5)


def value_and_grads(fn, args):
    """`fn(*args)` and the gradients of `sum(y * c)` w.r.t. `args`, for
    a fixed random cotangent `c` (a linear loss: its gradients are as
    well conditioned as the op's), as NumPy float32."""
    c = np.random.default_rng(1).normal(size=V.shape).astype("float32")
    if BACKEND == "jax":
        import jax
        import jax.numpy as jnp

        def loss(*a):
            y = fn(*a).astype("float32")
            return jnp.sum(y * c), y

        (_, y), g = jax.jit(
            jax.value_and_grad(loss, tuple(range(len(args))), has_aux=True)
        )(*args)
        return np_(y), [np_(x) for x in g]
    if BACKEND == "torch":
        import torch

        args = [ops.convert_to_tensor(a).requires_grad_(True) for a in args]
        y = fn(*args)
        torch.sum(y.float() * ops.convert_to_tensor(c)).backward()
        return np_(y.detach()), [np_(a.grad) for a in args]
    import tensorflow as tf

    args = [tf.constant(a) for a in args]
    with tf.GradientTape() as tape:
        tape.watch(args)
        y = tf.cast(fn(*args), "float32")
        loss = tf.reduce_sum(y * c)
    return np_(y), [np_(x) for x in tape.gradient(loss, args)]


@pytest.mark.parametrize("normalize", once_on_jax([True, False]))
def test_gradients_of_both_forms_are_equal(normalize):
    """Also w.r.t. the per-step decay (what a gate learns from)."""

    def form(chunk_size):
        def fn(q, k, v, decay):
            return linear_attention(
                q,
                k,
                v,
                decay=decay,
                segment_ids=SEGMENTS,
                key_mask=MASK,
                normalize=normalize,
                chunk_size=chunk_size,
            )

        return value_and_grads(fn, (Q, K, V, PER_STEP))

    (y1, g1), (y2, g2) = form(3), form(None)
    np.testing.assert_allclose(y1, y2, atol=2e-5)
    for a, b in zip(g1, g2):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", once_on_jax(["bfloat16", "float16"]))
def test_low_precision_keeps_the_state_in_float32(dtype):
    args = [ops.cast(x, dtype) for x in (Q, K, V)]
    out, state = attend(*args, decay=PER_STEP, chunk_size=4, return_state=True)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    assert keras.backend.standardize_dtype(state.dtype) == "float32"
    rounded = [np_(x) for x in args]
    expected, s, _ = ref.linear_attention(*rounded, decay=PER_STEP)
    tolerance = 2e-2 if dtype == "bfloat16" else 2e-3
    np.testing.assert_allclose(np_(out), expected, atol=tolerance, rtol=1e-2)
    # A float32 state: as accurate as float32 inputs of the same values.
    np.testing.assert_allclose(np_(state), s, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(BACKEND == "jax", reason="JAX computes float64 with x64")
def test_float64_stays_float64():
    args = [x.astype("float64") for x in (Q, K, V)]
    out, state = linear_attention(
        *args,
        decay=PER_STEP.astype("float64"),
        chunk_size=4,
        return_state=True,
    )
    assert keras.backend.standardize_dtype(state.dtype) == "float64"
    expected, _, _ = ref.linear_attention(*args, decay=PER_STEP)
    out = np.asarray(ops.convert_to_numpy(out))
    np.testing.assert_allclose(out, expected, atol=1e-12, rtol=1e-10)


def test_strong_decays_do_not_overflow():
    """Cumulative log decays far below float32's exp range inside one
    chunk (-80 per step): only differences <= 0 are exponentiated."""
    decay = np.full((B, T, H), -80.0, "float32")
    decay[:, ::3] = 0.0
    expected, _, _ = ref.linear_attention(Q, K, V, decay=decay)
    for chunk_size in (None, 11):
        out, grads = value_and_grads(
            lambda q, k, v, a: linear_attention(
                q, k, v, decay=a, chunk_size=chunk_size
            ),
            (Q, K, V, decay),
        )
        np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-5)
        assert all(np.all(np.isfinite(g)) for g in grads)


def test_callable_feature_map():
    def softplus(x):
        return ops.log(1.0 + ops.exp(x))

    out = attend(Q, K, V, feature_map=softplus, chunk_size=4)
    fq, fk = np.log1p(np.exp(Q)), np.log1p(np.exp(K))
    expected, _, _ = ref.linear_attention(fq, fk, V, feature_map="identity")
    np.testing.assert_allclose(np_(out), expected, atol=2e-5, rtol=1e-5)


def test_implied_weights_give_the_output():
    for normalize in (False, True):
        kwargs = dict(
            decay=PER_STEP,
            key_mask=MASK,
            segment_ids=SEGMENTS,
            normalize=normalize,
        )
        w = np_(attend(Q, K, fn=linear_attention_weights, **kwargs))
        np.testing.assert_allclose(
            w, ref.weights(Q, K, **kwargs), atol=1e-5, rtol=1e-5
        )
        out = np_(attend(Q, K, V, chunk_size=4, **kwargs))
        np.testing.assert_allclose(
            np.einsum("bhij,bjhe->bihe", w, V), out, atol=2e-5, rtol=1e-5
        )


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow graphs")
def test_tensorflow_graph_of_unknown_length():
    import tensorflow as tf

    spec = [
        tf.TensorSpec((None, None, H, D)),
        tf.TensorSpec((None, None, H, D)),
        tf.TensorSpec((None, None, H, E)),
        tf.TensorSpec((None, None, H)),
        tf.TensorSpec((None, None), tf.int32),
    ]

    @tf.function(input_signature=spec, autograph=False)
    def run(q, k, v, a, ids):
        return linear_attention(
            q,
            k,
            v,
            decay=a,
            segment_ids=ids,
            chunk_size=4,
            return_state=True,
        )

    out, state = run(Q, K, V, PER_STEP, SEGMENTS.astype("int32"))
    expected, s, _ = ref.linear_attention(
        Q, K, V, decay=PER_STEP, segment_ids=SEGMENTS
    )
    np.testing.assert_allclose(np_(out), expected, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np_(state), s, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(query=Q[0]), ValueError, "`query` must have shape"),
        (dict(value=V[:, :5]), ValueError, "`value` the same"),
        (dict(feature_map="softmax"), ValueError, "`feature_map` must be"),
        (
            dict(feature_map="identity", normalize=True),
            ValueError,
            "non-negative features",
        ),
        (dict(decay=PER_HEAD, causal=False), ValueError, "needs `causal"),
        (dict(decay=np.zeros(3)), ValueError, "`decay` must have shape"),
        (dict(decay=np.array([0.1, -0.2])), ValueError, "log decays"),
        (dict(chunk_size=0), ValueError, "`chunk_size` must be"),
        (dict(causal="yes"), ValueError, "`causal` must be a bool"),
        (dict(key_mask=MASK[:, :4]), ValueError, "`key_mask` must have"),
        (dict(segment_ids=MASK), TypeError, "`segment_ids` must be integers"),
        (
            dict(initial_state=np.zeros((B, H, D, D))),
            ValueError,
            "`initial_state` must be",
        ),
        (
            dict(initial_state=np.zeros((B, H, D, E)), normalize=True),
            ValueError,
            r"a tuple \(S, z\)",
        ),
    ],
)
def test_errors_name_the_argument(kwargs, error, match):
    args = dict(query=Q, key=K, value=V)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        linear_attention(**args)
