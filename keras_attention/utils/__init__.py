"""Shared helpers: argument checks (`validation`) and Keras helpers
(`keras_utils`). The bottom of the dependency order: they import nothing
from the rest of the package."""

from keras_attention.utils import keras_utils
from keras_attention.utils import validation

__all__ = [
    "keras_utils",
    "validation",
]
