"""Tiny backend dispatch for what `keras.ops` does not cover.

The home of backend-specific code, with the `_backend_*` modules beside
it (FlexAttention's kernel and block masks: `_backend_flex.py`; custom
gradients, `custom_vjp` and `vjp`: `_backend_autograd.py`): the only
modules that import TensorFlow, JAX or PyTorch, lazily, inside the
function that needs it.
Layers and generation reach it through the names `keras_attention.ops`
re-exports (`scan_carry`, `compile_step`).
"""

import contextlib

import keras
import ml_dtypes
import numpy as np

# Custom gradients (re-exported: the kernels call `_backend.custom_vjp`).
from keras_attention.ops._backend_autograd import custom_vjp  # noqa: F401
from keras_attention.ops._backend_autograd import vjp  # noqa: F401

try:  # Keras's list of the variables a stateless scope deferred
    from keras.src.backend.common import global_state as _global_state
except ImportError:  # pragma: no cover
    _global_state = None


def broadcast_add(x, y):
    """`x + y` with NumPy broadcasting, on every backend.

    `keras.ops.add` on TensorFlow (Keras 3.15) takes a `y` with a single
    dimension larger than 1 for a bias when that size equals `x`'s axis 1
    or last axis, and adds it along that axis (`tf.nn.bias_add`), whatever
    broadcasting says: a `(heads, 1)` bias on `(batch, T, heads, 1)` with
    `T == heads` is added along T, silently. `tf.add` broadcasts right.
    `keras.layers.EinsumDense` adds its bias so (the projections of a
    `key_dim=1` head): the layers use `layers/_einsum_dense.py`, which adds
    it here.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.add(x, y)
    return keras.ops.add(x, y)


def tanh_grad(t, d):
    """`d * (1 - t ** 2)`: the gradient through `t = tanh(x)` from `t`
    (one fused op on TensorFlow, `TanhGrad`; XLA and PyTorch fuse or run
    the elementwise form)."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.raw_ops.TanhGrad(y=t, dy=d)
    return d * (1.0 - t * t)


def segment_sum(data, segment_ids, num_segments):
    """`keras.ops.segment_sum` in the data's dtype: Keras's torch segment
    reductions compute in float32 (`data.float()`), which float64 data
    would lose its precision to; there, an `index_add` in float64."""
    dtype = keras.backend.standardize_dtype(data.dtype)
    if keras.backend.backend() != "torch" or dtype != "float64":
        return keras.ops.segment_sum(
            data, segment_ids, num_segments=num_segments
        )
    import torch

    data = keras.ops.convert_to_tensor(data)
    ids = keras.ops.convert_to_tensor(segment_ids).long()
    shape = (int(num_segments),) + tuple(data.shape[1:])
    out = torch.zeros(shape, dtype=data.dtype, device=data.device)
    return out.index_add(0, ids, data)


def _tf_in_place():
    """Whether TensorFlow runs `scatter_add` in place by hand here: not
    while XLA compiles (it has no `DeepCopy`, and updates in place
    itself). Not converted by AutoGraph (a Python check at trace time)."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    @tf.autograph.experimental.do_not_convert
    def check():
        graph = tf.compat.v1.get_default_graph()
        return not control_flow_util.GraphOrParentsInXlaContext(graph)

    return check()


def loops_run_eagerly():
    """Whether the kernels' tile loops (`keras.ops.fori_loop`, `scan`)
    run step by step, each op apart: PyTorch's (unless the caller
    compiles), not XLA's (TensorFlow's compiled loops, JAX's `jit`).
    Eager loops prefer fewer, larger tiles: top-k attention's backward
    ran 2.5x faster on its forward's tiles (2^23 gathered elements) than
    on the 2^21 of XLA's loops (T = 2,048, top-k 256, one key/value head,
    a rough 2-core measurement)."""
    return keras.backend.backend() == "torch"


def single_query_by_matmul(key_value_heads):
    """Whether the dense path takes one query's products with `(b, Tk, g,
    d)` keys and values as matmuls over all `g` heads (each head's block
    kept: `g` times the arithmetic, no copy into a matmul layout). At
    32,768 keys: TensorFlow 1.4-4.2x faster (with or without XLA), JAX
    1.2-2.7x to 4 key/value heads, slower from 8; PyTorch slower."""
    name = keras.backend.backend()
    return name == "tensorflow" or (name == "jax" and key_value_heads <= 4)


def zeros_accumulator(shape, dtype):
    """Zeros for `scatter_add` to accumulate into: on TensorFlow a buffer
    no other tensor shares (`DeepCopy`: a constant folded or shared zeros
    would be overwritten in place)."""
    zeros = keras.ops.zeros(shape, dtype)
    if keras.backend.backend() != "tensorflow" or not _tf_in_place():
        return zeros
    import tensorflow as tf

    return tf.raw_ops.DeepCopy(x=zeros)


def scatter_add(accumulator, ids, updates):
    """`accumulator` `(rows, ...)` with `updates` `(n, ...)` added to its
    rows `ids` `(n,)` (repeats add up), in place: an accumulation in a
    loop costs its updates, not a copy of the accumulator per step.

    The accumulator is consumed: it must come from `zeros_accumulator`
    or an earlier `scatter_add`, and not be read again. TensorFlow:
    `InplaceAdd`, which adds into its input's buffer (its CPU kernel row
    by row, so repeats add up); `tensor_scatter_nd_add` or `segment_sum`
    + add copy the accumulator every step (a loop of `Tq / tile` steps
    then costs O(Tq Tk)); under XLA, `tensor_scatter_nd_add`, which XLA
    updates in place. JAX: `.at[ids].add` (in place too); PyTorch:
    `index_add_` with int32 ids (its CPU kernel scatters int64 ids with
    repeats 15-30x slower: 130 ms against 5 ms for 16,384 rows of 64)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if not _tf_in_place():
            ids = ids[:, None]
            return tf.tensor_scatter_nd_add(accumulator, ids, updates)
        return tf.raw_ops.InplaceAdd(x=accumulator, i=ids, v=updates)
    if backend == "jax":
        return accumulator.at[ids].add(updates)
    if backend == "torch":
        import torch

        ids = keras.ops.convert_to_tensor(ids).to(torch.int32)
        return keras.ops.convert_to_tensor(accumulator).index_add_(
            0, ids, keras.ops.convert_to_tensor(updates)
        )
    raise NotImplementedError(f"scatter_add on the {backend!r} backend")


def take_rows(x, ids):
    """`keras.ops.take(x, ids, axis=0)` for `ids` known to lie in `[0,
    rows)`: on PyTorch `index_select` with the ids as they are (Keras's
    `take` first casts them to int64 and wraps negative ones: four
    passes over the ids, as long as the gather itself for rows of 64)."""
    if keras.backend.backend() != "torch":
        return keras.ops.take(x, ids, axis=0)
    import torch

    x, ids = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(ids)
    if ids.dtype not in (torch.int32, torch.int64):
        ids = ids.to(torch.int64)
    rows = torch.index_select(x, 0, ids.reshape(-1))
    return rows.reshape(tuple(ids.shape) + tuple(x.shape[1:]))


def write_slice(buffer, start, update):
    """`keras.ops.slice_update(buffer, start, update)`, in place on
    PyTorch, whose Keras `slice_update` copies the whole buffer (a loop
    writing `n` tiles into it copied it `n` times); the buffer is
    consumed, as `scatter_add`'s accumulator. Other backends update in
    place under their compilers themselves."""
    if keras.backend.backend() != "torch":
        return keras.ops.slice_update(buffer, start, update)
    buffer = keras.ops.convert_to_tensor(buffer)
    update = keras.ops.convert_to_tensor(update)
    index = tuple(slice(a, a + n) for a, n in zip(start, update.shape))
    buffer[index] = update
    return buffer


def cumsum(x, axis):
    """`keras.ops.cumsum` in the input's dtype: Keras's torch `cumsum`
    returns float32 for float64 inputs (its dtype promotion reads torch's
    dtypes as float32); there, `torch.cumsum` itself."""
    if keras.backend.backend() != "torch":
        return keras.ops.cumsum(x, axis=axis)
    import torch

    return torch.cumsum(keras.ops.convert_to_tensor(x), dim=axis)


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


def is_symbolic(x):
    """Whether `x` is a tensor without values: a `keras.KerasTensor`, a
    TensorFlow graph tensor or a JAX tracer."""
    if isinstance(x, keras.KerasTensor):
        return True
    module = type(x).__module__
    if module.startswith("tensorflow"):
        import tensorflow as tf

        return tf.is_tensor(x) and tf.is_symbolic_tensor(x)
    if module.startswith("jax"):
        import jax

        return isinstance(x, jax.core.Tracer)
    return False


def is_recorded(x):
    """Whether `x` is a TensorFlow eager tensor that a gradient tape
    records (watched, or computed from a watched tensor): it carries a
    gradient though it has values. False on other backends (their
    tensors say so themselves: `requires_grad`, a tracer)."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.eager import record

    if not isinstance(x, tf.Tensor) or tf.is_symbolic_tensor(x):
        return False
    return bool(record.should_record_backprop([x]))


def is_variable(x):
    """Whether `x` is a backend variable that a custom gradient gets by
    itself when its forward pass reads it: a `tf.Variable`
    (`tf.custom_gradient`'s `variables`). False on other backends."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return isinstance(x, tf.Variable)


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


def fused_attention_upcasts(dtype):
    """Whether the fused path computes float16 / bfloat16 inputs in
    float32 on this backend: TensorFlow's kernel forms low-precision
    scores in the input dtype, and Keras's torch backend turns a boolean
    mask into an additive one in float16 (-45850, which float32 scores of
    large float16 inputs exceed); JAX's and cuDNN's kernels accumulate in
    float32 themselves."""
    if dtype not in ("float16", "bfloat16"):
        return False
    backend = keras.backend.backend()
    return backend == "tensorflow" or (
        backend == "torch" and dtype == "float16"
    )


CUDNN_DTYPES = ("float16", "bfloat16")  # What cuDNN's flash kernel takes.


def cudnn_available(dtype):
    """Whether `jax.nn.dot_product_attention(implementation="cudnn")` may
    run inputs of `dtype`: the JAX backend on a GPU, `CUDNN_DTYPES`."""
    dtype = keras.backend.standardize_dtype(dtype)
    jax = keras.backend.backend() == "jax"
    return jax and has_gpu() and dtype in CUDNN_DTYPES


def cudnn_attention(query, key, value, arguments, probe=False):
    """`jax.nn.dot_product_attention(..., implementation="cudnn",
    **arguments)` on `(b, T, h, d)` inputs; with `probe`, whether cuDNN
    takes them (its checks run while tracing: `jax.eval_shape`)."""
    import jax

    lengths = {k: v for k, v in arguments.items() if k.endswith("lengths")}
    static = {k: v for k, v in arguments.items() if k not in lengths}

    def attend(q, k, v, lengths):
        return jax.nn.dot_product_attention(
            q, k, v, implementation="cudnn", **static, **lengths
        )

    if not probe:
        return attend(query, key, value, lengths)
    specs = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
        (query, key, value, lengths),
    )
    try:
        jax.eval_shape(attend, *specs)
    except Exception:  # noqa: BLE001 - cuDNN refuses these inputs.
        return False
    return True


def fused_mask_broadcasts():
    """Whether this backend's `keras.ops.dot_product_attention` takes a
    mask with broadcast query / key axes (`(b|1, h|1, 1, j)`); the others
    want them spelled out."""
    return keras.backend.backend() == "torch"


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
    fails). Other backends run `keras.ops.scan`. A loop of 0 steps known
    when tracing returns `init` and empty histories (PyTorch's
    `keras.ops.scan` cannot stack no step).
    """
    if keras.tree.flatten(xs)[0].shape[0] == 0:
        return init, keras.tree.map_structure(
            lambda c: keras.ops.zeros(
                (0,) + tuple(keras.ops.shape(c)), c.dtype
            ),
            init,
        )
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


def compiled_kernel(fn, static_argnames=()):
    """`fn` (a kernel: tensors in, tensors out) compiled once per input
    shape on JAX, where eager calls otherwise compile every operation
    apart (and `keras.ops.scan` retraces its loop at every call): eager
    calls then run one cached program, and a call inside the caller's own
    `jax.jit` (or `grad`) inlines it. `static_argnames`: the arguments
    that are Python values (sizes), one program per value. Other
    backends: `fn` itself."""
    if keras.backend.backend() != "jax":
        return fn
    import jax

    return jax.jit(fn, static_argnames=static_argnames)


def compile_step(step, jit_compile, autograph=True):
    """`step` as one compiled function on the current backend.

    Args:
        step: a function of tensors (a decoding loop, a training step).
        jit_compile: bool, compile with XLA.
        autograph: bool, on TensorFlow, whether AutoGraph converts Python
            control flow on tensors (`if`/`while` on tensor values) into
            graph ops. A step written with `keras.ops` control flow only
            (`ops.while_loop`, `ops.cond`: every backend runs it) needs
            none, and traces faster without it.

    Returns:
        On TensorFlow, `tf.function(step, jit_compile=jit_compile,
        autograph=autograph)` (a graph, traced once per input signature);
        on the other backends `step` as it is (JAX and PyTorch run it
        eagerly, or under the caller's own `jax.jit` / `torch.compile`).
    """
    if keras.backend.backend() != "tensorflow":
        return step
    import tensorflow as tf

    return tf.function(step, jit_compile=jit_compile, autograph=autograph)


@contextlib.contextmanager
def zeros_for_initializers():
    """A context in which new variables start as zeros, their
    initializers never drawn: for a model whose every weight is assigned
    next (a checkpoint being loaded).

    On JAX, drawing a random initializer holds the key-derived bits and a
    float32 draw beside each weight (a bfloat16 model built at random
    peaks at about twice its size; issue 55's loading goal is 1.3x). The
    build therefore runs in a `keras.StatelessScope`, where Keras defers
    every variable's initialization, and the deferred initializers are
    replaced by zeros before the scope initializes them on exit. On the
    other backends (each variable drawn and freed as it is made: no
    excess) the build runs as it is.
    """
    if keras.backend.backend() != "jax" or _global_state is None:
        yield
        return
    with keras.StatelessScope():
        yield
        pending = _global_state.get_global_attribute("uninitialized_variables")
        for variable in pending or ():
            variable._initializer = keras.initializers.Zeros()


# Compiled slice writers of the JAX backend, one per axis.
_JAX_SLICE_WRITERS = {}


def assign_slice(variable, value, start, axis=0):
    """Writes `value` into `variable` from index `start` along `axis`
    (its other axes whole), in the variable's own buffer: no copy of the
    whole variable is made, so a checkpoint's tensor can be loaded chunk
    by chunk beside the model's weights
    (`keras_attention.interop.from_huggingface`).

    Args:
        variable: a `keras.Variable`.
        value: a NumPy array (or array-like) of the variable's shape but
            along `axis`, where it has the written length; cast to the
            variable's dtype.
        start: int, the first index written along `axis`.
        axis: int, the axis the slice runs along.

    TensorFlow writes a strided-slice assignment into the variable's
    buffer; PyTorch copies into a view of its parameter; JAX's arrays are
    immutable: a compiled `dynamic_update_slice` that donates the
    variable's array (XLA updates that buffer). Another backend assigns
    the whole variable.

    Raises:
        ValueError: `value` does not fit the variable there.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> from keras_attention.ops import assign_slice
    >>> v = keras.Variable(np.zeros((2, 3), "float32"))
    >>> assign_slice(v, [[1.0], [2.0]], start=1, axis=1)
    >>> keras.ops.convert_to_numpy(v)
    array([[0., 1., 0.],
           [0., 2., 0.]], dtype=float32)
    """
    dtype = keras.backend.standardize_dtype(variable.dtype)
    value = np.asarray(value, np.dtype(getattr(ml_dtypes, dtype, dtype)))
    shape = tuple(variable.shape)
    axis = axis + len(shape) if axis < 0 else axis
    fits = 0 <= axis < len(shape) and value.ndim == len(shape)
    if fits:
        want = shape[:axis] + (value.shape[axis],) + shape[axis + 1 :]
        fits = value.shape == want and 0 <= start <= start + want[axis]
        fits = fits and start + want[axis] <= shape[axis]
    if not fits:
        raise ValueError(
            f"A value of shape {value.shape!r} at start={start!r} along "
            f"axis={axis!r} does not fit variable {variable.path!r} of "
            f"shape {shape!r}."
        )
    index = [slice(None)] * len(shape)
    index[axis] = slice(start, start + value.shape[axis])
    backend = keras.backend.backend()
    if backend == "tensorflow":
        _tf_assign_slice(variable.value, value, start, axis)
    elif backend == "torch":
        _torch_assign_slice(variable.value, value, start, axis)
    elif backend == "jax":
        import jax

        if axis not in _JAX_SLICE_WRITERS:
            _JAX_SLICE_WRITERS[axis] = jax.jit(
                lambda x, piece, at: jax.lax.dynamic_update_slice_in_dim(
                    x, piece, at, axis
                ),
                donate_argnums=0,
            )
        variable.assign(_JAX_SLICE_WRITERS[axis](variable.value, value, start))
    else:
        whole = keras.ops.convert_to_numpy(variable).copy()
        whole[tuple(index)] = value
        variable.assign(whole)


def _tf_assign_slice(variable, value, start, axis):
    """The strided-slice assignment op itself: slicing the `tf.Variable`
    (`variable[...].assign`) reads it first, and the write then copies
    the whole buffer that read still shares."""
    import tensorflow as tf

    begin = [0] * value.ndim
    begin[axis] = start
    end = list(variable.shape)
    end[axis] = start + value.shape[axis]
    tf.raw_ops.ResourceStridedSliceAssign(
        ref=variable.handle,
        begin=begin,
        end=end,
        strides=[1] * value.ndim,
        value=tf.convert_to_tensor(value),
    )


def _torch_assign_slice(parameter, value, start, axis):
    import torch

    if value.dtype.name == "bfloat16":  # NumPy's (ml_dtypes) bfloat16
        tensor = torch.from_numpy(np.ascontiguousarray(value).view(np.int16))
        tensor = tensor.view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(np.ascontiguousarray(value))
    with torch.no_grad():
        parameter.narrow(axis, start, value.shape[axis]).copy_(tensor)
