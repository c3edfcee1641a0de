"""The mixed key/value cache of stacks whose self-attention is windowed in
some blocks and full in others (Gemma 3, gpt-oss): a ring of slots for
the windowed blocks, `max_length` positions for the others. Cached
generation against the uncached model (the ring wrapped many times),
against `cache="full"`, with attention sinks, with beam and contrastive
search (the samplers that do not run the base loop of greedy), in
chunks; the cache's shapes; the arguments refused (every backend)."""

import functools

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from test_rolling_cache import assert_greedy
from test_rolling_cache import build_lm
from test_rolling_cache import new_generator
from test_rolling_cache import random_tokens

from keras_attention.generation import init_cache

# Windowed, full, windowed, full: the ring has 5 + 1 slots.
MIXED = (2, None, 5, None)


@functools.lru_cache(maxsize=None)
def _mixed_build(seed=4):
    keras.utils.set_random_seed(seed)
    return build_lm(windows=MIXED)


def mixed_lm(jit_compile=False):
    model, lm = _mixed_build()
    return model, new_generator(lm, jit_compile)


def test_each_block_makes_its_own_cache():
    # Issue 54: no plan of cache kinds; each block's self-attention makes
    # its own cache: a ring of its window's slots where windowed.
    _, lm = mixed_lm()
    caches = init_cache(lm.blocks, 2, 40, sink_tokens=3)
    for block, cache in zip(lm.blocks, caches):
        window = block.cache_window()
        shapes = {name: tuple(t.shape) for name, t in cache[0].items()}
        if window is None:  # 40 positions and their key mask
            assert shapes == dict(
                keys_values=(2, 2, 40, 2, 4), key_mask=(2, 40)
            )
        else:  # 3 sinks and a ring of window + 1 slots
            slots = 3 + window + 1
            assert shapes == dict(
                keys_values=(2, 2, slots, 2, 4), slot_mask=(2, slots)
            )
    full = init_cache(lm.blocks, 2, 40)  # cache="full": no ring
    assert all(
        tuple(c[0]["keys_values"].shape) == (2, 2, 40, 2, 4) for c in full
    )


@pytest.mark.parametrize("chunk", [1, 7])
def test_mixed_logits_equal_the_uncached_pass(chunk):
    model, lm = mixed_lm()
    ids = random_tokens((2, 23), seed=1)
    ids[1, 17:] = 0  # masked tokens (mask_zero) as keys, as the model does
    cache = init_cache(lm.blocks, 2, 23, sink_tokens=0)
    steps = []
    for start in range(0, 23, chunk):
        logits, _, cache = lm.call_with_cache(
            ids[:, start : start + chunk], cache, start
        )
        steps.append(to_numpy(logits))
    np.testing.assert_allclose(
        np.concatenate(steps, axis=1),
        to_numpy(model(ids)),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
@pytest.mark.parametrize("jit_compile", [False, True])
def test_greedy_equals_the_uncached_model_and_the_full_cache(jit_compile):
    model, lm = mixed_lm(jit_compile)
    prompt = random_tokens((3, 5), seed=2)
    prompt[1, 3:] = 0  # a shorter prompt
    tokens, _ = lm.generate(prompt, max_length=30, sampler="greedy")
    assert_greedy(model, prompt, tokens)
    full, _ = lm.generate(prompt, 30, sampler="greedy", cache="full")
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(full))


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
def test_sinks_apply_to_the_windowed_blocks_only():
    model, lm = mixed_lm()
    # The uncached reference: "window or first 2 keys" where windowed.
    reference, _ = build_lm(windows=MIXED, sinks=2)
    reference.set_weights(model.get_weights())
    prompt = random_tokens((2, 4), seed=3)
    tokens, _ = lm.generate(prompt, 26, sampler="greedy", sink_tokens=2)
    assert_greedy(reference, prompt, tokens)


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
@pytest.mark.parametrize(
    "sampler",
    [
        "beam",
        pytest.param(
            "contrastive",
            marks=pytest.mark.slow(
                "50 s on TensorFlow; the prefill's hidden-state buffer it "
                "reads is the rolling cache's contrastive test's (one "
                "`_prefill` for both caches)"
            ),
        ),
    ],
)
def test_other_samplers_equal_the_full_cache(sampler):
    _, lm = mixed_lm()
    prompt = random_tokens((2, 4), seed=5)
    keras.utils.set_random_seed(1)
    mixed, _ = lm.generate(prompt, 16, sampler=sampler)
    keras.utils.set_random_seed(1)
    full, _ = lm.generate(prompt, 16, sampler=sampler, cache="full")
    np.testing.assert_array_equal(to_numpy(mixed), to_numpy(full))


def test_arguments_are_refused_naming_them():
    _, lm = mixed_lm()
    prompt = np.array([[3, 4]])
    with pytest.raises(ValueError, match=r"cache='rolling'"):
        lm.generate(prompt, 8, cache="rolling")
    with pytest.raises(ValueError, match=r"sink_tokens=2, cache='full'"):
        lm.generate(prompt, 8, sink_tokens=2, cache="full")
    with pytest.raises(ValueError, match=r"cache_update_index=3"):
        lm.call_with_cache(prompt, init_cache(lm.blocks, 1, 4), 3)
