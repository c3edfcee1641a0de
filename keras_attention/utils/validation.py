"""Argument and shape checks shared by masks, ops, layers and generation.

Imported as a module (`from keras_attention.utils import validation`, then
`validation.check_rate("dropout", dropout)`), never through a layer. Every
check raises `ValueError` naming the argument and showing the value
with `repr` (so `"2"` and `2` read differently).
"""

import numpy as np


def check_positive_int(name, value, allow_none=False):
    """Raises `ValueError` naming `name` unless `value` is a positive int."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"`{name}` must be a positive integer. Received: {name}={value!r}"
        )


def check_non_negative_int(name, value, allow_none=False):
    """Raises `ValueError` naming `name` unless `value` is an int >= 0."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(
            f"`{name}` must be a non-negative integer. "
            f"Received: {name}={value!r}"
        )


def check_rate(name, value):
    """Raises `ValueError` naming `name` unless `0 <= value < 1`."""
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not 0.0 <= value < 1.0
    ):
        raise ValueError(
            f"`{name}` must be a float in [0, 1). Received: {name}={value!r}"
        )


def check_bool(name, value):
    """Raises `ValueError` naming `name` unless `value` is a bool.

    Strings such as `"False"` (from a command line or a YAML file) are
    refused rather than silently taken as True. NumPy bools are accepted.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(
        f"`{name}` must be a bool (True or False). Received: {name}={value!r}"
    )


def check_positive_number(name, value, allow_none=False):
    """Raises `ValueError` naming `name` unless `value` is a number > 0."""
    if value is None and allow_none:
        return
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or value <= 0
    ):
        raise ValueError(
            f"`{name}` must be a positive number. Received: {name}={value!r}"
        )


def check_padding_mask(name, mask, inputs, inputs_name="inputs", trailing=1):
    """Raises `ValueError` unless `mask` has `inputs`' shape without its
    last `trailing` axes (`(batch, T)` for `(batch, T, features)` inputs,
    `(batch,)` for one decoding step `(batch, features)`).

    `mask` may be None (nothing to check). Dimensions unknown at trace
    time are not compared. Returns nothing.
    """
    if mask is None:
        return
    mask_shape = tuple(mask.shape)
    want = tuple(inputs.shape[:-trailing])
    ok = len(mask_shape) == len(want) and all(
        m is None or w is None or m == w for m, w in zip(mask_shape, want)
    )
    if not ok:
        axes = "axis" if trailing == 1 else f"{trailing} axes"
        raise ValueError(
            f"`{name}` must be a boolean mask of shape {want!r}: the shape "
            f"of `{inputs_name}` {tuple(inputs.shape)!r} without its last "
            f"{axes}. Received: {name}.shape={mask_shape!r}"
        )


def check_rotary_head_size(rotary_max_wavelength, head_size, source):
    """Raises `ValueError` when rotary positions are on
    (`rotary_max_wavelength` not None) and the attention head size is odd:
    rotary embeddings rotate pairs of features. `source` says, in the
    user's words, where the head size came from (`"key_dim=5"`)."""
    if rotary_max_wavelength is not None and head_size % 2:
        raise ValueError(
            "`rotary_max_wavelength` needs an even attention head size "
            f"(rotary embeddings rotate feature pairs), but {source}. "
            f"Received: rotary_max_wavelength={rotary_max_wavelength!r}"
        )


def check_sequence_shape(name, shape, ranks=(3,), layout=None):
    """Raises `ValueError` unless `shape` has one of the ranks `ranks` and
    a known last (feature) axis.

    Args:
        name: the argument's name, as the user wrote it (`"inputs"`).
        shape: the shape to check (a tuple, `None` for unknown sizes).
        ranks: the accepted ranks; `(3,)` for `(batch, steps, features)`.
        layout: how to describe the expected shape in the message;
            defaults to `(batch, steps, features)` for rank 3.

    Returns the feature size.
    """
    shape = tuple(shape)
    if len(shape) not in ranks or shape[-1] is None:
        layout = layout or _LAYOUTS.get(ranks, f"rank {ranks!r}")
        raise ValueError(
            f"`{name}` must have shape {layout} with a known feature size. "
            f"Received: {name}_shape={shape!r}"
        )
    return shape[-1]


_LAYOUTS = {
    (3,): "(batch, steps, features)",
    (2, 3): "(batch, steps, features) or (batch, features)",
}


def check_integer_values(name, value, allow_negative=False):
    """Raises `ValueError` naming `name` unless `value` (a Python or NumPy
    integer, or an array of them) holds integers, all `>= 0` unless
    `allow_negative`. Bools and floats are refused (`3.0` is not an index).

    Known values only: symbolic tensors have no values to check.
    """
    values = np.asarray(value)
    if values.dtype.kind in "iu" and (allow_negative or not np.any(values < 0)):
        return
    what = "an integer" if allow_negative else "a non-negative integer"
    shown = value if values.ndim == 0 or isinstance(value, str) else values
    raise ValueError(f"`{name}` must be {what}. Received: {name}={shown!r}")
