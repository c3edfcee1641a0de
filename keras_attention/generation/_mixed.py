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

Blocks with latent attention (`latent_attention`, DeepSeek's MLA) have a
third kind of cache: `max_length` latents of `kv_lora_rank +
qk_rope_head_dim` numbers (`init_latent_cache`), instead of keys and
values. A stack holding any of them is generated with a mixed cache,
windowed blocks or not.

Blocks with a linear-time mixer (`mixer="linear"` or `"gated_delta"`,
`LinearAttention`, `GatedDeltaNet`) have a fourth kind, `recurrent`: the
mixer's own cache, a state of constant size (and the convolution's last
inputs for `GatedDeltaNet`), one entry per block (their shapes may
differ), O(1) per token whatever the length. A recurrent state cannot
write a position twice, as the other caches do: the prefill leaves the
prompt's last position to the sampler's first step, which runs it
(`_prefill(..., repeat_last=False)`), and the tokens the embedding masks
neither write nor decay the state (they reach the mixer as padding).
"""

import dataclasses

import keras
from keras import ops

from keras_attention.generation import _checks
from keras_attention.generation.cache import init_cache
from keras_attention.generation.cache import init_latent_cache
from keras_attention.generation.cache import latent_cache_width
from keras_attention.generation.cache import rolling_cache_size
from keras_attention.generation.cache import stack_caches
from keras_attention.ops.rolling_cache import rolling_cache_write
from keras_attention.utils.attention_checks import check_cache_index


@dataclasses.dataclass(frozen=True)
class MixedPlan:
    """A mixed cache: the indices of the blocks of each kind of cache,
    `full` (keys and values of `max_length` positions), `windowed` (the
    ring of slots) and `latent` (latents of `max_length` positions), and
    the attention sinks of the windowed ones (`sink_tokens`)."""

    full: tuple
    sink_tokens: int = 0
    windowed: tuple = ()
    latent: tuple = ()
    recurrent: tuple = ()

    def kind(self, index):
        """`"full"`, `"rolling"`, `"latent"` or `"recurrent"`: the cache
        of block `index`."""
        if index in self.latent:
            return "latent"
        if index in self.recurrent:
            return "recurrent"
        return "rolling" if index in self.windowed else "full"

    def split(self, blocks):
        """`(full blocks, windowed blocks, latent blocks)`, each in the
        stack's order (the recurrent ones make their own caches)."""
        return tuple(
            [b for i, b in enumerate(blocks) if i in group]
            for group in (self.full, self.windowed, self.latent)
        )

    def entries(self):
        """The names of the cache's tensors, in order: `full` (if any
        full block), `rolling` and `slot_mask` (if any windowed block),
        `position_mask`, `latent` (if any latent block), `recurrent` (if
        any recurrent block: a tuple of the blocks' caches)."""
        names = ("full",) if self.full else ()
        if self.windowed:
            names += ("rolling", "slot_mask")
        names += ("position_mask",) + (("latent",) if self.latent else ())
        return names + (("recurrent",) if self.recurrent else ())

    def pack(self, tensors):
        """The cache tuple of a dict of its tensors (`entries`)."""
        return tuple(tensors[name] for name in self.entries())

    def unpack(self, cache):
        """The dict `{name: tensor}` of a cache tuple (`entries`)."""
        return dict(zip(self.entries(), cache))


class MixedCacheMixin:
    """The mixed cache (some self-attention windowed, some full, some
    latent) of `Generator`: one pass through the model over it
    (`call_with_mixed_cache`), an empty one (`init_mixed_cache`), the
    sampler callback and the prefill of the prompts. Reads the model
    pieces of `Generator` and the prefill loop of `RollingCacheMixin`."""

    def mixed_cache_plan(self, sink_tokens=0, rolling=True):
        """The `MixedPlan` of this model's blocks: latent caches at the
        blocks with latent attention, full ones at those whose
        `cache_window()` is None (every other one too with
        `rolling=False`, as `cache="full"`), the ring at the others; None
        when no block is latent and every other one is windowed, or none
        is (the rolling or the full cache)."""
        latent = tuple(
            i
            for i, block in enumerate(self.blocks)
            if latent_cache_width(block) is not None
        )
        recurrent = tuple(
            i for i, block in enumerate(self.blocks) if is_recurrent(block)
        )
        full = tuple(
            i
            for i, block in enumerate(self.blocks)
            if i not in latent + recurrent
            and (
                not rolling
                or getattr(block.self_attention, "cache_window", lambda: None)()
                is None
            )
        )
        windowed = tuple(
            i
            for i in range(len(self.blocks))
            if i not in full + latent + recurrent
        )
        if not latent + recurrent and (not full or not windowed):
            return None
        return MixedPlan(full, int(sink_tokens), windowed, latent, recurrent)

    def init_mixed_cache(self, batch_size, max_length, plan, dtype=None):
        """An empty mixed cache for `batch_size` sequences of `max_length`
        positions: the tuple of `plan.entries()`, `(full, rolling,
        slot_mask, position_mask, latent)` less the kinds of blocks the
        plan has none of.

        `full` is `(batch, f, 2, max_length, kv_heads, key_dim)` for the
        `f` full blocks, `rolling` `(batch, w, 2, slots, kv_heads,
        key_dim)` for the `w` windowed ones (`slots`: `sink_tokens` plus
        the largest window plus one), `slot_mask` `(batch, slots)` the key
        mask of the slots (as `init_rolling_cache`'s), `position_mask`
        `(batch, max_length)` the key mask of the positions of the full
        and latent caches (False for tokens the embedding masks), `latent`
        `(batch, l, max_length, kv_lora_rank + qk_rope_head_dim)` for the
        `l` latent ones (`init_latent_cache`)."""
        full, windowed, latent = plan.split(self.blocks)
        if dtype is None:
            dtype = self.blocks[0].compute_dtype
        dtype = keras.backend.standardize_dtype(dtype)
        tensors = dict(position_mask=ops.ones((batch_size, max_length), "bool"))
        if full:
            tensors["full"] = init_cache(full, batch_size, max_length, dtype)
        if windowed:
            size = rolling_cache_size(windowed, plan.sink_tokens)
            tensors["rolling"] = init_cache(windowed, batch_size, size, dtype)
            tensors["slot_mask"] = ops.ones((batch_size, size), "bool")
        if latent:
            tensors["latent"] = init_latent_cache(
                latent, batch_size, max_length, dtype
            )
        if plan.recurrent:
            tensors["recurrent"] = tuple(
                recurrent_cache(self.blocks[i], batch_size, dtype)
                for i in plan.recurrent
            )
        return plan.pack(tensors)

    def call_with_mixed_cache(self, token_ids, cache, start, plan):
        """Runs `token_ids` (positions `start ..`) through the model with a
        mixed cache (`init_mixed_cache`) in which positions `0 .. start -
        1` were written in order; writes this call's positions.

        The full and latent blocks attend to every cached position up to
        the query's own (as `call_with_cache`), the windowed ones to the
        slots within their window or below `plan.sink_tokens` and to this
        call's keys (as `call_with_rolling_cache`). Tokens the embedding
        masks are masked as keys in all.

        Args:
            token_ids: int `(batch, T)` (static `T`).
            cache: the tuple of `init_mixed_cache`.
            start: int or int scalar tensor, the position of
                `token_ids[:, 0]`; `start + T <= max_length`.
            plan: the `MixedPlan` the cache was made for.

        Returns:
            `(logits, hidden, cache)`.
        """
        tensors = plan.unpack(cache)
        check_cache_index(
            start,
            _checks.token_steps(token_ids),
            tensors["position_mask"].shape[1],
            "start",
        )
        x = self.embed(token_ids, start_index=start)
        batch, steps = ops.shape(token_ids)[0], token_ids.shape[1]
        token_mask = self._embedding_mask(token_ids)
        if token_mask is None:
            token_mask = ops.ones((batch, steps), "bool")
        token_mask = ops.cast(token_mask, "bool")
        position_mask = ops.slice_update(
            tensors["position_mask"], (0, start), token_mask
        )
        tensors["position_mask"] = position_mask
        masks = dict(
            full=ops.repeat(ops.expand_dims(position_mask, 1), steps, 1)
        )
        masks["latent"] = masks["full"]
        if plan.windowed:
            keys = ops.concatenate([tensors["slot_mask"], token_mask], axis=1)
            masks["rolling"] = ops.repeat(ops.expand_dims(keys, 1), steps, 1)
        updated = dict(full=[], rolling=[], latent=[], recurrent=[])
        for i, block in enumerate(self.blocks):
            kind = plan.kind(i)
            count = len(updated[kind])
            if kind == "recurrent":  # the tokens' mask, no key mask
                options = dict(padding_mask=token_mask)
                block_cache = tensors[kind][count]
            else:
                options = dict(attention_mask=masks[kind])
                block_cache = tensors[kind][:, count]
            if kind == "rolling":
                options["self_attention_cache_sink_tokens"] = plan.sink_tokens
            x, block_cache = block(
                x,
                self_attention_cache=block_cache,
                self_attention_cache_update_index=start,
                **options,
            )
            updated[kind].append(block_cache)
        for kind, caches in updated.items():
            if caches:
                tensors[kind] = (
                    tuple(caches)
                    if kind == "recurrent"
                    else stack_caches(caches)
                )
        if plan.windowed:
            tensors["slot_mask"] = rolling_cache_write(
                tensors["slot_mask"], token_mask, start, plan.sink_tokens
            )
        return self.logits(x), x, plan.pack(tensors)

    def _mixed_next(self, plan, offset=0):
        """The sampler callback `next(prompt, cache, index)` over a mixed
        cache: `prompt[:, index - 1]` sits at position `offset + index -
        1`."""

        def next(prompt, cache, index):
            batch = ops.shape(prompt)[0]
            token = ops.slice(prompt, (0, index - 1), (batch, 1))
            logits, hidden, cache = self.call_with_mixed_cache(
                token, cache, offset + index - 1, plan
            )
            return logits[:, 0], hidden[:, 0], cache

        return next

    def _mixed_prefill(
        self, token_ids, padding_mask, plan, hidden=True, max_length=None
    ):
        """Writes the shortest prompt's positions into an empty mixed
        cache of `max_length` positions (the buffer's length when None),
        in chunks of the ring's length (as `_rolling_prefill`; 32 without
        a ring); with recurrent blocks, all but the last, which the
        sampler's first step runs.

        Returns `(hidden, cache, index)` (`hidden` None unless asked)."""
        batch = ops.shape(token_ids)[0]
        if max_length is None:
            max_length = ops.shape(token_ids)[1]
        cache = self.init_mixed_cache(batch, max_length, plan)
        ring = 0  # no windowed block: chunks of `_prefill`'s least
        if plan.windowed:
            slots = plan.unpack(cache)["rolling"].shape[3]
            ring = slots - plan.sink_tokens

        def call(tokens, cache, start):
            return self.call_with_mixed_cache(tokens, cache, start, plan)

        return self._prefill(
            token_ids,
            padding_mask,
            cache,
            ring,
            call,
            hidden,
            repeat_last=not plan.recurrent,
        )


def is_recurrent(block):
    """Whether `block`'s self-attention is a linear-time mixer with a
    recurrent cache (`mixer="linear"` or `"gated_delta"`)."""
    return getattr(block, "mixer", "attention") != "attention"


def recurrent_cache(block, batch_size, dtype):
    """The empty cache of a block with a mixer: `LinearAttention`'s
    state `(batch, heads, key_dim, value_dim)` (one more column with
    `normalize`), or `GatedDeltaNet`'s `(conv_state, state)`; the states
    in float32 (float64 for float64 blocks), the convolution's inputs in
    `dtype`."""
    mixer = block.self_attention
    if hasattr(mixer, "init_cache"):  # GatedDeltaNet
        return mixer.init_cache(batch_size, dtype)
    return mixer.initial_cache(batch_size)
