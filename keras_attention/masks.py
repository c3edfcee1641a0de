"""Attention mask builders.

One polarity everywhere in `keras_attention`: `True` (or 1) means "may
attend". Every builder returns a boolean tensor broadcastable to
`(batch, query_length, key_length)`; `combine_masks` joins any number of
them (and `None`s) with a logical and.

Axes in comments: b - batch, i - query positions, j - key positions.
"""

from keras import ops


def _positions(length, offset=0):
    return ops.arange(length, dtype="int32") + ops.cast(offset, "int32")


def _check_length(name, value):
    if isinstance(value, int) and value < 0:
        raise ValueError(f"`{name}` must be non-negative. Received: {name}={value}")


def causal_mask(query_length, key_length=None, offset=0):
    """Mask letting query `i` attend to keys `j <= i + offset`.

    Args:
        query_length: int, number of queries `Tq`.
        key_length: int, number of keys `Tk`; defaults to `query_length`.
        offset: int or scalar tensor, absolute position of the first query
            (for incremental decoding with a cache: the cache index).

    Returns:
        Boolean tensor of shape `(1, Tq, Tk)`.
    """
    _check_length("query_length", query_length)
    key_length = query_length if key_length is None else key_length
    _check_length("key_length", key_length)
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
    """
    x = ops.convert_to_tensor(lengths_or_mask)
    if len(x.shape) == 1:
        if max_length is None:
            raise ValueError(
                "`max_length` is required when `lengths_or_mask` holds lengths "
                f"of shape {x.shape}. Received: max_length={max_length}"
            )
        key_valid = _positions(max_length)[None, :] < ops.cast(x, "int32")[:, None]
    elif len(x.shape) == 2:
        key_valid = ops.cast(x, "bool")
    else:
        raise ValueError(
            "`lengths_or_mask` must have shape (batch,) or (batch, Tk). "
            f"Received: lengths_or_mask.shape={x.shape}"
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
    """
    _check_length("length", length)
    _check_length("prefix_length", prefix_length)
    i = _positions(length)[:, None]
    j = _positions(length)[None, :]
    prefix = ops.cast(ops.convert_to_tensor(prefix_length), "int32")
    prefix = ops.reshape(prefix, (-1, 1, 1))
    return ops.logical_or((j <= i)[None], j[None] < prefix)


def window_bounds(window_size, causal=False):
    """Normalizes `window_size` (int or `(left, right)`) to `(left, right)`."""
    if isinstance(window_size, (tuple, list)):
        if len(window_size) != 2:
            raise ValueError(
                "`window_size` must be an int or a pair (left, right). "
                f"Received: window_size={window_size}"
            )
        left, right = window_size
    else:
        left = right = window_size
    for v in (left, right):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(
                "`window_size` must hold non-negative ints. "
                f"Received: window_size={window_size}"
            )
    return (int(left), 0 if causal else int(right))


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
    """
    left, right = window_bounds(window_size, causal)
    key_length = query_length if key_length is None else key_length
    i = _positions(query_length, offset)[:, None]
    j = _positions(key_length)[None, :]
    return ops.expand_dims(ops.logical_and(j >= i - left, j <= i + right), 0)


def combine_masks(*masks):
    """Logical and of several masks (broadcasting); `None`s are skipped.

    Returns `None` when every argument is `None`.
    """
    masks = [ops.cast(m, "bool") for m in masks if m is not None]
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = ops.logical_and(out, m)
    return out
