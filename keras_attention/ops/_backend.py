"""Tiny backend dispatch for what `keras.ops` does not cover.

The one home of backend-specific code (the only module that imports
TensorFlow, JAX or PyTorch, lazily, inside the function that needs it).
Layers and generation reach it through the names `keras_attention.ops`
re-exports (`scan_carry`, `compile_step`).
"""

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


def after(tensors, dependencies):
    """`tensors` (a tuple), computed only after `dependencies` (a list of
    tensors; None entries ignored).

    A TensorFlow graph runs independent ops in any order: the blockwise
    path chains its rows of tiles this way so that one row's tiles are
    alive at a time (memory O(T * tile), not O(T^2) in scattered tiles).
    Other backends run eagerly or schedule under XLA: `tensors` as they
    are.
    """
    dependencies = [d for d in dependencies if d is not None]
    if keras.backend.backend() != "tensorflow" or not dependencies:
        return tuple(tensors)
    import tensorflow as tf

    with tf.control_dependencies(dependencies):
        return tuple(tf.identity(t) for t in tensors)


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


def prefers_fused_attention():
    """Whether `keras.ops.dot_product_attention` is this backend's fastest
    attention when no weights are needed: on a GPU (JAX, PyTorch: flash /
    cuDNN kernels) and on PyTorch's CPU too, whose
    `scaled_dot_product_attention` has fused CPU kernels, forward and
    backward (2-16x faster than the blockwise path at T = 128-2048,
    measured with `benchmarks/attention_paths.py`)."""
    return keras.backend.backend() == "torch" or has_gpu()


# `scan_carry` unrolls TensorFlow loops of at most this many static steps.
_UNROLL_MAX_STEPS = 64


def scan_carry(f, init, xs):
    """`keras.ops.scan` for a loop body whose outputs are its new carry.

    Args:
        f: `f(carry, x) -> (new_carry, ys)`, where `ys` has the structure
            of `carry` (a nest of tensors).
        init: the initial carry (a nest of tensors).
        xs: a tensor, or a nest of tensors, whose first axis is scanned
            (`(steps, ...)`); `f` gets one step of it, with its structure.

    Returns:
        `(final_carry, stacked_ys)`: the last carry, and every step's `ys`
        stacked on a new first axis (`(steps, ...)` for each leaf).

    On TensorFlow, a loop of at most `_UNROLL_MAX_STEPS` steps known when
    tracing is unrolled (a `tf.while_loop` pays per step for its control
    flow and, differentiated, for stacking every intermediate: the
    translate example's decoder trained 1.1x slower than the same network
    unrolled); a longer or unknown one is a `tf.while_loop` with
    `maximum_iterations`, which XLA needs to differentiate through the
    loop (`keras.ops.scan` sets none, so `jit_compile=True` training
    fails). Other backends run `keras.ops.scan`.
    """
    if keras.backend.backend() != "tensorflow":
        return keras.ops.scan(f, init, xs)
    import tensorflow as tf

    leaves = [tf.convert_to_tensor(x) for x in tf.nest.flatten(xs)]
    steps = leaves[0].shape[0]
    if steps is not None and 0 < steps <= _UNROLL_MAX_STEPS:
        # One unstack per input (not a slice per step and input).
        per_step = list(zip(*(tf.unstack(x, num=steps) for x in leaves)))
        carry, history = init, []
        for step in per_step:
            carry, ys = f(carry, tf.nest.pack_sequence_as(xs, list(step)))
            history.append(tf.nest.flatten(ys))
        stacked = [tf.stack(ys) for ys in zip(*history)]
        return carry, tf.nest.pack_sequence_as(init, stacked)

    n = tf.shape(leaves[0])[0]
    xs_arrays = [
        tf.TensorArray(x.dtype, size=n, element_shape=x.shape[1:]).unstack(x)
        for x in leaves
    ]
    flat = [tf.convert_to_tensor(c) for c in tf.nest.flatten(init)]
    arrays = [
        tf.TensorArray(c.dtype, size=n, element_shape=c.shape) for c in flat
    ]

    def pack(leaves):
        return tf.nest.pack_sequence_as(init, leaves)

    def body(i, carry, arrays):
        x_i = tf.nest.pack_sequence_as(xs, [a.read(i) for a in xs_arrays])
        carry, ys = f(pack(carry), x_i)
        arrays = [a.write(i, y) for a, y in zip(arrays, tf.nest.flatten(ys))]
        return i + 1, tf.nest.flatten(carry), arrays

    _, carry, arrays = tf.while_loop(
        lambda i, carry, arrays: i < n,
        body,
        (tf.constant(0), flat, arrays),
        maximum_iterations=n,
    )
    return pack(carry), pack([a.stack() for a in arrays])


def compile_step(step, jit_compile):
    """`step` as one compiled function on the current backend.

    Args:
        step: a function of tensors (a decoding loop, a training step).
        jit_compile: bool, compile with XLA.

    Returns:
        On TensorFlow, `tf.function(step, jit_compile=jit_compile)` (a graph,
        traced once per input signature); on the other backends `step` as
        it is (JAX and PyTorch run it eagerly, or under the caller's own
        `jax.jit` / `torch.compile`).
    """
    if keras.backend.backend() != "tensorflow":
        return step
    import tensorflow as tf

    return tf.function(step, jit_compile=jit_compile)
