"""keras_attention: attention layers for Keras 3 and TensorFlow.

Every subpackage is imported here, so that `import keras_attention as ka`
gives `ka.layers`, `ka.visualization.collect_attention`,
`ka.distribution.get_layout_map`, ... The import stays light: the
visualization imports matplotlib when it plots and TensorFlow when the
TensorBoard callback writes its first image.
"""

__version__ = "0.1.0"

from keras_attention import blocks
from keras_attention import distribution
from keras_attention import generation
from keras_attention import interop
from keras_attention import layers
from keras_attention import masks
from keras_attention import mods
from keras_attention import ops
from keras_attention import scores
from keras_attention import visualization

# `keras_attention.layers.TransformerEncoderBlock` / `...DecoderBlock`, kept
# for code written before the blocks moved to `keras_attention.blocks`.
# `keras_attention.layers` may not import `blocks` (a later level); the root
# imports every level and runs first whenever a subpackage is imported, so
# it is the one place that may hang the old names on `layers`.
layers.TransformerDecoderBlock = blocks.TransformerDecoderBlock
layers.TransformerEncoderBlock = blocks.TransformerEncoderBlock

__all__ = [
    "blocks",
    "distribution",
    "generation",
    "interop",
    "layers",
    "masks",
    "mods",
    "ops",
    "scores",
    "visualization",
]
