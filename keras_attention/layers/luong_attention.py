import math

import keras
import numpy as np
from keras import ops

from keras_attention.layers.seq2seq_attention import Seq2SeqAttention
from keras_attention.ops import additive_scores
from keras_attention.ops import masked_softmax
from keras_attention.ops.masking import softmax_dtype
from keras_attention.ops.window_gather import gather_windows
from keras_attention.ops.window_gather import scatter_windows
from keras_attention.ops.window_gather import window_indices
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

SCORE_MODES = ("dot", "general", "concat")
ALIGNMENTS = ("global", "local-m", "local-p")


def _pad_one_step(x):
    """`(b, T, ...)` -> `(b, T + 1, ...)`, a zero step at the end."""
    pad = ops.zeros((ops.shape(x)[0], 1) + tuple(x.shape[2:]), x.dtype)
    return ops.concatenate([x, pad], axis=1)


@keras.saving.register_keras_serializable(package="keras_attention")
class LuongAttention(Seq2SeqAttention):
    """Global and local attention of Luong, Pham & Manning (2015).

    Scores of a query `h_t` (a decoder state) against source states `h_s`:

        dot:      score(h_t, h_s) = h_t . h_s
        general:  score(h_t, h_s) = h_t^T W_a h_s
        concat:   score(h_t, h_s) = v_a^T tanh(W_a [h_t; h_s])

    (`concat` runs through the memory-bounded additive scores, as
    `BahdanauAttention`), optionally scaled by `1/sqrt(d)` or a learned
    scalar. Alignments:

    - `"global"`: `a_t = softmax(score(h_t, h_s))` over all source steps.
    - `"local-m"`: only the window `[p_t - D, p_t + D]` with `p_t = t`, the
      query's own target step (`positions` gives it when decoding one step
      at a time).
    - `"local-p"`: predicted `p_t = S * sigmoid(v_p^T tanh(W_p h_t))` with
      `S` the unpadded source length; the softmax over the window is
      multiplied by `exp(-(s - p_t)^2 / (2 sigma^2))`, `sigma = D / 2`
      (so local-p weights sum to less than 1, as in the paper).

    Local alignments gather each query's `2D + 1` source steps: the cost is
    `O(Tq * D)`, no `Tq x Tv` score matrix is built (except for the dense
    weights, when they are requested). An empty memory (`Tv = 0`) gives a
    zero context and zero weights, for every alignment.

    The scores are computed in float32 (under mixed precision, the `dot`
    product `h_t . h_s` of float16 states overflows already for states of
    size ~100), then softmax-normalized in float32; a float64 layer
    computes both in float64.

    Porting from TensorFlow Addons: `tfa.seq2seq.LuongAttention(units,
    scale=True)` multiplies the `general` score by a *learned* scalar `g`
    (initially 1): that is `LuongAttention("general", scale="learned")`
    here, with the same weights (`W_a` without bias, `g`). Our
    `scale=True` is instead the fixed `1/sqrt(d)` of scaled dot-product
    attention (no weight). `tfa`'s `scale=False` is our default
    `LuongAttention("general")`.

    A `Seq2SeqAttention`: `prepare_memory` computes the keys once per
    source (`W_a h_s` for `general`), `attend` the rest (as
    `AttentionRNNDecoder` calls them, passing `positions` for `local-m`).

    Args:
        score_mode: `"dot"`, `"general"` or `"concat"`.
        units: int, hidden size of the `concat` score (required by it and
            only used by it).
        scale: False, True (a fixed `1/sqrt(d)`, `d` the query size, or
            `units` for `concat`) or `"learned"` (a trained scalar,
            initially 1). Not the meaning of TensorFlow Addons'
            `scale=True`, which is our `"learned"` (see below).
        alignment: `"global"`, `"local-m"` or `"local-p"`.
        window: int `D >= 0`, half-width of local windows (required by and
            only used by the local alignments).
        dropout: float in [0, 1), dropout on the attention weights.
        kernel_initializer: initializer of the kernels and vectors.
        kernel_regularizer: optional regularizer of the kernels.
        seed: optional int, seed of the dropout.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(batch, Tq, dq)` or `(batch, dq)` (one decoder step).
        value: `(batch, Tv, dv)`, the encoder states.
        key: optional `(batch, Tv, dk)`; defaults to `value`.
        query_mask: optional boolean `(batch, Tq)`; padded queries get zero
            weights and a zero context. Read from the Keras mask.
        value_mask: optional boolean `(batch, Tv)`. Read from the Keras mask.
        positions: `local-m` only: the target step `t` of the queries, an
            int, `(batch,)` for a one-step query, or `(Tq,)` / `(batch, Tq)`
            for a sequence. Defaults to `0, 1, ..., Tq - 1`.
        return_attention_scores: bool, also return the weights.
        training: bool, dropout on or off.

    Returns:
        The context `(batch, Tq, dv)` (or `(batch, dv)`), then, if
        requested, the weights `(batch, Tq, Tv)` (or `(batch, Tv)`).

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> attention = keras_attention.layers.LuongAttention(
    ...     "general", alignment="local-p", window=2)
    >>> h = np.ones((2, 4, 8), "float32")       # decoder states
    >>> memory = np.ones((2, 9, 6), "float32")  # encoder states
    >>> context, weights = attention(h, memory, return_attention_scores=True)
    >>> tuple(context.shape), tuple(weights.shape)
    ((2, 4, 6), (2, 4, 9))

    References:
        - Luong, Pham & Manning, 2015, "Effective Approaches to
          Attention-based Neural Machine Translation".
    """

    def __init__(
        self,
        score_mode="general",
        units=None,
        scale=False,
        alignment="global",
        window=None,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        kernel_regularizer=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        if not isinstance(score_mode, str) or score_mode not in SCORE_MODES:
            raise ValueError(
                f"`score_mode` must be one of {SCORE_MODES}. "
                f"Received: score_mode={score_mode!r}"
            )
        if score_mode == "concat":
            units = validation.check_positive_int("units", units)
        elif units is not None:
            raise ValueError(
                "`units` is only used by `score_mode='concat'`. "
                f"Received: units={units!r}, score_mode={score_mode!r}"
            )
        if isinstance(scale, (bool, np.bool_)):
            scale = bool(scale)
        elif not (isinstance(scale, str) and scale == "learned"):
            raise ValueError(
                "`scale` must be False, True or 'learned'. "
                f"Received: scale={scale!r}"
            )
        if not isinstance(alignment, str) or alignment not in ALIGNMENTS:
            raise ValueError(
                f"`alignment` must be one of {ALIGNMENTS}. "
                f"Received: alignment={alignment!r}"
            )
        if alignment == "global":
            if window is not None:
                raise ValueError(
                    "`window` is only used by local alignments. "
                    f"Received: window={window!r}, alignment='global'"
                )
        elif not validation.is_int(window) or window < 0:
            raise ValueError(
                f"`alignment={alignment!r}` needs `window`, a non-negative "
                "int D (the window is [p_t - D, p_t + D]). "
                f"Received: window={window!r}"
            )
        self.score_mode = score_mode
        self.units = units
        self.scale = scale
        self.alignment = alignment
        self.window = None if window is None else int(window)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)

    def _weight(self, name, shape, initializer=None):
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=initializer
            or keras_utils.clone_initializer(self.kernel_initializer),
            regularizer=None if initializer else self.kernel_regularizer,
        )

    def _dense(self, units, name, input_shape):
        dense = keras.layers.Dense(
            units,
            use_bias=False,
            kernel_initializer=keras_utils.clone_initializer(
                self.kernel_initializer
            ),
            kernel_regularizer=self.kernel_regularizer,
            dtype=self.dtype_policy,
            name=name,
        )
        dense.build(input_shape)
        return dense

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        super().build(query_shape, value_shape, key_shape)
        dq, dk = query_shape[-1], key_shape[-1]
        if self.score_mode == "dot" and dq != dk:
            raise ValueError(
                "`score_mode='dot'` needs queries and keys of the same size. "
                f"Received: query_shape={tuple(query_shape)}, "
                f"key_shape={tuple(key_shape)}"
            )
        if self.score_mode == "general":
            # W_a, applied to the keys once per source: k'_s = W_a h_s.
            self.key_dense = self._dense(dq, "key", key_shape)
        if self.score_mode == "concat":
            # W_a [h_t; h_s] = W_a[:dq] h_t + W_a[dq:] h_s
            self.concat_kernel = self._weight(
                "concat_kernel", (dq + dk, self.units)
            )
            self.attention_v = self._weight("attention_v", (self.units,))
        if self.scale == "learned":
            self.scale_factor = self._weight(
                "scale_factor", (), keras.initializers.Ones()
            )
        if self.alignment == "local-p":
            self.position_dense = self._dense(
                dq, "position", query_shape
            )  # W_p
            self.position_v = self._weight("position_v", (dq,))  # v_p
        self._query_dim = dq
        self.built = True

    # Scores.

    def _score_dtype(self):
        """Scores, positions and softmax in at least float32 (float64 for
        a float64 layer)."""
        return softmax_dtype(self.compute_dtype)

    def prepare_memory(self, value, key=None):
        """The keys as the score reads them: `(batch, Tv, d)`."""
        key = value if key is None else key
        if self.score_mode == "general":
            return self.key_dense(key)
        if self.score_mode == "concat":
            # float32 (float64 stays), as the query half (see
            # `_concat_query`).
            kernel = ops.cast(self.concat_kernel, self._score_dtype())
            return ops.matmul(
                ops.cast(key, self._score_dtype()), kernel[self._query_dim :]
            )
        return key

    def _scale(self, scores):
        if self.scale is True:
            d = self.units if self.score_mode == "concat" else self._query_dim
            scale = keras_utils.constant(1.0 / math.sqrt(d), scores.dtype)
            return scores * scale
        if self.scale == "learned":
            return scores * ops.cast(self.scale_factor, scores.dtype)
        return scores

    def _concat_query(self, query):
        # float32: under mixed precision, the rounding of large projections
        # that nearly cancel in `W_a[:dq] h_t + W_a[dq:] h_s` would decide
        # the (unsaturated) `tanh`s.
        kernel = ops.cast(self.concat_kernel, self._score_dtype())[
            : self._query_dim
        ]
        query = ops.cast(query, self._score_dtype())
        return keras_utils.project(lambda x: ops.matmul(x, kernel), query)

    def _global_scores(self, query, keys):
        # b - batch, i - queries, j - source steps
        if self.score_mode == "concat":
            processed = self._concat_query(query)
            v = ops.cast(self.attention_v, processed.dtype)
            return additive_scores(processed, keys, v)
        # float32 (float64 stays): the product of float16 states
        # overflows (b i j).
        return ops.einsum(
            "bid,bjd->bij",
            ops.cast(query, self._score_dtype()),
            ops.cast(keys, self._score_dtype()),
        )

    def _window_scores(self, query, keys):
        # keys: (b, i, w, d) gathered windows; s - window slots
        if self.score_mode == "concat":
            hidden = ops.tanh(self._concat_query(query)[:, :, None, :] + keys)
            v = ops.cast(self.attention_v, hidden.dtype)
            return ops.einsum("bisu,u->bis", hidden, v)
        return ops.einsum(
            "bid,bisd->bis",
            ops.cast(query, self._score_dtype()),
            ops.cast(keys, self._score_dtype()),
        )

    # Alignment positions.

    def _predicted_positions(self, query, value, value_mask):
        """p_t = S * sigmoid(v_p^T tanh(W_p h_t)), `(b, i)` in the scores'
        dtype."""
        hidden = ops.tanh(keras_utils.project(self.position_dense, query))
        v_p = ops.cast(self.position_v, hidden.dtype)
        logit = ops.einsum("bid,d->bi", hidden, v_p)
        if value_mask is None:
            length = ops.cast(ops.shape(value)[1], self._score_dtype())
        else:
            length = ops.sum(ops.cast(value_mask, self._score_dtype()), axis=1)[
                :, None
            ]
        return length * ops.sigmoid(ops.cast(logit, self._score_dtype()))

    def _monotonic_positions(self, query, positions):
        """p_t = t, `(b, i)` in the scores' dtype."""
        b, i = ops.shape(query)[0], ops.shape(query)[1]
        zeros = ops.zeros((b, i), self._score_dtype())
        if positions is None:
            return zeros + ops.cast(ops.arange(i), self._score_dtype())[None, :]
        p = ops.cast(positions, self._score_dtype())
        if len(p.shape) == 1:
            # (batch,) for a one-step query, (Tq,) for a sequence.
            p = p[:, None] if query.shape[1] == 1 else p[None, :]
        return zeros + p

    def attend(
        self,
        query,
        memory,
        value,
        value_mask=None,
        query_mask=None,
        training=None,
        positions=None,
        return_weights=True,
        **kwargs,
    ):
        if self.alignment == "global":
            scores = self._scale(self._global_scores(query, memory))
            return self.apply_scores(
                scores, value, value_mask, query_mask, training
            )

        if self.alignment == "local-m":
            p = self._monotonic_positions(query, positions)
        else:
            p = self._predicted_positions(query, value, value_mask)
        tv = ops.shape(value)[1]
        if not (isinstance(value.shape[1], int) and value.shape[1] > 0):
            # Possibly empty memory: gather from one extra zero step (never
            # valid) so that the clipped index 0 exists.
            memory, value = _pad_one_step(memory), _pad_one_step(value)
            if value_mask is not None:
                value_mask = _pad_one_step(ops.cast(value_mask, "int32"))
        width = 2 * self.window + 1
        steps = value.shape[1]
        if isinstance(steps, int) and width > steps:
            # A window wider than the (static) source: its slots are the
            # source steps (window=10**9 gathered 2 * 10**9 + 1 slots).
            width = steps
            start = ops.zeros_like(ops.cast(p, "int32"))
        else:
            start = ops.cast(ops.floor(p), "int32") - self.window  # b i
        slots, clipped, valid = window_indices(start, width, tv)  # b i s
        # s - p_t
        distance = ops.cast(slots, self._score_dtype()) - p[..., None]
        valid = ops.logical_and(valid, ops.abs(distance) <= self.window)
        if value_mask is not None:
            source_ok = gather_windows(ops.cast(value_mask, "int32"), clipped)
            valid = ops.logical_and(valid, source_ok > 0)
        if query_mask is not None:
            valid = ops.logical_and(
                valid, ops.cast(query_mask, "bool")[..., None]
            )

        scores = self._scale(
            self._window_scores(query, gather_windows(memory, clipped))
        )
        weights = masked_softmax(scores, valid)  # b i s, >= float32
        if self.alignment == "local-p":
            sigma = self.window / 2.0
            if sigma > 0:
                weights = weights * ops.exp(
                    -ops.square(distance) / (2.0 * sigma**2)
                )
        kept = ops.cast(self._dropout_weights(weights, training), value.dtype)
        context = ops.einsum(
            "bis,bisd->bid", kept, gather_windows(value, clipped)
        )
        if not return_weights:
            return context, None
        return context, scatter_windows(weights, start, tv)  # b i j

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        positions=None,
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
            positions=positions,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "score_mode": self.score_mode,
                "units": self.units,
                "scale": self.scale,
                "alignment": self.alignment,
                "window": self.window,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "kernel_regularizer": keras.regularizers.serialize(
                    self.kernel_regularizer
                ),
            }
        )
        return config
