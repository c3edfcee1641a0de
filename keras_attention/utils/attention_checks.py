"""The argument checks of the attention layers' calls, beside `validation`.

`validation` holds the checks of single values and imports no Keras; these
read tensors (eager values, dtypes, masks against inputs) and raise
`ValueError`/`TypeError` naming the argument and showing its value, as
`MultiHeadAttention`, its subclasses, the blocks and generation call
them.
"""

import keras
import numpy as np

from keras_attention.utils import keras_utils
from keras_attention.utils import validation

FLASH_SCORES_ERROR = (
    "Returning attention scores is not supported when flash attention is "
    "enabled. Please disable flash attention to access attention scores."
)


def shape_of(x):
    """`x.shape` as a tuple (None without one: a list, a missing key)."""
    shape = getattr(x, "shape", None)
    return None if shape is None else tuple(shape)


def as_tensor(name, value):
    """`value` as a tensor when it is an array-like without a shape (a
    Python list, tuple or scalar of numbers or bools), as Keras's layers
    take their masks; None, tensors and NumPy arrays unchanged.

    Raises `TypeError` naming `name` unless the array-like holds numbers
    or bools, `ValueError` when it is ragged.

    Example:

    >>> from keras_attention.utils.attention_checks import as_tensor
    >>> tuple(as_tensor("query_mask", [[True, False]]).shape)
    (1, 2)
    >>> as_tensor("query_mask", [["a"]])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: `query_mask` must be a tensor or an array-like ...
    """
    if value is None or hasattr(value, "shape"):
        return value
    try:
        kind = np.asarray(value).dtype.kind
    except ValueError:
        raise ValueError(
            f"`{name}` must be a tensor or a rectangular array-like (nested "
            f"lists of one length per axis). Received: {name}={value!r}"
        ) from None
    if kind not in "biuf":
        raise TypeError(
            f"`{name}` must be a tensor or an array-like of numbers or "
            f"bools. Received: {name}={value!r}"
        )
    return keras.ops.convert_to_tensor(value)


def as_tensors(**values):
    """`as_tensor` of each keyword argument (name -> value), as a tuple
    in the order given: `mask, ids = as_tensors(mask=mask, ids=ids)`."""
    return tuple(as_tensor(name, value) for name, value in values.items())


def check_heads(num_heads, key_dim, value_dim, num_key_value_heads):
    """The head arguments of an attention layer, checked: positive ints
    (`value_dim`, `num_key_value_heads` may be None), and
    `num_key_value_heads` dividing `num_heads`."""
    num_heads = validation.check_positive_int("num_heads", num_heads)
    key_dim = validation.check_positive_int("key_dim", key_dim)
    value_dim = validation.check_positive_int(
        "value_dim", value_dim, allow_none=True
    )
    num_key_value_heads = validation.check_positive_int(
        "num_key_value_heads", num_key_value_heads, allow_none=True
    )
    if num_key_value_heads is not None and num_heads % num_key_value_heads:
        raise ValueError(
            "`num_key_value_heads` must divide `num_heads`. Received: "
            f"num_key_value_heads={num_key_value_heads!r}, "
            f"num_heads={num_heads!r}"
        )
    return num_heads, key_dim, value_dim, num_key_value_heads


def check_output_shape(output_shape):
    """`None`, an int or a tuple of ints -> `None` or a tuple of ints."""
    if output_shape is None:
        return None
    if validation.is_int(output_shape):
        shape = (output_shape,)
    else:
        shape = output_shape
    if (
        not isinstance(shape, (tuple, list))
        or not all(validation.is_int(d) and d > 0 for d in shape)
        or not shape
    ):
        raise ValueError(
            "Invalid `output_shape`: it must be a positive int or a non-empty "
            f"tuple of positive ints. Received: output_shape={output_shape!r}"
        )
    return tuple(int(d) for d in shape)


def check_key_value_shapes(value_shape, key_shape):
    """Keras's rule: `key` and `value` agree on every axis but the last."""
    v, k = tuple(value_shape)[1:-1], tuple(key_shape)[1:-1]
    ok = len(v) == len(k) and all(
        a is None or b is None or a == b for a, b in zip(v, k)
    )
    if not ok:
        raise ValueError(
            "All dimensions of `value` and `key`, except the last one, must "
            f"be equal. Received: value_shape={tuple(value_shape)!r}, "
            f"key_shape={tuple(key_shape)!r}"
        )


def check_positions(positions, call, has_rotary, layer_name):
    """`positions` set the rotary positions of a rank-3 self-attention
    call (keys of the query's length, or this call's keys of a cache);
    their shape is `RotaryEmbedding`'s to check. `call`: the
    `AttentionCall`."""
    query, key, cache = call.query, call.key, call.cache
    problem = None
    if not has_rotary:
        problem = (
            "they set rotary positions, and this layer has none "
            "(`rotary_max_wavelength=None`)"
        )
    elif len(query.shape) != 3:
        problem = "they need inputs of shape (batch, T, features)"
    elif call.cache_sink_tokens is not None:
        problem = (
            "a rolling cache (`cache_sink_tokens`) places and masks "
            "keys by `cache_update_index`, not by them"
        )
    elif cache is None and None not in (query.shape[1], key.shape[1]):
        if query.shape[1] != key.shape[1]:
            problem = (
                "they are the positions of the queries and the keys "
                "alike, so the key must have the query's length"
            )
    if problem is not None:
        raise ValueError(
            f"`positions` cannot be used here: {problem}. Received: "
            f"positions.shape={shape_of(positions)!r}, "
            f"query.shape={tuple(query.shape)!r}, "
            f"key.shape={shape_of(key)!r}, "
            f"layer {layer_name!r}"
        )


def check_segment_ids(segment_ids, query, key, cache):
    """`segment_ids` `(batch, T)` integers of a self-attention call on
    `(batch, T, features)` inputs, without a cache."""
    if cache is not None or len(query.shape) != 3:
        raise ValueError(
            "`segment_ids` (packed documents) need a self-attention call "
            "on inputs of shape (batch, T, features) without a cache. "
            f"Received: query.shape={tuple(query.shape)!r}, "
            f"cache={'given' if cache is not None else None}"
        )
    shape = tuple(segment_ids.shape)
    want = (query.shape[0], query.shape[1])
    if (
        len(shape) != 2
        or any(
            a is not None and b is not None and a != b
            for a, b in zip(shape, want)
        )
        or query.shape[1] != key.shape[1]
    ):
        raise ValueError(
            "`segment_ids` must have shape (batch, T) of the query, and "
            "the keys the same length (self-attention). Received: "
            f"segment_ids.shape={shape!r}, "
            f"query.shape={tuple(query.shape)!r}, "
            f"key.shape={tuple(key.shape)!r}"
        )
    if not keras.backend.is_int_dtype(
        keras.backend.standardize_dtype(segment_ids.dtype)
    ):
        raise TypeError(
            "`segment_ids` must be integers. Received: "
            f"segment_ids.dtype={segment_ids.dtype!r}"
        )


def check_attention_mask(attention_mask, query, key, num_heads):
    """`attention_mask` of shape `(Tq, Tk)`, `(batch, Tq, Tk)` or `(batch,
    num_heads, Tq, Tk)` (1 broadcasts on batch and heads)."""
    shape = tuple(attention_mask.shape)
    tq, tk = query.shape[1], key.shape[1]
    expected = f"(Tq, Tk), (batch, Tq, Tk) or (batch, {num_heads}, Tq, Tk)"
    ok = len(shape) in (2, 3, 4)
    if ok:
        for got, want in zip(shape[-2:], (tq, tk)):
            if got is not None and want is not None and got != want:
                ok = False
    if ok and len(shape) >= 3 and shape[0] not in (None, 1):
        b = query.shape[0]
        ok = b is None or shape[0] == b
    if ok and len(shape) == 4 and shape[1] not in (None, 1, num_heads):
        ok = False
    if not ok:
        raise ValueError(
            f"`attention_mask` must have shape {expected} with "
            f"Tq={tq}, Tk={tk}. Received: attention_mask.shape={shape}, "
            f"query.shape={tuple(query.shape)}, "
            f"key.shape={tuple(key.shape)}"
        )


def check_padding_masks(call):
    """`ValueError` naming the mask unless it fits its input (`call`: an
    `AttentionCall`; value/key None come from a precomputed cache)."""
    for name, inputs_name in (
        ("query_mask", "query"),
        ("value_mask", "value"),
        ("key_mask", "key"),
    ):
        inputs = getattr(call, inputs_name)
        if inputs is not None:
            validation.check_padding_mask(
                name, getattr(call, name), inputs, inputs_name
            )


def check_cache_batch(name, cache, inputs, inputs_name="query"):
    """Raises `ValueError` naming `name` and both batch sizes unless the
    cache `cache` (a tensor, batch on axis 0) has the batch size of
    `inputs`; sizes unknown now (symbolic) are not compared.

    Example:

    >>> import numpy as np
    >>> from keras_attention.utils.attention_checks import check_cache_batch
    >>> cache, query = np.zeros((3, 4)), np.zeros((2, 1, 8))
    >>> check_cache_batch("cache", cache, query)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: `cache` has batch size 3 and `query` batch size 2: ...
    """
    cache_shape, shape = tuple(cache.shape), tuple(inputs.shape)
    got, want = cache_shape[0], shape[0]
    if got is None or want is None or got == want:
        return
    raise ValueError(
        f"`{name}` has batch size {got!r} and `{inputs_name}` batch size "
        f"{want!r}: a cache holds one row per sequence of the batch. "
        f"Received: {name}.shape={cache_shape!r}, "
        f"{inputs_name}.shape={shape!r}"
    )


def check_key_value_cache(cache, query, kv_heads, key_dim, value_dim):
    """Raises `ValueError` naming `cache` unless it is a key/value cache
    `(batch, 2, length, kv_heads, key_dim)` of `query`'s batch
    (`MultiHeadAttention`'s, rolling or not; keys and values stacked, so
    `value_dim` must be `key_dim`). Sizes unknown now are not compared."""
    shape = tuple(cache.shape)
    want = (query.shape[0], 2, None, kv_heads, key_dim)
    ok = value_dim == key_dim and len(shape) == len(want)
    ok = ok and all(
        a is None or b is None or a == b for a, b in zip(shape[1:], want[1:])
    )
    if not ok:
        raise ValueError(
            "`cache` must have shape (batch, 2, max_length, "
            f"num_key_value_heads, key_dim) = (batch, 2, max_length, "
            f"{kv_heads}, {key_dim}), keys and values stacked (so "
            f"value_dim={value_dim} must be key_dim={key_dim}). Received: "
            f"cache.shape={shape!r}"
        )
    check_cache_batch("cache", cache, query)


def check_rolling_cache(cache, cache_update_index, sink_tokens, window, layer):
    """`ValueError` unless a rolling cache can be used here: a window
    (`window`, the layer's `cache_window()`), an update index, and room
    for the window beside the sinks. `layer`: the layer's name."""
    size = cache.shape[2] if cache is not None else None
    problem = None
    if not validation.is_int(sink_tokens) or sink_tokens < 0:
        problem = "`cache_sink_tokens` must be a non-negative int"
    elif cache is None or cache_update_index is None:
        problem = (
            "a rolling cache needs `cache` and `cache_update_index` "
            "(the absolute position of the first query)"
        )
    elif window is None:
        problem = (
            "a rolling cache needs windowed attention (`sliding_window`, "
            "or `LocalSelfAttention`'s causal `window_size`)"
        )
    elif size is not None and size < sink_tokens + window + 1:
        problem = (
            f"the cache needs at least sink_tokens + window + 1 = "
            f"{sink_tokens + window + 1} slots, it has {size}"
        )
    if problem is not None:
        raise ValueError(
            f"{problem}. Received: cache_sink_tokens={sink_tokens!r}, "
            f"cache.shape={getattr(cache, 'shape', None)!r}, "
            f"window={window!r}, layer {layer!r}"
        )


def check_cache_index(
    value, steps, cache_length, name="cache_update_index", rolling=False
):
    """Raises `ValueError` naming `name` unless `value` is a scalar
    integer (or integer tensor) at which a call's `steps` positions fit a
    cache of `cache_length` positions: `0 <= value` and `value + steps <=
    cache_length` (a rolling cache, `rolling`, wraps around: `0 <= value`
    only).

    Values known now are read: Python and NumPy integers, eager tensors.
    A symbolic index (a `tf.function`, XLA or `jax.jit` trace, a
    functional model) has no value yet and is not compared: out of range,
    the write then lands on a clamped slot. Keep `index + steps <=
    cache_length` there.

    Args:
        value: the index, as the user passed it.
        steps: int or None, the positions of this call.
        cache_length: int or None, the positions of the cache.
        name: the argument's name, as the user wrote it.
        rolling: bool, whether the cache is a rolling one.

    Example:

    >>> from keras_attention.utils.attention_checks import check_cache_index
    >>> check_cache_index(3, 1, 4)  # the last position: fine
    >>> check_cache_index(4, 1, 4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: `cache_update_index` must be >= 0 and leave room ...
    """
    validation.check_index(name, value, allow_negative=True)
    known = value if validation.is_int(value) else None
    if known is None:
        known = keras_utils.concrete_int(value)
    validation.check_cache_update_index(
        known, steps, cache_length, name=name, rolling=rolling
    )
