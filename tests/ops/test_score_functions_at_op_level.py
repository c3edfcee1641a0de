"""Score functions and score layers given straight to the op.

- A plain function reading a trainable `keras.Variable` it is not given
  (a module global, a default, a bound object, a partial) keeps the
  blockwise path under the automatic choice, whose hand-written backward
  pass gets the variable explicitly (`ops/captured.py`), and its
  gradient reaches the variable as on the dense path.
- A function closing over a *constant* tensor runs forward and backward
  on the forced blockwise path, as on the dense one; one closing over a
  traced tensor (computed inside a differentiated function) gets its
  gradient under the automatic choice.
- `T5RelativeBias` / `ALiBi` passed to the op are built from the query's
  heads, or refused naming `score_mod` when made for other heads.
"""

import functools

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention.ops import captured
from keras_attention.ops import paths

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(0)
# Past the automatic choice's blockwise threshold (b, t, h, d).
T = 192
Q, K, V = (RNG.normal(size=(1, T, 2, 4)).astype("float32") for _ in "qkv")
SLOPES = np.array([0.5, 0.25], "float32")
GLOBAL_SLOPES = keras.Variable(SLOPES, name="global_slopes")
CONSTANT = ops.convert_to_tensor(SLOPES)


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def reads_a_global_variable(score, batch, head, q_idx, kv_idx):
    distance = ops.cast(ops.abs(q_idx - kv_idx), "float32")
    return score - ops.take(GLOBAL_SLOPES, head) * distance


def reads_a_default(score, batch, head, q_idx, kv_idx, slopes=GLOBAL_SLOPES):
    distance = ops.cast(ops.abs(q_idx - kv_idx), "float32")
    return score - ops.take(slopes, head) * distance


def _with_slopes(slopes, score, batch, head, q_idx, kv_idx):
    distance = ops.cast(ops.abs(q_idx - kv_idx), "float32")
    return score - ops.take(slopes, head) * distance


class _Holder:
    def __init__(self, slopes):
        self.slopes = slopes

    def score(self, score, batch, head, q_idx, kv_idx):
        return _with_slopes(self.slopes, score, batch, head, q_idx, kv_idx)


def closes_over_a_constant(score, batch, head, q_idx, kv_idx):
    return _with_slopes(CONSTANT, score, batch, head, q_idx, kv_idx)


def _reference(slopes):
    """Dense NumPy attention with the distance bias."""
    d = Q.shape[-1]
    s = np.einsum("bihd,bjhd->bhij", Q, K) / np.sqrt(d)
    i = np.arange(T)
    s = s - slopes[None, :, None, None] * np.abs(i[:, None] - i[None, :])
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhd->bihd", w, V)


def _gradients(score_mod, variable=None, implementation=None):
    """Output and gradients of sum(out * sin(out)) w.r.t. q, k, v (and
    `variable`)."""

    def attend(*args):
        with ka.ops.implementation_scope(implementation, key_block=64):
            return ka.ops.dot_product_attention(*args, score_mod=score_mod)

    if BACKEND == "tensorflow":
        import tensorflow as tf

        args = [tf.constant(a) for a in (Q, K, V)]
        with tf.GradientTape() as tape:
            tape.watch(args)
            out = attend(*args)
            loss = tf.reduce_sum(out * tf.sin(out))
        targets = args + ([variable.value] if variable is not None else [])
        return np_(out), [np_(g) for g in tape.gradient(loss, targets)]
    if BACKEND == "jax":
        import jax

        def loss(value, *a):
            mapping = [(variable, value)] if variable is not None else []
            with keras.StatelessScope(state_mapping=mapping):
                out = attend(*a)
            return ops.sum(out * ops.sin(out)), out

        value = ops.convert_to_tensor(
            variable.value if variable is not None else 0.0
        )
        grads, out = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(
            value, Q, K, V
        )
        grads = [np_(g) for g in grads]
        return np_(out), grads[1:] + (grads[:1] if variable is not None else [])
    import torch

    args = [torch.tensor(a, requires_grad=True) for a in (Q, K, V)]
    out = attend(*args)
    torch.sum(out * torch.sin(out)).backward()
    grads = [np_(a.grad) for a in args]
    if variable is not None:
        grads.append(np_(variable.value.grad))
        variable.value.grad = None
    return np_(out.detach()), grads


def _variable_readers():
    local = keras.Variable(SLOPES, name="local_slopes")
    return [
        ("global", reads_a_global_variable, GLOBAL_SLOPES),
        ("default", reads_a_default, GLOBAL_SLOPES),
        ("partial", functools.partial(_with_slopes, local), local),
        ("bound", _Holder(local).score, local),
    ]


@pytest.mark.parametrize("case", [0, 1, 2, 3])
def test_a_function_reading_a_variable_keeps_blockwise_with_gradients(case):
    name, fn, variable = _variable_readers()[case]
    assert captured.closes_over_tensors(fn), name
    q, k = ops.convert_to_tensor(Q), ops.convert_to_tensor(K)
    request = paths.AttentionRequest(q, k, k, score_mod=fn)
    choice = paths.choose(request)
    assert choice == "blockwise", name
    out, grads = _gradients(fn, variable)
    np.testing.assert_allclose(out, _reference(SLOPES), atol=2e-5)
    want_out, want = _gradients(fn, variable, implementation="dense")
    for a, b in zip(grads, want):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert np.abs(grads[-1]).sum() > 0  # It reaches the variable.


def test_constants_and_frozen_variables_are_no_variables_to_differentiate():
    frozen = keras.Variable(SLOPES, trainable=False)
    assert not captured.closes_over_tensors(closes_over_a_constant)
    assert not captured.closes_over_tensors(_Holder(CONSTANT).score)
    assert not captured.closes_over_tensors(
        functools.partial(_with_slopes, np.float32(2.0))
    )
    assert not captured.closes_over_tensors(_Holder(frozen).score)


def test_a_function_closing_over_a_constant_runs_blockwise_both_ways():
    out, grads = _gradients(closes_over_a_constant, implementation="blockwise")
    np.testing.assert_allclose(out, _reference(SLOPES), atol=2e-5)
    want_out, want = _gradients(closes_over_a_constant, implementation="dense")
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    for a, b in zip(grads, want):
        np.testing.assert_allclose(a, b, atol=2e-5)


def _traced_gradient(implementation):
    """Gradient w.r.t. a variable of a loss whose score function closes
    over a tensor computed from the variable inside the differentiated
    (traced) function: a `tf.function`, `jax.grad`, torch autograd."""
    variable = keras.Variable(SLOPES, name="traced_slopes")

    def loss_of(value):
        slopes = value * 1.0  # A tensor, not the variable.

        def fn(score, batch, head, q_idx, kv_idx):
            return _with_slopes(slopes, score, batch, head, q_idx, kv_idx)

        with ka.ops.implementation_scope(implementation, key_block=64):
            out = ka.ops.dot_product_attention(Q, K, V, score_mod=fn)
        return ops.sum(out * ops.sin(out))

    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = loss_of(variable.value)
            return tape.gradient(loss, variable.value)

        return np_(step())
    if BACKEND == "jax":
        import jax

        return np_(jax.grad(loss_of)(ops.convert_to_tensor(SLOPES)))
    import torch

    value = torch.tensor(SLOPES, requires_grad=True)
    loss_of(value).backward()
    return np_(value.grad)


def test_a_function_closing_over_a_traced_tensor_gets_its_gradient():
    """The automatic choice cannot tell a traced tensor from a constant
    one: it may carry a gradient, so the blockwise path passes it to its
    backward pass explicitly."""
    want = _traced_gradient("dense")
    assert np.abs(want).sum() > 0
    np.testing.assert_allclose(
        _traced_gradient(None), want, atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("implementation", ["dense", "blockwise"])
def test_score_layers_passed_to_the_op_are_built_from_the_query(
    implementation,
):
    q, k, v = (x[:, :16] for x in (Q, K, V))
    for layer in (ka.scores.T5RelativeBias(), ka.scores.ALiBi()):
        with ka.ops.implementation_scope(implementation, key_block=8):
            out = ka.ops.dot_product_attention(q, k, v, score_mod=layer)
        assert layer.built and layer.num_heads == 2
        assert tuple(out.shape) == q.shape
        assert np.isfinite(np_(out)).all()
    bias = ka.scores.T5RelativeBias(num_heads=2)
    out = ka.ops.dot_product_attention(q, k, v, score_mod=bias)
    assert tuple(bias.embeddings.shape) == (32, 2)
    # The same as an attention layer's table would give: the layer's own
    # score function on the dense path.
    with ka.ops.implementation_scope("dense"):
        want = ka.ops.dot_product_attention(q, k, v, score_mod=bias)
    np.testing.assert_allclose(np_(out), np_(want), atol=1e-6)


def test_score_layers_passed_to_local_attention_are_built_too():
    q, k, v = (x[:, :12] for x in (Q, K, V))
    for layer in (ka.scores.T5RelativeBias(), ka.scores.ALiBi()):
        out = ka.ops.local_attention(q, k, v, window_size=3, score_mod=layer)
        assert layer.built and layer.num_heads == 2
        assert np.isfinite(np_(out)).all()
    with pytest.raises(ValueError, match="score_mod"):
        ka.ops.local_attention(
            q, k, v, window_size=3, score_mod=ka.scores.ALiBi(num_heads=4)
        )


def test_a_score_layer_for_other_heads_is_refused():
    q, k, v = (x[:, :8] for x in (Q, K, V))
    for layer in (
        ka.scores.T5RelativeBias(num_heads=3),
        ka.scores.ALiBi(num_heads=4),
    ):
        with pytest.raises(ValueError, match="score_mod") as error:
            ka.ops.dot_product_attention(q, k, v, score_mod=layer)
        assert "heads" in str(error.value)


def test_calling_an_unbuilt_t5_bias_directly():
    grid = [ops.zeros((1, 1, 1, 1), "int32")] * 4
    score = ops.zeros((1, 2, 1, 1))
    out = ka.scores.T5RelativeBias(num_heads=2)(score, *grid)
    assert tuple(out.shape) == (1, 2, 1, 1)
    with pytest.raises(ValueError, match="num_heads=None"):
        ka.scores.T5RelativeBias()(score, *grid)
