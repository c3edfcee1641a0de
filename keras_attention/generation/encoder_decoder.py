"""`Seq2SeqGenerator`: cached generation for encoder-decoder models."""

from keras import ops

from keras_attention.generation import _checks
from keras_attention.generation._generator import Generator
from keras_attention.generation._generator import check_length_fits


class Seq2SeqGenerator(Generator):
    """Generation glue for an encoder-decoder model (e.g. a translator).

    `logits = head(blocks(embedding(decoder_ids), context=encoder(ids)))`.
    The source is encoded once, and each decoder block's cross-attention
    keys/values of it are computed once per source sentence
    (`TransformerDecoderBlock.compute_cross_attention_cache`). The sampler
    carries the tuple of the blocks' caches (`init_cache`), each
    `(self_attention_cache, cross_keys_values, context_mask)`: the first
    written at each step, the other two read only.
    `CausalLMGenerator` is its sibling for decoder-only models (both share
    a private base).

    Args:
        encoder: callable (a Keras model or layer) mapping encoder token ids
            `(batch, S)` to the encoder output `(batch, S, d)`.
        embedding: the decoder's token embedding layer, mapping token ids
            `(batch, T)` to `(batch, T, d)` (its `start_index`, if its `call`
            takes one, gets the absolute position; the tokens it masks are
            masked at every step, as in `CausalLMGenerator`).
        blocks: list of built `TransformerDecoderBlock(cross_attention=True)`.
        head: layer or list of layers mapping decoder outputs to logits.
        pad_token_id: int (Python or NumPy), padding id of source and
            target sequences (encoder positions holding it are masked
            out), a token id of the decoder embedding's vocabulary.
        jit_compile: bool, compile `generate` with XLA (TensorFlow backend).

    Example:

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> src = keras.Input((None,), dtype="int32")
    >>> src_emb = keras_attention.layers.TokenAndPositionEmbedding(
    ...     50, 16, 8, mask_zero=True)
    >>> enc = keras_attention.blocks.TransformerEncoderBlock(2, 16)
    >>> encoder = keras.Model(src, enc(src_emb(src)))
    >>> emb = keras_attention.layers.TokenAndPositionEmbedding(
    ...     50, 16, 8, mask_zero=True)
    >>> block = keras_attention.blocks.TransformerDecoderBlock(2, 16)
    >>> head = keras.layers.Dense(50)
    >>> x, ctx = np.ones((1, 4), "int32"), np.ones((1, 3, 8), "float32")
    >>> _ = head(block(emb(x), ctx))  # build
    >>> translator = keras_attention.generation.Seq2SeqGenerator(
    ...     encoder, emb, [block], head)
    >>> out, mask = translator.generate(
    ...     np.array([[4, 9, 3, 0]]), np.array([[1, 0, 0, 0, 0]]))
    >>> tuple(out.shape)
    (1, 5)

    References:
        - Vaswani et al., 2017, "Attention Is All You Need".
    """

    _cross_attention = True
    _input_names = ("encoder_token_ids",)

    def __init__(
        self, encoder, embedding, blocks, head, pad_token_id=0, jit_compile=True
    ):
        super().__init__(embedding, blocks, head, pad_token_id, jit_compile)
        self.encoder = _checks.check_callable("encoder", encoder)

    def encode(self, encoder_token_ids):
        """Returns `(context, context_mask)` for the sources."""
        encoder_token_ids = ops.convert_to_tensor(encoder_token_ids, "int32")
        context = self.encoder(encoder_token_ids)
        context_mask = ops.not_equal(encoder_token_ids, self.pad_token_id)
        return context, context_mask

    def _cache_inputs(self, encoder_token_ids=None):
        context, context_mask = self.encode(encoder_token_ids)
        return dict(context=context, context_padding_mask=context_mask)

    def build_cache(self, token_ids, padding_mask=None, encoder_token_ids=None):
        """Encodes the sources and processes the whole `(batch, max_length)`
        prompt buffer once.

        Args:
            token_ids: int `(batch, max_length)` target prompts.
            padding_mask: optional boolean `(batch, max_length)`.
            encoder_token_ids: int `(batch, S)` sources.

        Returns:
            `(hidden, cache)`: the last block's output and the tuple of
            the blocks' caches, each `(self_attention_cache,
            cross_keys_values, context_mask)`, the first written at every
            position.
        """
        return super().build_cache(
            token_ids, padding_mask, encoder_token_ids=encoder_token_ids
        )

    def generate(
        self,
        encoder_token_ids,
        decoder_token_ids,
        max_length=None,
        sampler="greedy",
        stop_token_ids=None,
        padding_mask=None,
    ):
        """Generates target sequences for `encoder_token_ids`.

        Args:
            encoder_token_ids: int `(batch, S)` sources, padded with
                `pad_token_id`, or one `(S,)` source for one `(T,)` prompt.
            decoder_token_ids: int `(batch, T)` target prompts (at least a
                start token each), right-padded with `pad_token_id`, or one
                `(T,)` prompt.
            max_length: int >= `T`, total length of the outputs (prompt
                included); defaults to `T`.
            sampler: a `keras_hub.samplers.Sampler` or its name ("greedy",
                "beam", "top_k", "top_p", ...).
            stop_token_ids: optional tuple of end token ids (Python or NumPy
                integers; `pad_token_id` may be one): generation stops once
                every sequence produced one; later tokens are padding.
            padding_mask: optional boolean `(batch, T)` mask of the target
                prompts (`(T,)` for one prompt); defaults to
                `decoder_token_ids != pad_token_id`.

        Returns:
            `(token_ids, padding_mask)`, both `(batch, max_length)`, or
            both `(max_length,)` for one `(T,)` prompt.

        Raises:
            ValueError: before anything runs, for an argument out of its
                domain, named in the message (as
                `CausalLMGenerator.generate`), and for sources of another
                rank or batch size than the prompts or longer than the
                encoder's position embedding. Symbolic tensors (inside a
                `tf.function` or `jax.jit`) are checked for rank, dtype and
                length only.
        """
        token_ids, padding_mask, unbatched = self._prepare(
            decoder_token_ids, padding_mask, max_length, "decoder_token_ids"
        )
        encoder_token_ids = self._check_sources(
            encoder_token_ids, token_ids.shape[0], unbatched
        )
        return self._generate(
            sampler,
            stop_token_ids,
            token_ids,
            padding_mask,
            unbatched,
            encoder_token_ids,
        )

    def _check_sources(self, encoder_token_ids, batch, unbatched):
        """The sources as `(batch, S)` int32 ids: one `(S,)` source with
        one `(T,)` prompt (`unbatched`), else one source per prompt of the
        `batch` (None when unknown)."""
        encoder_token_ids, _ = _checks.check_token_ids(
            "encoder_token_ids", encoder_token_ids
        )
        shape = tuple(encoder_token_ids.shape)
        if unbatched:
            ok, prompts = len(shape) == 1, "one `(T,)` prompt"
        else:
            ok = len(shape) == 2 and (
                None in (shape[0], batch) or shape[0] == batch
            )
            prompts = f"a batch of {batch!r} prompts"
        if not ok:
            raise ValueError(
                "`encoder_token_ids` must hold one source per target prompt: "
                "`(batch, S)` sources for `(batch, T)` prompts, or one "
                f"`(S,)` source for one `(T,)` prompt; here {prompts}. "
                f"Received: encoder_token_ids.shape={shape!r}"
            )
        check_length_fits(
            self.encoder,
            shape[-1],
            f"encoder_token_ids.shape[{len(shape) - 1}]",
            "encoder",
        )
        if unbatched:
            encoder_token_ids = ops.expand_dims(encoder_token_ids, 0)
        return encoder_token_ids
