import inspect
import math

import keras
from keras import ops

from keras_attention import masks as masks_lib
from keras_attention.layers import _attention_axes
from keras_attention.layers import _recording
from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.layers.rotary_embedding import check_rotary_scaling
from keras_attention.mods import base as mods_base
from keras_attention.mods.masks import DocumentMask
from keras_attention.mods.masks import KerasSlidingWindowMask
from keras_attention.ops import scoring
from keras_attention.ops.attention import dense_mask
from keras_attention.ops.attention import dot_product_attention
from keras_attention.ops.attention import memory_efficient_implementation
from keras_attention.ops.masking import as_4d_mask
from keras_attention.ops.rolling_cache import rolling_cache_positions
from keras_attention.ops.rolling_cache import rolling_cache_write
from keras_attention.ops.sliding_window import local_attention
from keras_attention.utils import keras_utils
from keras_attention.utils import validation
from keras_attention.utils.cache_checks import check_cache_index

_FLASH_SCORES_ERROR = (
    "Returning attention scores is not supported when flash attention is "
    "enabled. Please disable flash attention to access attention scores."
)


def _check_output_shape(output_shape):
    """`None`, an int or a tuple of ints -> `None` or a tuple of ints."""
    if output_shape is None:
        return None
    if validation.is_int(output_shape):
        shape = (output_shape,)
    else:
        shape = output_shape
    if (
        not isinstance(shape, (tuple, list))
        or not all(validation.is_int(d) and d > 0 for d in shape)
        or not shape
    ):
        raise ValueError(
            "Invalid `output_shape`: it must be a positive int or a non-empty "
            f"tuple of positive ints. Received: output_shape={output_shape!r}"
        )
    return tuple(int(d) for d in shape)


def _check_key_value_shapes(value_shape, key_shape):
    """Keras's rule: `key` and `value` agree on every axis but the last."""
    v, k = tuple(value_shape)[1:-1], tuple(key_shape)[1:-1]
    ok = len(v) == len(k) and all(
        a is None or b is None or a == b for a, b in zip(v, k)
    )
    if not ok:
        raise ValueError(
            "All dimensions of `value` and `key`, except the last one, must "
            f"be equal. Received: value_shape={tuple(value_shape)!r}, "
            f"key_shape={tuple(key_shape)!r}"
        )


@keras.saving.register_keras_serializable(package="keras_attention")
class MultiHeadAttention(
    _attention_axes.AttentionAxesLayout,
    _recording.AttentionRecording,
    keras.layers.Layer,
):
    """Multi-head (and grouped-query) scaled dot-product attention.

    A drop-in replacement for Keras 3.15's `keras.layers.MultiHeadAttention`:
    same constructor (same positional order), same call signature, same
    options (`attention_axes`, `use_gate`, `sliding_window`,
    `flash_attention`, tuple `output_shape`) and, when `num_key_value_heads`
    is None, the same weights in the same order and shapes
    (`set_weights(keras_mha.get_weights())` gives the same outputs). A config
    saved by Keras's layer loads with `from_config`. Keras 3.15 resolves its
    own built-in classes before `custom_objects`, so to move a saved `.keras`
    model onto this class, load it and swap the layers:
    `keras.models.clone_model(model, clone_function=lambda layer:
    keras_attention.layers.MultiHeadAttention.from_config(layer.get_config())
    if isinstance(layer, keras.layers.MultiHeadAttention) else
    layer.__class__.from_config(layer.get_config()))`, then
    `set_weights(model.get_weights())`.

    Differences from Keras's layer, all deliberate:
    - a query with nothing to attend to (fully masked row, padded query) gets
      zero attention weights and a zero attention result (then the output
      projection's bias), never NaN or uniform weights;
    - the softmax runs in float32 under mixed precision;
    - Keras masks of the inputs are read but never deleted, so a masked tensor
      reused by several layers keeps its mask for all of them; an explicit
      `query_mask` is honoured (Keras's layer replaces it with the query's
      Keras mask);
    - the returned scores have the true key length also symbolically
      (Keras's symbolic scores assume `Tv == Tq`);
    - no tensor of rank above 5 is built (the limit of TensorFlow's oneDNN
      CPU kernels): with `attention_axes`, the other axes are merged into the
      batch and the attention axes into one sequence axis. Only the returned
      scores take Keras's shape `(batch, <other axes>, num_heads,
      <query attention axes>, <key attention axes>)`, by a final reshape,
      which is of rank above 5 when attention runs over several axes;
    - with `attention_axes`, `use_causal_mask` and `sliding_window` count
      positions over the attention axes flattened in row-major order (Keras
      counts along axis 1 only; the two agree for one attention axis);
      padding masks (`query_mask`, ...) have the input's shape without its
      last axis;
    - `flash_attention=True` picks the memory-efficient paths of this package
      (fused kernel on GPUs, blockwise online softmax on CPUs) on every
      backend; `False` forces the dense computation; `None` (default) picks
      automatically. As in Keras, `True` refuses dropout and returning
      scores;
    - extras: grouped-query / multi-query attention (`num_key_value_heads`),
      rotary position embeddings (`rotary_max_wavelength`) and a key/value
      cache for incremental decoding (rank-3 inputs).

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
      uses the backend's fused (flash / cuDNN) kernel where it can;
    - with `sliding_window` and `Tq == Tv` (self-attention, no cache, no
      scores requested, `flash_attention` not False), the banded
      `keras_attention.ops.local_attention`: time and memory
      `O(T * sliding_window)`; otherwise the window is a mask.

    Args:
        num_heads: int, number of query heads `h`.
        key_dim: int, size of each query/key head.
        value_dim: int, size of each value head; defaults to `key_dim`.
        dropout: float in [0, 1), dropout on the attention weights.
        use_bias: bool, whether the projections have biases.
        output_shape: int or tuple of ints, the shape of the output besides
            the batch and attention axes (a tuple gives a multi-dimensional
            output); defaults to the query's feature size.
        attention_axes: int or tuple of ints, the axes of inputs of rank > 3
            over which attention runs (negative values count from the end of
            the input's shape, -1 being the features). None (default):
            every axis but the batch and features.
        sliding_window: optional positive int `w`: query `i` attends only to
            keys `j` with `|i - j| < w` (with `use_causal_mask`,
            `i - w < j <= i`: Mistral's causal window).
        flash_attention: None (automatic), True (memory-efficient paths
            only: no scores, no dropout) or False (dense computation). When
            None, `keras.config.disable_flash_attention()` means False.
        kernel_initializer: initializer of the projection kernels, as for
            `keras.layers.EinsumDense`.
        bias_initializer: initializer of the projection biases.
        kernel_regularizer: optional regularizer of the projection kernels.
        bias_regularizer: optional regularizer of the projection biases.
        activity_regularizer: optional regularizer applied, as in Keras, to
            the output of each projection (the output projection included).
        kernel_constraint: optional constraint on the projection kernels.
        bias_constraint: optional constraint on the projection biases.
        use_gate: bool, gated attention: the attention result of each head
            is multiplied by `sigmoid(query W_g + b_g)` (weights `gate`,
            created between `key` and `value`, as in Keras).
        seed: optional int, seed of the dropout.
        num_key_value_heads: keyword-only int dividing `num_heads`, number
            of key/value heads (`1`: multi-query attention). Defaults to
            `num_heads`.
        rotary_max_wavelength: keyword-only optional finite number >= 1; when
            set, rotary position embeddings (`RotaryEmbedding`) rotate the
            projected queries and keys (`key_dim` must be even). Query
            positions start at `cache_update_index` (else 0); keys are
            rotated at their absolute positions when written into the cache
            (`compute_cache` rotates them from 0). Defaults to None (off; no
            weights added either way).
        rotary_scaling: keyword-only optional dict of `RotaryEmbedding`'s
            context-extension arguments (`scaling_factor`, `rope_type`
            `"linear"`, `"dynamic"`, `"yarn"` or `"llama3"`, `beta_fast`,
            `beta_slow`, `original_max_position_embeddings`, `truncate`,
            `low_freq_factor`, `high_freq_factor`), e.g.
            `{"scaling_factor": 4.0}` for position interpolation; needs
            `rotary_max_wavelength`. Defaults to None (no scaling).
        attention_scale: keyword-only optional finite float > 0, the
            factor of the scores, `softmax(attention_scale * q k^T)`
            (T5: `1.0`; Gemma with `query_head_dim_normalize=False`:
            `(hidden / heads) ** -0.5`). Defaults to None:
            `1 / sqrt(key_dim)`. Applied to the projected queries (after
            the rotary positions) as `attention_scale * sqrt(key_dim)`,
            so every path and a `_compute_attention` override see it.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(batch, Tq, dq)`, or `(batch, <axes>, dq)` with
            `attention_axes`.
        value: `(batch, Tv, dv)` (same rank as `query`).
        key: optional `(batch, Tv, dk)`; defaults to `value`.
        query_mask, value_mask, key_mask: optional boolean padding masks of
            the inputs' shapes without the last axis (`(batch, T)`); read
            from the inputs' Keras masks when omitted.
        attention_mask: optional boolean mask of shape `(Tq, Tv)`,
            `(batch, Tq, Tv)` or `(batch, num_heads, Tq, Tv)`; True = may
            attend. Combined (and) with the padding, causal and window
            masks. With `attention_axes`, as in Keras: the query and key
            attention axes last, preceded by a prefix of
            `(batch, <other axes>, num_heads)`.
        return_attention_scores: bool, also return the attention weights.
        training: bool, dropout on or off.
        use_causal_mask: bool, forbid attending to later positions.
        cache: optional `(batch, 2, max_length, num_key_value_heads, key_dim)`
            key/value cache (rank-3 inputs only). With `cache_update_index`,
            the projected keys and values of this call are written at that
            index and attention runs over the whole cache (mask unfilled
            slots with `attention_mask` or `use_causal_mask`, which then
            counts query positions from `cache_update_index`). Without it,
            the cached keys and values are used as they are (precomputed
            cross-attention, see `compute_cache`).
        cache_update_index: int or scalar integer tensor, where this
            call's `T` keys/values go: `0 <= cache_update_index` and
            `cache_update_index + T <= max_length` (a rolling cache,
            `cache_sink_tokens`, wraps around: `>= 0` only). A known index
            (Python or NumPy int, eager tensor) out of range raises a
            `ValueError`; a symbolic one (`tf.function`, XLA, `jax.jit`)
            is not checked, and the write lands on a clamped slot.
        cache_sink_tokens: optional int >= 0 (with `cache`,
            `cache_update_index` and `sliding_window`; causal): `cache` is
            a rolling cache `(batch, 2, S, kv_heads, key_dim)` instead,
            holding positions `0 .. cache_sink_tokens - 1` (attention sinks)
            and the latest `S - cache_sink_tokens` positions in a ring
            (`ops.rolling_cache`); `cache_update_index` is the absolute
            position of the first query, and positions `0 ..
            cache_update_index - 1` must have been written in order. Each
            query attends to the cached positions within its window or
            below `cache_sink_tokens`, and to this call's keys up to its
            own; then this call's keys and values are written (score and
            mask functions see absolute positions). A step costs `O(S)`
            whatever its position. `S` must be at least
            `cache_sink_tokens + sliding_window`; `attention_mask` (if
            any) covers `S + T` keys: the `S` slots, then this call's `T`.
        segment_ids: optional integer `(batch, T)` (self-attention, no
            cache): packed documents; a token attends only within its
            document (tiles between documents skipped on the blockwise
            path) and rotary positions restart at each document
            (`keras_attention.masks.segment_positions`).
        positions: optional integer `(batch, T)` or `(T,)` (needs
            `rotary_max_wavelength`; rank-3 inputs): the rotary positions
            of this call's queries and keys (the key has the query's
            length `T`, or comes with a `cache`, which then holds keys
            rotated at them), instead of `cache_update_index + arange(T)`
            or the restarting positions of `segment_ids`. With packed
            documents, positions restarting at each plus a mask keeping
            each token in its document give each document's own result.
            Not with a rolling cache (`cache_sink_tokens`).

    Returns:
        `attention_output` of the query's shape with the last axis replaced
        by `output_shape`, then the attention scores if requested
        (`(batch, num_heads, Tq, Tv)`; Keras's shape with `attention_axes`),
        then the updated cache if one was given.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> mha = keras_attention.layers.MultiHeadAttention(num_heads=2, key_dim=8)
    >>> x = np.ones((3, 5, 16), "float32")
    >>> y, scores = mha(x, x, return_attention_scores=True)
    >>> tuple(y.shape), tuple(scores.shape)
    ((3, 5, 16), (3, 2, 5, 5))
    >>> images = np.ones((2, 4, 6, 16), "float32")
    >>> mha = keras_attention.layers.MultiHeadAttention(
    ...     2, 8, attention_axes=2, use_gate=True, sliding_window=3)
    >>> y, scores = mha(images, images, return_attention_scores=True)
    >>> tuple(y.shape), tuple(scores.shape)
    ((2, 4, 6, 16), (2, 4, 2, 6, 6))

    References:
        - Vaswani et al., 2017, "Attention Is All You Need".
        - Shazeer, 2019, "Fast Transformer Decoding: One Write-Head is All
          You Need" (multi-query).
        - Ainslie et al., 2023, "GQA: Training Generalized Multi-Query
          Transformer Models from Multi-Head Checkpoints".
        - Qiu et al., 2025, "Gated Attention for Large Language Models"
          (`use_gate`).
        - Beltagy et al., 2020, "Longformer" (sliding-window attention).
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_shape=None,
        attention_axes=None,
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
        num_key_value_heads=None,
        rotary_max_wavelength=None,
        rotary_scaling=None,
        score_mod=None,
        mask_mod=None,
        attention_scale=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._return_attention_scores = False
        attention_scale = validation.check_positive_number(
            "attention_scale", attention_scale, allow_none=True
        )
        num_heads = validation.check_positive_int("num_heads", num_heads)
        key_dim = validation.check_positive_int("key_dim", key_dim)
        value_dim = validation.check_positive_int(
            "value_dim", value_dim, allow_none=True
        )
        num_key_value_heads = validation.check_positive_int(
            "num_key_value_heads", num_key_value_heads, allow_none=True
        )
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise ValueError(
                "`num_key_value_heads` must divide `num_heads`. Received: "
                f"num_key_value_heads={num_key_value_heads!r}, "
                f"num_heads={num_heads!r}"
            )
        dropout = validation.check_rate("dropout", dropout)
        sliding_window = validation.check_positive_int(
            "sliding_window", sliding_window, allow_none=True
        )
        if flash_attention is not None:
            flash_attention = validation.check_bool(
                "flash_attention", flash_attention
            )
        rotary_max_wavelength = validation.check_positive_number(
            "rotary_max_wavelength",
            rotary_max_wavelength,
            allow_none=True,
            minimum=1,
        )
        validation.check_rotary_head_size(
            rotary_max_wavelength, key_dim, f"key_dim={key_dim!r}"
        )
        rotary_scaling = check_rotary_scaling(
            rotary_scaling, rotary_max_wavelength
        )
        self.supports_masking = True
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim if value_dim else key_dim
        self.num_key_value_heads = num_key_value_heads
        self.dropout = dropout
        self.use_bias = validation.check_bool("use_bias", use_bias)
        self.use_gate = validation.check_bool("use_gate", use_gate)
        # Full output shape (tuple) and, for subclasses, `_output_shape`:
        # an int for a one-dimensional output, else the tuple.
        self._output_shapes = _check_output_shape(output_shape)
        self._output_shape = self._output_shapes
        if self._output_shapes is not None and len(self._output_shapes) == 1:
            self._output_shape = self._output_shapes[0]
        self.attention_axes = _attention_axes.check_attention_axes(
            attention_axes
        )
        self.sliding_window = self._sliding_window = sliding_window
        self.flash_attention = flash_attention
        if flash_attention is None:
            flash_attention = keras.config.is_flash_attention_enabled()
        self._flash_attention = flash_attention
        if self._flash_attention and dropout > 0.0:
            raise ValueError(
                "Dropout is not supported when flash attention is enabled. "
                "Please set dropout to 0.0 to use flash attention. Received: "
                f"dropout={dropout!r}, flash_attention={self.flash_attention!r}"
            )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        # As in Keras: regularizes each projection's output (the output
        # projection included), not the layer's output a second time.
        self.projection_activity_regularizer = keras.regularizers.get(
            activity_regularizer
        )
        self.seed = validation.check_seed("seed", seed)
        self.rotary_max_wavelength = rotary_max_wavelength
        self.rotary_scaling = rotary_scaling
        self.attention_scale = attention_scale
        self._rotary = None
        if rotary_max_wavelength is not None:
            self._rotary = RotaryEmbedding(
                max_wavelength=rotary_max_wavelength,
                **(rotary_scaling or {}),
                dtype=self.dtype_policy,
                name="rotary_embedding",
            )
        self._dropout_layer = keras.layers.Dropout(
            rate=dropout, seed=self.seed, dtype=self.dtype_policy
        )
        self.score_mod = mods_base.check_mod(score_mod, "score_mod")
        self.mask_mod = mods_base.check_mod(mask_mod, "mask_mod")

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
        dense = keras.layers.EinsumDense(
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
        _check_key_value_shapes(value_shape, key_shape)
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
        self._output_dense = keras.layers.EinsumDense(
            f"abcd,cd{letters}->ab{letters}",
            output_shape=(None,) + tuple(out),
            bias_axes=letters if self.use_bias else None,
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

    def _rotate(self, x, start_index, positions=None):
        """Rotary positions on projected `(b, T, heads, dim)` (if enabled):
        from `start_index`, or `positions` `(b, T)` (packed documents)."""
        if self._rotary is None:
            return x
        return self._rotary(x, start_index=start_index, positions=positions)

    def _scale_query(self, q):
        """The projected queries multiplied by `attention_scale *
        sqrt(key_dim)`, so that the attention step's `1 / sqrt(key_dim)`
        gives scores `attention_scale * q.k` on every path (dense,
        blockwise, banded, fused, cached); unchanged when
        `attention_scale` is None."""
        if self.attention_scale is None:
            return q
        factor = self.attention_scale * math.sqrt(self.key_dim)
        return ops.multiply(q, ops.cast(factor, q.dtype))

    def _check_positions(self, positions, query, key, cache, sink_tokens):
        """`positions` set the rotary positions of a rank-3 self-attention
        call (keys of the query's length, or this call's keys of a cache);
        their shape is `RotaryEmbedding`'s to check."""
        problem = None
        if self._rotary is None:
            problem = (
                "they set rotary positions, and this layer has none "
                "(`rotary_max_wavelength=None`)"
            )
        elif len(query.shape) != 3:
            problem = "they need inputs of shape (batch, T, features)"
        elif sink_tokens is not None:
            problem = (
                "a rolling cache (`cache_sink_tokens`) places and masks "
                "keys by `cache_update_index`, not by them"
            )
        elif cache is None and None not in (query.shape[1], key.shape[1]):
            if query.shape[1] != key.shape[1]:
                problem = (
                    "they are the positions of the queries and the keys "
                    "alike, so the key must have the query's length"
                )
        if problem is not None:
            raise ValueError(
                f"`positions` cannot be used here: {problem}. Received: "
                f"positions.shape={_shape_of(positions)!r}, "
                f"query.shape={tuple(query.shape)!r}, "
                f"key.shape={_shape_of(key)!r}, "
                f"layer {self.name!r}"
            )

    def _check_segment_ids(self, segment_ids, query, key, cache):
        """`segment_ids` `(batch, T)` integers of a self-attention call on
        `(batch, T, features)` inputs, without a cache."""
        if cache is not None or len(query.shape) != 3:
            raise ValueError(
                "`segment_ids` (packed documents) need a self-attention call "
                "on inputs of shape (batch, T, features) without a cache. "
                f"Received: query.shape={tuple(query.shape)!r}, "
                f"cache={'given' if cache is not None else None}"
            )
        shape = tuple(segment_ids.shape)
        want = (query.shape[0], query.shape[1])
        if (
            len(shape) != 2
            or any(
                a is not None and b is not None and a != b
                for a, b in zip(shape, want)
            )
            or query.shape[1] != key.shape[1]
        ):
            raise ValueError(
                "`segment_ids` must have shape (batch, T) of the query, and "
                "the keys the same length (self-attention). Received: "
                f"segment_ids.shape={shape!r}, "
                f"query.shape={tuple(query.shape)!r}, "
                f"key.shape={tuple(key.shape)!r}"
            )
        if not keras.backend.is_int_dtype(
            keras.backend.standardize_dtype(segment_ids.dtype)
        ):
            raise TypeError(
                "`segment_ids` must be integers. Received: "
                f"segment_ids.dtype={segment_ids.dtype!r}"
            )

    def _check_attention_mask(self, attention_mask, query, key):
        shape = tuple(attention_mask.shape)
        tq, tk = query.shape[1], key.shape[1]
        expected = (
            f"(Tq, Tk), (batch, Tq, Tk) or (batch, {self.num_heads}, Tq, Tk)"
        )
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
                f"query.shape={tuple(query.shape)}, "
                f"key.shape={tuple(key.shape)}"
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
        """The masks as `_compute_attention` keyword arguments.

        Causal and padding masks stay structural (`use_causal_mask`,
        `key_mask`, `query_mask`) so that the memory-efficient path never
        builds a `(Tq, Tk)` mask; only `attention_mask` is dense.
        """
        mask = None
        if attention_mask is not None:
            self._check_attention_mask(attention_mask, query, key)
            mask = as_4d_mask(attention_mask)
        return dict(
            attention_mask=mask,
            use_causal_mask=bool(use_causal_mask),
            query_offset=query_offset,
            key_mask=masks_lib.combine_masks(value_mask, key_mask),
            query_mask=masks_lib.combine_masks(query_mask),
        )

    def _implementation(self):
        """`dot_product_attention`'s implementation for `flash_attention`."""
        if self._flash_attention is None:
            return None
        if not self._flash_attention:
            return "dense"
        return memory_efficient_implementation()

    def _dropout_fn(self, training):
        if self.dropout > 0 and training is not None and training is not False:
            return lambda weights: self._dropout_layer(
                weights, training=training
            )
        return None

    def _compute_attention(
        self,
        query,
        key,
        value,
        attention_mask=None,
        training=None,
        return_attention_scores=None,
        use_causal_mask=False,
        *,
        query_mask=None,
        key_mask=None,
        query_offset=0,
        score_mod=None,
        mask_mod=None,
    ):
        """The attention step on projected heads: the one place a subclass
        changes how attention is computed (projections, rotary positions,
        the gate and the output projection stay in `call`).

        Keras's `MultiHeadAttention._compute_attention` semantics, so
        subclasses written for Keras's layer port over; the keyword-only
        arguments carry what this library keeps structural (never a dense
        `(Tq, Tk)` mask). An override that does not take them (Keras's
        signature) gets them folded into `attention_mask` by `call`.

        Args:
            query: projected queries `(b, Tq, heads, key_dim)`.
            key: projected keys `(b, Tk, kv_heads, key_dim)`.
            value: projected values `(b, Tk, kv_heads, value_dim)`.
            attention_mask: optional bool, `(b, Tq, Tk)` or
                `(b|1, heads|1, Tq, Tk)`; True = may attend.
            training: Python bool (dropout on the weights).
            return_attention_scores: also compute the weights; None: as
                the layer's call asked (an override with Keras's earlier
                signature calls `super()._compute_attention` without it).
            use_causal_mask: query `i` sees keys `j <= i + query_offset`.
            query_mask: optional bool `(b, Tq)`: padded queries give 0.
            key_mask: optional bool `(b, Tk)`: padded keys are not seen.
            query_offset: position of the first query (a cache offset).
            score_mod, mask_mod: bound score and mask functions (see
                `keras_attention.ops.dot_product_attention`).

        Returns:
            `(attention_output, attention_scores)`: `(b, Tq, heads,
            value_dim)` and the weights `(b, heads, Tq, Tk)` (None unless
            `return_attention_scores`).
        """
        if return_attention_scores is None:
            return_attention_scores = self._return_attention_scores
        if return_attention_scores and self._flash_attention:
            raise ValueError(_FLASH_SCORES_ERROR)
        dropout_fn = self._dropout_fn(training)
        implementation = self._implementation()
        if return_attention_scores or dropout_fn is not None:
            implementation = "dense"
        if implementation == "fused" and score_mod is not None:
            implementation = None  # No kernel hook: the automatic choice.
        result = dot_product_attention(
            query,
            key,
            value,
            attention_mask=attention_mask,
            dropout_fn=dropout_fn,
            return_weights=return_attention_scores,
            implementation=implementation,
            causal=use_causal_mask,
            query_offset=query_offset,
            query_mask=query_mask,
            key_mask=key_mask,
            score_mod=score_mod,
            mask_mod=mask_mod,
        )
        if return_attention_scores:
            return result
        return result, None

    def _attention_step(self, q, k, v, return_scores, training, **kwargs):
        """Calls `_compute_attention`, or a Keras-style override of it
        (without the structural keyword arguments) with every mask folded
        into a dense `attention_mask`."""
        step = self._compute_attention
        # What the call asked, for steps that do not take the argument
        # (Keras's GroupedQueryAttention reads this attribute).
        self._return_attention_scores = return_scores
        if _takes_structure(type(self)._compute_attention):
            return step(
                q,
                k,
                v,
                training=training,
                return_attention_scores=return_scores,
                **kwargs,
            )
        if kwargs.get("score_mod") is not None:
            raise ValueError(
                f"{type(self).__name__}._compute_attention does not take "
                "`score_mod` (Keras's signature), so the layer's score "
                "function cannot reach it. Accept keyword arguments "
                "(`**kwargs`) and pass them on to "
                "`super()._compute_attention`."
            )
        mask = _fold_masks(q, k, **kwargs)
        params = inspect.signature(step).parameters
        extra = {}
        if "return_attention_scores" in params:
            extra["return_attention_scores"] = return_scores
        return step(q, k, v, attention_mask=mask, training=training, **extra)

    def _use_local_path(self, q, k, query, key, return_scores, cache):
        """Whether `sliding_window` can run banded (`local_attention`):
        not with score or mask functions (the blockwise path skips the
        tiles outside the window then)."""
        if self.sliding_window is None or return_scores or cache is not None:
            return False
        if self.score_mod is not None or self.mask_mod is not None:
            return False
        if (
            type(self)._compute_attention
            is not MultiHeadAttention._compute_attention
        ):
            return False  # An overridden attention step runs on every call.
        if self._flash_attention is False:
            return False
        tq, tk = q.shape[1], k.shape[1]
        return query is key or (tq is not None and tq == tk)

    def _check_padding_masks(self, query, value, key, masks):
        """`ValueError` naming the mask unless it fits its input."""
        for (name, mask), (inputs_name, inputs) in zip(
            masks, (("query", query), ("value", value), ("key", key))
        ):
            if inputs is not None:  # None: value/key from a precomputed cache.
                validation.check_padding_mask(name, mask, inputs, inputs_name)

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
        mod_inputs=None,
        step_inputs=None,
        segment_ids=None,
        cache_sink_tokens=None,
        positions=None,
    ):
        key = value if key is None else key
        self._check_call_inputs(query, value, key)
        if positions is not None:
            self._check_positions(
                positions, query, key, cache, cache_sink_tokens
            )
        if segment_ids is not None:
            self._check_segment_ids(segment_ids, query, key, cache)
        if value is not None and (
            cache is None or cache_update_index is not None
        ):
            # Also at call time: a layer built on `(None, d)` inputs.
            _check_key_value_shapes(value.shape, key.shape)
        self._check_padding_masks(
            query,
            value,
            key,
            (
                ("query_mask", query_mask),
                ("value_mask", value_mask),
                ("key_mask", key_mask),
            ),
        )
        if return_attention_scores and self._flash_attention:
            raise ValueError(_FLASH_SCORES_ERROR)
        if len(query.shape) == 3:
            if cache is not None and cache_update_index is not None:
                check_cache_index(
                    cache_update_index,
                    query.shape[1],
                    cache.shape[2],
                    rolling=cache_sink_tokens is not None,
                )
            return self._call_3d(
                query,
                value,
                key,
                query_mask,
                value_mask,
                key_mask,
                attention_mask,
                return_attention_scores,
                training,
                use_causal_mask,
                cache,
                cache_update_index,
                mod_inputs=mod_inputs,
                step_inputs=step_inputs,
                segment_ids=segment_ids,
                cache_sink_tokens=cache_sink_tokens,
                positions=positions,
            )
        if cache is not None:
            raise ValueError(
                "A key/value `cache` needs inputs of shape (batch, steps, "
                f"features). Received: query.shape={tuple(query.shape)!r}"
            )
        if step_inputs:
            raise ValueError(
                "`step_inputs` need inputs of shape (batch, steps, "
                f"features). Received: query.shape={tuple(query.shape)!r}"
            )
        if self.score_mod is not None or self.mask_mod is not None:
            raise ValueError(
                "`score_mod` and `mask_mod` need inputs of shape (batch, "
                "steps, features): their positions are those of one sequence "
                "axis. Received: "
                f"query.shape={tuple(query.shape)!r}, "
                f"attention_axes={self.attention_axes!r}"
            )
        return self._call_high_rank(
            query,
            value,
            key,
            query_mask,
            value_mask,
            key_mask,
            attention_mask,
            return_attention_scores,
            training,
            use_causal_mask,
        )

    def _call_3d(
        self,
        query,
        value,
        key,
        query_mask,
        value_mask,
        key_mask,
        attention_mask,
        return_attention_scores,
        training,
        use_causal_mask,
        cache,
        cache_update_index,
        mod_inputs=None,
        step_inputs=None,
        segment_ids=None,
        cache_sink_tokens=None,
        positions=None,
    ):
        """Attention on `(b, T, features)` inputs (the rank-3 core).

        `step_inputs`: extra keyword arguments of this call for an
        overridden `_compute_attention` (a subclass's own inputs, such as
        `LocalSelfAttention`'s global tokens)."""
        offset = 0 if cache_update_index is None else cache_update_index
        gate = self._gate_dense(query) if self.use_gate else None
        rotary = self._rotary is not None
        if positions is None and segment_ids is not None and rotary:
            positions = masks_lib.segment_positions(segment_ids)
        q = self._rotate(self._query_dense(query), offset, positions)
        q = self._scale_query(q)
        if cache_sink_tokens is not None:
            result, scores, cache = self._attend_rolling_cache(
                q,
                query,
                value,
                key,
                query_mask,
                masks_lib.combine_masks(value_mask, key_mask),
                attention_mask,
                return_attention_scores,
                training,
                cache,
                cache_update_index,
                cache_sink_tokens,
                step_inputs,
                mod_inputs,
            )
            return self._finish(
                result, scores, cache, gate, return_attention_scores
            )
        if cache is None:
            k = self._rotate(self._key_dense(key), 0, positions)
            v = self._value_dense(value)
        elif cache_update_index is None:
            k, v = cache[:, 0], cache[:, 1]
        else:
            start = (0, cache_update_index, 0, 0)
            new_k = self._rotate(self._key_dense(key), offset, positions)
            k = ops.slice_update(cache[:, 0], start, new_k)
            v = ops.slice_update(cache[:, 1], start, self._value_dense(value))
            cache = ops.stack([k, v], axis=1)
        if cache_update_index is not None:
            # Padding masks of this call's keys do not cover the whole cache.
            value_mask = key_mask = None
        if segment_ids is None and self._use_local_path(
            q, k, query, key, return_attention_scores, cache
        ):
            if attention_mask is not None:
                self._check_attention_mask(attention_mask, query, k)
            result = local_attention(
                q,
                k,
                v,
                self.sliding_window - 1,
                causal=bool(use_causal_mask),
                query_mask=query_mask,
                key_mask=masks_lib.combine_masks(value_mask, key_mask),
                attention_mask=attention_mask,
                dropout_fn=self._dropout_fn(training),
            )
        else:
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
            score_mod, mask_mod = mods_base.bind_all(
                self.score_mod, self.mask_mod, mod_inputs
            )
            if segment_ids is not None:
                documents = DocumentMask().bind(segment_ids=segment_ids)
                mask_mod = (
                    mods_base.and_masks(mask_mod, documents)
                    if mask_mod
                    else documents
                )
            if self.sliding_window is not None:
                window = KerasSlidingWindowMask(self.sliding_window)
                mask_mod = (
                    mods_base.and_masks(mask_mod, window)
                    if mask_mod
                    else window
                )
            result = self._attention_step(
                q,
                k,
                v,
                return_attention_scores,
                training,
                score_mod=score_mod,
                mask_mod=mask_mod,
                **masks,
                **(step_inputs or {}),
            )
            result = result if return_attention_scores else result[0]
        scores = None
        if return_attention_scores:
            result, scores = result
        return self._finish(
            result, scores, cache, gate, return_attention_scores
        )

    def _finish(self, result, scores, cache, gate, return_attention_scores):
        """The gate and output projection of the heads' `result`, then the
        layer's outputs: `(output, scores?, cache?)`."""
        if gate is not None:
            result = ops.multiply(result, ops.cast(gate, result.dtype))
        output = self._output_dense(result)
        outputs = (output,)
        if return_attention_scores:
            outputs += (scores,)
        if cache is not None:
            outputs += (cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def cache_window(self):
        """How many earlier positions a query sees in a causal cache: the
        left bound of the sliding window (`sliding_window - 1`), or None
        when attention is not windowed (every earlier position).

        A rolling cache (`cache_sink_tokens`) needs a window: it holds
        `cache_window() + 1` recent positions (plus the sinks).

        Returns:
            int or None.
        """
        if self.sliding_window is None:
            return None
        return self.sliding_window - 1

    def _check_rolling_cache(self, cache, cache_update_index, sink_tokens):
        """`ValueError` unless a rolling cache can be used here: a window,
        an update index, and room for the window beside the sinks."""
        window = self.cache_window()
        size = cache.shape[2] if cache is not None else None
        problem = None
        if not validation.is_int(sink_tokens) or sink_tokens < 0:
            problem = "`cache_sink_tokens` must be a non-negative int"
        elif cache is None or cache_update_index is None:
            problem = (
                "a rolling cache needs `cache` and `cache_update_index` "
                "(the absolute position of the first query)"
            )
        elif window is None:
            problem = (
                "a rolling cache needs windowed attention (`sliding_window`, "
                "or `LocalSelfAttention`'s causal `window_size`)"
            )
        elif size is not None and size < sink_tokens + window + 1:
            problem = (
                f"the cache needs at least sink_tokens + window + 1 = "
                f"{sink_tokens + window + 1} slots, it has {size}"
            )
        if problem is not None:
            raise ValueError(
                f"{problem}. Received: cache_sink_tokens={sink_tokens!r}, "
                f"cache.shape={getattr(cache, 'shape', None)!r}, "
                f"window={window!r}, layer {self.name!r}"
            )

    def _attend_rolling_cache(
        self,
        q,
        query,
        value,
        key,
        query_mask,
        key_mask,
        attention_mask,
        return_attention_scores,
        training,
        cache,
        start,
        sink_tokens,
        step_inputs,
        mod_inputs=None,
    ):
        """Attention of `T` queries at positions `start ..` over a rolling
        cache (positions `0 .. start - 1` written in order, see
        `ops.rolling_cache`) and this call's own keys; then this call's
        keys and values are written into the cache.

        Keys are `[cache slots, this call's T keys]`: each query sees those
        whose position is at most its own, within the window or below
        `sink_tokens`. Score and mask functions see absolute positions:
        the query's, and the one each slot holds (`scoring.AtPositions`).
        Returns `(heads result, scores or None, cache)`.
        """
        self._check_rolling_cache(cache, start, sink_tokens)
        size, steps = cache.shape[2], q.shape[1]
        new_k = self._rotate(self._key_dense(key), start)
        new_v = self._value_dense(value)
        k = ops.concatenate([cache[:, 0], ops.cast(new_k, cache.dtype)], 1)
        v = ops.concatenate([cache[:, 1], ops.cast(new_v, cache.dtype)], 1)
        start = ops.cast(start, "int32")
        query_positions = start + ops.arange(steps, dtype="int32")
        key_positions = ops.concatenate(
            [rolling_cache_positions(size, sink_tokens, start), query_positions]
        )
        qp, kp = query_positions[:, None], key_positions[None]
        visible = ops.logical_and(kp >= 0, kp <= qp)
        near = ops.logical_or(qp - kp <= self.cache_window(), kp < sink_tokens)
        mask = ops.logical_and(visible, near)[None]  # (1, T, size + T)
        if attention_mask is not None:
            self._check_attention_mask(attention_mask, query, k)
            mask = ops.logical_and(ops.cast(attention_mask, "bool"), mask)
        if key_mask is not None:
            batch = ops.shape(key_mask)[0]
            key_mask = ops.concatenate(
                [ops.ones((batch, size), "bool"), ops.cast(key_mask, "bool")],
                axis=1,
            )
        masks = self._attention_masks(
            query,
            k,
            query_mask=query_mask,
            key_mask=key_mask,
            attention_mask=mask,
        )
        # The functions index keys by slot: give them the positions (an
        # unwritten slot, -1, is masked; any valid position will do).
        mods = mods_base.bind_all(self.score_mod, self.mask_mod, mod_inputs)
        score_mod, mask_mod = (
            None
            if fn is None
            else scoring.AtPositions(
                fn, query_positions, ops.maximum(key_positions, 0)
            )
            for fn in mods
        )
        result = self._attention_step(
            q,
            k,
            v,
            return_attention_scores,
            training,
            score_mod=score_mod,
            mask_mod=mask_mod,
            **masks,
            **(step_inputs or {}),
        )
        updated = rolling_cache_write(
            cache,
            ops.stack([new_k, new_v], axis=1),
            start,
            sink_tokens,
            axis=2,
        )
        if return_attention_scores:
            return result[0], result[1], updated
        return result[0], None, updated

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        _check_key_value_shapes(value_shape, key_shape)
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
            raise ValueError(_FLASH_SCORES_ERROR)
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

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook (`layers/_recording.py`): the
        weights of one call as `(batch, heads, Tq, Tk)` and what they
        are (self- or cross-attention, padding masks, causal)."""
        query, value = arguments.get("query"), arguments.get("value")
        key = arguments.get("key")
        weights = self.weights_as_4d(
            _recording.numpy_weights(scores), len(query.shape)
        )
        is_self = value is query and (key is None or key is query)
        meta = dict(
            kind="self" if is_self else "cross",
            query_mask=_recording.padding_mask(
                arguments.get("query_mask"), query
            ),
            key_mask=_recording.all_masks(
                _recording.padding_mask(arguments.get("value_mask"), value),
                _recording.padding_mask(arguments.get("key_mask"), key),
            ),
            causal=bool(arguments.get("use_causal_mask")),
            window=None,
        )
        if weights.shape[0] != query.shape[0]:  # attention_axes
            meta["query_mask"] = meta["key_mask"] = None
        return weights, meta

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "use_gate": self.use_gate,
                "output_shape": self._output_shapes,
                "attention_axes": self.attention_axes,
                "sliding_window": self.sliding_window,
                "flash_attention": self.flash_attention,
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
                    self.projection_activity_regularizer
                ),
                "kernel_constraint": keras.constraints.serialize(
                    self.kernel_constraint
                ),
                "bias_constraint": keras.constraints.serialize(
                    self.bias_constraint
                ),
                "seed": self.seed,
                "num_key_value_heads": self.num_key_value_heads,
                "rotary_max_wavelength": self.rotary_max_wavelength,
                "rotary_scaling": self.rotary_scaling,
            }
        )
        if self.attention_scale is not None:
            # Only when set: Keras's layer has no such key.
            config["attention_scale"] = self.attention_scale
        config.update(mods_base.config_entries(self))
        return config

    @classmethod
    def from_config(cls, config):
        config = mods_base.from_config_entries(config)
        return cls(**config)


def _shape_of(x):
    """`x.shape` as a tuple (None without one: a list, a missing key)."""
    shape = getattr(x, "shape", None)
    return None if shape is None else tuple(shape)


def _takes_structure(method):
    """Whether a `_compute_attention` takes this library's structural
    keyword arguments (ours does; a Keras-style override may not)."""
    params = inspect.signature(method).parameters.values()
    names = {p.name for p in params}
    return (
        any(p.kind is p.VAR_KEYWORD for p in params)
        or {
            "query_mask",
            "key_mask",
            "mask_mod",
        }
        <= names
    )


def _fold_masks(q, k, use_causal_mask=False, score_mod=None, **masks):
    """Every mask of a call as one dense bool `(b|1, h|1, Tq, Tk)` (None
    when nothing masks): for `_compute_attention` overrides with Keras's
    signature, which take `attention_mask` only."""
    return dense_mask(query=q, key=k, causal=use_causal_mask, **masks)
