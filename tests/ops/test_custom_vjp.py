"""`_backend.custom_vjp`, a function with a hand-written backward pass, on
each backend: its gradient is the backward's (PyTorch too, with
`all_params`: a `torch.autograd.Function`), for a tuple output with an
unused part, `aux` without a gradient, `params` with theirs, and
residuals nested with other values; without gradients the forward runs
as it is."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.ops import _backend

BACKEND = keras.backend.backend()
# The backward below returns this multiple of the true gradient: a test
# then sees whether it ran (or autograd's derivative of the forward).
FACTOR = 2.0


def forward(q, k, v, aux, params):
    (mask,), (w,) = aux, params
    y = ops.where(mask, q * k + v * w, ops.zeros_like(q))
    return (y, ops.sum(y)), (q, k, v, [mask, w], None, FACTOR)


def backward(residuals, d_output):
    q, k, v, (mask, w), none, factor = residuals
    if none is not None or factor != FACTOR:
        raise ValueError(f"residuals {residuals!r}")
    dy, dz = d_output
    g = ops.where(mask, dy + dz, ops.zeros_like(dy)) * factor
    return g * k, g * q, g * w, (ops.sum(g * v),)


def grads(f, args, dy, with_z):
    """The output `y` and the gradients of `sum(y * dy) (+ z)` w.r.t.
    `args` (q, k, v, w)."""

    def loss(*a):
        y, z = f(*a)
        total = ops.sum(y * ops.convert_to_tensor(dy))
        return (total + z if with_z else total), y

    if BACKEND == "jax":
        import jax

        (_, y), g = jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True)(*args)
        return ops.convert_to_numpy(y), [ops.convert_to_numpy(x) for x in g]
    if BACKEND == "torch":
        import torch

        args = [torch.tensor(a, requires_grad=True) for a in args]
        total, y = loss(*args)
        total.backward()
        return y.detach().numpy(), [a.grad.numpy() for a in args]
    import tensorflow as tf

    args = [tf.constant(a) for a in args]
    with tf.GradientTape() as tape:
        tape.watch(args)
        total, y = loss(*args)
    g = tape.gradient(total, args)
    return y.numpy(), [x.numpy() for x in g]


@pytest.mark.parametrize("with_z", [True, False], ids=["both", "y-only"])
@pytest.mark.parametrize("all_params", [True, False])
def test_gradient_is_the_hand_written_backward(all_params, with_z):
    rng = np.random.default_rng(0)
    q, k, v, dy = rng.normal(size=(4, 3, 5)).astype("float32")
    w = np.float32(0.7)
    mask = rng.random((3, 5)) > 0.3
    f = _backend.custom_vjp(forward, backward, all_params=all_params)
    y, got = grads(
        lambda q, k, v, w: f(q, k, v, (mask,), (w,)), (q, k, v, w), dy, with_z
    )
    # The reference: the gradient in NumPy; an unused `z` adds nothing.
    g = np.where(mask, dy + (1.0 if with_z else 0.0), 0.0)
    want = [g * k, g * q, g * w, np.sum(g * v)]
    np.testing.assert_allclose(y, np.where(mask, q * k + v * w, 0.0), 1e-6)
    # PyTorch without `all_params` differentiates the forward itself.
    factor = 1.0 if BACKEND == "torch" and not all_params else FACTOR
    for got_x, want_x in zip(got, want):
        np.testing.assert_allclose(got_x, factor * want_x, rtol=1e-5)


def test_torch_forward_without_gradients_records_nothing():
    if BACKEND != "torch":
        pytest.skip("PyTorch's autograd")
    import torch

    f = _backend.custom_vjp(forward, backward, all_params=True)
    x = torch.ones((2, 3), requires_grad=True)
    mask = torch.ones((2, 3), dtype=torch.bool)
    y, _ = f(x, x, x, (mask,), (torch.tensor(0.5, requires_grad=True),))
    assert type(y.grad_fn).__name__ == "CustomVJPBackward"
    with torch.no_grad():
        y, z = f(x, x, x, (mask,), (torch.tensor(0.5),))
    assert y.grad_fn is None and not z.requires_grad
    np.testing.assert_allclose(y.numpy(), 1.5)
