"""`keras_attention.ops.gated_delta_rule`: the chunked and recurrent
forms against the NumPy recurrence (`tests/gated_delta_reference.py`)
and keras-hub's `_chunk_gated_delta_rule` / `_recurrent_gated_delta_rule`,
for chunk sizes that do and do not divide the length; packed documents
equal to the documents run one by one; padded keys leaving the state
unchanged; fully padded rows; continuation from a returned state; equal,
finite gradients of the two forms; low and double precision; strong
decays; a TensorFlow graph of unknown length; the implied attention
matrix; argument errors. Random layouts: the properties in
`tests/properties/test_gated_delta_rule_property.py`."""

import contextlib

import gated_delta_reference as ref
import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.ops import gated_delta_rule
from keras_attention.ops.gated_delta_rule import implied_attention

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(39)
B, T, HK, HV, D, E = 2, 11, 1, 2, 4, 3


def _unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype("float32")


Q = _unit(RNG.normal(size=(B, T, HK, D)))
K = _unit(RNG.normal(size=(B, T, HK, D)))
V = RNG.normal(size=(B, T, HV, E)).astype("float32")
G = np.log(RNG.uniform(0.3, 1.0, size=(B, T, HV))).astype("float32")
BETA = RNG.uniform(0.05, 0.95, size=(B, T, HV)).astype("float32")
STATE = RNG.normal(size=(B, HV, D, E)).astype("float32")
MASK = np.ones((B, T), bool)
MASK[0, 3] = MASK[1, 8:] = False
SEGMENTS = np.array([[0] * 4 + [1] * 5 + [2] * 2, [3] * 6 + [5] * 5])
CHUNKS = [None, 3, 4, 64]  # recurrent; not dividing T; dividing 8; > T
ARGS = (Q, K, V, G, BETA)


def np_(x):
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def _compiled(fn, *args):
    """`fn(*args)`, under `jax.jit` on JAX (one compiled program instead
    of one per op and shape)."""
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)(*args)
    return fn(*args)


def _run(chunk_size, *args, **kwargs):
    """`(outputs, state)` as NumPy; `args`: q, k, v, g, beta and
    optionally the initial state."""

    def fn(*a):
        return gated_delta_rule(
            *a[:5],
            chunk_size=chunk_size,
            initial_state=a[5] if len(a) > 5 else None,
            return_state=True,
            **kwargs,
        )

    out, state = _compiled(fn, *args)
    return np_(out), np_(state)


@pytest.mark.parametrize("chunk_size", CHUNKS)
def test_forms_equal_the_recurrence(chunk_size):
    # Padding, packed documents, an initial state and grouped heads at once.
    out, state = _run(
        chunk_size,
        *ARGS,
        STATE,
        segment_ids=SEGMENTS,
        key_mask=MASK,
    )
    want, want_state = ref.gated_delta_rule(*ARGS, STATE, SEGMENTS, MASK)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=1e-5, atol=1e-5)
    assert np.all(out[~MASK] == 0.0)


@pytest.mark.parametrize("chunk_size", [4, None])
def test_equals_keras_hub(chunk_size):
    # keras-hub L2-normalises q and k inside (the op takes them as given:
    # they are unit vectors here, which its normalisation keeps).
    from keras_hub.src.models.qwen3_5 import qwen3_5_gated_delta_net as hub

    def repeat(x):
        return np.repeat(x, HV // HK, axis=2)

    args = [repeat(Q), repeat(K), V, G, BETA]
    hub_args = [ops.convert_to_tensor(x) for x in args]
    state = ops.convert_to_tensor(STATE)
    if chunk_size is None:

        def upstream(*a):
            return hub._recurrent_gated_delta_rule(
                *a[:5], initial_state=a[5], output_final_state=True
            )
    else:

        def upstream(*a):
            return hub._chunk_gated_delta_rule(
                *a[:5],
                chunk_size=chunk_size,
                initial_state=a[5],
                output_final_state=True,
            )

    want, want_state = _compiled(upstream, *hub_args, state)
    out, got_state = _run(chunk_size, *ARGS, STATE)
    np.testing.assert_allclose(out, np_(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_state, np_(want_state), atol=1e-5)


def test_packed_documents_equal_documents_one_by_one():
    out, _ = _run(4, *ARGS, segment_ids=SEGMENTS)
    # Each document alone: a row of its own (same length, one compiled
    # program), every other token padded out.
    rows, alone_masks = [], []
    for row in range(B):
        ids = SEGMENTS[row]
        starts = [0] + [i for i in range(1, T) if ids[i] != ids[i - 1]] + [T]
        for a, b in zip(starts[:-1], starts[1:]):
            mask = np.zeros(T, bool)
            mask[a:b] = True
            rows.append(row)
            alone_masks.append(mask)
    alone, _ = _run(4, *[x[rows] for x in ARGS], key_mask=np.array(alone_masks))
    for i, (row, mask) in enumerate(zip(rows, alone_masks)):
        np.testing.assert_allclose(out[row, mask], alone[i, mask], atol=1e-5)
    assert len(rows) == 5


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_padded_keys_leave_the_state_unchanged(chunk_size):
    # Row 0: padding in the middle (position 3), row 1: at the end. The
    # state and the real outputs equal those of the rows without padding
    # (the recurrence run on the real tokens alone), whatever the padded
    # tokens hold (NaN included).
    args = [x.copy() for x in ARGS]
    for x in args:
        x[~MASK] = np.nan
    out, state = _run(chunk_size, *args, key_mask=MASK)
    assert np.all(out[~MASK] == 0.0)
    for row in range(B):
        kept = [x[row : row + 1, MASK[row]] for x in ARGS]
        alone, alone_state = ref.gated_delta_rule(*kept)
        np.testing.assert_allclose(out[row, MASK[row]], alone[0], atol=1e-5)
        np.testing.assert_allclose(state[row], alone_state[0], atol=1e-5)


def test_fully_padded_rows_give_zeros():
    mask = MASK.copy()
    mask[1] = False
    for chunk_size in (None, 4):
        out, state = _run(chunk_size, *ARGS, key_mask=mask)
        assert np.all(out[1] == 0.0) and np.all(state[1] == 0.0)
        assert np.all(np.isfinite(out))


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_continuation_from_a_returned_state(chunk_size):
    whole, whole_state = _run(chunk_size, *ARGS, STATE, segment_ids=SEGMENTS)
    cut = 7  # inside a document in both rows
    first, state = _run(
        chunk_size,
        *[x[:, :cut] for x in ARGS],
        STATE,
        segment_ids=SEGMENTS[:, :cut],
    )
    # The second call's first document continues the state: its ids
    # start with the id the first call ended with.
    second, last = _run(
        chunk_size,
        *[x[:, cut:] for x in ARGS],
        state,
        segment_ids=SEGMENTS[:, cut:],
    )
    np.testing.assert_allclose(
        np.concatenate([first, second], 1), whole, atol=1e-5
    )
    np.testing.assert_allclose(last, whole_state, atol=1e-5)


def _gradients(chunk_size, args, cotangent):
    """Gradients of `sum(out * cotangent) + sum(state)` w.r.t. `args` (q,
    k, v, g, beta, initial state)."""

    def loss(*a):
        out, state = gated_delta_rule(
            *a[:5],
            chunk_size=chunk_size,
            initial_state=a[5],
            return_state=True,
            segment_ids=SEGMENTS,
            key_mask=MASK,
        )
        return ops.sum(out * cotangent) + ops.sum(state)

    if BACKEND == "jax":
        import jax

        grad = jax.grad(loss, argnums=tuple(range(len(args))))
        return [np.asarray(g) for g in jax.jit(grad)(*args)]
    if BACKEND == "torch":
        import torch

        args = [ops.convert_to_tensor(a).requires_grad_(True) for a in args]
        grads = torch.autograd.grad(loss(*args), args)
        return [np_(g) for g in grads]
    import tensorflow as tf

    args = [tf.Variable(a) for a in args]
    with tf.GradientTape() as tape:
        value = loss(*args)
    return [g.numpy() for g in tape.gradient(value, args)]


def test_gradients_are_finite_and_equal_in_both_forms():
    cotangent = ops.convert_to_tensor(
        RNG.normal(size=V.shape).astype("float32")
    )
    args = list(ARGS) + [STATE]
    chunked = _gradients(4, args, cotangent)
    recurrent = _gradients(None, args, cotangent)
    for name, a, b in zip("q k v g beta state".split(), chunked, recurrent):
        assert np.all(np.isfinite(a)), name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=name)
    # Padded tokens get no gradient (they do not take part).
    for grad in chunked[:5]:
        assert np.all(grad[~MASK] == 0.0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_keeps_a_float32_state(dtype):
    args = [ops.cast(x, dtype) for x in ARGS]
    rounded = [np_(x).astype("float64") for x in args]
    want, want_state = ref.gated_delta_rule(*rounded, key_mask=MASK)
    for chunk_size in (None, 4):
        out, state = _compiled(
            lambda *a: gated_delta_rule(
                *a, chunk_size=chunk_size, return_state=True, key_mask=MASK
            ),
            *args,
        )
        assert keras.backend.standardize_dtype(out.dtype) == dtype
        assert keras.backend.standardize_dtype(state.dtype) == "float32"
        # The state is exact to float32; the outputs to their dtype.
        np.testing.assert_allclose(np_(state), want_state, atol=1e-5)
        np.testing.assert_allclose(np_(out), want, atol=2e-2, rtol=2e-2)


@contextlib.contextmanager
def _float64_enabled():
    """JAX computes in float64 only with x64 enabled (the other backends
    always do)."""
    if BACKEND != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


def test_float64_computes_in_float64():
    args = [x.astype("float64") for x in ARGS]
    want, want_state = ref.gated_delta_rule(*args, segment_ids=SEGMENTS)
    for chunk_size in (None, 4):
        with _float64_enabled():
            out, state = _compiled(
                lambda *a: gated_delta_rule(
                    *a,
                    chunk_size=chunk_size,
                    return_state=True,
                    segment_ids=SEGMENTS,
                ),
                *args,
            )
            out, state = ops.convert_to_numpy(out), ops.convert_to_numpy(state)
        assert state.dtype == out.dtype == np.float64
        np.testing.assert_allclose(out, want, atol=1e-12)
        np.testing.assert_allclose(state, want_state, atol=1e-12)


def test_strong_decays_stay_finite():
    # A chunk's cumulative log decay reaches -40 * 11 = -440: exp of it
    # underflows to 0, and no exponential of a positive sum is taken.
    g = np.full(G.shape, -40.0, "float32")
    g[:, ::3] = 0.0
    want, _ = ref.gated_delta_rule(Q, K, V, g, BETA)
    for chunk_size in (None, 11):
        out, state = _run(chunk_size, Q, K, V, g, BETA)
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(state))
        np.testing.assert_allclose(out, want, atol=1e-5)


@pytest.mark.tf_only("a TensorFlow graph with an unknown time axis")
def test_unknown_length_in_a_tensorflow_graph():
    import tensorflow as tf

    def spec(x):
        return tf.TensorSpec((None, None) + x.shape[2:], x.dtype)

    fn = tf.function(
        lambda *a: gated_delta_rule(*a, chunk_size=4, key_mask=MASK[:, :7]),
        input_signature=[spec(x) for x in ARGS],
        autograph=False,
    )
    out = fn(*[x[:, :7] for x in ARGS])
    want, _ = ref.gated_delta_rule(
        *[x[:, :7] for x in ARGS], key_mask=MASK[:, :7]
    )
    np.testing.assert_allclose(np_(out), want, atol=1e-5)


def test_implied_attention_matrix():
    weights = np_(
        _compiled(
            lambda *a: implied_attention(
                *a, segment_ids=SEGMENTS, key_mask=MASK
            ),
            Q,
            K,
            G,
            BETA,
        )
    )
    assert weights.shape == (B, HV, T, T)
    want = ref.attention_matrix(Q, K, G, BETA, SEGMENTS, MASK)
    np.testing.assert_allclose(weights, want, atol=1e-5)
    assert np.all(np.triu(weights, 1) == 0.0)
    out, _ = _run(4, *ARGS, segment_ids=SEGMENTS, key_mask=MASK)
    np.testing.assert_allclose(
        np.einsum("bhij,bjhe->bihe", weights, V), out, atol=1e-5
    )


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(query=Q[0]), "`query` must have shape"),
        (dict(key=K[:, :5]), "`key` must have shape"),
        (dict(value=V[:, :5]), "`value` must have shape"),
        (
            dict(query=np.zeros((B, T, 3, D)), key=np.zeros((B, T, 3, D))),
            "`value` must have a multiple",
        ),
        (dict(g=G[..., :1]), "`g` must have shape"),
        (dict(beta=BETA[:, :5]), "`beta` must have shape"),
        (dict(chunk_size=0), "`chunk_size` must be a positive integer"),
        (dict(chunk_size=2.0), "`chunk_size` must be a positive integer"),
        (dict(return_state="yes"), "`return_state` must be a bool"),
        (dict(initial_state=STATE[:, :1]), "`initial_state` must have"),
        (dict(segment_ids=SEGMENTS[:, :5]), "`segment_ids` must have"),
        (dict(key_mask=MASK[:1]), "`key_mask` must have"),
    ],
)
def test_bad_arguments_are_refused(change, match):
    kwargs = dict(query=Q, key=K, value=V, g=G, beta=BETA)
    kwargs.update(change)
    with pytest.raises(ValueError, match=match):
        gated_delta_rule(**kwargs)


def test_bad_dtypes_are_refused():
    with pytest.raises(TypeError, match="`segment_ids` must hold integers"):
        gated_delta_rule(*ARGS, segment_ids=SEGMENTS.astype("float32"))
    with pytest.raises(TypeError, match="`key_mask` must hold booleans"):
        gated_delta_rule(*ARGS, key_mask=MASK.astype("int32"))
    with pytest.raises(TypeError, match="`query` must hold numbers"):
        gated_delta_rule(np.full(Q.shape, "a"), *ARGS[1:])
