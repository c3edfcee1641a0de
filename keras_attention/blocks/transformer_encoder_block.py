"""`TransformerEncoderBlock`: self-attention and feed-forward."""

import keras

from keras_attention.blocks import _mixer
from keras_attention.blocks._transformer_block import TransformerBlock
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
        num_heads: int, number of attention heads.
        intermediate_dim: int, hidden width of the feed-forward network.
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
        rotary_max_wavelength: optional finite number >= 1; rotary
            position embeddings in the self-attention (None: off).
        window_size: optional int or pair `(left, right)`; when set, the
            self-attention is local (`LocalSelfAttention`: position `i`
            sees `i - left .. i + right`, in `O(T * window)` time and
            memory, Longformer-style) and returned attention weights are
            banded `(batch, heads, T, left + right + 1)`, the window
            capped at `T - 1` each side (see `LocalSelfAttention`). None:
            full attention.
        kernel_initializer: initializer of all dense kernels.
        bias_initializer: initializer of all dense biases.
        **kwargs: the block options `normalization` (`"layer_norm"`, the
            default, or `"rms_norm"`), `use_bias` (default True) and
            `gated_feed_forward` (default False; SwiGLU with
            `activation="silu"`), `sandwich_norm` (default False; a norm
            of each sublayer's output too, Gemma 2's post-norms),
            `rotary_scaling` (default None; a dict of `RotaryEmbedding`'s
            context-extension arguments, e.g. `{"scaling_factor": 4.0}`,
            see `MultiHeadAttention`), `attention_scale` (default None:
            `1 / sqrt(key_dim)`; the factor of the scores of the block's
            attention layers, `1.0` for T5), `mixer` and `mixer_options`
            (default `"attention"` and None: a linear-time mixer,
            `"linear"` or `"gated_delta"`, in the self-attention's
            place, as in `TransformerDecoderBlock`; not causal only with
            `"linear"` and no decay, the others read the past only and
            are refused with `causal=False`), and base layer arguments
            (`name`, `dtype`, ...).

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

    References:
        - Vaswani et al., 2017, "Attention Is All You Need".
        - Xiong et al., 2020, "On Layer Normalization in the Transformer
          Architecture" (pre-norm).
        - Su et al., 2021, "RoFormer" (rotary positions).
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
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
            **kwargs,
        )
        self.causal = validation.check_bool("causal", causal)
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
            if self.window_size is None:
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
        x = self._feed_forward_residual(x, training, padding_mask)
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
        config["global_projections"] = self.global_projections
        config["max_global_tokens"] = self.max_global_tokens
        return config
