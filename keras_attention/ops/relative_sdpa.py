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

On a CPU, SDPA's kernel computes a block faster than FlexAttention's
compiled one (torch 2.13): although it visits every block, it is the
faster one for a bias with a wide band mask, slower for a narrow window
(FlexAttention skips the blocks outside it). How much faster depends on
the CPU: on an Intel Xeon (2 cores) SDPA's block was about 3x
FlexAttention's, on an AMD EPYC 1.6-1.7x. The automatic choice
(`prefers_relative_sdpa`) takes it where the flex path would run, when
its mask visits at least `min_density` of FlexAttention's blocks: a
crossover measured once per process, score function and head sizes
(`measure_min_density`: both kernels on a causal call of
`CALIBRATION_LENGTH` positions, FlexAttention compiled for it first;
relative_sdpa where predicted `CALIBRATION_MARGIN` times faster), or
`RELATIVE_SDPA_MIN_DENSITY` when set. Rows with nothing to attend to,
sinks, padding, mask tensors, gradients, the log-sum-exp and dtypes
other than float32 are the other paths'.
"""

import dataclasses
import time

import keras
import numpy as np
from keras import ops

from keras_attention.ops import _backend_flex
from keras_attention.ops import flex
from keras_attention.ops import scoring
from keras_attention.ops.fused import mask_band

# The automatic choice takes this path for a relative bias when its mask
# visits at least this share of FlexAttention's blocks: below, the blocks
# FlexAttention skips pay for its slower ones (causal visits ~0.5). None:
# the crossover is measured (`min_density`), as it depends on the CPU:
# ALiBi, causal windows, T = 2,048, 4 heads of 64, float32, flex /
# relative_sdpa on a 2-core Intel Xeon 0.58 at 0.12 of the pairs, 0.95
# at 0.22, 1.30 at 0.38, 1.67 at 0.50; on a 2-core AMD EPYC, causal
# ALiBi, 0.98 at T = 1,024 (0.56 of the blocks), 0.91 at 2,048 (0.53),
# 0.81 at 8,192 (0.51): SDPA's block 1.6-1.7x FlexAttention's there,
# about 3x on the Xeon. `KERAS_BACKEND=torch python
# benchmarks/programmable_attention.py --tables thresholds`. A number pins
# the crossover (the test suite pins it: tests/conftest.py).
RELATIVE_SDPA_MIN_DENSITY = None

# The measurement: a causal call of this many positions (density ~0.5),
# each kernel timed this many times after two calls, the fastest of each
# (what else runs only adds time: with medians of 3, a run on an idle
# 2-core AMD EPYC chose relative_sdpa for T5's bias at 8,192, 501 ms,
# where FlexAttention took 415).
CALIBRATION_LENGTH = 2048
CALIBRATION_REPEATS = 5
# ... and relative_sdpa is taken where the measurement predicts it at
# least this much faster than FlexAttention: FlexAttention's share grows
# with the length beyond the calibration's (2-core AMD EPYC, idle, flex /
# relative_sdpa: causal ALiBi 0.98 at 1,024, 0.91 at 2,048, 0.81 at
# 8,192; causal T5 0.90-1.05 at 2,048, 0.83-0.90 at 8,192), so a
# crossover measured at 2,048 alone favours SDPA at longer lengths.
CALIBRATION_MARGIN = 1.15
_MEASURED = {}  # (score function's type, head sizes): the crossover


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


def _key_bounds(band, first_query, last_query, tk):
    """The first and the last key (clipped to `[0, tk)`) that the queries
    at positions `first_query` to `last_query` attend to under `band`."""
    left, right = band
    first = np.zeros_like(first_query) if left is None else first_query - left
    last = last_query + tk if right is None else last_query + right
    return np.maximum(first, 0), np.minimum(last, tk - 1)


def _attended(request, band):
    """The number of keys each query attends to, int64 `(T_q,)`."""
    offset = flex.query_offset(request)
    tq, tk = request.query.shape[1], request.key.shape[1]
    position = np.arange(tq, dtype="int64") + offset
    first, last = _key_bounds(band, position, position, tk)
    return np.maximum(last - first + 1, 0)


def _visited_blocks(request, band):
    """The share of FlexAttention's `(query block, key block)` pairs
    (`_backend_flex.FLEX_BLOCK` square) that the band mask `band` visits:
    the blocks its kernel computes, where SDPA computes them all."""
    block = _backend_flex.FLEX_BLOCK
    tq, tk = request.query.shape[1], request.key.shape[1]
    start = np.arange(0, tq, block, dtype="int64")
    end = np.minimum(start + block, tq) - 1
    offset = flex.query_offset(request)
    first, last = _key_bounds(band, start + offset, end + offset, tk)
    visited = np.where(last >= first, last // block - first // block + 1, 0)
    return float(visited.sum()) / (len(start) * -(-tk // block))


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
    `request`, from `flex.FLEX_MIN_LENGTH` queries and keys, when its
    mask visits at least `min_density(request)` of FlexAttention's blocks
    (`_visited_blocks`)."""
    if keras.backend.backend() != "torch" or request.score_mod is None:
        return False
    if not request.static_lengths:
        return False
    tq, tk = request.query.shape[1], request.key.shape[1]
    if min(tq, tk) < flex.FLEX_MIN_LENGTH or can_run(request) is not None:
        return False
    return _visited_blocks(request, _band(request)) >= min_density(request)


def min_density(request):
    """The share of FlexAttention's blocks visited (`_visited_blocks`) from
    which the automatic choice takes this path for `request` rather than
    FlexAttention's kernel: `RELATIVE_SDPA_MIN_DENSITY` when set; 0 where the
    flex path cannot run it; else measured once per process for the request's
    score function type and head sizes (`measure_min_density`)."""
    if RELATIVE_SDPA_MIN_DENSITY is not None:
        return RELATIVE_SDPA_MIN_DENSITY
    if flex.can_run(request) is not None:  # Unavailable here, too.
        return 0.0
    entry = (
        type(request.score_mod),
        tuple(request.query.shape[2:]),
        tuple(request.key.shape[2:]),
        tuple(request.value.shape[2:]),
    )
    if entry not in _MEASURED:
        _MEASURED[entry] = measure_min_density(request)
    return _MEASURED[entry]


def measure_min_density(request, length=None, repeats=None):
    """The density at which this path and FlexAttention's kernel take the
    same time for `request`'s score function and head sizes: both run a
    causal call of `length` (`CALIBRATION_LENGTH`) positions, FlexAttention
    compiled first, then `repeats` (`CALIBRATION_REPEATS`) interleaved
    times each, the fastest of each kept; SDPA computes every block,
    FlexAttention the share `density` its mask visits
    (`_visited_blocks`), so the crossover is `density * sdpa / flex`;
    returned times `CALIBRATION_MARGIN` (this path where predicted that
    much faster). 0 (this path always) when FlexAttention cannot be
    compiled."""
    length = CALIBRATION_LENGTH if length is None else length
    repeats = CALIBRATION_REPEATS if repeats is None else repeats
    rng = np.random.default_rng(0)

    def like(x):
        shape = (1, length) + tuple(x.shape[2:])
        return ops.convert_to_tensor(rng.standard_normal(shape), "float32")

    calibration = dataclasses.replace(
        request,
        query=like(request.query),
        key=like(request.key),
        value=like(request.value),
        causal=True,
        mask_mod=None,
        query_offset=0,
        same_sequence=True,
    )
    runs = {"sdpa": relative_sdpa_attention, "flex": flex.flex_attention}
    times = {name: [] for name in runs}
    try:
        for _ in range(2):  # FlexAttention compiles at the first.
            for run in runs.values():
                run(calibration)
        for _ in range(repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run(calibration)
                times[name].append(time.perf_counter() - start)
    except _backend_flex.FlexCompileError:
        return 0.0
    density = _visited_blocks(calibration, _band(calibration))
    sdpa, flex_time = (min(times[k]) for k in ("sdpa", "flex"))
    return float(density * sdpa / flex_time * CALIBRATION_MARGIN)


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
