"""The projections and shapes of `MultiHeadAttention`: the query, key,
value, gate and output projections (built in `build`, usable on their own
by blocks, caches and local attention), rotary positions and the
`attention_scale` of the projected queries, and the shape checks and
output specs of the layer's inputs and outputs.

`Projections` is a mixin of `MultiHeadAttention` (it reads the
constructor's attributes: `num_heads`, `key_dim`, `value_dim`,
`num_key_value_heads`, `use_bias`, `use_gate`, the initializers,
`_rotary`, `attention_scale`); kept apart so that the layer's module holds
its arguments and its call.
"""

import math

import keras
from keras import ops

from keras_attention.layers._einsum_dense import EinsumDense
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import attention_checks
from keras_attention.utils import keras_utils
from keras_attention.utils import validation


def temperature_factors(positions, tuning, dtype):
    """The query factors of attention temperature tuning (Llama 4's
    `attn_temperature_tuning`), `1 + scale * log(1 + floor((p + 1) /
    floor_scale))` at positions `p` (`(b, T)` or `(T,)` integers), as
    `(b | 1, T, 1, 1)` in at least float32 (float64 for a float64
    `dtype`). `tuning`: `{"floor_scale", "scale"}`.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_attention.layers._projections import temperature_factors
    >>> f = temperature_factors(
    ...     np.array([0, 3, 7]), {"floor_scale": 4.0, "scale": 0.5}, "float32")
    >>> [round(float(x), 4) for x in ops.convert_to_numpy(f)[0, :, 0, 0]]
    [1.0, 1.3466, 1.5493]
    """
    dtype = softmax_dtype(dtype)
    p = ops.cast(ops.convert_to_tensor(positions), dtype)
    if len(p.shape) == 1:
        p = p[None]
    floor = keras_utils.constant(tuning["floor_scale"], dtype)
    scale = keras_utils.constant(tuning["scale"], dtype)
    steps = ops.floor((p + keras_utils.constant(1.0, dtype)) / floor)
    # Keras's JAX and torch `floor` return float32 for float64.
    steps = ops.cast(steps, dtype)
    factors = ops.log1p(steps) * scale + keras_utils.constant(1.0, dtype)
    return factors[:, :, None, None]


class Projections:
    """The weights and shapes of `MultiHeadAttention` (a mixin)."""

    @property
    def output_dim(self):
        """Size of the output features (known after build); a tuple for a
        multi-dimensional `output_shape`."""
        return self._output_shape or self._query_feature_dim

    @property
    def _kv_heads(self):
        return self.num_key_value_heads or self.num_heads

    def _sublayer_kwargs(self):
        return dict(
            kernel_initializer=keras_utils.clone_initializer(
                self.kernel_initializer
            ),
            bias_initializer=keras_utils.clone_initializer(
                self.bias_initializer
            ),
            kernel_regularizer=self.kernel_regularizer,
            bias_regularizer=self.bias_regularizer,
            activity_regularizer=self.projection_activity_regularizer,
            kernel_constraint=self.kernel_constraint,
            bias_constraint=self.bias_constraint,
            dtype=self.dtype_policy,
        )

    def _projection(self, name, heads, dim, activation=None):
        dense = EinsumDense(
            "abc,cde->abde",
            output_shape=(None, heads, dim),
            bias_axes="de" if self.use_bias else None,
            activation=activation,
            name=name,
            **self._sublayer_kwargs(),
        )
        # The projection keeps the time axis: let it carry the input's Keras
        # mask instead of warning that it drops it.
        dense.supports_masking = True
        return dense

    def _check_shapes(self, query_shape, value_shape, key_shape):
        attention_checks.check_key_value_shapes(value_shape, key_shape)
        rank = len(query_shape)
        ranks = (max(rank, 3),)
        layout = (
            f"(batch, <axes>, features) of rank {ranks[0]} (the same for "
            "query, key and value)"
        )
        for name, shape in (
            ("query", query_shape),
            ("value", value_shape),
            ("key", key_shape),
        ):
            validation.check_sequence_shape(
                name, shape, ranks=ranks, layout=layout
            )
        if rank == 3:
            return
        _, others, _ = self._layout(rank)
        for a in others:
            q, v = query_shape[a], value_shape[a]
            if q is not None and v is not None and q != v:
                raise ValueError(
                    "`query` and `value` must be equal on the axes that are "
                    f"not attention axes (axis {a}). Received: "
                    f"query_shape={tuple(query_shape)!r}, "
                    f"value_shape={tuple(value_shape)!r}"
                )

    def _check_call_inputs(
        self, query, value, key, names=("query", "value", "key")
    ):
        """At call time: numeric inputs, of the rank and feature sizes the
        layer was built for (its projections are); `ValueError` or
        `TypeError` naming the input (`names`, as the caller's arguments
        are called). `value` and `key` may be None (a precomputed
        cache)."""
        rank, features = getattr(self, "_built_inputs", (None, None))
        inputs = tuple(zip(names, (query, value, key)))
        for (name, x), size in zip(inputs, features or (None,) * 3):
            if x is None:
                continue
            validation.check_numeric_input(name, x)
            if rank is not None and len(x.shape) != rank:
                raise ValueError(
                    f"`{name}` must have rank {rank}, as the inputs the "
                    "layer was built for: (batch, <axes>, features). "
                    f"Received: {name}_shape={tuple(x.shape)!r}"
                )
            validation.check_built_features(name, x.shape, size)

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = tuple(key_shape)
        self._check_shapes(query_shape, value_shape, key_shape)
        self._built_inputs = (
            len(query_shape),
            (query_shape[-1], value_shape[-1], key_shape[-1]),
        )
        if self.attention_axes is not None or len(query_shape) > 3:
            # Validates attention_axes, also on rank-3 inputs (where only
            # 1 / -2, the time axis, is an attention axis).
            self._layout(len(query_shape))
        q3, v3, k3 = map(
            self._flat_shape, (query_shape, value_shape, key_shape)
        )
        self._query_feature_dim = query_shape[-1]
        self._query_dense = self._projection(
            "query", self.num_heads, self.key_dim
        )
        self._query_dense.build(q3)
        self._key_dense = self._projection("key", self._kv_heads, self.key_dim)
        self._key_dense.build(k3)
        if self.use_gate:
            self._gate_dense = self._projection(
                "gate", self.num_heads, self.value_dim, activation="sigmoid"
            )
            self._gate_dense.build(q3)
        self._value_dense = self._projection(
            "value", self._kv_heads, self.value_dim
        )
        self._value_dense.build(v3)
        out = self._output_shapes or (query_shape[-1],)
        letters = "efghij"[: len(out)]
        self._output_dense = EinsumDense(
            f"abcd,cd{letters}->ab{letters}",
            output_shape=(None,) + tuple(out),
            bias_axes=letters if self.use_bias is True else None,
            name="attention_output",
            **self._sublayer_kwargs(),
        )
        self._output_dense.build((q3[0], q3[1], self.num_heads, self.value_dim))
        if isinstance(self.score_mod, keras.layers.Layer):
            heads = getattr(self.score_mod, "num_heads", None)
            if heads is not None and heads != self.num_heads:
                raise ValueError(
                    f"`score_mod` is made for {heads} heads but this layer "
                    f"has num_heads={self.num_heads}. Received: "
                    f"score_mod={self.score_mod!r}"
                )
            if not self.score_mod.built:
                self.score_mod.build(self.num_heads)
        self._build_qk_norm_and_sinks()
        self.built = True

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
        k = self._rotate(self._project_key(key), 0)
        return ops.stack([k, self._value_dense(value)], axis=1)

    def _rotate(self, x, start_index, positions=None):
        """Rotary positions on projected `(b, T, heads, dim)` (if enabled):
        from `start_index`, or `positions` `(b, T)` (packed documents)."""
        if self._rotary is None:
            return x
        dims = getattr(self, "_rotary_dims", x.shape[-1])
        if dims == x.shape[-1]:
            return self._rotary(x, start_index=start_index, positions=positions)
        # Partial rotary (`rotary_fraction`): the first `dims` features.
        rotated = self._rotary(
            x[..., :dims], start_index=start_index, positions=positions
        )
        return ops.concatenate([rotated, x[..., dims:]], axis=-1)

    def _set_query_scales(self, attention_scale, temperature_tuning):
        """Checks and sets `attention_scale` and `temperature_tuning`, the
        factors of the projected queries (`_scale_query`)."""
        self.attention_scale = validation.check_positive_number(
            "attention_scale", attention_scale, allow_none=True
        )
        self.temperature_tuning = validation.check_temperature_tuning(
            temperature_tuning
        )

    def _scale_query(self, q, start_index=0, positions=None):
        """The projected queries multiplied by `attention_scale *
        sqrt(key_dim)`, so that the attention step's `1 / sqrt(key_dim)`
        gives scores `attention_scale * q.k` on every path (dense,
        blockwise, banded, fused, cached); unchanged when
        `attention_scale` is None. Then, with `temperature_tuning`, each
        query times its position's factor (`temperature_factors`): the
        positions are `positions` `(b, T)` or `(T,)` when given, else
        `start_index + arange(T)`."""
        if self.attention_scale is not None:
            factor = self.attention_scale * math.sqrt(self.key_dim)
            q = ops.multiply(q, keras_utils.constant(factor, q.dtype))
        tuning = getattr(self, "temperature_tuning", None)
        if tuning is None:
            return q
        if positions is None:
            start = ops.cast(start_index, "int32")
            positions = start + ops.arange(ops.shape(q)[1], dtype="int32")
        factors = temperature_factors(positions, tuning, q.dtype)
        return ops.cast(
            ops.multiply(ops.cast(q, factors.dtype), factors), q.dtype
        )

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        attention_checks.check_key_value_shapes(value_shape, key_shape)
        out = self._output_shapes or (query_shape[-1],)
        return query_shape[:-1] + tuple(out)

    def _scores_shape(self, query_shape, key_shape):
        if len(query_shape) == 3:
            return (
                query_shape[0],
                self.num_heads,
                query_shape[1],
                key_shape[1],
            )
        axes, others, _ = self._layout(len(query_shape))
        return (
            (query_shape[0],)
            + tuple(query_shape[a] for a in others)
            + (self.num_heads,)
            + tuple(query_shape[a] for a in axes)
            + tuple(key_shape[a] for a in axes)
        )

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        return_attention_scores=False,
        cache=None,
        cache_sink_tokens=None,
        **kwargs,
    ):
        key = value if key is None else key
        if return_attention_scores and self._flash_attention:
            raise ValueError(attention_checks.FLASH_SCORES_ERROR)
        query_shape = tuple(query.shape)
        key_shape = tuple(key.shape)
        if cache is None:
            shape = self.compute_output_shape(
                query_shape, value.shape, key_shape
            )
        else:
            shape = query_shape[:-1] + (self._output_shapes or query_shape[-1:])
            keys = cache.shape[2]
            if cache_sink_tokens is not None:
                # A rolling cache: the slots, then this call's keys.
                steps = query_shape[1]
                keys = None if None in (keys, steps) else keys + steps
            key_shape = (key_shape[0], keys) + key_shape[2:]
        outputs = (keras.KerasTensor(shape, dtype=self.compute_dtype),)
        if return_attention_scores:
            outputs += (
                keras.KerasTensor(
                    self._scores_shape(query_shape, key_shape),
                    dtype=self.compute_dtype,
                ),
            )
        if cache is not None:
            outputs += (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
        return outputs[0] if len(outputs) == 1 else outputs
