"""Sliding-window (local) attention computed on the band only:
`local_attention` and the conversions of its banded weights.

Query `i` attends to keys `j` with `i - left <= j <= i + right`. Instead of
masking a `T x T` score matrix, the sequence is cut into blocks of `B`
queries; query block `n` (positions `nB .. nB + B - 1`) only needs the
`W = B + left + right` keys `nB - left .. nB + B - 1 + right`. Those key
windows are built from shifted views of the key blocks (no gather), so
scores are `(b * n, g, r * B, W)`: time and memory are `O(T * W)`, linear in
`T` for a fixed window. Blocks are folded into the batch and query heads
into the rows of their key/value group, so no tensor has rank above 5 (the
limit of TensorFlow's oneDNN CPU kernels), forward or backward.

Axes in comments: b - batch, t - positions, n - blocks, z - b * n (blocks
folded into the batch), i - query position inside a block (`B`), j - key
position inside a block's key window (`W`), k - offset in the band
(`L + R + 1`), h - query heads, g - key/value heads, r - query heads per
key/value head, q - the `r * B` query rows of a group, d/e - key/value head
dims.

Banded weights: `banded[..., i, k]` is the weight of query `i` on key
`i - left + k` (zero where that key does not exist); `banded_to_dense` and
`dense_to_banded` convert to and from `(..., T, T)`.

A window wider than the sequence is capped at it: with a static length
`T`, the ops run with `left = min(left, T - 1)` and `right = min(right,
T - 1)` (`effective_window`), which changes no result (no key lies
further away) but bounds the cost by `O(T^2)`, and the banded weights
have `min(left, T - 1) + min(right, T - 1) + 1` columns. A length known
only at run time (a TensorFlow graph with an unknown time axis) keeps the
window as given.

The softmax of the blocks runs in `sliding_window_kernel.py`. The blocked
layout (`Geometry`, `blocked`, `window_scores`, `unblock`, `banded`,
`empty`, and `static_length`, `pad_axis`) is shared with the global-token
op in `global_local.py`.
"""

import numpy as np
from keras import ops

from keras_attention.masks import window_bounds
from keras_attention.ops import _scope
from keras_attention.ops import scoring
from keras_attention.ops.log_sum_exp import check_sink_logits
from keras_attention.ops.log_sum_exp import row_log_sum_exp
from keras_attention.ops.log_sum_exp import sinks_on_result
from keras_attention.ops.masking import as_4d_mask
from keras_attention.ops.masking import masked_softmax
from keras_attention.ops.sliding_window_kernel import window_attention
from keras_attention.utils import attention_checks
from keras_attention.utils import keras_utils
from keras_attention.utils import validation


def default_block_size(left, right):
    """Query block size `B` for a window `(left, right)`.

    Larger blocks mean fewer, larger matrix products; smaller blocks waste
    fewer scores (a block computes `B * (B + left + right)` scores for
    `B * (left + right + 1)` useful ones). Half the window, kept in
    `[16, 128]`, balances the two on CPU.
    """
    return int(min(128, max(16, (left + right) // 2)))


def effective_window(window_size, length, causal=False):
    """`(left, right)` of `window_size` capped at a sequence of `length`
    steps: `min(left, length - 1)`, `min(right, length - 1)` (0 for an
    empty sequence). The band of `local_attention`'s weights has
    `left + right + 1` of these columns. `length` None (not static): the
    window as given.

    Example:

    >>> from keras_attention.ops import effective_window
    >>> effective_window(100_000, 8), effective_window((2, 1), 8)
    ((7, 7), (2, 1))
    """
    left, right = window_bounds(window_size, causal)
    if length is None:
        return left, right
    reach = max(int(length) - 1, 0)
    return min(left, reach), min(right, reach)


def static_length(x, axis):
    """`x.shape[axis]` as an int, or None when not static."""
    n = x.shape[axis]
    return None if n is None else int(n)


def pad_axis(x, axis, before, after, value=0):
    pad = [[0, 0]] * len(x.shape)
    pad[axis] = [before, after]
    return ops.pad(x, pad, constant_values=value)


def _key_windows(x, block, width, num_blocks):
    """`(b, t_pad, ...)` key-side tensor, already padded with `left` steps
    in front and to `(n + m - 1) * B` steps, to the per-block windows
    `(b, n, W, ...)`: window `n` is `x[:, nB : nB + W]`."""
    m = -(-width // block)  # key blocks per window
    shape = ops.shape(x)
    rest = tuple(x.shape[2:])
    blocks = ops.reshape(x, (shape[0], num_blocks + m - 1, block) + rest)
    # Shifted views: window n = blocks n, n + 1, ..., n + m - 1.
    views = [
        keras_utils.slice_axis(blocks, 1, o, o + num_blocks) for o in range(m)
    ]
    windows = views[0] if m == 1 else ops.concatenate(views, axis=2)
    if m * block != width:
        windows = windows[:, :, :width]
    return windows


def _unskew(x, width, keep):
    """`y[..., i, c] = x[..., i, i + c]` for `c < keep` (rows shift left).

    `x` is `(..., rows, width)` with `rows - 1 + keep <= width`.
    """
    shape = ops.shape(x)
    lead = tuple(shape[:-2])
    rows = x.shape[-2] if x.shape[-2] is not None else shape[-2]
    flat = ops.reshape(x, lead + (rows * width,))
    flat = pad_axis(flat, -1, 0, rows)
    return ops.reshape(flat, lead + (rows, width + 1))[..., :keep]


def _skew(x, keep):
    """`y[..., i, i + c] = x[..., i, c]`, zeros elsewhere (rows shift right);
    returns `(..., rows, keep)`; needs `keep <= rows + width - 1`."""
    shape = ops.shape(x)
    lead = tuple(shape[:-2])
    rows = x.shape[-2] if x.shape[-2] is not None else shape[-2]
    width = x.shape[-1]
    x = pad_axis(x, -1, 0, rows)
    flat = ops.reshape(x, lead + (rows * (width + rows),))
    flat = flat[..., : rows * (width + rows - 1)]  # drop the last row's pad
    return ops.reshape(flat, lead + (rows, width + rows - 1))[..., :keep]


def banded_to_dense(weights, window_size, causal=False):
    """Expands banded weights `(..., T, L + R + 1)` to dense `(..., T, T)`.

    `dense[..., i, j] = weights[..., i, j - i + left]` inside the window,
    zero outside. `O(T^2)`: meant for plotting or checking short sequences.
    `L` and `R` are the window capped at `T` (`effective_window`), as the
    banded weights of `local_attention` have them.

    Args:
        weights: banded tensor, as returned by `local_attention` or
            `LocalSelfAttention(..., return_attention_scores=True)`.
        window_size: int or `(left, right)`, as given to the layer.
        causal: bool, as given to the layer.
    """
    (weights,) = attention_checks.as_tensors(weights=weights)
    left, right = effective_window(
        window_size, static_length(weights, -2), causal
    )
    band = left + right + 1
    if weights.shape[-1] is not None and weights.shape[-1] != band:
        raise ValueError(
            f"`weights` must have {band} columns for "
            f"window_size={window_size!r}, causal={causal!r}. "
            f"Received: weights.shape={tuple(weights.shape)!r}"
        )
    t = (
        weights.shape[-2]
        if weights.shape[-2] is not None
        else ops.shape(weights)[-2]
    )
    # y[i, i + k] = w[i, k]; key j = i - left + k sits at column j + left.
    y = _skew(weights, keep=left + t)
    return y[..., left:]


def dense_to_banded(dense, window_size, causal=False):
    """Reads the band of a dense `(..., T, T)` tensor: `(..., T, L + R + 1)`
    with `banded[..., i, k] = dense[..., i, i - left + k]` (zero where that
    key is outside `0 .. T - 1`). Inverse of `banded_to_dense` on the band;
    `L` and `R` are the window capped at `T` (`effective_window`).
    """
    (dense,) = attention_checks.as_tensors(dense=dense)
    left, right = effective_window(
        window_size, static_length(dense, -1), causal
    )
    t = dense.shape[-1] if dense.shape[-1] is not None else ops.shape(dense)[-1]
    padded = pad_axis(dense, -1, left, right)  # column c holds key c - left
    return _unskew(padded, width=t + left + right, keep=left + right + 1)


def _blocked_attention_mask(attention_mask, t, block, width, num_blocks, left):
    """Dense `(b|1, h|1, T, T)` mask -> per-block `(b|1, h|1, n, B, W)`."""
    mask = as_4d_mask(attention_mask)
    m = -(-width // block)
    mask = pad_axis(mask, 2, 0, num_blocks * block - t, False)
    mask = pad_axis(
        mask, 3, left, (num_blocks + m - 1) * block - left - t, False
    )
    shape = ops.shape(mask)
    mask = ops.reshape(mask, (shape[0], shape[1], num_blocks, block, shape[3]))
    # Query block n reads key columns nB .. nB + W - 1 (padded coordinates).
    columns = ops.arange(num_blocks, dtype="int32")[:, None, None] * block
    columns = columns + ops.arange(width, dtype="int32")[None, None, :]
    return ops.take_along_axis(mask, columns[None, None], axis=-1)


def _fold_blocks(x, batch, num_blocks):
    """`(b|1, n, ...)` -> `(b * n, ...)` (broadcasting a batch of 1)."""
    rest = tuple(x.shape[2:])
    x = ops.broadcast_to(x, (batch, num_blocks) + rest)
    return ops.reshape(x, (batch * num_blocks,) + rest)


def _block_mask(
    t,
    b,
    n,
    block,
    width,
    left,
    right,
    query_mask,
    key_mask,
    attention_mask,
    num_groups,
    r,
):
    """Mask `(b * n, g|1, r|1, B, W)`: band, existing and unpadded keys and
    queries, and the band of `attention_mask`."""
    # Query nB + i and key nB - left + j: offset j - i - left in [-left, right].
    i = np.arange(block)[:, None]
    j = np.arange(width)[None, :]
    band = ops.convert_to_tensor((j >= i) & (j <= i + left + right))
    k_after = (n + -(-width // block) - 1) * block - left - t
    if key_mask is None:
        key_valid = ops.ones((1, t), "bool")
    else:
        key_valid = ops.cast(key_mask, "bool")
    key_valid = pad_axis(key_valid, 1, left, k_after, False)
    key_valid = _key_windows(key_valid, block, width, n)  # (b|1, n, W)
    key_valid = _fold_blocks(key_valid, b, n)  # (b n, W)
    mask = ops.logical_and(band[None], key_valid[:, None, :])  # (b n, B, W)
    if query_mask is not None:
        query_valid = ops.cast(query_mask, "bool")
        query_valid = pad_axis(query_valid, 1, 0, n * block - t, False)
        query_valid = _fold_blocks(
            ops.reshape(query_valid, (-1, n, block)), b, n
        )
        mask = ops.logical_and(mask, query_valid[:, :, None])
    mask = mask[:, None, None]  # (b n, 1, 1, B, W)
    if attention_mask is None:
        return mask
    extra = _blocked_attention_mask(attention_mask, t, block, width, n, left)
    heads = extra.shape[1]
    g, rr = (num_groups, r) if heads != 1 else (1, 1)
    # (b|1, h|1, n, B, W) -> (b n, h|1, B, W) -> (b n, g|1, r|1, B, W).
    extra = ops.transpose(extra, (0, 2, 1, 3, 4))
    extra = _fold_blocks(extra, b, n)
    extra = ops.reshape(extra, (b * n, g, rr, block, width))
    return ops.logical_and(mask, extra)


class Geometry:
    """Static sizes of one banded computation (see the module's axes)."""

    def __init__(self, query, key, value, left, right, block_size, causal):
        self.left, self.right, self.causal = left, right, bool(causal)
        self.block = (
            default_block_size(left, right)
            if block_size is None
            else validation.check_positive_int("block_size", block_size)
        )
        length = static_length(query, 1)
        if length:
            # A block longer than the sequence computes only padding (a
            # block_size of 10**6 on T=2 built a (10**6, 10**6) band).
            self.block = min(self.block, length)
        self.width = self.block + left + right  # W: keys of a query block
        self.heads, self.groups = query.shape[2], key.shape[2]
        self.r = self.heads // self.groups
        self.d, self.e = query.shape[-1], value.shape[-1]
        self.b, self.t = ops.shape(query)[0], ops.shape(query)[1]
        self.n = (self.t + self.block - 1) // self.block
        self.z = self.b * self.n


def blocked(geo, query, key, value, scale, query_mask, key_mask, mask):
    """Scaled query blocks `(z, g, r B, d)` (float32, or float64), key/value
    windows `(z, g, W, d|e)` and the block mask `(z, g|1, r|1, B, W)`."""
    b, n, block, width = geo.b, geo.n, geo.block, geo.width
    m = -(-width // block)  # key blocks per window
    k_after = (n + m - 1) * block - geo.left - geo.t
    # Blocks are folded into the batch (z = b n) and query heads into the
    # rows of their key/value group (q = r B): every tensor has rank <= 5.
    # Scores are formed in float32 (no float16 overflow), float64 inputs
    # in float64 (`scoring.softmax_dtype`).
    dtype = scoring.softmax_dtype(query.dtype)
    query = ops.multiply(
        ops.cast(query, dtype), keras_utils.constant(scale, dtype)
    )
    q = pad_axis(query, 1, 0, n * block - geo.t)
    q = ops.reshape(q, (geo.z, block, geo.heads, geo.d))  # (z, B, h, d)
    q = ops.reshape(
        ops.transpose(q, (0, 2, 1, 3)),
        (geo.z, geo.groups, geo.r * block, geo.d),
    )
    # Key/value windows (b, n, W, g, d|e) -> (z, g, W, d|e).
    k = _key_windows(pad_axis(key, 1, geo.left, k_after), block, width, n)
    v = _key_windows(pad_axis(value, 1, geo.left, k_after), block, width, n)
    k = ops.transpose(
        ops.reshape(k, (geo.z, width, geo.groups, geo.d)), (0, 2, 1, 3)
    )
    v = ops.transpose(
        ops.reshape(v, (geo.z, width, geo.groups, geo.e)), (0, 2, 1, 3)
    )
    mask = _block_mask(
        geo.t,
        b,
        n,
        block,
        width,
        geo.left,
        geo.right,
        query_mask,
        key_mask,
        mask,
        geo.groups,
        geo.r,
    )  # (z, g|1, r|1, B, W)
    return q, k, v, mask


def window_scores(geo, q, k):
    """`(z, g, r, B, W)` scores of each query block on its window, in the
    queries' dtype (float32, or float64)."""
    scores = ops.einsum("zgqd,zgkd->zgqk", q, ops.cast(k, q.dtype))
    return ops.reshape(scores, (geo.z, geo.groups, geo.r, geo.block, -1))


def unblock(geo, out, dtype):
    """`(z, g, r B, e)` -> `(b, t, h, e)` in `dtype`."""
    out = ops.transpose(
        ops.reshape(out, (geo.z, geo.heads, geo.block, geo.e)), (0, 2, 1, 3)
    )
    out = ops.reshape(out, (geo.b, geo.n * geo.block, geo.heads, geo.e))
    return ops.cast(out[:, : geo.t], dtype)


def banded(geo, weights):
    """Window weights `(z, g, r B, W)` -> band `(b, h, t, L + R + 1)`."""
    band = geo.left + geo.right + 1
    banded = _unskew(
        ops.reshape(weights, (geo.z, geo.heads, geo.block, geo.width)),
        width=geo.width,
        keep=band,
    )
    banded = ops.reshape(banded, (geo.b, geo.n, geo.heads, geo.block, band))
    banded = ops.transpose(banded, (0, 2, 1, 3, 4))
    banded = ops.reshape(banded, (geo.b, geo.heads, geo.n * geo.block, band))
    return banded[:, :, : geo.t]


def local_attention(
    query,
    key,
    value,
    window_size,
    causal=False,
    query_mask=None,
    key_mask=None,
    attention_mask=None,
    block_size=None,
    scale=None,
    dropout_fn=None,
    return_weights=False,
    chunk_blocks=None,
    score_mod=None,
    mask_mod=None,
    return_lse=False,
    sink_logits=None,
):
    """Sliding-window softmax(q k^T * scale) v in `O(T * window)`.

    Equals `dot_product_attention` with the mask
    `sliding_window_mask(T, window_size, causal)` (and the padding masks),
    but never builds a `T x T` tensor (nor, for TensorFlow's oneDNN
    kernels, any tensor of rank above 5). Scores of low-precision inputs
    are formed in float32, so they cannot overflow.

    Args:
        query: `(b, t, h, d)`.
        key: `(b, t, g, d)`, same `t`; `h % g == 0` (grouped-query).
        value: `(b, t, g, e)`.
        window_size: int (`left = right`) or `(left, right)`.
        causal: bool, `right = 0`.
        query_mask: optional boolean `(b, t)`; padded queries get zero
            weights and a zero result.
        key_mask: optional boolean `(b, t)`; padded keys get no weight.
        attention_mask: optional dense boolean mask `(t, t)`, `(b, t, t)` or
            `(b, h, t, t)`, combined with the window (only its band is read,
            but it is itself `O(t^2)`).
        block_size: query block size `B` (at most `t`); defaults to
            `default_block_size`.
        scale: float; defaults to `1 / sqrt(d)`.
        dropout_fn: optional callable applied to the attention weights
            (given as `(b * n, g, r * B, W)`: blocks folded into the batch).
        return_weights: also return the banded weights `(b, h, t, L+R+1)`,
            `L`, `R` capped at `t` (`effective_window`).
        chunk_blocks: query blocks computed together (memory vs. speed;
            None: as many as fit in a fixed budget); results do not
            depend on it.
        score_mod: optional `score_mod(score, batch, head, q_idx, kv_idx)`
            on the window's scores (absolute positions; see
            `dot_product_attention`); differentiated by autodiff on the
            band (memory `O(T * window)` still).
        mask_mod: optional `mask_mod(batch, head, q_idx, kv_idx)`:
            restricts the window further (and-ed with it).
        return_lse: also return the softmax's log-sum-exp `(b, h, t)`
            (float32, or float64; `-inf` where a query attends to
            nothing; `log_sum_exp.py`), differentiable by autodiff on the
            band (memory `O(T * window)`).
        sink_logits: optional learned attention sinks `(h,)` (gpt-oss;
            `-inf`: no sink on that head), as `dot_product_attention`'s:
            one logit per query head joins each row's softmax as a
            virtual key with no value, applied through the band's
            log-sum-exp (`log_sum_exp.apply_sinks`); the weights then
            leave out the sink's share, and the returned lse includes
            it (`LocalSelfAttention(learned_sinks=True)` runs them here;
            `MultiHeadAttention(sliding_window=..., learned_sinks=True)`
            applies them the same way).

    Returns:
        `(b, t, h, e)` in the query's dtype, the banded weights (value
        dtype) if `return_weights`, then the log-sum-exp if
        `return_lse`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(1, 10, 2, 4)).astype("float32")
    >>> out, banded = keras_attention.ops.local_attention(
    ...     x, x, x, window_size=2, return_weights=True)
    >>> tuple(out.shape), tuple(banded.shape)
    ((1, 10, 2, 4), (1, 2, 10, 5))
    """
    query, key, value = attention_checks.as_tensors(
        query=query, key=key, value=value
    )
    _scope.refuse_in_exclusive_scope(
        "`local_attention`", "its banded kernel is its own"
    )
    return_weights = validation.check_bool("return_weights", return_weights)
    return_lse = validation.check_bool("return_lse", return_lse)
    if sink_logits is not None:
        check_sink_logits(sink_logits, query.shape[2])
        result = local_attention(
            query, key, value, window_size, causal=causal,
            query_mask=query_mask, key_mask=key_mask,
            attention_mask=attention_mask, block_size=block_size,
            scale=scale, dropout_fn=dropout_fn,
            return_weights=return_weights, chunk_blocks=chunk_blocks,
            score_mod=score_mod, mask_mod=mask_mod, return_lse=True,
        )  # fmt: skip
        return sinks_on_result(result, sink_logits, return_weights, return_lse)
    scoring.build_score_layer(score_mod, query.shape[2], "score_mod")
    left, right = effective_window(window_size, static_length(query, 1), causal)
    if static_length(query, 1) == 0:
        out, band = empty(query, value, left + right + 1)
        results = (out,) + ((band,) if return_weights else ())
        if return_lse:
            dtype = scoring.softmax_dtype(query.dtype)
            b, heads = ops.shape(query)[0], query.shape[2]
            results += (ops.zeros((b, heads, 0), dtype),)
        return results[0] if len(results) == 1 else results
    geo = Geometry(query, key, value, left, right, block_size, causal)
    if scale is None:
        scale = 1.0 / float(np.sqrt(geo.d))
    q, k, v, mask = blocked(
        geo, query, key, value, scale, query_mask, key_mask, attention_mask
    )
    grid = None
    if score_mod is not None or mask_mod is not None:
        grid = _band_grid(geo)
    if mask_mod is not None:
        mask = ops.logical_and(mask, _band_mask(geo, mask_mod, grid))
    if score_mod is not None:
        # Autodiff on the band: a score function's own tensors get their
        # gradients (the hand-written backward has no hook for them).
        scores = ops.reshape(
            window_scores(geo, q, k), (geo.z, geo.heads, geo.block, -1)
        )
        scores, _ = scoring.modify_scores(scores, grid, score_mod)
        scores = ops.reshape(
            scores, (geo.z, geo.groups, geo.r, geo.block, geo.width)
        )
        return _weighted(
            geo,
            scores,
            mask,
            v,
            query,
            value,
            dropout_fn,
            return_weights,
            empty_rows=True,
            return_lse=return_lse,
        )
    if dropout_fn is None and not return_weights and not return_lse:
        blocks = geo.n if isinstance(geo.n, int) else None
        out = window_attention(
            q, k, v, mask, blocks=blocks, chunk_blocks=chunk_blocks
        )
        return unblock(geo, out, query.dtype)
    return _weighted(
        geo,
        window_scores(geo, q, k),
        mask,
        v,
        query,
        value,
        dropout_fn,
        return_weights,
        return_lse=return_lse,
    )


def _weighted(
    geo,
    scores,
    mask,
    v,
    query,
    value,
    dropout_fn,
    return_weights,
    empty_rows=False,
    return_lse=False,
):
    """Softmax of the window scores `(z, g, r, B, W)`, dropout, the
    weighted values; the output, then the banded weights and the
    log-sum-exp `(b, h, t)` if asked. `empty_rows`: the scores come from
    a score function (whose `-inf` may empty rows: zeros too)."""
    lse = None
    if return_lse:
        masked, _ = scoring.modify_scores(scores, None, mask=mask)
        valid = ops.any(mask, axis=-1, keepdims=True)
        lse = row_log_sum_exp(masked, valid)  # (z, g, r, B, 1)
        lse = ops.reshape(lse, (geo.b, geo.n, geo.heads, geo.block))
        lse = ops.transpose(lse, (0, 2, 1, 3))
        lse = ops.reshape(lse, (geo.b, geo.heads, geo.n * geo.block))
        lse = lse[:, :, : geo.t]
    weights = masked_softmax(scores, mask, empty_rows=empty_rows)
    weights = ops.reshape(
        ops.cast(weights, value.dtype),
        (geo.z, geo.groups, geo.r * geo.block, geo.width),
    )
    kept = dropout_fn(weights) if dropout_fn is not None else weights
    out = ops.einsum("zgqk,zgke->zgqe", kept, v)  # (z, g, r B, e)
    out = unblock(geo, out, query.dtype)
    results = (out,) + ((banded(geo, weights),) if return_weights else ())
    results += (lse,) if return_lse else ()
    return results[0] if len(results) == 1 else results


def _band_grid(geo):
    """The `scoring.Grid` of every query block's window: batch axis `z =
    b n` (example `z // n`, block `z % n`), query `nB + i`, key
    `nB - left + j` (absolute positions)."""
    z = ops.arange(geo.z, dtype="int32")
    blocks = ops.reshape((z % geo.n) * geo.block, (-1, 1, 1, 1))
    q = ops.reshape(ops.arange(geo.block, dtype="int32"), (1, 1, -1, 1))
    kv = ops.reshape(ops.arange(geo.width, dtype="int32"), (1, 1, 1, -1))
    return scoring.Grid(
        ops.reshape(z // geo.n, (-1, 1, 1, 1)),
        ops.reshape(ops.arange(geo.heads, dtype="int32"), (1, -1, 1, 1)),
        blocks + q,
        blocks - geo.left + kv,
    )


def _band_mask(geo, mask_mod, grid):
    """`mask_mod` on every window, `(z, g|1, r|1, B, W)` boolean."""
    mod = scoring.evaluate_mask(mask_mod, grid)
    if mod.shape[1] == geo.heads and geo.heads > 1:
        mod = ops.broadcast_to(mod, (geo.z, geo.heads, geo.block, geo.width))
        return ops.reshape(
            mod, (geo.z, geo.groups, geo.r, geo.block, geo.width)
        )
    mod = ops.broadcast_to(mod, (geo.z, 1, geo.block, geo.width))
    return ops.reshape(mod, (geo.z, 1, 1, geo.block, geo.width))


def empty(query, value, band):
    """Output `(b, 0, h, e)` and banded weights `(b, h, 0, band)` of an
    empty sequence (no blocks to compute)."""
    b, heads = ops.shape(query)[0], query.shape[2]
    out = ops.zeros((b, 0, heads, value.shape[-1]), query.dtype)
    return out, ops.zeros((b, heads, 0, band), value.dtype)
