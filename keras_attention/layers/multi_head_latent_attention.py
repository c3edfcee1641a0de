"""`MultiHeadLatentAttention`: DeepSeek-V2/V3's multi-head latent
attention (MLA), whose key/value cache holds one low-rank latent per
token instead of per-head keys and values.

Axes in comments: b - batch, t - query positions, s - key positions
(the cache's), h - heads, n - `qk_nope_head_dim`, p - `qk_rope_head_dim`,
v - `v_head_dim`, r - `kv_lora_rank`.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attention import masks as masks_lib
from keras_attention.layers import _einsum_dense
from keras_attention.layers import _kv_cache
from keras_attention.layers import _latent_indexer
from keras_attention.layers import _latent_rotary
from keras_attention.layers import recording
from keras_attention.layers import token_mixer
from keras_attention.layers._qk_norm import HeadRMSNorm
from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.layers.token_mixer import TokenMixer
from keras_attention.utils import attention_checks
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

_LAYOUT = "(batch, steps, features)"


def _check_rope_head_dim(value):
    value = validation.check_positive_int("qk_rope_head_dim", value)
    if value % 2:
        raise ValueError(
            "`qk_rope_head_dim` must be even (rotary embeddings rotate "
            f"feature pairs). Received: qk_rope_head_dim={value!r}"
        )
    return value


def _check_absorb(value):
    if value is None:
        return None
    return validation.check_bool("absorb", value)


def _with_weights(result, options):
    """`(heads, weights or None)` of a `dot_product_attention` result."""
    if options["return_weights"]:
        return result
    return result, None


@keras.saving.register_keras_serializable(package="keras_attention")
class MultiHeadLatentAttention(
    recording.AttentionRecording,
    _kv_cache.SlotPerPosition,
    _latent_indexer.IndexedLatent,
    TokenMixer,
    keras.layers.Layer,
):
    """Multi-head latent attention (MLA) of DeepSeek-V2 and DeepSeek-V3.

    Each token is compressed into a latent `c = RMSNorm(x W_dkv)` of
    `kv_lora_rank` features, from which every head's keys and values are
    up-projected (`kv_b_proj`); a second, decoupled key of
    `qk_rope_head_dim` features, shared by all heads, carries the rotary
    positions. Queries have a position-free part of `qk_nope_head_dim` and
    a rotary part of `qk_rope_head_dim` per head:

        q = x W_q  (or RMSNorm(x W_qa) W_qb with `q_lora_rank`)
        [c, k_rope] = x W_kv_a;  c = RMSNorm(c);  k_rope = RoPE(k_rope)
        [k_nope, v] = c W_kv_b                    (per head)
        score = ([q_nope, RoPE(q_rope)] . [k_nope, k_rope])
                / sqrt(qk_nope_head_dim + qk_rope_head_dim)
        output = (softmax(score) v) W_o

    The weights are named and shaped as the `DeepseekV3Attention` of
    Hugging Face `transformers` (a `Dense` kernel is the `nn.Linear`
    weight transposed): `q_proj` or `q_a_proj`, `q_a_layernorm`,
    `q_b_proj`; `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`,
    `o_proj`. The biases follow `transformers` too: with
    `attention_bias`, `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj` get
    one; `q_proj`, `q_b_proj` and `kv_b_proj` never do.

    Cache: only the normalised latent and the rotated rope key of each
    token, `(batch, max_length, kv_lora_rank + qk_rope_head_dim)`. Per
    token and layer that is `kv_lora_rank + qk_rope_head_dim` numbers
    against `2 * num_heads * (qk_nope_head_dim + qk_rope_head_dim)` for a
    `MultiHeadAttention` cache of the same heads (keys and values of
    that width): DeepSeek-V3's sizes (`r=512, p=64, n=128, h=128`) give
    576 against 49,152, 85 times fewer bytes.

    Absorbed form (`absorb`): the up-projections are folded into the
    query and the output, so attention runs on the latents directly as
    multi-query attention with one shared key/value head:
    `score = (q_nope W_uk) . c + q_rope . k_rope`, `output = ((softmax .
    c) W_uv) W_o`. It gives the naive result (up to float rounding) and
    never materialises per-head keys or values: the cheap form for
    decoding, where the cache is long and the query short.

    Rotary positions: plain RoPE, frequencies `rope_theta ** (-2k / p)`.
    DeepSeek's checkpoints lay the rope features out in interleaved pairs
    `(x0, x1), (x2, x3), ...` (`rope_interleave=True`, as
    `DeepseekV3Config`'s default); `False` rotates halves `(x_k,
    x_{k + p/2})` as Llama does. Context extension: `rotary_scaling`
    (`RotaryEmbedding`'s scaling arguments, as `MultiHeadAttention`
    takes them), with DeepSeek's YaRN keys `mscale` and `mscale_all_dim`:
    `m(f, x) = 0.1 x ln(f) + 1` for the `scaling_factor` `f`, the rotary
    cos and sin scaled by `m(f, mscale) / m(f, mscale_all_dim)` (both
    given; else `m(f, 1)`) and the softmax scale multiplied by
    `m(f, mscale_all_dim) ** 2` (given), as `transformers`'
    `DeepseekV3Attention` does with `rope_scaling={"rope_type": "yarn",
    "factor": f, ...}` (its `factor` is `scaling_factor` here).

    Args:
        num_heads: int, number of attention heads `h`.
        kv_lora_rank: int, size `r` of the key/value latent.
        qk_nope_head_dim: int, per-head size of the position-free query
            and key part.
        qk_rope_head_dim: even int, size of the rotary query part (per
            head) and of the shared rotary key.
        v_head_dim: int, per-head value size.
        q_lora_rank: optional int: queries through a low-rank bottleneck
            (`q_a_proj`, RMSNorm, `q_b_proj`, as DeepSeek-V2/V3); None
            (default): one projection `q_proj` (DeepSeek-V2-Lite).
        rope_theta: finite number >= 1, the rotary base, or None: no
            rotary positions (NoPE, Kimi Linear's MLA layers): the rope
            features of queries and of the shared key stay as projected
            (`positions` then changes nothing). Defaults to 10000.
        rope_interleave: bool, interleaved rope pairs (DeepSeek's layout,
            default True) or halves (False).
        attention_bias: bool, biases on `q_a_proj`, `kv_a_proj_with_mqa`
            and `o_proj`. Defaults to False.
        rms_norm_eps: float > 0, the epsilon of the latents' RMSNorms.
            Defaults to 1e-6 (`transformers` builds these two norms with
            1e-6 whatever its config's `rms_norm_eps`).
        dropout: float in [0, 1), dropout on the attention weights.
        absorb: None, True or False: compute attention in the absorbed
            form above (True), the naive one (False), or absorbed for
            cached calls only (None, default).
        rotary_scaling: optional dict of `RotaryEmbedding`'s
            context-extension arguments (`scaling_factor`, `rope_type`,
            `beta_fast`, `beta_slow`, `original_max_position_embeddings`,
            `truncate`, ...), plus `mscale` and `mscale_all_dim`
            (positive numbers, `rope_type="yarn"` only) as above;
            DeepSeek-V3: `{"rope_type": "yarn", "scaling_factor": 40,
            "original_max_position_embeddings": 4096, "beta_fast": 32,
            "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}`.
            Defaults to None (no scaling).
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.
        seed: optional int, seed of the dropout.
        indexer: optional dict, DeepSeek Sparse Attention (DeepSeek-V3.2):
            a `LightningIndexer` of these arguments (`num_heads`,
            `head_dim`, `top_k`; `layer_norm_epsilon`,
            `kernel_initializer`), as the sublayer `indexer`, names each
            query's `top_k` keys and attention reads only those
            (`ops.topk_attention`); needs `q_lora_rank`. Its keys join
            the cache (`_latent_indexer.py`). Defaults to None (dense).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(batch, T, hidden)`, the sequence (self-attention).
        query_mask: optional boolean `(batch, T)`, True on real tokens;
            read from the query's Keras mask when omitted. Padded tokens
            are not attended to (uncached calls) and give zero attention
            (then `o_proj`'s bias). The output carries the query's Keras
            mask.
        attention_mask: optional boolean `(T, S)`, `(batch, T, S)` or
            `(batch, num_heads, T, S)`, True = may attend (`S = T`, or
            the cache's length with a cache).
        return_attention_scores: bool, also return the attention weights
            `(batch, num_heads, T, S)` (the same in the absorbed form).
        use_causal_mask: bool, position `i` sees keys `j <= i` (positions
            counted from `cache_update_index` with a cache).
        cache: optional latent cache `(batch, max_length, kv_lora_rank +
            qk_rope_head_dim)`, with `cache_update_index`: this call's
            latents are written at that index and attention runs over the
            whole cache (mask its unfilled slots with `use_causal_mask`
            or `attention_mask`).
        cache_update_index: int or scalar integer tensor, the position of
            this call's first token (and of its rotary positions):
            `0 <= index` and `index + T <= max_length`, refused with a
            `ValueError` when known (eager calls); a symbolic index is
            not checked.
        positions: optional integer `(batch, T)` or `(T,)`: the rotary
            positions of this call's queries and latents instead of
            `cache_update_index + arange(T)` (e.g. restarting in each
            packed document); with a cache the latents are still written
            at `cache_update_index`, rotated at these positions, and the
            causal mask still counts from `cache_update_index`.
        training: bool, dropout on or off.

    Returns:
        The output `(batch, T, hidden)`, then the attention weights if
        `return_attention_scores`, then the updated cache if a `cache`
        was given (`MultiHeadAttention`'s order).

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> mla = keras_attention.layers.MultiHeadLatentAttention(
    ...     num_heads=2, kv_lora_rank=8, qk_nope_head_dim=4,
    ...     qk_rope_head_dim=2, v_head_dim=4)
    >>> x = np.random.default_rng(0).normal(size=(1, 5, 16)).astype("float32")
    >>> tuple(mla(x, use_causal_mask=True).shape)
    (1, 5, 16)
    >>> cache = np.zeros((1, 5, 8 + 2), "float32")
    >>> y, cache = mla(x[:, :3], cache=cache, cache_update_index=0,
    ...                use_causal_mask=True)
    >>> tuple(cache.shape)
    (1, 5, 10)
    >>> y, weights = mla(x, use_causal_mask=True, return_attention_scores=True)
    >>> tuple(weights.shape)
    (1, 2, 5, 5)

    References:
        - DeepSeek-AI, 2024, "DeepSeek-V2: A Strong, Economical, and
          Efficient Mixture-of-Experts Language Model" (arXiv 2405.04434),
          section 2.1.
        - DeepSeek-AI, 2024, "DeepSeek-V3 Technical Report" (arXiv
          2412.19437).
        - Su et al., 2021, "RoFormer: Enhanced Transformer with Rotary
          Position Embedding".
    """

    # `dot_product_attention` runs as the ring in `ContextParallel`'s scope
    # (`recording.check_context_parallel`).
    runs_context_parallel = True

    def __init__(
        self,
        num_heads,
        kv_lora_rank,
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim,
        q_lora_rank=None,
        rope_theta=10000.0,
        rope_interleave=True,
        attention_bias=False,
        rms_norm_eps=1e-6,
        dropout=0.0,
        absorb=None,
        rotary_scaling=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        indexer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        positive = validation.check_positive_int
        self.num_heads = positive("num_heads", num_heads)
        self.kv_lora_rank = positive("kv_lora_rank", kv_lora_rank)
        self.qk_nope_head_dim = positive("qk_nope_head_dim", qk_nope_head_dim)
        self.qk_rope_head_dim = _check_rope_head_dim(qk_rope_head_dim)
        self.v_head_dim = positive("v_head_dim", v_head_dim)
        self.q_lora_rank = positive("q_lora_rank", q_lora_rank, True)
        self.rope_theta = _latent_rotary.check_rope_theta(rope_theta)
        self.rope_interleave = validation.check_bool(
            "rope_interleave", rope_interleave
        )
        self.attention_bias = validation.check_bool(
            "attention_bias", attention_bias
        )
        self.rms_norm_eps = float(
            validation.check_positive_number("rms_norm_eps", rms_norm_eps)
        )
        self.dropout = validation.check_rate("dropout", dropout)
        self.absorb = _check_absorb(absorb)
        self.rotary_scaling = _latent_rotary.check_rotary_scaling(
            rotary_scaling, self.rope_theta
        )
        self._rope_correction, self._softmax_factor = (
            _latent_rotary.yarn_factors(self.rotary_scaling)
        )
        self.seed = validation.check_seed("seed", seed)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True
        self._rotary = None  # NoPE
        if self.rope_theta is not None:
            self._rotary = RotaryEmbedding(
                max_wavelength=self.rope_theta,
                **_latent_rotary.rotary_arguments(self.rotary_scaling),
                dtype=self.dtype_policy,
                name="rotary_embedding",
            )
        self._dropout_layer = keras.layers.Dropout(
            rate=self.dropout, seed=self.seed, dtype=self.dtype_policy
        )
        self.indexer = self._make_indexer(indexer)

    @property
    def qk_head_dim(self):
        """Per-head query/key size, `qk_nope_head_dim + qk_rope_head_dim`."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_dim(self):
        """Last axis of the latent cache, `kv_lora_rank +
        qk_rope_head_dim`."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    # Build ---------------------------------------------------------------

    def _dense(self, units, name, use_bias, input_dim):
        clone = keras_utils.clone_initializer
        dense = _einsum_dense.Dense(
            units,
            use_bias=use_bias,
            kernel_initializer=clone(self.kernel_initializer),
            bias_initializer=clone(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        dense.build((None, None, input_dim))
        return dense

    def _norm(self, name, dim):
        norm = HeadRMSNorm(
            epsilon=self.rms_norm_eps, dtype=self.dtype_policy, name=name
        )
        # Per position: a Keras mask (on `q_a_proj`'s output) passes on.
        norm.supports_masking = True
        norm.build((None, None, dim))
        return norm

    def build(self, query_shape):
        hidden = validation.check_sequence_shape(
            "query", query_shape, layout=_LAYOUT
        )
        self._hidden = hidden
        q_units = self.num_heads * self.qk_head_dim
        bias = self.attention_bias
        self.q_proj = self.q_a_proj = None
        self.q_a_layernorm = self.q_b_proj = None
        if self.q_lora_rank is None:
            self.q_proj = self._dense(q_units, "q_proj", False, hidden)
        else:
            rank = self.q_lora_rank
            self.q_a_proj = self._dense(rank, "q_a_proj", bias, hidden)
            self.q_a_layernorm = self._norm("q_a_layernorm", rank)
            self.q_b_proj = self._dense(q_units, "q_b_proj", False, rank)
        self.kv_a_proj_with_mqa = self._dense(
            self.cache_dim, "kv_a_proj_with_mqa", bias, hidden
        )
        self.kv_a_layernorm = self._norm("kv_a_layernorm", self.kv_lora_rank)
        self.kv_b_proj = self._dense(
            self.num_heads * (self.qk_nope_head_dim + self.v_head_dim),
            "kv_b_proj",
            False,
            self.kv_lora_rank,
        )
        self.o_proj = self._dense(
            hidden, "o_proj", bias, self.num_heads * self.v_head_dim
        )
        self._build_indexer(hidden)
        self.built = True

    # Pieces --------------------------------------------------------------

    def _heads(self, x, dim):
        """`(b, t, h * dim)` -> `(b, t, h, dim)` (no -1: `t` may be 0)."""
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], self.num_heads, dim))

    def _rope(self, x, start, positions=None):
        """Rotary positions on the rope features `(b, t, heads, p)`, from
        position `start` (or at `positions`); interleaved pairs are first
        gathered into halves (as `transformers`'
        `apply_rotary_pos_emb_interleave` returns them), so queries and
        cached keys share the halves layout. DeepSeek's YaRN factor
        corrects `RotaryEmbedding`'s own (`_latent_rotary.py`). NoPE
        (`rope_theta=None`): `x` as it is."""
        if self._rotary is None:
            return x
        if self.rope_interleave:
            p = self.qk_rope_head_dim
            order = np.concatenate([np.arange(0, p, 2), np.arange(1, p, 2)])
            x = ops.take(x, ops.convert_to_tensor(order, "int32"), axis=-1)
        x = self._rotary(x, start_index=start, positions=positions)
        if self._rope_correction != 1.0:
            x = ops.multiply(
                x, keras_utils.constant(self._rope_correction, x.dtype)
            )
        return x

    def _queries(self, query, start, positions=None, latent=None):
        """`(q_nope (b, t, h, n), q_rope (b, t, h, p))`, rope rotated;
        `latent`: the query latent `q_a_layernorm(q_a_proj(query))` when
        computed already."""
        if self.q_proj is not None:
            q = self.q_proj(query)
        else:
            if latent is None:
                latent = self.q_a_layernorm(self.q_a_proj(query))
            q = self.q_b_proj(latent)
        q = self._heads(q, self.qk_head_dim)
        n = self.qk_nope_head_dim
        return q[..., :n], self._rope(q[..., n:], start, positions)

    def latents(self, query, start=0, positions=None):
        """The cache entries of `query`'s tokens: the normalised latent
        and the rotated rope key, `(b, t, kv_lora_rank +
        qk_rope_head_dim)`, rotary positions from `start` (or
        `positions`, `(b, t)` or `(t,)`)."""
        kv = self.kv_a_proj_with_mqa(query)
        r = self.kv_lora_rank
        c = self.kv_a_layernorm(kv[..., :r])
        k_rope = self._rope(kv[..., None, r:], start, positions)[:, :, 0]
        return ops.concatenate([c, ops.cast(k_rope, c.dtype)], axis=-1)

    def _up_projections(self):
        """`kv_b_proj`'s kernel split per head: `(W_uk (r, h, n), W_uv (r,
        h, v))`, in the compute dtype."""
        kernel = ops.cast(self.kv_b_proj.kernel, self.compute_dtype)
        kernel = ops.reshape(
            kernel,
            (
                self.kv_lora_rank,
                self.num_heads,
                self.qk_nope_head_dim + self.v_head_dim,
            ),
        )
        n = self.qk_nope_head_dim
        return kernel[..., :n], kernel[..., n:]

    def _attend(self, q_nope, q_rope, latent, masks, training, absorb):
        """Attention of the queries over the latents `(b, s, r + p)`,
        naive or absorbed; returns the heads `(b, t, h, v)` and the
        weights `(b, h, t, s)` (None unless `masks["return_weights"]`)."""
        r = self.kv_lora_rank
        c, k_rope = latent[..., :r], latent[..., r:]
        dropout_fn = None
        if self.dropout > 0 and training is not None and training is not False:

            def dropout_fn(weights):
                return self._dropout_layer(weights, training=training)

        dense = dropout_fn is not None or masks["return_weights"]
        options = dict(
            masks,
            scale=self._softmax_factor / math.sqrt(self.qk_head_dim),
            dropout_fn=dropout_fn,
            implementation="dense" if dense else None,
        )
        if absorb:
            w_uk, w_uv = self._up_projections()
            q_latent = ops.einsum("bthn,rhn->bthr", q_nope, w_uk)
            query = ops.concatenate([q_latent, q_rope], axis=-1)
            # One key/value head shared by every query head (MQA).
            result = _latent_indexer.attend(
                query, latent[:, :, None], c[:, :, None], **options
            )
            result, weights = _with_weights(result, options)
            return ops.einsum("bthr,rhv->bthv", result, w_uv), weights
        kv = self._heads(
            self.kv_b_proj(c), self.qk_nope_head_dim + self.v_head_dim
        )
        k_nope, value = (
            kv[..., : self.qk_nope_head_dim],
            kv[..., self.qk_nope_head_dim :],
        )
        shape = ops.shape(k_nope)
        k_rope = ops.broadcast_to(
            k_rope[:, :, None],
            (shape[0], shape[1], self.num_heads, self.qk_rope_head_dim),
        )
        key = ops.concatenate([k_nope, k_rope], axis=-1)
        query = ops.concatenate([q_nope, q_rope], axis=-1)
        result = _latent_indexer.attend(query, key, value, **options)
        return _with_weights(result, options)

    # Call ----------------------------------------------------------------

    def _check_call(self, query, query_mask, cache, index):
        validation.check_call_input("query", query, self._hidden, (3,), _LAYOUT)
        validation.check_padding_mask("query_mask", query_mask, query, "query")
        if (cache is None) != (index is None):
            raise ValueError(
                "`cache` and `cache_update_index` go together: the latents "
                "of this call are written into the cache at that index. "
                f"Received: cache={None if cache is None else 'a tensor'}, "
                f"cache_update_index={index!r}"
            )
        if cache is None:
            return
        shape = tuple(cache.shape)
        if len(shape) != 3 or shape[-1] not in (None, self.cache_dim):
            raise ValueError(
                "`cache` must have shape (batch, max_length, kv_lora_rank + "
                f"qk_rope_head_dim) = (batch, max_length, {self.cache_dim}). "
                f"Received: cache.shape={shape!r}"
            )
        attention_checks.check_cache_batch("cache", cache, query)
        attention_checks.check_cache_index(index, query.shape[1], shape[1])

    def call(
        self,
        query,
        query_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        cache=None,
        cache_update_index=None,
        training=None,
        return_attention_scores=False,
        positions=None,
        padding_mask=None,
    ):
        query_mask = token_mixer.padding_mask_and(
            padding_mask, "query_mask", query_mask
        )
        query_mask, attention_mask = attention_checks.as_tensors(
            query_mask=query_mask, attention_mask=attention_mask
        )
        if query_mask is None:
            query_mask = keras_utils.keras_mask(query)
        if _kv_cache.is_own_cache(cache):  # `init_cache`'s, with its mask
            validation.check_padding_mask(
                "query_mask", query_mask, query, "query"
            )
            latent, attention_mask, _, close = _kv_cache.open_cache(
                cache,
                cache_update_index,
                _kv_cache.token_mask(query, query_mask),
                attention_mask,
                query.shape[1],
                slots_axis=1,
            )
            outputs = self.call(
                query,
                query_mask=query_mask,
                attention_mask=attention_mask,
                use_causal_mask=True,
                cache=self._bare_cache(cache, latent),
                cache_update_index=cache_update_index,
                training=training,
                return_attention_scores=return_attention_scores,
                positions=positions,
            )
            return outputs[:-1] + (self._close_cache(close, outputs[-1]),)
        cache, index_keys = self._split_cache(cache)
        self._check_call(query, query_mask, cache, cache_update_index)
        start = 0 if cache is None else cache_update_index
        if positions is not None:
            validation.check_numeric_input("positions", positions)
            positions = ops.convert_to_tensor(positions)
        q_latent = None  # The indexer's queries read it too.
        if self.indexer is not None:
            q_latent = self.q_a_layernorm(self.q_a_proj(query))
        q_nope, q_rope = self._queries(query, start, positions, q_latent)
        latent = self.latents(query, start, positions)
        key_mask = query_mask
        if cache is not None:
            cache = ops.slice_update(
                ops.cast(cache, latent.dtype), (0, start, 0), latent
            )
            latent, key_mask = cache, None
        if attention_mask is not None:
            attention_checks.check_attention_mask(
                attention_mask, query, latent, self.num_heads
            )
        masks = dict(
            attention_mask=attention_mask,
            causal=bool(use_causal_mask),
            query_offset=start,
            query_mask=masks_lib.combine_masks(query_mask),
            key_mask=masks_lib.combine_masks(key_mask),
            return_weights=bool(return_attention_scores),
        )
        if self.indexer is not None:
            masks, index_keys = self._select(
                query, q_latent, start, positions, masks, index_keys
            )
        absorb = self.absorb
        if absorb is None:
            absorb = cache is not None
        heads, weights = self._attend(
            q_nope, q_rope, latent, masks, training, absorb
        )
        shape = ops.shape(heads)
        output = self.o_proj(
            ops.reshape(
                heads, (shape[0], shape[1], self.num_heads * self.v_head_dim)
            )
        )
        outputs = (output,)
        if return_attention_scores:
            outputs += (weights,)
        if cache is not None:
            outputs += (self._cache_out(cache, index_keys),)
        return outputs[0] if len(outputs) == 1 else outputs

    def init_cache(self, batch_size, max_length, dtype=None, sink_tokens=None):
        """The layer's empty cache (`TokenMixer`) for causal decoding:
        `{"latent", "key_mask"}`, zeros `(batch, max_length, cache_dim)`
        and boolean `(batch, max_length)`. Pass it as `cache` with
        `cache_update_index`: the call is causal, its tokens' padding
        mask goes into the key mask, and it returns the updated dict.
        `dtype`: the compute dtype when None. `sink_tokens` (a ring of
        slots) is refused: MLA has no window."""
        cache = _kv_cache.init_latent_cache(
            self, batch_size, max_length, dtype, sink_tokens
        )
        return self._init_index_cache(cache, batch_size, max_length, dtype)

    def compute_mask(self, query, previous_mask=None):
        return previous_mask

    def compute_output_spec(
        self, query, cache=None, return_attention_scores=False, **kwargs
    ):
        validation.check_sequence_shape("query", query.shape, layout=_LAYOUT)
        dtype = self.compute_dtype
        outputs = (keras.KerasTensor(tuple(query.shape), dtype=dtype),)
        if return_attention_scores:
            slots = None if cache is None else keras.tree.flatten(cache)[0]
            keys = query.shape[1] if cache is None else slots.shape[1]
            shape = (query.shape[0], self.num_heads, query.shape[1], keys)
            outputs += (keras.KerasTensor(shape, dtype=dtype),)
        if cache is not None:
            outputs += (
                keras.tree.map_structure(
                    lambda c: keras.KerasTensor(tuple(c.shape), dtype=dtype),
                    cache,
                ),
            )
        return outputs[0] if len(outputs) == 1 else outputs

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook (`layers/recording.py`): the
        weights of one call `(batch, heads, T, S)`, self-attention (over
        the cache's `S` slots with a cache, whose padding is unknown)."""
        query = arguments.get("query")
        query_mask = recording.padding_mask(arguments.get("query_mask"), query)
        cached = arguments.get("cache") is not None
        meta = dict(
            kind="self",
            query_mask=query_mask,
            key_mask=None if cached else query_mask,
            causal=bool(arguments.get("use_causal_mask")),
            window=None,
        )
        return recording.numpy_weights(scores), meta

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            kv_lora_rank=self.kv_lora_rank,
            qk_nope_head_dim=self.qk_nope_head_dim,
            qk_rope_head_dim=self.qk_rope_head_dim,
            v_head_dim=self.v_head_dim,
            q_lora_rank=self.q_lora_rank,
            rope_theta=self.rope_theta,
            rope_interleave=self.rope_interleave,
            attention_bias=self.attention_bias,
            rms_norm_eps=self.rms_norm_eps,
            dropout=self.dropout,
            absorb=self.absorb,
            rotary_scaling=self.rotary_scaling,
            kernel_initializer=keras.initializers.serialize(
                self.kernel_initializer
            ),
            bias_initializer=keras.initializers.serialize(
                self.bias_initializer
            ),
            seed=self.seed,
            indexer=self._indexer_config,
        )
        return config
