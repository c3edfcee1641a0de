"""Argument and shape checks shared by masks, ops, layers and generation.

Imported as a module (`from keras_attention.utils import validation`, then
`validation.check_rate("dropout", dropout)`), never through a layer. Every
check raises `ValueError` naming the argument and showing the value
with `repr` (so `"2"` and `2` read differently).
"""

import math

import numpy as np


def is_int(value):
    """Whether `value` is a Python or NumPy integer (bools are not: `True`
    is no count of heads)."""
    return isinstance(value, (int, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    )


def _is_real(value):
    """Whether `value` is a Python or NumPy int or float (not a bool)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and (
        not isinstance(value, (bool, np.bool_))
    )


def _finite(value):
    """Whether the number `value` is finite as a float (an int too large
    for a float is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _plain(value):
    """A NumPy scalar as the Python number it holds (`np.int64(2)` -> `2`),
    so that configs stay JSON-serializable; other values unchanged."""
    return value.item() if isinstance(value, np.generic) else value


def check_positive_int(name, value, allow_none=False):
    """Raises `ValueError` naming `name` unless `value` is a positive
    integer (Python or NumPy; not a bool). Returns it as a Python int
    (None stays None)."""
    if value is None and allow_none:
        return None
    if not is_int(value) or value <= 0:
        raise ValueError(
            f"`{name}` must be a positive integer. Received: {name}={value!r}"
        )
    return int(value)


def check_non_negative_int(name, value, allow_none=False):
    """Raises `ValueError` naming `name` unless `value` is an integer
    >= 0 (Python or NumPy; not a bool). Returns it as a Python int (None
    stays None)."""
    if value is None and allow_none:
        return None
    if not is_int(value) or value < 0:
        raise ValueError(
            f"`{name}` must be a non-negative integer. "
            f"Received: {name}={value!r}"
        )
    return int(value)


def check_seed(name, value):
    """Raises `ValueError` naming `name` unless `value` is None or an
    integer (Python or NumPy; not a bool), as Keras's seeds. Returns it as
    a Python int (None stays None)."""
    if value is None:
        return None
    if not is_int(value):
        raise ValueError(
            f"`{name}` must be None or an integer. Received: {name}={value!r}"
        )
    return int(value)


def check_rate(name, value):
    """Raises `ValueError` naming `name` unless `0 <= value < 1` (NaN is
    refused). Returns it as a Python number."""
    if not _is_real(value) or not 0.0 <= value < 1.0:
        raise ValueError(
            f"`{name}` must be a float in [0, 1). Received: {name}={value!r}"
        )
    return _plain(value)


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


def check_use_bias(use_bias):
    """An attention layer's `use_bias`: a bool (biases on every projection
    or on none), or `"qkv"` (on the query, key, value and gate
    projections, not on the output's: Qwen 2). Else `ValueError`."""
    if isinstance(use_bias, str) and use_bias == "qkv":
        return use_bias
    if isinstance(use_bias, (bool, np.bool_)):
        return bool(use_bias)
    raise ValueError(
        '`use_bias` must be a bool or "qkv" (no bias on the output '
        f"projection). Received: use_bias={use_bias!r}"
    )


def check_positive_number(name, value, allow_none=False, minimum=None):
    """Raises `ValueError` naming `name` unless `value` is a finite number
    > 0 (and >= `minimum` when given). NaN and infinities are refused:
    every output computed from them would be NaN or constant. Returns it as
    a Python number (None stays None)."""
    if value is None and allow_none:
        return None
    ok = _is_real(value) and _finite(value) and value > 0
    if ok and minimum is not None:
        ok = value >= minimum
    if not ok:
        what = "a finite positive number"
        if minimum is not None:
            what = f"a finite number >= {minimum!r}"
        raise ValueError(f"`{name}` must be {what}. Received: {name}={value!r}")
    return _plain(value)


def check_finite_number(name, value):
    """Raises `ValueError` naming `name` unless `value` is a finite real
    number (Python or NumPy, any sign; not a bool). Returns it as a
    Python float."""
    if not (_is_real(value) and _finite(value)):
        raise ValueError(
            f"`{name}` must be a finite number. Received: {name}={value!r}"
        )
    return float(value)


def check_window_size(name, value):
    """Raises `ValueError` naming `name` unless `value` is a non-negative
    integer or a pair `(left, right)` of them (Python or NumPy integers).
    Returns it in plain Python types, for a layer's config: an int, or a
    tuple of two ints (`np.int64(2)` -> `2`, `[2, np.int64(1)]` ->
    `(2, 1)`)."""
    pair = isinstance(value, (tuple, list))
    parts = tuple(value) if pair else (value,)
    if len(parts) != (2 if pair else 1) or not all(
        is_int(v) and v >= 0 for v in parts
    ):
        raise ValueError(
            f"`{name}` must be a non-negative int or a pair (left, right) "
            f"of non-negative ints. Received: {name}={value!r}"
        )
    parts = tuple(int(v) for v in parts)
    return parts if pair else parts[0]


def check_padding_mask(name, mask, inputs, inputs_name="inputs", trailing=1):
    """Raises `ValueError` unless `mask` has `inputs`' shape without its
    last `trailing` axes (`(batch, T)` for `(batch, T, features)` inputs,
    `(batch,)` for one decoding step `(batch, features)`).

    `mask` may be None (nothing to check). Dimensions unknown at trace
    time are not compared. Returns nothing.
    """
    if mask is None:
        return
    mask_shape = getattr(mask, "shape", None)
    if mask_shape is None:  # An array-like (a list): converted after.
        try:
            mask_shape = np.shape(mask)
        except ValueError:
            raise ValueError(
                f"`{name}` must be a boolean mask, a tensor or a "
                f"rectangular array-like. Received: {name}={mask!r}"
            ) from None
    mask_shape = tuple(mask_shape)
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


def check_built_features(name, shape, expected, inputs_name=None):
    """Raises `ValueError` unless the last axis of `shape` (a call's input)
    is `expected`, the feature size the layer was built for (its weights
    are shaped by it). An unknown size (None, either one) is not compared.
    `inputs_name` is the argument's name in the message's shape
    (`name` by default)."""
    shape = tuple(shape)
    got = shape[-1] if shape else None
    if expected is None or got is None or got == expected:
        return
    inputs_name = inputs_name or name
    raise ValueError(
        f"`{name}` must have {expected!r} features (its last axis), as "
        f"when the layer was built. Received: {inputs_name}_shape={shape!r}"
    )


def check_numeric_input(name, value):
    """Raises `TypeError` naming `name` unless the tensor `value` holds
    numbers (a float, int or bool dtype): strings (a NumPy array of
    `str`, a `tf.string` tensor) are refused before they reach a cast or a
    matrix product. Returns nothing."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return
    kind = getattr(dtype, "kind", None)
    text = str(dtype).lower()
    if kind in ("U", "S", "O") or "str" in text or "object" in text:
        raise TypeError(
            f"`{name}` must hold numbers. Received: {name} of dtype "
            f"{str(dtype)!r}"
        )


def check_call_input(name, value, features=None, ranks=(3,), layout=None):
    """At call time: `value` holds numbers (`check_numeric_input`), has
    one of the ranks `ranks` (`check_sequence_shape`) and the feature size
    `features` the layer was built for (None: any). Returns nothing."""
    check_numeric_input(name, value)
    check_sequence_shape(name, value.shape, ranks=ranks, layout=layout)
    check_built_features(name, value.shape, features)


def check_index(name, value, allow_negative=False):
    """Raises `ValueError` naming `name` unless `value` is a scalar
    integer position: a Python or NumPy integer (>= 0 unless
    `allow_negative`; bools and floats refused), returned as a Python
    int, or a scalar tensor of an integer dtype, returned as it is (its
    value is not read: it may be symbolic)."""
    if isinstance(value, (bool, int, float, str, np.generic, np.ndarray)):
        if np.ndim(value) != 0:
            raise ValueError(
                f"`{name}` must be a scalar integer. Received: {name}={value!r}"
            )
        check_integer_values(name, value, allow_negative)
        return int(value)
    dtype = str(getattr(value, "dtype", type(value).__name__))
    shape = getattr(value, "shape", None)
    if "int" not in dtype.lower() or (shape is not None and len(shape)):
        raise ValueError(
            f"`{name}` must be a scalar integer (or a scalar integer "
            f"tensor). Received: {name} of dtype {dtype!r} and shape "
            f"{None if shape is None else tuple(shape)!r}"
        )
    return value


def check_cache_update_index(
    index, steps, cache_length, name="cache_update_index", rolling=False
):
    """Raises `ValueError` naming `name` unless a call's `steps` positions,
    written from `index` into a key/value cache of `cache_length`
    positions, stay inside it: `0 <= index` and `index + steps <=
    cache_length`. A rolling cache (`rolling`) holds absolute positions
    in a ring and wraps around by design: `0 <= index` only, and
    positions below `2**31` (they are int32).

    `index` is the index as a Python or NumPy int (shown as it is), or
    None when its value is not known now (a symbolic tensor: traced
    functions, functional models), which is not checked. `steps` or
    `cache_length` None (unknown at trace time): the end is not compared.
    Returns nothing.
    """
    if index is None:
        return
    fits = index >= 0
    end = 2**31 if rolling else cache_length
    if fits and None not in (steps, end):
        fits = index + steps <= end
    if fits:
        return
    if rolling:
        raise ValueError(
            f"`{name}` must be >= 0 (the absolute position of the first "
            f"query; the rolling cache of {cache_length!r} positions wraps "
            "around), with this call's positions below 2**31 (int32). "
            f"Received: {name}={index!r}, steps={steps!r}"
        )
    raise ValueError(
        f"`{name}` must be >= 0 and leave room for this call's "
        f"{steps!r} positions in the cache of {cache_length!r} positions "
        f"(`{name} + steps <= {cache_length!r}`); a larger cache holds "
        f"more. Received: {name}={index!r}, steps={steps!r}, "
        f"cache length={cache_length!r}"
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
    (3, 4, 5): "(batch, ..., steps, features) of rank 3 to 5",
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


def check_positions(
    name,
    shape,
    inputs_shape,
    steps_axis,
    values=None,
    size=None,
    size_name="sequence_length",
):
    """`positions=` of the position layers (one position per step of the
    inputs, instead of `start_index + arange(T)`).

    Raises `ValueError` naming `name` unless `shape` is `(T,)` or
    `(batch, T)` with `T` the size of axis `steps_axis` of `inputs_shape`
    and `batch` its first axis or 1 (sizes unknown when traced, None, are
    not compared). When the layer reads rows of a table of `size` rows
    (`size` given) and the values are known (`values`, a NumPy array:
    eager calls), also unless they are whole numbers in `[0, size)`: a
    negative row would read from the end, one past it fail or clamp,
    depending on the backend. Returns nothing.

    Args:
        name: the argument's name (`"positions"`).
        shape: the shape of the positions.
        inputs_shape: the shape of the inputs, as the user passed them.
        steps_axis: the axis of `inputs_shape` that holds the steps.
        values: the positions as a NumPy array, or None (symbolic).
        size: None, or the number of rows of the table they index.
        size_name: the argument that set `size`, for the message.

    Example:

    >>> import numpy as np
    >>> from keras_attention.utils.validation import check_positions
    >>> check_positions("positions", (2,), (1, 2, 8), 1, np.array([0, 3]),
    ...                 size=3)
    Traceback (most recent call last):
    ...
    ValueError: `positions` must be whole numbers in [0, 3) (the rows of \
the table of `sequence_length=3`). Received: positions[1]=3, in positions \
of shape (2,)
    """
    shape, inputs_shape = tuple(shape), tuple(inputs_shape)
    steps, batch = inputs_shape[steps_axis], inputs_shape[0]

    def fits(got, *want):
        return got is None or None in want or got in want

    ok = len(shape) in (1, 2) and fits(shape[-1], steps)
    if ok and len(shape) == 2:
        ok = fits(shape[0], 1, batch)
    if not ok:
        raise ValueError(
            f"`{name}` must have shape (T,) or (batch, T), one position "
            f"per step of the inputs: T={steps!r} and batch 1 or "
            f"{batch!r}. Received: {name}.shape={shape!r} for "
            f"inputs_shape={inputs_shape!r}"
        )
    if size is None or values is None:
        return
    values = np.asarray(values)
    if values.dtype.kind in "iu":
        bad = (values < 0) | (values >= size)
    elif values.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~((values >= 0) & (values < size))
            bad |= values != np.floor(values)
    else:
        bad = np.ones(values.shape, bool)
    if not bad.any():
        return
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    at = f"[{', '.join(map(str, index))}]" if index else ""
    raise ValueError(
        f"`{name}` must be whole numbers in [0, {size!r}) (the rows of the "
        f"table of `{size_name}={size!r}`). Received: "
        f"{name}{at}={_plain(values[index])!r}, in {name} of shape "
        f"{tuple(values.shape)!r}"
    )


QK_NORMS = ("rms", "layer", "rms_across_heads", "l2")


def check_qk_norm(qk_norm, qk_norm_epsilon):
    """`(qk_norm, qk_norm_epsilon)` checked (`MultiHeadAttention`'s
    QK-norm): `qk_norm` None or one of `QK_NORMS`, the epsilon a finite
    number > 0 (returned as a float)."""
    if qk_norm is not None and qk_norm not in QK_NORMS:
        raise ValueError(
            f"`qk_norm` must be None or one of {QK_NORMS}. Received: "
            f"qk_norm={qk_norm!r}"
        )
    epsilon = check_positive_number("qk_norm_epsilon", qk_norm_epsilon)
    return qk_norm, float(epsilon)


# `MultiHeadAttention`'s `temperature_tuning` keys and their defaults
# (Llama 4's `floor_scale` and `attn_scale`).
TEMPERATURE_TUNING = {"floor_scale": 8192.0, "scale": 0.1}


def check_temperature_tuning(value):
    """`MultiHeadAttention`'s `temperature_tuning` checked: None, or a
    dict of `TEMPERATURE_TUNING`'s keys (a missing one takes its
    default): `floor_scale` a finite number > 0, `scale` a finite number
    >= 0. Returns the full dict of floats (None stays None)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - set(TEMPERATURE_TUNING):
        raise ValueError(
            "`temperature_tuning` must be None or a dict with the keys "
            f"{tuple(TEMPERATURE_TUNING)!r}. Received: "
            f"temperature_tuning={value!r}"
        )
    out = {**TEMPERATURE_TUNING, **value}
    floor = check_positive_number("floor_scale", out["floor_scale"])
    scale = check_finite_number("scale", out["scale"])
    if scale < 0:
        raise ValueError(
            "`temperature_tuning`'s `scale` must be >= 0. Received: "
            f"temperature_tuning={value!r}"
        )
    return {"floor_scale": float(floor), "scale": float(scale)}
