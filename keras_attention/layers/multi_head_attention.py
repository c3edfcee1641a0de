import keras
from keras import ops

from keras_attention import masks as masks_lib
from keras_attention.ops.attention import as_4d_mask
from keras_attention.ops.attention import dot_product_attention
from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.layers._validation import check_rate as _check_rate
from keras_attention.layers._validation import check_positive_int as _check_positive_int


def _check_rank3(name, shape):
    if len(shape) != 3 or shape[-1] is None:
        raise ValueError(
            f"`{name}` must have shape (batch, steps, features) with a known "
            f"feature size. Received: {name}={tuple(shape)}"
        )


@keras.saving.register_keras_serializable(package="keras_attention")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head (and grouped-query) scaled dot-product attention.

    A drop-in replacement for `keras.layers.MultiHeadAttention` on
    `(batch, steps, features)` inputs: same call signature and, when
    `num_key_value_heads` is None, the same weights in the same order and
    shapes (`set_weights(keras_mha.get_weights())` gives the same outputs).
    Differences, all deliberate:
    - a query with nothing to attend to (fully masked row, padded query) gets
      zero attention weights and a zero attention result (then the output
      projection's bias), never NaN or uniform weights;
    - the softmax runs in float32 under mixed precision;
    - Keras masks of the inputs are read but never deleted, so a masked tensor
      reused by several layers keeps its mask for all of them;
    - attention scores are always per head, `(batch, num_heads, Tq, Tv)`;
    - grouped-query / multi-query attention with `num_key_value_heads`;
    - an optional key/value cache for incremental decoding.

    Which attention computation runs (same results up to float rounding,
    see `keras_attention.ops.dot_product_attention`):
    - with `return_attention_scores=True` or dropout in training, the dense
      one (scores `(batch, heads, Tq, Tv)` in memory), as for short or
      not-statically-known sequence lengths (`Tq * Tv <= 32768`);
    - otherwise on CPU (and TensorFlow GPUs), a blockwise one (online
      softmax over tiles, backward pass recomputing them): memory linear in
      the sequence length, and with `use_causal_mask` the tiles above the
      diagonal are skipped (about half the work). Causal and padding masks
      are passed to it as such, never as a `(Tq, Tv)` tensor;
    - on JAX/torch with a GPU, `keras.ops.dot_product_attention`, which
      uses the backend's fused (flash / cuDNN) kernel where it can.

    Args:
        num_heads: int, number of query heads `h`.
        key_dim: int, size of each query/key head.
        value_dim: int, size of each value head; defaults to `key_dim`.
        num_key_value_heads: int dividing `num_heads`, number of key/value
            heads (`1`: multi-query attention). Defaults to `num_heads`.
        dropout: float in [0, 1), dropout on the attention weights.
        use_bias: bool, whether the projections have biases.
        output_shape: int, size of the output features; defaults to the
            query's feature size.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, activity_regularizer, kernel_constraint,
        bias_constraint: as for `keras.layers.Dense`.
        seed: optional int, seed of the dropout.
        rotary_max_wavelength: optional number; when set, rotary position
            embeddings (`RotaryEmbedding`) rotate the projected queries and
            keys. Query positions start at `cache_update_index` (else 0);
            keys are rotated at their absolute positions when written into
            the cache (`compute_cache` rotates them from 0). Defaults to
            None (off; no weights added either way).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(batch, Tq, dq)`.
        value: `(batch, Tv, dv)`.
        key: optional `(batch, Tv, dk)`; defaults to `value`.
        query_mask, value_mask, key_mask: optional boolean `(batch, T)`
            padding masks; read from the inputs' Keras masks when omitted.
        attention_mask: optional boolean mask of shape `(Tq, Tv)`,
            `(batch, Tq, Tv)` or `(batch, num_heads, Tq, Tv)`; True = may
            attend. Combined (and) with the padding and causal masks.
        return_attention_scores: bool, also return the attention weights.
        training: bool, dropout on or off.
        use_causal_mask: bool, forbid attending to later positions.
        cache: optional `(batch, 2, max_length, num_key_value_heads, key_dim)`
            key/value cache. With `cache_update_index`, the projected keys
            and values of this call are written at that index and attention
            runs over the whole cache (mask unfilled slots with
            `attention_mask` or `use_causal_mask`, which then counts query
            positions from `cache_update_index`). Without it, the cached keys
            and values are used as they are (precomputed cross-attention,
            see `compute_cache`).
        cache_update_index: int or scalar tensor.

    Returns:
        `attention_output` `(batch, Tq, output_shape)`, then the attention
        scores `(batch, num_heads, Tq, Tv)` if requested, then the updated
        cache if one was given.

    Example:

    >>> mha = MultiHeadAttention(num_heads=2, key_dim=8)
    >>> x = np.ones((3, 5, 16), "float32")
    >>> y, scores = mha(x, x, return_attention_scores=True)
    >>> tuple(y.shape), tuple(scores.shape)
    ((3, 5, 16), (3, 2, 5, 5))

    References:
        - Vaswani et al., 2017, "Attention Is All You Need".
        - Shazeer, 2019, "Fast Transformer Decoding: One Write-Head is All
          You Need" (multi-query).
        - Ainslie et al., 2023, "GQA: Training Generalized Multi-Query
          Transformer Models from Multi-Head Checkpoints".
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        num_key_value_heads=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        rotary_max_wavelength=None,
        **kwargs,
    ):
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        _check_positive_int("num_heads", num_heads)
        _check_positive_int("key_dim", key_dim)
        _check_positive_int("value_dim", value_dim, allow_none=True)
        _check_positive_int(
            "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise ValueError(
                "`num_key_value_heads` must divide `num_heads`. Received: "
                f"num_key_value_heads={num_key_value_heads}, "
                f"num_heads={num_heads}"
            )
        _check_rate("dropout", dropout)
        if isinstance(output_shape, (tuple, list)):
            if len(output_shape) != 1:
                raise ValueError(
                    "`output_shape` must be an int or a 1-tuple. "
                    f"Received: output_shape={output_shape}"
                )
            output_shape = output_shape[0]
        _check_positive_int("output_shape", output_shape, allow_none=True)
        self.supports_masking = True
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim if value_dim else key_dim
        self.num_key_value_heads = num_key_value_heads
        self.dropout = dropout
        self.use_bias = use_bias
        self._output_shape = output_shape
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.seed = seed
        self.rotary_max_wavelength = rotary_max_wavelength
        self._rotary = None
        if rotary_max_wavelength is not None:
            self._rotary = RotaryEmbedding(
                max_wavelength=rotary_max_wavelength,
                dtype=self.dtype_policy,
                name="rotary_embedding",
            )
        self._dropout_layer = keras.layers.Dropout(
            rate=dropout, seed=seed, dtype=self.dtype_policy
        )

    @property
    def output_dim(self):
        """Size of the output features (known after build)."""
        return self._output_shape or self._query_feature_dim

    @property
    def _kv_heads(self):
        return self.num_key_value_heads or self.num_heads

    def _sublayer_kwargs(self):
        def clone(initializer):
            return initializer.__class__.from_config(initializer.get_config())

        return dict(
            kernel_initializer=clone(self.kernel_initializer),
            bias_initializer=clone(self.bias_initializer),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
        )

    def _projection(self, name, heads, dim):
        dense = keras.layers.EinsumDense(
            "abc,cde->abde",
            output_shape=(None, heads, dim),
            bias_axes="de" if self.use_bias else None,
            name=name,
            **self._sublayer_kwargs(),
        )
        # The projection keeps the time axis: let it carry the input's Keras
        # mask instead of warning that it drops it.
        dense.supports_masking = True
        return dense

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        _check_rank3("query_shape", query_shape)
        _check_rank3("value_shape", value_shape)
        _check_rank3("key_shape", key_shape)
        if (
            value_shape[1] is not None
            and key_shape[1] is not None
            and value_shape[1] != key_shape[1]
        ):
            raise ValueError(
                "`key` and `value` must have the same number of steps. "
                f"Received: key_shape={tuple(key_shape)}, "
                f"value_shape={tuple(value_shape)}"
            )
        self._query_feature_dim = query_shape[-1]
        self._query_dense = self._projection("query", self.num_heads, self.key_dim)
        self._query_dense.build(query_shape)
        self._key_dense = self._projection("key", self._kv_heads, self.key_dim)
        self._key_dense.build(key_shape)
        self._value_dense = self._projection(
            "value", self._kv_heads, self.value_dim
        )
        self._value_dense.build(value_shape)
        self._output_dense = keras.layers.EinsumDense(
            "abcd,cde->abe",
            output_shape=(None, self.output_dim),
            bias_axes="e" if self.use_bias else None,
            name="attention_output",
            **self._sublayer_kwargs(),
        )
        self._output_dense.build(
            (query_shape[0], query_shape[1], self.num_heads, self.value_dim)
        )
        self.built = True

    # Projections and the attention core, usable on their own (blocks,
    # caches, local attention).

    @property
    def query_dense(self):
        return self._query_dense

    @property
    def key_dense(self):
        return self._key_dense

    @property
    def value_dense(self):
        return self._value_dense

    @property
    def output_dense(self):
        return self._output_dense

    def compute_cache(self, value, key=None):
        """Projects `key`/`value` once: `(batch, 2, Tv, kv_heads, key_dim)`.

        Pass the result as `cache` (without `cache_update_index`) to attend
        to a fixed memory (an encoder's output) at every decoding step
        without projecting it again.
        """
        key = value if key is None else key
        k = self._rotate(self._key_dense(key), 0)
        return ops.stack([k, self._value_dense(value)], axis=1)

    def _rotate(self, x, start_index):
        """Rotary positions on projected `(b, T, heads, dim)` (if enabled)."""
        if self._rotary is None:
            return x
        return self._rotary(x, start_index=start_index)

    def _check_attention_mask(self, attention_mask, query, key):
        shape = tuple(attention_mask.shape)
        tq, tk = query.shape[1], key.shape[1]
        expected = f"(Tq, Tk), (batch, Tq, Tk) or (batch, {self.num_heads}, Tq, Tk)"
        ok = len(shape) in (2, 3, 4)
        if ok:
            for got, want in zip(shape[-2:], (tq, tk)):
                if got is not None and want is not None and got != want:
                    ok = False
        if ok and len(shape) >= 3 and shape[0] not in (None, 1):
            b = query.shape[0]
            ok = b is None or shape[0] == b
        if ok and len(shape) == 4 and shape[1] not in (None, 1, self.num_heads):
            ok = False
        if not ok:
            raise ValueError(
                f"`attention_mask` must have shape {expected} with "
                f"Tq={tq}, Tk={tk}. Received: attention_mask.shape={shape}, "
                f"query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
            )

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
        """The masks as `dot_product_attention` keyword arguments.

        Causal and padding masks stay structural (`is_causal`,
        `key_padding`, `query_padding`) so that the memory-efficient path
        never builds a `(Tq, Tk)` mask; only `attention_mask` is dense.
        """
        mask = None
        if attention_mask is not None:
            self._check_attention_mask(attention_mask, query, key)
            mask = as_4d_mask(attention_mask)
        return dict(
            mask=mask,
            is_causal=bool(use_causal_mask),
            causal_offset=query_offset,
            key_padding=masks_lib.combine_masks(value_mask, key_mask),
            query_padding=masks_lib.combine_masks(query_mask),
        )

    def _attend(self, query, key, value, mask, return_scores, training, **masks):
        """Core on projected `(b, T, heads, dim)` tensors.

        `masks`: optional structural masks (`is_causal`, `causal_offset`,
        `key_padding`, `query_padding`) of `dot_product_attention`.
        """

        def dropout_fn(weights):
            return self._dropout_layer(weights, training=training)

        use_dropout = (
            self.dropout > 0 and training is not None and training is not False
        )
        return dot_product_attention(
            query,
            key,
            value,
            mask=mask,
            dropout_fn=dropout_fn if use_dropout else None,
            return_weights=return_scores,
            **masks,
        )

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
    ):
        key = value if key is None else key
        offset = 0 if cache_update_index is None else cache_update_index
        q = self._rotate(self._query_dense(query), offset)
        if cache is None:
            k = self._rotate(self._key_dense(key), 0)
            v = self._value_dense(value)
        elif cache_update_index is None:
            k, v = cache[:, 0], cache[:, 1]
        else:
            start = (0, cache_update_index, 0, 0)
            new_k = self._rotate(self._key_dense(key), offset)
            k = ops.slice_update(cache[:, 0], start, new_k)
            v = ops.slice_update(cache[:, 1], start, self._value_dense(value))
            cache = ops.stack([k, v], axis=1)
        if cache_update_index is not None:
            # Padding masks of this call's keys do not cover the whole cache.
            value_mask = key_mask = None
        masks = self._attention_masks(
            query,
            k,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            query_offset=offset,
        )
        mask = masks.pop("mask")
        result = self._attend(
            q, k, v, mask, return_attention_scores, training, **masks
        )
        if return_attention_scores:
            result, scores = result
        output = self._output_dense(result)
        outputs = (output,)
        if return_attention_scores:
            outputs += (scores,)
        if cache is not None:
            outputs += (cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        return_attention_scores=False,
        cache=None,
        **kwargs,
    ):
        key = value if key is None else key
        batch, tq = query.shape[0], query.shape[1]
        tk = cache.shape[2] if cache is not None else key.shape[1]
        out_dim = self._output_shape or query.shape[-1]
        outputs = (
            keras.KerasTensor(
                (batch, tq, out_dim), dtype=self.compute_dtype
            ),
        )
        if return_attention_scores:
            outputs += (
                keras.KerasTensor(
                    (batch, self.num_heads, tq, tk), dtype=self.compute_dtype
                ),
            )
        if cache is not None:
            outputs += (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
        return outputs[0] if len(outputs) == 1 else outputs

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_shape": self._output_shape,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "kernel_regularizer": keras.regularizers.serialize(
                    self.kernel_regularizer
                ),
                "bias_regularizer": keras.regularizers.serialize(
                    self.bias_regularizer
                ),
                "activity_regularizer": keras.regularizers.serialize(
                    self.activity_regularizer
                ),
                "kernel_constraint": keras.constraints.serialize(
                    self.kernel_constraint
                ),
                "bias_constraint": keras.constraints.serialize(
                    self.bias_constraint
                ),
                "seed": self.seed,
                "rotary_max_wavelength": self.rotary_max_wavelength,
            }
        )
        return config
