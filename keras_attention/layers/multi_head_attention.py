"""`MultiHeadAttention`: its arguments, its call and its config.

The layer is put together from its seams, each in a module of its own:
the projections and shapes (`_projections.py`), the overridable attention
step (`_attention_step.py`, `_compute_attention`), the adapter for
overrides with Keras's signature (`_keras_override.py`), the rolling
cache (`_rolling_attention.py`, arithmetic in `ops/rolling_cache.py`),
the `attention_axes` layout (`_attention_axes.py`) and the recording hook
(`recording.py`). A call's arguments are checked once (`_check_call`,
checks in `utils/attention_checks.py`) and travel as one `AttentionCall`
record (`_attention_call.py`).
"""

import keras
from keras import ops

from keras_attention import masks as masks_lib
from keras_attention.layers import _attention_axes
from keras_attention.layers import _kv_cache
from keras_attention.layers import _rolling_attention
from keras_attention.layers import recording
from keras_attention.layers._attention_call import AttentionCall
from keras_attention.layers._attention_step import AttentionStep
from keras_attention.layers._projections import Projections
from keras_attention.layers._qk_norm import QKNormAndSinks
from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.layers.rotary_embedding import check_rotary_arguments
from keras_attention.layers.rotary_embedding import check_rotary_fraction
from keras_attention.layers.token_mixer import TokenMixer
from keras_attention.mods import base as mods_base
from keras_attention.utils import attention_checks
from keras_attention.utils import validation
from keras_attention.utils.attention_checks import check_cache_index


@keras.saving.register_keras_serializable(package="keras_attention")
class MultiHeadAttention(
    _attention_axes.AttentionAxesLayout,
    recording.AttentionRecording,
    Projections,
    QKNormAndSinks,
    AttentionStep,
    _kv_cache.SlotPerPosition,
    TokenMixer,
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
        use_bias: bool, the projections' biases; "qkv": all but the output's.
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
        rotary_fraction: keyword-only float in (0, 1], the share of each
            head's `key_dim` features that the rotary positions rotate
            (partial rotary, as GPT-NeoX and Phi-2: the first
            `2 * floor(key_dim * rotary_fraction / 2)` features, the
            frequencies computed over them; the rest pass unrotated).
            Needs `rotary_max_wavelength` when below 1. Defaults to 1.0.
        qk_norm: keyword-only None, "rms", "layer" (each head's queries
            and keys normalized over `key_dim` before the rotary positions:
            Gemma 3, Qwen 3), "rms_across_heads" (over all heads at once:
            OLMo 2) or "l2" (`x / sqrt(mean(x^2) + eps)` per head, no
            weight: Llama 4); `_qk_norm.py` has the formulas. Weights
            `query_norm` and `key_norm` (a `key_dim` scale each, a bias for
            "layer"; `(heads, key_dim)` across heads; none for "l2").
            Defaults to None.
        qk_norm_epsilon: keyword-only float > 0, the norms' epsilon.
            Defaults to 1e-6.
        learned_sinks: keyword-only bool, learned attention sinks
            (gpt-oss): one trainable logit per query head (weight
            `sinks`, `(num_heads,)`, zeros) joins each row's softmax as a
            virtual key that contributes no value, on every path
            (`keras_attention.ops.dot_product_attention`'s `sink_logits`).
            Unlike a rolling cache's `cache_sink_tokens` (real first
            tokens kept in the cache), nothing is stored. Defaults to
            False.
        temperature_tuning: keyword-only optional dict `{"floor_scale":
            f, "scale": s}` (defaults 8192 and 0.1, Llama 4's): attention
            temperature tuning (Llama 4's NoPE layers): each query times
            `1 + s * log(1 + floor((p + 1) / f))` at its position `p`, the
            token's position as the rotary positions count it
            (`positions` when given, else `cache_update_index + i`;
            transformers counts the index in the padded sequence, so its
            left-padded rows differ from the same tokens alone). Defaults
            to None (off).
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
        qk_norm=None,
        qk_norm_epsilon=1e-6,
        learned_sinks=False,
        rotary_fraction=1.0,
        temperature_tuning=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._set_query_scales(attention_scale, temperature_tuning)
        self.qk_norm, self.qk_norm_epsilon = validation.check_qk_norm(
            qk_norm, qk_norm_epsilon
        )
        self.learned_sinks = validation.check_bool(
            "learned_sinks", learned_sinks
        )
        self._return_attention_scores = False
        num_heads, key_dim, value_dim, num_key_value_heads = (
            attention_checks.check_heads(
                num_heads, key_dim, value_dim, num_key_value_heads
            )
        )
        dropout = validation.check_rate("dropout", dropout)
        sliding_window = validation.check_positive_int(
            "sliding_window", sliding_window, allow_none=True
        )
        if flash_attention is not None:
            flash_attention = validation.check_bool(
                "flash_attention", flash_attention
            )
        self.rotary_fraction, self._rotary_dims = check_rotary_fraction(
            rotary_fraction, rotary_max_wavelength, key_dim
        )
        rotary_max_wavelength, rotary_scaling = check_rotary_arguments(
            rotary_max_wavelength, rotary_scaling, self._rotary_dims
        )
        self.supports_masking = True
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim if value_dim else key_dim
        self.num_key_value_heads = num_key_value_heads
        self.dropout = dropout
        self.use_bias = validation.check_use_bias(use_bias)
        self.use_gate = validation.check_bool("use_gate", use_gate)
        # Full output shape (tuple) and, for subclasses, `_output_shape`:
        # an int for a one-dimensional output, else the tuple.
        self._output_shapes = attention_checks.check_output_shape(output_shape)
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
        call = AttentionCall(  # array-likes become tensors (as in Keras)
            query=query,
            value=value,
            key=value if key is None else key,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            use_causal_mask=use_causal_mask,
            cache=cache,
            cache_update_index=cache_update_index,
            mod_inputs=mod_inputs,
            step_inputs=step_inputs,
            segment_ids=segment_ids,
            cache_sink_tokens=cache_sink_tokens,
            positions=positions,
        )
        close = None
        if _kv_cache.is_own_cache(cache):  # `init_cache`'s, with its mask
            call, close = _kv_cache.open_attention_call(
                call, self.cache_window()
            )
        self._check_call(call)
        if len(query.shape) != 3:
            return self._call_high_rank(call)
        outputs = self._call_3d(call)
        if close is None:
            return outputs
        return outputs[:-1] + (close(outputs[-1]),)

    def init_cache(self, batch_size, max_length, dtype=None, sink_tokens=None):
        """The layer's empty cache (`TokenMixer`) for causal decoding:
        `{"keys_values", "key_mask"}`, zeros `(batch, 2, max_length,
        kv_heads, key_dim)` and boolean `(batch, max_length)`; with
        `sink_tokens` (windowed attention), a rolling cache
        `{"keys_values", "slot_mask"}` of `sink_tokens + cache_window() +
        1` slots (as `cache_sink_tokens`'s). Pass it as `cache` with
        `cache_update_index`: the call is causal, its tokens' padding
        mask goes into the cache's key mask; it returns the new dict.

        Example:

        >>> import numpy as np
        >>> import keras_attention
        >>> mha = keras_attention.layers.SelfAttention(2, 4, causal=True)
        >>> x = np.ones((1, 5, 8), "float32")
        >>> _ = mha(x)  # build
        >>> cache = mha.init_cache(1, 5)
        >>> y, cache = mha(x[:, :3], cache=cache, cache_update_index=0)
        >>> y, cache = mha(x[:, 3:], cache=cache, cache_update_index=3)
        >>> {name: tuple(c.shape) for name, c in cache.items()}
        {'keys_values': (1, 2, 5, 2, 4), 'key_mask': (1, 5)}
        """
        return _kv_cache.init_kv_cache(
            self, batch_size, max_length, dtype, sink_tokens
        )

    def _check_call(self, call):
        """Every check a call's arguments need before any computation."""
        query, value, key, cache = call.query, call.value, call.key, call.cache
        self._check_call_inputs(query, value, key)
        if call.positions is not None:
            attention_checks.check_positions(
                call.positions,
                call,
                (self._rotary, self.temperature_tuning) != (None, None),
                self.name,
            )
        if call.segment_ids is not None:
            attention_checks.check_segment_ids(
                call.segment_ids, query, key, cache
            )
        if value is not None and (
            cache is None or call.cache_update_index is not None
        ):
            # Also at call time: a layer built on `(None, d)` inputs.
            attention_checks.check_key_value_shapes(value.shape, key.shape)
        attention_checks.check_padding_masks(call)
        if call.return_attention_scores and self._flash_attention:
            raise ValueError(attention_checks.FLASH_SCORES_ERROR)
        if len(query.shape) == 3:
            if cache is not None:
                attention_checks.check_key_value_cache(
                    cache, query, self._kv_heads, self.key_dim, self.value_dim
                )
            if cache is not None and call.cache_update_index is not None:
                check_cache_index(
                    call.cache_update_index,
                    query.shape[1],
                    cache.shape[2],
                    rolling=call.cache_sink_tokens is not None,
                )
            return
        if cache is not None:
            raise ValueError(
                "A key/value `cache` needs inputs of shape (batch, steps, "
                f"features). Received: query.shape={tuple(query.shape)!r}"
            )
        if call.step_inputs:
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

    def _call_3d(self, call):
        """Attention on `(b, T, features)` inputs (the rank-3 core), for
        one `AttentionCall`.

        `call.step_inputs`: extra keyword arguments of this call for an
        overridden `_compute_attention` (a subclass's own inputs, such as
        `LocalSelfAttention`'s global tokens)."""
        gate = self._gate_dense(call.query) if self.use_gate else None
        positions = call.positions
        rotary = self._rotary is not None or self.temperature_tuning
        if positions is None and call.segment_ids is not None and rotary:
            positions = masks_lib.segment_positions(call.segment_ids)
        q = self._rotate(
            self._project_query(call.query), call.offset, positions
        )
        q = self._scale_query(q, call.offset, positions)
        if call.cache_sink_tokens is not None:
            result, scores, cache = _rolling_attention.attend_rolling_cache(
                self, call, q
            )
            return self._finish(call, result, scores, cache, gate)
        k, v, cache = self._keys_and_values(call, positions)
        if call.cache_update_index is not None:
            # Padding masks of this call's keys do not cover the whole cache.
            call = call.replace(value_mask=None, key_mask=None)
        banded = None
        if call.segment_ids is None:
            banded = self._banded_request(call, q, k, v, cache)
        if banded is not None:
            result, scores = self._attend_banded(call, banded), None
        else:
            result, scores = self._attend(call, q, k, v)
        return self._finish(call, result, scores, cache, gate)

    def _keys_and_values(self, call, positions):
        """The keys and values a rank-3 call attends to, and the updated
        cache: this call's projections, a precomputed cache, or this
        call's projections written into the cache at
        `cache_update_index`."""
        cache, index = call.cache, call.cache_update_index
        if cache is None:
            k = self._rotate(self._project_key(call.key), 0, positions)
            return k, self._value_dense(call.value), None
        if index is None:
            return cache[:, 0], cache[:, 1], cache
        new_k = self._rotate(
            self._project_key(call.key), call.offset, positions
        )
        new = ops.stack([new_k, self._value_dense(call.value)], axis=1)
        # One slice into the cache as it is (in place under XLA); a
        # stack of the updated keys and values would copy the cache.
        cache = ops.slice_update(
            cache, (0, 0, index, 0, 0), ops.cast(new, cache.dtype)
        )
        return cache[:, 0], cache[:, 1], cache

    def _finish(self, call, result, scores, cache, gate):
        """The gate and output projection of the heads' `result`, then the
        layer's outputs: `(output, scores?, cache?)`."""
        if gate is not None:
            result = ops.multiply(result, ops.cast(gate, result.dtype))
        output = self._output_dense(result)
        outputs = (output,)
        if call.return_attention_scores:
            outputs += (scores,)
        if cache is not None:
            outputs += (cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def cache_window(self):
        """How many earlier positions a query sees in a causal cache: the
        smaller of the sliding window's left bound (`sliding_window - 1`)
        and the mask object's (`mask_mod.lookback()`: a
        `ChunkedCausalMask`'s `chunk_size - 1`), or None when neither
        bounds it (every earlier position).

        A rolling cache (`cache_sink_tokens`) needs a window: it holds
        `cache_window() + 1` recent positions (plus the sinks).
        """
        bounds = [mods_base.mask_lookback(self.mask_mod)]
        if self.sliding_window is not None:
            bounds.append(self.sliding_window - 1)
        return min((b for b in bounds if b is not None), default=None)

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
        if self.qk_norm is not None:
            config["qk_norm"] = self.qk_norm
            config["qk_norm_epsilon"] = self.qk_norm_epsilon
        if self.learned_sinks:
            config["learned_sinks"] = True
        if self.rotary_fraction != 1.0:
            config["rotary_fraction"] = self.rotary_fraction
        if self.temperature_tuning is not None:
            config["temperature_tuning"] = dict(self.temperature_tuning)
        config.update(mods_base.config_entries(self))
        return config

    @classmethod
    def from_config(cls, config):
        config = mods_base.from_config_entries(config)
        return cls(**config)
