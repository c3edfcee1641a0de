import math

import keras
from keras import ops

from keras_attention.layers._validation import check_bool as _check_bool
from keras_attention.layers._validation import (
    check_padding_mask as _check_padding_mask,
)
from keras_attention.layers._validation import (
    check_positive_int as _check_positive_int,
)
from keras_attention.layers._validation import check_rate as _check_rate
from keras_attention.layers._validation import clone_initializer as _clone
from keras_attention.ops.additive import additive_scores
from keras_attention.ops.attention import masked_softmax

# Floor of `||v||^2` in the weight-normalized score vector (as
# `tf.math.l2_normalize`): a zero `v` gives zero scores (uniform attention)
# and finite gradients instead of 0/0.
_NORM_EPSILON = 1e-12


def _project(fn, x):
    """`fn` (a layer or a matmul) on the last axis; a one-step `(b, 1, d)`
    query runs as `(b, d)`, the plain matmul that XLA differentiates
    inside the decoder's loop."""
    if len(x.shape) == 3 and x.shape[1] == 1:
        return fn(x[:, 0])[:, None]
    return fn(x)


class _Seq2SeqAttention(keras.layers.Layer):
    """Shared plumbing of the encoder-decoder attention layers.

    Subclasses implement `prepare_memory(value, key)` (the keys, processed
    once per source sentence) and `attend(query, memory, value, ...)` on a
    rank-3 query; this class handles single-step queries, Keras masks,
    dropout on the weights and output specs.

    Axes in comments: b - batch, i - queries, j - source steps, u - units.
    """

    def __init__(self, dropout=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        _check_rate("dropout", dropout)
        self.supports_masking = True
        self.dropout = dropout
        self.seed = seed
        self._dropout_layer = keras.layers.Dropout(
            rate=dropout, seed=seed, dtype=self.dtype_policy
        )

    def _check_shapes(self, query_shape, value_shape, key_shape):
        if len(query_shape) not in (2, 3) or query_shape[-1] is None:
            raise ValueError(
                "`query` must have shape (batch, Tq, features) or (batch, "
                "features) with a known feature size. Received: "
                f"query_shape={tuple(query_shape)}"
            )
        for name, shape in (
            ("value_shape", value_shape),
            ("key_shape", key_shape),
        ):
            if len(shape) != 3 or shape[-1] is None:
                raise ValueError(
                    f"`{name[:-6]}` must have shape (batch, Tv, features) with a "
                    f"known feature size. Received: {name}={tuple(shape)}"
                )
        if (
            None not in (value_shape[1], key_shape[1])
            and value_shape[1] != key_shape[1]
        ):
            raise ValueError(
                "`key` and `value` must have the same number of steps. Received: "
                f"key_shape={tuple(key_shape)}, value_shape={tuple(value_shape)}"
            )
        self._query_features = query_shape[-1]

    def _check_masks(self, query, value, query_mask, value_mask):
        """`ValueError` naming the mask unless it fits its input's axes
        (a one-step query `(batch, features)` takes a `(batch,)` mask)."""
        one_step = len(query.shape) == 2
        _check_padding_mask(
            "query_mask",
            query_mask,
            query,
            "query (one-step)" if one_step else "query",
        )
        _check_padding_mask("value_mask", value_mask, value, "value")

    def _dropout_weights(self, weights, training):
        if self.dropout > 0:
            return self._dropout_layer(weights, training=training)
        return weights

    def _global_attend(self, scores, value, value_mask, query_mask, training):
        """softmax over all (unmasked) source steps, then `sum_j a_ij v_j`."""
        mask = None
        if value_mask is not None:
            mask = ops.cast(value_mask, "bool")[:, None, :]  # b 1 j
        if query_mask is not None:
            q = ops.cast(query_mask, "bool")[:, :, None]  # b i 1
            mask = q if mask is None else ops.logical_and(mask, q)
        weights = masked_softmax(scores, mask)  # b i j, float32
        kept = ops.cast(self._dropout_weights(weights, training), value.dtype)
        context = ops.einsum("bij,bjd->bid", kept, value)
        return context, weights

    def prepare_memory(self, value, key=None):
        """Processes the keys once; pass the result to `attend`."""
        raise NotImplementedError

    def attend(
        self,
        query,
        memory,
        value,
        value_mask=None,
        query_mask=None,
        training=None,
        return_weights=True,
        **kwargs,
    ):
        """Context `(b, Tq, dv)` and float32 weights `(b, Tq, Tv)` for a
        rank-3 `query`, with `memory = prepare_memory(value, key)`; the
        weights may be None when `return_weights=False`."""
        raise NotImplementedError

    def _call(
        self,
        query,
        value,
        key,
        query_mask,
        value_mask,
        return_attention_scores,
        training,
        **kwargs,
    ):
        self._check_masks(query, value, query_mask, value_mask)
        if key is not None:
            # Again at call time: a layer built on `(None, None, d)` inputs
            # could not compare the lengths then.
            self._check_shapes(query.shape, value.shape, key.shape)
        # Integer (or any non-compute-dtype) inputs are computed in the
        # layer's compute dtype: cast to an int dtype, the weights would
        # round to zero.
        dtype = self.compute_dtype
        query, value = ops.cast(query, dtype), ops.cast(value, dtype)
        key = value if key is None else ops.cast(key, dtype)
        single = len(query.shape) == 2
        if single:
            query = query[:, None, :]
            query_mask = None if query_mask is None else query_mask[:, None]
        memory = self.prepare_memory(value, key)
        context, weights = self.attend(
            query,
            memory,
            value,
            value_mask=value_mask,
            query_mask=query_mask,
            training=training,
            return_weights=return_attention_scores,
            **kwargs,
        )
        if not return_attention_scores:
            return context[:, 0] if single else context
        weights = ops.cast(weights, self.compute_dtype)
        if single:
            context, weights = context[:, 0], weights[:, 0]
        return context, weights

    def compute_output_spec(
        self, query, value, key=None, return_attention_scores=False, **kwargs
    ):
        lead = tuple(query.shape[:-1])
        context = keras.KerasTensor(
            lead + (value.shape[-1],), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return context
        weights = keras.KerasTensor(
            lead + (value.shape[1],), dtype=self.compute_dtype
        )
        return context, weights

    def get_config(self):
        config = super().get_config()
        config.update({"dropout": self.dropout, "seed": self.seed})
        return config


@keras.saving.register_keras_serializable(package="keras_attention")
class BahdanauAttention(_Seq2SeqAttention):
    """Additive attention of Bahdanau et al. (2015), memory-bounded.

    For each query `q_i` (a decoder state) and source step `j`:

        e_ij = v^T tanh(W_q q_i + W_k k_j + b)
        a_ij = softmax_j(e_ij)       (over the unmasked source steps)
        c_i  = sum_j a_ij v_j

    With `normalize=True`, `v` is weight-normalized (Salimans & Kingma,
    2016): `v = g * v / ||v||` with a learned scalar `g` initialised to
    `sqrt(1 / units)` -- the formula and initial value of TensorFlow
    Addons' `BahdanauAttention(normalize=True)`, except that `||v||^2` is
    floored at 1e-12, so a zero `v` (`kernel_initializer="zeros"`, uniform
    attention at the start) gives finite scores and gradients, not NaN.

    Porting from TensorFlow Addons: `tfa.seq2seq.BahdanauAttention(units,
    normalize=True)` has the same weights as `BahdanauAttention(units,
    normalize=True)` (`W_q`, `W_k` without bias, `v`, `g`, `b`);
    `normalize=False` there has no bias `b`: use `use_bias=False`. The
    memory mask is `value_mask` (or the Keras mask) instead of
    `memory_sequence_length`.

    Under mixed precision the scores stay in the compute dtype (they cannot
    overflow: `|e_ij| <= sum_u |v_u|`); the softmax runs in float32.

    The scores never materialize the `(batch, Tq, Tv, units)` tensor: they
    are computed over chunks of queries, and the backward pass recomputes
    each chunk (see `keras_attention.ops.additive.additive_scores`), so a
    whole target sequence can be scored at once in training.

    Args:
        units: int, size `u` of the hidden layer of the score.
        normalize: bool, weight-normalize `v`.
        dropout: float in [0, 1), dropout on the attention weights.
        use_bias: bool, whether the score has the bias `b`.
        kernel_initializer: initializer of `W_q`, `W_k` and `v`.
        bias_initializer: initializer of `b`.
        kernel_regularizer, bias_regularizer: optional regularizers.
        seed: optional int, seed of the dropout.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(batch, Tq, dq)` (a whole target sequence) or `(batch, dq)`
            (one decoder step).
        value: `(batch, Tv, dv)`, the encoder states.
        key: optional `(batch, Tv, dk)`; defaults to `value`.
        query_mask: optional boolean `(batch, Tq)`; padded queries get zero
            weights and a zero context. Read from the Keras mask.
        value_mask: optional boolean `(batch, Tv)`, True on real source
            steps. Read from the Keras mask.
        return_attention_scores: bool, also return the weights.
        training: bool, dropout on or off.

    Returns:
        The context `(batch, Tq, dv)` (or `(batch, dv)`), then, if
        requested, the weights `(batch, Tq, Tv)` (or `(batch, Tv)`), which
        sum to 1 over the unmasked source steps (0 when all are masked).

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> attention = keras_attention.layers.BahdanauAttention(units=16)
    >>> state = np.ones((2, 8), "float32")       # one decoder step
    >>> memory = np.ones((2, 5, 6), "float32")   # encoder states
    >>> context, weights = attention(state, memory, return_attention_scores=True)
    >>> tuple(context.shape), tuple(weights.shape)
    ((2, 6), (2, 5))
    >>> np.round(np.asarray(weights)[0], 2)   # equal keys: uniform weights
    array([0.2, 0.2, 0.2, 0.2, 0.2], dtype=float32)

    References:
        - Bahdanau, Cho & Bengio, 2015, "Neural Machine Translation by
          Jointly Learning to Align and Translate".
        - Salimans & Kingma, 2016, "Weight Normalization: A Simple
          Reparameterization to Accelerate Training of Deep Neural
          Networks".
    """

    def __init__(
        self,
        units,
        normalize=False,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        _check_positive_int("units", units)
        self.units = units
        self.normalize = _check_bool("normalize", normalize)
        self.use_bias = _check_bool("use_bias", use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)

    def _dense(self, name):
        return keras.layers.Dense(
            self.units,
            use_bias=False,
            kernel_initializer=_clone(self.kernel_initializer),
            kernel_regularizer=self.kernel_regularizer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self._check_shapes(query_shape, value_shape, key_shape)
        self.query_dense = self._dense("query")  # W_q
        self.query_dense.build(query_shape)
        self.key_dense = self._dense("key")  # W_k
        self.key_dense.build(key_shape)
        self.attention_v = self.add_weight(
            name="attention_v",
            shape=(self.units,),
            initializer=_clone(self.kernel_initializer),
            regularizer=self.kernel_regularizer,
        )
        self.attention_bias = None
        if self.use_bias:
            self.attention_bias = self.add_weight(
                name="attention_bias",
                shape=(self.units,),
                initializer=_clone(self.bias_initializer),
                regularizer=self.bias_regularizer,
            )
        self.attention_g = None
        if self.normalize:
            self.attention_g = self.add_weight(
                name="attention_g",
                shape=(),
                initializer=keras.initializers.Constant(
                    math.sqrt(1.0 / self.units)
                ),
            )
        self.built = True

    def score_vector(self, dtype=None):
        """`v`, or `g * v / ||v||` when `normalize=True` (float32, with
        `||v||^2` floored at 1e-12: a zero `v` gives zero scores)."""
        dtype = dtype or self.compute_dtype
        if not self.normalize:
            return ops.cast(self.attention_v, dtype)
        v = ops.cast(self.attention_v, "float32")
        g = ops.cast(self.attention_g, "float32")
        squared_norm = ops.maximum(ops.sum(ops.square(v)), _NORM_EPSILON)
        return ops.cast(g * v * ops.rsqrt(squared_norm), dtype)

    def prepare_memory(self, value, key=None):
        """`W_k k_j` for every source step: `(batch, Tv, units)`."""
        return self.key_dense(value if key is None else key)

    def attend(
        self,
        query,
        memory,
        value,
        value_mask=None,
        query_mask=None,
        training=None,
        **kwargs,
    ):
        processed_query = _project(self.query_dense, query)  # b i u
        if self.use_bias:
            bias = ops.cast(self.attention_bias, processed_query.dtype)
            processed_query = processed_query + bias
        v = self.score_vector(processed_query.dtype)
        scores = additive_scores(processed_query, memory, v)
        return self._global_attend(
            scores, value, value_mask, query_mask, training
        )

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        return self._call(
            query,
            value,
            key,
            query_mask,
            value_mask,
            return_attention_scores,
            training,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "normalize": self.normalize,
                "use_bias": self.use_bias,
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
            }
        )
        return config
