"""Keras helpers shared by the layers (not validation: see `_validation`)."""

try:  # Keras >= 3.6
    from keras.src.backend import get_keras_mask as _get_keras_mask
except ImportError:  # pragma: no cover

    def _get_keras_mask(x):
        return getattr(x, "_keras_mask", None)


def keras_mask(x):
    """The Keras mask attached to `x` (eager, traced or symbolic), or None.

    Keras fills a layer's `mask` argument only when the call has exactly
    one tensor argument; with more (`attention_mask=`, `cache=`) it fills
    `<argument>_mask` names instead, so layers read the mask themselves.
    """
    return None if x is None else _get_keras_mask(x)
