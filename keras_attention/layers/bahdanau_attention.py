import math

import keras
from keras import ops

from keras_attention.layers.seq2seq_attention import Seq2SeqAttention
from keras_attention.ops import additive_scores
from keras_attention.ops.masking import softmax_dtype
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

# Floor of `||v||^2` in the weight-normalized score vector (as
# `tf.math.l2_normalize`): a zero `v` gives zero scores (uniform attention)
# and finite gradients instead of 0/0.
_NORM_EPSILON = 1e-12


@keras.saving.register_keras_serializable(package="keras_attention")
class BahdanauAttention(Seq2SeqAttention):
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
    overflow: `|e_ij| <= sum_u |v_u|`); the softmax runs in float32
    (float64 layers compute in float64 throughout).

    The scores never materialize the `(batch, Tq, Tv, units)` tensor: they
    are computed over chunks of queries, and the backward pass recomputes
    each chunk (see `keras_attention.ops.additive.additive_scores`), so a
    whole target sequence can be scored at once in training.

    A `Seq2SeqAttention`: `prepare_memory` computes `W_k k_j` once per
    source, `attend` the rest (as `AttentionRNNDecoder` calls them).

    Args:
        units: int, size `u` of the hidden layer of the score.
        normalize: bool, weight-normalize `v`.
        dropout: float in [0, 1), dropout on the attention weights.
        use_bias: bool, whether the score has the bias `b`.
        kernel_initializer: initializer of `W_q`, `W_k` and `v`.
        bias_initializer: initializer of `b`.
        kernel_regularizer: optional regularizer of `W_q`, `W_k` and `v`.
        bias_regularizer: optional regularizer of `b`.
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

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> attention = keras_attention.layers.BahdanauAttention(units=16)
    >>> state = np.ones((2, 8), "float32")       # one decoder step
    >>> memory = np.ones((2, 5, 6), "float32")   # encoder states
    >>> context, weights = attention(
    ...     state, memory, return_attention_scores=True)
    >>> tuple(context.shape), tuple(weights.shape)
    ((2, 6), (2, 5))
    >>> # equal keys: uniform weights
    >>> np.round(keras.ops.convert_to_numpy(weights)[0], 2)
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
        self.units = validation.check_positive_int("units", units)
        self.normalize = validation.check_bool("normalize", normalize)
        self.use_bias = validation.check_bool("use_bias", use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)

    def _dense(self, name):
        return keras.layers.Dense(
            self.units,
            use_bias=False,
            kernel_initializer=keras_utils.clone_initializer(
                self.kernel_initializer
            ),
            kernel_regularizer=self.kernel_regularizer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        super().build(query_shape, value_shape, key_shape)
        self.query_dense = self._dense("query")  # W_q
        self.query_dense.build(query_shape)
        self.key_dense = self._dense("key")  # W_k
        self.key_dense.build(key_shape)
        self.attention_v = self.add_weight(
            name="attention_v",
            shape=(self.units,),
            initializer=keras_utils.clone_initializer(self.kernel_initializer),
            regularizer=self.kernel_regularizer,
        )
        self.attention_bias = None
        if self.use_bias:
            self.attention_bias = self.add_weight(
                name="attention_bias",
                shape=(self.units,),
                initializer=keras_utils.clone_initializer(
                    self.bias_initializer
                ),
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
        """`v`, or `g * v / ||v||` when `normalize=True` (in at least
        float32, with `||v||^2` floored at 1e-12: a zero `v` gives zero
        scores)."""
        dtype = dtype or self.compute_dtype
        if not self.normalize:
            return ops.cast(self.attention_v, dtype)
        v = ops.cast(self.attention_v, softmax_dtype(dtype))
        g = ops.cast(self.attention_g, softmax_dtype(dtype))
        squared_norm = ops.sum(ops.square(v))
        # A `where`: Keras's torch `maximum` computes float64 in float32.
        squared_norm = ops.where(
            squared_norm > _NORM_EPSILON, squared_norm, _NORM_EPSILON
        )
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
        processed_query = keras_utils.project(self.query_dense, query)  # b i u
        if self.use_bias:
            bias = ops.cast(self.attention_bias, processed_query.dtype)
            processed_query = processed_query + bias
        v = self.score_vector(processed_query.dtype)
        scores = additive_scores(processed_query, memory, v)
        return self.apply_scores(
            scores, value, value_mask, query_mask, training
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
