"""Gradients into the tensors a plain score function reads, on the
blockwise path (issue 53, defect 12).

A plain function (not a `ScoreLayer`) reading a trainable
`keras.Variable` or a tensor that carries a gradient (a watched
TensorFlow tensor, a JAX tracer, a torch tensor requiring grad) from its
closure, a global, a default or an object: the blockwise path passes
them through its hand-written backward pass explicitly, so their
gradients equal the dense path's (autodiff), and the automatic choice
keeps blockwise for long sequences instead of falling back to O(T^2)
memory. A tensor in a place it cannot be replaced (a module's attribute)
is refused on a forced "blockwise", naming `score_mod`, and sends the
automatic choice to "dense".
"""

import types

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention.ops import captured
from keras_attention.ops import paths
from keras_attention.ops import scoring

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(53)
T, H, D = 512, 2, 8
Q, K, V = (RNG.normal(size=(1, T, H, D)).astype("float32") for _ in "qkv")
SLOPES = np.array([0.05, -0.02], "float32")
GLOBAL_SLOPES = keras.Variable(SLOPES, name="captured_global_slopes")


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def _bias(slopes, score, head, q_idx, kv_idx):
    distance = ops.cast(q_idx - kv_idx, "float32")
    return score + ops.take(slopes, head) * distance


def reads_a_global(score, batch, head, q_idx, kv_idx):
    return _bias(GLOBAL_SLOPES, score, head, q_idx, kv_idx)


class _Holder:
    """A callable object holding its tensor as an attribute."""

    def __init__(self, slopes):
        self.slopes = slopes

    def __call__(self, score, batch, head, q_idx, kv_idx):
        return _bias(self.slopes, score, head, q_idx, kv_idx)


def _closure(slopes):
    def fn(score, batch, head, q_idx, kv_idx):
        return _bias(slopes, score, head, q_idx, kv_idx)

    return fn


def _attend(q, k, v, fn, implementation, **options):
    with ka.ops.implementation_scope(implementation, **options):
        return ka.ops.dot_product_attention(q, k, v, score_mod=fn, **CALL)


CALL = {}


def _variable_gradients(make_fn, variable, implementation, graph=False, **o):
    """Gradients of `sum(out * sin(out))` w.r.t. q, k, v and a
    `keras.Variable` the function `make_fn()` reads."""
    fn = make_fn()
    if BACKEND == "tensorflow":
        import tensorflow as tf

        def step(q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                out = _attend(q, k, v, fn, implementation, **o)
                loss = tf.reduce_sum(out * tf.sin(out))
            return tape.gradient(loss, [q, k, v, variable.value])

        if graph:
            step = tf.function(step, autograph=False)
        return [np_(g) for g in step(*map(tf.constant, (Q, K, V)))]
    if BACKEND == "jax":
        import jax

        def loss(value, q, k, v):
            with keras.StatelessScope(state_mapping=[(variable, value)]):
                out = _attend(q, k, v, fn, implementation, **o)
            return ops.sum(out * ops.sin(out))

        # Compiled either way: op by op, the tiles take seconds.
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
        grads = [np_(g) for g in grad(variable.value, Q, K, V)]
        return grads[1:] + grads[:1]
    import torch

    args = [torch.tensor(a, requires_grad=True) for a in (Q, K, V)]
    out = _attend(*args, fn, implementation, **o)
    torch.sum(out * torch.sin(out)).backward()
    grads = [np_(a.grad) for a in args] + [np_(variable.value.grad)]
    variable.value.grad = None
    return grads


def _tensor_gradients(make_fn, implementation, graph=False, **o):
    """The same w.r.t. a backend tensor `make_fn(tensor)` closes over (a
    watched TensorFlow tensor, a JAX tracer, a torch tensor requiring
    grad)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        def step(slopes, q, k, v):
            with tf.GradientTape() as tape:
                tape.watch([slopes, q, k, v])
                out = _attend(q, k, v, make_fn(slopes), implementation, **o)
                loss = tf.reduce_sum(out * tf.sin(out))
            return tape.gradient(loss, [q, k, v, slopes])

        if graph:
            step = tf.function(step, autograph=False)
        return [np_(g) for g in step(*map(tf.constant, (SLOPES, Q, K, V)))]
    if BACKEND == "jax":
        import jax

        def loss(slopes, q, k, v):
            out = _attend(q, k, v, make_fn(slopes), implementation, **o)
            return ops.sum(out * ops.sin(out))

        # Compiled either way: op by op, the tiles take seconds.
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
        grads = [np_(g) for g in grad(SLOPES, Q, K, V)]
        return grads[1:] + grads[:1]
    import torch

    slopes = torch.tensor(SLOPES, requires_grad=True)
    args = [torch.tensor(a, requires_grad=True) for a in (Q, K, V)]
    out = _attend(*args, make_fn(slopes), implementation, **o)
    torch.sum(out * torch.sin(out)).backward()
    return [np_(a.grad) for a in args] + [np_(slopes.grad)]


def _assert_same(got, want):
    for name, a, b in zip(("q", "k", "v", "captured"), got, want):
        scale = max(np.abs(b).max(), 1.0)
        np.testing.assert_allclose(a, b, atol=2e-5 * scale, err_msg=name)
    assert np.abs(want[-1]).sum() > 1e-3  # The bias has a gradient.


_VARIABLE_READERS = {
    "closure": lambda v: _closure(v),
    "object": lambda v: _Holder(v),
    "global": lambda v: reads_a_global,
}


@pytest.mark.parametrize("reader", sorted(_VARIABLE_READERS))
def test_a_captured_variable_gets_the_dense_gradient_on_blockwise(reader):
    variable = (
        GLOBAL_SLOPES
        if reader == "global"
        else keras.Variable(SLOPES, name=f"slopes_{reader}")
    )

    def make_fn():
        return _VARIABLE_READERS[reader](variable)

    want = _variable_gradients(make_fn, variable, "dense")
    got = _variable_gradients(make_fn, variable, "blockwise", key_block=128)
    _assert_same(got, want)


@pytest.mark.parametrize("reader", ["closure", "object"])
def test_a_captured_tensor_gets_the_dense_gradient_on_blockwise(reader):
    make_fn = _closure if reader == "closure" else _Holder
    want = _tensor_gradients(make_fn, "dense")
    # One key tile per row (probabilities kept) and several (recomputed
    # from the log-sum-exp).
    for key_block in (1024, 128):
        got = _tensor_gradients(make_fn, "blockwise", key_block=key_block)
        _assert_same(got, want)


class _LearnedDistance(ka.mods.ScoreMod):
    """A relative bias (`relative_bias`: a fast path of the blockwise
    kernel) reading a variable it holds."""

    def __init__(self, slopes):
        self.slopes = slopes

    def relative_bias(self, distance):
        distance = ops.cast(distance, "float32")[None, :]
        return ops.expand_dims(self.slopes, 1) * distance

    def __call__(self, score, batch, head, q_idx, kv_idx):
        return _bias(self.slopes, score, head, q_idx, kv_idx)


_POSITIONS = np.arange(T)[::-1].copy()


@pytest.mark.parametrize("wrapper", ["relative_bias", "at_positions"])
def test_fast_paths_and_position_tables(wrapper):
    """A relative bias's fast path would read the variable where it is:
    the general path runs instead. A position table (`AtPositions`, as a
    rolling cache gives) is seen through."""
    variable = keras.Variable(SLOPES, name=f"slopes_{wrapper}")

    def make_fn():
        if wrapper == "relative_bias":
            return _LearnedDistance(variable)
        return scoring.AtPositions(_closure(variable), _POSITIONS, _POSITIONS)

    want = _variable_gradients(make_fn, variable, "dense")
    got = _variable_gradients(make_fn, variable, "blockwise", key_block=128)
    _assert_same(got, want)


def test_compiled_steps_get_the_dense_gradient_too():
    """Graph tensors and variables read in a `tf.function`."""
    variable = keras.Variable(SLOPES, name="slopes_compiled")

    def make_fn():
        return _closure(variable)

    want = _variable_gradients(make_fn, variable, "dense")
    got = _variable_gradients(
        make_fn, variable, "blockwise", graph=True, key_block=128
    )
    _assert_same(got, want)
    want = _tensor_gradients(_closure, "dense")
    got = _tensor_gradients(_closure, "blockwise", graph=True, key_block=128)
    _assert_same(got, want)


def test_a_tensor_mask_with_a_captured_variable():
    """Tiles skipped at run time (a document mask: `ops.cond` per tile,
    forward and backward) keep the variable's gradient."""
    ids = np.repeat(np.arange(4), T // 4)[None]
    CALL["mask_mod"] = ka.mods.DocumentMask().bind(segment_ids=ids)
    try:
        variable = keras.Variable(SLOPES, name="slopes_documents")

        def make_fn():
            return _closure(variable)

        want = _variable_gradients(make_fn, variable, "dense")
        got = _variable_gradients(
            make_fn, variable, "blockwise", graph=True, key_block=128
        )
        _assert_same(got, want)
    finally:
        CALL.clear()


def test_the_automatic_choice_keeps_blockwise():
    variable = keras.Variable(SLOPES, name="slopes_automatic")
    shapes = []

    def fn(score, batch, head, q_idx, kv_idx):
        shapes.append(tuple(score.shape))
        return _bias(variable, score, head, q_idx, kv_idx)

    q, k = ops.convert_to_tensor(Q), ops.convert_to_tensor(K)
    for score_mod in (fn, _Holder(variable), reads_a_global):
        request = paths.AttentionRequest(q, k, k, score_mod=score_mod)
        assert paths.choose(request) == "blockwise", score_mod
    # It runs so: causal, the score function sees rows of tiles (of 128
    # queries at T = 512), never the (T, T) scores.
    CALL["causal"] = True
    try:
        got = _variable_gradients(lambda: fn, variable, None)
        assert shapes and (T, T) not in [s[-2:] for s in shapes], shapes
        assert any(s[-2] == T // 4 for s in shapes), shapes
        _assert_same(got, _variable_gradients(lambda: fn, variable, "dense"))
    finally:
        CALL.clear()
    # Below the blockwise threshold the choice stays dense.
    q, k = q[:, :64], k[:, :64]
    request = paths.AttentionRequest(q, k, k, score_mod=fn)
    assert paths.choose(request) == "dense"


# A module holding a tensor: `fn` reads it as `_MODULE.slopes`, a place
# no copy of the function can replace.
_MODULE = types.ModuleType("captured_slopes_module")


def reads_a_module_attribute(score, batch, head, q_idx, kv_idx):
    return _bias(_MODULE.slopes, score, head, q_idx, kv_idx)


def _in_module(slopes):
    _MODULE.slopes = slopes
    return reads_a_module_attribute


def test_a_tensor_that_cannot_be_replaced_is_refused_or_goes_dense():
    """Forced "blockwise" refuses it, naming `score_mod`; the automatic
    choice runs "dense", whose gradient reaches it."""
    want = _tensor_gradients(_in_module, "dense")
    got = _tensor_gradients(_in_module, None)
    _assert_same(got, want)
    with pytest.raises(ValueError, match="score_mod=") as error:
        _tensor_gradients(_in_module, "blockwise")
    assert "`_MODULE.slopes`" in str(error.value)
    del _MODULE.slopes


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a `tf.Variable`")
@pytest.mark.parametrize("graph", [False, True])
def test_a_tensorflow_variable_reaches_the_custom_gradient(graph):
    """A `tf.Variable`, even where no copy can replace it, is read inside
    the custom gradient, which gets it (`variables`): the backward pass
    differentiates it; through the run-time tile skipping too."""
    import tensorflow as tf

    _MODULE.slopes = tf.Variable(SLOPES)
    ids = np.repeat(np.arange(4), T // 4)[None]
    CALL["mask_mod"] = ka.mods.DocumentMask().bind(segment_ids=ids)
    try:
        fn = reads_a_module_attribute
        assert captured.refusal(fn) is None
        variable = types.SimpleNamespace(value=_MODULE.slopes)
        want = _variable_gradients(lambda: fn, variable, "dense", graph)
        got = _variable_gradients(
            lambda: fn, variable, "blockwise", graph, key_block=128
        )
        _assert_same(got, want)
    finally:
        CALL.clear()
        del _MODULE.slopes


def test_constants_are_not_passed():
    """A constant tensor carries no gradient: nothing to pass (no
    gradient computed into it per tile)."""
    fn = _closure(ops.convert_to_tensor(SLOPES))
    assert captured.split_captured(fn)[1] == ()
    frozen = keras.Variable(SLOPES, trainable=False)
    assert captured.split_captured(_closure(frozen))[1] == ()
    variable = keras.Variable(SLOPES)
    _, params = captured.split_captured(_Holder(variable))
    assert len(params) == 1
    np.testing.assert_array_equal(np_(params[0]), SLOPES)
