"""keras_attention: attention layers for Keras 3 and TensorFlow."""

__version__ = "0.1.0"

from keras_attention import blocks
from keras_attention import generation
from keras_attention import layers
from keras_attention import masks
from keras_attention import ops

__all__ = [
    "blocks",
    "generation",
    "layers",
    "masks",
    "ops",
]
