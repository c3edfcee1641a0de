"""Custom gradients per backend (for the kernels' hand-written backward
passes): `custom_vjp`, a function whose gradient is a given backward
pass, and `vjp`, the pullback of a user's function (a score function)
that such a backward pass calls tile by tile.

Part of the package's backend dispatch (with `_backend.py`, which
re-exports both names: the only modules that import TensorFlow, JAX or
PyTorch, lazily, inside the function that needs it). State: PyTorch's
`torch.autograd.Function` of `custom_vjp`, made on first use.
"""

import keras

_TORCH = {}  # "function": the `torch.autograd.Function` of `custom_vjp`


def custom_vjp(forward, backward, all_params=False):
    """A function with a hand-written backward pass, on any backend.

    Args:
        forward: `forward(q, k, v, aux) -> (output, residuals)` (`output`
            a tensor or a tuple of tensors: `backward` then gets a tuple of
            their gradients, None or zeros for an unused one; `residuals`
            a nest of tuples and lists of tensors and other values), or
            `forward(q, k, v, aux, params)` when the function is called
            with `params`.
        backward: `backward(residuals, d_output) -> (dq, dk, dv)`, or
            `(dq, dk, dv, dparams)` (a tuple, one per tensor of `params`)
            when called with `params`. `aux` (masks, offsets: a tuple of
            tensors or None) gets no gradient. On TensorFlow, when
            `forward` reads trainable variables it is not given (a score
            function's), `backward(residuals, d_output,
            variables=variables)` gets them (`tf.custom_gradient`'s
            `variables`) and returns their gradients after those of
            `params`, in `dparams`.
        all_params: bool, whether `q`, `k`, `v` and `params` are every
            differentiable tensor `forward` reads (it reads no trainable
            variable by itself). PyTorch runs `backward` only then: a
            `torch.autograd.Function` gives no gradient to a tensor it is
            not passed, so otherwise PyTorch differentiates `forward` as
            it is.

    Returns:
        `f(q, k, v, aux, params=()) -> output` whose gradient is
        `backward`: the forward's intermediates are not kept for the
        backward pass (TensorFlow: `tf.custom_gradient`, JAX:
        `jax.custom_vjp`, PyTorch with `all_params`: a
        `torch.autograd.Function` whose forward records nothing and
        keeps the residuals alone, upstream gradients of None given as
        zeros; without gradients to take, `forward` runs as it is).
        `params` are further differentiable tensors (a score function's
        weights), passed explicitly: JAX refuses gradients of values a
        custom VJP closes over, and TensorFlow would give them none.
        Other backends (PyTorch without `all_params`) differentiate
        `forward` as it is.
    """

    def fwd(q, k, v, aux, params):
        if params:
            return forward(q, k, v, aux, params)
        return forward(q, k, v, aux)

    def bwd(residuals, d_output, variables=()):
        if variables:
            grads = backward(residuals, d_output, variables=variables)
        else:
            grads = backward(residuals, d_output)
        grads = tuple(grads)
        return grads if len(grads) == 4 else grads + ((),)

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        def f(q, k, v, aux, params=()):
            params = tuple(params)

            @tf.custom_gradient
            def inner(q, k, v, *params):
                output, residuals = fwd(q, k, v, aux, params)

                def grad(*d_outputs, variables=None):
                    # One upstream gradient per output (a tuple output:
                    # the attention and its log-sum-exp).
                    d_output = (
                        d_outputs[0] if len(d_outputs) == 1 else d_outputs
                    )
                    variables = tuple(variables or ())
                    dq, dk, dv, dparams = bwd(residuals, d_output, variables)
                    dparams = tuple(dparams)
                    inputs = (dq, dk, dv) + dparams[: len(params)]
                    if not variables:
                        return inputs
                    return inputs, list(dparams[len(params) :])

                return output, grad

            return inner(q, k, v, *params)

        return f
    if backend == "jax":
        import jax

        @jax.custom_vjp
        def g(q, k, v, aux, params):
            return fwd(q, k, v, aux, params)[0]

        def g_bwd(residuals, d_output):
            dq, dk, dv, dparams = bwd(residuals, d_output)
            return dq, dk, dv, None, tuple(dparams)

        g.defvjp(lambda *args: fwd(*args), g_bwd)
        return lambda q, k, v, aux, params=(): g(q, k, v, aux, tuple(params))
    if backend == "torch" and all_params:
        return _torch_custom_vjp(fwd, bwd)

    return lambda q, k, v, aux, params=(): fwd(q, k, v, aux, tuple(params))[0]


def _torch_custom_vjp(fwd, bwd):
    """`custom_vjp`'s function on PyTorch: `fwd(q, k, v, aux, params) ->
    (output, residuals)`, `bwd(residuals, d_output) -> (dq, dk, dv,
    dparams)`."""
    import torch

    function = _torch_function()

    def f(q, k, v, aux, params=()):
        params = tuple(params)
        tensors = (q, k, v) + params
        needs_grad = torch.is_grad_enabled() and any(
            torch.is_tensor(t) and t.requires_grad for t in tensors
        )
        if not needs_grad:  # Inference: nothing to record or keep.
            return fwd(q, k, v, aux, params)[0]
        return function.apply(fwd, bwd, aux, *tensors)

    return f


def _split(nest, tensors):
    """`nest` (tuples and lists) with each tensor replaced by its index
    in `tensors`, to which it is appended (`_Slot`)."""
    if isinstance(nest, (tuple, list)):
        return type(nest)(_split(x, tensors) for x in nest)
    if keras.ops.is_tensor(nest):
        tensors.append(nest)
        return _Slot(len(tensors) - 1)
    return nest


def _join(template, tensors):
    """`_split`'s inverse."""
    if isinstance(template, (tuple, list)):
        return type(template)(_join(x, tensors) for x in template)
    if isinstance(template, _Slot):
        return tensors[template.index]
    return template


class _Slot:
    """Where `_split` took a tensor out of a nest."""

    def __init__(self, index):
        self.index = index


def _torch_function():
    """The `torch.autograd.Function`: `apply(fwd, bwd, aux, q, k, v,
    *params)`. Its forward runs without recording (autograd's rule for a
    Function) and saves the residuals' tensors alone
    (`save_for_backward`: outputs among them are kept without a
    reference cycle); its backward gets zeros for an output's gradient
    of None (`materialize_grads`, the default)."""
    if "function" in _TORCH:
        return _TORCH["function"]
    import torch

    class CustomVJP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, fwd, bwd, aux, q, k, v, *params):
            output, residuals = fwd(q, k, v, aux, params)
            tensors = []
            ctx.template = _split(residuals, tensors)
            ctx.save_for_backward(*tensors)
            ctx.bwd, ctx.tuple_output = bwd, isinstance(output, tuple)
            ctx.params = len(params)
            return output

        @staticmethod
        def backward(ctx, *d_outputs):
            residuals = _join(ctx.template, ctx.saved_tensors)
            d_output = d_outputs if ctx.tuple_output else d_outputs[0]
            dq, dk, dv, dparams = ctx.bwd(residuals, d_output)
            dparams = tuple(dparams)[: ctx.params]
            return (None, None, None, dq, dk, dv) + dparams

    _TORCH["function"] = CustomVJP
    return CustomVJP


def vjp(fn, primals, variables=()):
    """`fn(*primals)` (one tensor) and its pullback: `pull(cotangent)`
    gives the gradients w.r.t. each of `primals` (zeros for a primal `fn`
    does not use), as `jax.vjp` does, then w.r.t. each of `variables`
    (TensorFlow: variables `fn` reads itself, those a custom gradient
    gets; empty on other backends). For hand-written backward passes
    that must differentiate a user's function (a score function) tile by
    tile: the function runs once, its output serves the backward pass
    and the pullback (call it once)."""
    backend = keras.backend.backend()
    primals, variables = tuple(primals), tuple(variables)
    if variables and backend != "tensorflow":
        raise NotImplementedError(f"variables on the {backend!r} backend")
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            tape.watch(primals + variables)
            out = fn(*primals)

        def pull(cotangent):
            return tuple(
                tape.gradient(
                    out,
                    primals + variables,
                    output_gradients=cotangent,
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
            )

        return out, pull
    if backend == "jax":
        import jax

        out, pull = jax.vjp(fn, *primals)
        return out, lambda cotangent: tuple(pull(cotangent))
    if backend == "torch":
        import torch

        with torch.enable_grad():
            leaves = [p.detach().requires_grad_(True) for p in primals]
            out = fn(*leaves)

        def pull(cotangent):
            if not out.requires_grad:  # `fn` ignores every primal.
                return tuple(torch.zeros_like(p) for p in primals)
            with torch.enable_grad():
                grads = torch.autograd.grad(
                    out, leaves, cotangent, allow_unused=True
                )
            return tuple(
                torch.zeros_like(p) if g is None else g
                for p, g in zip(primals, grads)
            )

        return out.detach(), pull
    raise NotImplementedError(f"vjp on the {backend!r} backend")
