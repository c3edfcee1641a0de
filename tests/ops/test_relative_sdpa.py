"""The relative_sdpa path (`keras_attention/ops/relative_sdpa.py`): a
relative bias (ALiBi, T5's buckets) in PyTorch's SDPA kernel through a
strided view of its table, the keys in reverse order.

- PyTorch: equal to a NumPy reference and the dense path (1e-5, float32)
  with a causal mask, a sliding window, a query offset with fewer
  queries than keys, grouped-query heads and head sizes that differ; the
  automatic choice takes it for a wide band (causal) at long lengths,
  FlexAttention for a narrow window; unpinned, the crossover is measured
  once per score function type and head sizes and follows the kernels'
  times; what it cannot run (padding, rows
  with nothing to attend to, gradients) it refuses, naming why.
- TensorFlow and JAX: refused, never chosen.
"""

import types

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import mods
from keras_attention import scores
from keras_attention.ops import flex
from keras_attention.ops import paths
from keras_attention.ops import relative_sdpa

TORCH = keras.backend.backend() == "torch"
torch_only = pytest.mark.skipif(not TORCH, reason="PyTorch's SDPA kernel")
RNG = np.random.default_rng(58)
B, H, G, D, E = 2, 4, 2, 8, 6


def _reference(q, k, v, bias, mask, scale):
    """float64 NumPy attention; every row attends to something."""
    q, k, v = (np.asarray(x, "float64") for x in (q, k, v))
    k, v = np.repeat(k, H // G, axis=2), np.repeat(v, H // G, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale + bias
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhe->bihe", p, v)


def _t5():
    t5 = scores.T5RelativeBias(bidirectional=False, num_heads=H)
    t5.build(H)
    return t5


def _bias(score_mod, distance):
    """`(h, i, j)` biases of `distance` `(i, j)`."""
    flat = ops.convert_to_tensor(distance.reshape(-1), "int32")
    table = ops.convert_to_numpy(score_mod.relative_bias(flat))
    return table.reshape((-1,) + distance.shape)


@torch_only
@pytest.mark.parametrize(
    "case", ["alibi causal", "t5 window", "offset, fewer queries"]
)
def test_equals_reference_and_dense_path(case):
    import torch

    tq, tk, offset = 24, 24, 0
    score_mod, mask_mod, causal = scores.ALiBi(num_heads=H), None, True
    if case == "t5 window":
        score_mod, causal = _t5(), False
        mask_mod = mods.SlidingWindowMask((5, 2))
    elif case == "offset, fewer queries":
        tq, offset, score_mod = 10, 14, _t5()
    q = RNG.normal(size=(B, tq, H, D)).astype("float32")
    k = RNG.normal(size=(B, tk, G, D)).astype("float32")
    v = RNG.normal(size=(B, tk, G, E)).astype("float32")
    kwargs = dict(
        scale=0.3,
        causal=causal,
        mask_mod=mask_mod,
        score_mod=score_mod,
        query_offset=offset,
    )
    request = paths.AttentionRequest(
        *(ops.convert_to_tensor(x) for x in (q, k, v)), **kwargs
    )
    with torch.no_grad():  # T5's weights would need a gradient.
        assert relative_sdpa.can_run(request) is None
        got = paths.run_path("relative_sdpa", request)
        dense = paths.run_path("dense", request)
    i = np.arange(tq)[:, None] + offset
    j = np.arange(tk)[None, :]
    mask = j <= i if causal else (j >= i - 5) & (j <= i + 2)
    reference = _reference(q, k, v, _bias(score_mod, i - j), mask, 0.3)
    got = ops.convert_to_numpy(got)
    np.testing.assert_allclose(got, reference, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got, ops.convert_to_numpy(dense), atol=1e-5)


def _request(t, **kwargs):
    q = ops.zeros((1, t, 2, 8))
    kwargs.setdefault("score_mod", scores.ALiBi(num_heads=2))
    return paths.AttentionRequest(q, q, q, scale=0.35, **kwargs)


@torch_only
def test_automatic_choice_takes_it_for_wide_bands(monkeypatch):
    import torch

    monkeypatch.setattr(flex, "FLEX_MIN_LENGTH", 256)
    window = mods.SlidingWindowMask(16, causal=True)
    with torch.no_grad():
        assert paths.choose(_request(512, causal=True)) == "relative_sdpa"
        # 31 of 256 blocks (T = 2,048, blocks of 128): below 0.25.
        assert paths.choose(_request(2048, mask_mod=window)) != (
            "relative_sdpa"
        )
        assert paths.choose(_request(128, causal=True)) != "relative_sdpa"
        soft_cap = _request(512, causal=True, score_mod=scores.SoftCap(5.0))
        assert paths.choose(soft_cap) != "relative_sdpa"


def test_refusals_name_why():
    padding = ops.ones((1, 64), "bool")
    cases = {
        "padding": _request(64, causal=True, key_mask=padding),
        # Queries 0 and 1 have no key from position -2 + 0 - 0 on.
        "empty rows": _request(64, causal=True, query_offset=-2),
        "chunks": _request(64, mask_mod=mods.ChunkedCausalMask(8)),
    }
    reasons = {
        "padding": "no mask tensor",
        "empty rows": "nothing to attend to",
        "chunks": "band of keys",
    }
    for name, request in cases.items():
        reason = relative_sdpa.can_run(request)
        expected = reasons[name] if TORCH else "PyTorch's kernel"
        assert expected in reason, (name, reason)
    if TORCH:
        import torch

        q = torch.zeros((1, 64, 2, 8), requires_grad=True)
        request = paths.AttentionRequest(
            q, q, q, scale=0.3, causal=True, score_mod=scores.ALiBi(2)
        )
        assert "inference" in relative_sdpa.can_run(request)
    else:
        assert paths.automatic(_request(2048, causal=True)) != ("relative_sdpa")


@torch_only
def test_measured_crossover_follows_the_kernels_times(monkeypatch):
    """Unpinned, the crossover is `blocks * sdpa / flex` of one timed causal
    call (the share of FlexAttention's blocks it visits), measured once per
    score function type and head sizes: a slower FlexAttention kernel moves the
    choice to relative_sdpa at lower densities, a faster one keeps FlexAttention
    to higher ones."""
    import torch

    monkeypatch.setattr(relative_sdpa, "RELATIVE_SDPA_MIN_DENSITY", None)
    monkeypatch.setattr(relative_sdpa, "_MEASURED", {})
    monkeypatch.setattr(flex, "FLEX_MIN_LENGTH", 256)
    calls = []

    def measure(request, length=None, repeats=None):
        calls.append(tuple(request.query.shape[2:]))
        return crossover

    monkeypatch.setattr(relative_sdpa, "measure_min_density", measure)
    causal = _request(512, causal=True)  # 10 of 16 blocks: 0.625.
    with torch.no_grad():
        crossover = 0.3  # SDPA's block 1.7x FlexAttention's.
        assert paths.choose(causal) == "relative_sdpa"
        crossover = 0.7  # Measured once: the first value stays.
        assert paths.choose(causal) == "relative_sdpa"
        assert len(calls) == 1
        monkeypatch.setattr(relative_sdpa, "_MEASURED", {})
        assert paths.choose(causal) == "flex"
        wider = paths.AttentionRequest(
            ops.zeros((1, 512, 3, 8)),
            ops.zeros((1, 512, 3, 8)),
            ops.zeros((1, 512, 3, 8)),
            scale=0.35,
            causal=True,
            score_mod=scores.ALiBi(num_heads=3),
        )
        paths.choose(wider)  # Other head sizes: measured anew.
    assert calls == [(2, 8), (2, 8), (3, 8)]


@torch_only
def test_measurement_times_both_kernels_once_compiled(monkeypatch):
    """The measurement itself (a short causal call): a positive
    crossover, SDPA's time over FlexAttention's, and the pinned value
    when set, without measuring."""
    import torch

    request = _request(128, causal=True)
    monkeypatch.setattr(relative_sdpa, "CALIBRATION_REPEATS", 1)
    with torch.no_grad():
        measured = relative_sdpa.measure_min_density(request, length=128)
    assert 0.0 < measured < 100.0
    monkeypatch.setattr(relative_sdpa, "RELATIVE_SDPA_MIN_DENSITY", 0.4)
    assert relative_sdpa.min_density(request) == 0.4


@torch_only
def test_measurement_keeps_each_kernels_fastest_time_and_the_margin(
    monkeypatch,
):
    """`density * sdpa / flex * CALIBRATION_MARGIN`, each kernel's time its
    fastest timed call (what else runs only adds time), the two warm-up
    calls untimed: a fake clock that the fake kernels advance."""
    clock = [0.0]
    durations = {
        "sdpa": iter([9.0, 9.0, 2.0, 3.0, 2.5]),  # Warm-ups, then timed.
        "flex": iter([50.0, 7.0, 1.0, 0.5, 4.0]),
    }

    def kernel(name):
        def run(request):
            clock[0] += next(durations[name])

        return run

    monkeypatch.setattr(
        relative_sdpa, "relative_sdpa_attention", kernel("sdpa")
    )
    monkeypatch.setattr(flex, "flex_attention", kernel("flex"))
    clock_module = types.SimpleNamespace(perf_counter=lambda: clock[0])
    monkeypatch.setattr(relative_sdpa, "time", clock_module)
    request = _request(256, causal=True)
    measured = relative_sdpa.measure_min_density(request, length=256, repeats=3)
    # A causal call of 256 visits 3 of the 4 blocks of 128.
    expected = 0.75 * 2.0 / 0.5 * relative_sdpa.CALIBRATION_MARGIN
    assert measured == pytest.approx(expected)


@torch_only
def test_no_flex_kernel_means_relative_sdpa(monkeypatch):
    """Where FlexAttention cannot be compiled, relative_sdpa runs every
    relative bias it can: the crossover is 0, nothing is measured."""
    from keras_attention.ops import _backend_flex

    monkeypatch.setattr(relative_sdpa, "RELATIVE_SDPA_MIN_DENSITY", None)
    monkeypatch.setattr(
        _backend_flex, "flex_unavailable", lambda: "no C++ compiler"
    )
    monkeypatch.setattr(relative_sdpa, "measure_min_density", None)
    assert relative_sdpa.min_density(_request(512, causal=True)) == 0.0


def test_visited_blocks_count_the_kernels_blocks():
    """The share of FlexAttention's 128 x 128 blocks a band visits,
    against a NumPy count over a dense band mask."""
    block = 128
    cases = [
        (512, 512, dict(causal=True)),
        (1000, 1000, dict(causal=True)),
        (300, 700, dict(causal=True, query_offset=400)),
        (1024, 1024, dict(mask_mod=mods.SlidingWindowMask(100, causal=True))),
        (640, 640, dict(mask_mod=mods.SlidingWindowMask(200))),
    ]
    for tq, tk, kwargs in cases:
        q, k = ops.zeros((1, tq, 2, 8)), ops.zeros((1, tk, 2, 8))
        request = paths.AttentionRequest(
            q, k, k, scale=0.3, score_mod=scores.ALiBi(2), **kwargs
        )
        band = relative_sdpa._band(request)
        offset = kwargs.get("query_offset", 0)
        distance = (np.arange(tq)[:, None] + offset) - np.arange(tk)[None]
        left, right = band
        keep = np.ones((tq, tk), bool)
        if left is not None:
            keep &= distance <= left
        if right is not None:
            keep &= distance >= -right
        nq, nk = -(-tq // block), -(-tk // block)
        padded = np.zeros((nq * block, nk * block), bool)
        padded[:tq, :tk] = keep
        blocks = padded.reshape(nq, block, nk, block).any(axis=(1, 3))
        got = relative_sdpa._visited_blocks(request, band)
        assert got == pytest.approx(blocks.mean(), abs=1e-12), kwargs
