import keras

from keras_attention import masks as masks_lib
from keras_attention.layers._validation import check_bool as _check_bool
from keras_attention.layers._validation import (
    check_positive_int as _check_positive_int,
)
from keras_attention.layers._validation import (
    check_positive_number as _check_positive_number,
)
from keras_attention.layers._validation import check_rate as _check_rate
from keras_attention.layers._validation import check_rotary_head_size
from keras_attention.layers._validation import clone_initializer as _clone
from keras_attention.layers.feed_forward import FeedForward
from keras_attention.layers.local_self_attention import LocalSelfAttention
from keras_attention.layers.self_attention import SelfAttention


def _first(*values):
    for v in values:
        if v is not None:
            return v
    return None


@keras.saving.register_keras_serializable(package="keras_attention")
class TransformerEncoderBlock(keras.layers.Layer):
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
    `_make_self_attention()`.

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
        layer_norm_epsilon: float, epsilon of the layer norms.
        causal: bool, causal self-attention (position `i` sees `<= i`).
        rotary_max_wavelength: optional number; rotary position embeddings
            in the self-attention (None: off).
        window_size: optional int or pair `(left, right)`; when set, the
            self-attention is local (`LocalSelfAttention`: position `i`
            sees `i - left .. i + right`, in `O(T * window)` time and
            memory, Longformer-style) and returned attention weights are
            banded `(batch, heads, T, left + right + 1)`. None: full
            attention.
        kernel_initializer, bias_initializer: initializers of all dense
            layers.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

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

    Returns:
        `(batch, T, features)`, and the per-head attention weights
        `(batch, num_heads, T, T)` if `return_attention_scores`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> block = keras_attention.layers.TransformerEncoderBlock(
    ...     num_heads=2, intermediate_dim=32)
    >>> y, w = block(np.ones((2, 5, 8), "float32"), return_attention_scores=True)
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
        **kwargs,
    ):
        super().__init__(**kwargs)
        if window_size is not None:
            masks_lib.window_bounds(window_size)  # validates
            if isinstance(window_size, list):
                window_size = tuple(window_size)
        _check_positive_int("num_heads", num_heads)
        _check_positive_int("intermediate_dim", intermediate_dim)
        _check_positive_int("key_dim", key_dim, allow_none=True)
        _check_positive_int(
            "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise ValueError(
                "`num_key_value_heads` must divide `num_heads`. Received: "
                f"num_key_value_heads={num_key_value_heads!r}, "
                f"num_heads={num_heads!r}"
            )
        _check_rate("dropout", dropout)
        _check_positive_number("layer_norm_epsilon", layer_norm_epsilon)
        norm_first = _check_bool("norm_first", norm_first)
        causal = _check_bool("causal", causal)
        _check_positive_number(
            "rotary_max_wavelength", rotary_max_wavelength, allow_none=True
        )
        if key_dim is not None:
            check_rotary_head_size(
                rotary_max_wavelength, key_dim, f"key_dim={key_dim!r}"
            )
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.key_dim = key_dim
        self.num_key_value_heads = num_key_value_heads
        self.dropout = dropout
        self.activation = keras.activations.get(activation)
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.causal = causal
        self.rotary_max_wavelength = rotary_max_wavelength
        self.window_size = window_size
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    # Sublayer factories (override or extend in subclasses / other blocks).

    def _head_dim(self, hidden_dim):
        if self.key_dim is not None:
            return self.key_dim
        if hidden_dim % self.num_heads:
            raise ValueError(
                "The feature size must be divisible by `num_heads` when "
                f"`key_dim` is None. Received: features={hidden_dim!r}, "
                f"num_heads={self.num_heads!r}"
            )
        head_dim = hidden_dim // self.num_heads
        check_rotary_head_size(
            self.rotary_max_wavelength,
            head_dim,
            f"head size features // num_heads = {hidden_dim!r} // "
            f"{self.num_heads!r} = {head_dim!r}",
        )
        return head_dim

    def _self_attention_kwargs(self, hidden_dim):
        """Arguments shared by every self-attention variant of the block."""
        return dict(
            num_heads=self.num_heads,
            key_dim=self._head_dim(hidden_dim),
            num_key_value_heads=self.num_key_value_heads,
            dropout=self.dropout,
            rotary_max_wavelength=self.rotary_max_wavelength,
            kernel_initializer=_clone(self.kernel_initializer),
            bias_initializer=_clone(self.bias_initializer),
            dtype=self.dtype_policy,
            name="self_attention",
        )

    def _make_self_attention(self, hidden_dim):
        """The block's self-attention layer: `call(x, mask=...,
        attention_mask=..., return_attention_scores=..., training=...)`."""
        if self.window_size is not None:
            return LocalSelfAttention(
                window_size=self.window_size,
                causal=self.causal,
                **self._self_attention_kwargs(hidden_dim),
            )
        return SelfAttention(
            causal=self.causal, **self._self_attention_kwargs(hidden_dim)
        )

    def _make_norm(self, name):
        return keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def _make_dropout(self, name):
        return keras.layers.Dropout(
            self.dropout, dtype=self.dtype_policy, name=name
        )

    def _make_feed_forward(self):
        return FeedForward(
            self.intermediate_dim,
            activation=self.activation,
            dropout=self.dropout,
            kernel_initializer=_clone(self.kernel_initializer),
            bias_initializer=_clone(self.bias_initializer),
            dtype=self.dtype_policy,
            name="feed_forward",
        )

    def build(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                "`inputs` must have shape (batch, steps, features) with a known "
                f"feature size. Received: inputs_shape={tuple(inputs_shape)!r}"
            )
        hidden_dim = inputs_shape[-1]
        self.self_attention = self._make_self_attention(hidden_dim)
        self.self_attention.build(inputs_shape)
        self.self_attention_norm = self._make_norm("self_attention_norm")
        self.self_attention_norm.build(inputs_shape)
        self.self_attention_dropout = self._make_dropout(
            "self_attention_dropout"
        )
        self.feed_forward = self._make_feed_forward()
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm = self._make_norm("feed_forward_norm")
        self.feed_forward_norm.build(inputs_shape)
        self.feed_forward_dropout = self._make_dropout("feed_forward_dropout")
        self.built = True

    def _residual(self, x, sublayer, norm, dropout, training):
        """Runs `sublayer` with residual + norm; returns (x, extra outputs)."""
        y = norm(x) if self.norm_first else x
        outputs = sublayer(y)
        if isinstance(outputs, tuple):
            y, extra = outputs[0], outputs[1:]
        else:
            y, extra = outputs, ()
        x = x + dropout(y, training=training)
        if not self.norm_first:
            x = norm(x)
        return x, extra

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        mask=None,
        inputs_mask=None,
    ):
        padding_mask = _first(padding_mask, inputs_mask, mask)

        def attend(y):
            return self.self_attention(
                y,
                mask=padding_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )

        x, extra = self._residual(
            inputs,
            attend,
            self.self_attention_norm,
            self.self_attention_dropout,
            training,
        )
        x, _ = self._residual(
            x,
            lambda y: self.feed_forward(y, training=training),
            self.feed_forward_norm,
            self.feed_forward_dropout,
            training,
        )
        if return_attention_scores:
            return (x,) + extra
        return x

    def compute_output_spec(
        self, inputs, return_attention_scores=False, **kwargs
    ):
        output = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_attention_scores:
            return output
        return output, self._self_attention_scores_spec(inputs)

    def _self_attention_scores_spec(self, inputs, cache=None):
        """Shape of the self-attention weights, as the attention layer says
        (a local attention layer may return banded weights)."""
        spec = self.self_attention.compute_output_spec(
            inputs, return_attention_scores=True, cache=cache
        )[1]
        return keras.KerasTensor(spec.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "key_dim": self.key_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "dropout": self.dropout,
                "activation": keras.activations.serialize(self.activation),
                "norm_first": self.norm_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "causal": self.causal,
                "rotary_max_wavelength": self.rotary_max_wavelength,
                "window_size": self.window_size,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config
