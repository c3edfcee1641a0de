"""DeBERTa's disentangled attention as a score object: the
content-to-position and position-to-content terms of log-bucketed
relative positions (`DisentangledRelativeBias`, `log_bucket_index`)."""

import math

import keras
import numpy as np
from keras import ops

from keras_attention.mods.base import PACKAGE
from keras_attention.mods.base import ScoreLayer
from keras_attention.ops import broadcast_add
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import validation

# Distances beyond which a configuration's buckets would need a table of
# more rows are refused (`_saturation`): no real DeBERTa comes near.
_MAX_TABLE_DISTANCE = 2**24


def _check_buckets(bucket_size, max_distance):
    """`(bucket_size, max_distance)` checked: `ValueError` naming the
    argument where DeBERTa's log buckets are undefined (no exact bucket,
    or `log((max_distance - 1) / (bucket_size // 2))` not positive)."""
    size = validation.check_positive_int("bucket_size", bucket_size)
    if size < 2:
        raise ValueError(
            "`bucket_size` must be at least 2 (the exact distances are "
            f"those below bucket_size // 2). Received: bucket_size={size!r}"
        )
    distance = validation.check_positive_int("max_distance", max_distance)
    if distance - 1 <= size // 2:
        raise ValueError(
            "`max_distance - 1` must exceed `bucket_size // 2` (the log "
            "buckets span the distances between them). Received: "
            f"max_distance={distance!r}, bucket_size={size!r}"
        )
    return size, distance


def _buckets(distance, bucket_size, max_distance):
    """DeBERTa's log bucket of each distance `>= 0` (NumPy int64): the
    distance itself up to `mid = bucket_size // 2`, beyond `mid +
    ceil(log(d / mid) * (mid - 1) / log((max_distance - 1) / mid))`, in
    float32 in keras-hub's order (`make_log_bucket_position`); the log is
    float32's correctly rounded one (TensorFlow's and PyTorch's)."""
    distance = np.asarray(distance, "int64")
    mid = bucket_size // 2
    f32 = np.float32
    abs_pos = np.where(distance < mid, mid - 1, distance)
    ratio = abs_pos.astype("float32") / f32(mid)
    with np.errstate(divide="ignore", invalid="ignore"):
        log = np.log(ratio.astype("float64")).astype("float32")
        numerator = log * f32(mid - 1)
        denominator = f32(np.log(np.float64(f32(max_distance - 1) / f32(mid))))
        log_pos = np.ceil(numerator / denominator)
    log_pos = np.nan_to_num(log_pos).astype("int64") + mid
    return np.where(abs_pos <= mid, distance, log_pos)


def _saturation(bucket_size, max_distance):
    """The smallest distance from which every bucket is at least
    `bucket_size` (the rows of the table are clipped there: farther
    positions share the first or the last row)."""
    mid = bucket_size // 2
    if mid == 1:  # every distance past 1 has bucket 1
        return 2

    def saturated(d):
        return _buckets([d], bucket_size, max_distance)[0] >= bucket_size

    high = mid + 1
    while not saturated(high):
        high *= 2
        if high > _MAX_TABLE_DISTANCE:
            raise ValueError(
                "DeBERTa's log buckets of these arguments reach "
                f"`bucket_size` only past {_MAX_TABLE_DISTANCE} positions. "
                f"Received: bucket_size={bucket_size!r}, "
                f"max_distance={max_distance!r}"
            )
    low = high // 2  # not saturated
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if saturated(middle) else (middle, high)
    return high


def _index_table(bucket_size, max_distance):
    """`(table, reach)`: the row of the relative embedding table of each
    relative position `-reach .. reach` (NumPy int32, at `table[r +
    reach]`); farther positions share the end rows."""
    reach = _saturation(bucket_size, max_distance)
    relative = np.arange(-reach, reach + 1)
    bucket = np.sign(relative) * _buckets(
        np.abs(relative), bucket_size, max_distance
    )
    rows = np.clip(bucket + bucket_size, 0, 2 * bucket_size - 1)
    return rows.astype("int32"), reach


def log_bucket_index(relative_position, bucket_size=256, max_distance=512):
    """DeBERTa's row of the relative embedding table for each relative
    position `q_idx - kv_idx` (int32 in `[0, 2 * bucket_size)`).

    The log bucket of the position (itself within `bucket_size // 2`,
    log-spaced beyond, reaching `bucket_size // 2 + ...` at
    `max_distance`; keras-hub's and Hugging Face's
    `make_log_bucket_position`) plus `bucket_size`, clipped to the table:
    the index DeBERTa's content-to-position and position-to-content terms
    read (`DisentangledRelativeBias`). The same on every backend (a
    table built in NumPy).

    Args:
        relative_position: integer tensor of `q_idx - kv_idx`.
        bucket_size: int >= 2, DeBERTa's `position_buckets` (256).
        max_distance: int, DeBERTa's `max_relative_positions` (512; more
            than `bucket_size // 2 + 1`).

    Example:

    >>> import numpy as np
    >>> from keras_attention.scores import log_bucket_index
    >>> np.asarray(log_bucket_index(
    ...     np.array([-40, -7, -3, 0, 3, 7, 40]), bucket_size=6,
    ...     max_distance=16)).tolist()
    [0, 1, 3, 6, 9, 11, 11]
    """
    bucket_size, max_distance = _check_buckets(bucket_size, max_distance)
    table, reach = _index_table(bucket_size, max_distance)
    relative = ops.convert_to_tensor(relative_position, "int32")
    return ops.take(table, ops.clip(relative, -reach, reach) + reach)


@keras.saving.register_keras_serializable(package=PACKAGE)
class DisentangledRelativeBias(ScoreLayer):
    """DeBERTa's disentangled attention: the content-to-position and
    position-to-content terms added to the content scores.

    `score + (q_i . pk[r] + k_j . pq[r]) / sqrt(head_dim)` with `r =
    log_bucket_index(i - j)`: `q`, `k` the attention's (projected) query
    and key heads, `pq`, `pk` its query and key projections of the rows
    of a relative embedding table `(2 * bucket_size, embedding_dim)`
    (DeBERTa-v3: projected by the attention's own query and key
    projections). Divided by `sqrt(head_dim)` as the content score
    `q . k / sqrt(head_dim)` is: a layer that scales its queries (DeBERTa's
    `1 / sqrt(3 head_dim)`, `attention_scale`) scales `pq` the same way.

    A layer holding the table and its layer norm (DeBERTa's
    `rel_embeddings` and `LayerNorm`), shared by every attention layer of
    a stack as DeBERTa shares them (give the same object to every layer;
    it is one weight, saved once). Each call binds the heads
    (`bind(query=, key=, position_query=, position_key=)`);
    `layers.DisentangledSelfAttention` binds them itself, from its own
    projections of `position_embeddings()`. The terms of every query are
    formed once per call, `(batch, heads, T, 2 * bucket_size)`, and read
    per tile on every path (dense, blockwise: their gradient reaches the
    heads, hence the table, through the bound tensors).

    Args:
        embedding_dim: int, the size of the table's rows (the attention's
            input features).
        bucket_size: int >= 2, DeBERTa's `position_buckets` (256).
        max_distance: int, DeBERTa's `max_relative_positions` (512).
        layer_norm_epsilon: float, the table's layer norm, or None for
            none.
        embeddings_initializer: initializer of the table.

    Call-time inputs (`bind`): `query` `(batch, Tq, heads, head_dim)`,
    `key` `(batch, Tk, kv_heads, head_dim)` (repeated to `heads`),
    `position_query` `(2 * bucket_size, heads, head_dim)` and
    `position_key` `(2 * bucket_size, kv_heads, head_dim)`. Rows of
    `query` are queries `0 .. Tq - 1` (no cache offset), rows of `key`
    keys `0 .. Tk - 1`.

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> import keras_attention as ka
    >>> bias = ka.scores.DisentangledRelativeBias(
    ...     embedding_dim=8, bucket_size=4, max_distance=16)
    >>> bias.build()
    >>> table = bias.position_embeddings()  # (8, 8): 2 * bucket_size rows
    >>> w_q, w_k = np.ones((2, 8, 2, 4), "float32") * 0.1  # (e, h, d)
    >>> q = k = v = np.ones((1, 5, 2, 4), "float32")
    >>> scores = bias.bind(
    ...     query=q, key=k,
    ...     position_query=ops.einsum("re,ehd->rhd", table, w_q),
    ...     position_key=ops.einsum("re,ehd->rhd", table, w_k))
    >>> out = ka.ops.dot_product_attention(q, k, v, score_mod=scores)
    >>> tuple(out.shape)
    (1, 5, 2, 4)

    References:
        - He et al., 2021, "DeBERTa: Decoding-enhanced BERT with
          Disentangled Attention".
        - He et al., 2023, "DeBERTaV3: Improving DeBERTa using
          ELECTRA-Style Pre-Training with Gradient-Disentangled Embedding
          Sharing".
    """

    inputs = ("query", "key", "position_query", "position_key")

    def __init__(
        self,
        embedding_dim,
        bucket_size=256,
        max_distance=512,
        layer_norm_epsilon=1e-7,
        embeddings_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.embedding_dim = validation.check_positive_int(
            "embedding_dim", embedding_dim
        )
        self.bucket_size, self.max_distance = _check_buckets(
            bucket_size, max_distance
        )
        self.layer_norm_epsilon = validation.check_positive_number(
            "layer_norm_epsilon", layer_norm_epsilon, allow_none=True
        )
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
        )
        self.layer_norm = None
        if self.layer_norm_epsilon is not None:
            self.layer_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon,
                dtype=self.dtype_policy,
                name="layer_norm",
            )
        self._rows, self._reach = _index_table(
            self.bucket_size, self.max_distance
        )

    def build(self, num_heads=None):
        # The table does not depend on the heads: each attention layer
        # projects it to its own.
        self.embeddings = self.add_weight(
            shape=(2 * self.bucket_size, self.embedding_dim),
            initializer=self.embeddings_initializer,
            name="embeddings",
        )
        if self.layer_norm is not None:
            self.layer_norm.build((2 * self.bucket_size, self.embedding_dim))
        self.built = True

    def position_embeddings(self):
        """The table after its layer norm, `(2 * bucket_size,
        embedding_dim)`: what the attention projects to `position_query`
        and `position_key`."""
        if not self.built:
            self.build()
        table = ops.convert_to_tensor(self.embeddings)
        if self.layer_norm is not None:
            table = self.layer_norm(table)
        return table

    def _bind(self, query, key, position_query, position_key):
        return _BoundDisentangled(
            self, query, key, position_query, position_key
        )

    def score_fn(self, score, batch, head, q_idx, kv_idx):
        raise ValueError(
            "DisentangledRelativeBias needs the attention's heads: bind "
            "them (`bias.bind(query=..., key=..., position_query=..., "
            "position_key=...)`) or give it to a "
            "`layers.DisentangledSelfAttention`. Received: an unbound "
            f"call with scores of shape {tuple(score.shape)!r}"
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            embedding_dim=self.embedding_dim,
            bucket_size=self.bucket_size,
            max_distance=self.max_distance,
            layer_norm_epsilon=self.layer_norm_epsilon,
            embeddings_initializer=keras.initializers.serialize(
                self.embeddings_initializer
            ),
        )
        return config


class _BoundDisentangled:
    """`DisentangledRelativeBias` for one call: the content-to-position
    terms of every query and relative row `(batch, heads, Tq, rows)` and
    the position-to-content terms of every key `(batch, heads, Tk, rows)`,
    flattened; per tile, one gather of each. A plain object (not a
    layer), so that the blockwise path finds the tensors it holds and
    differentiates them."""

    def __init__(self, bias, query, key, position_query, position_key):
        query, key = _heads("query", query), _heads("key", key)
        position_query = _positions("position_query", position_query, bias)
        position_key = _positions("position_key", position_key, bias)
        heads, head_dim = query.shape[2], query.shape[3]
        groups = _groups("key", key, heads)
        _same_heads("position_query", position_query, heads)
        _same_heads("position_key", position_key, key.shape[2])
        dtype = softmax_dtype(query.dtype)
        # Grouped keys: query head `h` reads key head `h // groups` (as
        # `ops.repeat` would), through a group axis (ranks <= 5; no
        # repeated copies).
        batch, q_length = ops.shape(query)[0], ops.shape(query)[1]
        kv_length = ops.shape(key)[1]
        rows = 2 * bias.bucket_size
        grouped_query = ops.reshape(
            ops.cast(query, dtype),
            (batch, q_length, heads // groups, groups, head_dim),
        )
        c2p = ops.einsum(
            "bqkgd,rkd->bkgqr", grouped_query, ops.cast(position_key, dtype)
        )
        grouped_position_query = ops.reshape(
            ops.cast(position_query, dtype),
            (rows, heads // groups, groups, head_dim),
        )
        p2c = ops.einsum(
            "bjkd,rkgd->bkgjr", ops.cast(key, dtype), grouped_position_query
        )
        scale = 1.0 / math.sqrt(head_dim)
        self.c2p = ops.reshape(c2p * scale, (-1,))
        self.p2c = ops.reshape(p2c * scale, (-1,))
        self.rows, self.reach = bias._rows, bias._reach
        self.heads, self.width = heads, rows
        self.q_length, self.kv_length = q_length, kv_length

    def __call__(self, score, batch, head, q_idx, kv_idx):
        relative = ops.clip(q_idx - kv_idx, -self.reach, self.reach)
        row = ops.take(self.rows, relative + self.reach)
        bh = batch * self.heads + head
        q = ops.clip(q_idx, 0, self.q_length - 1)
        kv = ops.clip(kv_idx, 0, self.kv_length - 1)
        c2p = ops.take(self.c2p, (bh * self.q_length + q) * self.width + row)
        p2c = ops.take(self.p2c, (bh * self.kv_length + kv) * self.width + row)
        score = broadcast_add(score, ops.cast(c2p, score.dtype))
        return broadcast_add(score, ops.cast(p2c, score.dtype))


def _heads(name, x):
    x = ops.convert_to_tensor(x)
    if len(x.shape) != 4:
        raise ValueError(
            f"`{name}` must be `(batch, T, heads, head_dim)`. Received: "
            f"{name}.shape={tuple(x.shape)!r}"
        )
    return x


def _positions(name, x, bias):
    x = ops.convert_to_tensor(x)
    rows = 2 * bias.bucket_size
    if len(x.shape) != 3 or x.shape[0] != rows:
        raise ValueError(
            f"`{name}` must be `({rows}, heads, head_dim)`: the "
            f"projection of the {rows} rows of the relative table "
            f"(2 * bucket_size). Received: {name}.shape={tuple(x.shape)!r}"
        )
    return x


def _groups(name, x, heads):
    """How many query heads share each head of `x` (axis -2): `ValueError`
    naming `name` unless its heads divide `heads`."""
    have = x.shape[-2]
    if have is None or heads % have:
        raise ValueError(
            f"`{name}` has {have} heads, which do not divide the query's "
            f"{heads}. Received: {name}.shape={tuple(x.shape)!r}"
        )
    return heads // have


def _same_heads(name, x, heads):
    """`ValueError` naming `name` unless `x` has `heads` heads (axis -2):
    a position projection has the heads of its content projection."""
    if x.shape[-2] != heads:
        raise ValueError(
            f"`{name}` must have the {heads} heads of its content "
            f"projection. Received: {name}.shape={tuple(x.shape)!r}"
        )
