"""The check of a cache index (`cache_update_index`, a generator's
position) against a cache's length, reading the value when it is known
(Python and NumPy integers, eager tensors). Beside `validation` (which
imports no Keras): this one reads eager tensors through `keras_utils`.
"""

from keras_attention.utils import keras_utils
from keras_attention.utils import validation


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

    >>> from keras_attention.utils.cache_checks import check_cache_index
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
