import math

import keras
import numpy as np
from keras import ops

from keras_attention.mods.base import PACKAGE
from keras_attention.mods.base import ScoreLayer
from keras_attention.ops import broadcast_add
from keras_attention.utils import validation


def relative_position_bucket(
    relative_position, bidirectional=True, num_buckets=32, max_distance=128
):
    """T5's bucket of each relative position `kv_idx - q_idx` (int32).

    Half the buckets (a quarter each side when `bidirectional`) hold one
    distance each; the others are log-spaced up to `max_distance`, beyond
    which every distance shares the last bucket. Causal
    (`bidirectional=False`): keys after the query share bucket 0. T5's
    arithmetic (float32, in its order: `log(n / max_exact) /
    log(max_distance / max_exact) * (num_buckets - max_exact)`), the same
    on every backend.

    Args:
        relative_position: integer tensor of `kv_idx - q_idx`.
        bidirectional: bool.
        num_buckets: int >= 4 (>= 2 when causal).
        max_distance: int, more than the exact distances
            (`num_buckets // 4`, causal `num_buckets // 2`).

    Example:

    >>> import numpy as np
    >>> from keras_attention.scores import relative_position_bucket
    >>> np.asarray(relative_position_bucket(
    ...     np.array([-200, -20, -3, 0, 3, 20, 200]), num_buckets=16,
    ...     max_distance=64)).tolist()
    [7, 6, 3, 0, 11, 14, 15]
    """
    bidirectional, num_buckets, max_distance = _check_buckets(
        bidirectional, num_buckets, max_distance
    )
    half = num_buckets // 2 if bidirectional else num_buckets
    by_distance = _distance_buckets(half, max_distance)
    n = -ops.convert_to_tensor(relative_position, "int32")
    bucket = 0
    if bidirectional:
        bucket = ops.cast(n < 0, "int32") * half
        n = ops.abs(n)
    else:
        n = ops.maximum(n, 0)
    # Beyond `max_distance` every distance has the last bucket.
    return bucket + ops.take(by_distance, ops.minimum(n, max_distance))


def _check_buckets(bidirectional, num_buckets, max_distance):
    """`(bidirectional, num_buckets, max_distance)` checked: `ValueError`
    naming the argument where T5's function would divide by zero (no
    exact bucket, or `max_distance` not beyond the exact ones)."""
    bidirectional = validation.check_bool("bidirectional", bidirectional)
    checked = validation.check_positive_int("num_buckets", num_buckets)
    smallest = 4 if bidirectional else 2
    if checked < smallest:
        raise ValueError(
            f"`num_buckets` must be at least {smallest} (half of them hold "
            "exact distances, at least one). Received: "
            f"num_buckets={num_buckets!r}"
        )
    distance = validation.check_positive_int("max_distance", max_distance)
    exact = checked // (4 if bidirectional else 2)
    if distance <= exact:
        raise ValueError(
            f"`max_distance` must exceed the {exact} exact distances. "
            f"Received: max_distance={max_distance!r}"
        )
    return bidirectional, checked, distance


def _distance_buckets(num_buckets, max_distance):
    """The bucket of each distance `0 .. max_distance` on one side (the
    `num_buckets` of that side), NumPy int32 (built while tracing too, so
    never a tensor).

    T5's float32 arithmetic in T5's order: the log of the ratio, divided
    by `log(max_distance / max_exact)`, then times the log-spaced
    buckets. Scaling the log by one precomputed factor instead loses a
    bucket where the product is an exact integer (a distance of 6 with 8
    causal buckets and `max_distance=9`: 6, not 5). The log is float32's
    correctly rounded one, as TensorFlow's and PyTorch's (NumPy's float32
    log is one unit in the last place above it at some ratios: 2.25).
    """
    n = np.arange(max_distance + 1, dtype="int64")
    max_exact = num_buckets // 2
    ratio = np.maximum(n, 1).astype("float32") / np.float32(max_exact)
    log = np.log(ratio.astype("float64")).astype("float32")
    scaled = (
        log
        / np.float32(math.log(max_distance / max_exact))
        * np.float32(num_buckets - max_exact)
    )
    large = np.minimum(max_exact + scaled.astype("int64"), num_buckets - 1)
    return np.where(n < max_exact, n, large).astype("int32")


def _bucket_table(bidirectional, num_buckets, max_distance):
    """`relative_position_bucket` of `-max_distance .. max_distance` in
    NumPy (int32; built while tracing too, so never a tensor)."""
    half = num_buckets // 2 if bidirectional else num_buckets
    by_distance = _distance_buckets(half, max_distance)
    n = -np.arange(-max_distance, max_distance + 1, dtype="int64")
    if not bidirectional:
        return by_distance[np.maximum(n, 0)]
    return ((n < 0) * half + by_distance[np.abs(n)]).astype("int32")


@keras.saving.register_keras_serializable(package=PACKAGE)
class T5RelativeBias(ScoreLayer):
    """T5's relative position bias: `score + bias[bucket(kv - q), head]`.

    A learned `(num_buckets, num_heads)` table of biases, one per head and
    bucket of relative positions (`relative_position_bucket`: exact for
    small distances, log-spaced up to `max_distance`). A layer: the
    attention layer holding it builds, trains and saves the table; its
    gradient reaches the table on every path (dense, blockwise, banded).
    T5 shares one table across the blocks of a stack: give the same
    object to every block (`score_mod=bias`) and it is one weight, trained
    by all of them, saved once and loaded as one object (`.keras`); or
    give each layer its own.

    Args:
        num_buckets: int >= 4 (>= 2 when causal), T5's 32.
        max_distance: int, T5's 128: distances beyond share the last
            bucket.
        bidirectional: bool: encoders (True) tell keys before and after
            the query apart; decoders (False) see only keys before.
        embeddings_initializer: initializer of the table.
        num_heads: int or None (an attention layer passes its own).

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> from keras_attention.scores import T5RelativeBias
    >>> layer = keras_attention.layers.SelfAttention(
    ...     num_heads=2, key_dim=8, score_mod=T5RelativeBias())
    >>> tuple(layer(np.ones((2, 5, 16), "float32")).shape)
    (2, 5, 16)
    >>> tuple(layer.score_mod.weights[0].shape)  # (num_buckets, heads)
    (32, 2)

    References:
        - Raffel et al., 2020, "Exploring the Limits of Transfer Learning
          with a Unified Text-to-Text Transformer" (T5).
        - Shaw et al., 2018, "Self-Attention with Relative Position
          Representations".
    """

    def __init__(
        self,
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        embeddings_initializer="glorot_uniform",
        num_heads=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        (
            self.bidirectional,
            self.num_buckets,
            self.max_distance,
        ) = _check_buckets(bidirectional, num_buckets, max_distance)
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
        )
        self.num_heads = validation.check_positive_int(
            "num_heads", num_heads, allow_none=True
        )

    def build(self, num_heads=None):
        num_heads = num_heads if num_heads is not None else self.num_heads
        if num_heads is None:
            raise ValueError(
                "T5RelativeBias needs the number of heads: pass "
                "`num_heads=` or give it to an attention layer. Received: "
                "num_heads=None"
            )
        self.num_heads = validation.check_positive_int("num_heads", num_heads)
        self.embeddings = self.add_weight(
            shape=(self.num_buckets, self.num_heads),
            initializer=self.embeddings_initializer,
            name="embeddings",
        )
        # The bucket of every relative position -max_distance ..
        # max_distance (beyond, buckets saturate: clip), computed once.
        self._buckets = _bucket_table(
            self.bidirectional, self.num_buckets, self.max_distance
        )
        self.built = True

    def _build_if_needed(self):
        # Called directly (no attention layer built it): its own
        # `num_heads`, or a `ValueError` naming the argument.
        if not self.built:
            self.build(None)

    def score_fn(self, score, batch, head, q_idx, kv_idx):
        # Per tile only integer index work and one gather: the biases of
        # the 2 max_distance + 1 relative positions are gathered from the
        # table once per call (differentiable), then indexed by the
        # clipped relative position of each pair.
        self._build_if_needed()
        by_position = ops.take(self.embeddings, self._buckets, axis=0)
        by_position = ops.reshape(by_position, (-1,))  # (2M + 1) * heads
        m = self.max_distance
        relative = ops.clip(kv_idx - q_idx, -m, m) + m
        bias = ops.take(by_position, relative * self.num_heads + head)
        return broadcast_add(score, ops.cast(bias, "float32"))

    def relative_bias(self, distance):
        """The bias of each head at each distance `q_idx - kv_idx`
        (`distance`: 1-D int32): float32 `(num_heads, n)`. The blockwise
        path forms a tile's biases from it and sums their gradient along
        the tile's diagonals (`keras_attention.ops.scoring`)."""
        self._build_if_needed()
        m = self.max_distance
        relative = ops.clip(-distance, -m, m) + m
        buckets = ops.take(self._buckets, relative, axis=0)
        bias = ops.take(self.embeddings, buckets, axis=0)  # (n, heads)
        return ops.transpose(ops.cast(bias, "float32"))

    def get_config(self):
        config = super().get_config()
        config.update(
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            bidirectional=self.bidirectional,
            embeddings_initializer=keras.initializers.serialize(
                self.embeddings_initializer
            ),
            num_heads=self.num_heads,
        )
        return config
