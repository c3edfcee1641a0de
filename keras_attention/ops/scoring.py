"""Attention scores: formed, modified and masked in one place.

Every attention path of the package (dense, blockwise forward and its
recomputing backward, the banded windows of local attention, the global
tokens) forms its scores `q k^T`, applies the user's score function, masks
them and normalizes them through this module. The rules it keeps:

- dtypes: the scores of float16 inputs are formed in float32 (float16's
  range, 65,504, overflows); bfloat16 scores stay bfloat16 (float32's
  exponent range: they cannot overflow); the softmax runs in at least
  float32 (`softmax_dtype`: float64 inputs stay float64 throughout);
- mask True means "may attend"; a masked score is a large negative
  *finite* value (`mask_fill_value` of the softmax dtype), never `-inf`;
  a score function may return `-inf` (FlexAttention's way to mask): such
  scores are raised to the fill value (`finite_scores`), so that no
  `-inf - (-inf)` appears, and count as masked;
- a query row with no key to attend to (every key masked, or every score
  `-inf`) gets all-zero weights (so a zero result) and finite gradients,
  never NaN and never uniform weights;
- the causal rule is `kv_idx <= q_idx` on absolute positions, the window
  rule `q_idx - left <= kv_idx <= q_idx + right` (`causal`, `in_window`).

Score and mask functions (the signatures of PyTorch's FlexAttention, so
functions written for it port over):

    score_mod(score, batch, head, q_idx, kv_idx) -> score
    mask_mod(batch, head, q_idx, kv_idx) -> bool

are called on a block of scores at once, with index tensors (int32)
broadcastable to the block `(batch, heads, queries, keys)`: write them
elementwise (`q_idx >= kv_idx`, `score + ops.take(bias, head)`), never
assuming a rank or a size. `q_idx` and `kv_idx` are absolute positions (a
cache offset is already added); `batch` is the example's index in the
batch. The blockwise and banded paths call them once per tile; a mask
function that only reads the index arguments (NumPy in, NumPy out) is
evaluated on each tile while tracing, and fully masked tiles are skipped
(`static_block_mask`).

Axes in comments: b - batch, h - heads, i/j - query/key positions.
"""

import contextlib

import keras
import numpy as np
from keras import ops

from keras_attention.masks import combine_masks
from keras_attention.utils import attention_checks

try:  # Keras >= 3.0: the scope layers use for mixed precision.
    from keras.src.backend.common.variables import AutocastScope
except ImportError:  # pragma: no cover
    AutocastScope = None

# Fill values and dtypes -------------------------------------------------


def mask_fill_value(dtype):
    """A large negative *finite* score for masked positions of `dtype`.

    Half of the dtype's lowest value: adding a bias to it cannot overflow to
    `-inf` (as a fixed `-1e9` does in float16).

    Example:

    >>> import keras_attention
    >>> keras_attention.ops.mask_fill_value("float16")
    -32752.0
    """
    try:  # Any backend's dtype object (`torch.float64`) or name.
        dtype = keras.backend.standardize_dtype(dtype)
    except ValueError:
        dtype = str(getattr(dtype, "name", dtype))
    if dtype == "bfloat16":
        return -1.6e38
    return float(np.finfo(np.dtype(dtype)).min) / 2.0


FILL = mask_fill_value("float32")


def score_dtype(dtype):
    """The dtype attention scores are formed in: float32 for float16 inputs
    (whose range, 65,504, scores can overflow), the input dtype otherwise
    (float64 stays float64).

    bfloat16 has float32's exponent range, so its scores cannot overflow
    and stay in bfloat16 (the fast matmuls of CPUs with AVX512_BF16/AMX and
    of accelerators); the softmax still runs in float32.
    """
    dtype = keras.backend.standardize_dtype(dtype)
    return "float32" if dtype == "float16" else dtype


def softmax_dtype(dtype):
    """The dtype scores are modified, masked and normalized in: at least
    float32 ("float64" for float64, "float32" for every other dtype).

    Example:

    >>> from keras_attention.ops.scoring import softmax_dtype
    >>> softmax_dtype("bfloat16"), softmax_dtype("float64")
    ('float32', 'float64')
    """
    dtype = keras.backend.standardize_dtype(dtype)
    return "float64" if dtype == "float64" else "float32"


def _fill_bias(mask, dtype):
    """0 where `mask` is True, the fill value of `dtype` elsewhere (in
    `dtype`: float64's fill is not a float32)."""
    zero = ops.zeros((), dtype)
    return ops.where(mask, zero, zero + mask_fill_value(dtype))


def finite_scores(scores):
    """`scores` with every value below the fill value of their dtype
    (`-inf` from a score function) raised to it: a tile or a row of
    `-inf` scores then behaves as a masked one (no `-inf - (-inf)` in a
    softmax), and its gradient is zero there (a `where`, which keeps
    the dtype on every backend; NaN stays NaN)."""
    fill = ops.zeros((), scores.dtype) + mask_fill_value(scores.dtype)
    return ops.where(scores < fill, fill, scores)


# Rules on absolute positions ----------------------------------------------


def causal(q_idx, kv_idx):
    """The causal rule: query `q_idx` may attend to key `kv_idx <= q_idx`.

    Works on NumPy arrays (static tile masks) and on tensors alike.
    """
    return kv_idx <= q_idx


def in_window(q_idx, kv_idx, left, right):
    """The window rule of local attention: `q_idx - left <= kv_idx <=
    q_idx + right` (`left`/`right` keys before/after the query).

    Written on differences of positions, with `left`/`right` capped at
    the int32 range: a window wider than any sequence (`10**12`) cannot
    overflow int32 indices."""
    left, right = min(int(left), _INT32_MAX), min(int(right), _INT32_MAX)
    return (q_idx - kv_idx <= left) & (kv_idx - q_idx <= right)


_INT32_MAX = 2**31 - 1


# Index grids ------------------------------------------------------------


class Grid:
    """Absolute indices of a block of scores, for score and mask functions.

    `batch`, `head`, `q_idx`, `kv_idx`: int32 tensors broadcastable to the
    block's `(batch, heads, queries, keys)` (rank 4). The blockwise path
    builds one per tile, the banded path one per chunk of windows (its
    batch axis then holds `batch * blocks`: `batch` still gives each row's
    example).
    """

    __slots__ = ("batch", "head", "q_idx", "kv_idx")

    def __init__(self, batch, head, q_idx, kv_idx):
        self.batch, self.head = batch, head
        self.q_idx, self.kv_idx = q_idx, kv_idx

    @classmethod
    def dense(
        cls, batch_size, heads, q_length, kv_length, q_offset=0, kv_offset=0
    ):
        """The grid of `q_length` queries from absolute position
        `q_offset` (an int or a scalar tensor: a cache offset) over
        `kv_length` keys from `kv_offset`, every head and example."""
        if isinstance(q_offset, int):
            q = ops.arange(q_offset, q_offset + q_length, dtype="int32")
        else:
            # A tensor: `arange + offset` would let TensorFlow's graph
            # optimizer push the constant through (`(C1 + x) - C2` ->
            # `(C1 - C2) + x`) and fold `q - kv` of every tile into a
            # `(Bq, Bk)` constant kept as long as the graph (O(T^2) memory
            # on the blockwise path). It cannot push through a maximum
            # (equal here: positions are >= the offset).
            start = ops.cast(q_offset, "int32")
            q = ops.arange(q_length, dtype="int32") + start
            q = ops.maximum(q, start)
        kv = ops.arange(kv_length, dtype="int32")
        if kv_offset:
            kv = kv + kv_offset
        return cls(
            ops.reshape(ops.arange(batch_size, dtype="int32"), (-1, 1, 1, 1)),
            ops.reshape(ops.arange(heads, dtype="int32"), (1, -1, 1, 1)),
            ops.reshape(q, (1, 1, -1, 1)),
            ops.reshape(kv, (1, 1, 1, -1)),
        )

    def __iter__(self):
        return iter((self.batch, self.head, self.q_idx, self.kv_idx))


class AtPositions:
    """A score or mask function seen through a position table: the query
    and key indices of the block (`0 ..` along the axes of the scores) are
    replaced by `q_positions[q_idx]` and `kv_positions[kv_idx]` before
    `fn` sees them.

    For keys that are not in position order: a rolling key/value cache
    holds its positions in ring slots, so the index of a key along the
    scores is its slot, not its position. Indices beyond a table (padding
    of a tile) read its last entry; give the entries of slots that hold
    no position any valid position (they are masked anyway).
    `split_score_mod` and the search for the tensors a function reads
    (`captured.py`) see through it to `fn` (a `ScoreLayer` keeps passing
    its weights explicitly).

    Args:
        fn: `score_mod(score, batch, head, q_idx, kv_idx)` or
            `mask_mod(batch, head, q_idx, kv_idx)` (the indices are the
            last two arguments either way).
        q_positions: int `(Tq,)` tensor, the position of each query.
        kv_positions: int `(Tk,)` tensor, the position of each key.

    Example:

    >>> import numpy as np
    >>> import keras
    >>> from keras_attention.ops.scoring import AtPositions
    >>> distance = AtPositions(
    ...     lambda b, h, q, kv: q - kv, np.array([7]), np.array([5, 6, 4]))
    >>> keras.ops.convert_to_numpy(
    ...     distance(0, 0, np.zeros((1, 1)), np.arange(3)[None])).tolist()
    [[2, 1, 3]]
    """

    def __init__(self, fn, q_positions, kv_positions):
        self.fn = fn
        self.q_positions = ops.cast(q_positions, "int32")
        self.kv_positions = ops.cast(kv_positions, "int32")

    @staticmethod
    def _look_up(table, index):
        last = ops.shape(table)[0] - 1
        index = ops.clip(ops.cast(index, "int32"), 0, last)
        return ops.take(table, index)

    def positions(self, q_idx, kv_idx):
        """`(q_positions[q_idx], kv_positions[kv_idx])`."""
        return (
            self._look_up(self.q_positions, q_idx),
            self._look_up(self.kv_positions, kv_idx),
        )

    def __call__(self, *args):
        return self.fn(*args[:-2], *self.positions(*args[-2:]))


def modify_scores(scores, grid, score_mod=None, mask_mod=None, mask=None):
    """The one place scores are modified and masked.

    Args:
        scores: `(b, h, i, j)` scores of any float dtype (already scaled).
        grid: the block's `Grid` (needed when a function is given).
        score_mod: optional `score_mod(score, batch, head, q_idx, kv_idx)`.
        mask_mod: optional `mask_mod(batch, head, q_idx, kv_idx) -> bool`.
        mask: optional boolean mask broadcastable to `scores`.

    Returns:
        `(scores, mask)`: scores in `softmax_dtype` (float32, or float64)
        with the masked entries at the fill value (and a score function's
        `-inf` raised to it: `finite_scores`), and the combined boolean
        mask (None when nothing masks). `mask` is needed by `softmax` to
        zero empty rows (and `empty_rows=True` where a score function may
        have emptied some).
    """
    dtype = softmax_dtype(scores.dtype)
    scores = ops.cast(scores, dtype)
    if score_mod is not None:
        scores = finite_scores(ops.cast(score_mod(scores, *grid), dtype))
    if mask_mod is not None:
        mask = combine_masks(mask, evaluate_mask(mask_mod, grid))
    if mask is None:
        return scores, None
    # An additive bias of the mask's own shape: its gradient is the
    # identity, where a `where` on the scores needs a select.
    return scores + _fill_bias(mask, dtype), mask


def evaluate_mask(mask_mod, grid):
    """`mask_mod` on `grid` as a boolean tensor."""
    return ops.cast(ops.convert_to_tensor(mask_mod(*grid)), "bool")


def check_mod(obj, argument):
    """`TypeError` naming `argument` unless `obj` (a score or mask
    function or object) is None or callable; returns `obj`."""
    if obj is not None and not callable(obj):
        raise TypeError(
            f"`{argument}` must be a mask/score object of "
            f"`keras_attention.mods` or a function. "
            f"Received: {argument}={obj!r}"
        )
    return obj


# Softmax ----------------------------------------------------------------


def plain_softmax(scores, axis=-1):
    """`ops.softmax`, except over an axis of static size 1, where it is 1
    (Keras warns there, as if the user had meant a sigmoid: an attention
    over one key is legitimate)."""
    if scores.shape[axis] == 1:
        return ops.ones_like(scores)
    return ops.softmax(scores, axis=axis)


def softmax(scores, mask=None, axis=-1, empty_rows=False):
    """Softmax in `softmax_dtype` of scores from `modify_scores` (masked
    entries at the fill value); rows whose `mask` is all False get
    all-zero weights (a per-row factor: no select in the gradient), and
    with `empty_rows` (a score function may have set whole rows to
    `-inf`, i.e. to the fill value) so do rows whose maximum is the fill
    value (`rows_valid`)."""
    dtype = softmax_dtype(scores.dtype)
    scores = ops.cast(scores, dtype)
    weights = plain_softmax(scores, axis=axis)
    valid = None
    if mask is not None:
        valid = ops.any(mask, axis=axis, keepdims=True)
    if empty_rows:
        seen = rows_valid(ops.max(scores, axis=axis, keepdims=True))
        valid = seen if valid is None else ops.logical_and(valid, seen)
    if valid is None:
        return weights
    return weights * ops.cast(valid, dtype)


def masked_softmax(scores, mask=None, axis=-1, empty_rows=False):
    """Softmax over `axis` in at least float32 (float64 stays float64)
    with masked entries set to exactly 0.

    Rows where `mask` is all False get all-zero weights.

    Args:
        scores: float tensor of any dtype.
        mask: optional boolean tensor broadcastable to `scores`.
        axis: the axis to normalize over.
        empty_rows: whether `scores` come from `modify_scores` with a
            score function (whose `-inf` may have emptied whole rows:
            those get zeros too).

    Returns:
        float32 (float64 for float64 scores) tensor shaped like `scores`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> weights = keras_attention.ops.masked_softmax(
    ...     np.zeros((2, 3), "float32"),
    ...     mask=np.array([[True, True, False], [False, False, False]]))
    >>> np.asarray(weights).tolist()
    [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
    """
    scores, mask = attention_checks.as_tensors(scores=scores, mask=mask)
    dtype = softmax_dtype(scores.dtype)
    scores = ops.cast(scores, dtype)
    if mask is None:
        if empty_rows:
            return softmax(scores, axis=axis, empty_rows=True)
        return plain_softmax(scores, axis=axis)
    mask = ops.cast(mask, "bool")
    return softmax(
        scores + _fill_bias(mask, dtype), mask, axis=axis, empty_rows=empty_rows
    )


def rows_valid(row_max):
    """Which rows saw an unmasked key, from their score maximum (float32
    or float64: a row whose maximum is the fill value of its dtype saw
    only masked keys, or `-inf` scores)."""
    return row_max > 0.5 * mask_fill_value(
        keras.backend.standardize_dtype(row_max.dtype)
    )


# Static tile masks (block sparsity) ---------------------------------------


def static_block_mask(mask_mod, heads, q_start, q_stop, kv_start, kv_stop):
    """`mask_mod` on one tile, as NumPy, when it reads only the indices.

    The function is called with NumPy index arrays (batch 0, every head);
    a NumPy (or Python bool) result is the tile's mask `(1|h, i, j)`
    boolean, the same for every example. A function that reads a tensor
    (segment ids, a learned table) returns a tensor: None then, and the
    tile is masked at run time instead.

    Returns:
        A NumPy bool array broadcast to `(heads, i, j)`, or None.
    """
    q = np.arange(q_start, q_stop, dtype="int32")
    kv = np.arange(kv_start, kv_stop, dtype="int32")
    try:
        out = mask_mod(
            np.zeros((1, 1, 1, 1), "int32"),
            np.arange(heads, dtype="int32").reshape(1, -1, 1, 1),
            q.reshape(1, 1, -1, 1),
            kv.reshape(1, 1, 1, -1),
        )
    except Exception:  # noqa: BLE001 - a tensor function refusing NumPy.
        return None
    if not isinstance(out, (np.ndarray, np.bool_, bool)):
        return None
    shape = (1, heads, q_stop - q_start, kv_stop - kv_start)
    try:
        return np.broadcast_to(np.asarray(out, bool), shape)[0]
    except ValueError:  # Not broadcastable: left to the run-time check.
        return None


# Score functions with weights ---------------------------------------------


def split_score_mod(score_mod):
    """A score function as `(fn, params)`: `fn(params, score, batch, head,
    q_idx, kv_idx)` reads its trainable tensors from `params` (a tuple),
    so that hand-written backward passes can differentiate them.

    A Keras layer (`keras_attention.mods.ScoreLayer`) gives its variables'
    values (trainable or frozen) as `params` and runs in a
    `keras.StatelessScope` mapping the variables to them; any other
    callable gets `params=()`.
    """
    if score_mod is None:
        return None, ()
    if isinstance(score_mod, AtPositions):
        inner, params = split_score_mod(score_mod.fn)

        def at_positions(params, score, batch, head, q_idx, kv_idx):
            q_idx, kv_idx = score_mod.positions(q_idx, kv_idx)
            return inner(params, score, batch, head, q_idx, kv_idx)

        return at_positions, params
    # Every variable, trainable or not: a frozen layer's weights are read
    # through `params` too (a hand-written backward pass must not see a
    # variable it is not given: TensorFlow's custom gradient refuses it).
    variables = list(getattr(score_mod, "variables", ()) or ())
    if not isinstance(score_mod, keras.layers.Layer) or not variables:
        return (lambda params, *args: score_mod(*args)), ()

    def fn(params, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, params))):
            return score_mod(*args)

    # `ops.copy`: a read of the variable (on TensorFlow the value of a
    # Keras variable is the `tf.Variable` itself, which a custom gradient
    # would see as a variable it must differentiate).
    return fn, tuple(ops.copy(v) for v in variables)


def full_precision_variables():
    """Variables read at their own dtype (float32), not autocast to the
    attention layer's compute dtype: scores are at least float32 under
    every policy, so a learned bias must be too."""
    if AutocastScope is None:  # pragma: no cover
        return contextlib.nullcontext()
    return AutocastScope(None)


def _defining_class(obj, name):
    for cls in type(obj).__mro__:
        if name in vars(cls):
            return cls
    return None


def declared_method(obj, name, scorer="__call__"):
    """`obj`'s method `name` when the class defining it defines `scorer`
    too (the object declares what its score or mask function computes:
    `relative_bias`, `tanh_soft_cap`, `band_bounds`, ...), else None: a
    subclass overriding one of the two without the other gets the
    general path."""
    method = getattr(obj, name, None)
    if method is None or not callable(method):
        return None
    if _defining_class(obj, name) is not _defining_class(obj, scorer):
        return None
    return method


def split_relative_bias(score_mod):
    """A relative bias as `fn(params, distance) -> (heads | 1, n)`, or None.

    A score object may declare that it only adds a bias depending on the
    head and the distance `q_idx - kv_idx`, by implementing
    `relative_bias(distance)` beside its score function: `distance` a
    1-D int32 tensor of distances, the result float `(heads | 1, n)`,
    such that `score(s, b, h, q, kv) == s + relative_bias(q - kv)[h]`
    (`keras_attention.scores.ALiBi` and `T5RelativeBias` do). The
    blockwise path then forms each tile's bias from the tile's
    `Bq + Bk - 1` distances, skips the raw scores in the backward pass
    (the derivative w.r.t. the score is 1) and sums the gradient along
    the tile's diagonals before it reaches the weights (no scatter of
    every score into the table). Used only when the same class defines
    both methods: a subclass overriding one of them gets the general
    path. `params` are those of `split_score_mod` (same order).
    """
    scorer = "score_fn" if hasattr(score_mod, "score_fn") else "__call__"
    method = declared_method(score_mod, "relative_bias", scorer)
    if method is None:
        return None
    variables = list(getattr(score_mod, "variables", ()) or ())
    if not isinstance(score_mod, keras.layers.Layer) or not variables:

        def plain(params, distance):
            with full_precision_variables():
                return _at_least_float32(method(distance))

        return plain

    def fn(params, distance):
        mapping = list(zip(variables, params))
        with keras.StatelessScope(state_mapping=mapping):
            with full_precision_variables():
                return _at_least_float32(method(distance))

    return fn


def _at_least_float32(x):
    x = ops.convert_to_tensor(x)
    return ops.cast(x, softmax_dtype(x.dtype))


def split_soft_cap(score_mod):
    """The cap of a score object that is logit soft-capping,
    `cap * tanh(score / cap)`, or None.

    A score object says so by implementing `tanh_soft_cap()` (returning
    its cap) beside `__call__` in the same class
    (`keras_attention.scores.SoftCap`). The blockwise path then scales
    the tile's raw scores once, keeps `tanh` of them for the backward
    pass and differentiates through it in one op (FlashAttention's
    `softcap` option), instead of a general score function's vjp.
    """
    method = declared_method(score_mod, "tanh_soft_cap")
    return None if method is None else float(method())


def build_score_layer(score_mod, num_heads, argument="score_mod"):
    """Builds a `ScoreLayer` given straight to an op (an attention layer
    builds it with its own heads) from the query's `num_heads`, or
    refuses one made for another number of heads (`ValueError` naming
    `argument`). Anything else is left as it is."""
    layer = score_mod.fn if isinstance(score_mod, AtPositions) else score_mod
    if not isinstance(layer, keras.layers.Layer):
        return
    if not layer.built:
        layer.build(getattr(layer, "num_heads", None) or num_heads)
    made_for = getattr(layer, "num_heads", None)
    if made_for is not None and num_heads is not None and made_for != num_heads:
        raise ValueError(
            f"`{argument}` is made for {made_for} heads but the query has "
            f"{num_heads}. Received: {argument}={score_mod!r}"
        )
