import keras

from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.utils import validation


@keras.saving.register_keras_serializable(package="keras_attention")
class GroupQueryAttention(MultiHeadAttention):
    """Grouped-query attention, a drop-in for Keras's
    `keras.layers.GroupQueryAttention` (Ainslie et al. 2023).

    `num_query_heads` query heads share `num_key_value_heads` key/value
    heads (`num_query_heads / num_key_value_heads` queries per group;
    1 key/value head is multi-query attention, as many as the queries is
    multi-head attention). Keras's constructor (the same positional
    order), config keys, weights (`set_weights` from Keras's layer gives
    the same outputs: query, key, [gate], value, output projections) and
    shape rules (`query` and `value` have the same feature size; the
    output has it too), on this library's `MultiHeadAttention`: its
    blockwise and banded paths (`sliding_window`), score and mask objects
    (`score_mod=`, `mask_mod=`), rotary positions and caches.

    Axes: b - batch, q/k - query/key positions, u - heads, h - `head_dim`.
    `out = W_o . concat_u softmax(q_u k_g(u)^T / sqrt(h)) v_g(u)`, with
    `g(u) = u // (num_query_heads / num_key_value_heads)`.

    Args:
        head_dim: int, size of each query, key and value head.
        num_query_heads: int, number of query heads.
        num_key_value_heads: int, number of key/value heads; divides
            `num_query_heads`.
        dropout: float, attention-weight dropout rate.
        use_bias: bool, whether the projections have biases.
        sliding_window: optional int, Keras's window `|q - k| < w`.
        flash_attention: Keras's flag (None: automatic).
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        kernel_regularizer: regularizer of the kernels.
        bias_regularizer: regularizer of the biases.
        activity_regularizer: regularizer of the output.
        kernel_constraint: constraint of the kernels.
        bias_constraint: constraint of the biases.
        use_gate: bool, a sigmoid gate on the attention output.
        seed: int, the dropout seed.
        rotary_max_wavelength: keyword only; rotary positions on queries
            and keys (see `MultiHeadAttention`).
        rotary_scaling: keyword only; a dict of `RotaryEmbedding`'s
            context-extension arguments (see `MultiHeadAttention`).
        score_mod: keyword only; a score object (see `MultiHeadAttention`).
        mask_mod: keyword only; a mask object (see `MultiHeadAttention`).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(batch, Tq, features)`.
        value: `(batch, Tk, features)` (the query's feature size).
        key: optional `(batch, Tk, key_features)`; defaults to `value`.
        attention_mask, return_attention_scores, training,
        use_causal_mask, and this library's mask and cache arguments: see
            `MultiHeadAttention`.

    Returns:
        `(batch, Tq, features)`, and the scores `(batch, num_query_heads,
        Tq, Tk)` if requested.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.GroupQueryAttention(
    ...     head_dim=8, num_query_heads=4, num_key_value_heads=2)
    >>> x = np.ones((2, 10, 32), "float32")
    >>> y, scores = layer(x, x, return_attention_scores=True)
    >>> tuple(y.shape), tuple(scores.shape)
    ((2, 10, 32), (2, 4, 10, 10))

    References:
        - Ainslie et al., 2023, "GQA: Training Generalized Multi-Query
          Transformer Models from Multi-Head Checkpoints".
        - Shazeer, 2019, "Fast Transformer Decoding: One Write-Head is All
          You Need" (multi-query attention).
    """

    def __init__(
        self,
        head_dim,
        num_query_heads,
        num_key_value_heads,
        dropout=0.0,
        use_bias=True,
        sliding_window=None,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        use_gate=False,
        seed=None,
        *,
        rotary_max_wavelength=None,
        rotary_scaling=None,
        score_mod=None,
        mask_mod=None,
        **kwargs,
    ):
        head_dim = validation.check_positive_int("head_dim", head_dim)
        num_query_heads = validation.check_positive_int(
            "num_query_heads", num_query_heads
        )
        num_key_value_heads = validation.check_positive_int(
            "num_key_value_heads", num_key_value_heads
        )
        if num_query_heads % num_key_value_heads:
            raise ValueError(
                "`num_query_heads` must be divisible by "
                "`num_key_value_heads`. Received: "
                f"num_query_heads={num_query_heads!r}, "
                f"num_key_value_heads={num_key_value_heads!r}"
            )
        super().__init__(
            num_heads=num_query_heads,
            key_dim=head_dim,
            value_dim=head_dim,
            dropout=dropout,
            use_bias=use_bias,
            sliding_window=sliding_window,
            flash_attention=flash_attention,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            kernel_regularizer=kernel_regularizer,
            bias_regularizer=bias_regularizer,
            activity_regularizer=activity_regularizer,
            kernel_constraint=kernel_constraint,
            bias_constraint=bias_constraint,
            use_gate=use_gate,
            seed=seed,
            num_key_value_heads=num_key_value_heads,
            rotary_max_wavelength=rotary_max_wavelength,
            rotary_scaling=rotary_scaling,
            score_mod=score_mod,
            mask_mod=mask_mod,
            **kwargs,
        )

    @property
    def head_dim(self):
        return self.key_dim

    @property
    def num_query_heads(self):
        return self.num_heads

    @property
    def num_repeats(self):
        """Query heads per key/value head."""
        return self.num_heads // self.num_key_value_heads

    def _check_shapes(self, query_shape, value_shape, key_shape):
        _check_feature_sizes(query_shape, value_shape)
        super()._check_shapes(query_shape, value_shape, key_shape)

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        _check_feature_sizes(query_shape, value_shape)
        return super().compute_output_shape(query_shape, value_shape, key_shape)

    def get_config(self):
        config = super().get_config()
        for name in (
            "num_heads",
            "key_dim",
            "value_dim",
            "output_shape",
            "attention_axes",
        ):
            config.pop(name)
        config.update(
            head_dim=self.head_dim,
            num_query_heads=self.num_query_heads,
        )
        for name in ("rotary_max_wavelength", "rotary_scaling"):
            if config.get(name) is None:
                config.pop(name, None)
        return config


def _check_feature_sizes(query_shape, value_shape):
    """Keras's rule: `query` and `value` have the same feature size (the
    output projection maps back to it)."""
    q, v = tuple(query_shape)[-1], tuple(value_shape)[-1]
    if q is not None and v is not None and q != v:
        raise ValueError(
            "The last dimension of `query_shape` and `value_shape` must be "
            f"equal, but are {q}, {v}. Received: "
            f"query_shape={tuple(query_shape)!r}, "
            f"value_shape={tuple(value_shape)!r}"
        )
