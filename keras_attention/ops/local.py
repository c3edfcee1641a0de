"""Local (sliding-window) attention computed on the band only.

Query `i` attends to keys `j` with `i - left <= j <= i + right`. Instead of
masking a `T x T` score matrix, the sequence is cut into blocks of `B`
queries; query block `n` (positions `nB .. nB + B - 1`) only needs the
`W = B + left + right` keys `nB - left .. nB + B - 1 + right`. Those key
windows are built from shifted views of the key blocks (no gather), so
scores are `(b, n, g, r, B, W)`: time and memory are `O(T * W)`, linear in
`T` for a fixed window.

Axes in comments: b - batch, t - positions, n - blocks, i - query position
inside a block (`B`), j - key position inside a block's key window (`W`),
k - offset in the band (`L + R + 1`), h - query heads, g - key/value heads,
r - query heads per key/value head, d/e - key/value head dims.

Banded weights: `banded[..., i, k]` is the weight of query `i` on key
`i - left + k` (zero where that key does not exist); `banded_to_dense` and
`dense_to_banded` convert to and from `(..., T, T)`.
"""

import numpy as np
from keras import ops

from keras_attention.masks import window_bounds
from keras_attention.ops.attention import as_4d_mask
from keras_attention.ops.attention import masked_softmax


def default_block_size(left, right):
    """Query block size `B` for a window `(left, right)`.

    Larger blocks mean fewer, larger matrix products; smaller blocks waste
    fewer scores (a block computes `B * (B + left + right)` scores for
    `B * (left + right + 1)` useful ones). Half the window, kept in
    `[16, 128]`, balances the two on CPU.
    """
    return int(min(128, max(16, (left + right) // 2)))


def _pad_axis(x, axis, before, after, value=0):
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
    views = [blocks[:, o : o + num_blocks] for o in range(m)]
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
    flat = _pad_axis(flat, -1, 0, rows)
    return ops.reshape(flat, lead + (rows, width + 1))[..., :keep]


def _skew(x, keep):
    """`y[..., i, i + c] = x[..., i, c]`, zeros elsewhere (rows shift right);
    returns `(..., rows, keep)`; needs `keep <= rows + width - 1`."""
    shape = ops.shape(x)
    lead = tuple(shape[:-2])
    rows = x.shape[-2] if x.shape[-2] is not None else shape[-2]
    width = x.shape[-1]
    x = _pad_axis(x, -1, 0, rows)
    flat = ops.reshape(x, lead + (rows * (width + rows),))
    flat = flat[..., : rows * (width + rows - 1)]  # drop the last row's pad
    return ops.reshape(flat, lead + (rows, width + rows - 1))[..., :keep]


def banded_to_dense(weights, window_size, causal=False):
    """Expands banded weights `(..., T, L + R + 1)` to dense `(..., T, T)`.

    `dense[..., i, j] = weights[..., i, j - i + left]` inside the window,
    zero outside. `O(T^2)`: meant for plotting or checking short sequences.

    Args:
        weights: banded tensor, as returned by `local_attention` or
            `LocalSelfAttention(..., return_attention_scores=True)`.
        window_size: int or `(left, right)`, as given to the layer.
        causal: bool, as given to the layer.
    """
    left, right = window_bounds(window_size, causal)
    band = left + right + 1
    if weights.shape[-1] is not None and weights.shape[-1] != band:
        raise ValueError(
            f"`weights` must have {band} columns for window_size={window_size}, "
            f"causal={causal}. Received: weights.shape={tuple(weights.shape)}"
        )
    t = weights.shape[-2] if weights.shape[-2] is not None else ops.shape(weights)[-2]
    # y[i, i + k] = w[i, k]; key j = i - left + k sits at column j + left.
    y = _skew(weights, keep=left + t)
    return y[..., left:]


def dense_to_banded(dense, window_size, causal=False):
    """Reads the band of a dense `(..., T, T)` tensor: `(..., T, L + R + 1)`
    with `banded[..., i, k] = dense[..., i, i - left + k]` (zero where that
    key is outside `0 .. T - 1`). Inverse of `banded_to_dense` on the band.
    """
    left, right = window_bounds(window_size, causal)
    t = dense.shape[-1] if dense.shape[-1] is not None else ops.shape(dense)[-1]
    padded = _pad_axis(dense, -1, left, right)  # column c holds key c - left
    return _unskew(padded, width=t + left + right, keep=left + right + 1)


def _blocked_attention_mask(attention_mask, t, block, width, num_blocks, left):
    """Dense `(b|1, h|1, T, T)` mask -> per-block `(b|1, n, h|1, B, W)`."""
    mask = as_4d_mask(attention_mask)
    m = -(-width // block)
    mask = _pad_axis(mask, 2, 0, num_blocks * block - t, False)
    mask = _pad_axis(mask, 3, left, (num_blocks + m - 1) * block - left - t, False)
    shape = ops.shape(mask)
    mask = ops.reshape(
        mask, (shape[0], shape[1], num_blocks, block, ops.shape(mask)[3])
    )
    # Query block n reads key columns nB .. nB + W - 1 (padded coordinates).
    columns = ops.arange(num_blocks, dtype="int32")[:, None, None] * block
    columns = columns + ops.arange(width, dtype="int32")[None, None, :]
    mask = ops.take_along_axis(mask, columns[None, None], axis=-1)
    return ops.transpose(mask, (0, 2, 1, 3, 4))


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
):
    """Sliding-window softmax(q k^T * scale) v in `O(T * window)`.

    Equals `dot_product_attention` with the mask
    `sliding_window_mask(T, window_size, causal)` (and the padding masks),
    but never builds a `T x T` tensor.

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
        block_size: query block size `B`; defaults to `default_block_size`.
        scale: float; defaults to `1 / sqrt(d)`.
        dropout_fn: optional callable applied to the attention weights.
        return_weights: also return the banded weights `(b, h, t, L+R+1)`.

    Returns:
        `(b, t, h, e)` in the query's dtype, and the banded weights (value
        dtype) if `return_weights`.
    """
    left, right = window_bounds(window_size, causal)
    block = default_block_size(left, right) if block_size is None else block_size
    if not isinstance(block, int) or isinstance(block, bool) or block <= 0:
        raise ValueError(
            f"`block_size` must be a positive integer. Received: block_size={block}"
        )
    width = block + left + right  # W: keys seen by one query block
    m = -(-width // block)  # key blocks per window
    num_heads, num_groups = query.shape[2], key.shape[2]
    r = num_heads // num_groups
    d, e = query.shape[-1], value.shape[-1]
    if scale is None:
        scale = 1.0 / float(np.sqrt(d))
    b, t = ops.shape(query)[0], ops.shape(query)[1]
    n = (t + block - 1) // block
    q_pad = n * block - t
    k_after = (n + m - 1) * block - left - t

    # Query blocks: (b, n, B, g, r, d).
    query = ops.multiply(query, ops.cast(scale, query.dtype))
    q = _pad_axis(query, 1, 0, q_pad)
    q = ops.reshape(q, (b, n, block, num_groups, r, d))
    # Key/value windows: (b, n, W, g, d|e).
    k = _key_windows(_pad_axis(key, 1, left, k_after), block, width, n)
    v = _key_windows(_pad_axis(value, 1, left, k_after), block, width, n)

    # Mask (b|1, n, 1, 1, B, W): band, existing and unpadded keys/queries.
    i = np.arange(block)[:, None]
    j = np.arange(width)[None, :]
    # Query nB + i and key nB - left + j: offset j - i - left in [-left, right].
    band = ops.convert_to_tensor((j >= i) & (j <= i + left + right))
    if key_mask is None:
        key_valid = ops.ones((1, t), "bool")
    else:
        key_valid = ops.cast(key_mask, "bool")
    key_valid = _pad_axis(key_valid, 1, left, k_after, False)
    key_valid = _key_windows(key_valid, block, width, n)  # (b|1, n, W)
    mask = ops.logical_and(band[None, None], key_valid[:, :, None, :])
    if query_mask is not None:
        query_valid = _pad_axis(ops.cast(query_mask, "bool"), 1, 0, q_pad, False)
        query_valid = ops.reshape(query_valid, (-1, n, block))
        mask = ops.logical_and(mask, query_valid[:, :, :, None])
    mask = mask[:, :, None, None]
    if attention_mask is not None:
        extra = _blocked_attention_mask(attention_mask, t, block, width, n, left)
        heads = extra.shape[2]
        extra = ops.reshape(
            extra,
            (ops.shape(extra)[0], n, num_groups if heads != 1 else 1,
             r if heads != 1 else 1, block, width),
        )
        mask = ops.logical_and(mask, extra)

    scores = ops.einsum("bnigrd,bnjgd->bngrij", q, k)
    weights = masked_softmax(scores, mask)  # float32, masked entries 0
    weights = ops.cast(weights, value.dtype)
    kept = dropout_fn(weights) if dropout_fn is not None else weights
    out = ops.einsum("bngrij,bnjge->bnigre", kept, v)
    out = ops.reshape(out, (b, n * block, num_heads, e))[:, :t]
    if not return_weights:
        return out
    # (b, n, g, r, B, W) -> band offsets k = j - i: (b, h, t, L + R + 1).
    banded = _unskew(
        ops.reshape(weights, (b, n, num_heads, block, width)),
        width=width,
        keep=left + right + 1,
    )
    banded = ops.transpose(banded, (0, 2, 1, 3, 4))
    banded = ops.reshape(banded, (b, num_heads, n * block, left + right + 1))
    return out, banded[:, :, :t]
