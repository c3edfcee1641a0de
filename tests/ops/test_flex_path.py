"""The flex path (`keras_attention/ops/flex.py`): PyTorch's FlexAttention
kernels for score and mask objects.

- PyTorch: its results equal a NumPy reference and the dense path (1e-5
  in float32), with everything a call can carry (grouped-query heads,
  head sizes that differ, a document mask, key and query padding, rows
  with nothing to attend to, ALiBi, learned sinks; a learned score layer
  and a sliding window); the block mask is built once per shape and
  mask (bound segment ids included) and the compiled kernel is reused;
  the automatic choice (flex for document masks and sliding windows at
  long lengths, SDPA for plain causal and padding masks); on a CPU the
  refusals (no backward pass, no log-sum-exp: the path is not chosen
  and, forced, says why); where `torch.compile` cannot run, one warning
  and another path, never an error.
- TensorFlow and JAX: never chosen, and refused when forced, naming why.

Compiling a kernel takes seconds on a CPU: the fast tier compiles two
(module-scoped results); the other score and mask objects and the low
precisions are the slow tier's.
"""

import warnings

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention
from keras_attention import mods
from keras_attention import scores
from keras_attention.ops import _backend_flex
from keras_attention.ops import flex
from keras_attention.ops import paths
from keras_attention.ops.attention import dot_product_attention

TORCH = keras.backend.backend() == "torch"
torch_only = pytest.mark.skipif(
    not TORCH, reason="FlexAttention is PyTorch's (KERAS_BACKEND=torch)"
)
RNG = np.random.default_rng(57)
B, T, H, G, D, E = 2, 24, 4, 2, 8, 6


def _no_grad():
    if TORCH:
        import torch

        return torch.no_grad()
    import contextlib

    return contextlib.nullcontext()


def np_attention(q, k, v, mask=None, bias=None, sinks=None, scale=None):
    """float64 NumPy attention: `mask` (True: may attend) and `bias`
    broadcastable to `(b, h, i, j)`, `sinks` `(h,)` a virtual key with no
    value; a row with nothing to attend to gives zeros."""
    q, k, v = (np.asarray(x, "float64") for x in (q, k, v))
    h, g = q.shape[2], k.shape[2]
    k, v = np.repeat(k, h // g, axis=2), np.repeat(v, h // g, axis=2)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    if bias is not None:
        s = s + bias
    if mask is not None:
        s = np.where(np.broadcast_to(mask, s.shape), s, -np.inf)
    lse = np.logaddexp.reduce(s, axis=-1)
    if sinks is not None:
        lse = np.logaddexp(lse, np.asarray(sinks, "float64")[None, :, None])
    with np.errstate(invalid="ignore"):
        p = np.where(np.isfinite(s), np.exp(s - lse[..., None]), 0.0)
    p = np.where(np.isfinite(lse)[..., None], p, 0.0)
    return np.einsum("bhij,bjhe->bihe", p, v)


def _inputs(t=T, d=D, e=E, dtype="float32"):
    q = RNG.normal(size=(B, t, H, d)).astype(dtype)
    k = RNG.normal(size=(B, t, G, d)).astype(dtype)
    v = RNG.normal(size=(B, t, G, e)).astype(dtype)
    return q, k, v


def _segments(t=T):
    ids = np.stack([np.arange(t) // 6, np.arange(t) // 10]).astype("int32")
    return ids


def _document_case():
    """Everything at once: GQA, d != e, causal documents (a mask object
    bound to segment ids), key and query padding (rows with nothing to
    attend to), ALiBi, learned sinks."""
    q, k, v = _inputs()
    ids = _segments()
    key_mask = np.ones((B, T), bool)
    key_mask[1, 15:] = False  # Queries 20.. of example 1: no key left.
    query_mask = np.ones((B, T), bool)
    query_mask[0, 20:] = False
    sinks = RNG.normal(size=(H,)).astype("float32")
    kwargs = dict(
        mask_mod=mods.and_masks(
            mods.CausalMask(), mods.DocumentMask().bind(segment_ids=ids)
        ),
        score_mod=scores.ALiBi(num_heads=H),
        key_mask=key_mask,
        query_mask=query_mask,
        sink_logits=sinks,
    )
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    mask = (j <= i) & (ids[:, None, :, None] == ids[:, None, None, :])
    mask = mask & key_mask[:, None, None, :] & query_mask[:, None, :, None]
    slopes = np.asarray(scores.alibi_slopes(H))[None, :, None, None]
    bias = -slopes * (i - j)
    reference = np_attention(q, k, v, mask, bias, sinks)
    return (q, k, v), kwargs, reference


class DistanceBias(mods.ScoreLayer):
    """A learned per-head slope of the distance (a score layer with
    weights, called in the kernel as it is)."""

    def build(self, num_heads=None):
        self.slopes = self.add_weight(
            shape=(num_heads,),
            initializer=keras.initializers.RandomUniform(0.0, 0.5, seed=1),
            name="slopes",
        )
        self.built = True

    def score_fn(self, score, batch, head, q_idx, kv_idx):
        distance = ops.cast(ops.abs(q_idx - kv_idx), "float32")
        return score - ops.take(self.slopes, head) * distance


def _window_case():
    """A learned score layer (read through the kernel's scalars) and a
    causal sliding window of 5 keys."""
    q, k, v = _inputs()
    layer = DistanceBias()
    layer.build(H)
    kwargs = dict(
        mask_mod=mods.SlidingWindowMask(4, causal=True), score_mod=layer
    )
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    mask = (j <= i) & (j >= i - 4)
    slopes = ops.convert_to_numpy(layer.slopes)[None, :, None, None]
    reference = np_attention(q, k, v, mask, -slopes * np.abs(i - j))
    return (q, k, v), kwargs, reference


CASES = {"documents": _document_case, "window": _window_case}


@pytest.fixture(scope="module")
def results():
    """Each case's inputs, reference and flex / dense outputs (one
    kernel compiled per case, shared by the tests)."""
    out = {}
    for name, make in CASES.items():
        inputs, kwargs, reference = make()
        with _no_grad():
            got = {
                impl: ops.convert_to_numpy(
                    dot_product_attention(
                        *inputs, implementation=impl, **kwargs
                    )
                )
                for impl in ("flex", "dense")
            }
        out[name] = (inputs, kwargs, reference, got)
    return out


@torch_only
@pytest.mark.parametrize("case", list(CASES))
def test_flex_equals_reference_and_dense_path(results, case):
    _, _, reference, got = results[case]
    np.testing.assert_allclose(got["flex"], reference, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got["flex"], got["dense"], atol=1e-5, rtol=0)


@torch_only
def test_empty_rows_give_zeros(results):
    _, _, _, got = results["documents"]
    assert np.all(got["flex"][0, 20:] == 0)  # Padded queries.
    assert np.all(np.isfinite(got["flex"]))


@torch_only
def test_block_mask_and_kernel_are_reused_per_shape_and_mask(
    results, monkeypatch
):
    import torch._dynamo.utils

    inputs, kwargs, _, got = results["documents"]
    built = []
    original = _backend_flex._build_block_mask
    monkeypatch.setattr(
        _backend_flex,
        "_build_block_mask",
        lambda *a: built.append(1) or original(*a),
    )
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    # The same segment ids, bound anew (a layer binds them per call).
    ids = _segments()
    again = dict(kwargs)
    again["mask_mod"] = mods.and_masks(
        mods.CausalMask(), mods.DocumentMask().bind(segment_ids=ids.copy())
    )
    with _no_grad():
        out = dot_product_attention(*inputs, implementation="flex", **again)
    np.testing.assert_array_equal(ops.convert_to_numpy(out), got["flex"])
    assert built == []  # The cached block mask.
    assert torch._dynamo.utils.counters["frames"]["ok"] == frames
    # Other segment ids: a new block mask (the bound tensor is part of
    # the key), the same kernel.
    again["mask_mod"] = mods.and_masks(
        mods.CausalMask(), mods.DocumentMask().bind(segment_ids=ids // 2)
    )
    with _no_grad():
        dot_product_attention(*inputs, implementation="flex", **again)
    assert built == [1]
    # The ids are compared in the kernel (arithmetic), read as its input:
    # no new compilation either.
    assert torch._dynamo.utils.counters["frames"]["ok"] == frames


@torch_only
def test_kernel_gets_copies_of_the_query_and_keys_read_often(monkeypatch):
    # The kernel reads the strided (b, h, T, d) views of (b, T, h, d)
    # tensors slower than contiguous copies (CPU): the query's always
    # pays, the keys' where more than one query block reads each key
    # block (`FLEX_COPY_MIN_KEY_READS`), the values' never.
    import torch
    import torch._dynamo

    seen, config = [], torch._dynamo.config

    def kernel(q, k, v, score_fn, block_mask, scale, gqa, lse):
        seen.append((q, k, v, config.recompile_limit))
        return torch.zeros(tuple(q.shape[:3]) + (v.shape[-1],))

    monkeypatch.setitem(_backend_flex._FLEX, "kernel", kernel)
    # Blocks of 128 (never the smaller ones), built here (not cached).
    monkeypatch.setattr(_backend_flex, "FLEX_SMALL_BLOCK_WORK", 0.0)
    monkeypatch.setattr(_backend_flex, "_FLEX_BLOCK_MASKS", {})
    q, k, v = _inputs(t=256)
    # Two query blocks; 3 of the 4 blocks visited: 1.5 query blocks (x 2
    # query heads a key head) read each key block.
    window = mods.SlidingWindowMask(40, causal=True)
    limit = config.recompile_limit
    with _no_grad():
        for reads in (2.9, 3.0):
            monkeypatch.setattr(flex, "FLEX_COPY_MIN_KEY_READS", reads)
            out = dot_product_attention(
                q, k, v, mask_mod=window, implementation="flex"
            )
            assert tuple(out.shape) == (B, 256, H, E)
    (copied, views) = seen
    shapes = [(B, H, 256, D), (B, G, 256, D), (B, G, 256, E)]
    assert [tuple(x.shape) for x in copied[:3]] == shapes
    assert [x.is_contiguous() for x in copied[:3]] == [True, True, False]
    assert [x.is_contiguous() for x in views[:3]] == [True, False, False]
    # Our kernels' recompile limit, during the call only.
    assert copied[3] >= _backend_flex.FLEX_RECOMPILE_LIMIT
    assert config.recompile_limit == limit
    assert flex.kernel_copies(1.0, 1) == (True, False, False)  # Decoding.
    # Query blocks of 64: twice as many read each key block.
    monkeypatch.setattr(flex, "FLEX_COPY_MIN_KEY_READS", 1.0)
    assert flex.kernel_copies(0.75, 256, 1, 128)[1] is True
    assert flex.kernel_copies(0.375, 256, 1, 128)[1] is False
    assert flex.kernel_copies(0.375, 256, 1, 64)[1] is True


@torch_only
def test_automatic_choice_and_call_look_the_block_mask_up_once(monkeypatch):
    # Its cache key hashes the bound segment ids: once a call, not twice.
    monkeypatch.setattr(flex, "FLEX_MIN_LENGTH", 16)
    looked_up, original = [], _backend_flex.flex_block_mask
    monkeypatch.setattr(
        _backend_flex,
        "flex_block_mask",
        lambda *a, **k: looked_up.append(1) or original(*a, **k),
    )
    ran = []

    def kernel(q, k, v, score_fn, block_mask, scale, lse, copies):
        ran.append(block_mask)
        return ops.zeros(tuple(q.shape[:3]) + (v.shape[-1],))

    monkeypatch.setattr(_backend_flex, "flex_attention", kernel)
    q, k, v = _inputs(t=512)
    with _no_grad():
        for ids in (_segments(512), _segments(512) // 2):
            mask = mods.and_masks(
                mods.CausalMask(), mods.DocumentMask().bind(segment_ids=ids)
            )
            dot_product_attention(q, k, v, mask_mod=mask)
        assert len(ran) == 2 and len(looked_up) == 2
        assert ran[0] is not ran[1]  # Other ids: another block mask.
        # A call the choice did not see looks it up itself, every time.
        request = paths.AttentionRequest(q, k, v, scale=1.0, mask_mod=mask)
        flex.flex_attention(request)
        flex.flex_attention(request)
    assert len(looked_up) == 4 and ran[2] is ran[3] is ran[1]


def test_tensor_digest_is_the_values_whatever_the_container():
    ids = _segments()
    digest = flex.tensor_digest(ids)
    assert flex.tensor_digest(ops.convert_to_tensor(ids)) == digest
    assert flex.tensor_digest(ids.copy()) == digest
    assert flex.tensor_digest(ids // 2) != digest
    assert flex.tensor_digest(ids.astype("int64")) != digest
    # A dtype NumPy lacks (torch's bfloat16): through Keras's conversion.
    assert flex.tensor_digest(ops.cast(ids, "bfloat16")) != digest
    # Small tensors: their values themselves (exact, no hash to compute),
    # in C order whatever the strides; large ones a hash of them.
    assert digest[2] == ids.tobytes()
    assert flex.tensor_digest(ids.T.copy().T) == digest
    large = np.zeros(flex.FLEX_DIGEST_RAW_BYTES // 4 + 1, "int32")
    changed = large.copy()
    changed[-1] = 1
    assert len(flex.tensor_digest(large)[2]) == 16
    assert flex.tensor_digest(changed) != flex.tensor_digest(large)
    assert flex.tensor_digest(large[::-1].copy()[::-1]) == (
        flex.tensor_digest(large)
    )


@torch_only
def test_block_mask_follows_tensors_changed_in_place(monkeypatch):
    # The same mask objects, the tensors they read changed in place
    # between calls (a bound torch tensor; a NumPy array a function
    # closes over, whose writes no version counter sees): the block mask
    # follows their values.
    ran = []

    def kernel(q, k, v, score_fn, block_mask, scale, lse, copies):
        ran.append(block_mask.to_dense()[0, 0].cpu().numpy().tolist())
        return ops.zeros(tuple(q.shape[:3]) + (v.shape[-1],))

    monkeypatch.setattr(_backend_flex, "flex_attention", kernel)
    q, k, v = _inputs(t=256)
    bound = mods.DocumentMask().bind(segment_ids=np.zeros((B, 256), "int32"))
    ids = np.zeros((B, 256), "int32")

    def documents(batch, head, q_idx, kv_idx):
        return ids[0][q_idx] == ids[0][kv_idx]

    with _no_grad():
        for mask in (bound, documents):
            dot_product_attention(q, k, v, mask_mod=mask, implementation="flex")
            # Two documents of one block each.
            bound.segment_ids[:, 128:] = 1
            ids[:, 128:] = 1
            dot_product_attention(q, k, v, mask_mod=mask, implementation="flex")
            bound.segment_ids[:, 128:] = 0
            ids[:, 128:] = 0
    every, apart = [[1, 1], [1, 1]], [[1, 0], [0, 1]]  # (q, kv) blocks.
    assert ran == [every, apart, every, apart]


@torch_only
def test_availability_is_asked_once_and_a_failure_overrides_it(monkeypatch):
    asked = []
    original = _backend_flex._flex_here_unavailable
    monkeypatch.setattr(
        _backend_flex,
        "_flex_here_unavailable",
        lambda: asked.append(1) or original(),
    )
    monkeypatch.delitem(_backend_flex._FLEX, "here", raising=False)
    first = _backend_flex.flex_unavailable()
    assert _backend_flex.flex_unavailable() == first and asked == [1]
    monkeypatch.setitem(_backend_flex._FLEX, "failure", "compiling failed")
    assert _backend_flex.flex_unavailable() == "compiling failed"


@torch_only
@pytest.mark.parametrize(
    "chunk, sink",
    [(None, True), (None, False), (50, True)],
    ids=["arithmetic", "arithmetic-no-sink", "table"],
)
def test_block_mask_function_is_the_mask_on_every_block(chunk, sink):
    """The kernel reads the block mask's `mask_mod` on partial blocks
    only, eager FlexAttention (where `torch.compile` gives up) on all of
    them: it must be the mask everywhere (it read another block's
    entries on the full ones: T5's bias off by 1.7 at T = 1,024).
    Causal documents are arithmetic on the indices (the ids compared);
    chunks with them, a table of the mask's entries."""
    import torch

    t = 300  # Blocks of 128: full, partial and empty ones.
    ids = np.stack([np.arange(t) // 70, np.arange(t) // 200])
    mask_mod = mods.and_masks(
        mods.CausalMask(), mods.DocumentMask().bind(segment_ids=ids)
    )
    if chunk is not None:
        mask_mod = mods.and_masks(mods.ChunkedCausalMask(chunk), mask_mod)
    q = ops.zeros((2, t, 2, 8))
    request = paths.AttentionRequest(
        q,
        q,
        q,
        scale=0.35,
        mask_mod=mask_mod,
        sink_logits=[0.0, 1.0] if sink else None,
    )
    block_mask = flex._block_mask(request, 0, sink)[0]
    b, h, i, j = (torch.arange(n) for n in (2, 2, t, t + sink))
    got = block_mask.mask_mod(
        b[:, None, None, None], h[None, :, None, None], i[:, None], j
    )
    i, j = np.arange(t)[:, None], np.arange(t + sink)[None, :]
    jj = np.minimum(j, t - 1)
    keys = ids[:, jj[0]][:, None, None, :]  # (b, 1, 1, t + 1)
    expected = (jj <= i) & (ids[:, None, :, None] == keys)
    if chunk is not None:
        expected = expected & (jj // chunk == i // chunk)
    expected = expected | (j == t)  # The sink's key.
    arithmetic = flex._KernelMask(request, 0, t, sink).kernel() is not None
    assert arithmetic == (chunk is None)
    np.testing.assert_array_equal(
        got.numpy(), np.broadcast_to(expected, got.shape)
    )


@pytest.mark.parametrize(
    "mask_mod, causal, offset, sink, band",
    [
        (None, True, 0, False, (None, 0)),
        (mods.SlidingWindowMask(6, causal=True), False, 0, False, (6, 0)),
        (mods.SlidingWindowMask((3, 2)), True, 5, True, (3, 0)),
        (
            mods.and_masks(mods.CausalMask(), mods.SlidingWindowMask(9)),
            False,
            0,
            False,
            (9, 0),
        ),
        (mods.ChunkedCausalMask(7), False, 0, False, None),
    ],
    ids=["causal", "window", "offset-sink", "and", "chunked"],
)
def test_band_masks_get_an_arithmetic_kernel_mask(
    mask_mod, causal, offset, sink, band
):
    """A mask that is a band of keys (causal, sliding windows, their
    intersection; no mask tensor) reaches the kernel as arithmetic on the
    indices (a table lookup per entry made the kernel 1.6x slower at 8k,
    window 512): equal to the mask on every entry; any other mask but
    documents (`test_block_mask_function_is_the_mask_on_every_block`)
    keeps the table (`parts()` None)."""
    t = 40
    q = ops.zeros((1, t, 2, 4))
    request = paths.AttentionRequest(
        q, q, q, scale=0.5, mask_mod=mask_mod, causal=causal
    )
    kernel_mask = flex._KernelMask(request, offset, t, sink)
    assert kernel_mask.parts() == (None if band is None else (band, []))
    fn = kernel_mask.kernel()
    if band is None:
        assert fn is None
        return
    i = ops.arange(t)[:, None]
    j = ops.arange(t + int(sink))[None, :]
    got = ops.convert_to_numpy(fn(0, 0, i, j))
    expected = ops.convert_to_numpy(kernel_mask(0, 0, i, j))
    np.testing.assert_array_equal(got, expected)
    if TORCH:  # The block mask the kernel gets carries it.
        block_mask = flex._block_mask(request, offset, sink)[0]
        assert block_mask.mask_mod is fn or (
            block_mask.mask_mod.__qualname__ == fn.__qualname__
        )


@torch_only
def test_a_bias_linear_in_the_distance_is_arithmetic_in_the_kernel():
    """ALiBi's causal bias is exactly `slope * distance`: the kernel's
    `score_mod` computes it (no table reads; 1.3x slower at 8k), equal
    to the table's on every entry; the symmetric form and T5's buckets
    are no line and keep the table."""
    t, offset = 40, 3
    q = ops.zeros((1, t, 4, 8))
    t5 = scores.T5RelativeBias(bidirectional=False, num_heads=4)
    t5.build(4)
    b, h = ops.arange(1)[:, None, None, None], ops.arange(4)[:, None, None]
    i, j = ops.arange(t)[:, None], ops.arange(t)[None, :]
    raw = ops.convert_to_tensor(RNG.normal(size=(1, 4, t, t)), "float32")
    for score_mod, linear in [
        (scores.ALiBi(num_heads=4), True),
        (scores.ALiBi(num_heads=4, bidirectional=True), False),
        (t5, False),
    ]:
        request = paths.AttentionRequest(
            q, q, q, scale=0.5, score_mod=score_mod, causal=True
        )
        score = flex._KernelScore(request, offset, t, t)
        assert (score.slope is not None) == linear
        got = ops.convert_to_numpy(score(raw, b, h, i, j))
        score.slope = None  # The table's lookup.
        table = ops.convert_to_numpy(score(raw, b, h, i, j))
        np.testing.assert_array_equal(got, table)
        expected = score_mod(raw, b, h, i + offset, j)
        np.testing.assert_allclose(
            got, ops.convert_to_numpy(expected), rtol=1e-6, atol=1e-6
        )


def _request(t=2048, mask_mod=None, causal=False, **kwargs):
    q = np.zeros((1, t, 2, 8), "float32")
    q = ops.convert_to_tensor(q)
    return paths.AttentionRequest(
        q, q, q, scale=0.35, mask_mod=mask_mod, causal=causal, **kwargs
    )


def _documents(t, count=8, batch=1):
    ids = np.repeat(np.arange(t)[None] * count // t, batch, axis=0)
    ids = ids.astype("int32")
    return mods.and_masks(
        mods.CausalMask(), mods.DocumentMask().bind(segment_ids=ids)
    )


def _block_kinds(counts, indices, kv_blocks):
    """The blocks a `BlockMask`'s `(counts, indices)` name, bool
    `(b, h, q blocks, kv_blocks)`."""
    counts, indices = (x.numpy() for x in (counts, indices))
    out = np.zeros(counts.shape + (kv_blocks,), bool)
    for at in np.ndindex(counts.shape):
        out[at][indices[at][: counts[at]]] = True
    return out


@torch_only
@pytest.mark.parametrize("share", [0.0, 0.95, 1.0])
@pytest.mark.parametrize(
    "t, mask_mod",
    [
        (2048, _documents(2048)),  # 64's entries: 0.83 of 128's.
        (2048, _documents(2048, count=1)),  # Causal: 0.97.
        (2048, mods.SlidingWindowMask(511, causal=True)),  # 0.90.
        (300, _documents(300, count=3)),
        (300, None),
    ],
    ids=["documents", "causal", "window-512", "ragged", "ragged-causal"],
)
def test_cpu_block_size_is_the_one_visiting_fewer_entries(
    t, mask_mod, share, monkeypatch
):
    """On a CPU an arithmetic mask takes blocks of 64 where they visit at
    most `FLEX_SMALL_BLOCK_WORK` (`share`, whatever it is tuned to) of the
    entries blocks of 128 visit (the kernel computes a visited block
    whole), else 128: never 64 at 0, always at 1 (64-blocks never visit
    more); the block mask's visited and full blocks are the mask's,
    counted here in NumPy."""
    monkeypatch.setattr(_backend_flex, "FLEX_SMALL_BLOCK_WORK", share)
    monkeypatch.setattr(_backend_flex, "_FLEX_BLOCK_MASKS", {})
    request = _request(t, mask_mod, causal=mask_mod is None)
    block_mask, density = flex._block_mask(request, 0, False)
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    mask = ops.convert_to_numpy(
        flex._KernelMask(request, 0, t, False)(
            0, 0, ops.convert_to_tensor(i), ops.convert_to_tensor(j)
        )
    )
    mask = np.broadcast_to(mask, (t, t))

    def kinds(block):
        n = -(-t // block)
        padded = np.zeros((n * block, n * block), bool)
        padded[:t, :t] = mask
        tiles = padded.reshape(n, block, n, block).swapaxes(1, 2)
        return tiles.any(axis=(2, 3)), tiles.all(axis=(2, 3))

    work = {b: kinds(b)[0].sum() * b * b for b in (64, 128)}
    block = 64 if work[64] <= share * work[128] else 128
    assert share not in (0.0, 1.0) or block == (64 if share else 128)
    assert block_mask.BLOCK_SIZE == (block, block)
    seen, full = kinds(block)
    n = seen.shape[1]
    partial = _block_kinds(block_mask.kv_num_blocks, block_mask.kv_indices, n)
    whole = _block_kinds(
        block_mask.full_kv_num_blocks, block_mask.full_kv_indices, n
    )
    np.testing.assert_array_equal(whole[0, 0], full)
    np.testing.assert_array_equal(partial[0, 0], seen & ~full)
    assert density == pytest.approx(seen.mean())


@torch_only
def test_small_blocks_equal_the_dense_path(monkeypatch):
    # Blocks of 64 (taken whatever the tuned share: 1) over ragged causal
    # documents that differ per example (full, partial and empty blocks,
    # a partial last one, a block map per example), grouped-query heads
    # and a sink.
    monkeypatch.setattr(_backend_flex, "FLEX_SMALL_BLOCK_WORK", 1.0)
    monkeypatch.setattr(_backend_flex, "_FLEX_BLOCK_MASKS", {})
    t = 300
    q, k, v = _inputs(t=t)
    ids = np.stack([np.arange(t) // 100, np.arange(t) // 70]).astype("int32")
    mask_mod = mods.and_masks(
        mods.CausalMask(), mods.DocumentMask().bind(segment_ids=ids)
    )
    request = paths.AttentionRequest(q, k, v, scale=0.35, mask_mod=mask_mod)
    block_mask = flex._block_mask(request, 0, False)[0]
    assert block_mask.BLOCK_SIZE == (64, 64)
    assert tuple(block_mask.kv_num_blocks.shape) == (B, 1, 5)
    kwargs = dict(
        mask_mod=mask_mod,
        sink_logits=RNG.normal(size=(H,)).astype("float32"),
    )
    with _no_grad():
        got = {
            impl: ops.convert_to_numpy(
                dot_product_attention(q, k, v, implementation=impl, **kwargs)
            )
            for impl in ("flex", "dense")
        }
    np.testing.assert_allclose(got["flex"], got["dense"], atol=1e-5)


@torch_only
def test_automatic_choice_takes_flex_for_sparse_masks_only(monkeypatch):
    monkeypatch.setattr(flex, "FLEX_MIN_LENGTH", 256)
    window = mods.SlidingWindowMask(32, causal=True)
    with _no_grad():
        assert paths.choose(_request(512, _documents(512))) == "flex"
        assert paths.choose(_request(512, window)) == "flex"
        cap = scores.SoftCap(5.0)
        assert paths.choose(_request(512, score_mod=cap)) == "flex"
        # A relative bias: flex for a narrow window (else relative_sdpa):
        # 31 of FlexAttention's 256 blocks at 2,048.
        alibi = scores.ALiBi(num_heads=2)
        assert paths.choose(_request(2048, window, score_mod=alibi)) == "flex"
        # SDPA keeps plain causal, padding and dense masks.
        assert paths.choose(_request(512, causal=True)) == "fused"
        key_mask = ops.ones((1, 512), "bool")
        assert paths.choose(_request(512, key_mask=key_mask)) == "fused"
        assert paths.choose(_request(512, mods.CausalMask())) == "fused"
        # Too short to pay for a compilation.
        assert paths.choose(_request(128, _documents(128))) == "fused"


@torch_only
def test_cpu_gradient_and_lse_are_refused_and_not_chosen(monkeypatch):
    import torch

    monkeypatch.setattr(flex, "FLEX_MIN_LENGTH", 256)
    q = torch.zeros((1, 512, 2, 8), requires_grad=True)
    request = paths.AttentionRequest(
        q, q, q, scale=0.35, mask_mod=_documents(512)
    )
    assert paths.choose(request) == "fused"
    with pytest.raises(ValueError, match="no backward pass on a CPU"):
        paths.choose(request, "flex")
    with torch.no_grad():  # Inference: no gradient to give.
        assert paths.choose(request) == "flex"
    # A learned score layer's weights require grad too.
    layer = DistanceBias()
    layer.build(2)
    plain = _request(512, score_mod=layer)
    assert paths.choose(plain) != "flex"
    with pytest.raises(ValueError, match="no backward pass on a CPU"):
        paths.choose(plain, "flex")
    with torch.no_grad():
        lse = _request(512, _documents(512), return_lse=True)
        with pytest.raises(ValueError, match="return no log-sum-exp"):
            paths.choose(lse, "flex")
        assert paths.choose(lse) != "flex"
    q64 = ops.zeros((1, 512, 2, 8), "float64")
    request = paths.AttentionRequest(
        q64, q64, q64, scale=0.35, mask_mod=_documents(512)
    )
    with pytest.raises(ValueError, match="float64 stays float64"):
        paths.choose(request, "flex")
    assert paths.choose(request) != "flex"


@torch_only
def test_without_torch_compile_one_warning_and_another_path(monkeypatch):
    reason = "no C++ compiler here (a test)"
    monkeypatch.setattr(flex, "FLEX_MIN_LENGTH", 8)
    monkeypatch.setattr(_backend_flex, "flex_unavailable", lambda: reason)
    monkeypatch.setattr(flex, "_WARNED", set())
    q, k, v = _inputs(t=16)
    mask_mod = mods.SlidingWindowMask(2, causal=True)
    expected = dot_product_attention(
        q, k, v, mask_mod=mask_mod, implementation="dense"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _no_grad():
            for _ in range(2):
                out = dot_product_attention(q, k, v, mask_mod=mask_mod)
    messages = [str(w.message) for w in caught if reason in str(w.message)]
    assert len(messages) == 1
    np.testing.assert_allclose(
        ops.convert_to_numpy(out), ops.convert_to_numpy(expected), atol=1e-5
    )
    with pytest.raises(ValueError, match="no C\\+\\+ compiler"):
        dot_product_attention(q, k, v, mask_mod=mask_mod, implementation="flex")


@torch_only
def test_failed_compilation_falls_back_with_one_warning(monkeypatch):
    def fail(*args, **kwargs):
        raise _backend_flex.FlexCompileError("torch.compile failed (a test)")

    monkeypatch.setattr(_backend_flex, "flex_attention", fail)
    monkeypatch.setattr(flex, "_WARNED", set())
    q, k, v = _inputs(t=16)
    kwargs = dict(score_mod=scores.SoftCap(2.0), causal=True)
    expected = dot_product_attention(q, k, v, implementation="dense", **kwargs)
    with pytest.warns(UserWarning, match="torch.compile failed"):
        with _no_grad():
            out = dot_product_attention(
                q, k, v, implementation="flex", **kwargs
            )
    np.testing.assert_allclose(
        ops.convert_to_numpy(out), ops.convert_to_numpy(expected), atol=1e-5
    )


@pytest.mark.skipif(TORCH, reason="the other backends' refusal")
def test_other_backends_never_choose_flex_and_refuse_it(monkeypatch):
    monkeypatch.setattr(flex, "FLEX_MIN_LENGTH", 8)
    request = _request(64, _documents(64))
    assert paths.choose(request) != "flex"
    assert not flex.prefers_flex(request)
    backend = keras.backend.backend()
    with pytest.raises(ValueError, match=f"Keras backend is '{backend}'"):
        paths.choose(request, "flex")
    q, k, v = _inputs(t=8)
    with pytest.raises(ValueError, match="FlexAttention is PyTorch's"):
        keras_attention.ops.dot_product_attention(
            q, k, v, causal=True, implementation="flex"
        )


def _slow_cases():
    """name -> (kwargs, mask, bias) of the other score and mask objects
    (`mask`, `bias` broadcastable to `(b, h, i, j)` for the reference)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    t5 = scores.T5RelativeBias(num_buckets=8, max_distance=12, num_heads=H)
    t5.build(H)
    table = ops.convert_to_numpy(t5.embeddings)  # (buckets, heads)
    buckets = ops.convert_to_numpy(
        scores.relative_position_bucket(j - i, True, 8, 12)
    )
    prefix = np.array([3, 9], "int32")
    offset = 5
    attention_mask = RNG.random((B, 1, T, T)) < 0.7
    return {
        "soft-cap, prefix-LM": (
            dict(
                score_mod=scores.SoftCap(1.5),
                mask_mod=mods.PrefixLMMask().bind(prefix_length=prefix),
            ),
            (j <= i) | (j < prefix[:, None, None, None]),
            "soft-cap",
        ),
        "T5 bias, chunks": (
            dict(score_mod=t5, mask_mod=mods.ChunkedCausalMask(7)),
            (j <= i) & (j // 7 == i // 7),
            np.transpose(table[buckets], (2, 0, 1))[None],
        ),
        "attention mask, offset, causal": (
            dict(
                attention_mask=attention_mask,
                causal=True,
                query_offset=offset,
                mask_mod=mods.SlidingWindowMask(6),
            ),
            attention_mask & (j <= i + offset) & (np.abs(i + offset - j) <= 6),
            None,
        ),
    }


@torch_only
@pytest.mark.slow("compiles one FlexAttention kernel per case")
@pytest.mark.parametrize("case", list(_slow_cases()))
def test_other_objects_equal_reference_and_dense_path(case):
    kwargs, mask, bias = _slow_cases()[case]
    q, k, v = _inputs()
    if isinstance(bias, str):  # Soft-capping acts on the scores.
        s = np.einsum(
            "bihd,bjhd->bhij", q, np.repeat(k, H // G, axis=2)
        ) / np.sqrt(D)
        bias = 1.5 * np.tanh(s / 1.5) - s
    reference = np_attention(q, k, v, mask, bias)
    with _no_grad():
        got, dense = (
            ops.convert_to_numpy(
                dot_product_attention(q, k, v, implementation=impl, **kwargs)
            )
            for impl in ("flex", "dense")
        )
    np.testing.assert_allclose(got, reference, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(got, dense, atol=1e-5, rtol=0)


@torch_only
@pytest.mark.slow("compiles one FlexAttention kernel per dtype")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_scores_accumulate_in_float32(dtype):
    # Large queries and keys: float16 scores would overflow (65,504).
    q, k, v = _inputs(d=8, e=8)
    q, k = q * 120.0, k * 120.0
    cast = [ops.cast(x, dtype) for x in (q, k, v)]
    mask_mod = _documents(T, count=3, batch=B)
    with _no_grad():
        got = dot_product_attention(
            *cast, mask_mod=mask_mod, implementation="flex"
        )
    assert keras.backend.standardize_dtype(got.dtype) == dtype
    up = [ops.convert_to_numpy(ops.cast(x, "float32")) for x in cast]
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    ids = (np.arange(T) * 3 // T)[None]
    mask = (j <= i) & (ids[:, None, :, None] == ids[:, None, None, :])
    reference = np_attention(*up, mask)
    got = ops.convert_to_numpy(ops.cast(got, "float32"))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, reference, atol=0.05, rtol=0.05)


@torch_only
@pytest.mark.slow("compiles FlexAttention nine times")
def test_another_compiled_flex_attention_leaves_ours_compiled():
    """A program's own `torch.compile(flex_attention)` past its recompile
    limit (8) runs eagerly from then on; ours is another function, whose
    kernels stay compiled."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = _inputs(t=16)
    theirs = torch.compile(flex_attention, dynamic=False)
    qt = torch.as_tensor(q).transpose(1, 2)
    with torch.no_grad():
        for n in range(9):
            theirs(qt, qt, qt, score_mod=lambda s, b, h, i, j, n=n: s * n)
    monkeypatch = pytest.MonkeyPatch()
    eager = []
    monkeypatch.setattr(
        torch.nn.attention.flex_attention,
        "_warn_once",
        lambda *args, **kwargs: eager.append(args),
    )
    try:
        with _no_grad():
            dot_product_attention(
                q,
                k,
                v,
                causal=True,
                score_mod=scores.SoftCap(3.0),
                implementation="flex",
            )
    finally:
        monkeypatch.undo()
    assert eager == []  # No "flex_attention called without torch.compile".


def _cuda():
    if not TORCH:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="FlexAttention's backward: CUDA")
def test_cuda_gradients_equal_dense_path_score_layer_included():
    import torch

    inputs, kwargs, _ = _window_case()
    layer = kwargs["score_mod"]
    sinks = RNG.normal(size=(H,)).astype("float32")
    grads = {}
    for impl in ("flex", "dense"):
        tensors = [
            torch.tensor(x, device="cuda", requires_grad=True)
            for x in inputs + (sinks,)
        ]
        out, lse = dot_product_attention(
            *tensors[:3],
            sink_logits=tensors[3],
            return_lse=True,
            implementation=impl,
            **kwargs,
        )
        loss = (out**2).sum() + lse.sum()
        weights = [layer.slopes.value]
        grads[impl] = torch.autograd.grad(loss, tensors + weights)
    for a, b in zip(grads["flex"], grads["dense"]):
        np.testing.assert_allclose(
            a.cpu().numpy(), b.cpu().numpy(), atol=1e-4, rtol=1e-4
        )
