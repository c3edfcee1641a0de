"""`LightningIndexer`: DeepSeek Sparse Attention's indexer (DeepSeek-V3.2),
which scores every earlier token for each query and names the top-k that
the attention then reads (`ops.topk_attention`).

Axes in comments: b - batch, t - queries, s - keys, h - indexer heads,
d - `head_dim`, p - `rope_head_dim`.
"""

import math

import keras
from keras import ops

from keras_attention.layers import _einsum_dense
from keras_attention.layers import _latent_rotary
from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.ops import scan_carry
from keras_attention.ops import scoring
from keras_attention.utils import attention_checks
from keras_attention.utils import keras_utils
from keras_attention.utils import norms
from keras_attention.utils import validation

_LAYOUT = "(batch, steps, features)"
NEG_INF = float("-inf")
REDUCTIONS = ("mean", "sum", "none")
# `top_k_indices`: per-head scores `(tile, heads, S)` of one query tile,
# at most this many per batch element (64 MiB in float32).
TILE_ELEMENTS = 2**24


def _check_rope_head_dim(value, head_dim):
    if value is None:
        return 2 * (head_dim // 4)
    value = validation.check_non_negative_int("rope_head_dim", value)
    if value % 2 or value > head_dim:
        raise ValueError(
            "`rope_head_dim` must be even (rotary embeddings rotate feature "
            f"pairs) and at most `head_dim` ({head_dim}). Received: "
            f"rope_head_dim={value!r}"
        )
    return value


def select_top_k(scores, allowed, top_k):
    """The top-`top_k` allowed keys of each query, ties broken toward the
    lowest position: `(indices, kept)`, `(b, t, top_k)` int32 positions in
    increasing order (-1 in the slots of a query with fewer than `top_k`
    allowed keys) and the same as a bool mask `(b, t, s)`.

    `scores` `(b, t, s)` (float), `allowed` bool `(b, t, s)`. The `k`-th
    largest allowed score `v` is found (`ops.top_k`); the keys above it
    are kept, and of those equal to it the first ones in position order
    (a cumulative count), whatever order a backend's `top_k` breaks ties
    in. A second `top_k` on `s - position` of the kept keys then lists
    their positions."""
    length = ops.shape(scores)[-1]
    pad = top_k if scores.shape[-1] is None else max(top_k - length, 0)
    if pad:  # Fewer keys than `top_k` (or unknown): unselectable columns.
        shape = ops.shape(scores)[:2] + (pad,)
        scores = ops.concatenate([scores, ops.zeros(shape, scores.dtype)], -1)
        allowed = ops.concatenate([allowed, ops.zeros(shape, "bool")], -1)
    dtype = scoring.softmax_dtype(scores.dtype)
    scores = ops.cast(scores, dtype)
    low = ops.full_like(scores, NEG_INF)
    kth = ops.top_k(ops.where(allowed, scores, low), top_k)[0][..., -1:]
    above = ops.logical_and(allowed, scores > kth)
    ties = ops.logical_and(allowed, scores == kth)
    need = top_k - ops.sum(ops.cast(above, "int32"), axis=-1, keepdims=True)
    rank = ops.cumsum(ops.cast(ties, "int32"), axis=-1)
    kept = ops.logical_or(above, ops.logical_and(ties, rank <= need))
    s = ops.shape(scores)[-1]
    order = ops.cast(s - ops.arange(s, dtype="int32"), "float32")
    values, positions = ops.top_k(
        ops.where(kept, order, ops.zeros_like(order)), top_k
    )
    positions = ops.cast(positions, "int32")
    indices = ops.where(values > 0, positions, ops.full_like(positions, -1))
    return indices, kept[..., :length] if pad else kept


def selection_mask(indices, length):
    """Bool `(b, t, length)`, True at the positions `indices` `(b, t, k)`
    names (-1: none), by one scatter: O(b t length) memory, nothing of
    `(b, t, k, length)`."""
    indices = ops.cast(indices, "int32")
    b, t, k = ops.shape(indices)
    column = ops.where(indices >= 0, indices, ops.full_like(indices, length))
    rows = ops.broadcast_to(
        ops.arange(b, dtype="int32")[:, None, None], (b, t, k)
    )
    steps = ops.broadcast_to(
        ops.arange(t, dtype="int32")[None, :, None], (b, t, k)
    )
    coordinates = ops.reshape(ops.stack([rows, steps, column], -1), (-1, 3))
    ones = ops.ones((b * t * k,), "int32")
    hits = ops.scatter(coordinates, ones, (b, t, length + 1))
    return hits[..., :length] > 0


@keras.saving.register_keras_serializable(package="keras_attention")
class LightningIndexer(keras.layers.Layer):
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2).

    A few small heads score every key `s` for each query `t`, and each
    query keeps its `top_k` best keys, which the attention then reads
    (`keras_attention.ops.topk_attention`):

        q[t, j] = RoPE(query_inputs[t] W_q)[j]       (per head j)
        k[s] = RoPE(LayerNorm(inputs[s] W_k))         (shared by the heads)
        w[t, j] = (inputs[t] W_w)[j] / sqrt(num_heads)
        I[t, s] = sum_j w[t, j] ReLU(q[t, j] . k[s] / sqrt(head_dim))

    RoPE rotates the first `rope_head_dim` features of queries and keys
    in halves (`(x_i, x_{i + p/2})`, the indexer's layout in DeepSeek's
    code); the others pass unrotated. The weights are named and shaped as
    `transformers`' `DeepseekV32Indexer` (a `Dense` kernel is the
    `nn.Linear` weight transposed): `wq_b` (`num_heads * head_dim` units,
    no bias), `wk` (`head_dim`, no bias), `k_norm` (a `LayerNormalization`
    of epsilon `layer_norm_epsilon`, its gamma and beta the torch
    weight and bias), `weights_proj` (`num_heads`, no bias; applied in
    float32 at least under every dtype policy, as `transformers` keeps
    it in float32). The scores are float32 (float64 for float64
    inputs).

    Selection: a query keeps the `top_k` largest `I[t, s]` among the keys
    it may select (earlier or equal positions with `use_causal_mask`, real
    tokens, `attention_mask`); equal scores are kept lowest position
    first (DeepSeek's ReLU gives exact ties, zeros, when few heads are
    all negative); a query with fewer allowed keys keeps all of them.

    Inside `MultiHeadLatentAttention(indexer={...})` its queries read the
    query latent `q_a_layernorm(q_a_proj(x))` (`query_inputs`) and its
    rotary positions are the attention's; it can be used alone, over any
    sequence (`query_inputs` defaults to `inputs`). Training: the top-k
    choice has no gradient; the indexer learns from `distillation_loss`
    (DeepSeek-V3.2's warm-up against the dense attention).

    Args:
        num_heads: int, the indexer heads (DeepSeek-V3.2: 64).
        head_dim: int, their size (DeepSeek-V3.2: 128).
        top_k: int, keys kept per query (DeepSeek-V3.2: 2,048).
        rope_head_dim: even int <= `head_dim`, the rotated features (the
            attention's `qk_rope_head_dim`, 64 in DeepSeek-V3.2; 0: no
            positions); None (default): half of `head_dim`, even.
        rope_theta: finite number >= 1, the rotary base. Defaults to
            10000.
        rotary_scaling: optional dict, `MultiHeadLatentAttention`'s
            `rotary_scaling` (`RotaryEmbedding`'s scaling arguments and
            DeepSeek's YaRN `mscale`, `mscale_all_dim`): the cos and sin
            are the attention's.
        layer_norm_epsilon: float > 0, `k_norm`'s epsilon (1e-6).
        kernel_initializer: initializer of the projection kernels.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, T, hidden)`, the sequence: the keys and the
            heads' weights are read from it.
        query_inputs: optional `(batch, T, features)`, what the queries
            are projected from (`inputs` when None).
        padding_mask: optional bool `(batch, T)`: a False token is never
            selected and, as a query, selects nothing; read from the
            inputs' Keras mask when omitted.
        attention_mask: optional bool `(T, S)` or `(batch, T, S)`, True
            where a key may be selected.
        use_causal_mask: bool, query `t` selects among keys `s <= t`
            (positions counted from `cache_update_index`). Defaults to
            True.
        positions: optional integer `(batch, T)` or `(T,)`, the rotary
            positions (default: `cache_update_index + arange(T)`).
        cache: optional key cache `(batch, max_length, head_dim)`, with
            `cache_update_index`: this call's keys are written there and
            the queries score every slot (`S = max_length`; mask unfilled
            or padded slots with `use_causal_mask` and `attention_mask`).
        cache_update_index: int or scalar int tensor, the position of
            this call's first token.

    Returns:
        `(scores, indices)`, then the updated cache when one is given:
        the index scores `I` `(batch, T, S)` (float32, `-inf` where a key
        may not be selected) and the kept keys `(batch, T, top_k)`, int32
        positions in increasing order, -1 in unused slots.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> indexer = keras_attention.layers.LightningIndexer(
    ...     num_heads=2, head_dim=8, top_k=3)
    >>> x = np.random.default_rng(0).normal(size=(1, 5, 16)).astype("float32")
    >>> scores, indices = indexer(x)
    >>> tuple(scores.shape), tuple(indices.shape)
    ((1, 5, 5), (1, 5, 3))
    >>> np.asarray(indices)[0, :2].tolist()  # fewer than 3 earlier keys
    [[0, -1, -1], [0, 1, -1]]

    References:
        - DeepSeek-AI, 2025, "DeepSeek-V3.2: Pushing the Frontier of Open
          Large Language Models" (DeepSeek Sparse Attention, section 2).
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        top_k,
        rope_head_dim=None,
        rope_theta=10000.0,
        rotary_scaling=None,
        layer_norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        positive = validation.check_positive_int
        self.num_heads = positive("num_heads", num_heads)
        self.head_dim = positive("head_dim", head_dim)
        self.top_k = positive("top_k", top_k)
        self.rope_head_dim = _check_rope_head_dim(rope_head_dim, self.head_dim)
        self.rope_theta = float(
            validation.check_positive_number(
                "rope_theta", rope_theta, minimum=1
            )
        )
        self.rotary_scaling = _latent_rotary.check_rotary_scaling(
            rotary_scaling, self.rope_theta
        )
        if self.rotary_scaling is not None and not self.rope_head_dim:
            raise ValueError(
                "`rotary_scaling` scales the rotary positions, which "
                "`rope_head_dim=0` turns off. Received: rotary_scaling="
                f"{rotary_scaling!r}, rope_head_dim=0"
            )
        self._rope_correction = _latent_rotary.yarn_factors(
            self.rotary_scaling
        )[0]
        self.layer_norm_epsilon = float(
            validation.check_positive_number(
                "layer_norm_epsilon", layer_norm_epsilon
            )
        )
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._rotary = RotaryEmbedding(
            max_wavelength=self.rope_theta,
            **_latent_rotary.rotary_arguments(self.rotary_scaling),
            dtype=self.dtype_policy,
            name="rotary_embedding",
        )
        self.supports_masking = True  # the Keras mask is the padding

    def _dense(self, units, name, input_dim):
        dense = _einsum_dense.Dense(
            units,
            use_bias=False,
            kernel_initializer=keras_utils.clone_initializer(
                self.kernel_initializer
            ),
            dtype=self.dtype_policy,
            name=name,
        )
        dense.build((None, None, input_dim))
        return dense

    def build(self, inputs_shape, query_inputs_shape=None):
        hidden = validation.check_sequence_shape(
            "inputs", inputs_shape, layout=_LAYOUT
        )
        features = hidden
        if query_inputs_shape is not None:
            features = validation.check_sequence_shape(
                "query_inputs", query_inputs_shape, layout=_LAYOUT
            )
        self._hidden, self._features = hidden, features
        units = self.num_heads * self.head_dim
        self.wq_b = self._dense(units, "wq_b", features)
        self.wk = self._dense(self.head_dim, "wk", hidden)
        self.k_norm = norms.LayerNormalization(
            epsilon=self.layer_norm_epsilon,
            dtype=self.dtype_policy,
            name="k_norm",
        )
        self.k_norm.build((None, None, self.head_dim))
        # Applied in float32 at least (`index_scores`), as `transformers`
        # keeps it in float32.
        self.weights_proj = self._dense(self.num_heads, "weights_proj", hidden)
        self.built = True

    # Pieces (`MultiHeadLatentAttention` calls them too) -------------------

    def _rope(self, x, start, positions):
        """Rotary positions on the first `rope_head_dim` features of `x`
        `(b, t, heads, d)` (halves), from `start` or at `positions`."""
        p = self.rope_head_dim
        if not p:
            return x
        rotated = self._rotary(
            x[..., :p], start_index=start, positions=positions
        )
        if self._rope_correction != 1.0:
            rotated = ops.multiply(
                rotated, keras_utils.constant(self._rope_correction, x.dtype)
            )
        return ops.concatenate([ops.cast(rotated, x.dtype), x[..., p:]], -1)

    def keys(self, inputs, start=0, positions=None):
        """The keys of `inputs`' tokens `(b, t, head_dim)` (what a cache
        holds), rotary positions from `start` (or `positions`)."""
        k = self.k_norm(self.wk(inputs))
        return self._rope(k[:, :, None], start, positions)[:, :, 0]

    def queries(self, query_inputs, start=0, positions=None):
        """The queries `(b, t, num_heads, head_dim)`, rotated."""
        q = self.wq_b(query_inputs)
        shape = ops.shape(q)
        q = ops.reshape(q, (shape[0], shape[1], self.num_heads, self.head_dim))
        return self._rope(q, start, positions)

    def index_scores(self, inputs, queries, keys, allowed):
        """`I[t, s]` `(b, t, s)` in float32 (float64 for float64 inputs),
        `-inf` where `allowed` `(b|1, t, s)` is False; `inputs` `(b, t,
        hidden)` give the heads' weights."""
        dtype = scoring.softmax_dtype(queries.dtype)
        q, k = ops.cast(queries, dtype), ops.cast(keys, dtype)
        dots = ops.einsum("bthd,bsd->bths", q, k)
        scale = keras_utils.constant(1.0 / math.sqrt(self.head_dim), dtype)
        dots = ops.relu(dots * scale)
        with scoring.full_precision_variables():  # the float32 kernel
            kernel = ops.cast(self.weights_proj.kernel, dtype)
        # An einsum: Keras's torch `matmul` computes float64 in float32.
        w = ops.einsum("btc,ch->bth", ops.cast(inputs, dtype), kernel)
        w = w * keras_utils.constant(1.0 / math.sqrt(self.num_heads), dtype)
        scores = ops.einsum("bths,bth->bts", dots, w)
        return ops.where(allowed, scores, ops.full_like(scores, NEG_INF))

    def top_k_indices(self, inputs, queries, keys, allowed, query_block=None):
        """`select_top_k` of `index_scores` computed a tile of queries at a
        time (no gradient: positions), so that the per-head scores `(b,
        tile, heads, S)` of one tile are alive at once, not those of every
        query: `(b, t, top_k)`. `query_block`: queries per tile (None:
        the largest power of two within `TILE_ELEMENTS`); the results do
        not depend on it. A length unknown when tracing runs whole."""
        t, s = queries.shape[1], keys.shape[1]
        if query_block is None and None not in (t, s):
            query_block, per_row = 1, self.num_heads * max(s, 1)
            while (
                query_block < t and 2 * query_block * per_row <= TILE_ELEMENTS
            ):
                query_block *= 2
        if t is None or query_block is None or query_block >= t:
            scores = self.index_scores(inputs, queries, keys, allowed)
            return select_top_k(scores, allowed, self.top_k)[0]
        n = -(-t // query_block)
        xs = []
        for x in (inputs, queries, allowed):
            pad = (ops.shape(x)[0], n * query_block - t) + tuple(x.shape[2:])
            x = ops.concatenate([x, ops.zeros(pad, x.dtype)], axis=1)
            shape = (ops.shape(x)[0], n, query_block) + tuple(x.shape[2:])
            xs.append(ops.moveaxis(ops.reshape(x, shape), 1, 0))

        def body(carry, x):
            del carry
            scores = self.index_scores(x[0], x[1], keys, x[2])
            indices = select_top_k(scores, x[2], self.top_k)[0]
            return indices, indices

        init = ops.zeros(
            (ops.shape(queries)[0], query_block, self.top_k), "int32"
        )
        _, tiles = scan_carry(body, init, tuple(xs))
        tiles = ops.moveaxis(tiles, 0, 1)
        shape = (ops.shape(tiles)[0], n * query_block, self.top_k)
        return ops.reshape(tiles, shape)[:, :t]

    # Call -----------------------------------------------------------------

    def allowed_keys(self, query, keys, start, causal, padding, mask, cached):
        """The keys each query `(b, t, .)` may select among `keys` `(b, s,
        .)`: bool `(b, t, s)` (`causal` from position `start`, `padding`
        `(b, t)` on the queries and, uncached, on the keys, `mask` `(b|1,
        t, s)`)."""
        t, s = ops.shape(query)[1], ops.shape(keys)[1]
        allowed = ops.ones((ops.shape(query)[0], t, s), "bool")
        if causal:
            i = ops.arange(t, dtype="int32")[:, None] + ops.cast(start, "int32")
            allowed = ops.logical_and(allowed, ops.arange(s)[None] <= i)
        if mask is not None:
            mask = ops.cast(mask, "bool")
            allowed = ops.logical_and(allowed, mask)
        if padding is not None:
            padding = ops.cast(padding, "bool")
            allowed = ops.logical_and(allowed, padding[:, :, None])
            if not cached:
                allowed = ops.logical_and(allowed, padding[:, None, :])
        return allowed

    def call(
        self,
        inputs,
        query_inputs=None,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=True,
        positions=None,
        cache=None,
        cache_update_index=None,
    ):
        padding_mask, attention_mask, positions = attention_checks.as_tensors(
            padding_mask=padding_mask,
            attention_mask=attention_mask,
            positions=positions,
        )
        if padding_mask is None:
            padding_mask = keras_utils.keras_mask(inputs)
        validation.check_call_input("inputs", inputs, self._hidden, (3,))
        if query_inputs is not None:
            validation.check_call_input(
                "query_inputs", query_inputs, self._features, (3,)
            )
            want, got = tuple(inputs.shape[:2]), tuple(query_inputs.shape[:2])
            if any(None not in (a, b) and a != b for a, b in zip(want, got)):
                raise ValueError(
                    "`query_inputs` must have the batch and steps of "
                    f"`inputs`, {want!r} (one query per token). Received: "
                    f"query_inputs.shape={tuple(query_inputs.shape)!r}"
                )
        elif self._features != self._hidden:
            raise ValueError(
                "This indexer was built for `query_inputs` of "
                f"{self._features} features: pass them. Received: "
                "query_inputs=None"
            )
        validation.check_padding_mask("padding_mask", padding_mask, inputs)
        use_causal_mask = validation.check_bool(
            "use_causal_mask", use_causal_mask
        )
        if (cache is None) != (cache_update_index is None):
            raise ValueError(
                "`cache` and `cache_update_index` go together. Received: "
                f"cache={None if cache is None else 'a tensor'}, "
                f"cache_update_index={cache_update_index!r}"
            )
        start = 0 if cache is None else cache_update_index
        if cache is not None:
            attention_checks.check_cache_batch("cache", cache, inputs, "inputs")
            attention_checks.check_cache_index(
                start, inputs.shape[1], cache.shape[1]
            )
        queries = self.queries(
            inputs if query_inputs is None else query_inputs, start, positions
        )
        keys = self.keys(inputs, start, positions)
        if cache is not None:
            cache = ops.slice_update(
                ops.cast(cache, keys.dtype), (0, start, 0), keys
            )
            keys = cache
        if attention_mask is not None:
            attention_checks.check_attention_mask(
                attention_mask, inputs, keys, 1
            )
            if len(attention_mask.shape) == 4:
                attention_mask = attention_mask[:, 0]
        allowed = self.allowed_keys(
            inputs,
            keys,
            start,
            use_causal_mask,
            padding_mask,
            attention_mask,
            cache is not None,
        )
        scores = self.index_scores(inputs, queries, keys, allowed)
        indices, _ = select_top_k(scores, allowed, self.top_k)
        if cache is None:
            return scores, indices
        return scores, indices, cache

    def compute_mask(self, inputs, previous_mask=None):
        return None  # scores and positions: no sequence of the inputs'

    def compute_output_spec(self, inputs, cache=None, **kwargs):
        b, t = inputs.shape[0], inputs.shape[1]
        s = t if cache is None else cache.shape[1]
        dtype = scoring.softmax_dtype(self.compute_dtype)
        outputs = (
            keras.KerasTensor((b, t, s), dtype=dtype),
            keras.KerasTensor((b, t, self.top_k), dtype="int32"),
        )
        if cache is not None:
            outputs += (keras.KerasTensor(tuple(cache.shape), cache.dtype),)
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            top_k=self.top_k,
            rope_head_dim=self.rope_head_dim,
            rope_theta=self.rope_theta,
            rotary_scaling=self.rotary_scaling,
            layer_norm_epsilon=self.layer_norm_epsilon,
            kernel_initializer=keras.initializers.serialize(
                self.kernel_initializer
            ),
        )
        return config

    @staticmethod
    def distillation_loss(
        index_scores, attention_weights, indices=None, reduction="mean"
    ):
        """DeepSeek-V3.2's KL loss that trains the indexer on the dense
        attention: for each query `t`, the target `p_t` is the attention
        weights summed over the heads and L1-normalized over the keys,
        and the loss `KL(p_t || softmax(I_t))`.

        Warm-up stage (dense attention, `indices` None): over every key
        the indexer may select (`index_scores` finite). Sparse stage
        (`indices`, the kept keys): both distributions restricted to the
        kept keys. The target carries no gradient (`stop_gradient`): the
        attention is the teacher; DeepSeek also detaches the indexer's
        inputs from the model's graph, which is the caller's choice (pass
        `ops.stop_gradient` of them to the indexer).

        Args:
            index_scores: `(batch, T, S)`, the indexer's scores (`-inf`
                where a key may not be selected).
            attention_weights: `(batch, heads, T, S)` weights of the
                attention (e.g. `return_attention_scores=True`), or
                `(batch, T, S)` already summed over the heads.
            indices: optional `(batch, T, k)` kept keys (-1: none).
            reduction: "mean" (over the queries with a target), "sum"
                (over the queries, the paper's `sum_t`, averaged over the
                batch) or "none" (`(batch, T)`).

        Returns:
            A float32 scalar (float64 for float64 inputs), or `(batch, T)`
            with `reduction="none"`; a query with no key scores 0.
        """
        if reduction not in REDUCTIONS:
            raise ValueError(
                f"`reduction` must be one of {REDUCTIONS}. Received: "
                f"reduction={reduction!r}"
            )
        index_scores, attention_weights, indices = attention_checks.as_tensors(
            index_scores=index_scores,
            attention_weights=attention_weights,
            indices=indices,
        )
        dtype = scoring.softmax_dtype(index_scores.dtype)
        scores = ops.cast(index_scores, dtype)
        target = ops.stop_gradient(ops.cast(attention_weights, dtype))
        if len(target.shape) == 4:
            target = ops.sum(target, axis=1)
        if len(target.shape) != 3 or len(scores.shape) != 3:
            raise ValueError(
                "`distillation_loss` takes index_scores (batch, T, S) and "
                "attention_weights (batch, heads, T, S) or (batch, T, S). "
                f"Received: index_scores.shape={tuple(scores.shape)}, "
                f"attention_weights.shape={tuple(attention_weights.shape)}"
            )
        _check_same_shape(
            "attention_weights", attention_weights, target, scores, 3
        )
        valid = scores > NEG_INF
        if indices is not None:
            dtype = keras.backend.standardize_dtype(indices.dtype)
            if "int" not in dtype:
                raise TypeError(
                    "`indices` must hold integer positions. Received: "
                    f"indices.dtype={dtype!r}"
                )
            _check_same_shape("indices", indices, indices, scores, 2)
            indices = ops.cast(indices, "int32")
            length = ops.shape(scores)[-1]
            kept = ops.logical_and(indices >= 0, indices < length)
            at = ops.where(kept, indices, ops.zeros_like(indices))
            scores = ops.take_along_axis(scores, at, axis=-1)
            target = ops.take_along_axis(target, at, axis=-1)
            valid = ops.logical_and(
                kept, ops.take_along_axis(valid, at, axis=-1)
            )
        return _kl(scores, target, valid, reduction)


def _check_same_shape(name, given, tensor, scores, axes):
    """The first `axes` axes of `tensor` (`given`, as passed, or what it
    became) must be those of `scores` `(batch, T, S)` (static sizes;
    unknown ones pass): broadcasting would pair other queries or keys."""
    want = tuple(scores.shape[:axes])
    got = tuple(tensor.shape[:axes])
    if len(got) < axes or any(
        None not in (a, b) and a != b for a, b in zip(want, got)
    ):
        what = (
            "(batch, T, S), summed over the heads"
            if axes == 3
            else "(batch, T)"
        )
        raise ValueError(
            f"`{name}` must match the index scores on {what}: {want!r}. "
            f"Received: {name}.shape={tuple(given.shape)!r}"
        )


def _kl(scores, target, valid, reduction):
    """`KL(p || softmax(scores))` per row over `valid`, `p` the target
    L1-normalized there; then reduced."""
    zero = ops.zeros_like(scores)
    target = ops.where(valid, ops.abs(target), zero)
    total = ops.sum(target, axis=-1, keepdims=True)
    rows = total[..., 0] > 0
    p = target / ops.where(total > 0, total, ops.ones_like(total))
    safe = ops.where(valid, scores, zero)
    fill = zero + scoring.mask_fill_value(scores.dtype)
    masked = ops.where(valid, scores, fill)
    m = ops.max(masked, axis=-1, keepdims=True)
    log_z = m + ops.log(
        ops.sum(ops.where(valid, ops.exp(masked - m), zero), -1, keepdims=True)
    )
    log_p = ops.log(ops.where(p > 0, p, ops.ones_like(p)))
    terms = ops.where(p > 0, p * (log_p - (safe - log_z)), zero)
    loss = ops.where(rows, ops.sum(terms, axis=-1), zero[..., 0])
    if reduction == "none":
        return loss
    if reduction == "sum":
        return ops.mean(ops.sum(loss, axis=-1))
    count = ops.sum(ops.cast(rows, loss.dtype))
    return ops.sum(loss) / ops.maximum(count, ops.ones_like(count))
