"""Argument checks of the generators (private to `generation`).

Each check raises `ValueError` naming the argument as the user wrote it
and showing the value received (with `repr`), before any graph is built.
Values are checked where they are known: NumPy arrays, Python lists and
eager tensors. Symbolic tensors (a `tf.function` graph, a `jax.jit`
trace, a `keras.KerasTensor`) have only a shape and a dtype to check.
"""

import inspect

import keras
import numpy as np
from keras import ops

from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)
from keras_attention.ops import is_symbolic as _is_symbolic

# Token ids travel as int32 tensors.
INT32_LIMIT = 2**31


def is_integer(value):
    """Whether `value` is a Python or NumPy integer (bools are not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    )


def vocabulary_size(layer):
    """How many token ids the embedding `layer` can look up, or None when
    that is unknown (a layer of another kind, a plain callable)."""
    if isinstance(layer, TokenAndPositionEmbedding):
        return layer.vocabulary_size
    if isinstance(layer, keras.layers.Embedding):  # keras_hub's too
        return layer.input_dim
    return None


def _id_range(vocabulary):
    if vocabulary is None:
        return "a non-negative integer below 2**31 (int32)"
    return f"an integer in [0, {vocabulary!r}) (the vocabulary size)"


def check_token_id(name, value, vocabulary=None):
    """Returns the token id `value` as a Python int: a Python or NumPy
    integer in `[0, vocabulary)` (`[0, 2**31)` when `vocabulary` is
    None)."""
    limit = INT32_LIMIT if vocabulary is None else vocabulary
    if not is_integer(value) or not 0 <= value < limit:
        raise ValueError(
            f"`{name}` must be a token id: {_id_range(vocabulary)}. "
            f"Received: {name}={value!r}"
        )
    return int(value)


def check_stop_token_ids(value, vocabulary=None):
    """Returns `stop_token_ids` as a tuple of Python ints, or None (for
    None or an empty sequence: no stop token)."""
    is_sequence = isinstance(value, (tuple, list)) or (
        isinstance(value, np.ndarray) and value.ndim == 1
    )
    if value is None or (is_sequence and len(value) == 0):
        return None
    limit = INT32_LIMIT if vocabulary is None else vocabulary
    if not is_sequence or not all(
        is_integer(v) and 0 <= v < limit for v in value
    ):
        raise ValueError(
            "`stop_token_ids` must be None or a tuple of token ids, each "
            f"{_id_range(vocabulary)}; for one id write `(end_id,)`. "
            f"Received: stop_token_ids={value!r}"
        )
    return tuple(int(v) for v in value)


def check_callable(name, value):
    """Raises `ValueError` naming `name` unless `value` is callable."""
    if not callable(value):
        raise ValueError(
            f"`{name}` must be a layer or a callable. "
            f"Received: {name}={value!r}"
        )
    return value


def takes_start_index(fn):
    """Whether the layer (its `call`) or callable `fn` takes
    `start_index`."""
    call = fn.call if isinstance(fn, keras.layers.Layer) else fn
    try:
        parameters = inspect.signature(call).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return "start_index" in parameters


def is_symbolic(x):
    """Whether `x` is a tensor without values: a `keras.KerasTensor`, a
    TensorFlow graph tensor or a JAX tracer (`ops.is_symbolic`)."""
    return _is_symbolic(x)


def _values(name, x):
    """`x` as a NumPy array, or None when it is symbolic."""
    if is_symbolic(x):
        return None
    try:
        values = (
            ops.convert_to_numpy(x)
            if ops.is_tensor(x) or hasattr(x, "__array__")
            else np.asarray(x)
        )
    except ValueError:  # a ragged list
        raise ValueError(
            f"`{name}` must be a rectangular array, the same length in "
            f"every row. Received: {name}={x!r}"
        ) from None
    if values.size == 0 and values.dtype.kind == "f":
        values = values.astype("int32")  # `[]`: an empty prompt
    return values


def _dtype_name(dtype):
    """`dtype` by Keras's name (`"float32"`), or as it is (`<U3`)."""
    try:
        return keras.backend.standardize_dtype(dtype)
    except ValueError:  # strings, objects
        return str(dtype)


def _is_integer_dtype(dtype):
    return _dtype_name(dtype).startswith(("int", "uint"))


def _shown(x, values, dtype):
    """How to show a refused `x` after `name`: an array's values (up to 64
    of them), shape and dtype; a tensor's shape and dtype; anything else
    (a string, None, a number) as it is."""
    dtype = _dtype_name(dtype)
    if isinstance(x, (np.ndarray, list, tuple)) or ops.is_tensor(x):
        shape = tuple(x.shape) if values is None else values.shape
        if values is not None and values.size <= 64:
            return f"={values!r} (shape {shape!r}, dtype {dtype})"
        return f".shape={shape!r} (dtype {dtype})"
    return f"={x!r}"


def check_token_ids(name, token_ids, vocabulary=None, ranks=(1, 2)):
    """Checks token ids of one of the `ranks` (`(length,)` for one
    sequence, `(batch, length)` for a batch).

    Returns `(token_ids, values)`: the ids as an int32 tensor, and their
    values as a NumPy array (None for a symbolic tensor, whose values are
    not checked).
    """
    values = _values(name, token_ids)
    if values is None:
        shape, dtype = tuple(token_ids.shape), token_ids.dtype
    else:
        shape, dtype = values.shape, values.dtype
    if len(shape) not in ranks or not _is_integer_dtype(dtype):
        raise ValueError(
            f"`{name}` must be integer token ids of shape (batch, length), "
            "or (length,) for one sequence. "
            f"Received: {name}{_shown(token_ids, values, dtype)}"
        )
    if len(shape) == 2 and shape[0] == 0:
        raise ValueError(
            f"`{name}` must hold at least one sequence. "
            f"Received: {name}.shape={shape!r}"
        )
    if values is None:
        return ops.cast(token_ids, "int32"), None
    limit = INT32_LIMIT if vocabulary is None else vocabulary
    bad = (values < 0) | (values >= limit)
    if np.any(bad):
        raise ValueError(
            f"`{name}` must hold token ids, each {_id_range(vocabulary)}. "
            f"Received: {name} holding {sorted(set(values[bad].tolist()))!r}"
        )
    values = values.astype("int32")
    return ops.convert_to_tensor(values, "int32"), values


def check_prompt_mask(mask, shape, ids_name):
    """Checks `padding_mask` against the prompts' shape `shape`.

    Returns `(mask, values)`: a boolean tensor, and its values (None for a
    symbolic tensor).
    """
    values = _values("padding_mask", mask)
    if values is None:
        mask_shape, dtype = tuple(mask.shape), mask.dtype
    else:
        mask_shape, dtype = values.shape, values.dtype
    same = len(mask_shape) == len(shape) and all(
        m is None or s is None or m == s for m, s in zip(mask_shape, shape)
    )
    is_mask = dtype == "bool" or _is_integer_dtype(dtype)
    if not same or not is_mask:
        raise ValueError(
            "`padding_mask` must be a boolean mask with the shape of "
            f"`{ids_name}` {tuple(shape)!r}. "
            f"Received: padding_mask{_shown(mask, values, dtype)}"
        )
    if values is None:
        return ops.cast(mask, "bool"), None
    values = values.astype(bool)
    return ops.convert_to_tensor(values, "bool"), values


def check_right_padded(mask, ids_name, token_ids, padding_mask, pad):
    """Raises `ValueError` unless every row of the `(batch, length)`
    boolean `mask` is some tokens (at least one), then padding only.

    `token_ids` and `padding_mask` (None when the mask comes from
    `pad_token_id`, the user's mask otherwise) are shown in the message;
    `pad` is the padding id.
    """
    received = f"Received: {ids_name}={token_ids!r}"
    if padding_mask is None:
        where = f"`{ids_name}`"
        token = f"an id other than pad_token_id={pad!r}"
        padding = f"pad_token_id={pad!r}"
    else:
        where = "`padding_mask`"
        token, padding = "True in `padding_mask`", "False"
        received += f", padding_mask={padding_mask!r}"
    lengths = mask.sum(axis=-1)
    empty = np.flatnonzero(lengths == 0).tolist()
    if empty:
        raise ValueError(
            f"Every prompt needs at least one token ({token}), but rows "
            f"{empty!r} of {where} have none. {received}"
        )
    right_padded = np.arange(mask.shape[-1]) < lengths[:, None]
    holes = np.flatnonzero(np.any(mask != right_padded, axis=-1)).tolist()
    if holes:
        raise ValueError(
            "Prompts must be right-padded (padding only after the last "
            f"token), but rows {holes!r} of {where} have padding "
            f"({padding}) before a token. {received}"
        )


def token_steps(token_ids):
    """The static length `T` of `(batch, T)` token ids (None: unknown)."""
    shape = tuple(getattr(token_ids, "shape", None) or ())
    return shape[1] if len(shape) > 1 else None
