"""Keras helpers shared by the layers, blocks and generation.

Imported as a module (`from keras_attention.utils import keras_utils`),
never through a layer. Argument checks live in `validation`.
"""

import keras
import numpy as np
from keras import ops

try:  # Keras >= 3.6
    from keras.src.backend import get_keras_mask as _get_keras_mask
except ImportError:  # pragma: no cover

    def _get_keras_mask(x):
        return getattr(x, "_keras_mask", None)


try:  # Keras's saving: `.keras` files save and load inside this scope
    from keras.src.backend.common import global_state as _global_state
except ImportError:  # pragma: no cover
    _global_state = None


def keras_mask(x):
    """The Keras mask attached to `x` (eager, traced or symbolic), or None.

    Keras fills a layer's `mask` argument only when the call has exactly
    one tensor argument; with more (`attention_mask=`, `cache=`) it fills
    `<argument>_mask` names instead, so layers read the mask themselves.
    """
    return None if x is None else _get_keras_mask(x)


def clone_initializer(initializer):
    """A fresh copy, so sublayers do not share one (stateless) initializer
    object (Keras would draw the same values for each of them).

    Anything else `keras.initializers.get` accepts, a plain function
    `fn(shape, dtype=None)` (as keras-hub takes), has no config to copy
    and is returned as it is."""
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer
    return initializer.__class__.from_config(initializer.get_config())


def concrete_int(value):
    """`value` as a Python int when it is known now: a Python or NumPy
    integer, or a scalar eager tensor (Keras turns a NumPy scalar call
    argument into one); None for symbolic tensors (traced functions,
    functional models) and anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if getattr(value, "shape", None) is None or len(value.shape):
        return None
    try:
        number = np.asarray(ops.convert_to_numpy(value))
    except Exception:  # noqa: BLE001 - symbolic: no value before it runs.
        return None
    return int(number) if number.dtype.kind in "iu" else None


def first_not_none(*values):
    """The first of `values` that is not None (None if all are)."""
    for value in values:
        if value is not None:
            return value
    return None


def project(fn, x):
    """`fn` (a layer or a matmul) on the last axis; a one-step `(b, 1, d)`
    input runs as `(b, d)`, the plain matmul that XLA differentiates
    inside a decoder's loop."""
    if len(x.shape) == 3 and x.shape[1] == 1:
        # squeeze/expand_dims: gradients are reshapes, not strided slices.
        return ops.expand_dims(fn(ops.squeeze(x, 1)), 1)
    return fn(x)


def slice_axis(x, axis, start, stop):
    """`x[start:stop]` along `axis` through `ops.slice`, or `x` itself when
    that is everything. On TensorFlow this is a contiguous `Slice`, whose
    gradient is a pad: the strided slice that indexing builds, and its
    gradient kernel, took up to 60 ms per call on the rank-5 tiles and key
    windows of the attention paths (T = 8,192)."""
    if start == 0 and isinstance(stop, int) and stop == x.shape[axis]:
        return x
    size = list(ops.shape(x))
    size[axis] = stop - start
    begin = [0] * len(size)
    begin[axis] = start
    return ops.slice(x, begin, size)


def saving_shared_objects():
    """Whether Keras is saving a model with object sharing (`model.save`
    to `.keras` and `load_model`): there, an object that several layers
    hold (one `T5RelativeBias` for every block) must carry its
    `shared_object_id` in every config that holds it, so that it loads
    as one object with one set of weights."""
    if _global_state is None:  # pragma: no cover
        return False
    return (
        _global_state.get_global_attribute("shared_objects/id_to_config_map")
        is not None
    )


def float64_numbers(value):
    """Python numbers (one, or a list or tuple of them) as a NumPy float64
    array, anything else as it is: every backend then converts them in
    float64, not through float32 as TensorFlow converts Python floats
    (`ops.cast(0.1, "float64") - 0.1` is 1.5e-9 there; PyTorch's
    `ops.multiply(x, 0.1)` alike)."""
    items = value if isinstance(value, (list, tuple)) else [value]
    if all(isinstance(x, (int, float)) for x in items):
        return np.asarray(value, "float64")
    return value


def constant(value, dtype):
    """`value` (a scale, a logit: a Python number or a list of them, a
    NumPy value, a tensor) in `dtype`, Python numbers through float64.

    Example:

    >>> import numpy as np
    >>> from keras_attention.utils.keras_utils import constant
    >>> np.asarray(constant([0.5, 2.0], "float32")).tolist()
    [0.5, 2.0]

    On TensorFlow, `constant(0.1, "float64")` is exactly `0.1` where
    `ops.cast(0.1, "float64")` is 1.5e-9 off (through float32).
    """
    return ops.cast(float64_numbers(value), dtype)
