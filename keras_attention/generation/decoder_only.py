import inspect

import keras
from keras import ops

from keras_attention.generation.cache import init_cache
from keras_attention.generation.cache import stack_caches
from keras_attention.layers._validation import check_bool
from keras_attention.layers._validation import check_positive_int
from keras_attention.layers.position_embedding import PositionEmbedding
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)


def _as_list(x):
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _get_sampler(sampler):
    import keras_hub

    return (
        keras_hub.samplers.get(sampler) if isinstance(sampler, str) else sampler
    )


def _sampler_key(sampler):
    """Samplers given by name share one compiled loop; objects by identity."""
    return sampler if isinstance(sampler, str) else id(sampler)


def position_capacity(layer):
    """How many positions `layer` (an embedding, or a model) can embed.

    The smallest `sequence_length` of the learned position tables in it
    (`PositionEmbedding`, `TokenAndPositionEmbedding`, at any depth), or
    None when it has none (rotary and sinusoidal positions have no limit;
    so has a plain callable).
    """
    if not isinstance(layer, keras.layers.Layer):
        return None
    lengths = [
        sublayer.sequence_length
        for sublayer in layer._flatten_layers(include_self=True, recursive=True)
        if isinstance(sublayer, (PositionEmbedding, TokenAndPositionEmbedding))
    ]
    return min(lengths) if lengths else None


def check_length_fits(layer, length, name, layer_name):
    """Raises `ValueError` when sequences of `length` positions overflow the
    learned position table of `layer` (known before any graph is built)."""
    capacity = position_capacity(layer)
    if capacity is not None and length is not None and length > capacity:
        raise ValueError(
            f"`{name}` exceeds the {capacity!r} positions of the {layer_name}'s "
            "position embedding (its `sequence_length`); generate at most "
            f"that many tokens or train with a longer `sequence_length`. "
            f"Received: {name}={length!r}, sequence_length={capacity!r}"
        )


def mask_after_stop(token_ids, padding_mask, stop_token_ids, pad_token_id):
    """Keeps the first generated stop token, pads everything after it."""
    if stop_token_ids is None:
        return token_ids, ops.ones_like(token_ids, dtype="bool")
    padding_mask = ops.cast(padding_mask, "bool")
    generated = ops.logical_not(padding_mask)
    is_stop = ops.zeros_like(generated)
    for token in stop_token_ids:
        is_stop = ops.logical_or(is_stop, ops.equal(token_ids, token))
    is_stop = ops.cast(ops.logical_and(is_stop, generated), "int32")
    after = ops.cumsum(is_stop, axis=-1) - is_stop  # t - positions after a stop
    valid = ops.equal(after, 0)
    token_ids = ops.where(
        valid, token_ids, ops.cast(pad_token_id, token_ids.dtype)
    )
    return token_ids, valid


class CausalLMGenerator:
    """Generation glue for a decoder-only language model.

    The model is given by its parts, the layers it was trained with:
    `logits = head(blocks[-1](... blocks[0](embedding(token_ids))))`. The
    generator runs them with a fixed-size key/value cache: the prompt is
    processed once (`build_cache`), then each new token costs one pass of a
    single position through the blocks (`next`), whatever its position.
    `generate` drives a `keras_hub` sampler with `next`, compiled once (with
    XLA by default on TensorFlow) per batch size and `max_length`.

    Args:
        embedding: layer mapping token ids `(batch, T)` to `(batch, T, d)`.
            If its `call` takes `start_index` (e.g. `TokenAndPositionEmbedding`,
            or your own layer), decoding passes the absolute position.
        blocks: list of built `TransformerDecoderBlock(cross_attention=False)`
            with the same attention head shape.
        head: layer (or list of layers applied in order) mapping the last
            block's output to logits `(batch, T, vocabulary_size)`.
        pad_token_id: int, the padding id of prompts and outputs.
        jit_compile: bool, compile `generate` with XLA (TensorFlow backend).

    Example:

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> emb = keras_attention.layers.TokenAndPositionEmbedding(
    ...     50, 16, 8, mask_zero=True)
    >>> block = keras_attention.layers.TransformerDecoderBlock(
    ...     2, 16, cross_attention=False)
    >>> head = keras.layers.Dense(50)
    >>> _ = head(block(emb(np.ones((1, 4), "int32"))))  # build
    >>> lm = keras_attention.generation.CausalLMGenerator(emb, [block], head)
    >>> out, mask = lm.generate(np.array([[1, 5, 0, 0, 0, 0]]), sampler="greedy")
    >>> tuple(out.shape)
    (1, 6)

    References:
        - Pope et al., 2022, "Efficiently Scaling Transformer Inference"
          (key/value caching).
    """

    def __init__(
        self, embedding, blocks, head, pad_token_id=0, jit_compile=True
    ):
        self.embedding = embedding
        self.blocks = list(blocks)
        if not self.blocks:
            raise ValueError(
                f"`blocks` must not be empty. Received: blocks={blocks!r}"
            )
        for block in self.blocks:
            if (
                getattr(block, "cross_attention", None)
                is not self._cross_attention
            ):
                raise ValueError(
                    f"`{type(self).__name__}` needs `TransformerDecoderBlock`s "
                    f"with cross_attention={self._cross_attention}. "
                    f"Received: {block!r}"
                )
        self.head = _as_list(head)
        self.pad_token_id = pad_token_id
        self.jit_compile = check_bool("jit_compile", jit_compile)
        self._embedding_takes_start = (
            "start_index" in inspect.signature(embedding.call).parameters
        )
        self._compiled = {}

    _cross_attention = False

    # The model pieces.

    def embed(self, token_ids, start_index=0):
        if self._embedding_takes_start:
            return self.embedding(token_ids, start_index=start_index)
        return self.embedding(token_ids)

    def logits(self, hidden):
        for layer in self.head:
            hidden = layer(hidden)
        return hidden

    def _block_kwargs(self, cache, index):
        return {}

    def call_with_cache(
        self, token_ids, cache, cache_update_index, padding_mask=None
    ):
        """Runs `token_ids` (positions `cache_update_index ..`) through the
        model, reading and writing the stacked cache.

        Returns `(logits, hidden, cache)`.
        """
        self_cache = cache[0] if isinstance(cache, tuple) else cache
        x = self.embed(token_ids, start_index=cache_update_index)
        updated = []
        for i, block in enumerate(self.blocks):
            x, block_cache = block(
                x,
                padding_mask=padding_mask,
                self_attention_cache=self_cache[:, i],
                self_attention_cache_update_index=cache_update_index,
                **self._block_kwargs(cache, i),
            )
            updated.append(block_cache)
        self_cache = stack_caches(updated)
        if isinstance(cache, tuple):
            cache = (self_cache,) + tuple(cache[1:])
        else:
            cache = self_cache
        return self.logits(x), x, cache

    def _empty_cache(self, token_ids):
        batch, max_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        dtype = keras.backend.standardize_dtype(self.blocks[0].compute_dtype)
        return init_cache(self.blocks, batch, max_length, dtype)

    def build_cache(self, token_ids, padding_mask=None, **kwargs):
        """Processes the whole `(batch, max_length)` prompt buffer once.

        Returns `(hidden, cache)`, the cache filled at every position.
        """
        cache = self._empty_cache(token_ids)
        _, hidden, cache = self.call_with_cache(
            token_ids, cache, 0, padding_mask
        )
        return hidden, cache

    def next(self, prompt, cache, index):
        """The `keras_hub` sampler callback: logits for position `index`
        from the token at `index - 1` and the cache of earlier positions."""
        batch = ops.shape(prompt)[0]
        token = ops.slice(prompt, (0, index - 1), (batch, 1))
        logits, hidden, cache = self.call_with_cache(token, cache, index - 1)
        return logits[:, 0], hidden[:, 0], cache

    # Generation.

    def _prepare(self, token_ids, padding_mask, max_length):
        check_positive_int("max_length", max_length, allow_none=True)
        token_ids = ops.convert_to_tensor(token_ids, "int32")
        if max_length is None or max_length <= token_ids.shape[1]:
            # Outputs keep the prompts' length.
            check_length_fits(
                self.embedding,
                token_ids.shape[1],
                "token_ids.shape[1]",
                "decoder embedding",
            )
        else:
            check_length_fits(
                self.embedding, max_length, "max_length", "decoder embedding"
            )
        if padding_mask is None:
            padding_mask = ops.not_equal(token_ids, self.pad_token_id)
        padding_mask = ops.cast(padding_mask, "bool")
        length = token_ids.shape[1]
        if max_length is not None and max_length > length:
            extra = max_length - length
            token_ids = ops.pad(
                token_ids,
                ((0, 0), (0, extra)),
                constant_values=self.pad_token_id,
            )
            padding_mask = ops.pad(padding_mask, ((0, 0), (0, extra)))
        return token_ids, padding_mask

    def _generate_step(
        self, sampler, stop_token_ids, token_ids, padding_mask, **inputs
    ):
        hidden, cache = self.build_cache(token_ids, padding_mask, **inputs)
        lengths = ops.sum(ops.cast(padding_mask, "int32"), axis=-1)
        index = ops.min(lengths)
        result = sampler(
            next=self.next,
            prompt=token_ids,
            cache=cache,
            index=index,
            mask=padding_mask,
            stop_token_ids=stop_token_ids,
            hidden_states=hidden,
        )
        if isinstance(result, tuple):  # BeamSampler(return_all_beams=True)
            return result
        return mask_after_stop(
            result, padding_mask, stop_token_ids, self.pad_token_id
        )

    def _compile(self, sampler, stop_token_ids, num_inputs):
        """One compiled generation loop per sampler and stop tokens (and,
        through tf.function, per input shape)."""
        key = (_sampler_key(sampler), stop_token_ids, num_inputs)
        if key not in self._compiled:
            sampler = _get_sampler(sampler)

            def step(token_ids, padding_mask, *inputs):
                return self._generate_step(
                    sampler,
                    stop_token_ids,
                    token_ids,
                    padding_mask,
                    **dict(zip(self._input_names, inputs)),
                )

            if keras.backend.backend() == "tensorflow":
                import tensorflow as tf

                step = tf.function(step, jit_compile=self.jit_compile)
            self._compiled[key] = (sampler, step)
        return self._compiled[key][1]

    _input_names = ()

    def generate(
        self,
        token_ids,
        max_length=None,
        sampler="greedy",
        stop_token_ids=None,
        padding_mask=None,
    ):
        """Completes right-padded prompts up to `max_length` tokens.

        Args:
            token_ids: int `(batch, T)` prompts, right-padded with
                `pad_token_id`; every prompt needs at least one token.
            max_length: int, total length of the outputs (prompt included);
                defaults to `T`.
            sampler: a `keras_hub.samplers.Sampler` or its name ("greedy",
                "beam", "top_k", "top_p", ...).
            stop_token_ids: optional tuple of end token ids: generation stops
                once every sequence produced one; later tokens are padding.
            padding_mask: optional boolean `(batch, T)`; defaults to
                `token_ids != pad_token_id`.

        Returns:
            `(token_ids, padding_mask)`, both `(batch, max_length)`.
        """
        token_ids, padding_mask = self._prepare(
            token_ids, padding_mask, max_length
        )
        stop = tuple(stop_token_ids) if stop_token_ids is not None else None
        return self._compile(sampler, stop, 0)(token_ids, padding_mask)
