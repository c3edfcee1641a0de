"""QK-norm and learned sinks of `MultiHeadAttention`: the per-head
normalization of the projected queries and keys, and the learned
attention-sink logits (one per query head).

QK-norm (Dehghani et al. 2023, "Scaling Vision Transformers to 22
Billion Parameters"; Gemma 3, Qwen 3, OLMo 2): each head's query and key
vectors are normalized over the head dimension after their projection and
before the rotary positions, as keras-hub's `Gemma3Attention` and
`Qwen3Attention` do:

    q_n = norm(q_n W_q),  k_n = norm(k_n W_k),  then RoPE, then softmax.

"rms": `x / sqrt(mean(x^2) + eps) * scale` (Qwen 3's `Qwen3LayerNorm`;
Gemma 3's `RMSNormalization` stores `scale - 1`: its converter adds 1);
"layer": `keras.layers.LayerNormalization` over the head dimension. One
scale (and for "layer" one bias) of `key_dim` per projection, shared by
the heads, computed in at least float32 (float64 in float64).
"rms_across_heads" (OLMo 2): one RMS norm over all heads' features at
once (`AcrossHeadsRMSNorm`), a scale of `(heads, key_dim)` per
projection. "l2" (Llama 4's `Llama4TextL2Norm`): `x / sqrt(mean(x^2) +
eps)` over each head, no weight (`WeightlessRMSNorm`); Llama 4 applies
it after the rotary positions, here before, which is the same: a full
rotary rotation keeps each head's mean square.

`QKNormAndSinks` is a mixin of `MultiHeadAttention` (it reads `qk_norm`,
`qk_norm_epsilon`, `learned_sinks`, `num_heads`, `key_dim`).
"""

import keras
from keras import ops

from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import keras_utils
from keras_attention.utils import validation


class HeadRMSNorm(keras.layers.Layer):
    """RMS normalization over the last axis, `x / sqrt(mean(x^2) + eps) *
    scale`, computed in at least float32 (float64 in float64), as
    keras-hub's `Qwen3LayerNorm`.

    Args:
        epsilon: float > 0 added to the mean square.
        **kwargs: base layer arguments.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_attention.layers._qk_norm import HeadRMSNorm
    >>> y = HeadRMSNorm()(np.full((1, 2, 3, 4), 3.0, "float32"))
    >>> round(float(ops.convert_to_numpy(y)[0, 0, 0, 0]), 4)
    1.0
    """

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(
            validation.check_positive_number("epsilon", epsilon)
        )

    def build(self, input_shape):
        self.scale = self.add_weight(
            name="scale", shape=(input_shape[-1],), initializer="ones"
        )
        self.built = True

    def call(self, x):
        dtype = softmax_dtype(x.dtype)
        y = ops.cast(x, dtype)
        # A sum over the size, not `ops.mean`: Keras's JAX and torch `mean`
        # compute float64 in float32 (1e-7 off).
        square_sum = ops.sum(ops.square(y), axis=-1, keepdims=True)
        mean_square = square_sum / y.shape[-1]
        epsilon = keras_utils.constant(self.epsilon, dtype)
        y = y * ops.rsqrt(mean_square + epsilon)
        return ops.cast(y * ops.cast(self.scale, dtype), x.dtype)

    def get_config(self):
        config = super().get_config()
        config["epsilon"] = self.epsilon
        return config


class AcrossHeadsRMSNorm(HeadRMSNorm):
    """RMS normalization over the last two axes `(heads, head_dim)` at
    once, with a scale per head and feature, `x / sqrt(mean over heads
    and features of x^2 + eps) * scale`: OLMo 2's QK-norm, one
    `Olmo2RMSNorm` over all heads' projected queries (or keys).

    Args:
        epsilon: float > 0 added to the mean square.
        **kwargs: base layer arguments.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_attention.layers._qk_norm import AcrossHeadsRMSNorm
    >>> x = np.array([[[[3.0, 3.0], [0.0, 0.0]]]], "float32")
    >>> y = AcrossHeadsRMSNorm()(x)  # one RMS over both heads: 3 / sqrt(2)
    >>> np.round(ops.convert_to_numpy(y)[0, 0].astype("float64"), 4).tolist()
    [[1.4142, 1.4142], [0.0, 0.0]]
    """

    def build(self, input_shape):
        self.scale = self.add_weight(
            name="scale", shape=tuple(input_shape[-2:]), initializer="ones"
        )
        self.built = True

    def call(self, x):
        dtype = softmax_dtype(x.dtype)
        y = ops.cast(x, dtype)
        square_sum = ops.sum(ops.square(y), axis=(-2, -1), keepdims=True)
        mean_square = square_sum / (y.shape[-2] * y.shape[-1])
        epsilon = keras_utils.constant(self.epsilon, dtype)
        y = y * ops.rsqrt(mean_square + epsilon)
        return ops.cast(y * ops.cast(self.scale, dtype), x.dtype)


class WeightlessRMSNorm(HeadRMSNorm):
    """RMS normalization over the last axis without a scale, `x /
    sqrt(mean(x^2) + eps)` (Llama 4's QK-norm, `qk_norm="l2"`), in at
    least float32. No weights.

    Args:
        epsilon: float > 0 added to the mean square.
        **kwargs: base layer arguments.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_attention.layers._qk_norm import WeightlessRMSNorm
    >>> norm = WeightlessRMSNorm()
    >>> y = norm(np.array([[3.0, 4.0]], "float32"))
    >>> np.round(ops.convert_to_numpy(y).astype("float64"), 4).tolist()
    [[0.8485, 1.1314]]
    >>> norm.weights
    []
    """

    def build(self, input_shape):
        self.built = True

    def call(self, x):
        dtype = softmax_dtype(x.dtype)
        y = ops.cast(x, dtype)
        square_sum = ops.sum(ops.square(y), axis=-1, keepdims=True)
        epsilon = keras_utils.constant(self.epsilon, dtype)
        y = y * ops.rsqrt(square_sum / y.shape[-1] + epsilon)
        return ops.cast(y, x.dtype)


class QKNormAndSinks:
    """The QK-norm layers and the sink logits of `MultiHeadAttention`
    (a mixin)."""

    def _build_qk_norm_and_sinks(self):
        """Creates the norms (`query_norm`, `key_norm`) and the sinks
        (`sinks`, `(num_heads,)`, zeros) the constructor asked for."""
        self._query_norm = self._key_norm = None
        if self.qk_norm is not None:
            self._query_norm = self._head_norm("query_norm", self.num_heads)
            self._key_norm = self._head_norm("key_norm", self._kv_heads)
        self.sinks = None
        if self.learned_sinks:
            self.sinks = self.add_weight(
                name="sinks",
                shape=(self.num_heads,),
                initializer="zeros",
                dtype=self.variable_dtype,
            )

    def _head_norm(self, name, heads):
        if self.qk_norm == "rms_across_heads":
            norm = AcrossHeadsRMSNorm(
                epsilon=self.qk_norm_epsilon,
                dtype=self.dtype_policy,
                name=name,
            )
        elif self.qk_norm in ("rms", "l2"):
            kind = HeadRMSNorm if self.qk_norm == "rms" else WeightlessRMSNorm
            norm = kind(
                epsilon=self.qk_norm_epsilon,
                dtype=self.dtype_policy,
                name=name,
            )
        else:
            norm = keras.layers.LayerNormalization(
                epsilon=self.qk_norm_epsilon,
                dtype=self.dtype_policy,
                name=name,
            )
        # Per position, as the projections: Keras masks pass through.
        norm.supports_masking = True
        norm.build((None, None, heads, self.key_dim))
        return norm

    @property
    def query_norm(self):
        """The queries' QK-norm layer (None without `qk_norm`)."""
        return getattr(self, "_query_norm", None)

    @property
    def key_norm(self):
        """The keys' QK-norm layer (None without `qk_norm`)."""
        return getattr(self, "_key_norm", None)

    def _project_query(self, x):
        """The query projection, then its QK-norm (if any)."""
        q = self._query_dense(x)
        return q if self.query_norm is None else self._query_norm(q)

    def _project_key(self, x):
        """The key projection, then its QK-norm (if any)."""
        k = self._key_dense(x)
        return k if self.key_norm is None else self._key_norm(k)

    def _sink_logits(self):
        """The learned sink logits `(num_heads,)`, or None."""
        return getattr(self, "sinks", None)
