"""Transformer blocks built from `keras_attention.layers`.

`TransformerEncoderBlock` (self-attention and feed-forward) and its
sibling `TransformerDecoderBlock` (causal self-attention, optional
cross-attention to an encoder's output, feed-forward, with key/value
caches for generation). Both share a private base holding the norms,
dropouts, feed-forward and residual wiring. They were first published as
`keras_attention.layers.TransformerEncoderBlock` / `...DecoderBlock`;
those names still resolve here.
"""

from keras_attention.blocks.transformer_decoder_block import (
    TransformerDecoderBlock,
)
from keras_attention.blocks.transformer_encoder_block import (
    TransformerEncoderBlock,
)

__all__ = [
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
]
