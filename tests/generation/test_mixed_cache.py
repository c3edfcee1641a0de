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

# Windowed, full, windowed, full: the ring has 5 + 1 slots.
MIXED = (2, None, 5, None)


@functools.lru_cache(maxsize=None)
def _mixed_build(seed=4):
    keras.utils.set_random_seed(seed)
    return build_lm(windows=MIXED)


def mixed_lm(jit_compile=False):
    model, lm = _mixed_build()
    return model, new_generator(lm, jit_compile)


def test_plan_names_the_full_blocks():
    _, lm = mixed_lm()
    plan = lm.mixed_cache_plan(sink_tokens=2)
    assert plan.full == (1, 3) and plan.sink_tokens == 2
    assert lm._cache_plan(2) == plan  # what `generate` keeps
    _, windowed = build_lm(windows=(2, 3))
    _, full = build_lm(windows=(None, None))
    assert windowed.mixed_cache_plan() is None
    assert full.mixed_cache_plan() is None


def test_cache_holds_max_length_for_full_blocks_and_the_ring_else():
    _, lm = mixed_lm()
    plan = lm.mixed_cache_plan(sink_tokens=3)
    full, rolling, slots, positions = lm.init_mixed_cache(2, 40, plan)
    # 2 full blocks of 40 positions; 2 windowed ones of 3 + 5 + 1 slots;
    # 2 key/value heads of 4 (16 features over 4 heads).
    assert tuple(full.shape) == (2, 2, 2, 40, 2, 4)
    assert tuple(rolling.shape) == (2, 2, 2, 9, 2, 4)
    assert tuple(slots.shape) == (2, 9)
    assert tuple(positions.shape) == (2, 40)


@pytest.mark.parametrize("chunk", [1, 7])
def test_mixed_logits_equal_the_uncached_pass(chunk):
    model, lm = mixed_lm()
    ids = random_tokens((2, 23), seed=1)
    ids[1, 17:] = 0  # masked tokens (mask_zero) as keys, as the model does
    plan = lm.mixed_cache_plan()
    cache = lm.init_mixed_cache(2, 23, plan)
    steps = []
    for start in range(0, 23, chunk):
        logits, _, cache = lm.call_with_mixed_cache(
            ids[:, start : start + chunk], cache, start, plan
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
    with pytest.raises(ValueError, match=r"'start'|start="):
        plan = lm.mixed_cache_plan()
        lm.call_with_mixed_cache(
            prompt, lm.init_mixed_cache(1, 4, plan), 3, plan
        )
