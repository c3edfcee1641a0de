"""Score and mask objects: programmable attention for every path.

`mask(batch, head, q_idx, kv_idx) -> bool` and
`score(score, batch, head, q_idx, kv_idx) -> score` objects (PyTorch
FlexAttention's signatures), Keras-serializable, for the `mask_mod=` and
`score_mod=` arguments of `keras_attention.ops.dot_product_attention`,
`local_attention` and the attention layers and blocks. See the guide
"Programmable attention".
"""

from keras_attention.mods.base import AndMask
from keras_attention.mods.base import MaskMod
from keras_attention.mods.base import OrMask
from keras_attention.mods.base import ScoreLayer
from keras_attention.mods.base import ScoreMod
from keras_attention.mods.base import and_masks
from keras_attention.mods.base import or_masks
from keras_attention.mods.masks import CausalMask
from keras_attention.mods.masks import ChunkedCausalMask
from keras_attention.mods.masks import DocumentMask
from keras_attention.mods.masks import KerasSlidingWindowMask
from keras_attention.mods.masks import PrefixLMMask
from keras_attention.mods.masks import SlidingWindowMask

__all__ = [
    "AndMask",
    "CausalMask",
    "ChunkedCausalMask",
    "DocumentMask",
    "KerasSlidingWindowMask",
    "MaskMod",
    "OrMask",
    "PrefixLMMask",
    "ScoreLayer",
    "ScoreMod",
    "SlidingWindowMask",
    "and_masks",
    "or_masks",
]
