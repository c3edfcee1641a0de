"""The attention step of `MultiHeadAttention`: the one place a subclass
changes how attention is computed (`_compute_attention`, Keras's
overridable method), and how the layer reaches it: the call's masks kept
structural, its score and mask functions bound, packed documents and the
sliding window as mask functions, and the banded path for a plain
sliding window.

`AttentionStep` is a mixin of `MultiHeadAttention` (it reads `num_heads`,
`dropout`, `sliding_window`, `score_mod`, `mask_mod`, `_flash_attention`
and `_dropout_layer`); kept apart so that the layer's module holds its
arguments and its call.
"""

from keras_attention import masks as masks_lib
from keras_attention.layers import _keras_override
from keras_attention.mods import base as mods_base
from keras_attention.mods.masks import DocumentMask
from keras_attention.mods.masks import KerasSlidingWindowMask
from keras_attention.ops import paths
from keras_attention.ops.attention import dot_product_attention
from keras_attention.ops.masking import as_4d_mask
from keras_attention.ops.paths import memory_efficient_implementation
from keras_attention.utils import attention_checks


class AttentionStep:
    """The attention step of `MultiHeadAttention` (a mixin)."""

    # `dot_product_attention` runs as the ring in `ContextParallel`'s scope
    # (`recording.check_context_parallel`).
    runs_context_parallel = True

    def _attention_masks(
        self,
        query,
        key,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        query_offset=0,
    ):
        """The masks as `_compute_attention` keyword arguments.

        Causal and padding masks stay structural (`use_causal_mask`,
        `key_mask`, `query_mask`) so that the memory-efficient path never
        builds a `(Tq, Tk)` mask; only `attention_mask` is dense.
        """
        mask = None
        if attention_mask is not None:
            attention_checks.check_attention_mask(
                attention_mask, query, key, self.num_heads
            )
            mask = as_4d_mask(attention_mask)
        return dict(
            attention_mask=mask,
            use_causal_mask=bool(use_causal_mask),
            query_offset=query_offset,
            key_mask=masks_lib.combine_masks(value_mask, key_mask),
            query_mask=masks_lib.combine_masks(query_mask),
        )

    def _implementation(self):
        """`dot_product_attention`'s implementation for `flash_attention`."""
        if self._flash_attention is None:
            return None
        if not self._flash_attention:
            return "dense"
        return memory_efficient_implementation()

    def _dropout_fn(self, training):
        if self.dropout > 0 and training is not None and training is not False:
            return lambda weights: self._dropout_layer(
                weights, training=training
            )
        return None

    def _check_exclusive_scope(self, return_attention_scores, training):
        """Inside an exclusive scope (`ContextParallel`'s ring, whose
        inputs are sharded) every attention runs on its path: refuses what
        this layer would run on another kernel, naming the option."""
        ring = paths.exclusive_scope()
        if ring is None:
            return
        if return_attention_scores:
            reason = (
                "it computes no attention weights (call the layer outside "
                "the scope, on one device, to get them)",
                f"return_attention_scores={return_attention_scores!r}",
            )
        elif self._dropout_fn(training) is not None:
            reason = (
                "it applies no dropout to the attention weights (it never "
                "forms them): give the attention layers of a "
                "context-parallel model `dropout=0`",
                f"dropout={self.dropout!r}, training={training!r}",
            )
        elif self._flash_attention is not None:
            reason = (
                "`flash_attention` picks a one-device kernel, and the ring "
                "picks each block's own: leave it None (and "
                "`keras.config.is_flash_attention_enabled()` None)",
                f"flash_attention={self.flash_attention!r} (in effect: "
                f"{self._flash_attention!r})",
            )
        elif getattr(self, "learned_sinks", False):
            reason = (
                "the ring takes no learned sinks: build the attention "
                "layers of a context-parallel model without them",
                f"learned_sinks={self.learned_sinks!r}",
            )
        else:
            return
        raise ValueError(
            f"Inside `implementation_scope({ring!r})` "
            "(`keras_attention.distribution.ContextParallel`'s scope), "
            f"{self.name!r} must run as ring attention, but {reason[0]}. "
            f"Received: {reason[1]}"
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
        sink_logits=None,
    ):
        """The attention step on projected heads: the one place a subclass
        changes how attention is computed (projections, rotary positions,
        the gate and the output projection stay in `call`).

        Keras's `MultiHeadAttention._compute_attention` semantics, so
        subclasses written for Keras's layer port over; the keyword-only
        arguments carry what this library keeps structural (never a dense
        `(Tq, Tk)` mask). An override that does not take them (Keras's
        signature) gets them folded into `attention_mask` by `call`.

        Args:
            query: projected queries `(b, Tq, heads, key_dim)`.
            key: projected keys `(b, Tk, kv_heads, key_dim)`.
            value: projected values `(b, Tk, kv_heads, value_dim)`.
            attention_mask: optional bool, `(b, Tq, Tk)` or
                `(b|1, heads|1, Tq, Tk)`; True = may attend.
            training: Python bool (dropout on the weights).
            return_attention_scores: also compute the weights; None: as
                the layer's call asked (an override with Keras's earlier
                signature calls `super()._compute_attention` without it).
            use_causal_mask: query `i` sees keys `j <= i + query_offset`.
            query_mask: optional bool `(b, Tq)`: padded queries give 0.
            key_mask: optional bool `(b, Tk)`: padded keys are not seen.
            query_offset: position of the first query (a cache offset).
            score_mod, mask_mod: bound score and mask functions (see
                `keras_attention.ops.dot_product_attention`).
            sink_logits: the learned sinks `(heads,)` (`learned_sinks`),
                or None; passed only when the layer has them.

        Returns:
            `(attention_output, attention_scores)`: `(b, Tq, heads,
            value_dim)` and the weights `(b, heads, Tq, Tk)` (None unless
            `return_attention_scores`).
        """
        if return_attention_scores is None:
            return_attention_scores = self._return_attention_scores
        self._check_exclusive_scope(return_attention_scores, training)
        if return_attention_scores and self._flash_attention:
            raise ValueError(attention_checks.FLASH_SCORES_ERROR)
        dropout_fn = self._dropout_fn(training)
        implementation = self._implementation()
        if return_attention_scores or dropout_fn is not None:
            implementation = "dense"
        if implementation == "fused" and score_mod is not None:
            implementation = None  # No kernel hook: the automatic choice.
        result = dot_product_attention(
            query,
            key,
            value,
            attention_mask=attention_mask,
            dropout_fn=dropout_fn,
            return_weights=return_attention_scores,
            implementation=implementation,
            causal=use_causal_mask,
            query_offset=query_offset,
            query_mask=query_mask,
            key_mask=key_mask,
            score_mod=score_mod,
            mask_mod=mask_mod,
            sink_logits=sink_logits,
        )
        if return_attention_scores:
            return result
        return result, None

    def _banded_request(self, call, q, k, v, cache):
        """The call as a request for the table's banded path
        (`ops/paths.py`), or None when it does not run it: the table says
        whether the path can (a plain sliding window, no weights, no
        score or mask function, self-attention lengths); the layer adds
        what only it knows (no cache, no overridden attention step, no
        `flash_attention=False`, no exclusive scope: the ring runs the
        window as a mask function on global positions)."""
        if self.sliding_window is None or cache is not None:
            return None
        if paths.exclusive_scope() is not None:
            return None
        if (
            type(self)._compute_attention
            is not AttentionStep._compute_attention
        ):
            return None  # An overridden attention step runs on every call.
        if self._flash_attention is False:
            return None
        request = paths.AttentionRequest(
            q,
            k,
            v,
            attention_mask=call.attention_mask,
            dropout_fn=self._dropout_fn(call.training),
            return_weights=call.return_attention_scores,
            causal=bool(call.use_causal_mask),
            query_mask=call.query_mask,
            key_mask=masks_lib.combine_masks(call.value_mask, call.key_mask),
            score_mod=self.score_mod,
            mask_mod=self.mask_mod,
            window=self.sliding_window - 1,
            same_sequence=call.query is call.key,
            sink_logits=self._sink_logits(),
        )
        if paths.PATHS["banded"].can_run(request) is not None:
            return None
        return request

    def _attend_banded(self, call, request):
        """`sliding_window` on the table's banded path."""
        if call.attention_mask is not None:
            attention_checks.check_attention_mask(
                call.attention_mask, call.query, request.key, self.num_heads
            )
        return paths.run_path("banded", request)

    def _attend(self, call, q, k, v):
        """The attention step (`_compute_attention`, or a Keras-style
        override) with the call's masks, score and mask functions, packed
        documents and sliding window. Returns `(result, scores or
        None)`."""
        masks = self._attention_masks(
            call.query,
            k,
            query_mask=call.query_mask,
            value_mask=call.value_mask,
            key_mask=call.key_mask,
            attention_mask=call.attention_mask,
            use_causal_mask=call.use_causal_mask,
            query_offset=call.offset,
        )
        score_mod, mask_mod = mods_base.bind_all(
            self.score_mod, self.mask_mod, call.mod_inputs
        )
        if call.segment_ids is not None:
            documents = DocumentMask().bind(segment_ids=call.segment_ids)
            mask_mod = (
                mods_base.and_masks(mask_mod, documents)
                if mask_mod
                else documents
            )
        if self.sliding_window is not None:
            window = KerasSlidingWindowMask(self.sliding_window)
            mask_mod = (
                mods_base.and_masks(mask_mod, window) if mask_mod else window
            )
        result = _keras_override.attention_step(
            self,
            q,
            k,
            v,
            call.return_attention_scores,
            call.training,
            score_mod=score_mod,
            mask_mod=mask_mod,
            **masks,
            **(call.step_inputs or {}),
        )
        if call.return_attention_scores:
            return result
        return result[0], None
