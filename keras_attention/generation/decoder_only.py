"""`CausalLMGenerator`: cached generation for decoder-only models."""

from keras_attention.generation import _checks
from keras_attention.generation._generator import Generator
from keras_attention.utils import validation


class CausalLMGenerator(Generator):
    """Generation glue for a decoder-only language model.

    The model is given by its parts, the layers it was trained with:
    `logits = head(blocks[-1](... blocks[0](embedding(token_ids))))`. The
    generator runs them with a fixed-size key/value cache: the prompt is
    processed once (`build_cache`), then each new token costs one pass of a
    single position through the blocks (`next`), whatever its position.
    `generate` drives a `keras_hub` sampler with `next`, compiled once (with
    XLA by default on TensorFlow) per batch size and `max_length`.
    `Seq2SeqGenerator` is its sibling for encoder-decoder models (both
    share a private base).

    Args:
        embedding: layer (or callable) mapping token ids `(batch, T)` to
            `(batch, T, d)`. If its `call` (a callable: itself) takes
            `start_index` (e.g. `TokenAndPositionEmbedding`, or your own
            layer), decoding passes the absolute position. Token ids are
            checked against its vocabulary when it is a
            `TokenAndPositionEmbedding` or a `keras.layers.Embedding`. The
            tokens it masks (`mask_zero`) are masked at every step as the
            model masks them, generated ones included.
        blocks: list of built `TransformerDecoderBlock(cross_attention=False)`
            (any self-attention implementing `keras_attention.layers.
            TokenMixer`: each block keeps its own cache).
        head: layer (or list of layers applied in order) mapping the last
            block's output to logits `(batch, T, vocabulary_size)`.
        pad_token_id: int (Python or NumPy), the padding id of prompts and
            outputs, a token id of the embedding's vocabulary.
        jit_compile: bool, compile `generate` with XLA (TensorFlow backend).

    Example:

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> emb = keras_attention.layers.TokenAndPositionEmbedding(
    ...     50, 16, 8, mask_zero=True)
    >>> block = keras_attention.blocks.TransformerDecoderBlock(
    ...     2, 16, cross_attention=False)
    >>> head = keras.layers.Dense(50)
    >>> _ = head(block(emb(np.ones((1, 4), "int32"))))  # build
    >>> lm = keras_attention.generation.CausalLMGenerator(emb, [block], head)
    >>> prompt = np.array([[1, 5, 0, 0, 0, 0]])
    >>> out, mask = lm.generate(prompt, sampler="greedy")
    >>> tuple(out.shape)
    (1, 6)

    References:
        - Pope et al., 2022, "Efficiently Scaling Transformer Inference"
          (key/value caching).
    """

    _cross_attention = False
    _input_names = ()

    def build_cache(self, token_ids, padding_mask=None):
        """Processes the whole `(batch, max_length)` prompt buffer once.

        Args:
            token_ids: int `(batch, max_length)` prompts, right-padded.
            padding_mask: optional boolean `(batch, max_length)`.

        Returns:
            `(hidden, cache)`: the last block's output and the tuple of
            the blocks' caches (`init_cache`) of `max_length` positions,
            written at every one.
        """
        return super().build_cache(token_ids, padding_mask)

    def generate(
        self,
        token_ids,
        max_length=None,
        sampler="greedy",
        stop_token_ids=None,
        padding_mask=None,
        sink_tokens=None,
        stream=False,
        cache="auto",
    ):
        """Completes right-padded prompts up to `max_length` tokens.

        Args:
            token_ids: int `(batch, T)` prompts, right-padded with
                `pad_token_id`, or one `(T,)` prompt. Every prompt needs at
                least one token, and no padding before its last token.
            max_length: int >= `T`, total length of the outputs (prompt
                included); defaults to `T`.
            sampler: a `keras_hub.samplers.Sampler` or its name ("greedy",
                "beam", "top_k", "top_p", ...).
            stop_token_ids: optional tuple of end token ids (Python or NumPy
                integers; `pad_token_id` may be one): generation stops once
                every sequence produced one; later tokens are padding.
            padding_mask: optional boolean `(batch, T)` (`(T,)` for one
                prompt); defaults to `token_ids != pad_token_id`.
            sink_tokens: optional int >= 0, for models with windowed
                self-attention: the first `sink_tokens` positions stay
                visible to every later query of a windowed block beside
                its window (attention sinks, StreamingLLM). Defaults to 0.
            stream: bool, or a positive int: return a Python generator of
                the outputs' columns as they are produced, `stream`
                tokens per piece (64 for True), instead of the outputs
                (samplers that draw each token from the logits alone:
                greedy, top-k, top-p, random). Any stack: the blocks'
                caches are made for `max_length` positions at the first
                piece and carried from piece to piece.
            cache: "auto" (default) or "full". "auto" gives each windowed
                self-attention a ring of slots (below); "full" keeps
                `max_length` positions in every block (the same tokens,
                more memory and time).

        Each block keeps its own cache, which its self-attention makes
        (`init_cache`, the `keras_attention.layers.TokenMixer`
        protocol): keys and values of `max_length` positions for softmax
        attention; with `cache="auto"`, a ring of `sink_tokens + window
        + 1` slots for windowed self-attention (`window_size`; score and
        mask objects such as `ALiBi` see absolute positions), so that
        each token costs the same whatever its position and a stack
        whose every self-attention is windowed is bounded only by
        learned position tables; one compressed vector per position for
        DeepSeek's MLA; a state of constant size for
        a linear-time mixer (`mixer="linear"` or `"gated_delta"`). The
        prompts' positions are run, in chunks of the widest window plus
        one (at least 32), up to the shortest prompt's last token, which
        the sampler's first step runs (the longer prompts go on token by
        token in the sampler's loop): every position is written once.
        Tokens the embedding masks (`mask_zero`, e.g. a left-padded
        prompt under a `pad_token_id` the embedding does not mask) are
        never attended to and neither write nor decay a state.

        Returns:
            `(token_ids, padding_mask)`, both `(batch, max_length)`, or
            both `(max_length,)` for one `(T,)` prompt. With `stream`, a
            generator of NumPy int32 arrays `(batch, n)` (`(n,)` for one
            prompt): the first holds the prompts' columns and the first
            generated ones, the next ones `stream` columns each (fewer for
            the last); joined on their last axis, they are the
            `token_ids` that `generate` returns (tokens after a stop
            token are `pad_token_id`, and the stream ends once every
            sequence produced one).

        Raises:
            ValueError: before anything runs, for an argument out of its
                domain, named in the message: prompts that are not integer
                token ids of rank 1 or 2 (or hold ids outside the
                embedding's vocabulary), a prompt with no token or with
                padding before a token, `max_length` below `T` or beyond
                the position embedding, a `padding_mask` of another shape,
                an unknown `sampler`, `stop_token_ids` that are not a tuple
                of token ids, `sink_tokens` for a model without windowed
                self-attention or with `cache="full"` (the block is
                named), a `cache` other than "auto" or "full", a sampler
                that cannot stream.
                Prompts given as symbolic tensors (inside a
                `tf.function` or `jax.jit`) are checked for rank, dtype and
                length only: their values are unknown there, and a prompt
                with no token then gives unspecified tokens.
        """
        options = self._cache_options(sink_tokens, cache)
        piece = self._stream_size(stream)
        if piece is None:
            token_ids, padding_mask, unbatched = self._prepare(
                token_ids, padding_mask, max_length, "token_ids"
            )
            return self._generate(
                sampler,
                stop_token_ids,
                token_ids,
                padding_mask,
                unbatched,
                options=options,
            )
        if _checks.is_integer(max_length):
            max_length = int(max_length)
        validation.check_positive_int("max_length", max_length, allow_none=True)
        token_ids, padding_mask, unbatched = self._prepare(
            token_ids, padding_mask, None, "token_ids"
        )
        length = token_ids.shape[-1]
        self._check_max_length(max_length, length, "token_ids.shape[-1]")
        return self._stream(
            sampler,
            stop_token_ids,
            token_ids,
            padding_mask,
            unbatched,
            max_length,
            options,
            piece,
        )
