"""`LinearAttention`: a linear-time token mixer (linear attention,
RetNet's retention, gated linear attention) with a recurrent decoding
cache of constant size.

Axes in comments: b - batch, t - steps, h - heads, d - `key_dim`, e -
`value_dim`.
"""

import keras
import numpy as np
from keras import ops

from keras_attention.layers import recording
from keras_attention.layers import token_mixer
from keras_attention.layers._einsum_dense import EinsumDense
from keras_attention.layers._qk_norm import HeadRMSNorm
from keras_attention.layers.token_mixer import TokenMixer
from keras_attention.ops.linear_attention import FEATURE_MAPS
from keras_attention.ops.linear_attention import linear_attention
from keras_attention.ops.linear_attention import linear_attention_weights
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import attention_checks
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

_LAYOUT = "(batch, steps, features)"
DECAYS = (None, "retention", "gated")


def retention_log_decays(num_heads):
    """RetNet's fixed decays, one per head, in log space: `log(1 -
    2 ** (-5 - h))` for `h = 0 .. num_heads - 1` (float64 NumPy).

    Example:

    >>> from keras_attention.layers.linear_attention import (
    ...     retention_log_decays)
    >>> [round(float(x), 5) for x in retention_log_decays(2)]
    [-0.03175, -0.01575]
    """
    return np.log1p(-(2.0 ** (-5.0 - np.arange(num_heads))))


def _check_feature_map(value):
    if isinstance(value, dict):  # a serialized function (from a config)
        value = keras.saving.deserialize_keras_object(value)
    if callable(value) or (isinstance(value, str) and value in FEATURE_MAPS):
        return value
    raise ValueError(
        f"`feature_map` must be one of {sorted(FEATURE_MAPS)!r} or a "
        f"callable. Received: feature_map={value!r}"
    )


def _check_decay(value):
    if value not in DECAYS:
        raise ValueError(
            f"`decay` must be one of {DECAYS!r}. Received: decay={value!r}"
        )
    return value


@keras.saving.register_keras_serializable(package="keras_attention")
class LinearAttention(
    recording.AttentionRecording, TokenMixer, keras.layers.Layer
):
    """Linear attention: a token mixer whose cost is linear in the
    sequence length, with a decoding cache of constant size.

    Per head, with `q, k, v` the projections of the input,

        S_t = exp(a_t) S_{t-1} + phi(k_t) v_t^T,
        o_t = phi(q_t)^T S_t / sqrt(key_dim),
        output = W_o RMSNorm(o)

    (`keras_attention.ops.linear_attention`: its chunked form in
    training, its recurrent form one token at a time in decoding). The
    decay `a_t <= 0`:

    - `decay=None`: none (Katharopoulos et al. 2020).
    - `decay="retention"`: RetNet's fixed per-head decays, `exp(a) =
      1 - 2 ** (-5 - h)` for head `h` (no weights; Sun et al. 2023).
    - `decay="gated"`: a gate computed from the input at each step, one
      per head, `a_t = log_sigmoid(x_t W_g + b_g) / gate_logit_normalizer`
      (gated linear attention's gate, Yang et al. 2024, with one scalar
      per head as Mamba-2 and the gated delta rule have).

    With `normalize=True` the output is divided by `phi(q_t)^T z_t`
    (Katharopoulos et al.'s normalised form: the implied weights of a
    row sum to 1) and there is no output norm; the default, unnormalised
    form has a per-head RMSNorm on `o` (`output_norm`), as RetNet, gated
    linear attention and flash-linear-attention do: the division's
    denominator can come close to 0 (Qin et al. 2022).

    Weights: `query`, `key`, `value` (`(features, heads, dim)` kernels,
    biases with `use_bias`, as `MultiHeadAttention`'s), `decay_gate`
    (`"gated"` only, `(features, heads)`, always with a bias),
    `output_norm` (unnormalised only, a scale of `value_dim`) and
    `attention_output`.

    Args:
        num_heads: int, number of heads.
        key_dim: int, size of each query and key head (the feature map's
            input and output).
        value_dim: int, size of each value head; defaults to `key_dim`.
        feature_map: `"elu_plus_one"` (default), `"relu"`, `"identity"`
            (RetNet's and gated linear attention's choice) or a callable
            (Keras-serializable, e.g. registered with
            `keras.saving.register_keras_serializable`, to save the
            layer).
        normalize: bool, the normalised form (see above). Defaults to
            False. Not with `feature_map="identity"`.
        decay: None, `"retention"` or `"gated"` (see above).
        gate_logit_normalizer: positive number dividing the gate's
            `log_sigmoid` (`"gated"` only; gated linear attention's 16
            keeps the initial decays close to 1: `exp(log_sigmoid(0) /
            16) = 0.958`).
        chunk_size: positive int, the chunk length of the chunked form
            (a tuning constant: the result does not depend on it).
            Defaults to 64.
        use_bias: bool, biases on the query, key, value and output
            projections. Defaults to True.
        norm_epsilon: float > 0, the output norm's epsilon.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(batch, T, features)`, the sequence.
        query_mask: optional boolean `(batch, T)`, True on real tokens;
            read from the query's Keras mask when omitted. A padded token
            neither writes nor decays the state, and its output is zero
            attention (then `attention_output`'s bias). The output
            carries the query's Keras mask.
        use_causal_mask: bool, token `t` reads tokens `<= t` (what a
            decay needs). False: every token reads the whole sequence
            (the sum over its keys). Default None: True with a `cache`
            (`TokenMixer`'s cached calls are causal), else False.
        cache: optional recurrent state `(batch, num_heads, key_dim,
            cache_value_dim)` (`cache_value_dim = value_dim`, plus one
            column holding the normaliser with `normalize`), zeros to
            start (`initial_cache`), float32 (float64 in a float64 layer)
            whatever the compute dtype. The call goes on from it and
            returns the state after its last token: decoding costs the
            same per token whatever the length.
        cache_update_index: optional int or scalar integer tensor, the
            position of this call's first token, for the signature the
            package's cached layers share: the state does not depend on
            it (checked `>= 0` when known).
        segment_ids: optional integers `(batch, T)`: packed documents;
            the state starts afresh where the id changes.
        return_attention_scores: bool, also return the implied attention
            weights `(batch, num_heads, T, T)` (`O(T^2)`: short
            inputs); not with a cache (the state keeps no per-token
            keys). Unnormalised rows need not sum to 1, and with
            `feature_map="identity"` weights can be negative.
        training: unused (no dropout), accepted for Keras.
        padding_mask: the `TokenMixer` name of `query_mask` (both given:
            and-ed).

    Returns:
        The output `(batch, T, features)`, then the weights if
        `return_attention_scores`, then the updated cache if a `cache`
        was given (`MultiHeadAttention`'s order).

    Example:

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.LinearAttention(
    ...     num_heads=2, key_dim=4, decay="gated")
    >>> x = np.random.default_rng(0).normal(size=(1, 6, 8)).astype("float32")
    >>> y = layer(x, use_causal_mask=True)
    >>> tuple(y.shape)
    (1, 6, 8)

    Token by token from a zero cache, the same outputs:

    >>> cache = layer.initial_cache(1)
    >>> tuple(cache.shape)
    (1, 2, 4, 4)
    >>> steps = []
    >>> for t in range(6):
    ...     out, cache = layer(x[:, t : t + 1], use_causal_mask=True,
    ...                        cache=cache, cache_update_index=t)
    ...     steps.append(keras.ops.convert_to_numpy(out))
    >>> y = keras.ops.convert_to_numpy(y)
    >>> bool(np.allclose(np.concatenate(steps, 1), y, atol=1e-5))
    True

    References:
        - Katharopoulos et al., 2020, "Transformers are RNNs: Fast
          Autoregressive Transformers with Linear Attention".
        - Sun et al., 2023, "Retentive Network: A Successor to Transformer
          for Large Language Models".
        - Yang et al., 2024, "Gated Linear Attention Transformers with
          Hardware-Efficient Training".
        - Qin et al., 2022, "The Devil in Linear Transformer".
    """

    attention_kind = "self"

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        feature_map="elu_plus_one",
        normalize=False,
        decay=None,
        gate_logit_normalizer=16.0,
        chunk_size=64,
        use_bias=True,
        norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        positive = validation.check_positive_int
        self.num_heads = positive("num_heads", num_heads)
        self.key_dim = positive("key_dim", key_dim)
        self.value_dim = positive("value_dim", value_dim, allow_none=True)
        if self.value_dim is None:
            self.value_dim = self.key_dim
        self.feature_map = _check_feature_map(feature_map)
        self.normalize = validation.check_bool("normalize", normalize)
        if self.normalize and self.feature_map == "identity":
            raise ValueError(
                "`normalize=True` needs non-negative features: use "
                "`feature_map='elu_plus_one'` or `'relu'`. Received: "
                f"feature_map={feature_map!r}, normalize={normalize!r}"
            )
        self.decay = _check_decay(decay)
        self.gate_logit_normalizer = float(
            validation.check_positive_number(
                "gate_logit_normalizer", gate_logit_normalizer
            )
        )
        self.chunk_size = positive("chunk_size", chunk_size)
        self.use_bias = validation.check_bool("use_bias", use_bias)
        self.norm_epsilon = float(
            validation.check_positive_number("norm_epsilon", norm_epsilon)
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    @property
    def cache_value_dim(self):
        """Last axis of the cache: `value_dim`, plus one with
        `normalize` (the normaliser's column)."""
        return self.value_dim + (1 if self.normalize else 0)

    @property
    def state_dtype(self):
        """The dtype of the state and cache: float32, float64 for a
        float64 layer."""
        return softmax_dtype(self.compute_dtype)

    def init_cache(self, batch_size, max_length=None, dtype=None):
        """The layer's empty cache (`TokenMixer`): `initial_cache`'s
        state, whose size does not depend on `max_length` (not read) and
        whose dtype is `state_dtype` whatever `dtype` (not read)."""
        return self.initial_cache(batch_size)

    def initial_cache(self, batch_size):
        """The zero state, `(batch_size, num_heads, key_dim,
        cache_value_dim)` in `state_dtype`: a cache before the first
        token."""
        shape = (batch_size, self.num_heads, self.key_dim)
        return ops.zeros(shape + (self.cache_value_dim,), self.state_dtype)

    # Build ---------------------------------------------------------------

    def _einsum(self, equation, output_shape, bias_axes, name, input_shape):
        clone = keras_utils.clone_initializer
        dense = EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes,
            kernel_initializer=clone(self.kernel_initializer),
            bias_initializer=clone(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        dense.supports_masking = True
        dense.build(input_shape)
        return dense

    def build(self, query_shape):
        hidden = validation.check_sequence_shape(
            "query", query_shape, layout=_LAYOUT
        )
        self._hidden = hidden
        shape = (None, None, hidden)
        bias = "de" if self.use_bias else None
        h = self.num_heads
        self.query_dense = self._einsum(
            "abc,cde->abde", (None, h, self.key_dim), bias, "query", shape
        )
        self.key_dense = self._einsum(
            "abc,cde->abde", (None, h, self.key_dim), bias, "key", shape
        )
        self.value_dense = self._einsum(
            "abc,cde->abde", (None, h, self.value_dim), bias, "value", shape
        )
        self.decay_gate = None
        if self.decay == "gated":
            self.decay_gate = self._einsum(
                "abc,cd->abd", (None, h), "d", "decay_gate", shape
            )
        self.output_norm = None
        if not self.normalize:
            self.output_norm = HeadRMSNorm(
                epsilon=self.norm_epsilon,
                dtype=self.dtype_policy,
                name="output_norm",
            )
            self.output_norm.build((None, None, h, self.value_dim))
        self.output_dense = self._einsum(
            "abcd,cde->abe",
            (None, hidden),
            "e" if self.use_bias else None,
            "attention_output",
            (None, None, h, self.value_dim),
        )
        self.built = True

    # Call ----------------------------------------------------------------

    def _log_decay(self, query):
        """The decay for the op: None, `(h,)` or `(b, t, h)`, float32."""
        if self.decay == "retention":
            return retention_log_decays(self.num_heads).astype("float32")
        if self.decay == "gated":
            logits = ops.cast(self.decay_gate(query), self.state_dtype)
            return ops.log_sigmoid(logits) / self.gate_logit_normalizer
        return None

    def _state(self, cache):
        """The cache as the op's `initial_state`."""
        if cache is None:
            return None
        cache = ops.cast(cache, self.state_dtype)
        if self.normalize:
            return cache[..., :-1], cache[..., -1]
        return cache

    def _check_call(self, query, query_mask, causal, cache, index, scores):
        validation.check_call_input("query", query, self._hidden, (3,), _LAYOUT)
        validation.check_padding_mask("query_mask", query_mask, query, "query")
        if self.decay is not None and not causal:
            raise ValueError(
                f"`decay={self.decay!r}` weighs each token by its distance "
                "to the query: it needs `use_causal_mask=True`. Received: "
                f"use_causal_mask={causal!r}"
            )
        if cache is not None and scores:
            raise ValueError(
                "`return_attention_scores=True` cannot be given with a "
                "`cache`: the recurrent state keeps no per-token keys to "
                "weigh. Call without a cache to see the weights. Received: "
                "cache of shape "
                f"{tuple(cache.shape)!r}, return_attention_scores=True"
            )
        if cache is not None:
            want = (self.num_heads, self.key_dim, self.cache_value_dim)
            shape = tuple(cache.shape)
            if len(shape) != 4 or shape[1:] != want:
                raise ValueError(
                    "`cache` must have shape (batch, num_heads, key_dim, "
                    f"cache_value_dim) = (batch,) + {want!r} (the recurrent "
                    f"state, `initial_cache`). Received: cache.shape={shape!r}"
                )
            attention_checks.check_cache_batch("cache", cache, query)
        if index is not None:
            attention_checks.check_cache_index(index, query.shape[1], None)

    def call(
        self,
        query,
        query_mask=None,
        use_causal_mask=None,
        cache=None,
        cache_update_index=None,
        segment_ids=None,
        return_attention_scores=False,
        training=None,
        padding_mask=None,
    ):
        query_mask = token_mixer.padding_mask_and(
            padding_mask, "query_mask", query_mask
        )
        query_mask, segment_ids = attention_checks.as_tensors(
            query_mask=query_mask, segment_ids=segment_ids
        )
        if use_causal_mask is None:
            use_causal_mask = cache is not None
        if query_mask is None:
            query_mask = keras_utils.keras_mask(query)
        self._check_call(
            query,
            query_mask,
            use_causal_mask,
            cache,
            cache_update_index,
            return_attention_scores,
        )
        q = self.query_dense(query)
        k = self.key_dense(query)
        v = self.value_dense(query)
        decay = self._log_decay(query)
        options = dict(
            feature_map=self.feature_map,
            causal=bool(use_causal_mask),
            decay=decay,
            segment_ids=segment_ids,
            key_mask=query_mask,
            normalize=self.normalize,
        )
        result = linear_attention(
            q,
            k,
            v,
            chunk_size=self.chunk_size,
            initial_state=self._state(cache),
            return_state=cache is not None,
            **options,
        )
        heads, state = result if cache is not None else (result, None)
        if query_mask is not None:
            valid = ops.cast(query_mask, "bool")[..., None, None]
            heads = ops.where(valid, heads, ops.zeros_like(heads))
        if self.output_norm is not None:
            heads = self.output_norm(heads)
        outputs = (self.output_dense(heads),)
        if return_attention_scores:
            weights = linear_attention_weights(q, k, **options)
            if query_mask is not None:
                valid = ops.cast(query_mask, "bool")[:, None, :, None]
                weights = ops.where(valid, weights, ops.zeros_like(weights))
            outputs += (ops.cast(weights, self.compute_dtype),)
        if cache is not None:
            if self.normalize:
                state = ops.concatenate([state[0], state[1][..., None]], -1)
            outputs += (state,)
        return outputs[0] if len(outputs) == 1 else outputs

    def compute_mask(self, query, previous_mask=None):
        return previous_mask

    def compute_output_spec(
        self, query, cache=None, return_attention_scores=False, **kwargs
    ):
        validation.check_sequence_shape("query", query.shape, layout=_LAYOUT)
        dtype = self.compute_dtype
        outputs = (keras.KerasTensor(tuple(query.shape), dtype=dtype),)
        if return_attention_scores:
            b, t = query.shape[0], query.shape[1]
            shape = (b, self.num_heads, t, t)
            outputs += (keras.KerasTensor(shape, dtype=dtype),)
        if cache is not None:
            outputs += (
                keras.KerasTensor(tuple(cache.shape), dtype=self.state_dtype),
            )
        return outputs[0] if len(outputs) == 1 else outputs

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook (`layers/recording.py`): the
        implied weights of one uncached call `(batch, heads, T, T)`."""
        query = arguments.get("query")
        query_mask = recording.padding_mask(arguments.get("query_mask"), query)
        meta = dict(
            kind="self",
            query_mask=query_mask,
            key_mask=query_mask,
            causal=bool(arguments.get("use_causal_mask")),
            window=None,
        )
        return recording.numpy_weights(scores), meta

    def get_config(self):
        config = super().get_config()
        feature_map = self.feature_map
        if callable(feature_map):
            feature_map = keras.saving.serialize_keras_object(feature_map)
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            feature_map=feature_map,
            normalize=self.normalize,
            decay=self.decay,
            gate_logit_normalizer=self.gate_logit_normalizer,
            chunk_size=self.chunk_size,
            use_bias=self.use_bias,
            norm_epsilon=self.norm_epsilon,
            kernel_initializer=keras.initializers.serialize(
                self.kernel_initializer
            ),
            bias_initializer=keras.initializers.serialize(
                self.bias_initializer
            ),
        )
        return config
