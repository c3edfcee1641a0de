"""Local (sliding-window) attention computed on the band only.

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
"""

import numpy as np
from keras import ops

from keras_attention.masks import window_bounds
from keras_attention.ops.masking import as_4d_mask
from keras_attention.ops.masking import masked_softmax
from keras_attention.utils import validation


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
    key is outside `0 .. T - 1`). Inverse of `banded_to_dense` on the band.
    """
    left, right = window_bounds(window_size, causal)
    t = dense.shape[-1] if dense.shape[-1] is not None else ops.shape(dense)[-1]
    padded = _pad_axis(dense, -1, left, right)  # column c holds key c - left
    return _unskew(padded, width=t + left + right, keep=left + right + 1)


def _blocked_attention_mask(attention_mask, t, block, width, num_blocks, left):
    """Dense `(b|1, h|1, T, T)` mask -> per-block `(b|1, h|1, n, B, W)`."""
    mask = as_4d_mask(attention_mask)
    m = -(-width // block)
    mask = _pad_axis(mask, 2, 0, num_blocks * block - t, False)
    mask = _pad_axis(
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
    key_valid = _pad_axis(key_valid, 1, left, k_after, False)
    key_valid = _key_windows(key_valid, block, width, n)  # (b|1, n, W)
    key_valid = _fold_blocks(key_valid, b, n)  # (b n, W)
    mask = ops.logical_and(band[None], key_valid[:, None, :])  # (b n, B, W)
    if query_mask is not None:
        query_valid = ops.cast(query_mask, "bool")
        query_valid = _pad_axis(query_valid, 1, 0, n * block - t, False)
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
        block_size: query block size `B`; defaults to `default_block_size`.
        scale: float; defaults to `1 / sqrt(d)`.
        dropout_fn: optional callable applied to the attention weights
            (given as `(b * n, g, r * B, W)`: blocks folded into the batch).
        return_weights: also return the banded weights `(b, h, t, L+R+1)`.

    Returns:
        `(b, t, h, e)` in the query's dtype, and the banded weights (value
        dtype) if `return_weights`.

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
    left, right = window_bounds(window_size, causal)
    block = (
        default_block_size(left, right) if block_size is None else block_size
    )
    validation.check_positive_int("block_size", block)
    width = block + left + right  # W: keys seen by one query block
    m = -(-width // block)  # key blocks per window
    num_heads, num_groups = query.shape[2], key.shape[2]
    r = num_heads // num_groups
    d, e = query.shape[-1], value.shape[-1]
    if scale is None:
        scale = 1.0 / float(np.sqrt(d))
    b, t = ops.shape(query)[0], ops.shape(query)[1]
    n = (t + block - 1) // block
    k_after = (n + m - 1) * block - left - t
    out_dtype = query.dtype

    # Blocks are folded into the batch (z = b n) and query heads into the
    # rows of their key/value group (q = r B): every tensor has rank <= 5.
    # Scores are formed in float32 (no float16 overflow).
    query = ops.multiply(ops.cast(query, "float32"), scale)
    q = _pad_axis(query, 1, 0, n * block - t)
    q = ops.reshape(q, (b * n, block, num_heads, d))  # (z, B, h, d)
    q = ops.reshape(
        ops.transpose(q, (0, 2, 1, 3)), (b * n, num_groups, r * block, d)
    )
    # Key/value windows (b, n, W, g, d|e) -> (z, g, W, d|e).
    k = _key_windows(_pad_axis(key, 1, left, k_after), block, width, n)
    v = _key_windows(_pad_axis(value, 1, left, k_after), block, width, n)
    k = ops.transpose(
        ops.reshape(k, (b * n, width, num_groups, d)), (0, 2, 1, 3)
    )
    v = ops.transpose(
        ops.reshape(v, (b * n, width, num_groups, e)), (0, 2, 1, 3)
    )

    mask = _block_mask(
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
    )  # (z, g|1, r|1, B, W)
    scores = ops.einsum("zgqd,zgkd->zgqk", q, ops.cast(k, "float32"))
    scores = ops.reshape(scores, (b * n, num_groups, r, block, width))
    weights = masked_softmax(scores, mask)  # float32, masked entries 0
    weights = ops.reshape(
        ops.cast(weights, value.dtype), (b * n, num_groups, r * block, width)
    )
    kept = dropout_fn(weights) if dropout_fn is not None else weights
    out = ops.einsum("zgqk,zgke->zgqe", kept, v)  # (z, g, r B, e)
    out = ops.transpose(
        ops.reshape(out, (b * n, num_heads, block, e)), (0, 2, 1, 3)
    )
    out = ops.reshape(out, (b, n * block, num_heads, e))[:, :t]
    out = ops.cast(out, out_dtype)
    if not return_weights:
        return out
    # (z, h, B, W) -> band offsets k = j - i: (b, h, t, L + R + 1).
    banded = _unskew(
        ops.reshape(weights, (b * n, num_heads, block, width)),
        width=width,
        keep=left + right + 1,
    )
    banded = ops.reshape(banded, (b, n, num_heads, block, left + right + 1))
    banded = ops.transpose(banded, (0, 2, 1, 3, 4))
    banded = ops.reshape(banded, (b, num_heads, n * block, left + right + 1))
    return out, banded[:, :, :t]
