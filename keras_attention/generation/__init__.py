"""Cached incremental generation with the `keras_hub` samplers.

`CausalLMGenerator` (decoder-only language models) and
`Seq2SeqGenerator` (encoder-decoder models), siblings over one private
base, turn a model built from `keras_attention.layers` and
`keras_attention.blocks` (an embedding, `TransformerDecoderBlock`s, a head)
into the `next(prompt, cache, index)` function that `keras_hub.samplers`
(greedy, beam, top-k, top-p, ...) call, with a fixed-size key/value cache so
that the whole generation loop compiles once.
"""

from keras_attention.generation.cache import init_cache
from keras_attention.generation.cache import init_latent_cache
from keras_attention.generation.cache import init_rolling_cache
from keras_attention.generation.cache import latent_cache_width
from keras_attention.generation.cache import rolling_cache_size
from keras_attention.generation.cache import self_attention_cache_shape
from keras_attention.generation.cache import stack_caches
from keras_attention.generation.decoder_only import CausalLMGenerator
from keras_attention.generation.encoder_decoder import Seq2SeqGenerator

__all__ = [
    "init_cache",
    "init_latent_cache",
    "init_rolling_cache",
    "latent_cache_width",
    "rolling_cache_size",
    "self_attention_cache_shape",
    "stack_caches",
    "CausalLMGenerator",
    "Seq2SeqGenerator",
]
