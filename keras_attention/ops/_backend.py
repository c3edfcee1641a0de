"""Tiny backend dispatch for what `keras.ops` does not cover."""

import keras


def custom_vjp(forward, backward):
    """A function with a hand-written backward pass, on any backend.

    Args:
        forward: `forward(q, k, v, aux) -> (output, residuals)`.
        backward: `backward(residuals, d_output) -> (dq, dk, dv)`.
            `aux` (masks, offsets: a tuple of tensors or None) gets no
            gradient.

    Returns:
        `f(q, k, v, aux) -> output` whose gradient is `backward`: the
        forward's intermediates are not kept for the backward pass
        (TensorFlow: `tf.custom_gradient`, JAX: `jax.custom_vjp`). Other
        backends differentiate `forward` as it is.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        def f(q, k, v, aux):
            @tf.custom_gradient
            def inner(q, k, v):
                output, residuals = forward(q, k, v, aux)

                def grad(d_output):
                    return backward(residuals, d_output)

                return output, grad

            return inner(q, k, v)

        return f
    if backend == "jax":
        import jax

        @jax.custom_vjp
        def f(q, k, v, aux):
            return forward(q, k, v, aux)[0]

        def f_bwd(residuals, d_output):
            return tuple(backward(residuals, d_output)) + (None,)

        f.defvjp(forward, f_bwd)
        return f

    return lambda q, k, v, aux: forward(q, k, v, aux)[0]


def has_gpu():
    """Whether the backend computes on a GPU (for fused attention kernels)."""
    backend = keras.backend.backend()
    try:
        if backend == "jax":
            import jax

            return jax.default_backend() == "gpu"
        if backend == "torch":
            import torch

            return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no accelerator runtime at all.
        return False
    return False
