"""Attention mask builders.

One polarity everywhere in `keras_attention`: `True` (or 1) means "may
attend". Every builder returns a boolean tensor broadcastable to
`(batch, query_length, key_length)`; `combine_masks` joins any number of
them (and `None`s) with a logical and.

Arguments known when a builder is called (Python numbers, NumPy arrays,
eager tensors) are checked and bad ones raise `ValueError` naming the
argument; symbolic tensors (inside `tf.function`, `jax.jit` or a
functional model) are taken as they are.

Axes in comments: b - batch, i - query positions, j - key positions.
"""

import keras
import numpy as np
from keras import ops

from keras_attention.utils import validation

__all__ = [
    "causal_mask",
    "padding_mask",
    "prefix_lm_mask",
    "window_bounds",
    "sliding_window_mask",
    "combine_masks",
    "segment_positions",
    "segment_mask",
]


def _concrete(value):
    """`value` as a NumPy array when it is known now, else None.

    Python numbers, NumPy arrays and eager tensors are known; symbolic
    tensors (graph tensors, JAX tracers, Keras tensors) are not.
    """
    if isinstance(value, (bool, int, float, str, np.ndarray, np.generic)):
        return np.asarray(value)
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    try:
        return np.asarray(ops.convert_to_numpy(value))
    except Exception:  # noqa: BLE001 - symbolic: no value before it runs.
        return None


def _check_integer(name, value, allow_negative=False):
    """`ValueError` unless `value` holds integers (>= 0 unless
    `allow_negative`); symbolic tensors must have an integer dtype (their
    values are not known yet)."""
    known = _concrete(value)
    if known is not None:
        plain = isinstance(value, (bool, int, float, str, np.generic))
        validation.check_integer_values(
            name, value if plain else known, allow_negative
        )
        return
    dtype = keras.backend.standardize_dtype(getattr(value, "dtype", "int32"))
    if "int" not in dtype:
        raise ValueError(
            f"`{name}` must be an integer tensor. Received: {name} of "
            f"dtype {dtype!r}"
        )


def _positions(length, offset=0):
    return ops.arange(length, dtype="int32") + ops.cast(offset, "int32")


def causal_mask(query_length, key_length=None, offset=0):
    """Mask letting query `i` attend to keys `j <= i + offset`.

    Args:
        query_length: int, number of queries `Tq`.
        key_length: int, number of keys `Tk`; defaults to `query_length`.
        offset: int or scalar tensor, absolute position of the first query
            (for incremental decoding with a cache: the cache index).

    Returns:
        Boolean tensor of shape `(1, Tq, Tk)`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> mask = keras_attention.masks.causal_mask(2, 4, offset=1)
    >>> np.asarray(mask).astype(int)
    array([[[1, 1, 0, 0],
            [1, 1, 1, 0]]])
    """
    _check_integer("query_length", query_length)
    key_length = query_length if key_length is None else key_length
    _check_integer("key_length", key_length)
    _check_integer("offset", offset, allow_negative=True)
    i = _positions(query_length, offset)[:, None]
    j = _positions(key_length)[None, :]
    return ops.expand_dims(j <= i, 0)


def padding_mask(lengths_or_mask, max_length=None, query_mask=None):
    """Mask hiding padded keys (and optionally padded queries).

    Args:
        lengths_or_mask: either an integer tensor of shape `(batch,)` with the
            number of valid (leading) steps of each example, or a boolean /
            0-1 tensor of shape `(batch, Tk)` that is True on valid steps.
        max_length: int, `Tk`; required when `lengths_or_mask` holds lengths.
        query_mask: optional boolean tensor `(batch, Tq)`; when given, padded
            queries attend to nothing.

    Returns:
        Boolean tensor of shape `(batch, 1, Tk)`, or `(batch, Tq, Tk)` when
        `query_mask` is given.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> lengths = np.array([2, 3])
    >>> mask = keras_attention.masks.padding_mask(lengths, max_length=4)
    >>> np.asarray(mask).astype(int)
    array([[[1, 1, 0, 0]],
    <BLANKLINE>
           [[1, 1, 1, 0]]])
    """
    x = ops.convert_to_tensor(lengths_or_mask)
    if len(x.shape) == 1:
        if max_length is None:
            raise ValueError(
                "`max_length` is required when `lengths_or_mask` holds "
                f"lengths of shape {tuple(x.shape)!r}. "
                f"Received: max_length={max_length!r}"
            )
        _check_integer("max_length", max_length)
        _check_integer("lengths_or_mask", x)  # lengths: integers >= 0
        key_valid = (
            _positions(max_length)[None, :] < ops.cast(x, "int32")[:, None]
        )
    elif len(x.shape) == 2:
        key_valid = ops.cast(x, "bool")
    else:
        raise ValueError(
            "`lengths_or_mask` must have shape (batch,) or (batch, Tk). "
            f"Received: lengths_or_mask.shape={tuple(x.shape)!r}"
        )
    mask = key_valid[:, None, :]
    if query_mask is not None:
        mask = ops.logical_and(mask, ops.cast(query_mask, "bool")[:, :, None])
    return mask


def prefix_lm_mask(length, prefix_length):
    """Prefix-LM mask: bidirectional inside the prefix, causal after it.

    Query `i` may attend to key `j` when `j <= i` or `j < prefix_length`.

    Args:
        length: int, sequence length `T`.
        prefix_length: int, or integer tensor of shape `(batch,)` giving a
            prefix length per example.

    Returns:
        Boolean tensor of shape `(1, T, T)` or `(batch, T, T)`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> np.asarray(keras_attention.masks.prefix_lm_mask(4, 2)[0]).astype(int)
    array([[1, 1, 0, 0],
           [1, 1, 0, 0],
           [1, 1, 1, 0],
           [1, 1, 1, 1]])
    """
    _check_integer("length", length)
    _check_integer("prefix_length", prefix_length)
    i = _positions(length)[:, None]
    j = _positions(length)[None, :]
    prefix = ops.cast(ops.convert_to_tensor(prefix_length), "int32")
    prefix = ops.reshape(prefix, (-1, 1, 1))
    return ops.logical_or((j <= i)[None], j[None] < prefix)


def window_bounds(window_size, causal=False):
    """Normalizes `window_size` (int or `(left, right)`) to `(left, right)`.

    Example:

    >>> import keras_attention
    >>> masks = keras_attention.masks
    >>> masks.window_bounds(3), masks.window_bounds((2, 1), causal=True)
    ((3, 3), (2, 0))
    """
    causal = validation.check_bool("causal", causal)
    window = validation.check_window_size("window_size", window_size)
    left, right = window if isinstance(window, tuple) else (window, window)
    return (left, 0 if causal else right)


def sliding_window_mask(
    query_length, window_size, causal=False, key_length=None, offset=0
):
    """Local attention mask: query `i` sees keys `i - left <= j <= i + right`.

    Args:
        query_length: int, `Tq`.
        window_size: int (`left = right = window_size`) or pair `(left, right)`.
        causal: bool, if True `right = 0`.
        key_length: int, `Tk`; defaults to `query_length`.
        offset: absolute position of the first query.

    Returns:
        Boolean tensor of shape `(1, Tq, Tk)`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> mask = keras_attention.masks.sliding_window_mask(4, (1, 0))
    >>> np.asarray(mask[0]).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    left, right = window_bounds(window_size, causal)
    _check_integer("query_length", query_length)
    key_length = query_length if key_length is None else key_length
    _check_integer("key_length", key_length)
    _check_integer("offset", offset, allow_negative=True)
    i = _positions(query_length, offset)[:, None]
    j = _positions(key_length)[None, :]
    # Compared as offsets j - i (small), against the bounds clipped to
    # int32: `i + right` would overflow for a huge window.
    limit = np.iinfo("int32").max
    offset_ji = j - i
    return ops.expand_dims(
        ops.logical_and(
            offset_ji >= -min(left, limit), offset_ji <= min(right, limit)
        ),
        0,
    )


def combine_masks(*masks):
    """Logical and of several masks (broadcasting); `None`s are skipped.

    Returns `None` when every argument is `None`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> masks = keras_attention.masks
    >>> both = masks.combine_masks(
    ...     masks.causal_mask(3), None, masks.padding_mask(np.array([2]), 3))
    >>> np.asarray(both[0]).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 0]])
    """
    masks = [ops.cast(m, "bool") for m in masks if m is not None]
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = ops.logical_and(out, m)
    return out


def segment_positions(segment_ids):
    """Positions that restart at 0 in each packed document.

    `segment_ids` `(batch, T)` (or `(T,)`) integer ids of the document of
    each token, documents contiguous (packing puts them one after the
    other); returns int32 positions of the same shape: token `i` gets
    `i - start`, `start` the first index of its run of equal ids. Give
    them to `RotaryEmbedding(positions=...)` or to the position layers so
    that a packed document is encoded as it would be alone.

    Example:

    >>> import numpy as np
    >>> from keras_attention.masks import segment_positions
    >>> np.asarray(segment_positions(np.array([[0, 0, 0, 1, 1, 2]]))).tolist()
    [[0, 1, 2, 0, 1, 0]]
    """
    ids = ops.convert_to_tensor(segment_ids)
    if len(ids.shape) not in (1, 2):
        raise ValueError(
            "`segment_ids` must have shape (batch, T) or (T,). Received: "
            f"segment_ids.shape={tuple(ids.shape)!r}"
        )
    squeeze = len(ids.shape) == 1
    ids = ops.cast(ids[None] if squeeze else ids, "int32")
    # Dynamic lengths too (TensorFlow traces `fit` with `(None, None)`).
    # (Symbolic Keras tensors too: no `arange` of an unknown length.)
    index = ops.cumsum(ops.ones_like(ids), axis=1) - 1
    changed = ops.not_equal(ids[:, 1:], ids[:, :-1])
    first = ops.concatenate([ops.ones_like(ids[:, :1], "bool"), changed], 1)
    # The index of each run's first token, carried forward: a running
    # maximum (a parallel scan, log2(T) steps).
    starts = ops.associative_scan(
        ops.maximum, ops.where(first, index, 0), axis=1
    )
    # The scan loses the static shape on TensorFlow; torch's gives floats.
    shape = ops.shape(ids)  # None entries: a symbolic Keras input
    if all(size is not None for size in shape):
        starts = ops.reshape(starts, shape)
    positions = ops.cast(index - starts, "int32")
    return positions[0] if squeeze else positions


def segment_mask(segment_ids):
    """`(batch, T, T)` boolean mask: tokens attend within their document
    (`segment_ids[b, i] == segment_ids[b, j]`). Dense: for short
    sequences; layers take `segment_ids=` and skip the tiles between
    documents instead (`keras_attention.mods.DocumentMask`).

    Example:

    >>> import numpy as np
    >>> from keras_attention.masks import segment_mask
    >>> np.asarray(segment_mask(np.array([[0, 0, 1]]))[0]).astype(int)
    array([[1, 1, 0],
           [1, 1, 0],
           [0, 0, 1]])
    """
    ids = ops.convert_to_tensor(segment_ids)
    return ops.equal(ids[:, :, None], ids[:, None, :])
