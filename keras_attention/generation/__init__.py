"""Cached incremental generation with the `keras_hub` samplers.

`CausalLMGenerator` (decoder-only language models) and
`Seq2SeqGenerator` (encoder-decoder models), siblings over one private
base, turn a model built from `keras_attention.layers` and
`keras_attention.blocks` (an embedding, `TransformerDecoderBlock`s, a head)
into the `next(prompt, cache, index)` function that `keras_hub.samplers`
(greedy, beam, top-k, top-p, ...) call, with each block's own cache (the
`keras_attention.layers.TokenMixer` protocol), of a fixed size, so that
the whole generation loop compiles once.
"""

from keras_attention.generation.cache import init_cache
from keras_attention.generation.decoder_only import CausalLMGenerator
from keras_attention.generation.encoder_decoder import Seq2SeqGenerator

__all__ = [
    "init_cache",
    "CausalLMGenerator",
    "Seq2SeqGenerator",
]
