"""Streamed generation (private to `generation`): `StreamingMixin`, the
methods of `Generator` that generate in pieces over a cache carried from
piece to piece and yield each piece's columns, and `stop_after_first`,
the NumPy stop-token padding of those pieces.

The blocks' caches are made at the first piece for the `max_length`
positions of the whole output (a cache of constant size, such as a ring
of slots or a state, keeps its size) and carried from piece to piece.
"""

import numpy as np
from keras import ops

from keras_attention.generation import _checks
from keras_attention.generation._samplers import get_sampler
from keras_attention.generation._samplers import is_streamable
from keras_attention.generation._samplers import sampler_key
from keras_attention.ops import compile_step


def stop_after_first(tokens, generated, stop_token_ids, stopped, pad):
    """NumPy: pads what follows each row's first generated stop token.

    `tokens` `(batch, n)` the next columns of the outputs, `generated`
    their positions that were generated (not prompt), `stopped` `(batch,)`
    whether the row stopped in earlier columns. Returns `(tokens,
    stopped)`.
    """
    if stop_token_ids is None:
        return tokens, stopped
    is_stop = np.isin(tokens, stop_token_ids) & generated
    before = np.cumsum(is_stop, axis=1) - is_stop + stopped[:, None]
    tokens = np.where(before == 0, tokens, pad)
    return tokens, stopped | np.any(is_stop, axis=1)


class StreamingMixin:
    """Streaming (`generate(..., stream=...)`) of `Generator`: the piece
    size, the sampling loop of one piece over the blocks' caches, the
    compiled pieces and the Python generator of the outputs' columns.
    Uses `Generator`'s `_next`, `_new_cache` and `_prefill`."""

    def _stream_size(self, stream):
        """Tokens per piece of a streamed generation: `stream` (a positive
        int), 64 for True, None for False (no streaming)."""
        if stream is True:
            return 64
        if stream is False or stream is None:
            return None
        if not _checks.is_integer(stream) or stream < 1:
            raise ValueError(
                "`stream` must be a bool or a positive int (tokens per "
                f"piece). Received: stream={stream!r}"
            )
        return int(stream)

    def _sample_piece(
        self, sampler, token_ids, padding_mask, cache, index, offset
    ):
        """The `keras_hub` sampling loop (greedy, top-k, ...: the base
        `Sampler.__call__`, step for step) over the blocks' caches,
        returning the cache too: `(token_ids, cache)`. `token_ids[:, i]`
        sits at position `offset + i`; positions before `offset + index -
        1` are in the cache."""
        next = self._next(offset)
        mask = ops.cast(padding_mask, "bool")

        def cond(prompt, cache, index, mask):
            return ops.convert_to_tensor(True, "bool")

        def body(prompt, cache, index, mask):
            logits, _, cache = next(prompt, cache, index)
            probabilities = sampler.compute_probabilities(logits)
            token = ops.cast(sampler.get_next_token(probabilities), "int32")
            token = ops.where(mask[:, index], prompt[:, index], token)
            prompt = ops.slice_update(prompt, (0, index), token[:, None])
            return prompt, cache, index + 1, mask

        index = ops.cast(index, "int32")
        length = ops.cast(ops.shape(token_ids)[-1], "int32")
        token_ids, cache, _, _ = sampler.run_loop(
            cond,
            body,
            loop_vars=(ops.cast(token_ids, "int32"), cache, index, mask),
            maximum_iterations=length - index,
        )
        return token_ids, cache

    def _compile_stream(self, sampler, options, max_length):
        """The compiled pieces of a streamed generation (per sampler,
        cache options and `max_length`, the positions of the caches):
        `first(token_ids, padding_mask)` fills the cache from the prompts
        and samples the rest of the buffer; `more(token_ids,
        padding_mask, cache, offset)` goes on from a cache. Both return
        `(token_ids, cache)`."""
        key = ("stream", sampler_key(sampler), options, max_length)
        if key not in self._compiled:
            resolved = get_sampler(sampler)
            if not is_streamable(resolved):
                raise ValueError(
                    "`stream=True` needs a sampler that draws each token "
                    "from the logits alone (greedy, top_k, top_p, random); "
                    "beam and contrastive search look back over the whole "
                    f"output. Received: sampler={sampler!r}"
                )

            def first(token_ids, padding_mask):
                batch = ops.shape(token_ids)[0]
                cache = self._new_cache(batch, max_length, options)
                _, cache, index = self._prefill(
                    token_ids, padding_mask, cache, hidden=False
                )
                return self._sample_piece(
                    resolved, token_ids, padding_mask, cache, index, 0
                )

            def more(token_ids, padding_mask, cache, offset):
                return self._sample_piece(
                    resolved, token_ids, padding_mask, cache, 1, offset
                )

            self._compiled[key] = (
                resolved,
                compile_step(first, self.jit_compile, autograph=False),
                compile_step(more, self.jit_compile, autograph=False),
            )
        return self._compiled[key][1:]

    def _stream(
        self,
        sampler,
        stop_ids,
        token_ids,
        padding_mask,
        unbatched,
        max_length,
        options,
        piece,
    ):
        """A Python generator of the outputs' columns, piece by piece (see
        `CausalLMGenerator.generate`); everything is checked before it is
        returned."""
        stop_token_ids = _checks.check_stop_token_ids(
            stop_ids, self._vocabulary_size
        )
        width = token_ids.shape[1]
        max_length = width if max_length is None else max_length
        first, more = self._compile_stream(sampler, options, max_length)
        pad = self.pad_token_id

        def pieces():
            length = min(max_length, width + piece)
            ids = ops.pad(
                token_ids, ((0, 0), (0, length - width)), constant_values=pad
            )
            mask = ops.pad(padding_mask, ((0, 0), (0, length - width)))
            out, cache = first(ids, mask)
            out = ops.convert_to_numpy(out)
            generated = np.logical_not(ops.convert_to_numpy(mask))
            stopped = np.zeros(out.shape[0], bool)
            shown, stopped = stop_after_first(
                out, generated, stop_token_ids, stopped, pad
            )
            yield shown[0] if unbatched else shown
            batch = out.shape[0]
            while length < max_length and not np.all(stopped):
                steps = min(piece, max_length - length)
                ids = np.full((batch, steps + 1), pad, "int32")
                ids[:, 0] = out[:, -1]
                mask = np.zeros((batch, steps + 1), bool)
                mask[:, 0] = True
                offset = ops.convert_to_tensor(length - 1, "int32")
                out, cache = more(ids, mask, cache, offset)
                out = ops.convert_to_numpy(out)[:, 1:]
                shown, stopped = stop_after_first(
                    out,
                    np.ones_like(mask[:, 1:]),
                    stop_token_ids,
                    stopped,
                    pad,
                )
                yield shown[0] if unbatched else shown
                length += steps

        return pieces()
