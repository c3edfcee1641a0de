"""`TransformerEncoderBlock`: self-attention and feed-forward."""

import keras

from keras_attention.blocks import _compose
from keras_attention.blocks import _mixer
from keras_attention.blocks._transformer_block import TransformerBlock
from keras_attention.layers.local_self_attention import LocalSelfAttention
from keras_attention.utils import keras_utils
from keras_attention.utils import validation


@keras.saving.register_keras_serializable(package="keras_attention")
class TransformerEncoderBlock(TransformerBlock):
    """Transformer encoder block: self-attention and feed-forward, each with
    a residual connection and layer normalization.

    Post-norm (the paper, `norm_first=False`):

        x = LayerNorm(x + Dropout(SelfAttention(x)))
        x = LayerNorm(x + Dropout(FeedForward(x)))

    Pre-norm (`norm_first=True`, easier to train deep):

        x = x + Dropout(SelfAttention(LayerNorm(x)))
        x = x + Dropout(FeedForward(LayerNorm(x)))

    The Keras mask of `inputs` (e.g. from `TokenAndPositionEmbedding(...,
    mask_zero=True)`) is read as the padding mask and passed on to the
    output. The attention layer comes from the overridable factory
    `_make_self_attention()`. `TransformerDecoderBlock` is its sibling
    (both share a private base): a decoder block is always causal and
    may attend to an encoder's output.

    Args:
        num_heads: int, number of attention heads of the self-attention
            the block builds (None only with `self_attention` given).
        intermediate_dim: int, hidden width of the feed-forward network
            the block builds (None only with `feed_forward` given, or a
            `moe` with its own `intermediate_dim`).
        key_dim: int, size of each attention head; defaults to
            `features // num_heads`.
        num_key_value_heads: int dividing `num_heads` (grouped-query
            attention); defaults to `num_heads`.
        dropout: float in [0, 1), dropout on the attention weights, the
            feed-forward hidden layer and both residual branches.
        activation: activation of the feed-forward network.
        norm_first: bool, pre-norm instead of post-norm.
        layer_norm_epsilon: finite positive float, epsilon of the layer
            norms.
        causal: bool, causal self-attention (position `i` sees `<= i`).
            A given `self_attention` with a `causal` of its own
            (`SelfAttention`, `LocalSelfAttention`) must agree with it.
        rotary_max_wavelength: optional finite number >= 1; rotary
            position embeddings in the self-attention (None: off).
        kernel_initializer: initializer of all dense kernels.
        bias_initializer: initializer of all dense biases.
        window_size: optional int or pair `(left, right)`; when set, the
            self-attention is local (`LocalSelfAttention`: position `i`
            sees `i - left .. i + right`, in `O(T * window)` time and
            memory, Longformer-style) and returned attention weights are
            banded `(batch, heads, T, left + right + 1)`, the window
            capped at `T - 1` each side (see `LocalSelfAttention`). None:
            full attention.
        global_projections: bool, separate projections for the global
            tokens of the local self-attention (Longformer; needs
            `window_size`). Default False.
        max_global_tokens: optional int, a bound on the global tokens per
            sequence (needs `window_size`; see `LocalSelfAttention`).
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
            `norm_first=True`. Default False.
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
            `attention_scale` are refused beside it (a `ValueError`).
            Default None: `SelfAttention` (or `LocalSelfAttention`).
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
            beside `"gated_delta"`), and so are an `attention_mask` and
            `positions` at call time. Not causal only with `"linear"` and
            no decay: the others read the past only and are refused with
            `causal=False`.
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
        inputs: `(batch, T, features)`.
        padding_mask: optional boolean `(batch, T)`, True on real tokens.
            Read from the Keras mask of `inputs` when omitted (Keras fills
            `mask`/`inputs_mask` for that; do not pass those yourself).
        attention_mask: optional boolean `(T, T)`, `(batch, T, T)` or
            `(batch, heads, T, T)`, e.g. `keras_attention.masks.
            prefix_lm_mask(T, prefix_length)`; combined with the padding
            (and causal) masks.
        return_attention_scores: bool, also return the attention weights.
        training: bool, dropout on or off.
        global_mask: optional boolean `(batch, T)`, True at global positions
            (Longformer: they attend to and are attended by every
            position); only with `window_size`. Attention weights are then
            the dict of `LocalSelfAttention`.
        segment_ids: optional integer `(batch, T)`: packed documents; a
            token attends only within its
            document (tiles between documents skipped on the blockwise
            path) and rotary positions restart at each document
            (`keras_attention.masks.segment_positions`).
        positions: optional integer `(batch, T)` or `(T,)`: the rotary
            positions of the self-attention's queries and keys (needs
            `rotary_max_wavelength`; a `ValueError` otherwise), instead of
            `0 .. T - 1` (or those of `segment_ids`). Positions restarting
            at each packed document, with `attention_mask` (or
            `segment_ids`) keeping each token in its document, give each
            document's own outputs.

    Returns:
        `(batch, T, features)`, and the per-head attention weights
        `(batch, num_heads, T, T)` if `return_attention_scores`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> block = keras_attention.blocks.TransformerEncoderBlock(
    ...     num_heads=2, intermediate_dim=32)
    >>> x = np.ones((2, 5, 8), "float32")
    >>> y, w = block(x, return_attention_scores=True)
    >>> tuple(y.shape), tuple(w.shape)
    ((2, 5, 8), (2, 2, 5, 5))

    Composed from layers: any token mixer as the self-attention, any
    Keras layer as the feed-forward (the block adds the norms, dropouts
    and residuals; options that would configure a given layer are
    refused):

    >>> block = keras_attention.blocks.TransformerEncoderBlock(
    ...     norm_first=True,
    ...     self_attention=keras_attention.layers.LinearAttention(
    ...         num_heads=2, key_dim=4),
    ...     feed_forward=keras_attention.layers.MixtureOfExperts(
    ...         num_experts=4, top_k=2, intermediate_dim=16))
    >>> tuple(block(x).shape)
    (2, 5, 8)
    >>> nested = block.get_config()["self_attention"]  # saved with the block
    >>> nested["class_name"]
    'LinearAttention'

    References:
        - Vaswani et al., 2017, "Attention Is All You Need".
        - Xiong et al., 2020, "On Layer Normalization in the Transformer
          Architecture" (pre-norm).
        - Su et al., 2021, "RoFormer" (rotary positions).
    """

    def __init__(
        self,
        num_heads=None,
        intermediate_dim=None,
        key_dim=None,
        num_key_value_heads=None,
        dropout=0.0,
        activation="relu",
        norm_first=False,
        layer_norm_epsilon=1e-5,
        causal=False,
        rotary_max_wavelength=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        window_size=None,
        global_projections=False,
        max_global_tokens=None,
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
            **kwargs,
        )
        _compose.check_options(
            dict(
                global_projections=global_projections,
                max_global_tokens=max_global_tokens,
            ),
            self._given,
            self._present,
        )
        self.causal = validation.check_bool("causal", causal)
        if _compose.SELF in self._given:
            _compose.check_causal(self_attention, self.causal)
            _mixer.check_causal(self, self_attention)
        else:
            _mixer.check_causal(self)
        self.global_projections = validation.check_bool(
            "global_projections", global_projections
        )
        self.max_global_tokens = validation.check_positive_int(
            "max_global_tokens", max_global_tokens, allow_none=True
        )
        if window_size is None and (global_projections or max_global_tokens):
            raise ValueError(
                "`global_projections` and `max_global_tokens` need "
                "`window_size` (global tokens run on local attention). "
                f"Received: global_projections={global_projections!r}, "
                f"max_global_tokens={max_global_tokens!r}, window_size=None"
            )

    def _local_attention_kwargs(self):
        return dict(
            global_projections=self.global_projections,
            max_global_tokens=self.max_global_tokens,
        )

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        mask=None,
        inputs_mask=None,
        global_mask=None,
        mod_inputs=None,
        segment_ids=None,
        positions=None,
    ):
        padding_mask = keras_utils.first_not_none(
            padding_mask, inputs_mask, mask
        )
        extra_kwargs = {}
        if mod_inputs is not None:
            extra_kwargs["mod_inputs"] = mod_inputs
        if segment_ids is not None:
            extra_kwargs["segment_ids"] = segment_ids
        if positions is not None:
            extra_kwargs["positions"] = positions
        if global_mask is not None:
            if not isinstance(self.self_attention, LocalSelfAttention):
                raise ValueError(
                    "`global_mask` needs a block with `window_size` (global "
                    "tokens run on local attention). Received: global_mask "
                    f"of shape {tuple(global_mask.shape)!r}, window_size=None"
                )
            extra_kwargs["global_mask"] = global_mask
        x, extra = self._self_attention_residual(
            inputs,
            training,
            mask=padding_mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            **extra_kwargs,
        )
        x = self._feed_forward_residual(x, training, padding_mask, inputs)
        if return_attention_scores:
            return (x,) + extra
        return x

    def compute_output_spec(
        self,
        inputs,
        return_attention_scores=False,
        global_mask=None,
        **kwargs,
    ):
        output = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return output
        if global_mask is not None:
            return output, self.self_attention.compute_output_spec(
                inputs, return_attention_scores=True, global_mask=global_mask
            )[1]
        return output, self._self_attention_scores_spec(inputs)

    def get_config(self):
        config = super().get_config()
        config["causal"] = self.causal
        if _compose.SELF not in self._given:
            config["global_projections"] = self.global_projections
            config["max_global_tokens"] = self.max_global_tokens
        return config
