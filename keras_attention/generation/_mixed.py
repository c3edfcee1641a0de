"""The mixed cache of the generators (private to `generation`):
`MixedCacheMixin`, the methods of `Generator` that run a model whose
self-attention is windowed in some blocks and full in the others (Gemma
3's five sliding-window layers to one global, gpt-oss's alternation).

The windowed blocks share a rolling cache (`sink_tokens + window + 1`
slots each, `_rolling.py`); the others a full cache of `max_length`
positions. With `n` blocks of which `f` are full, the cache holds
`f * max_length + (n - f) * slots` positions per key/value head instead
of `n * max_length`: for Gemma 3's 5 : 1 pattern about a sixth at long
lengths. Each step's time falls alike: the windowed blocks attend over
their slots only.
"""

import dataclasses

import keras
from keras import ops

from keras_attention.generation import _checks
from keras_attention.generation.cache import init_cache
from keras_attention.generation.cache import rolling_cache_size
from keras_attention.generation.cache import stack_caches
from keras_attention.ops.rolling_cache import rolling_cache_write
from keras_attention.utils.attention_checks import check_cache_index


@dataclasses.dataclass(frozen=True)
class MixedPlan:
    """A mixed cache: the indices of the blocks with full self-attention
    (`full`; the others are windowed) and the attention sinks of the
    windowed ones (`sink_tokens`)."""

    full: tuple
    sink_tokens: int = 0

    def split(self, blocks):
        """`(full blocks, windowed blocks)`, each in the stack's order."""
        full = [b for i, b in enumerate(blocks) if i in self.full]
        windowed = [b for i, b in enumerate(blocks) if i not in self.full]
        return full, windowed


class MixedCacheMixin:
    """The mixed cache (some self-attention windowed, some full) of
    `Generator`: one pass through the model over it
    (`call_with_mixed_cache`), an empty one (`init_mixed_cache`), the
    sampler callback and the prefill of the prompts. Reads the model
    pieces of `Generator` and the prefill loop of `RollingCacheMixin`."""

    def mixed_cache_plan(self, sink_tokens=0):
        """The `MixedPlan` of this model's blocks (full self-attention at
        the blocks whose `cache_window()` is None), or None when every
        block is windowed or none is."""
        full = tuple(
            i
            for i, block in enumerate(self.blocks)
            if getattr(block.self_attention, "cache_window", lambda: None)()
            is None
        )
        if not full or len(full) == len(self.blocks):
            return None
        return MixedPlan(full, int(sink_tokens))

    def init_mixed_cache(self, batch_size, max_length, plan, dtype=None):
        """An empty mixed cache for `batch_size` sequences of `max_length`
        positions: `(full, rolling, slot_mask, position_mask)`.

        `full` is `(batch, f, 2, max_length, kv_heads, key_dim)` for the
        `f` full blocks, `rolling` `(batch, n - f, 2, slots, kv_heads,
        key_dim)` for the windowed ones (`slots`: `sink_tokens` plus the
        largest window plus one), `slot_mask` `(batch, slots)` the key mask
        of the slots (as `init_rolling_cache`'s) and `position_mask`
        `(batch, max_length)` the key mask of the full cache's positions
        (False for tokens the embedding masks)."""
        full, windowed = plan.split(self.blocks)
        if dtype is None:
            dtype = self.blocks[0].compute_dtype
        dtype = keras.backend.standardize_dtype(dtype)
        size = rolling_cache_size(windowed, plan.sink_tokens)
        return (
            init_cache(full, batch_size, max_length, dtype),
            init_cache(windowed, batch_size, size, dtype),
            ops.ones((batch_size, size), "bool"),
            ops.ones((batch_size, max_length), "bool"),
        )

    def call_with_mixed_cache(self, token_ids, cache, start, plan):
        """Runs `token_ids` (positions `start ..`) through the model with a
        mixed cache (`init_mixed_cache`) in which positions `0 .. start -
        1` were written in order; writes this call's positions.

        The full blocks attend to every cached position up to the query's
        own (as `call_with_cache`), the windowed ones to the slots within
        their window or below `plan.sink_tokens` and to this call's keys
        (as `call_with_rolling_cache`). Tokens the embedding masks are
        masked as keys in both.

        Args:
            token_ids: int `(batch, T)` (static `T`).
            cache: `(full, rolling, slot_mask, position_mask)`.
            start: int or int scalar tensor, the position of
                `token_ids[:, 0]`; `start + T <= max_length`.
            plan: the `MixedPlan` the cache was made for.

        Returns:
            `(logits, hidden, cache)`.
        """
        full_kv, rolling_kv, slot_mask, position_mask = cache
        check_cache_index(
            start,
            _checks.token_steps(token_ids),
            full_kv.shape[3],
            "start",
        )
        x = self.embed(token_ids, start_index=start)
        batch, steps = ops.shape(token_ids)[0], token_ids.shape[1]
        token_mask = self._embedding_mask(token_ids)
        if token_mask is None:
            token_mask = ops.ones((batch, steps), "bool")
        token_mask = ops.cast(token_mask, "bool")
        position_mask = ops.slice_update(position_mask, (0, start), token_mask)
        full_mask = ops.repeat(ops.expand_dims(position_mask, 1), steps, 1)
        keys = ops.concatenate([slot_mask, token_mask], axis=1)
        rolling_mask = ops.repeat(ops.expand_dims(keys, 1), steps, axis=1)
        full_updated, rolling_updated = [], []
        for i, block in enumerate(self.blocks):
            if i in plan.full:
                x, block_cache = block(
                    x,
                    attention_mask=full_mask,
                    self_attention_cache=full_kv[:, len(full_updated)],
                    self_attention_cache_update_index=start,
                )
                full_updated.append(block_cache)
            else:
                x, block_cache = block(
                    x,
                    attention_mask=rolling_mask,
                    self_attention_cache=rolling_kv[:, len(rolling_updated)],
                    self_attention_cache_update_index=start,
                    self_attention_cache_sink_tokens=plan.sink_tokens,
                )
                rolling_updated.append(block_cache)
        slot_mask = rolling_cache_write(
            slot_mask, token_mask, start, plan.sink_tokens
        )
        cache = (
            stack_caches(full_updated),
            stack_caches(rolling_updated),
            slot_mask,
            position_mask,
        )
        return self.logits(x), x, cache

    def _mixed_next(self, plan):
        """The sampler callback `next(prompt, cache, index)` over a mixed
        cache."""

        def next(prompt, cache, index):
            batch = ops.shape(prompt)[0]
            token = ops.slice(prompt, (0, index - 1), (batch, 1))
            logits, hidden, cache = self.call_with_mixed_cache(
                token, cache, index - 1, plan
            )
            return logits[:, 0], hidden[:, 0], cache

        return next

    def _mixed_prefill(self, token_ids, padding_mask, plan, hidden=True):
        """Writes the shortest prompt's positions into an empty mixed
        cache, in chunks of the ring's length (as `_rolling_prefill`).

        Returns `(hidden, cache, index)` (`hidden` None unless asked)."""
        batch = ops.shape(token_ids)[0]
        cache = self.init_mixed_cache(batch, ops.shape(token_ids)[1], plan)
        size = cache[1].shape[3]

        def call(tokens, cache, start):
            return self.call_with_mixed_cache(tokens, cache, start, plan)

        return self._prefill(
            token_ids,
            padding_mask,
            cache,
            size - plan.sink_tokens,
            call,
            hidden,
        )
