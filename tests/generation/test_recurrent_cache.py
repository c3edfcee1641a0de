"""Generation with linear-time mixers (`mixer="gated_delta"`,
`GatedDeltaNet`; `mixer="linear"`, `LinearAttention`) in hybrid stacks:
each mixer block keeps its recurrent cache (state, and the convolution's
last inputs) in the mixed cache beside full attention's keys and
values. The cache's size (constant in the length for those blocks);
chunked passes against the uncached model, masked tokens included;
greedy decoding against the uncached model's argmax re-run on every
prefix; left-padded prompts against the unpadded ones (padding neither
writes nor decays the state nor enters the convolution, unlike
keras-hub's prefill over the padded buffer); the other samplers; beam
search against keras-hub's beam search over the uncached model;
streaming over full attention against the outputs at once; the
arguments refused (every backend)."""

import functools

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops
from keras.ops import convert_to_numpy as to_numpy
from test_rolling_cache import END
from test_rolling_cache import VOCAB
from test_rolling_cache import assert_greedy
from test_rolling_cache import random_tokens

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.generation import CausalLMGenerator
from keras_attention.generation import init_cache

DELTA = dict(
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=4,
    linear_value_head_dim=4,
    chunk_size=4,
)
LINEAR = dict(decay="gated", chunk_size=4)
HYBRID = ("gated_delta", "gated_delta", None)  # Qwen 3.5's pattern, short
BACKEND = keras.backend.backend()


def costly(reason, backends=("tensorflow", "jax")):
    """The slow tier on `backends` (compiling a generation loop costs 3
    to 15 s there), the fast tier elsewhere: PyTorch runs every test of
    this file in the fast tier (11 s), each of the others a sample."""
    if BACKEND in backends:
        return pytest.mark.slow(f"{reason}; PyTorch runs it in the fast tier")
    return pytest.mark.skipif(False, reason="")  # no mark


@functools.lru_cache(maxsize=None)
def build(kinds=HYBRID):
    """A pre-norm model of 4 heads whose blocks are a gated delta net
    (`"gated_delta"`), a gated linear attention (`"linear"`), windowed
    attention (an int) or full attention (None), without positions
    (the mixers carry the order): `(model, embedding, blocks, head)`."""
    keras.utils.set_random_seed(39)
    embedding = keras.layers.Embedding(VOCAB, 16, mask_zero=True)
    blocks = []
    for kind in kinds:
        options = dict(window_size=kind)
        if kind == "gated_delta":
            options = dict(mixer=kind, mixer_options=DELTA)
        elif kind == "linear":
            options = dict(mixer=kind, mixer_options=LINEAR)
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
    model = keras.Model(ids, head(x))
    rng = np.random.default_rng(0)
    for block in blocks:  # decays far from 1, gates of both signs
        for w in block.weights:
            if w.path.endswith(("A_log", "dt_bias")):
                w.assign(rng.normal(size=w.shape).astype(w.dtype))
    return model, embedding, blocks, head


def generator(kinds=HYBRID, jit_compile=False, pad_token_id=0):
    model, embedding, blocks, head = build(kinds)
    lm = CausalLMGenerator(
        embedding, blocks, head, pad_token_id, jit_compile=jit_compile
    )
    return model, lm


def test_recurrent_caches_keep_their_size_whatever_the_length():
    _, lm = generator(("gated_delta", "linear", None))
    # What `generate` keeps, with cache="auto" or "full" alike.
    assert lm._cache_options(None) == lm._cache_options(None, "full") == ()

    def shapes(max_length):
        caches = init_cache(lm.blocks, 2, max_length)
        (delta,), (linear,), (full,) = caches
        return tuple(full["keys_values"].shape), keras.tree.map_structure(
            lambda c: tuple(c.shape), (delta, linear)
        )

    (full_40, recurrent_40), (full_400, recurrent_400) = shapes(40), shapes(400)
    # The gated delta net: the convolution's last K - 1 = 3 inputs of
    # 2 key_dim + value_dim = 16 channels, and 2 value heads' 4 x 4
    # states; the linear attention: 4 heads' 4 x 4 states. The full
    # block: keys and values of every position.
    want = (((2, 3, 16), (2, 2, 4, 4)), (2, 4, 4, 4))
    assert recurrent_40 == recurrent_400 == want
    assert full_40 == (2, 2, 40, 4, 4) and full_400[2] == 400


@pytest.mark.parametrize(
    "chunk",
    [
        pytest.param(4, marks=costly("5 to 8 s of eager calls", ("jax",))),
        pytest.param(1, marks=costly("12 eager calls; chunks of 4 suffice")),
    ],
)
def test_chunked_logits_equal_the_uncached_pass(chunk):
    model, lm = generator(("gated_delta", "linear", None))
    ids = random_tokens((2, 12), seed=1)
    ids[0, :2] = 0  # masked tokens (mask_zero): left padding
    ids[1, 9:] = 0  # and right padding
    cache = init_cache(lm.blocks, 2, 12)
    steps = []
    for start in range(0, 12, chunk):
        logits, _, cache = lm.call_with_cache(
            ids[:, start : start + chunk], cache, start
        )
        steps.append(to_numpy(logits))
    valid = ids != 0
    np.testing.assert_allclose(
        np.concatenate(steps, axis=1)[valid],
        to_numpy(model(ids))[valid],
        atol=1e-4,
    )


# One shape for all (batch 2, 12 positions): JAX compiles per shape.
@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
@pytest.mark.parametrize(
    "jit_compile",
    [
        pytest.param(
            False,
            marks=[
                pytest.mark.skipif(
                    BACKEND == "tensorflow",
                    reason="TensorFlow's loop without XLA is the "
                    "left-padding test's",
                ),
                costly(
                    "the left-padding test checks greedy against the "
                    "uncached model in the same loop",
                    ("jax",),
                ),
            ],
        ),
        pytest.param(
            True,
            marks=[
                pytest.mark.tf_only(
                    "jit_compile is TensorFlow's XLA; JAX and PyTorch run "
                    "the same loop as jit_compile=False"
                ),
                pytest.mark.slow(
                    "XLA compiles the loop in 14 s; the left-padding test "
                    "checks greedy against the uncached model on TensorFlow"
                ),
            ],
        ),
    ],
)
def test_greedy_equals_the_uncached_model(jit_compile):
    model, lm = generator(jit_compile=jit_compile)
    prompt = random_tokens((2, 5), seed=2)
    prompt[1, 3:] = 0  # a shorter prompt, run on in the sampler's loop
    tokens, _ = lm.generate(prompt, max_length=12, sampler="greedy")
    assert_greedy(model, prompt, tokens)


@costly("a loop compiled for 44 positions, 2 to 9 s")
def test_a_long_prompt_is_prefilled_in_chunks():
    """40 prompt tokens: one chunk of 32, then token by token, then the
    sampler's steps (the prefill leaves the last prompt token to them:
    a recurrent state cannot take a token twice)."""
    model, lm = generator(("linear", None))
    prompt = random_tokens((1, 40), seed=3)
    tokens, _ = lm.generate(prompt, max_length=44, sampler="greedy")
    assert_greedy(model, prompt, tokens)


@costly("eager prefills with their loops, 7 to 16 s")
def test_the_prefill_of_a_left_padded_prompt_is_the_unpadded_ones():
    """Tokens the embedding masks (`mask_zero`: id 0, the padding of the
    prompts here being `END`) before a prompt change nothing: the
    generator's prefill leaves the unpadded prompt's recurrent states
    (convolution's included) and hidden states."""
    _, lm = generator(pad_token_id=END)
    tokens = random_tokens((1, 4), seed=4)
    padded = np.concatenate([np.zeros((1, 2), tokens.dtype), tokens], 1)
    results = []
    for ids in (padded, tokens):
        hidden, cache, index = lm._prefill(
            ids,
            np.ones(ids.shape, bool),
            init_cache(lm.blocks, 1, ids.shape[1]),
            hidden=True,
        )
        recurrent = [
            c for b, c in zip(lm.blocks, cache) if b.mixer != "attention"
        ]
        results.append((to_numpy(hidden)[0, -1], recurrent, int(index)))
    (h_pad, state_pad, i_pad), (h, state, i) = results
    assert (i_pad, i) == (6, 4)
    np.testing.assert_allclose(h_pad, h, atol=1e-5)
    for a, b in zip(keras.tree.flatten(state_pad), keras.tree.flatten(state)):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=1e-5)


def test_left_padded_prompts_generate_the_unpadded_ones_tokens():
    """In one batch, row 0 a prompt left-padded with tokens the
    embedding masks (the batch's padding being `END`), row 1 the same
    prompt right-padded: row 0 generates row 1's tokens (the padding
    ran through the prefill and the sampler's loop without touching the
    state), and row 1's are the uncached model's argmax."""
    model, lm = generator(pad_token_id=END)
    tokens = random_tokens((4,), seed=4)
    batch = np.full((2, 6), END)
    batch[0, 2:], batch[0, :2], batch[1, :4] = tokens, 0, tokens
    out, _ = lm.generate(batch, max_length=12, sampler="greedy")
    out = to_numpy(out)
    np.testing.assert_array_equal(out[1, :4], tokens)
    np.testing.assert_array_equal(out[0, 6:12], out[1, 4:10])
    logits = to_numpy(model(out[1:, :10]))[0]
    np.testing.assert_array_equal(out[1, 4:10], logits[3:9].argmax(-1))


@costly("three loops compiled, 11 to 22 s")
def test_samplers_that_reduce_to_greedy_give_its_tokens():
    """Top-k with k = 1, top-p with a tiny p and contrastive search with
    alpha = 0 (its hidden states and candidate caches included) pick
    the argmax at every step."""
    model, lm = generator()
    prompt = random_tokens((2, 5), seed=2)
    prompt[1, 3:] = 0
    for sampler in (
        keras_hub.samplers.TopKSampler(k=1, seed=1),
        keras_hub.samplers.TopPSampler(p=1e-6, seed=1),
        keras_hub.samplers.ContrastiveSampler(k=2, alpha=0.0),
    ):
        tokens, _ = lm.generate(prompt, max_length=12, sampler=sampler)
        assert_greedy(model, prompt, tokens)


@costly("7 s; TensorFlow's XLA, JAX's loop", ("tensorflow",))
def test_beam_equals_beam_search_over_the_uncached_model():
    """The beams (batch 1 x 2 beams) gather the recurrent caches as
    keras-hub's beam search over the uncached model's logits of the
    whole prefix."""
    model, lm = generator()
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


@pytest.mark.parametrize(
    "kinds",
    [
        pytest.param(HYBRID, marks=costly("two loops compiled, 8 to 18 s")),
        pytest.param(
            (None, None), marks=costly("the same path, 4 s", ("jax",))
        ),
    ],
    ids=["hybrid", "full attention"],
)
def test_stream_over_full_attention_equals_the_outputs(kinds):
    """`stream=` over a stack holding full attention (its cache made for
    `max_length` positions at the first piece): the pieces joined are
    the outputs at once."""
    _, lm = generator(kinds)
    prompt = random_tokens((2, 5), seed=6)
    prompt[1, 3:] = 0
    tokens, _ = lm.generate(prompt, max_length=12, sampler="greedy")
    pieces = list(lm.generate(prompt, max_length=12, stream=3))
    assert [p.shape[1] for p in pieces] == [8, 3, 1]
    np.testing.assert_array_equal(np.concatenate(pieces, 1), to_numpy(tokens))


def test_arguments_are_refused_naming_them():
    _, lm = generator()
    block = lm.blocks[0].name
    with pytest.raises(
        ValueError, match=rf"block 0 \('{block}'.*GatedDeltaNet.*=1"
    ):
        lm.generate(np.array([[3, 4]]), 6, sink_tokens=1)
    with pytest.raises(ValueError, match="sampler='beam'"):
        lm.generate(np.array([[3, 4]]), 6, sampler="beam", stream=True)
