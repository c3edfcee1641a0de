"""Top-k sparse attention: each query attends only to the keys it names,
the attention step of DeepSeek Sparse Attention (DeepSeek-V3.2), whose
`layers.LightningIndexer` names them.

    o_i = sum_{j in S_i} softmax_j(scale * q_i . k_j) v_j,
    S_i = {indices[i, 0], ..., indices[i, k - 1]} (valid entries)

The keys and values are laid out head by head once (`(b g Tk, d)`
rows, `_flat_heads`), and a tile of queries gathers its rows for every
key/value head (`(b q g, k, d)`): each product is then a batched matrix
product with the contraction last, no gathered tile is transposed, and
with one key/value head (MQA, as DeepSeek-V3.2 runs it) each gathered
row serves every query head. The tiles are scored and normalized in a
loop (`keras.ops.scan`): no `(Tq, Tk)` tensor is formed, nor one gather
of every query's keys; memory is O(Tq * k) plus one tile. The backward
pass is hand-written (`_backend.custom_vjp`: a custom gradient on
TensorFlow and JAX, a `torch.autograd.Function` on PyTorch): it
recomputes each tile's probabilities from the saved log-sum-exp and adds
the keys' and values' gradients into their rows in place
(`_backend.scatter_add`: a new accumulator per tile would cost O(Tk)
each, O(Tq Tk) in all), so nothing of the tiles is kept between the
passes, on any backend. On TensorFlow the backward loop of large inputs
runs compiled with XLA (`_backward_loop`): TensorFlow's own in-place add
goes row by row, several times slower.

The cost is the gathers: each pass reads `Tq * k * g` rows of keys and
values at random, which a CPU serves far below its streaming bandwidth
(see `benchmarks/topk_attention.py`).

Backward, per tile (P the probabilities, dO the output's gradient, dl
the log-sum-exp's): `dV = P^T dO`, `dP = dO V^T`, `dS = P * (dP -
rowsum(dO * O) + dl)`, `dQ = dS K`, `dK = dS^T Q`.

Axes in comments: b - batch, q - queries of a tile, k - the selected
keys (slots) of a query, g - key/value heads, r - query heads per
key/value head (h = g r), d/e - key/value head dims, s - key positions;
n - a tile's `(b q g)` rows in the products (the tiles in `_tiles`).
"""

import math

import keras
from keras import ops

from keras_attention.ops import _backend
from keras_attention.ops import scoring
from keras_attention.ops.log_sum_exp import lse_dtype
from keras_attention.ops.log_sum_exp import row_log_sum_exp
from keras_attention.utils import attention_checks
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

# Gathered key and value elements of one tile, per batch element (32 MiB
# in float32): the query tile is the largest power of two (at most
# `MAX_QUERY_BLOCK`) within it. The backward's tiles are smaller (8 MiB)
# where XLA compiles its loop (`_backward_loop`; JAX's `jit`): it ran
# faster on tiles nearer the cache's size (T = 8,192, top-k 256, one
# key/value head: 64 rows 1.4x faster than 256, a rough 2-core
# measurement). PyTorch's eager loop takes tiles of the forward's size
# (`_backend.loops_run_eagerly`), fewer steps.
TILE_ELEMENTS = 2**23
BACKWARD_TILE_ELEMENTS = 2**21
EAGER_BACKWARD_TILE_ELEMENTS = 2**23  # at most TILE_ELEMENTS
MAX_QUERY_BLOCK = 512


def query_block_size(length, top_k, kv_heads, width, budget=None):
    """The rows of a query tile: the largest power of two, at most
    `MAX_QUERY_BLOCK`, whose gathered keys and values (`rows * top_k *
    kv_heads * width` elements, `width` the key and value dims together)
    fit in `budget` (None: `TILE_ELEMENTS`), and no larger than `length`
    rounded up to a power of two (None: unknown, one tile)."""
    budget = TILE_ELEMENTS if budget is None else budget
    rows = MAX_QUERY_BLOCK
    while rows > 1 and rows * top_k * kv_heads * width > budget:
        rows //= 2
    if length is not None:
        rows = min(rows, 2 ** math.ceil(math.log2(max(length, 1))))
    return rows


def _check(query, key, value, indices):
    shapes = [tuple(x.shape) for x in (query, key, value)]
    if any(len(s) != 4 for s in shapes) or len(indices.shape) != 3:
        raise ValueError(
            "`topk_attention` takes query (batch, Tq, heads, dim), key and "
            "value (batch, Tk, kv_heads, dim) and indices (batch, Tq, k). "
            f"Received: query.shape={shapes[0]}, key.shape={shapes[1]}, "
            f"value.shape={shapes[2]}, indices.shape={tuple(indices.shape)}"
        )
    heads, groups = shapes[0][2], shapes[1][2]
    if groups != shapes[2][2] or heads % groups or shapes[0][3] != shapes[1][3]:
        raise ValueError(
            "`key` and `value` must have the same number of heads, which "
            "divides the query's, and `key` the query's head dim. "
            f"Received: query.shape={shapes[0]}, key.shape={shapes[1]}, "
            f"value.shape={shapes[2]}"
        )
    known = [s for s in (shapes[1][1], shapes[2][1]) if s is not None]
    if len(set(known)) > 1:
        raise ValueError(
            "`key` and `value` must have one length. Received: "
            f"key.shape={shapes[1]}, value.shape={shapes[2]}"
        )
    pairs = zip(shapes[0][:2], tuple(indices.shape)[:2])
    if any(a is not None and c is not None and a != c for a, c in pairs):
        raise ValueError(
            "`indices` must have one row per query of each example "
            "(batch, Tq, k). "
            f"Received: indices.shape={tuple(indices.shape)}, "
            f"query.shape={shapes[0]}"
        )
    if "int" not in keras.backend.standardize_dtype(indices.dtype):
        raise TypeError(
            "`indices` must be integers (key positions; negative: none). "
            f"Received: indices.dtype={indices.dtype!r}"
        )


def _slots(indices, key, causal, query_offset, query_mask, key_mask, mask):
    """`(rows, valid)` `(b, Tq, k)`: each slot's row in the keys of
    key/value head 0 flattened by `_flat_heads` (`b * g * Tk` rows; head
    `n`'s is `n * Tk` further: `_head_rows`), the example's first where
    invalid, and whether it may be attended to (an index in `[0, Tk)`,
    causal, on a real key and query, `mask`)."""
    b, tk, groups = ops.shape(key)[0], ops.shape(key)[1], key.shape[2]
    idx = ops.cast(indices, "int32")
    valid = ops.logical_and(idx >= 0, idx < tk)
    if causal:
        tq = ops.shape(idx)[1]
        offset = ops.cast(query_offset, "int32")
        positions = ops.arange(tq, dtype="int32") + offset
        valid = ops.logical_and(valid, idx <= positions[None, :, None])
    idx = ops.where(valid, idx, ops.zeros_like(idx))
    example = ops.arange(b, dtype="int32")[:, None, None] * ops.cast(
        tk, "int32"
    )
    if key_mask is not None:
        flat = ops.reshape(ops.cast(key_mask, "bool"), (-1,))
        valid = ops.logical_and(valid, ops.take(flat, idx + example, axis=0))
    if query_mask is not None:
        valid = ops.logical_and(valid, ops.cast(query_mask, "bool")[..., None])
    if mask is not None:
        valid = ops.logical_and(valid, ops.cast(mask, "bool"))
    return idx + example * groups, valid


def _tiles(x, n, rows):
    """`(b, n * rows, ...)` -> `(n, b, rows, ...)`."""
    shape = tuple(x.shape[2:])
    x = ops.reshape(x, (ops.shape(x)[0], n, rows) + shape)
    return ops.moveaxis(x, 1, 0)


def _untile(x):
    """`(n, b, rows, ...)` -> `(b, n * rows, ...)`."""
    x = ops.moveaxis(x, 0, 1)
    shape = ops.shape(x)
    return ops.reshape(x, (shape[0], -1) + tuple(x.shape[3:]))


def _pad(x, extra):
    """`x` `(b, T, ...)` with `extra` zero (False) rows appended."""
    if not extra:
        return x
    shape = (ops.shape(x)[0], extra) + tuple(x.shape[2:])
    return ops.concatenate([x, ops.zeros(shape, x.dtype)], axis=1)


def _flat_heads(x):
    """Keys or values `(b, s, g, d)` as rows `(b * g * s, d)`, head by
    head (a transpose, none for one head): a gather of them is already
    in the layout of the products (`(b q g, k, d)`)."""
    if x.shape[2] != 1:
        x = ops.transpose(x, (0, 2, 1, 3))
    return ops.reshape(x, (-1, x.shape[-1]))


def _unflat_heads(x, like):
    """`_flat_heads`' rows `(b * g * s, d)` back to `like`'s `(b, s, g,
    d)`."""
    b, s, groups = ops.shape(like)[0], ops.shape(like)[1], like.shape[2]
    if groups == 1:
        return ops.reshape(x, ops.shape(like))
    x = ops.reshape(x, (b, groups, s, like.shape[3]))
    return ops.transpose(x, (0, 2, 1, 3))


def _head_rows(rows, kv):
    """Rows `(b, q, k)` of head 0 -> `(b q g k,)`, every head's (`kv`:
    `(flat keys, flat values, g, Tk)`)."""
    groups, length = kv[2], kv[3]
    rows = rows[:, :, None, :]
    if groups > 1:
        step = ops.cast(length, "int32")
        rows = rows + (ops.arange(groups, dtype="int32") * step)[:, None]
    return ops.reshape(rows, (-1,))


def _gather(flat, ids, slots):
    """Rows `ids` of `flat` as `(b q g, k, d)`."""
    rows = _backend.take_rows(flat, ids)  # `ids` lie in range
    return ops.reshape(rows, (-1, slots, flat.shape[1]))


def _scores(q, kt, valid, scale, groups):
    """Masked scores `(b, q, g, r, k)` in the softmax dtype of a tile's
    queries `(b, q, h, d)` on its gathered keys `(b q g, k, d)`
    (`scoring.modify_scores`), the mask `(b, q, 1, 1, k)` and the scaled
    queries `(b q g, r, d)`. Each product is a batched matrix product
    with the contraction last: no operand is transposed."""
    dtype = scoring.score_dtype(q.dtype)
    per_group = q.shape[2] // groups
    q = ops.multiply(ops.cast(q, dtype), keras_utils.constant(scale, dtype))
    q = ops.reshape(q, (-1, per_group, q.shape[3]))
    s = ops.einsum("nrd,nkd->nrk", q, ops.cast(kt, dtype))
    shape = ops.shape(valid)
    s = ops.reshape(s, (shape[0], shape[1], groups, per_group, shape[2]))
    mask = valid[:, :, None, None, :]
    s, _ = scoring.modify_scores(s, None, mask=mask)
    return s, mask, q


def _probabilities(s, mask, lse):
    """`exp(s - lse)` on the mask, 0 elsewhere and on empty rows (`lse`
    `-inf`)."""
    finite = lse > float("-inf")
    p = ops.exp(s - ops.where(finite, lse, ops.zeros_like(lse)))
    return p * ops.cast(mask, s.dtype)


def _forward_tile(q, kv, rows, valid, scale):
    """The output `(b, q, h, e)` and log-sum-exp `(b, q, h)` of a tile."""
    ids, slots = _head_rows(rows, kv), rows.shape[2]
    kt, vt = _gather(kv[0], ids, slots), _gather(kv[1], ids, slots)
    s, mask, qg = _scores(q, kt, valid, scale, kv[2])
    lse = row_log_sum_exp(s, ops.any(mask, axis=-1, keepdims=True))
    p = _probabilities(s, mask, lse)
    p = ops.reshape(ops.cast(p, vt.dtype), (-1, qg.shape[1], slots))
    out = ops.einsum("nrk,nke->nre", p, vt)
    shape = ops.shape(q)
    out = ops.reshape(out, (shape[0], shape[1], q.shape[2], vt.shape[-1]))
    return ops.cast(out, q.dtype), ops.reshape(lse, ops.shape(out)[:3])


def _backward_tile(q, kv, rows, valid, scale, grads):
    """`(dq (b, q, h, d), dk and dv contributions (b q g k, d|e), their
    rows)` of a tile; `grads`: `(dO (b, q, h, e), rowsum(dO * O), lse,
    dlse)`, the last three `(b, q, h)`."""
    d_out, dd, lse, d_lse = grads
    ids, slots = _head_rows(rows, kv), rows.shape[2]
    kt, vt = _gather(kv[0], ids, slots), _gather(kv[1], ids, slots)
    s, mask, qg = _scores(q, kt, valid, scale, kv[2])
    dtype, per_group = s.dtype, qg.shape[1]
    p = _probabilities(s, mask, ops.reshape(lse, ops.shape(s)[:4] + (1,)))
    p = ops.reshape(p, (-1, per_group, slots))
    do = ops.reshape(ops.cast(d_out, dtype), (-1, per_group, d_out.shape[3]))
    dp = ops.einsum("nre,nke->nrk", do, ops.cast(vt, dtype))
    ds = p * (dp - ops.reshape(dd - d_lse, (-1, per_group, 1)))
    dq = ops.einsum("nrk,nkd->nrd", ds, ops.cast(kt, dtype))
    dq = ops.reshape(dq * keras_utils.constant(scale, dtype), ops.shape(q))
    # `qg` is scaled already: dK = dS^T (scale Q). It is in the score
    # dtype (bfloat16 for bfloat16: PyTorch's einsum takes one dtype).
    dk = ops.einsum("nrk,nrd->nkd", ds, ops.cast(qg, dtype))
    dv = ops.einsum("nrk,nre->nke", p, do)
    flat_k, flat_v = (-1, kt.shape[2]), (-1, vt.shape[2])
    return dq, ops.reshape(dk, flat_k), ops.reshape(dv, flat_v), ids


def _backward_tiles(xs, flat_k, flat_v, groups, length, scale):
    """`(dq tiles (n, b, q, h, d), dk rows, dv rows)` (the rows as
    `_flat_heads` lays them out) of the tiles `xs` `(q, rows, valid, dO,
    rowsum(dO * O), lse, dlse)`."""
    kv = (flat_k, flat_v, groups, length)
    dtype = xs[5].dtype

    def body(i, carry):
        dq_tiles, dk_acc, dv_acc = carry
        x = [t[i] for t in xs]
        dq, dk, dv, ids = _backward_tile(x[0], kv, x[1], x[2], scale, x[3:])
        # In place: a new accumulator per tile would cost O(Tk) each.
        dk_acc = _backend.scatter_add(dk_acc, ids, dk)
        dv_acc = _backend.scatter_add(dv_acc, ids, dv)
        start = (i,) + (0,) * 4
        dq_tiles = _backend.write_slice(dq_tiles, start, dq[None])
        return dq_tiles, dk_acc, dv_acc

    init = (
        ops.zeros(ops.shape(xs[0]), dtype),
        _backend.zeros_accumulator(ops.shape(flat_k), dtype),
        _backend.zeros_accumulator(ops.shape(flat_v), dtype),
    )
    return ops.fori_loop(0, ops.shape(xs[0])[0], body, init)


# The backward loop compiled with XLA on TensorFlow (other backends: as
# it is; JAX compiles `_attend` whole), from `XLA_MIN_PAIRS` (query,
# key/value head, slot) triples: XLA adds the rows of dK and dV into
# their accumulators in place several times faster than TensorFlow's
# `InplaceAdd` (which runs row by row), but compiles each shape once
# (about a second).
_backward_tiles_xla = _backend.compile_step(
    _backward_tiles, True, autograph=False
)
XLA_MIN_PAIRS = 2**18


def _backward_loop(xs, flat_k, flat_v, groups, length, scale):
    """`_backward_tiles`, compiled with XLA for large tiles (`xs[1]`, the
    rows `(n, b, q, k)`; an unknown batch counts as 1)."""
    shape = tuple(xs[1].shape)
    pairs = math.prod(size or 1 for size in shape) * groups
    loop = _backward_tiles
    if None not in shape[2:] and pairs >= XLA_MIN_PAIRS:
        loop = _backward_tiles_xla
    return loop(xs, flat_k, flat_v, groups, length, scale)


def _attend(q, k, v, rows, valid, scale, blocks, return_lse):
    """The tiled kernel on padded inputs (`Tq` a multiple of both
    `blocks`, the forward's and the backward's query tiles; -1: one tile
    of unknown length): the output, and the log-sum-exp `(b, Tq, h)`
    when `return_lse`."""
    query_block = blocks[0]
    n = 1 if query_block == -1 else q.shape[1] // query_block

    def heads(k, v):
        return _flat_heads(k), _flat_heads(v), k.shape[2], ops.shape(k)[1]

    def forward(q, k, v, aux):
        rows, valid = aux
        kv = heads(k, v)
        xs = tuple(_tiles(x, n, query_block) for x in (q, rows, valid))
        shape = ops.shape(xs[0])[1:4]
        init = (
            ops.zeros(shape + (v.shape[-1],), q.dtype),
            ops.zeros(shape, lse_dtype(q.dtype)),
        )

        def body(carry, x):
            del carry
            result = _forward_tile(x[0], kv, x[1], x[2], scale)
            return result, result

        _, (out, lse) = _backend.scan_carry(body, init, xs)
        out, lse = _untile(out), _untile(lse)
        result = (out, lse) if return_lse else out
        return result, (q, k, v, rows, valid, out, lse)

    def backward(residuals, d_output):
        q, k, v, rows, valid, out, lse = residuals
        d_out, d_lse = d_output if return_lse else (d_output, None)
        dtype = lse.dtype
        d_lse = ops.zeros_like(lse) if d_lse is None else ops.cast(d_lse, dtype)
        dd = ops.sum(ops.cast(d_out, dtype) * ops.cast(out, dtype), axis=-1)
        block = blocks[1]
        n_back = 1 if block == -1 else q.shape[1] // block
        xs = tuple(
            _tiles(x, n_back, block)
            for x in (q, rows, valid, d_out, dd, lse, d_lse)
        )
        dq, dk, dv = _backward_loop(xs, *heads(k, v), scale=scale)
        dq = ops.cast(_untile(dq), q.dtype)
        dk = ops.cast(_unflat_heads(dk, k), k.dtype)
        dv = ops.cast(_unflat_heads(dv, v), v.dtype)
        return dq, dk, dv

    # q, k and v are all it differentiates: PyTorch may run `backward`.
    attend = _backend.custom_vjp(forward, backward, all_params=True)
    return attend(q, k, v, (rows, valid))


_attend_compiled = _backend.compiled_kernel(
    _attend, static_argnames=("scale", "blocks", "return_lse")
)


def _empty(query, value, return_lse):
    b, tq, heads = ops.shape(query)[0], ops.shape(query)[1], query.shape[2]
    out = ops.zeros((b, tq, heads, value.shape[-1]), query.dtype)
    if not return_lse:
        return out
    lse = ops.full((b, heads, tq), float("-inf"), lse_dtype(query.dtype))
    return out, lse


def topk_attention(
    query,
    key,
    value,
    indices,
    *,
    scale=None,
    causal=False,
    query_offset=0,
    query_mask=None,
    key_mask=None,
    index_mask=None,
    return_lse=False,
    query_block=None,
):
    """Attention of each query on the keys `indices` names (top-k sparse
    attention), in tiles of queries: memory O(Tq * k), never O(Tq * Tk).

    `o_i = sum_{j in S_i} softmax_j(scale * q_i . k_j) v_j` over the
    valid entries `S_i` of `indices[:, i]`: the same as
    `dot_product_attention` under the mask "key `j` is in `indices[:,
    i]`" (and-ed with the masks below), up to float rounding, with
    gradients for the query, key and value. The package's rules: masks
    are True where a query may attend; scores and softmax run in at least
    float32 (float64 stays float64); a query with no valid entry gets a
    zero output (log-sum-exp `-inf`) and zero gradients, never NaN.

    Args:
        query: `(b, Tq, h, d)`.
        key: `(b, Tk, g, d)` with `h % g == 0` (grouped-query: query head
            `n` reads key/value head `n // (h // g)`).
        value: `(b, Tk, g, e)`.
        indices: integer `(b, Tq, k)`, the key positions each query
            attends to. An entry outside `[0, Tk)` (-1, as
            `LightningIndexer` pads a query with fewer than `k` keys)
            selects nothing. Entries of a row should be distinct: a
            repeated one is a key counted twice.
        scale: float; defaults to `1 / sqrt(d)`.
        causal: bool, an entry `j > i + query_offset` selects nothing.
        query_offset: int or scalar int tensor, the position of the
            first query (a cache offset), for `causal`.
        query_mask: optional bool `(b, Tq)`, True on real queries; the
            others get zeros.
        key_mask: optional bool `(b, Tk)`, True on real keys; entries on
            the others select nothing.
        index_mask: optional bool `(b, Tq, k)`, True where an entry of
            `indices` may be attended to.
        return_lse: also return the log-sum-exp `(b, h, Tq)` (float32;
            float64 for float64 inputs), `-inf` on rows with no valid
            entry, differentiable (`merge_attention` combines it).
        query_block: queries per tile (None: `query_block_size`); the
            results do not depend on it. A query length unknown at trace
            time runs in one tile.

    Returns:
        `(b, Tq, h, e)` in the query's dtype, then the log-sum-exp when
        `return_lse`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> rng = np.random.default_rng(0)
    >>> q = rng.normal(size=(1, 4, 2, 8)).astype("float32")
    >>> kv = rng.normal(size=(1, 6, 1, 8)).astype("float32")
    >>> indices = np.array([[[0, -1], [1, 0], [2, 0], [3, 1]]])
    >>> out = keras_attention.ops.topk_attention(q, kv, kv, indices)
    >>> tuple(out.shape)
    (1, 4, 2, 8)
    >>> np.allclose(np.asarray(out)[0, 0], kv[0, 0])  # only key 0
    True
    """
    query, key, value, indices = attention_checks.as_tensors(
        query=query, key=key, value=value, indices=indices
    )
    query_mask, key_mask, index_mask = attention_checks.as_tensors(
        query_mask=query_mask, key_mask=key_mask, index_mask=index_mask
    )
    _check(query, key, value, indices)
    causal = validation.check_bool("causal", causal)
    return_lse = validation.check_bool("return_lse", return_lse)
    query_block = validation.check_positive_int(
        "query_block", query_block, allow_none=True
    )
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    scale = float(validation.check_finite_number("scale", scale))
    for name, mask, length in (
        ("query_mask", query_mask, query.shape[1]),
        ("key_mask", key_mask, key.shape[1]),
    ):
        shape = None if mask is None else tuple(mask.shape)
        if shape is not None and (
            len(shape) != 2
            or None not in (length, shape[1])
            and shape[1] != length
        ):
            raise ValueError(
                f"`{name}` must have shape (batch, {length}). Received: "
                f"{name}.shape={tuple(mask.shape)}"
            )
    if index_mask is not None and len(index_mask.shape) != 3:
        raise ValueError(
            "`index_mask` must have the shape of `indices` (batch, Tq, k). "
            f"Received: index_mask.shape={tuple(index_mask.shape)}"
        )
    if 0 in (query.shape[1], key.shape[1], indices.shape[2]):
        return _empty(query, value, return_lse)
    rows, valid = _slots(
        indices, key, causal, query_offset, query_mask, key_mask, index_mask
    )
    tq = query.shape[1]
    width = key.shape[-1] + value.shape[-1]
    # The backward's tile divides the forward's (powers of two).
    backward = BACKWARD_TILE_ELEMENTS
    if _backend.loops_run_eagerly():
        backward = EAGER_BACKWARD_TILE_ELEMENTS
    blocks = tuple(
        query_block
        or query_block_size(tq, indices.shape[2], key.shape[2], width, size)
        for size in (TILE_ELEMENTS, backward)
    )
    extra = 0 if tq is None else -tq % blocks[0]
    if tq is None:
        blocks = (-1, -1)  # One tile of unknown length.
    q, rows, valid = (_pad(x, extra) for x in (query, rows, valid))
    result = _attend_compiled(
        q, key, value, rows, valid, scale, blocks, return_lse
    )
    if not return_lse:
        return result[:, :tq] if extra else result
    out, lse = result
    if extra:
        out, lse = out[:, :tq], lse[:, :tq]
    return out, ops.transpose(lse, (0, 2, 1))
