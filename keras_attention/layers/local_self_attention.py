import keras
import numpy as np

from keras_attention import masks as masks_lib
from keras_attention.layers import _kv_cache
from keras_attention.layers import recording
from keras_attention.layers import token_mixer
from keras_attention.layers.self_attention import SelfAttention
from keras_attention.mods.base import and_masks
from keras_attention.mods.masks import SlidingWindowMask
from keras_attention.ops import paths
from keras_attention.ops.global_local import global_local_attention
from keras_attention.ops.global_local import global_local_weights_to_dense
from keras_attention.ops.sliding_window import banded_to_dense
from keras_attention.ops.sliding_window import effective_window
from keras_attention.ops.sliding_window import local_attention
from keras_attention.utils import attention_checks
from keras_attention.utils import validation


def _and_mods(first, second):
    """`and_masks(first, second)`, either of which may be None."""
    if first is None or second is None:
        return second if first is None else first
    return and_masks(first, second)


def _refuse_unsupported(kwargs):
    """`MultiHeadAttention` options that have no meaning here."""
    for name, hint in (
        ("sliding_window", "use `window_size`"),
        ("attention_axes", "attention runs over the time axis only"),
    ):
        if kwargs.get(name) is not None:
            raise ValueError(
                f"`LocalSelfAttention` does not take `{name}` ({hint}). "
                f"Received: {name}={kwargs[name]!r}"
            )
    shape = kwargs.get("output_shape")
    if isinstance(shape, (tuple, list)) and len(shape) != 1:
        raise ValueError(
            "`LocalSelfAttention` takes an int `output_shape` (or a 1-tuple). "
            f"Received: output_shape={shape!r}"
        )


@keras.saving.register_keras_serializable(package="keras_attention")
class LocalSelfAttention(SelfAttention):
    """Sliding-window (local) multi-head self-attention, linear in length.

    Position `i` attends to positions `j` with `i - left <= j <= i + right`.
    Same weights, call arguments and outputs as `SelfAttention` with
    `attention_mask=keras_attention.masks.sliding_window_mask(T, window_size,
    causal)`, but only the band is computed: queries are processed in blocks
    that attend to their own and neighbouring key blocks, so time and memory
    grow as `O(T * (left + right))` and no `T x T` tensor is ever created.

    Args:
        num_heads: int, number of attention heads.
        key_dim: int, size of each query/key head.
        window_size: int (`left = right = window_size`) or a pair
            `(left, right)` of non-negative ints.
        causal: bool, if True `right = 0` (position `i` sees
            `i - left .. i`).
        block_size: optional int, number of queries per block (a speed
            knob; results do not depend on it). Defaults to
            `keras_attention.ops.sliding_window.default_block_size(left,
            right)`.
        global_projections: bool, separate query/key/value projections
            (`query_global`, `key_global`, `value_global`) for the rows of
            global tokens, as in Longformer; off by default (the global
            rows use the local projections and no weights are added).
        max_global_tokens: optional int, the number of global slots per
            example (static). Needed with `global_mask` inside compiled
            functions (`model.fit`, `jax.jit`); when None it is read from
            a concrete (eager) `global_mask`. Global positions of an
            example beyond the first `max_global_tokens` stay local.
        **kwargs: the other arguments of `SelfAttention` /
            `MultiHeadAttention` (`value_dim`, `num_key_value_heads`,
            `dropout`, `use_bias`, `output_shape`, initializers,
            `qk_norm`, ...) and base layer arguments. `learned_sinks=True`
            (gpt-oss's sinks: one trainable logit per head, weight
            `sinks`) runs on the band through its log-sum-exp
            (`keras_attention.ops.local_attention`'s `sink_logits`), as
            `MultiHeadAttention(sliding_window=..., learned_sinks=True)`
            does; the returned banded weights then leave out the sink's
            share. Not with `global_mask`.

    Call arguments:
        inputs: `(batch, T, features)`.
        mask: optional boolean `(batch, T)` padding mask (read from the Keras
            mask of `inputs` when omitted); padded positions are neither
            attended to nor attend (zero weights), and the mask is
            propagated to the output.
        attention_mask: optional dense boolean mask `(T, T)`,
            `(batch, T, T)` or `(batch, heads, T, T)`, combined with the
            window and padding masks. Only its band is read, but such a mask
            is itself `O(T^2)`: prefer padding masks for long sequences.
        return_attention_scores: bool, also return the banded attention
            weights `(batch, heads, T, left + right + 1)`, where
            `[..., i, k]` is the weight of query `i` on key `i - left + k`
            and the window is capped at the sequence: `left = min(left,
            T - 1)`, `right = min(right, T - 1)`
            (`keras_attention.ops.effective_window`; a window of 100,000
            on 8 steps computes and returns 15 columns, not 200,001);
            expand them with `scores_to_dense` for plotting.
        training: bool, dropout on or off.
        cache, cache_update_index: incremental decoding as in
            `SelfAttention`; with a cache the window is applied as a mask
            over the cache (each step costs `O(max_length)`) and
            returned scores are dense `(batch, heads, Tq, max_length)`.
        cache_sink_tokens: optional int >= 0: `cache` is a rolling cache
            of `sink_tokens + left + 1` (or more) slots instead, each step
            costing `O(left)` whatever the position (see
            `MultiHeadAttention`); causal.
        global_mask: optional boolean `(batch, T)`, True at global
            positions (Longformer: e.g. `[CLS]` or question tokens). They
            attend to every position and every position attends to them;
            the others keep their window. `O(T * (window + S))` for `S`
            global slots (see `keras_attention.ops.global_local_attention`);
            under `causal` a global position still sees no later position.
            Not with `cache` or `attention_mask`. Returned scores are then
            a dict (`"local"`, `"global_keys"`, `"global_queries"`,
            `"global_indices"`); `scores_to_dense` expands it.
        positions: optional integer `(batch, T)` or `(T,)`: the rotary
            positions of the tokens (local and global projections; needs
            `rotary_max_wavelength`), as in `SelfAttention`.

    Returns:
        `(batch, T, output_dim)`, then the banded scores if requested, then
        the updated cache if one was given.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.LocalSelfAttention(
    ...     num_heads=2, key_dim=4, window_size=2
    ... )
    >>> x = np.random.default_rng(0).normal(size=(1, 10, 8)).astype("float32")
    >>> y, scores = layer(x, return_attention_scores=True)
    >>> tuple(y.shape), tuple(scores.shape)
    ((1, 10, 8), (1, 2, 10, 5))
    >>> dense = layer.scores_to_dense(scores)
    >>> tuple(dense.shape), float(dense[0, 0, 0, 3])
    ((1, 2, 10, 10), 0.0)

    With a global token at position 0 (it attends to, and is attended by,
    every position):

    >>> is_global = np.zeros((1, 10), bool)
    >>> is_global[:, 0] = True
    >>> y, scores = layer(x, global_mask=is_global,
    ...                   return_attention_scores=True)
    >>> dense = layer.scores_to_dense(scores)
    >>> float(dense[0, 0, 0, 9]) > 0.0, float(dense[0, 0, 9, 0]) > 0.0
    (True, True)

    References:
        - Parmar et al., 2018, "Image Transformer" (local 1D attention in
          query blocks).
        - Child et al., 2019, "Generating Long Sequences with Sparse
          Transformers".
        - Beltagy et al., 2020, "Longformer: The Long-Document Transformer"
          (sliding-window attention).
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        window_size,
        causal=False,
        block_size=None,
        global_projections=False,
        max_global_tokens=None,
        **kwargs,
    ):
        super().__init__(
            num_heads=num_heads, key_dim=key_dim, causal=causal, **kwargs
        )
        _refuse_unsupported(kwargs)
        self._left, self._right = masks_lib.window_bounds(
            window_size, self.causal
        )
        self.window_size = validation.check_window_size(
            "window_size", window_size
        )
        self.block_size = validation.check_positive_int(
            "block_size", block_size, allow_none=True
        )
        self.global_projections = validation.check_bool(
            "global_projections", global_projections
        )
        self.max_global_tokens = validation.check_positive_int(
            "max_global_tokens", max_global_tokens, allow_none=True
        )

    def build(self, inputs_shape):
        super().build(inputs_shape)
        if not self.global_projections:
            return
        # Longformer's separate projections of the global rows (created
        # after the local ones: the local weight paths do not change).
        inputs_shape = tuple(inputs_shape)
        for name, heads, dim in (
            ("query_global", self.num_heads, self.key_dim),
            ("key_global", self._kv_heads, self.key_dim),
            ("value_global", self._kv_heads, self.value_dim),
        ):
            dense = self._projection(name, heads, dim)
            dense.build(inputs_shape)
            setattr(self, f"_{name}_dense", dense)

    def _band(self, steps):
        """Columns of the banded scores for `steps` queries: the window
        capped at the sequence (`effective_window`); None when `steps` is
        not static and the cap could apply."""
        if steps is None:
            return 1 if self._left + self._right == 0 else None
        left, right = effective_window(self.window_bounds, steps)
        return left + right + 1

    def cache_window(self):
        """How many earlier positions a query sees in a cache: the left
        bound of the window (see `MultiHeadAttention.cache_window`)."""
        return self._left

    @property
    def window_bounds(self):
        """`(left, right)`: query `i` sees keys `i - left .. i + right`."""
        return (self._left, self._right)

    def scores_to_dense(self, scores):
        """Banded scores `(..., T, left + right + 1)` -> dense `(..., T, T)`
        (zeros outside the window), for plotting short sequences; also
        takes the dict of scores returned with a `global_mask`."""
        if isinstance(scores, dict):
            return global_local_weights_to_dense(scores, self.window_bounds)
        return banded_to_dense(scores, self.window_bounds)

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook: banded weights expanded to dense
        `(batch, heads, T, T)` (at most `options["max_dense_length"]`
        steps), with the window and the global tokens."""
        meta = self._self_metadata(arguments)
        meta["window"] = tuple(self.window_bounds)
        if arguments.get("cache") is not None:  # dense over the cache
            return recording.numpy_weights(scores), meta
        banded = scores["local"] if isinstance(scores, dict) else scores
        steps = banded.shape[2]
        limit = options.get("max_dense_length")
        if limit is not None and steps > limit:
            raise ValueError(
                f"`{self.name}` (LocalSelfAttention) ran on {steps} steps: "
                "its banded weights would be expanded to a dense "
                f"({steps}, {steps}) matrix per head. Pass a shorter probe, "
                "leave the layer out with `layers=`, or raise "
                "`max_dense_length` (None: no limit). Received: "
                f"max_dense_length={limit!r}"
            )
        weights = recording.numpy_weights(self.scores_to_dense(scores))
        if isinstance(scores, dict):  # global tokens
            indices = recording.numpy_weights(scores["global_indices"], "int64")
            meta["global_mask"] = np.any(
                indices[:, :, None] == np.arange(weights.shape[-1]), axis=1
            )
        return weights, meta

    def call(
        self,
        inputs,
        mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_update_index=None,
        global_mask=None,
        mod_inputs=None,
        segment_ids=None,
        cache_sink_tokens=None,
        positions=None,
        padding_mask=None,
    ):
        mask = token_mixer.padding_mask_and(padding_mask, "mask", mask)
        global_mask, attention_mask = attention_checks.as_tensors(
            global_mask=global_mask, attention_mask=attention_mask
        )
        rolling = cache_sink_tokens is not None
        rolling = rolling or _kv_cache.ring_sinks(cache, self._left) is not None
        if global_mask is not None:
            for name, value in (
                ("cache", cache),
                ("attention_mask", attention_mask),
            ):
                if value is not None:
                    raise ValueError(
                        f"`global_mask` cannot be combined with `{name}` "
                        "(global tokens run on the banded path only). "
                        f"Received: {name} of shape {tuple(value.shape)!r}"
                    )
        return super().call(
            inputs,
            mask=mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            cache=cache,
            cache_update_index=cache_update_index,
            mod_inputs=mod_inputs,
            segment_ids=segment_ids,
            cache_sink_tokens=cache_sink_tokens,
            positions=positions,
            step_inputs={
                "global_mask": global_mask,
                "inputs": inputs,
                "decoding": cache is not None,
                "rolling": rolling,
                "positions": positions,
            },
        )

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=None,
        use_causal_mask=False,
        *,
        query_mask=None,
        key_mask=None,
        query_offset=0,
        score_mod=None,
        mask_mod=None,
        global_mask=None,
        inputs=None,
        decoding=False,
        rolling=False,
        positions=None,
        sink_logits=None,
    ):
        """The attention step of `MultiHeadAttention`, on the band: every
        query attends to its window (`local_attention`), or with global
        tokens (`global_local_attention`). A step over a cache (decoding:
        queries and keys of other lengths, or an offset) attends densely
        with the window as a mask function (`decoding`), and so does a
        call inside `ContextParallel`'s scope (ring attention, global
        positions; global tokens and `block_size` refused). Returns banded
        weights `(b, heads, T, left + right + 1)` (a dict with global
        tokens).

        `global_mask`, `inputs` (for the global projections), `decoding`,
        `rolling` (a rolling cache, whose keys are not in position
        order: the window comes in `attention_mask`) and `positions` (the
        rotary positions of the global projections) come from `call`
        through `step_inputs`. `sink_logits` (`learned_sinks`) are applied
        through the band's log-sum-exp (`local_attention`'s
        `sink_logits`); not with global tokens."""
        if return_attention_scores is None:
            return_attention_scores = self._return_attention_scores
        ring = self._runs_on_ring(global_mask)
        if decoding or ring:
            window = None if rolling else SlidingWindowMask(self.window_bounds)
            both = _and_mods(mask_mod, window)
            # The ring skips its causal blocks (the window is inside them).
            use_causal_mask = use_causal_mask or (ring and self.causal)
            return super()._compute_attention(
                query,
                key,
                value,
                attention_mask=attention_mask,
                training=training,
                return_attention_scores=return_attention_scores,
                use_causal_mask=use_causal_mask,
                query_mask=query_mask,
                key_mask=key_mask,
                query_offset=query_offset,
                score_mod=score_mod,
                mask_mod=both,
                sink_logits=sink_logits,
            )
        if global_mask is not None:
            for name, fn in (
                ("score_mod", score_mod),
                ("mask_mod", mask_mod),
                ("learned_sinks", None if sink_logits is None else True),
            ):
                if fn is not None:
                    raise ValueError(
                        f"`{name}` cannot be combined with `global_mask` "
                        "(the global-token path has no hook for it). "
                        f"Received: {name}={fn!r}"
                    )
        dropout_fn = self._dropout_fn(training)
        if global_mask is not None:
            result = self._global_attention(
                query,
                key,
                value,
                inputs,
                global_mask,
                query_mask,
                dropout_fn,
                return_attention_scores,
                positions,
            )
        else:
            result = local_attention(
                query,
                key,
                value,
                self.window_bounds,
                query_mask=query_mask,
                key_mask=key_mask,
                attention_mask=attention_mask,
                block_size=self.block_size,
                dropout_fn=dropout_fn,
                return_weights=return_attention_scores,
                score_mod=score_mod,
                mask_mod=mask_mod,
                sink_logits=sink_logits,
            )
        return result if return_attention_scores else (result, None)

    def _runs_on_ring(self, global_mask):
        """Whether an exclusive scope (`ContextParallel`'s ring) is in
        effect: the window then runs as a mask function of ring attention
        (global positions); refused when the banded kernel's options are
        set (global tokens, `block_size`)."""
        ring = paths.exclusive_scope()
        if ring is None:
            return False
        for name, value, why in (
            ("global_mask", global_mask, "global tokens attend to the "
             "whole sequence on one device (`global_local_attention`)"),
            ("block_size", self.block_size, "it tunes the banded kernel, "
             "which does not run there"),
        ):  # fmt: skip
            if value is None:
                continue
            if hasattr(value, "shape"):  # a tensor: its shape
                value = f"<tensor of shape {tuple(value.shape)}>"
            raise ValueError(
                f"Inside `implementation_scope({ring!r})` (`keras_"
                "attention.distribution.ContextParallel`'s scope), "
                "`LocalSelfAttention` runs its window as a mask of "
                f"ring attention; `{name}` cannot apply: {why}. "
                f"Received: {name}={value}"
            )
        return True

    def _global_attention(
        self,
        query,
        key,
        value,
        inputs,
        global_mask,
        padding,
        dropout_fn,
        return_weights,
        positions=None,
    ):
        """`global_local_attention`, with Longformer's separate global
        projections of `inputs` when `global_projections` (rotated at
        `positions`, as the local ones)."""
        globals_ = {}
        if self.global_projections:
            # Not `query, key = ...`: those are the local projections.
            global_query, global_key = (
                self._rotate(dense(inputs), 0, positions)
                for dense in (self._query_global_dense, self._key_global_dense)
            )
            globals_ = dict(
                global_query=global_query,
                global_key=global_key,
                global_value=self._value_global_dense(inputs),
            )
        return global_local_attention(
            query,
            key,
            value,
            self.window_bounds,
            global_mask,
            causal=self.causal,
            query_mask=padding,
            key_mask=padding,
            max_global=self.max_global_tokens,
            block_size=self.block_size,
            dropout_fn=dropout_fn,
            return_weights=return_weights,
            **globals_,
        )

    def compute_output_spec(
        self,
        inputs,
        return_attention_scores=False,
        cache=None,
        global_mask=None,
        cache_sink_tokens=None,
        **kwargs,
    ):
        if cache is not None:
            return super().compute_output_spec(
                inputs,
                return_attention_scores=return_attention_scores,
                cache=cache,
                cache_sink_tokens=cache_sink_tokens,
            )
        batch, steps = inputs.shape[0], inputs.shape[1]
        out_dim = self._output_shape or inputs.shape[-1]
        output = keras.KerasTensor(
            (batch, steps, out_dim), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return output
        scores = keras.KerasTensor(
            (batch, self.num_heads, steps, self._band(steps)),
            dtype=self.compute_dtype,
        )
        if global_mask is None:
            return output, scores
        slots = self.max_global_tokens
        heads = self.num_heads
        return output, {
            "local": scores,
            "global_keys": keras.KerasTensor(
                (batch, heads, steps, slots), dtype=self.compute_dtype
            ),
            "global_queries": keras.KerasTensor(
                (batch, heads, slots, steps), dtype=self.compute_dtype
            ),
            "global_indices": keras.KerasTensor((batch, slots), dtype="int32"),
        }

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "window_size": self.window_size,
                "block_size": self.block_size,
                "global_projections": self.global_projections,
                "max_global_tokens": self.max_global_tokens,
            }
        )
        return config
