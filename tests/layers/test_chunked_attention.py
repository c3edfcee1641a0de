"""Chunked local attention (Llama 4's local layers): an attention layer
holding `mods.ChunkedCausalMask(c)` equals a NumPy reference of "causal
within chunks of `c`", and decodes over its own cache of one chunk (`c`
slots, position `p` in slot `p % c`): cached calls of any sizes (past
chunk boundaries, longer than a chunk) equal the uncached pass, with
padding, rotary positions and grouped-query heads; a full cache (no
`sink_tokens`) gives the same; in a generator, `cache="auto"` (the ring)
and `cache="full"` give the uncached argmax loop's tokens."""

import keras
import numpy as np
import pytest
from keras import ops
from references import multi_head_attention

from keras_attention import mods
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.generation import CausalLMGenerator
from keras_attention.generation import init_cache
from keras_attention.layers import SelfAttention
from keras_attention.mods.base import mask_lookback
from keras_attention.ops.blockwise import _Plan

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(0)
CHUNK = 3
X = RNG.normal(size=(2, 11, 8)).astype("float32")
# Row 1 padded on the right from position 8.
MASK = np.ones((2, 11), bool)
MASK[1, 8:] = False


def np_(x):
    return ops.convert_to_numpy(x)


def chunked(rotary=None, heads=(2, 1), chunk=CHUNK):
    layer = SelfAttention(
        heads[0],
        4,
        causal=True,
        num_key_value_heads=heads[1],
        rotary_max_wavelength=rotary,
        mask_mod=mods.ChunkedCausalMask(chunk),
    )
    layer(X[:, :2])
    return layer


def test_uncached_equals_numpy_chunks():
    layer = chunked(heads=(2, 2))
    q = np.arange(11)[:, None]
    k = np.arange(11)[None, :]
    allowed = (k <= q) & (k // CHUNK == q // CHUNK)
    mask = allowed[None, None] & MASK[:, None, None, :]
    want, _ = multi_head_attention(layer, X, X, mask=mask)
    got = np_(layer(X, mask=MASK))
    np.testing.assert_allclose(got[MASK], want[MASK], atol=1e-5)


def test_the_cache_holds_one_chunk():
    layer = chunked()
    assert mask_lookback(layer.mask_mod) == CHUNK - 1
    assert layer.cache_window() == CHUNK - 1
    ring = layer.init_cache(2, 11, sink_tokens=0)
    assert tuple(ring["keys_values"].shape) == (2, 2, CHUNK, 1, 4)
    assert not layer.cache_overwrites_positions(ring)
    full = layer.init_cache(2, 11)
    assert tuple(full["keys_values"].shape) == (2, 2, 11, 1, 4)
    # The smaller bound wins beside a sliding window; a mask object
    # without a lookback keeps every position.
    both = mods.and_masks(mods.CausalMask(), mods.ChunkedCausalMask(8))
    assert mask_lookback(both) == 7
    assert mask_lookback(mods.CausalMask()) is None


def _slow_on_jax(test):
    if BACKEND != "jax":
        return test
    return pytest.mark.slow(
        reason="JAX compiles each op of the cached calls per piece shape "
        "(38 s); TensorFlow and PyTorch run it in the fast tier"
    )(test)


@_slow_on_jax
@pytest.mark.parametrize("ring", [True, False])
def test_cached_calls_equal_the_uncached_pass(ring):
    layer = chunked(rotary=100.0)
    want = np_(layer(X, mask=MASK))
    options = {"sink_tokens": 0} if ring else {}
    cache = layer.init_cache(2, 11, **options)
    got, start = [], 0
    # Pieces across chunk boundaries, one longer than a chunk.
    for size in (4, 1, 1, 2, 3):
        piece = slice(start, start + size)
        out, cache = layer(
            X[:, piece],
            padding_mask=MASK[:, piece],
            cache=cache,
            cache_update_index=start,
        )
        got.append(np_(out))
        start += size
    got = np.concatenate(got, axis=1)
    np.testing.assert_allclose(got[MASK], want[MASK], atol=1e-5)


VOCAB = 11


def _lm():
    keras.utils.set_random_seed(1)
    embedding = keras.layers.Embedding(VOCAB, 16)
    blocks = []
    for chunk in (CHUNK, None):  # a chunked layer, then a global one
        attention = SelfAttention(
            4,
            4,
            causal=True,
            num_key_value_heads=2,
            rotary_max_wavelength=None if chunk is None else 100.0,
            mask_mod=chunk and mods.ChunkedCausalMask(chunk),
            name="self_attention",
        )
        blocks.append(
            TransformerDecoderBlock(
                intermediate_dim=16,
                cross_attention=False,
                self_attention=attention,
                norm_first=True,
            )
        )
    head = keras.layers.Dense(VOCAB)
    ids = keras.Input((None,), dtype="int32")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    model = keras.Model(ids, head(x))
    generator = CausalLMGenerator(embedding, blocks, head, jit_compile=False)
    return model, generator


@pytest.mark.slow(
    reason="a generator's compiled loops (17 s on TensorFlow); the "
    "llama4_text case of tests/interop/test_from_huggingface.py decodes "
    "with chunk rings in the fast tier"
)
def test_generation_with_a_chunk_ring_equals_the_uncached_loop():
    model, generator = _lm()
    prompts = np.array([[3, 4, 5, 6, 0, 0, 0, 0, 0, 0], [7, 2, 0, 0] + [0] * 6])
    mask = prompts != 0
    lengths = mask.sum(axis=1)
    want = prompts.copy()
    for row, length in enumerate(lengths):
        ids = list(prompts[row, :length])
        while len(ids) < prompts.shape[1]:
            logits = np_(model(np.array([ids], "int32")))
            ids.append(int(logits[0, -1].argmax()))
        want[row] = ids
    for cache in ("auto", "full"):
        got, _ = generator.generate(
            prompts, max_length=10, padding_mask=mask, cache=cache
        )
        np.testing.assert_array_equal(np_(got), want)
    ring = init_cache(generator.blocks, 2, 10, sink_tokens=0)
    assert tuple(ring[0][0]["keys_values"].shape)[2] == CHUNK
    assert tuple(ring[1][0]["keys_values"].shape)[2] == 10


def test_the_blockwise_path_skips_the_tiles_between_chunks():
    # 8 x 8 tiles of 32, chunks of 64 (2 tiles): of the 36 causal tiles
    # (the diagonal's included), each chunk keeps its 3, 24 are skipped.
    plan = _Plan(256, 256, True, 0, 32, 32, mask_mod=mods.ChunkedCausalMask(64))
    assert plan.skipped_tiles == 24
    kept = [len(chunks) for _, _, chunks in plan.rows]
    assert kept == [1, 2] * 4
