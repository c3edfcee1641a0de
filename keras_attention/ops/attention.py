"""Scaled dot-product attention with the package's masking rules.

Axes in comments: b - batch, i/j - query/key positions, h - query heads,
g - key/value heads (groups), r - query heads per group, d/e - key/value
head dims.

Rules (shared by every layer of the package):
- mask True means "may attend";
- the scores `q k^T` are formed in float32 for float16 / bfloat16 inputs
  (in float16 they overflow to inf, hence NaN weights, as soon as
  `|q| |k|` nears 65504), and the softmax runs in at least float32
  whatever the compute dtype (float64 inputs compute in float64);
- a query row with no key to attend to gets all-zero weights (so a zero
  result), never NaN and never uniform weights; gradients stay finite.
"""

import warnings

from keras import ops

from keras_attention.ops import paths
from keras_attention.ops import scoring
from keras_attention.ops.log_sum_exp import check_sink_logits
from keras_attention.ops.log_sum_exp import lse_dtype
from keras_attention.ops.masking import as_4d_mask
from keras_attention.utils import attention_checks
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

_RENAMED = {
    "mask": "attention_mask",
    "is_causal": "causal",
    "causal_offset": "query_offset",
    "key_padding": "key_mask",
    "query_padding": "query_mask",
}


def renamed_arguments(function, old_kwargs, new_values):
    """Moves the deprecated names of `old_kwargs` to their new names (with a
    `DeprecationWarning` naming the new one); `TypeError` for unknown
    names or for an argument given under both names."""
    out = dict(new_values)
    for old, value in old_kwargs.items():
        if old not in _RENAMED:
            raise TypeError(
                f"{function}() got an unexpected keyword argument {old!r}"
            )
        new = _RENAMED[old]
        warnings.warn(
            f"{function}(): `{old}` is deprecated and will be removed in the "
            f"next release; use `{new}`.",
            DeprecationWarning,
            stacklevel=3,
        )
        current = out.get(new)
        if not (current is None or current is False or _is_zero(current)):
            raise TypeError(
                f"{function}() got both `{new}` and its deprecated name "
                f"`{old}`. Received: {new}={out[new]!r}, {old}={value!r}"
            )
        out[new] = value
    return out


def _is_zero(value):
    return isinstance(value, int) and not isinstance(value, bool) and not value


def dot_product_attention(
    query,
    key,
    value,
    attention_mask=None,
    scale=None,
    dropout_fn=None,
    return_weights=False,
    *,
    causal=False,
    query_offset=0,
    query_mask=None,
    key_mask=None,
    score_mod=None,
    mask_mod=None,
    implementation=None,
    return_lse=False,
    sink_logits=None,
    **deprecated,
):
    """softmax(score_mod(q k^T * scale)) v, per head, masked, with
    grouped-query support.

    Three implementations give the same result (up to float rounding):
    - "dense": scores `(b, h, i, j)` in memory; the only one that can return
      the weights or apply dropout to them, and the one used for sequence
      lengths unknown at trace time and for small problems;
    - "blockwise": exact attention over query tiles (each against up to
      8,192 keys in one matmul; an online softmax over longer key ranges)
      with a backward pass that recomputes each tile (memory O(T * tile),
      see `blockwise.py`); tiles above the causal diagonal, and tiles a
      static `mask_mod` masks entirely, are skipped. Used on CPU with
      TensorFlow and JAX when the lengths are static and
      `Tq * Tk > 128 * 256`;
    - "fused": `keras.ops.dot_product_attention` (cuDNN / flash kernels)
      on the JAX and torch backends when a GPU is present, and always on
      the torch backend (PyTorch's `scaled_dot_product_attention` has
      fused CPU kernels too: faster than the other two paths there) when
      there is no `score_mod` (a `mask_mod` is then evaluated into the
      kernel's mask).
    `implementation=None` picks as above; `implementation_scope` or the
    argument forces one ("dense" is always possible; "blockwise" needs
    static lengths; neither "blockwise" nor "fused" returns weights or
    takes `dropout_fn`; "fused" takes no `score_mod`).

    Args:
        query: `(b, i, h, d)`.
        key: `(b, j, g, d)` with `h % g == 0` (`g < h`: grouped-query
            attention, query head `n` reads key/value head `n // (h // g)`).
        value: `(b, j, g, e)`.
        attention_mask: optional boolean, broadcastable to `(b, h, i, j)`
            (ranks 2-4 accepted, see `as_4d_mask`). True means "may
            attend".
        scale: float; defaults to `1 / sqrt(d)`.
        dropout_fn: optional callable applied to the attention weights.
        return_weights: also return the weights `(b, h, i, j)`.
        causal: query `i` may only attend to keys `j <= i + query_offset`
            (given this way, no `(i, j)` mask is built on the blockwise
            path).
        query_offset: int or scalar tensor, the absolute position of the
            first query (a cache offset): for `causal` and for the
            `q_idx` of `score_mod` / `mask_mod`.
        query_mask: optional bool `(b, i)`, True on real queries; padded
            queries get zero weights and a zero result.
        key_mask: optional bool `(b, j)`, True on real keys.
        score_mod: optional `score_mod(score, batch, head, q_idx, kv_idx)
            -> score` (PyTorch FlexAttention's signature), applied to the
            scaled float32 scores (float64 for float64 inputs) before
            masking; a score of `-inf` is masked (a row left with none
            gets zeros, as masked rows do); index arguments are
            int32 tensors broadcastable to `(b, h, i, j)`, positions
            absolute (cast them before mixing with floats:
            TensorFlow does not promote int32). Gradients reach the
            weights of a `keras_attention.mods.ScoreLayer` on every
            path, and the trainable variables and tensors that may carry
            a gradient (a watched or traced tensor, a JAX tracer, a torch
            tensor requiring grad) a plain function reads from its
            closure, globals, defaults, partial or object: the blockwise
            backward pass gets them explicitly (`ops/captured.py`). One
            read where a copy of the function cannot replace it (a
            module's attribute) is refused on "blockwise" and runs on
            "dense" under the automatic choice. A `ScoreLayer` not built
            yet is built here with the query's number of heads.
        mask_mod: optional `mask_mod(batch, head, q_idx, kv_idx) -> bool`
            (True = may attend), and-ed with the other masks. Written with
            elementwise operators on the indices alone, it is evaluated on
            NumPy tiles while tracing and fully masked tiles are skipped.
        implementation: None (automatic), "dense", "blockwise", "fused"
            or "flex" (PyTorch's FlexAttention kernels for score and mask
            functions, `ops/flex.py`: chosen on PyTorch for a score
            function or a sparse mask from 1,024 queries and keys, on a
            CPU for calls without gradients only).
        return_lse: also return the softmax's log-sum-exp `lse` `(b, h,
            i)` (float32; float64 for float64 inputs), `-inf` on rows that
            attend to nothing, differentiable on every path (the fused
            kernels return none: a second pass computes it there, and the
            automatic choice then avoids "fused"). `merge_attention`
            combines results over disjoint key sets with it.
        sink_logits: optional learned attention sinks `(h,)` (gpt-oss):
            one logit per query head, a virtual key that takes probability
            mass and contributes no value (`p_j = exp(s_j) / (sum_k
            exp(s_k) + exp(z_h))`), differentiable, on every path (applied
            through the log-sum-exp: `o' = o exp(lse - lse')`, no extra
            score column). With sinks the returned `lse` includes the
            sink's term (`log_sum_exp.py` says how to merge then). Not the
            streaming `sink_tokens` of rolling caches, which are real
            first tokens kept in the cache.

    The names `mask`, `is_causal`, `causal_offset`, `key_padding` and
    `query_padding` of earlier releases are accepted with a
    `DeprecationWarning` naming the new one.

    Returns:
        `(b, i, h, e)` in the query's dtype, then the weights (query dtype)
        if `return_weights`, then the log-sum-exp if `return_lse`.

    Low-precision inputs: the scores of float16 inputs are formed in float32
    on the dense and blockwise paths (and by the fused kernels of JAX, which
    accumulate in float32; on TensorFlow, and for float16 on torch, the
    "fused" path computes in float32), so large queries and keys cannot
    overflow them. bfloat16 scores (float32's range: no overflow) stay in
    bfloat16 on the dense and blockwise paths; the softmax is float32.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> rng = np.random.default_rng(0)
    >>> q = rng.normal(size=(2, 5, 4, 8)).astype("float32")  # 4 query heads
    >>> kv = rng.normal(size=(2, 7, 2, 8)).astype("float32")  # 2 k/v heads
    >>> out, weights = keras_attention.ops.dot_product_attention(
    ...     q, kv, kv, causal=True, return_weights=True)
    >>> tuple(out.shape), tuple(weights.shape)
    ((2, 5, 4, 8), (2, 4, 5, 7))
    >>> float(np.asarray(weights)[0, 0, 0, 1])  # query 0 sees key 0 only
    0.0

    A mask function (documents of 3 and 4 tokens) and a score function (a
    linear bias of the distance, ALiBi-like):

    >>> def same_document(batch, head, q_idx, kv_idx):
    ...     return (q_idx < 3) == (kv_idx < 3)
    >>> from keras import ops
    >>> def distance_bias(score, batch, head, q_idx, kv_idx):
    ...     distance = ops.cast(ops.abs(q_idx - kv_idx), "float32")
    ...     return score - 0.5 * distance
    >>> _, weights = keras_attention.ops.dot_product_attention(
    ...     kv, kv, kv, mask_mod=same_document, score_mod=distance_bias,
    ...     return_weights=True)
    >>> float(np.asarray(weights)[0, 0, 0, 3])  # another document
    0.0

    The log-sum-exp, and learned sinks (a sink logit of 0 for each head
    next to zero scores over 7 keys takes 1/8 of the mass):

    >>> zeros = np.zeros((1, 2, 2, 4), "float32")
    >>> keys = np.zeros((1, 7, 2, 4), "float32")
    >>> out, lse = keras_attention.ops.dot_product_attention(
    ...     zeros, keys, keys + 1.0, return_lse=True)
    >>> round(float(np.asarray(lse)[0, 0, 0]), 4)  # log(7)
    1.9459
    >>> out = keras_attention.ops.dot_product_attention(
    ...     zeros, keys, keys + 1.0, sink_logits=np.zeros((2,), "float32"))
    >>> round(float(np.asarray(out)[0, 0, 0, 0]), 4)  # 7/8 of the value 1
    0.875
    """
    query, key, value = attention_checks.as_tensors(
        query=query, key=key, value=value
    )
    if deprecated:
        given = dict(
            attention_mask=attention_mask,
            causal=causal,
            query_offset=query_offset,
            key_mask=key_mask,
            query_mask=query_mask,
        )
        given = renamed_arguments("dot_product_attention", deprecated, given)
        attention_mask, causal = given["attention_mask"], given["causal"]
        query_offset, key_mask = given["query_offset"], given["key_mask"]
        query_mask = given["query_mask"]
    return_weights = validation.check_bool("return_weights", return_weights)
    causal = validation.check_bool("causal", causal)
    return_lse = validation.check_bool("return_lse", return_lse)
    scoring.check_mod(score_mod, "score_mod")
    scoring.check_mod(mask_mod, "mask_mod")
    scoring.build_score_layer(score_mod, query.shape[2], "score_mod")
    if sink_logits is not None:
        sink_logits = keras_utils.float64_numbers(sink_logits)
        check_sink_logits(sink_logits, query.shape[2])
    if 0 in (query.shape[1], key.shape[1]):
        return _empty(
            query, key, value, return_weights, return_lse, sink_logits
        )
    if scale is None:
        scale = paths.default_scale(query)
    request = paths.AttentionRequest(
        query,
        key,
        value,
        attention_mask=as_4d_mask(attention_mask),
        scale=scale,
        dropout_fn=dropout_fn,
        return_weights=return_weights,
        causal=causal,
        query_offset=query_offset,
        query_mask=query_mask,
        key_mask=key_mask,
        score_mod=score_mod,
        mask_mod=mask_mod,
        return_lse=return_lse,
        sink_logits=sink_logits,
    )
    scope = paths.current_scope()
    choice = paths.choose(request, paths.requested_path(implementation))
    path = paths.PATHS[choice]
    options = {k: v for k, v in scope.options.items() if k in path.options}
    return paths.run_path(choice, request, **options)


def _empty(query, key, value, return_weights, return_lse, sink_logits):
    """The result when the query or the key length is statically 0: no
    rows, or rows with nothing to attend to (zeros, as a fully masked
    row; log-sum-exp `-inf`, or the sink's logit). TensorFlow's einsum
    mixes up the batch axes of the grouped-query products on empty
    sequences, so they are not formed."""
    b, i = ops.shape(query)[0], ops.shape(query)[1]
    heads = query.shape[2]
    out = ops.zeros((b, i, heads, value.shape[-1]), query.dtype)
    results = (out,)
    if return_weights:
        weights = ops.zeros((b, heads, i, ops.shape(key)[1]), query.dtype)
        results += (weights,)
    if return_lse:
        dtype = lse_dtype(query.dtype)
        lse = ops.full((b, heads, i), float("-inf"), dtype)
        if sink_logits is not None:
            sinks = ops.cast(sink_logits, dtype)[None, :, None]
            lse = ops.broadcast_to(sinks, (b, heads, i))
        results += (lse,)
    return results[0] if len(results) == 1 else results


# What `implementation_scope` and the layers read (`paths.py`).
implementation_scope = paths.implementation_scope
memory_efficient_implementation = paths.memory_efficient_implementation
