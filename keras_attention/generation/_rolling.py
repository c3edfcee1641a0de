"""The rolling cache of the generators (private to `generation`):
`RollingCacheMixin`, the methods of `Generator` that run a model whose
every self-attention is windowed over a ring of cache slots (attention
sinks included) instead of the full cache.
"""

import keras
from keras import ops

from keras_attention.generation import _checks
from keras_attention.generation.cache import init_rolling_cache
from keras_attention.generation.cache import rolling_cache_size
from keras_attention.generation.cache import stack_caches
from keras_attention.generation.cache import unwindowed_block
from keras_attention.ops.rolling_cache import rolling_cache_write
from keras_attention.utils.attention_checks import check_cache_index


class RollingCacheMixin:
    """The rolling cache (every self-attention windowed) of `Generator`:
    one pass through the model over it (`call_with_rolling_cache`), the
    sampler callback over it, the prefill of the prompts (`_prefill`, also
    the mixed cache's), and which cache `generate` keeps (`_cache_plan`).
    Reads the model pieces and helpers of `Generator` (`embed`,
    `blocks`, `logits`, `_block_kwargs`, `_embedding_mask`,
    `_check_built`)."""

    def call_with_rolling_cache(self, token_ids, cache, start, sink_tokens=0):
        """Runs `token_ids` (positions `start ..`) through the model with a
        rolling cache (`init_rolling_cache`) in which positions `0 ..
        start - 1` were written in order; writes this call's positions.

        Every self-attention must be windowed. Each query attends to the
        cached positions within its window or below `sink_tokens`, and to
        this call's positions up to its own; tokens the embedding masks
        are masked as keys and queries, as in `call_with_cache`.

        Args:
            token_ids: int `(batch, T)` (static `T`).
            cache: `(keys_values, slot_mask)` of `rolling_cache_size(
                blocks, sink_tokens)` slots (or more).
            start: int or int scalar tensor, the position of
                `token_ids[:, 0]`.
            sink_tokens: int >= 0, the attention sinks (the same at every
                call on one cache).

        Returns:
            `(logits, hidden, cache)`.
        """
        keys_values, slot_mask = cache
        check_cache_index(
            start,
            _checks.token_steps(token_ids),
            keys_values.shape[3],
            "start",
            True,
        )
        x = self.embed(token_ids, start_index=start)
        batch, steps = ops.shape(token_ids)[0], token_ids.shape[1]
        token_mask = self._embedding_mask(token_ids)
        if token_mask is None:
            token_mask = ops.ones((batch, steps), "bool")
        token_mask = ops.cast(token_mask, "bool")
        keys = ops.concatenate([slot_mask, token_mask], axis=1)
        attention_mask = ops.repeat(ops.expand_dims(keys, 1), steps, axis=1)
        updated = []
        for i, block in enumerate(self.blocks):
            x, block_cache = block(
                x,
                attention_mask=attention_mask,
                self_attention_cache=keys_values[:, i],
                self_attention_cache_update_index=start,
                self_attention_cache_sink_tokens=sink_tokens,
                **self._block_kwargs(cache, i),
            )
            updated.append(block_cache)
        slot_mask = rolling_cache_write(
            slot_mask, token_mask, start, sink_tokens
        )
        return self.logits(x), x, (stack_caches(updated), slot_mask)

    def _rolling_size(self, sink_tokens):
        return rolling_cache_size(self.blocks, sink_tokens)

    def _rolling_next(self, sink_tokens, offset=0):
        """The sampler callback `next(prompt, cache, index)` over a rolling
        cache: `prompt[:, index - 1]` sits at position `offset + index -
        1`."""

        def next(prompt, cache, index):
            batch = ops.shape(prompt)[0]
            token = ops.slice(prompt, (0, index - 1), (batch, 1))
            logits, hidden, cache = self.call_with_rolling_cache(
                token, cache, offset + index - 1, sink_tokens
            )
            return logits[:, 0], hidden[:, 0], cache

        return next

    def _rolling_prefill(
        self, token_ids, padding_mask, sink_tokens, hidden=True
    ):
        """Writes the shortest prompt's positions into an empty rolling
        cache (`_prefill`, in chunks of the ring's slots, at least 32).

        Returns `(hidden, cache, index)` (`hidden` None unless asked)."""
        batch = ops.shape(token_ids)[0]
        size = self._rolling_size(sink_tokens)
        dtype = keras.backend.standardize_dtype(self.blocks[0].compute_dtype)
        cache = init_rolling_cache(self.blocks, batch, size, dtype)

        def call(tokens, cache, start):
            return self.call_with_rolling_cache(
                tokens, cache, start, sink_tokens
            )

        return self._prefill(
            token_ids, padding_mask, cache, size - sink_tokens, call, hidden
        )

    def _prefill(
        self,
        token_ids,
        padding_mask,
        cache,
        ring,
        call,
        hidden,
        repeat_last=True,
    ):
        """Writes the shortest prompt's positions into an empty cache of
        constant size per step (rolling or mixed): `call(tokens, cache,
        start)` in chunks of static length (the ring's `ring` slots, at
        least 32, at most the buffer's length when known), then the rest
        one position at a time. With `repeat_last=False` (a cache that
        cannot take a position twice: a recurrent state), the last
        position is left out of the cache returned (its hidden state is
        computed when asked): the samplers' first step runs it.

        Returns `(hidden, cache, index)`: with `hidden`, the last block's
        outputs `(batch, max_length, d)` at the positions written (zeros
        after; the contrastive sampler compares with them), else None
        (no buffer of the outputs: the other samplers ignore it); the
        cache; and the shortest prompt's length (where the samplers
        start: they run the token at `index - 1` again, which rewrites its
        slot with the same keys and sees the same ones).

        The buffer's length may be unknown while tracing (a `tf.function`
        taking prompts of any length): only the chunks are static.
        """
        batch, width = ops.shape(token_ids)[0], token_ids.shape[1]
        chunk = max(ring, 32)
        if width is not None:
            chunk = min(chunk, width)
        dtype = keras.backend.standardize_dtype(self.blocks[0].compute_dtype)
        shortest = ops.min(ops.sum(ops.cast(padding_mask, "int32"), axis=-1))
        chunks = (shortest - 1) // chunk
        if hidden:
            features = self.embed(token_ids[:, :1]).shape[-1]
            shape = (batch, ops.shape(token_ids)[1], features)
        else:
            shape = (1, 1, 1)  # a placeholder the loops carry unchanged
        outputs = ops.zeros(shape, dtype)

        def write(outputs, h, start):
            if not hidden:
                return outputs
            return ops.slice_update(outputs, (0, start, 0), ops.cast(h, dtype))

        def cond(i, outputs, cache):
            return i < chunks

        def body(i, outputs, cache):
            start = i * chunk
            tokens = ops.slice(token_ids, (0, start), (batch, chunk))
            _, h, cache = call(tokens, cache, start)
            return i + 1, write(outputs, h, start), cache

        _, outputs, cache = ops.while_loop(
            cond, body, (ops.convert_to_tensor(0, "int32"), outputs, cache)
        )

        last = shortest if repeat_last else shortest - 1

        def step_cond(position, outputs, cache):
            return position < last

        def step_body(position, outputs, cache):
            token = ops.slice(token_ids, (0, position), (batch, 1))
            _, h, cache = call(token, cache, position)
            return position + 1, write(outputs, h, position), cache

        _, outputs, cache = ops.while_loop(
            step_cond, step_body, (chunks * chunk, outputs, cache)
        )
        if hidden and not repeat_last:  # the last position's, not kept
            token = ops.slice(token_ids, (0, last), (batch, 1))
            _, h, _ = call(token, cache, last)
            outputs = write(outputs, h, last)
        return (outputs if hidden else None), cache, shortest

    def _cache_plan(self, sink_tokens, cache="auto"):
        """Which cache `generate` keeps: an int (the sinks of a rolling
        cache) when every self-attention is windowed, a `MixedPlan` when
        some are (a rolling cache for those, a full one for the others)
        or some blocks have latent attention (their latent caches), else
        None (the full cache); for `cache="full"`, None too, or a
        `MixedPlan` of full and latent caches. Raises `ValueError` for a
        `cache` other than "auto" or "full", for `sink_tokens` that are
        not a non-negative int, or given where no rolling cache is kept
        (the block is named)."""
        if cache not in ("auto", "full"):
            raise ValueError(
                '`cache` must be "auto" (a rolling cache for each windowed '
                'self-attention, a full one for the others) or "full" '
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
        sinks = 0 if sink_tokens is None else int(sink_tokens)
        if cache == "auto":
            if unwindowed_block(self.blocks) is None:
                return sinks
            plan = self.mixed_cache_plan(sinks)
            if plan is not None and (plan.windowed or sink_tokens is None):
                return plan
        if sink_tokens is not None:
            if cache == "full":
                raise ValueError(
                    "`sink_tokens` needs a rolling cache, and "
                    "cache='full' keeps none. Received: "
                    f"sink_tokens={sink_tokens!r}, cache={cache!r}"
                )
            index, block = unwindowed_block(self.blocks)
            raise ValueError(
                "`sink_tokens` needs a rolling cache, so windowed "
                "self-attention (`window_size`) in at least one block; "
                f"block {index} ({block.name!r}, "
                f"self-attention {type(block.self_attention).__name__}) "
                f"has none, nor has any other. Received: "
                f"sink_tokens={sink_tokens!r}"
            )
        # Latent attention keeps its latents whatever `cache` says.
        return self.mixed_cache_plan(rolling=False)
