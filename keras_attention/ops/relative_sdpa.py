"""The "relative_sdpa" path: a relative bias (ALiBi, T5's buckets) in
PyTorch's fused SDPA kernel on a CPU, inference only.

A bias that depends on the head and the distance `q - kv` alone
(`relative_bias`, `scoring.split_relative_bias`) is a Toeplitz matrix per
head: with the keys in reverse order it is a Hankel matrix, entry `(i,
j')` the table's entry `i + j'`, which a strided view of the table's
`T_q + T_k - 1` distances is (strides `(1, 1)`): SDPA's CPU kernel reads
it as its additive mask and no `(h, T, T)` bias is formed. A band mask
(causal, a sliding window: `mask_band`) is `-inf` at the distances
outside it, in the same table.

On a CPU, SDPA's kernel computes a block about three times as fast as
FlexAttention's compiled one (torch 2.13): although it visits every
block, it is the faster one for a bias with a causal mask, slower for a
narrow window (FlexAttention skips the blocks outside it). The automatic
choice (`prefers_relative_sdpa`) takes it where the flex path would run,
when at least `RELATIVE_SDPA_MIN_DENSITY` of the (query, key) pairs are
attended. Rows with nothing to attend to, sinks, padding, mask tensors,
gradients, the log-sum-exp and dtypes other than float32 are the other
paths'.
"""

import keras
import numpy as np
from keras import ops

from keras_attention.ops import _backend_flex
from keras_attention.ops import flex
from keras_attention.ops import scoring
from keras_attention.ops.fused import mask_band

# The automatic choice takes this path for a relative bias when at least
# this share of the (query, key) pairs is attended: below, FlexAttention's
# skipped blocks pay for its slower ones (causal attends ~0.5). Measured
# (rough: torch 2.13, 1 thread, CPU time on a loaded 2-core machine; ALiBi,
# causal windows, T = 2,048, 4 heads of 64, float32): flex / relative_sdpa
# 0.58 at 0.12 of the pairs, 0.95 at 0.22, 1.30 at 0.38, 1.67 at 0.50:
# equal at ~0.24. `KERAS_BACKEND=torch python
# benchmarks/programmable_attention.py --tables thresholds`.
RELATIVE_SDPA_MIN_DENSITY = 0.25


def _band(request):
    """`(left, right)` of the call's mask when it is a band of keys
    (None: unbounded there), else None."""
    left, right = None, None
    if request.mask_mod is not None:
        bounds = mask_band(request.mask_mod)
        if bounds is None:
            return None
        left, right = bounds
    if request.causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def _attended(request, band):
    """The number of keys each query attends to, int64 `(T_q,)`."""
    offset = flex.query_offset(request)
    tq, tk = request.query.shape[1], request.key.shape[1]
    position = np.arange(tq, dtype="int64") + offset
    left, right = band
    first = np.zeros_like(position) if left is None else position - left
    last = position + tk if right is None else position + right
    first, last = np.maximum(first, 0), np.minimum(last, tk - 1)
    return np.maximum(last - first + 1, 0)


def can_run(request):
    """None when the path can run `request`, else the reason."""
    reason = None
    dtypes = {
        keras.backend.standardize_dtype(x.dtype)
        for x in (request.query, request.key, request.value)
    }
    score_mod = request.score_mod
    if keras.backend.backend() != "torch":
        reason = "it is PyTorch's kernel"
    elif scoring.split_relative_bias(score_mod) is None:
        reason = "it takes a relative bias only (`relative_bias`)"
    elif request.needs_weights or request.needs_lse:
        reason = "it returns no weights nor log-sum-exp and takes no sinks"
    elif dtypes != {"float32"}:
        reason = "it computes float32 inputs only"
    elif not request.static_lengths or request.window is not None:
        reason = "it needs the lengths when called, and no sliding window"
    elif any(
        x is not None
        for x in (request.attention_mask, request.key_mask, request.query_mask)
    ):
        reason = "it takes no mask tensor"
    elif (band := _band(request)) is None:
        reason = "its mask is a band of keys (causal, a sliding window)"
    elif not np.all(_attended(request, band)):
        reason = "a query with nothing to attend to is another path's"
    elif _on_gpu_or_gradient(request):
        reason = "it runs inference on a CPU only"
    if reason is None:
        return None
    return (
        f"The relative_sdpa path cannot run this attention: {reason}. "
        f"Received: score_mod={score_mod!r}, mask_mod={request.mask_mod!r}"
    )


def _on_gpu_or_gradient(request):
    """Whether the call is on CUDA or needs a gradient."""
    tensors = [request.query, request.key, request.value]
    tensors += list(getattr(request.score_mod, "trainable_variables", ()))
    on_gpu = _backend_flex.flex_on_gpu(request.query)[0]
    return on_gpu or _backend_flex.flex_needs_gradient(tensors)


def prefers_relative_sdpa(request):
    """Whether the automatic choice takes this path: where it can run
    `request`, from `flex.FLEX_MIN_LENGTH` queries and keys, when at least
    `RELATIVE_SDPA_MIN_DENSITY` of the pairs are attended."""
    if keras.backend.backend() != "torch" or request.score_mod is None:
        return False
    if not request.static_lengths:
        return False
    tq, tk = request.query.shape[1], request.key.shape[1]
    if min(tq, tk) < flex.FLEX_MIN_LENGTH or can_run(request) is not None:
        return False
    density = _attended(request, _band(request)).sum() / (tq * tk)
    return density >= RELATIVE_SDPA_MIN_DENSITY


def relative_sdpa_attention(request):
    """Runs `request` (one the path can run: `can_run`): the output
    `(b, i, h, e)`."""
    query, key, value = request.query, request.key, request.value
    tq, tk = query.shape[1], key.shape[1]
    offset = flex.query_offset(request)
    relative = scoring.split_relative_bias(request.score_mod)
    _, params = scoring.split_score_mod(request.score_mod)
    # Distances `q - kv` from `offset - (tk - 1)` up: key `tk - 1 - j'`.
    distance = ops.arange(offset - (tk - 1), offset + tq, dtype="int32")
    table = ops.cast(relative(params, distance), "float32")
    left, right = _band(request)
    inside = ops.ones_like(distance, dtype="bool")
    if left is not None:
        inside = ops.logical_and(inside, distance <= left)
    if right is not None:
        inside = ops.logical_and(inside, distance >= -right)
    table = ops.where(inside[None, :], table, float("-inf"))
    q, k, v = (ops.transpose(x, (0, 2, 1, 3)) for x in (query, key, value))
    out = _backend_flex.relative_bias_sdpa(q, k, v, table, request.scale)
    return ops.transpose(out, (0, 2, 1, 3))
