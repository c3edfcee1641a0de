"""Sliding-window attention with global tokens (Longformer):
`global_local_attention` and `global_local_weights_to_dense`.

The non-global queries take one softmax over their window (laid out in
blocks as in `sliding_window.py`, global keys removed from it) joined
with the `S` gathered global keys; the `S` global queries attend to every
key. Time and memory are `O(T * (W + S))`: no `T x T` tensor is formed.
Axes in comments as in `sliding_window.py`; s/S - global slots.
"""

import numpy as np
from keras import ops

from keras_attention.ops import _scope
from keras_attention.ops import scoring
from keras_attention.ops import sliding_window
from keras_attention.ops.masking import masked_softmax
from keras_attention.ops.window_gather import gather_windows
from keras_attention.utils import attention_checks
from keras_attention.utils import keras_utils
from keras_attention.utils import validation


def _empty_global(query, value, band, count, return_weights):
    """`global_local_attention` on an empty sequence:
    `sliding_window.empty`, and the global weights with `count` unused
    slots."""
    out, local = sliding_window.empty(query, value, band)
    if not return_weights:
        return out
    b, heads = ops.shape(query)[0], query.shape[2]
    return out, {
        "local": local,
        "global_keys": ops.zeros((b, heads, 0, count), value.dtype),
        "global_queries": ops.zeros((b, heads, count, 0), value.dtype),
        "global_indices": ops.full((b, count), -1, "int32"),
    }


def _global_count(global_mask, max_global):
    """Static number `S` of global slots: `max_global`, or (eagerly) the
    largest number of global positions of a batch row (at least 1)."""
    if max_global is not None:
        return validation.check_positive_int("max_global", max_global)
    counts = ops.sum(ops.cast(global_mask, "int32"), axis=1)
    try:
        counts = ops.convert_to_numpy(counts)
    except Exception as error:  # a symbolic tensor (tf.function, jax.jit)
        raise ValueError(
            "`max_global` (the layers' `max_global_tokens`) must be an int "
            "when `global_mask` is symbolic (inside a compiled function): "
            "the number of global slots must be static. Received: "
            f"max_global={max_global!r}"
        ) from error
    return max(int(np.max(counts, initial=0)), 1)


def _check_global_mask(global_mask, query):
    """Boolean `(b, t)` global mask; `ValueError` naming it otherwise."""
    shape = tuple(getattr(global_mask, "shape", ()))
    dtype = str(getattr(global_mask, "dtype", type(global_mask).__name__))
    expected = (query.shape[0], query.shape[1])
    ok = len(shape) == 2 and all(
        a is None or w is None or a == w for a, w in zip(shape, expected)
    )
    if not ok or "bool" not in dtype:
        raise ValueError(
            "`global_mask` must be a boolean tensor of shape (batch, T) = "
            f"{expected!r}, True at global positions. Received: "
            f"global_mask.shape={shape!r}, global_mask.dtype={dtype!r}"
        )
    return ops.convert_to_tensor(global_mask)


def _global_slots(global_mask, count, t):
    """The first `count` global positions of each row.

    Returns `slots` `(b, S)` int32 (ascending; positions of unused slots
    are arbitrary), `slot_valid` `(b, S)` bool and `effective` `(b, t)`
    bool (the global positions that got a slot).
    """
    flags = ops.cast(global_mask, "int32")
    effective = ops.logical_and(
        ops.cast(global_mask, "bool"), ops.cumsum(flags, axis=1) <= count
    )
    # Earlier positions rank higher; `count` zero columns keep top_k valid
    # when count > t.
    rank = ops.cast(t - ops.arange(t, dtype="int32"), "float32")
    priority = ops.where(effective, rank[None, :], 0.0)
    priority = sliding_window.pad_axis(priority, 1, 0, count)
    values, slots = ops.top_k(priority, k=count)
    slots = ops.minimum(ops.cast(slots, "int32"), ops.maximum(t - 1, 0))
    return slots, values > 0.0, effective


def _gather(x, slots):
    """`x` `(b, t, ...)` at `slots` `(b, S)` -> `(b, S, ...)`."""
    rows = gather_windows(x, slots[:, :, None])  # (b, S, 1, ...)
    return ops.reshape(rows, (ops.shape(x)[0], -1) + tuple(x.shape[2:]))


def _global_key_scores(geo, q, keys, key_ok, slots, query_valid):
    """Scores `(z, g, r, B, S)` and mask `(z, 1, 1, B, S)` of every query
    block on the `S` gathered global keys `(b, S, g, d)`."""
    b, n, block = geo.b, geo.n, geo.block
    qb = ops.reshape(q, (b, n, geo.groups, geo.r * block, geo.d))
    keys = ops.transpose(ops.cast(keys, q.dtype), (0, 2, 1, 3))
    scores = ops.einsum("bngqd,bgsd->bngqs", qb, keys)
    scores = ops.reshape(scores, (geo.z, geo.groups, geo.r, block, -1))
    mask = key_ok[:, None, None, :]  # (b, 1, 1, S)
    if geo.causal:
        positions = ops.reshape(
            ops.arange(n * block, dtype="int32"), (n, block)
        )
        mask = ops.logical_and(
            mask, slots[:, None, None, :] <= positions[None, :, :, None]
        )
    query_valid = sliding_window.pad_axis(
        query_valid, 1, 0, n * block - geo.t, False
    )
    query_valid = ops.reshape(query_valid, (b, n, block, 1))
    mask = ops.logical_and(mask, query_valid)  # (b, n, B, S)
    mask = ops.reshape(mask, (geo.z, 1, 1, block, -1))
    return scores, mask


def _global_rows(
    geo,
    queries,
    keys,
    values,
    key_valid,
    slots,
    row_ok,
    scale,
    causal,
    dropout_fn,
):
    """Full attention of the `S` global queries over all `t` keys.

    `queries` `(b, S, h, d)`, `keys`/`values` `(b, t, g, d|e)`; returns
    `(b, S, h, e)` and the weights `(b, g, r, S, t)` (value dtype).
    """
    dtype = scoring.softmax_dtype(queries.dtype)
    queries = ops.multiply(
        ops.cast(queries, dtype), keras_utils.constant(scale, dtype)
    )
    # S (-1): static only once the slots are gathered in eager calls.
    queries = ops.reshape(queries, (geo.b, -1, geo.groups, geo.r, geo.d))
    scores = ops.einsum("bsgrd,btgd->bgrst", queries, ops.cast(keys, dtype))
    mask = ops.logical_and(
        row_ok[:, :, None], key_valid[:, None, :]
    )  # (b, S, t)
    if causal:
        mask = ops.logical_and(
            mask,
            ops.arange(geo.t, dtype="int32")[None, None] <= slots[..., None],
        )
    weights = masked_softmax(scores, mask[:, None, None])
    weights = ops.cast(weights, values.dtype)
    kept = dropout_fn(weights) if dropout_fn is not None else weights
    rows = ops.einsum("bgrst,btge->bsgre", kept, values)
    return ops.reshape(rows, (geo.b, -1, geo.heads, geo.e)), weights


def global_local_attention(
    query,
    key,
    value,
    window_size,
    global_mask,
    causal=False,
    query_mask=None,
    key_mask=None,
    max_global=None,
    global_query=None,
    global_key=None,
    global_value=None,
    block_size=None,
    scale=None,
    dropout_fn=None,
    return_weights=False,
):
    """Sliding-window attention with global tokens (Longformer), in
    `O(T * (W + S))`.

    Query `i` may attend to key `j` when

        (|window(i, j)| or global[i] or global[j]) and valid(i, j)

    (`valid`: the padding masks, and `j <= i` if `causal`): global
    positions attend to every key and every query attends to them. This
    equals `dot_product_attention` with that dense mask, but no `T x T`
    tensor is formed: the non-global queries take one softmax over their
    window (global keys removed from it, so nothing counts twice) joined
    with the `S` gathered global keys; the `S` global queries' rows are
    replaced by their full attention over the `T` keys (`S x T`).
    Under `causal`, a global query still only sees keys `j <= i`, and a
    global key `j` is seen by the queries `i >= j`.

    `S` is static: `max_global`, or, when the mask is concrete (eager),
    the largest number of global positions in a row. Only the first
    `max_global` global positions of a row are global; later ones stay
    local.

    Args:
        query: `(b, t, h, d)`.
        key: `(b, t, g, d)`, same `t`; `h % g == 0` (grouped-query).
        value: `(b, t, g, e)`.
        window_size: int (`left = right`) or `(left, right)`.
        global_mask: boolean `(b, t)`, True at global positions.
        causal: bool, `right = 0` and no key after its query.
        query_mask: optional boolean `(b, t)`; padded queries get zero
            weights and a zero result.
        key_mask: optional boolean `(b, t)`; padded keys get no weight.
        max_global: optional int, the number `S` of global slots per row
            (required inside compiled functions).
        global_query: optional `(b, t, h, d)` queries of the global rows
            (Longformer's separate global projections); defaults to
            `query`.
        global_key: optional `(b, t, g, d)` keys of the global rows;
            defaults to `key`.
        global_value: optional `(b, t, g, e)` values of the global rows;
            defaults to `value`.
        block_size: query block size `B` (at most `t`); defaults to
            `default_block_size`.
        scale: float; defaults to `1 / sqrt(d)`.
        dropout_fn: optional callable applied to the attention weights
            (window and global keys together, then the global rows).
        return_weights: also return a dict of weights (value dtype):
            `"local"` `(b, h, t, L + R + 1)` banded weights on the window
            keys (`L`, `R` capped at `t`: `effective_window`),
            `"global_keys"` `(b, h, t, S)` weights on the global keys,
            `"global_queries"` `(b, h, S, t)` rows of the global queries,
            `"global_indices"` `(b, S)` int32 positions of the slots (-1 for
            unused slots). The rows of global queries are zero in the first
            two. `global_local_weights_to_dense` expands them.

    Returns:
        `(b, t, h, e)` in the query's dtype, and the weights if
        `return_weights`.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> x = np.random.default_rng(0).normal(size=(1, 10, 2, 4))
    >>> x = x.astype("float32")
    >>> is_global = np.zeros((1, 10), bool)
    >>> is_global[0, 0] = True  # e.g. a [CLS] token
    >>> out, w = keras_attention.ops.global_local_attention(
    ...     x, x, x, window_size=1, global_mask=is_global,
    ...     return_weights=True)
    >>> tuple(out.shape), tuple(w["global_keys"].shape)
    ((1, 10, 2, 4), (1, 2, 10, 1))
    >>> row = keras.ops.convert_to_numpy(w["global_queries"][0, 0, 0])
    >>> round(float(row.sum()), 4)
    1.0

    References:
        - Beltagy et al., 2020, "Longformer: The Long-Document Transformer".
    """
    query, key, value = attention_checks.as_tensors(
        query=query, key=key, value=value
    )
    global_mask, query_mask, key_mask = attention_checks.as_tensors(
        global_mask=global_mask, query_mask=query_mask, key_mask=key_mask
    )
    _scope.refuse_in_exclusive_scope(
        "`global_local_attention`", "its kernel is its own"
    )
    left, right = sliding_window.effective_window(
        window_size, sliding_window.static_length(query, 1), causal
    )
    if sliding_window.static_length(query, 1) == 0:
        global_mask = _check_global_mask(global_mask, query)
        count = _global_count(global_mask, max_global)
        return _empty_global(
            query, value, left + right + 1, count, return_weights
        )
    geo = sliding_window.Geometry(
        query, key, value, left, right, block_size, causal
    )
    if scale is None:
        scale = 1.0 / float(np.sqrt(geo.d))
    global_mask = _check_global_mask(global_mask, query)
    count = _global_count(global_mask, max_global)
    slots, slot_valid, effective = _global_slots(global_mask, count, geo.t)

    def valid(mask):
        if mask is None:
            return ops.ones((geo.b, geo.t), "bool")
        return ops.broadcast_to(ops.cast(mask, "bool"), (geo.b, geo.t))

    query_valid, key_valid = valid(query_mask), valid(key_mask)
    window_keys = ops.logical_and(key_valid, ops.logical_not(effective))
    q, k, v, mask = sliding_window.blocked(
        geo, query, key, value, scale, query_valid, window_keys, None
    )
    key_ok = ops.logical_and(slot_valid, _gather(key_valid, slots))
    global_scores, global_mask_blocks = _global_key_scores(
        geo, q, _gather(key, slots), key_ok, slots, query_valid
    )
    # One softmax over the window and the global keys: (z, g, r, B, W + S).
    scores = ops.concatenate(
        [sliding_window.window_scores(geo, q, k), global_scores], -1
    )
    mask = ops.concatenate([mask, global_mask_blocks], axis=-1)
    weights = ops.cast(masked_softmax(scores, mask), value.dtype)
    weights = ops.reshape(
        weights, (geo.z, geo.groups, geo.r * geo.block, geo.width + count)
    )
    kept = dropout_fn(weights) if dropout_fn is not None else weights
    out = ops.einsum("zgqk,zgke->zgqe", kept[..., : geo.width], v)
    kept_global = ops.reshape(
        kept[..., geo.width :],
        (geo.b, geo.n, geo.groups, geo.r * geo.block, count),
    )
    global_values = ops.transpose(_gather(value, slots), (0, 2, 1, 3))
    out_global = ops.einsum("bngqs,bgse->bngqe", kept_global, global_values)
    out = out + ops.reshape(out_global, ops.shape(out))
    out = sliding_window.unblock(geo, out, query.dtype)  # (b, t, h, e)

    # Rows of the global queries: full attention over the t keys.
    row_ok = ops.logical_and(slot_valid, _gather(query_valid, slots))
    rows, row_weights = _global_rows(
        geo,
        _gather(query if global_query is None else global_query, slots),
        key if global_key is None else global_key,
        value if global_value is None else global_value,
        key_valid,
        slots,
        row_ok,
        scale,
        geo.causal,
        dropout_fn,
    )
    slot_of = ops.clip(
        ops.cumsum(ops.cast(effective, "int32"), 1) - 1, 0, count - 1
    )
    spread = _gather(ops.cast(rows, out.dtype), slot_of)  # (b, t, h, e)
    out = ops.where(effective[:, :, None, None], spread, out)
    if not return_weights:
        return out
    local_rows = ops.logical_not(effective)[:, None, :, None]
    band = ops.where(
        local_rows, sliding_window.banded(geo, weights[..., : geo.width]), 0
    )
    on_global = ops.reshape(
        weights[..., geo.width :],
        (geo.b, geo.n, geo.heads, geo.block, count),
    )
    on_global = ops.reshape(
        ops.transpose(on_global, (0, 2, 1, 3, 4)),
        (geo.b, geo.heads, geo.n * geo.block, count),
    )[:, :, : geo.t]
    return out, {
        "local": band,
        "global_keys": ops.where(local_rows, on_global, 0),
        "global_queries": ops.reshape(
            row_weights, (geo.b, geo.heads, count, geo.t)
        ),
        "global_indices": ops.where(slot_valid, slots, -1),
    }


def global_local_weights_to_dense(weights, window_size, causal=False):
    """Expands the weights of `global_local_attention` (the dict it returns
    with `return_weights=True`) to dense `(b, h, T, T)`. `O(T^2)`: meant
    for plotting or checking short sequences.

    Args:
        weights: dict with `"local"`, `"global_keys"`, `"global_queries"`
            and `"global_indices"`.
        window_size: int or `(left, right)`, as given to the op.
        causal: bool, as given to the op.
    """
    dense = sliding_window.banded_to_dense(
        weights["local"], window_size, causal
    )
    indices = ops.convert_to_tensor(weights["global_indices"])
    t = ops.shape(dense)[-1]
    # one_hot[b, s, j]: slot s holds key j (unused slots: all zeros).
    one_hot = ops.cast(
        indices[:, :, None] == ops.arange(t, dtype="int32")[None, None],
        dense.dtype,
    )
    dense = dense + ops.einsum(
        "bhis,bsj->bhij", ops.cast(weights["global_keys"], dense.dtype), one_hot
    )
    rows = ops.einsum(
        "bsi,bhsj->bhij",
        one_hot,
        ops.cast(weights["global_queries"], dense.dtype),
    )
    is_global = ops.sum(one_hot, axis=1) > 0  # (b, t)
    return ops.where(is_global[:, None, :, None], rows, dense)
