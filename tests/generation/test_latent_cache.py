"""Generation with multi-head latent attention (`latent_attention=`,
DeepSeek's MLA): its blocks cache one latent of `kv_lora_rank +
qk_rope_head_dim` numbers per token in the mixed cache, beside a ring for
windowed blocks and keys and values for full ones. The cache's shapes
(the per-token width); chunked passes over every plan against the
uncached model; greedy decoding (XLA-compiled and not) against the
uncached model; beam search against keras-hub's beam search over the
uncached model; the arguments refused (every backend)."""

import functools

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops
from keras.ops import convert_to_numpy as to_numpy
from test_rolling_cache import VOCAB
from test_rolling_cache import assert_greedy
from test_rolling_cache import random_tokens

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.generation import CausalLMGenerator
from keras_attention.generation import init_cache

LATENT = dict(
    kv_lora_rank=6,
    qk_nope_head_dim=4,
    qk_rope_head_dim=2,
    v_head_dim=3,
    q_lora_rank=5,
    rope_theta=100.0,
)
WIDTH = 6 + 2  # kv_lora_rank + qk_rope_head_dim


@functools.lru_cache(maxsize=None)
def build(kinds=("latent", 2)):
    """A pre-norm model of 4 heads whose blocks are latent (`"latent"`),
    windowed (an int) or full (None; rotary, 2 key/value heads of 4):
    `(model, embedding, blocks, head)`, built once per `kinds`."""
    keras.utils.set_random_seed(38)
    embedding = keras.layers.Embedding(VOCAB, 16, mask_zero=True)
    blocks = []
    for kind in kinds:
        if kind == "latent":
            options = dict(latent_attention=LATENT)
        else:
            options = dict(
                window_size=kind,
                rotary_max_wavelength=100,
                num_key_value_heads=2,
            )
        blocks.append(
            TransformerDecoderBlock(
                num_heads=4,
                intermediate_dim=16,
                cross_attention=False,
                norm_first=True,
                **options,
            )
        )
    head = keras.layers.Dense(VOCAB)
    ids = keras.Input((None,), dtype="int32")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    return keras.Model(ids, head(x)), embedding, blocks, head


def generator(kinds=("latent", 2), jit_compile=False):
    model, embedding, blocks, head = build(kinds)
    lm = CausalLMGenerator(embedding, blocks, head, jit_compile=jit_compile)
    return model, lm


def test_the_latent_blocks_cache_their_latent_width_per_token():
    _, lm = generator()
    options = dict(lm._cache_options(None))  # what `generate` keeps
    latent, ring = init_cache(lm.blocks, 2, 40, **options)
    # The latent: kv_lora_rank + qk_rope_head_dim = 8 numbers per token
    # and layer, against 2 * heads * (nope + rope) = 48 for keys and
    # values of the same heads; the windowed block's ring: 2 + 1 slots.
    assert tuple(latent[0]["latent"].shape) == (2, 40, WIDTH)
    assert tuple(latent[0]["key_mask"].shape) == (2, 40)
    assert tuple(ring[0]["keys_values"].shape) == (2, 2, 3, 2, 4)
    assert tuple(ring[0]["slot_mask"].shape) == (2, 3)
    # cache="full": keys and values for the windowed block, the latent
    # still for the latent one.
    latent, full = init_cache(
        lm.blocks, 2, 40, **dict(lm._cache_options(None, "full"))
    )
    assert tuple(full[0]["keys_values"].shape) == (2, 2, 40, 2, 4)
    assert tuple(latent[0]["latent"].shape) == (2, 40, WIDTH)


@pytest.mark.parametrize(
    "kinds, rolling",
    [(("latent", 2), True), (("latent", 2), False), (("latent",), True)],
    ids=["latent+ring", "latent+full", "latent only"],
)
def test_chunked_logits_equal_the_uncached_pass(kinds, rolling):
    model, lm = generator(kinds)
    ids = random_tokens((2, 12), seed=1)
    ids[1, 8:] = 0  # masked tokens (mask_zero) as keys, as the model does
    options = dict(sink_tokens=0) if rolling else {}
    cache = init_cache(lm.blocks, 2, 12, **options)
    shapes = [tuple(t.shape) for t in keras.tree.flatten(cache)]
    steps = []
    for start in range(0, 12, 4):
        logits, _, cache = lm.call_with_cache(
            ids[:, start : start + 4], cache, start
        )
        steps.append(to_numpy(logits))
    assert [tuple(t.shape) for t in keras.tree.flatten(cache)] == shapes
    np.testing.assert_allclose(
        np.concatenate(steps, axis=1), to_numpy(model(ids)), atol=1e-4
    )


# One shape for all (batch 2, 12 positions): JAX compiles per shape.
@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
@pytest.mark.parametrize(
    "jit_compile",
    [
        pytest.param(
            False,
            marks=pytest.mark.skipif(
                keras.backend.backend() == "tensorflow",
                reason="TensorFlow's loop without XLA is the beam test's",
            ),
        ),
        pytest.param(
            True,
            marks=pytest.mark.tf_only(
                "jit_compile is TensorFlow's XLA; JAX and PyTorch run the "
                "same loop as jit_compile=False"
            ),
        ),
    ],
)
def test_greedy_equals_the_uncached_model(jit_compile):
    model, lm = generator(jit_compile=jit_compile)
    prompt = random_tokens((2, 5), seed=2)
    prompt[1, 3:] = 0  # a shorter prompt
    tokens, _ = lm.generate(prompt, max_length=12, sampler="greedy")
    assert_greedy(model, prompt, tokens)


def test_beam_equals_beam_search_over_the_uncached_model():
    """The beams (batch 1 x 2 beams: the other tests' batch of 2) gather
    the latent cache as keras-hub's beam search over the uncached model's
    logits of the whole prefix."""
    model, lm = generator(("latent",))
    prompt = random_tokens((1, 4), seed=5)
    tokens, _ = lm.generate(
        prompt, 12, sampler=keras_hub.samplers.BeamSampler(num_beams=2)
    )

    def uncached(prompt, cache, index):
        logits = model(prompt)
        return logits[:, index - 1], None, cache

    padded = np.pad(prompt, ((0, 0), (0, 8)))
    want = keras_hub.samplers.BeamSampler(num_beams=2)(
        next=uncached,
        prompt=ops.convert_to_tensor(padded),
        index=4,
        mask=ops.convert_to_tensor(padded != 0),
    )
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(want))


def test_arguments_are_refused_naming_them():
    _, lm = generator(("latent",))
    prompt = np.array([[3, 4]])
    block = lm.blocks[0].name
    with pytest.raises(
        ValueError, match=rf"block 0 \('{block}'.*sink_tokens=1"
    ):
        lm.generate(prompt, 6, sink_tokens=1)
    # A latent cache holds no window: `sink_tokens` cannot reach it.
    with pytest.raises(ValueError, match=r"sink_tokens=1.*window=None"):
        lm.blocks[0].self_attention.init_cache(1, 6, sink_tokens=1)
