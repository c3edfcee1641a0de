"""The scores and masks of one tile of the blockwise path
(`blockwise.py`): its position grid, its mask, its scores (with a score
function, a relative bias or soft-capping), and the pullbacks of a
relative bias.

Each function takes the call's `_Plan` (`blockwise.py`) as `plan` and
reads its static tiling; `aux` is `(key_padding, dense_mask, offset)`.
Axes in comments as in `blockwise.py`.
"""

import keras
from keras import ops

from keras_attention import masks
from keras_attention.ops import _backend
from keras_attention.ops import scoring
from keras_attention.ops.scoring import softmax_dtype


def _grid(plan, aux, anchor, i0, i1, j0, j1):
    """The `scoring.Grid` of one tile (absolute query positions), its
    query positions computed at run time from `anchor` (the tile's
    queries): with positions known while tracing, TensorFlow's graph
    optimizer folds every tile's index-only terms (a score function's
    distance bias, `(b, h, Bq, k)` per tile) into constants that live as
    long as the graph: O(T^2) memory. A query position plus a run-time
    zero read from the data cannot be folded, and it also runs each
    tile's index terms when the tile runs, not all at the start."""
    offset = plan.offset if aux[2] is None else aux[2]
    zero = ops.minimum(
        ops.cast(ops.any(ops.isnan(anchor[:1, :1, :1, :1])), "int32"), 0
    )
    offset = ops.cast(offset, "int32") + (i0 + zero)
    return scoring.Grid.dense(
        ops.shape(anchor)[0],
        plan.heads,
        i1 - i0,
        j1 - j0,
        q_offset=offset,
        kv_offset=j0,
    )


def _tile_mask(plan, aux, grid, i0, i1, chunk):
    """Boolean mask broadcastable to `(b, h, Bq, k)`, or None."""
    _, j0, j1, needs_causal, needs_mod = chunk
    key_padding, dense_mask, _ = aux
    causal = None
    if needs_causal:
        causal = scoring.causal(grid.q_idx, grid.kv_idx)
    if key_padding is not None:
        key_padding = key_padding[:, None, None, j0:j1]
    if dense_mask is not None:
        dense_mask = dense_mask[:, :, i0:i1, j0:j1]
    mod = None
    if needs_mod:
        mod = scoring.evaluate_mask(plan.mask_mod, grid)
    return masks.combine_masks(causal, key_padding, dense_mask, mod)


def grid_and_mask(plan, aux, anchor, i0, i1, chunk):
    """The tile's grid and its boolean mask (None: nothing masks)."""
    grid = _grid(plan, aux, anchor, i0, i1, chunk[1], chunk[2])
    return grid, _tile_mask(plan, aux, grid, i0, i1, chunk)


def live(plan, chunk, mask):
    """Whether a tile may hold an allowed pair: None when known to (run
    it unconditionally), else a scalar boolean tensor (any example)."""
    if not (plan.dynamic_mod and chunk[4]) or mask is None:
        return None
    return ops.any(mask)


def raw_scores(plan, q_t, k_c, i0, i1, scale=None):
    """Scores of one tile, formed in the keys' dtype `k_c` (`score_dtype`:
    float32 for float16, whose products of large queries and keys would
    overflow; bfloat16 stays bfloat16): `(b, h, Bq, k)` in `softmax_dtype`
    (float32, float64 for float64 keys), times `scale` if given (applied
    to the tile's queries when they are in that dtype already: a
    `(b, g, q, d)` product instead of a `(b, g, q, k)` one)."""
    cols = k_c.shape[2]
    q_t = ops.cast(q_t, k_c.dtype)
    dtype = softmax_dtype(k_c.dtype)
    prescale = scale is not None and _dtype(k_c) == dtype
    if prescale:
        q_t = q_t * scale
    s = ops.einsum("bgqd,bgkd->bgqk", q_t, k_c)
    # (b, g, r Bq, k) -> (b, h, Bq, k): query head g r + r'.
    s = ops.cast(ops.reshape(s, (-1, plan.heads, i1 - i0, cols)), dtype)
    return s * scale if scale is not None and not prescale else s


def _dtype(x):
    return keras.backend.standardize_dtype(x.dtype)


def maximum(x, y):
    """`maximum(x, y)` in `x`'s dtype (Keras's torch `maximum` computes
    float64 in float32)."""
    y = ops.cast(y, x.dtype)
    return ops.where(x >= y, x, y)


def soft_capped_tanh(plan, q_t, k_c, i0, i1):
    """`tanh(raw / cap)` of one tile (`plan.soft_cap`): the scores are
    `cap` times it, and its derivative `1 - tanh^2` is read from it."""
    return ops.tanh(raw_scores(plan, q_t, k_c, i0, i1, 1.0 / plan.soft_cap))


def _score_function(plan, params):
    """The score function with its parameters bound, or None."""
    if plan.score_fn is None:
        return None

    def score_mod(score, *args):
        return plan.score_fn(params, score, *args)

    return score_mod


def _distances(grid, cols):
    """The `Bq + Bk - 1` distances `q_idx - kv_idx` of a tile, ascending
    (1-D int32), and each pair's index among them, `(Bq, Bk)`."""
    q = ops.reshape(grid.q_idx, (-1,))
    kv_last = ops.reshape(grid.kv_idx, (-1,))[cols - 1]
    start = q[0] - kv_last
    n = q.shape[0] + cols - 1
    distances = ops.arange(n, dtype="int32") + start
    index = ops.reshape(grid.q_idx - grid.kv_idx, (-1, cols)) - start
    return distances, index


def relative_scores(plan, params, raw, grid):
    """`raw` `(b, h, Bq, k)` plus a relative bias (`plan.relative_fn`):
    with weights, the tile's `Bq + Bk - 1` biases per head gathered to
    the tile (their gradient is then summed per distance); without, the
    score function itself (elementwise: cheaper than a gather)."""
    if not params:
        return plan.score_fn(params, raw, *grid)
    distances, index = _distances(grid, raw.shape[-1])
    bias = plan.relative_fn(params, distances)  # (h | 1, n)
    return raw + ops.cast(ops.take(bias, index, axis=1)[None], raw.dtype)


def relative_pullback(plan, params, grid, cols, variables=()):
    """The pullback of a relative bias over one tile: `ds` `(b, h, Bq,
    k)` is summed over the batch and along the tile's diagonals (one
    value per distance, a skew of the padded tile: no scatter of every
    score), then pulled back to the parameters (and to `variables`, on
    TensorFlow: those the bias reads itself)."""
    distances, _ = _distances(grid, cols)
    bias, pull = _backend.vjp(
        lambda *p: plan.relative_fn(p, distances), tuple(params), variables
    )

    def pullback(ds):
        x = ops.sum(ds, axis=0)  # (h, Bq, k)
        heads, rows = plan.heads, x.shape[1]
        # Row i padded with Bq zeros in front and read with a stride of
        # one more than its length: pair (i, j) lands in column
        # Bq + j - i, so each column holds one diagonal.
        x = ops.pad(x, ((0, 0), (0, 0), (rows, 0)))
        width = rows + cols
        x = ops.reshape(x, (heads, rows * width))
        x = ops.pad(x, ((0, 0), (0, rows)))
        x = ops.reshape(x, (heads, rows, width + 1))
        # Column Bq + k - 1 - t holds distance `start + t`.
        sums = ops.flip(ops.sum(x, axis=1)[:, 1:width], axis=-1)
        if bias.shape[0] == 1:
            sums = ops.sum(sums, axis=0, keepdims=True)
        # In the bias's dtype (a float32 table under float64 scores).
        return (ds,) + tuple(pull(ops.cast(sums, bias.dtype)))

    return pullback


def scores(plan, aux, params, q_t, k_c, i0, i1, chunk, tile=None):
    """Scores of one tile (`raw_scores`), modified and masked by
    `scoring.modify_scores` (a score function's `-inf` raised to the fill
    value): `(b, g, q, k)` in `softmax_dtype`. Also returns the tile's
    grid and mask."""
    g, rows, cols = q_t.shape[1], q_t.shape[2], k_c.shape[2]
    score_mod = _score_function(plan, params)
    if plan.soft_cap is not None:
        s = plan.soft_cap * soft_capped_tanh(plan, q_t, k_c, i0, i1)
        score_mod = None
    else:
        s = raw_scores(plan, q_t, k_c, i0, i1)
    if tile is None:
        tile = grid_and_mask(plan, aux, s, i0, i1, chunk)
    grid, mask = tile
    if plan.relative_fn is not None and params:
        s, score_mod = relative_scores(plan, params, s, grid), None
    masked, _ = scoring.modify_scores(s, grid, score_mod, None, mask)
    return ops.reshape(masked, (-1, g, rows, cols)), tile


def never_empty(plan, aux, i0, chunks):
    """Whether every query of the row of tiles starting at `i0` sees a key
    whatever the inputs: no mask at all (nor a score function, which may
    return `-inf` for a whole row; soft-capping and relative biases are
    finite), or a static causal structure where the row's first query
    already sees key 0."""
    key_padding, dense_mask, _ = aux
    if key_padding is not None or dense_mask is not None:
        return False
    if plan.mask_mod is not None:
        return False
    general = plan.soft_cap is None and plan.relative_fn is None
    if plan.score_fn is not None and general:
        return False
    if plan.dynamic_causal:
        return False
    return not plan.static_causal or (bool(chunks) and i0 + plan.offset >= 0)
