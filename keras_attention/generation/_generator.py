"""The machinery shared by the generators (private to `generation`).

`Generator` holds what `CausalLMGenerator` and `Seq2SeqGenerator` have in
common: the model pieces (embedding, decoder blocks, head), one pass
through them over a tuple of per-block caches (`call_with_cache`), the
prefill of the prompts, the `keras_hub` sampler callback (`next`) and the
compiled generation loop. Each generator subclasses it directly (they are
siblings), says what its blocks look like (`_cross_attention`), what
extra inputs its loop takes (`_input_names`) and what else its blocks'
caches are made from (`_cache_inputs`), and exposes its own `generate`.

The generators never look inside a cache: each block makes its own
(`block.init_cache`, the `keras_attention.layers.TokenMixer` protocol),
and takes it back at each call. Streamed generation is the mixin
`_streaming.StreamingMixin`; the samplers' helpers are in `_samplers`.

The helpers below (`position_capacity`, `check_length_fits`,
`mask_after_stop`) are shared by both generators; the argument checks are
in `_checks`.
"""

import keras
from keras import ops

from keras_attention.generation import _checks
from keras_attention.generation._samplers import get_sampler
from keras_attention.generation._samplers import sampler_key
from keras_attention.generation._samplers import uses_hidden_states
from keras_attention.generation._streaming import StreamingMixin
from keras_attention.generation.cache import init_cache
from keras_attention.layers.position_embedding import PositionEmbedding
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)
from keras_attention.ops import compile_step
from keras_attention.utils import validation

# The most positions one prefill call writes (a static chunk). A compiled
# loop (XLA) holds buffers for its body whether or not it runs, such as
# each layer's scores of a chunk against its cache, `chunk * (cache +
# chunk)` per head: whole 8,193-position chunks (Llama 4's window plus
# one) against a 8,192-slot ring took GBs for an 8-token prompt. A prompt
# of `P` positions costs `P / chunk` calls of the same work in all.
PREFILL_CHUNK = 512
# The most scores per head of a prefill call against a buffer of
# `max_length` positions (4 MiB in float32): a chunk attends to the whole
# buffer, written or not. `benchmarks/chunked_cache.py`'s compiled
# prefill (4 layers, 4 heads, 32,768 positions) peaked 2.0 GB above the
# model with chunks of 512, 1.45 GB with 128, 1.15 GB with 32 (caches:
# 256 MiB). The work in all is the same.
PREFILL_SCORES = 2**20
MIN_PREFILL_CHUNK = 16


def prefill_chunk(width, widest=None):
    """A prefill call's positions on a buffer of `width` (None: unknown):
    at most `widest`, `PREFILL_CHUNK`, `width` and `PREFILL_SCORES /
    width` (not under `MIN_PREFILL_CHUNK`)."""
    chunk = PREFILL_CHUNK if widest is None else min(widest, PREFILL_CHUNK)
    if width is None:
        return chunk
    bound = max(PREFILL_SCORES // width, MIN_PREFILL_CHUNK)
    return max(min(chunk, bound, width), 1)


def as_list(x):
    """`x` as a list: None -> [], a layer -> [layer], a sequence -> list."""
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def position_capacity(layer):
    """How many positions `layer` (an embedding, or a model) can embed.

    The smallest `sequence_length` of the learned position tables in it
    (`PositionEmbedding`, `TokenAndPositionEmbedding`, at any depth), or
    None when it has none (rotary and sinusoidal positions have no limit;
    so has a plain callable).
    """
    table = position_table(layer)
    return None if table is None else table.sequence_length


def position_table(layer):
    """The learned position table in `layer` (an embedding, or a model)
    with the fewest positions (see `position_capacity`), or None."""
    if not isinstance(layer, keras.layers.Layer):
        return None
    tables = [
        sublayer
        for sublayer in layer._flatten_layers(include_self=True, recursive=True)
        if isinstance(sublayer, (PositionEmbedding, TokenAndPositionEmbedding))
    ]
    return min(tables, key=lambda t: t.sequence_length) if tables else None


def check_length_fits(layer, length, name, layer_name):
    """Raises `ValueError` when sequences of `length` positions overflow the
    learned position table of `layer` (known before any graph is built),
    naming the table's layer."""
    capacity = position_capacity(layer)
    if capacity is not None and length is not None and length > capacity:
        table = position_table(layer)
        raise ValueError(
            f"`{name}` exceeds the {capacity!r} positions of the "
            f"{layer_name}'s position embedding (layer {table.name!r}, its "
            "`sequence_length`); generate at most that many tokens or "
            "train with a longer `sequence_length`. Received: "
            f"{name}={length!r}, sequence_length={capacity!r}"
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


def free_id(pad_token_id, stop_token_ids):
    """`pad_token_id`, or the smallest id that is no stop token when it is
    one: what the positions still to generate hold."""
    token = pad_token_id
    if token in stop_token_ids:
        token = min(set(range(len(stop_token_ids) + 1)) - set(stop_token_ids))
    return token


class Generator(StreamingMixin):
    """Base of the generators: a decoder (embedding, blocks, head) run with
    a fixed-size key/value cache and driven by a `keras_hub` sampler.

    `logits = head(blocks[-1](... blocks[0](embedding(token_ids))))`.
    Subclasses set `_cross_attention` (the `cross_attention` their blocks
    must have) and `_input_names` (the extra inputs of the compiled loop,
    passed to `_cache_inputs` by name), and write `generate`.

    Args:
        embedding: layer (or callable) mapping token ids `(batch, T)` to
            `(batch, T, d)`. If its `call` (a callable: itself) takes
            `start_index` (e.g. `TokenAndPositionEmbedding`, or your own
            layer), decoding passes the absolute position. Token ids are
            checked against its vocabulary when it is a
            `TokenAndPositionEmbedding` or a `keras.layers.Embedding`. The
            tokens it masks (`mask_zero`) are masked at every step as the
            model masks them, generated ones included.
        blocks: list of built `TransformerDecoderBlock`s (any
            self-attention implementing `keras_attention.layers.
            TokenMixer`).
        head: layer (or list of layers applied in order) mapping the last
            block's output to logits `(batch, T, vocabulary_size)`.
        pad_token_id: int (Python or NumPy), the padding id of prompts and
            outputs, a token id of the embedding's vocabulary.
        jit_compile: bool, compile `generate` with XLA (TensorFlow backend).

    The constructor raises `ValueError`, naming the argument, for pieces
    that are not callables, `blocks` that are not a non-empty list of
    decoder blocks of the right kind, and a `pad_token_id` that is not a
    token id.
    """

    _cross_attention = False
    _input_names = ()

    def __init__(
        self, embedding, blocks, head, pad_token_id=0, jit_compile=True
    ):
        self.embedding = _checks.check_callable("embedding", embedding)
        self.blocks = self._check_blocks(blocks)
        self.head = self._check_head(head)
        self.pad_token_id = _checks.check_token_id(
            "pad_token_id", pad_token_id, self._vocabulary_size
        )
        self.jit_compile = validation.check_bool("jit_compile", jit_compile)
        self._embedding_takes_start = _checks.takes_start_index(embedding)
        self._compiled = {}

    @property
    def _vocabulary_size(self):
        """The token ids the embedding can look up, or None when unknown
        (an embedding layer of another kind): prompts, `pad_token_id` and
        `stop_token_ids` are checked against it."""
        return _checks.vocabulary_size(self.embedding)

    def _check_blocks(self, blocks):
        """`blocks` as a non-empty list of decoder blocks with the
        `cross_attention` of this generator."""
        if not isinstance(blocks, (list, tuple)) or not blocks:
            raise ValueError(
                "`blocks` must be a non-empty list of "
                f"`TransformerDecoderBlock`s. Received: blocks={blocks!r}"
            )
        for block in blocks:
            cross_attention = getattr(block, "cross_attention", None)
            if cross_attention is not self._cross_attention:
                raise ValueError(
                    f"`{type(self).__name__}` needs `blocks` of "
                    "`TransformerDecoderBlock`s with "
                    f"cross_attention={self._cross_attention}. "
                    f"Received: {block!r} in blocks={blocks!r}"
                )
        return list(blocks)

    def _check_head(self, head):
        """`head` as a non-empty list of callables."""
        layers = as_list(head)
        if not layers or not all(callable(layer) for layer in layers):
            raise ValueError(
                "`head` must be a layer, or a non-empty list of layers, "
                f"mapping hidden states to logits. Received: head={head!r}"
            )
        return layers

    def _check_built(self):
        """Raises `ValueError` unless every block is built (the cache's
        shape is read from the blocks' weights)."""
        unbuilt = [i for i, block in enumerate(self.blocks) if not block.built]
        if unbuilt:
            raise ValueError(
                "`blocks` must be built before generating: call the model "
                "(or each block) once. Received: unbuilt blocks at "
                f"positions {unbuilt!r} of blocks={self.blocks!r}"
            )

    # The model pieces.

    def embed(self, token_ids, start_index=0):
        """The embedding of `token_ids` at positions `start_index ..`."""
        if self._embedding_takes_start:
            return self.embedding(token_ids, start_index=start_index)
        return self.embedding(token_ids)

    def logits(self, hidden):
        """The head's logits of the last block's output `hidden`."""
        for layer in self.head:
            hidden = layer(hidden)
        return hidden

    def _token_mask(self, token_ids, padding_mask=None):
        """The mask of `token_ids` as the blocks take it: the embedding's
        Keras mask (`mask_zero`) and-ed with `padding_mask`; None when
        there is neither."""
        mask = self._embedding_mask(token_ids)
        if padding_mask is None:
            return mask
        padding_mask = ops.cast(padding_mask, "bool")
        if mask is None:
            return padding_mask
        return ops.logical_and(ops.cast(mask, "bool"), padding_mask)

    def call_with_cache(
        self, token_ids, cache, cache_update_index, padding_mask=None
    ):
        """Runs `token_ids` (positions `cache_update_index ..`) through the
        model, each block reading and writing its own cache.

        Args:
            token_ids: int `(batch, T)` (static `T`).
            cache: the tuple of the blocks' caches (`init_cache`), in
                which positions `0 .. cache_update_index - 1` were written
                in order.
            cache_update_index: int or int scalar tensor, the position of
                `token_ids[:, 0]` (a block's cache of `max_length`
                positions refuses one that does not fit, naming it).
            padding_mask: optional boolean `(batch, T)`, this call's
                tokens' mask, and-ed with the embedding's Keras mask: a
                masked token is never attended to, now or later.

        Returns:
            `(logits, hidden, cache)`.
        """
        start = cache_update_index
        if _checks.is_integer(start) and start < 0:
            start = 0  # the blocks refuse it, naming their caches' sizes
        x = self.embed(token_ids, start_index=start)
        mask = self._token_mask(token_ids, padding_mask)
        updated = []
        for block, block_cache in zip(self.blocks, cache):
            x, block_cache = block(
                x,
                cache=block_cache,
                cache_update_index=cache_update_index,
                padding_mask=mask,
            )
            updated.append(block_cache)
        return self.logits(x), x, tuple(updated)

    def _cache_inputs(self, **inputs):
        """What the blocks' caches are made from beside their size (the
        `init_cache` options of a subclass: an encoder's context)."""
        return {}

    def _new_cache(self, batch_size, max_length, options=(), **inputs):
        """The empty tuple of the blocks' caches; `options`: the pairs of
        `init_cache` options of `_cache_options`."""
        return init_cache(
            self.blocks,
            batch_size,
            max_length,
            **dict(options),
            **self._cache_inputs(**inputs),
        )

    def build_cache(self, token_ids, padding_mask=None, **inputs):
        """Processes the whole `(batch, max_length)` prompt buffer once
        (positions masked by `padding_mask` are written masked).

        Returns `(hidden, cache)`: the last block's outputs and the
        blocks' caches of `max_length` positions, written at every one.
        """
        batch, width = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        cache = self._new_cache(batch, width, **inputs)
        _, hidden, cache = self.call_with_cache(
            token_ids, cache, 0, padding_mask
        )
        return hidden, cache

    def _next(self, offset=0):
        """The sampler callback `next(prompt, cache, index)`: logits for
        position `offset + index` from the token `prompt[:, index - 1]`
        (at position `offset + index - 1`) and the cache of the earlier
        positions."""

        def next(prompt, cache, index):
            batch = ops.shape(prompt)[0]
            token = ops.slice(prompt, (0, index - 1), (batch, 1))
            logits, hidden, cache = self.call_with_cache(
                token, cache, offset + index - 1
            )
            return logits[:, 0], hidden[:, 0], cache

        return next

    def next(self, prompt, cache, index):
        """The `keras_hub` sampler callback: logits for position `index`
        from the token at `index - 1` and the cache of earlier positions."""
        return self._next()(prompt, cache, index)

    def _window(self):
        """The widest window of the blocks' self-attention
        (`cache_window()`), or None when no block has one."""
        windows = [
            block.cache_window()
            for block in self.blocks
            if callable(getattr(block, "cache_window", None))
        ]
        windows = [w for w in windows if w is not None]
        return max(windows) if windows else None

    def _cache_options(self, sink_tokens, cache="auto"):
        """The `init_cache` options of `generate`'s caches, as a tuple of
        pairs: `sink_tokens` (0 when None) for "auto" when a block has
        windowed self-attention (which turns it into a ring of slots);
        none for "full" (`max_length` positions in every block). Raises
        `ValueError` for a `cache` other than "auto" or "full", for
        `sink_tokens` that are not a non-negative int, or given where no
        block is windowed or with "full" (the block is named)."""
        if cache not in ("auto", "full"):
            raise ValueError(
                '`cache` must be "auto" (a ring of slots for each windowed '
                'self-attention, a full cache for the others) or "full" '
                f"(max_length positions in every block). Received: "
                f"cache={cache!r}"
            )
        if sink_tokens is not None and (
            not _checks.is_integer(sink_tokens) or sink_tokens < 0
        ):
            raise ValueError(
                "`sink_tokens` must be None or a non-negative int (the first "
                "positions kept beside the window). "
                f"Received: sink_tokens={sink_tokens!r}"
            )
        self._check_built()
        if sink_tokens is not None and cache == "full":
            raise ValueError(
                "`sink_tokens` needs a ring of slots, and cache='full' "
                f"keeps none. Received: sink_tokens={sink_tokens!r}, "
                f"cache={cache!r}"
            )
        if sink_tokens is not None and self._window() is None:
            block = self.blocks[0]
            raise ValueError(
                "`sink_tokens` needs a ring of slots, so windowed "
                "self-attention (`window_size`) in at least one block; "
                f"block 0 ({block.name!r}, self-attention "
                f"{type(getattr(block, 'self_attention', block)).__name__}) "
                "has none, nor has any other. Received: "
                f"sink_tokens={sink_tokens!r}"
            )
        if cache == "full" or self._window() is None:
            return ()
        return (("sink_tokens", 0 if sink_tokens is None else sink_tokens),)

    def _overwrites_positions(self, cache):
        """Whether every block's cache keeps a slot per position that a
        call at that position overwrites (`cache_overwrites_positions`
        of the `TokenMixer` protocol): then a prompt buffer is written in
        one call."""
        return all(
            callable(getattr(block, "cache_overwrites_positions", None))
            and block.cache_overwrites_positions(block_cache)
            for block, block_cache in zip(self.blocks, cache)
        )

    def _prefill_slots(self, token_ids, padding_mask, cache, hidden):
        """`_prefill` for caches that keep a slot per position: the
        buffer (static length) in chunks of `prefill_chunk` positions (in
        one call when it is shorter), from its start to past the shortest
        prompt's last position, its masked positions written masked; the
        samplers' steps from the shortest prompt's end overwrite the
        positions after it (the same tokens where a prompt is longer).
        A last chunk past the buffer's end is moved back to end with it:
        it writes some positions again, with the same values."""
        batch, width = ops.shape(token_ids)[0], token_ids.shape[1]
        chunk = prefill_chunk(width)
        shortest = ops.min(ops.sum(ops.cast(padding_mask, "int32"), axis=-1))
        write, outputs = self._prefill_outputs(token_ids, hidden)

        def body(i, outputs, cache):
            start = ops.minimum(i * chunk, width - chunk)
            tokens = ops.slice(token_ids, (0, start), (batch, chunk))
            mask = ops.slice(padding_mask, (0, start), (batch, chunk))
            _, h, cache = self.call_with_cache(tokens, cache, start, mask)
            return i + 1, write(outputs, h, start), cache

        if chunk == width:  # one call: no loop to compile
            _, outputs, cache = body(0, outputs, cache)
        else:
            _, outputs, cache = ops.while_loop(
                lambda i, outputs, cache: i * chunk < shortest,
                body,
                (ops.convert_to_tensor(0, "int32"), outputs, cache),
            )
        if not hidden:
            return None, cache, shortest
        positions = ops.arange(width)
        kept = ops.expand_dims(ops.expand_dims(positions < shortest, 0), -1)
        outputs = ops.where(kept, outputs, ops.zeros_like(outputs))
        return outputs, cache, shortest

    def _prefill_outputs(self, token_ids, hidden):
        """`(write, outputs)`: the buffer of the last block's outputs
        `(batch, max_length, d)` in zeros (with `hidden`, else a
        placeholder the loops carry unchanged) and `write(outputs, h,
        start)`, which puts a call's outputs `h` at `start`."""
        dtype = keras.backend.standardize_dtype(self.blocks[0].compute_dtype)
        shape = (1, 1, 1)
        if hidden:
            features = self.embed(token_ids[:, :1]).shape[-1]
            shape = (ops.shape(token_ids)[0], ops.shape(token_ids)[1], features)

        def write(outputs, h, start):
            if not hidden:
                return outputs
            return ops.slice_update(outputs, (0, start, 0), ops.cast(h, dtype))

        return write, ops.zeros(shape, dtype)

    def _prefill(self, token_ids, padding_mask, cache, hidden):
        """Writes the shortest prompt's positions but its last into the
        empty `cache` (the sampler's first step runs that one: a position
        is written once), in chunks of `prefill_chunk` positions when
        every block's cache keeps a slot per position (`_prefill_slots`),
        else in chunks of static length (the widest window plus one, at
        least 32, within `prefill_chunk`'s bounds when the buffer's
        length is known), then the rest one position at a time.

        Returns `(hidden, cache, index)`: with `hidden`, the last block's
        outputs `(batch, max_length, d)` at the prompt's positions up to
        the shortest prompt's last (zeros after; the contrastive sampler
        compares with them), else None (no buffer of the outputs: the
        other samplers ignore it); the cache; and the shortest prompt's
        length (where the samplers start).

        The buffer's length may be unknown while tracing (a `tf.function`
        taking prompts of any length): only the chunks are static.
        """
        # Slot chunks need the buffer's length while tracing (a cached
        # call of an unknown number of tokens does not trace).
        if token_ids.shape[1] is not None and self._overwrites_positions(cache):
            return self._prefill_slots(token_ids, padding_mask, cache, hidden)
        batch, width = ops.shape(token_ids)[0], token_ids.shape[1]
        chunk = prefill_chunk(width, max((self._window() or 0) + 1, 32))
        shortest = ops.min(ops.sum(ops.cast(padding_mask, "int32"), axis=-1))
        chunks = (shortest - 1) // chunk
        write, outputs = self._prefill_outputs(token_ids, hidden)

        def body(i, outputs, cache):
            start = i * chunk
            tokens = ops.slice(token_ids, (0, start), (batch, chunk))
            _, h, cache = self.call_with_cache(tokens, cache, start)
            return i + 1, write(outputs, h, start), cache

        _, outputs, cache = ops.while_loop(
            lambda i, outputs, cache: i < chunks,
            body,
            (ops.convert_to_tensor(0, "int32"), outputs, cache),
        )
        last = shortest - 1

        def step_body(position, outputs, cache):
            token = ops.slice(token_ids, (0, position), (batch, 1))
            _, h, cache = self.call_with_cache(token, cache, position)
            return position + 1, write(outputs, h, position), cache

        _, outputs, cache = ops.while_loop(
            lambda position, outputs, cache: position < last,
            step_body,
            (chunks * chunk, outputs, cache),
        )
        if hidden:  # the last position's, not kept in the cache
            token = ops.slice(token_ids, (0, last), (batch, 1))
            _, h, _ = self.call_with_cache(token, cache, last)
            outputs = write(outputs, h, last)
        return (outputs if hidden else None), cache, shortest

    def _embedding_mask(self, token_ids):
        """The embedding layer's Keras mask of `token_ids` (`mask_zero`),
        None when it computes none: the model masks those tokens as keys
        too, generated ones included (a generated padding id)."""
        if not isinstance(self.embedding, keras.layers.Layer):
            return None
        return self.embedding.compute_mask(token_ids, None)

    # Generation.

    def _prepare(self, token_ids, padding_mask, max_length, name):
        """Checks the prompts `token_ids` (the argument `name`), their
        `padding_mask` and `max_length`, and right-pads the prompts and
        their mask to `max_length`.

        Returns `(token_ids, padding_mask, unbatched)`: both `(batch,
        max_length)`, and whether the prompt was one `(T,)` sequence (a
        batch of one here).
        """
        if _checks.is_integer(max_length):  # np.int64(6) -> 6
            max_length = int(max_length)
        validation.check_positive_int("max_length", max_length, allow_none=True)
        self._check_built()
        token_ids, values = _checks.check_token_ids(
            name, token_ids, self._vocabulary_size
        )
        shape = tuple(token_ids.shape)
        unbatched = len(shape) == 1
        length = shape[-1]
        length_name = f"{name}.shape[{len(shape) - 1}]"
        self._check_max_length(max_length, length, length_name)
        explicit_mask = padding_mask is not None
        if explicit_mask:
            padding_mask, mask_values = _checks.check_prompt_mask(
                padding_mask, shape, name
            )
        else:
            padding_mask = ops.not_equal(token_ids, self.pad_token_id)
            mask_values = None
            if values is not None:
                mask_values = values != self.pad_token_id
        if unbatched:
            token_ids = ops.expand_dims(token_ids, 0)
            padding_mask = ops.expand_dims(padding_mask, 0)
        if mask_values is not None:
            _checks.check_right_padded(
                mask_values[None] if unbatched else mask_values,
                name,
                token_ids if values is None else values,
                padding_mask=mask_values if explicit_mask else None,
                pad=self.pad_token_id,
            )
        if max_length is not None and max_length > length:
            extra = max_length - length
            token_ids = ops.pad(
                token_ids,
                ((0, 0), (0, extra)),
                constant_values=self.pad_token_id,
            )
            padding_mask = ops.pad(padding_mask, ((0, 0), (0, extra)))
        return token_ids, padding_mask, unbatched

    def _check_max_length(self, max_length, length, length_name):
        """Raises `ValueError` unless the outputs, `max_length` long (the
        prompts' `length` when None), hold the prompts and fit the
        embedding's positions."""
        if length is None and max_length is not None:
            raise ValueError(
                "With `max_length`, symbolic prompts need a static length "
                f"(the outputs are padded to it). Received: {length_name}="
                f"None, max_length={max_length!r}"
            )
        if max_length is not None and max_length < length:
            raise ValueError(
                "`max_length` is the length of the outputs, prompts "
                "included: it must be at least the prompts' length "
                f"`{length_name}`. Received: max_length={max_length!r}, "
                f"{length_name}={length!r}"
            )
        if max_length is None:
            self._check_fits(length, length_name)
        else:
            self._check_fits(max_length, "max_length")

    def _check_fits(self, length, name):
        check_length_fits(self.embedding, length, name, "decoder embedding")

    def _generate_step(
        self,
        sampler,
        stop_token_ids,
        token_ids,
        padding_mask,
        options=(),
        **inputs,
    ):
        if stop_token_ids is not None:
            # The samplers stop once every row holds a stop token at a
            # position it generates: the positions still to generate must
            # not hold one already (a `pad_token_id` that is also the end
            # token; anything under an explicit `padding_mask`).
            token_ids = ops.where(
                padding_mask,
                token_ids,
                free_id(self.pad_token_id, stop_token_ids),
            )
        batch, width = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        cache = self._new_cache(batch, width, options, **inputs)
        hidden, cache, index = self._prefill(
            token_ids, padding_mask, cache, uses_hidden_states(sampler)
        )
        result = sampler(
            next=self._next(),
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

    def _generate(
        self,
        sampler,
        stop_ids,
        token_ids,
        padding_mask,
        unbatched,
        *inputs,
        options=(),
    ):
        """Runs the compiled loop on prepared prompts (`_prepare`); one
        `(T,)` prompt (`unbatched`) gives `(max_length,)` outputs.
        `options`: the caches' (`_cache_options`)."""
        stop_token_ids = _checks.check_stop_token_ids(
            stop_ids, self._vocabulary_size
        )
        step = self._compile(sampler, stop_token_ids, options)
        outputs = step(token_ids, padding_mask, *inputs)
        if unbatched:
            return tuple(output[0] for output in outputs)
        return outputs

    def _compile(self, sampler, stop_token_ids, options=()):
        """One compiled generation loop per sampler, stop tokens (a tuple
        of ints, or None) and cache options (and, through tf.function,
        per input shape): `step(token_ids, padding_mask, *inputs)`,
        `inputs` named by `_input_names`."""
        key = (sampler_key(sampler), stop_token_ids) + options
        if key not in self._compiled:
            sampler = get_sampler(sampler)

            def step(token_ids, padding_mask, *inputs):
                return self._generate_step(
                    sampler,
                    stop_token_ids,
                    token_ids,
                    padding_mask,
                    options,
                    **dict(zip(self._input_names, inputs)),
                )

            self._compiled[key] = (
                sampler,
                compile_step(step, self.jit_compile, autograph=False),
            )
        return self._compiled[key][1]
