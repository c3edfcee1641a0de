"""`TransformerDecoderBlock`: causal self-attention, cross-attention to
an encoder's output (optional) and feed-forward."""

import keras

from keras_attention.blocks import _cache
from keras_attention.blocks import _compose
from keras_attention.blocks import _latent
from keras_attention.blocks._transformer_block import TransformerBlock
from keras_attention.layers.cross_attention import CrossAttention
from keras_attention.utils import keras_utils
from keras_attention.utils import validation
from keras_attention.utils.attention_checks import check_cache_index


@keras.saving.register_keras_serializable(package="keras_attention")
class TransformerDecoderBlock(TransformerBlock):
    """Transformer decoder block: causal self-attention, cross-attention to
    an encoder's output (optional), feed-forward; each with a residual
    connection and layer normalization (post-norm, or pre-norm with
    `norm_first=True`, as in `TransformerEncoderBlock`).

    With `cross_attention=False` this is the block of a decoder-only
    language model. For incremental decoding, the block takes a fixed-size
    self-attention key/value cache and the index to write at, and returns
    the updated cache; the encoder's keys/values are projected once with
    `compute_cross_attention_cache(context)` and passed at every step.
    `keras_attention.generation` drives whole models built from these
    blocks with the `keras_hub` samplers.

    `TransformerEncoderBlock` is its sibling (both share a private base
    holding the norms, dropouts, feed-forward and residual wiring); the
    decoder block is always causal, so it takes no `causal` argument.

    Args:
        num_heads: int, number of attention heads of the attention layers
            the block builds (None only when they are all given).
        intermediate_dim: int, hidden width of the feed-forward network
            the block builds (None only with `feed_forward` given, or a
            `moe` with its own `intermediate_dim`).
        cross_attention: bool, whether the block attends to a `context`;
            or a `keras_attention.layers.CrossAttention` layer, used as
            the block's cross-attention.
        key_dim: int, size of each attention head; defaults to
            `features // num_heads`.
        num_key_value_heads: int dividing `num_heads` (grouped-query
            attention); defaults to `num_heads`.
        dropout: float in [0, 1), dropout on the attention weights, the
            feed-forward hidden layer and the residual branches.
        activation: activation of the feed-forward network.
        norm_first: bool, pre-norm instead of post-norm.
        layer_norm_epsilon: finite positive float, epsilon of the layer
            norms.
        rotary_max_wavelength: optional finite number >= 1; rotary
            position embeddings in the self-attention only (None: off).
        kernel_initializer: initializer of all dense kernels.
        bias_initializer: initializer of all dense biases.
        window_size: optional int or pair `(left, right)`: local causal
            self-attention (see `TransformerEncoderBlock`); with a full
            cache the window is applied as a mask over the cache, with a
            rolling one (`self_attention_cache_sink_tokens`) only the
            window is kept. None: full attention.
        score_mod: optional score object or function of the
            self-attention (`keras_attention.mods`; see the guide
            "Programmable attention"); with `window_size` too (the
            banded path applies it inside the window).
        mask_mod: optional mask object or function of the self-attention,
            and-ed with its other masks (the window's included).
        normalization: `"layer_norm"` (default: `LayerNormalization`, with
            a bias) or `"rms_norm"` (`RMSNormalization`, a scale only:
            Llama, Mistral, Gemma), for every norm of the block.
        use_bias: bool, biases in the attention projections and the
            feed-forward network (default True; False: Llama, Mistral).
        gated_feed_forward: bool, the gated (GLU) feed-forward
            `FeedForward(gated=True)`: SwiGLU with `activation="silu"`
            (default False).
        sandwich_norm: bool, also normalize each sublayer's output before
            the residual sum, `x + Dropout(Norm'(f(...)))` (Gemma 2's
            post-attention and post-feed-forward norms, CogView's sandwich
            layer norm; sublayers `*_post_norm`); or `"post"`: only those
            norms, none before the sublayer, `x + Dropout(Norm'(f(x)))`
            (OLMo 2's reordered norm; needs `norm_first=True`; no
            `*_norm` sublayers). Default False.
        parallel_residual: bool, the self-attention and the feed-forward
            side by side on the block's input, `x + Dropout(a(Norm(x))) +
            Dropout(f(Norm'(x)))` (GPT-J, GPT-NeoX, PaLM); needs
            `norm_first=True` and no cross-attention. Default False.
        rotary_scaling: optional dict of `RotaryEmbedding`'s
            context-extension arguments for the rotary positions of the
            self-attention (`scaling_factor`, `rope_type` `"linear"`,
            `"dynamic"`, `"yarn"` or `"llama3"`, ...; see
            `MultiHeadAttention`), e.g. `{"scaling_factor": 4.0}`; needs
            `rotary_max_wavelength`. Default None: no scaling.
        attention_scale: optional finite float > 0, the factor of the
            scores of every attention layer of the block (self- and
            cross-attention; `MultiHeadAttention(attention_scale=...)`),
            e.g. `1.0` for T5. Default None: `1 / sqrt(key_dim)`.
        qk_norm: optional "rms" or "layer": QK-norm in every attention
            layer of the block (`MultiHeadAttention(qk_norm=...)`).
            Default None.
        qk_norm_epsilon: optional float > 0, the QK-norms' epsilon.
            Default None: `layer_norm_epsilon`.
        rotary_fraction: float in (0, 1], partial rotary positions in the
            self-attention (`MultiHeadAttention(rotary_fraction=...)`).
            Default 1.0.
        moe: optional dict of `keras_attention.layers.MixtureOfExperts`
            arguments (`num_experts`, `top_k`, and any of its others;
            `intermediate_dim` defaults to the block's): the feed-forward
            is then a mixture of experts (Mixtral, Qwen3-MoE, gpt-oss),
            with the experts' own activation (`activation` of the block
            does not apply) and, with `router_aux_loss_coef`, its
            load-balancing loss added in training. Default None: the
            dense `FeedForward`.
        learned_sinks: bool, learned attention sinks in every attention
            layer of the block (`MultiHeadAttention(learned_sinks=...)`).
            Default False.
        latent_attention: optional dict of
            `keras_attention.layers.MultiHeadLatentAttention` arguments
            (`kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`,
            `v_head_dim`, and any of its others: `q_lora_rank`,
            `rope_theta`, `rope_interleave`, `rotary_scaling`, `absorb`,
            ...; `num_heads` is the block's, `dropout` and
            `attention_bias` default to the block's `dropout` and
            `use_bias`): the self-attention is then DeepSeek-V2/V3's
            multi-head latent attention, whose cache holds `kv_lora_rank +
            qk_rope_head_dim` numbers per token (`self_attention_cache`
            `(batch, max_length, kv_lora_rank + qk_rope_head_dim)`). MLA
            brings its own head shape, rotary positions and scale:
            `key_dim`, `num_key_value_heads`, `window_size`, `score_mod`,
            `mask_mod`, `qk_norm`, `learned_sinks`, `rotary_*` and
            `attention_scale` are refused beside it (a `ValueError`), and
            so is `cross_attention=True` (MLA is the self-attention of
            decoder-only models). Default None: `SelfAttention` (or
            `LocalSelfAttention`).
        mixer: the token mixer of the self-attention sublayer:
            `"attention"` (default: softmax attention, as the other
            arguments say), `"linear"` (`keras_attention.layers.
            LinearAttention`: linear attention, retention, gated linear
            attention), `"gated_delta"` (`keras_attention.layers.
            GatedDeltaNet`, Qwen3-Next / Qwen 3.5's gated delta rule) or
            `"kda"` (`keras_attention.layers.KimiDeltaAttention`, Kimi
            Linear's delta rule with a decay per channel, `num_heads`
            heads of `key_dim` or `features // num_heads`): linear in the
            length, with a recurrent cache of constant
            size (the block's `self_attention_cache` is then the
            mixer's cache, and `keras_attention.generation` keeps it
            per layer). The mixer has no window, score or mask objects,
            positions, QK-norm, sinks or shared key heads:
            `num_key_value_heads`, `window_size`, `score_mod`,
            `mask_mod`, `qk_norm`, `learned_sinks`,
            `attention_output_gate`, `rotary_*`, `attention_scale` and
            `latent_attention` are refused beside it (and `key_dim`
            beside `"gated_delta"`, and `cross_attention=True`), and so
            are an `attention_mask` and `positions` at call time.
        mixer_options: optional dict of the mixer layer's own arguments
            (refused with `mixer="attention"`): `LinearAttention`'s
            (`decay`, `feature_map`, `normalize`, `value_dim`, ...;
            `num_heads` and `key_dim` are the block's, `use_bias`
            defaults to the block's) or `GatedDeltaNet`'s
            (`linear_num_key_heads`, `linear_num_value_heads`,
            `linear_key_head_dim`, `linear_value_head_dim`, all four or
            none: by default one key and one value head per block head,
            each of size `features // num_heads`; and
            `linear_conv_kernel_dim`, ...; `hidden_size` is the block's
            width) or `KimiDeltaAttention`'s (`conv_kernel_size`,
            `chunk_size`, ...; `hidden_size`, `num_heads` and `head_dim`
            are the block's). The initializers, dtype and name come
            from the block (refused in the dict). Default None.
        attention_output_gate: bool, gated attention in the
            self-attention (Qwen3-Next and Qwen 3.5's full-attention
            layers; Qiu et al., 2025): each head's attention result is
            multiplied by `sigmoid` of a projection of the sublayer's
            input (`heads x value head size`, weights `gate`) before the
            output projection, on every path and with every cache
            (`MultiHeadAttention(use_gate=True)`). Default False.
        self_attention: optional layer, the block's token mixer, used
            as it is instead of one built from the options above: any
            `keras_attention.layers.TokenMixer` (`SelfAttention`,
            `LocalSelfAttention`, `MultiHeadAttention` and its
            subclasses, `MultiHeadLatentAttention`, `LinearAttention`,
            `GatedDeltaNet`, a user's layer). The options that configure
            only the self-attention (`window_size`, `score_mod`,
            `mask_mod`, `rotary_*`, `attention_output_gate`,
            `latent_attention`, `mixer`, `mixer_options`, and the
            attention options when no other attention layer is built
            from them) are then refused beside it. Default None.
        feed_forward: optional layer, the block's feed-forward (e.g.
            `FeedForward`, `MixtureOfExperts`, any Keras layer mapping
            `(batch, T, features)` to the same shape); the feed-forward
            options (`intermediate_dim`, `activation`,
            `gated_feed_forward`, `moe`) are then refused beside it.
            Default None.
        **kwargs: base layer arguments (`name`, `dtype`, `trainable`).

    Call arguments:
        inputs: `(batch, T, features)` decoder sequence.
        context: `(batch, S, context_features)` encoder output; required
            when `cross_attention` unless `cross_attention_cache` is given.
        padding_mask: optional boolean `(batch, T)` mask of the decoder
            queries (read from the Keras mask of `inputs` when omitted).
            With a cache it covers this call's queries only; mask padded
            cache slots with `attention_mask`.
        context_padding_mask: optional boolean `(batch, S)` (read from the
            Keras mask of `context` when omitted).
        attention_mask: optional boolean `(T, Tk)`, `(batch, T, Tk)` or
            `(batch, heads, T, Tk)` for the self-attention (`Tk = T`, or the
            cache length), combined with the causal and padding masks.
        cross_attention_mask: optional boolean mask `(.., T, S)` for the
            cross-attention.
        return_attention_scores: bool, also return the per-head weights of
            the self-attention `(batch, heads, T, Tk)` and, when
            `cross_attention`, of the cross-attention `(batch, heads, T, S)`.
        training: bool, dropout on or off.
        self_attention_cache: optional `(batch, 2, max_length, kv_heads,
            key_dim)` keys/values of earlier positions; with
            `latent_attention`, the latent cache `(batch, max_length,
            kv_lora_rank + qk_rope_head_dim)` (`MultiHeadLatentAttention`);
            with a `mixer`, the mixer's recurrent cache
            (`LinearAttention.initial_cache`, `GatedDeltaNet.init_cache`:
            the same size after any number of tokens; the index is then
            not read).
        self_attention_cache_update_index: int or scalar tensor, position
            of `inputs[:, 0]`; this call's keys/values are written there,
            so `0 <= index` and `index + T <= max_length` (a `ValueError`
            otherwise; a symbolic index, in a compiled function, is not
            checked: see `MultiHeadAttention`).
        cross_attention_cache: optional `compute_cross_attention_cache(
            context)` result, used instead of projecting `context`.
        self_attention_cache_sink_tokens: optional int >= 0 (windowed
            self-attention only): `self_attention_cache` is a rolling cache
            `(batch, 2, S, kv_heads, key_dim)` of `S >= sink_tokens +
            window + 1` slots (positions `0 .. sink_tokens - 1`, then a ring
            of the latest ones; see
            `MultiHeadAttention(cache_sink_tokens=...)`), each step costing
            `O(S)`; `self_attention_cache_update_index` is the absolute
            position, and `attention_mask` (if any) covers the `S` slots
            then this call's `T` keys.
        segment_ids: optional integer `(batch, T)` (no cache): packed
            documents; in the self-attention a token attends only within its
            document (tiles between documents skipped on the blockwise
            path) and rotary positions restart at each document
            (`keras_attention.masks.segment_positions`).
        positions: optional integer `(batch, T)` or `(T,)`: the rotary
            positions of the self-attention's queries and keys (needs
            `rotary_max_wavelength`; a `ValueError` otherwise), instead of
            `self_attention_cache_update_index + arange(T)` (or those of
            `segment_ids`); with a cache, this call's keys are cached
            rotated at them. Positions restarting at each packed document,
            with `attention_mask` (or `segment_ids`) keeping each token in
            its document, give each document's own outputs. Not with a
            rolling cache. The cross-attention has no positions.
        cache, cache_update_index: the block's own cache (`init_cache`,
            the `keras_attention.layers.TokenMixer` protocol) and the
            position of `inputs[:, 0]`: the block then returns `(outputs,
            cache)`, its self-attention keeping the key mask of its
            cache (`padding_mask` covers this call's tokens only) and the
            cache holding the context's keys and values (no `context`,
            masks of the cache, scores or the `self_attention_cache*`
            arguments beside it).
        mask, inputs_mask, context_mask: filled by Keras from the inputs'
            Keras masks; pass `padding_mask`/`context_padding_mask` instead.

    Returns:
        `(batch, T, features)`, then the self-attention weights and the
        cross-attention weights (if `return_attention_scores`), then the
        updated self-attention cache (if one was given).

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> block = keras_attention.blocks.TransformerDecoderBlock(
    ...     num_heads=2, intermediate_dim=16)
    >>> x, ctx = np.ones((2, 4, 8), "float32"), np.ones((2, 6, 8), "float32")
    >>> y, w_self, w_cross = block(x, ctx, return_attention_scores=True)
    >>> tuple(y.shape), tuple(w_self.shape), tuple(w_cross.shape)
    ((2, 4, 8), (2, 2, 4, 4), (2, 2, 4, 6))

    References:
        - Vaswani et al., 2017, "Attention Is All You Need".
        - Radford et al., 2019, "Language Models are Unsupervised Multitask
          Learners" (decoder-only).
    """

    causal = True  # always; not an argument nor a config key

    def __init__(
        self,
        num_heads=None,
        intermediate_dim=None,
        cross_attention=True,
        key_dim=None,
        num_key_value_heads=None,
        dropout=0.0,
        activation="relu",
        norm_first=False,
        layer_norm_epsilon=1e-5,
        rotary_max_wavelength=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        window_size=None,
        score_mod=None,
        mask_mod=None,
        normalization="layer_norm",
        use_bias=True,
        gated_feed_forward=False,
        sandwich_norm=False,
        rotary_scaling=None,
        attention_scale=None,
        qk_norm=None,
        qk_norm_epsilon=None,
        learned_sinks=False,
        rotary_fraction=1.0,
        moe=None,
        mixer="attention",
        mixer_options=None,
        latent_attention=None,
        attention_output_gate=False,
        parallel_residual=False,
        self_attention=None,
        feed_forward=None,
        **kwargs,
    ):
        if "causal" in kwargs:
            raise ValueError(
                "`TransformerDecoderBlock` is always causal. "
                f"Received: causal={kwargs['causal']!r}"
            )
        super().__init__(
            num_heads,
            intermediate_dim,
            key_dim=key_dim,
            num_key_value_heads=num_key_value_heads,
            dropout=dropout,
            activation=activation,
            norm_first=norm_first,
            layer_norm_epsilon=layer_norm_epsilon,
            rotary_max_wavelength=rotary_max_wavelength,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            window_size=window_size,
            score_mod=score_mod,
            mask_mod=mask_mod,
            normalization=normalization,
            use_bias=use_bias,
            gated_feed_forward=gated_feed_forward,
            sandwich_norm=sandwich_norm,
            rotary_scaling=rotary_scaling,
            attention_scale=attention_scale,
            qk_norm=qk_norm,
            qk_norm_epsilon=qk_norm_epsilon,
            learned_sinks=learned_sinks,
            rotary_fraction=rotary_fraction,
            moe=moe,
            mixer=mixer,
            mixer_options=mixer_options,
            latent_attention=latent_attention,
            attention_output_gate=attention_output_gate,
            parallel_residual=parallel_residual,
            self_attention=self_attention,
            feed_forward=feed_forward,
            cross_attention=cross_attention,
            **kwargs,
        )
        cross_attention = _compose.CROSS in self._present
        if _compose.CROSS in self._given:
            self.cross_attention_layer = self._given[_compose.CROSS]
        if _compose.SELF in self._given:
            _compose.check_causal(self_attention, True)
        if cross_attention and self.latent_attention is not None:
            raise ValueError(
                "`latent_attention` is the self-attention of decoder-only "
                "models (DeepSeek-V2/V3): pass cross_attention=False. "
                f"Received: cross_attention={cross_attention!r}, "
                f"latent_attention={self.latent_attention!r}"
            )
        if cross_attention and self.mixer != "attention":
            raise ValueError(
                "`mixer` replaces the self-attention of decoder-only "
                "stacks (a recurrent cache per layer, "
                "`CausalLMGenerator`): pass cross_attention=False. "
                f"Received: cross_attention={cross_attention!r}, "
                f"mixer={self.mixer!r}"
            )
        self.cross_attention = cross_attention

    def _make_cross_attention(self, hidden_dim):
        return CrossAttention(
            **self._attention_kwargs(hidden_dim, "cross_attention")
        )

    def build(self, inputs_shape, context_shape=None):
        super().build(inputs_shape)
        if not self.cross_attention:
            return
        if context_shape is None:
            raise ValueError(
                "A block with `cross_attention=True` is built from `inputs` "
                "and `context`. Call it once with a `context` first. "
                "Received: context_shape=None"
            )
        validation.check_sequence_shape("context", context_shape)
        if _compose.CROSS not in self._given:
            self.cross_attention_layer = self._make_cross_attention(
                inputs_shape[-1]
            )
        if not self.cross_attention_layer.built:
            self.cross_attention_layer.build(inputs_shape, context_shape)
        self.cross_attention_norm = self._make_pre_norm(
            "cross_attention_norm", inputs_shape
        )
        self.cross_attention_dropout = self._make_dropout(
            "cross_attention_dropout"
        )
        self.cross_attention_post_norm = self._make_post_norm(
            "cross_attention_post_norm", inputs_shape
        )
        self.built = True

    def init_cache(self, batch_size, max_length, dtype=None, **options):
        """The block's empty cache for `block(x, cache=cache,
        cache_update_index=index, padding_mask=mask)`, which returns
        `(outputs, cache)` (the `keras_attention.layers.TokenMixer`
        protocol): `(self_attention_cache,)`, the self-attention's own
        `init_cache`, and with cross-attention `(self_attention_cache,
        cross_keys_values, context_mask)`.

        Args:
            batch_size: int (or int scalar tensor), the sequences.
            max_length: int, the positions of the self-attention's cache.
            dtype: the cache's dtype; the block's compute dtype when None.
            **options: `context` (and `context_padding_mask`), required
                with cross-attention; `sink_tokens` (int >= 0), a ring of
                `sink_tokens + window + 1` slots for a windowed
                self-attention (the others keep `max_length`
                positions).
        """
        return _cache.init_block_cache(
            self, batch_size, max_length, dtype, **options
        )

    def cache_window(self):
        """The self-attention's `cache_window()`: how many earlier
        positions a query sees (None: all of them)."""
        return _cache.cache_window(self)

    def cache_overwrites_positions(self, cache):
        """Whether the block's cache keeps a slot per position that a
        call at that position overwrites: its self-attention's
        (`TokenMixer.cache_overwrites_positions`; the cross-attention's
        part is read only)."""
        return _cache.overwrites_positions(self, cache)

    def compute_cross_attention_cache(self, context):
        """Encoder keys/values `(batch, 2, S, kv_heads, key_dim)`, once per
        source sequence. The block must be built (called once, or `build`
        with the inputs' and context's shapes): the decoder's feature size is
        not known from `context` alone."""
        if not self.cross_attention:
            raise ValueError(
                "This block has no cross-attention "
                "(`cross_attention=False`): there is no context to cache."
            )
        if not self.built:
            raise ValueError(
                "`compute_cross_attention_cache` needs a built block: call it "
                "once or `build(inputs_shape, context_shape)` first. "
                f"Received: context.shape={tuple(context.shape)!r}"
            )
        return self.cross_attention_layer.compute_cache(context)

    def call(
        self,
        inputs,
        context=None,
        padding_mask=None,
        context_padding_mask=None,
        attention_mask=None,
        cross_attention_mask=None,
        return_attention_scores=False,
        training=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        mask=None,
        inputs_mask=None,
        context_mask=None,
        mod_inputs=None,
        segment_ids=None,
        self_attention_cache_sink_tokens=None,
        positions=None,
        cache=None,
        cache_update_index=None,
    ):
        padding_mask = keras_utils.first_not_none(
            padding_mask, inputs_mask, mask
        )
        if cache is not None:  # `init_cache`'s (`TokenMixer` protocol)
            given = dict(locals())
            return _cache.cached_call(
                self,
                inputs,
                cache,
                cache_update_index,
                padding_mask,
                training,
                given,
            )
        self._check_context(context, cross_attention_cache)
        context_padding_mask = keras_utils.first_not_none(
            context_padding_mask, context_mask
        )
        use_cache = self_attention_cache is not None
        if use_cache and self_attention_cache_update_index is None:
            raise ValueError(
                "`self_attention_cache_update_index` is required with "
                "`self_attention_cache`. Received: "
                "self_attention_cache_update_index=None"
            )
        kind = _compose.kind(self.self_attention)
        latent = kind == "latent"
        if latent and self_attention_cache_sink_tokens is not None:
            raise ValueError(
                "`self_attention_cache_sink_tokens` needs a rolling cache, "
                "which latent attention (no window) has none of. Received: "
                "self_attention_cache_sink_tokens="
                f"{self_attention_cache_sink_tokens!r}"
            )
        if use_cache:
            recurrent = kind in ("mixer", "protocol")  # no positions to fit
            check_cache_index(
                self_attention_cache_update_index,
                inputs.shape[1],
                None
                if recurrent
                else _latent.cache_length(self_attention_cache, latent),
                name="self_attention_cache_update_index",
                rolling=self_attention_cache_sink_tokens is not None,
            )
        x, self_extra = self._self_attention_residual(
            inputs,
            training,
            mask=padding_mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            cache=self_attention_cache,
            cache_update_index=self_attention_cache_update_index,
            **({} if mod_inputs is None else {"mod_inputs": mod_inputs}),
            **({} if segment_ids is None else {"segment_ids": segment_ids}),
            **({} if positions is None else {"positions": positions}),
            **(
                {}
                if self_attention_cache_sink_tokens is None
                else {"cache_sink_tokens": self_attention_cache_sink_tokens}
            ),
        )
        cross_extra = ()
        if self.cross_attention:
            x, cross_extra = self._cross_attention_residual(
                x,
                training,
                context=context,
                query_mask=padding_mask,
                context_mask=context_padding_mask,
                attention_mask=cross_attention_mask,
                return_attention_scores=return_attention_scores,
                cache=cross_attention_cache,
            )
        x = self._feed_forward_residual(x, training, padding_mask, inputs)
        # self_extra: (scores?, cache?); cross_extra: (scores?,)
        outputs = (x,)
        if return_attention_scores:
            outputs += (self_extra[0],) + cross_extra
        if use_cache:
            outputs += (self_extra[-1],)
        return outputs[0] if len(outputs) == 1 else outputs

    def _check_context(self, context, cross_attention_cache):
        has_context = context is not None or cross_attention_cache is not None
        if self.cross_attention and not has_context:
            raise ValueError(
                "This block has `cross_attention=True`: pass `context` (or "
                "`cross_attention_cache`). Received: context=None"
            )
        if not self.cross_attention and has_context:
            raise ValueError(
                "This block has `cross_attention=False` and takes no "
                "context. Received: "
                f"context.shape={getattr(context, 'shape', None)!r}"
            )

    def _cross_attention_residual(self, x, training, context, cache, **kwargs):
        """The cross-attention sublayer; `kwargs` go to `CrossAttention`."""

        def attend(y):
            out = self.cross_attention_layer(
                y, context, training=training, cache=cache, **kwargs
            )
            if cache is None:
                return out
            out = out[:-1]  # the fixed cache comes back unchanged
            return out if len(out) > 1 else out[0]

        return self._residual(
            x,
            attend,
            self.cross_attention_norm,
            self.cross_attention_dropout,
            training,
            post_norm=self.cross_attention_post_norm,
        )

    def compute_output_spec(
        self,
        inputs,
        context=None,
        return_attention_scores=False,
        self_attention_cache=None,
        cross_attention_cache=None,
        self_attention_cache_sink_tokens=None,
        **kwargs,
    ):
        b, t = inputs.shape[0], inputs.shape[1]
        outputs = (keras.KerasTensor(inputs.shape, dtype=self.compute_dtype),)
        if return_attention_scores:
            outputs += (
                self._self_attention_scores_spec(
                    inputs,
                    self_attention_cache,
                    self_attention_cache_sink_tokens,
                ),
            )
            if self.cross_attention:
                s = (
                    context.shape[1]
                    if cross_attention_cache is None
                    else cross_attention_cache.shape[2]
                )
                outputs += (
                    keras.KerasTensor(
                        (b, self.cross_attention_layer.num_heads, t, s),
                        dtype=self.compute_dtype,
                    ),
                )
        if self_attention_cache is not None:
            outputs += (
                keras.tree.map_structure(
                    lambda c: keras.KerasTensor(c.shape, dtype=c.dtype),
                    self_attention_cache,
                ),
            )
        return outputs[0] if len(outputs) == 1 else outputs

    def get_config(self):
        config = super().get_config()
        if _compose.CROSS not in self._given:
            config["cross_attention"] = self.cross_attention
        return config
