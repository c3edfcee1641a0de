"""The rolling key/value cache of windowed models: cached generation
against the uncached windowed forward pass (several wraps of the ring,
grouped-query attention, chunked prompts), attention sinks against the
uncached mask "window or first k keys", score and mask objects (ALiBi, T5
relative bias, soft-capping, a chunked mask) on absolute positions,
streaming, lengths beyond every position table, and the arguments refused
(every backend)."""

import functools

import keras
import keras_hub
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.generation import CausalLMGenerator
from keras_attention.generation import init_cache
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import TokenAndPositionEmbedding
from keras_attention.mods import ChunkedCausalMask
from keras_attention.mods import MaskMod
from keras_attention.mods import SlidingWindowMask
from keras_attention.mods import or_masks
from keras_attention.scores import ALiBi
from keras_attention.scores import SoftCap
from keras_attention.scores import T5RelativeBias

VOCAB, END = 17, 16
WINDOWS = (3, 5)  # ring of 6 slots: the test lengths wrap it many times


class FirstKeys(MaskMod):
    """Keys `0 .. k - 1` (the sinks), for the uncached reference."""

    def __init__(self, k):
        self.k = k

    def __call__(self, batch, head, q_idx, kv_idx):
        return kv_idx < self.k


def build_lm(windows=WINDOWS, sinks=None, embedding=None, jit_compile=False):
    """A rotary, grouped-query (4 heads, 2 key/value heads) language model
    whose blocks attend to the last `windows[l]` positions (all of them for
    None); with `sinks`, the windowed blocks attend with full attention
    under the mask "window or first `sinks` keys" instead (the uncached
    reference of attention sinks). Returns `(model, generator)`."""
    embedding = embedding or keras.layers.Embedding(VOCAB, 16, mask_zero=True)
    blocks = []
    for window in windows:
        kwargs = dict(window_size=window)
        if sinks is not None and window is not None:
            kwargs = dict(
                mask_mod=or_masks(
                    SlidingWindowMask(window, causal=True), FirstKeys(sinks)
                )
            )
        blocks.append(
            TransformerDecoderBlock(
                num_heads=4,
                intermediate_dim=32,
                cross_attention=False,
                num_key_value_heads=2,
                norm_first=True,
                rotary_max_wavelength=100,
                **kwargs,
            )
        )
    head = keras.layers.Dense(VOCAB)
    ids = keras.Input((None,), dtype="int32")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    model = keras.Model(ids, head(x))
    return model, CausalLMGenerator(
        embedding, blocks, head, jit_compile=jit_compile
    )


# Models are built once per configuration (`functools.lru_cache`) and
# shared by the tests (and parametrizations) of that configuration; no test
# changes them. Each call of `seeded_lm` / `twin_models` gives a new
# generator of the shared layers (its own compiled loops).
def new_generator(lm, jit_compile=False):
    return CausalLMGenerator(
        lm.embedding, lm.blocks, lm.head, jit_compile=jit_compile
    )


@functools.lru_cache(maxsize=None)
def _seeded_build(seed):
    keras.utils.set_random_seed(seed)
    return build_lm()


def seeded_lm(seed, jit_compile=False):
    """`build_lm()` after `keras.utils.set_random_seed(seed)` (the same
    weights), built once: `(model, new generator)`."""
    model, lm = _seeded_build(seed)
    return model, new_generator(lm, jit_compile)


@functools.lru_cache(maxsize=None)
def _reference_build(sinks):
    """The uncached reference with `sinks`, with `seeded_lm(3)`'s weights."""
    model, _ = _seeded_build(3)
    reference, reference_lm = build_lm(sinks=sinks)
    reference.set_weights(model.get_weights())
    return reference, reference_lm


def twin_models(sinks):
    """The windowed model, its generator, and the uncached reference with
    `sinks` (model and generator), sharing weights."""
    model, lm = seeded_lm(3)
    reference, reference_lm = _reference_build(sinks)
    return model, lm, reference, new_generator(reference_lm)


def random_tokens(shape, seed=0):
    return np.random.default_rng(seed).integers(1, END, size=shape)


def ring_slots(blocks, sink_tokens=0):
    """The slots of each block's ring (its keys and values' axis 2)."""
    caches = init_cache(blocks, 1, 1000, sink_tokens=sink_tokens)
    return [cache[0]["keys_values"].shape[2] for cache in caches]


def rolling_logits(lm, ids, chunk, sinks=0):
    """Logits of `ids` fed through the rolling cache `chunk` at a time."""
    cache = init_cache(lm.blocks, ids.shape[0], 1, sink_tokens=sinks)
    steps = []
    for start in range(0, ids.shape[1], chunk):
        logits, _, cache = lm.call_with_cache(
            ids[:, start : start + chunk], cache, start
        )
        steps.append(to_numpy(logits))
    return np.concatenate(steps, axis=1)


def assert_greedy(model, prompt, tokens):
    """`tokens` hold the prompts, then at every later position the argmax
    of the uncached model's logits of the prefix: one causal pass over
    `tokens` gives the logits of every prefix at once."""
    tokens = to_numpy(tokens)
    logits = to_numpy(model(tokens))
    for row, ids in enumerate(prompt):
        length = int(np.sum(ids != 0))
        np.testing.assert_array_equal(tokens[row, :length], ids[:length])
        np.testing.assert_array_equal(
            tokens[row, length:], logits[row, length - 1 : -1].argmax(-1)
        )


# Score and mask objects: built per block (T5's table is a weight).
MODS = {
    "alibi": lambda: dict(score_mod=ALiBi()),
    "t5": lambda: dict(
        score_mod=T5RelativeBias(
            num_buckets=8,
            max_distance=16,
            bidirectional=False,
            embeddings_initializer="random_normal",
        )
    ),
    "softcap_chunked": lambda: dict(
        score_mod=SoftCap(2.0), mask_mod=ChunkedCausalMask(4)
    ),
}


def build_lm_with_mods(mods, windows=WINDOWS):
    """`build_lm`'s grouped-query model without rotary positions, each
    windowed block with the score/mask objects of `MODS[mods]` (ALiBi and
    T5 carry the positions). Returns `(model, generator)`."""
    embedding = keras.layers.Embedding(VOCAB, 16, mask_zero=True)
    blocks = [
        TransformerDecoderBlock(
            num_heads=4,
            intermediate_dim=32,
            cross_attention=False,
            num_key_value_heads=2,
            norm_first=True,
            window_size=window,
            **MODS[mods](),
        )
        for window in windows
    ]
    head = keras.layers.Dense(VOCAB)
    ids = keras.Input((None,), dtype="int32")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    # Traced without XLA: the compiled (XLA) rolling loop is
    # test_greedy_equals_uncached_windowed_model[True]'s.
    return keras.Model(ids, head(x)), CausalLMGenerator(
        embedding, blocks, head, jit_compile=False
    )


@pytest.mark.parametrize("mods", sorted(MODS))
def test_score_objects_see_positions_on_the_rolling_cache(mods):
    # 29 positions through a ring of 6 slots (about five wraps), one, four
    # and nine at a time: the functions must see each slot's position.
    keras.utils.set_random_seed(5)
    model, lm = build_lm_with_mods(mods)
    ids = random_tokens((2, 29), seed=2)
    ids[1, 17] = 0  # a token the embedding masks
    full = to_numpy(model(ids))
    valid = ids != 0
    for chunk in (1, 4, 9):
        rolled = rolling_logits(lm, ids, chunk)
        np.testing.assert_allclose(rolled[valid], full[valid], atol=2e-5)


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
@pytest.mark.parametrize("mods", ["alibi", "t5"])
def test_greedy_with_score_objects_uses_the_rolling_cache(mods):
    keras.utils.set_random_seed(6)
    model, lm = build_lm_with_mods(mods)
    # A rolling cache (streaming needs one), prompts longer than a
    # prefill chunk (32) and of different lengths.
    assert max(ring_slots(lm.blocks)) == max(WINDOWS) + 1
    prompt = np.zeros((2, 36), "int32")
    prompt[0] = random_tokens(36, seed=7)
    prompt[1, :5] = random_tokens(5, seed=8)
    tokens, _ = lm.generate(prompt, max_length=50, sampler="greedy")
    assert_greedy(model, prompt, tokens)
    pieces = list(lm.generate(prompt, max_length=50, stream=8))
    np.testing.assert_array_equal(np.concatenate(pieces, 1), to_numpy(tokens))


def test_cache_holds_the_window_only():
    _, lm = seeded_lm(0)  # any weights
    # Each block's ring holds its own window (issue 54: the largest one
    # for every block before).
    assert ring_slots(lm.blocks) == [w + 1 for w in WINDOWS]
    assert ring_slots(lm.blocks, sink_tokens=4) == [w + 5 for w in WINDOWS]


@pytest.mark.parametrize("chunk", [1, 4, 9])
def test_rolling_logits_equal_uncached_windowed_pass(chunk):
    model, lm = seeded_lm(1)
    ids = random_tokens((2, 29))
    ids[1, 20] = 0  # a token the embedding masks (`mask_zero`)
    full = to_numpy(model(ids))
    rolled = rolling_logits(lm, ids, chunk)
    valid = ids != 0
    np.testing.assert_allclose(rolled[valid], full[valid], atol=2e-5)


@pytest.mark.parametrize("sinks", [1, 3])
def test_sinks_equal_uncached_mask_window_or_first_keys(sinks):
    _, lm, reference, _ = twin_models(sinks)
    ids = random_tokens((2, 25), seed=1)
    full = to_numpy(reference(ids))
    for chunk in (1, 7):
        rolled = rolling_logits(lm, ids, chunk, sinks)
        np.testing.assert_allclose(rolled, full, atol=2e-5)


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
@pytest.mark.parametrize(
    "jit_compile",
    [False, pytest.param(True, marks=pytest.mark.tf_only("XLA on TensorFlow"))],
)
def test_greedy_equals_uncached_windowed_model(jit_compile):
    model, lm = seeded_lm(2, jit_compile=jit_compile)
    # Prompts longer than a prefill chunk (32), of different lengths.
    prompt = np.zeros((3, 40), "int32")
    prompt[0] = random_tokens(40, seed=4)
    prompt[1, :35] = random_tokens(35, seed=5)
    prompt[2, :3] = [3, 4, 5]
    tokens, mask = lm.generate(prompt, max_length=52, sampler="greedy")
    assert_greedy(model, prompt, tokens)
    assert np.all(to_numpy(mask))


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
def test_greedy_with_sinks_equals_uncached_reference():
    sinks = 2
    _, lm, reference, _ = twin_models(sinks)
    prompt = np.array(
        [[3, 4, 5, 6, 7, 8, 9, 1, 2], [8, 9, 0, 0, 0, 0, 0, 0, 0]]
    )
    tokens, _ = lm.generate(prompt, max_length=40, sink_tokens=sinks)
    assert_greedy(reference, prompt, tokens)


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
@pytest.mark.parametrize("sampler", ["beam", "contrastive"])
def test_beam_and_contrastive_search_equal_the_full_cache(sampler):
    # Both reorder the cache along the batch (beams, candidates);
    # contrastive search also compares with the prompt's hidden states.
    # The reference has full attention under the window mask: the
    # generator keeps a full cache for it.
    _, lm, _, full = twin_models(sinks=0)
    prompt = np.array([[3, 4, 5, 6], [8, 9, 0, 0]])
    sampler = (
        keras_hub.samplers.BeamSampler(num_beams=3)
        if sampler == "beam"
        else keras_hub.samplers.ContrastiveSampler(k=3)
    )
    rolled, _ = lm.generate(prompt, max_length=20, sampler=sampler)
    expected, _ = full.generate(prompt, max_length=20, sampler=sampler)
    np.testing.assert_array_equal(to_numpy(rolled), to_numpy(expected))


@pytest.mark.parametrize("sampler", ["top_k", "top_p"])
def test_random_samplers_run_on_the_rolling_cache(sampler):
    _, lm = seeded_lm(0)  # any weights
    tokens, mask = lm.generate(np.array([[3, 4, 5]]), 24, sampler=sampler)
    tokens = to_numpy(tokens)
    assert tokens.shape == (1, 24) and np.all(to_numpy(mask))
    assert np.all((tokens >= 0) & (tokens < VOCAB))


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
def test_stream_yields_the_outputs_piece_by_piece():
    _, lm = seeded_lm(0)  # any weights
    prompt = np.array([[3, 4, 5, 6, 7], [8, 9, 0, 0, 0]])
    whole, _ = lm.generate(prompt, max_length=31)
    pieces = list(lm.generate(prompt, max_length=31, stream=8))
    assert [p.shape[1] for p in pieces] == [13, 8, 8, 2]
    np.testing.assert_array_equal(np.concatenate(pieces, 1), to_numpy(whole))
    # One `(T,)` prompt: `(n,)` pieces.
    one = list(lm.generate(prompt[0], max_length=31, stream=True))
    np.testing.assert_array_equal(np.concatenate(one), to_numpy(whole)[0])


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
def test_stream_pads_after_stop_tokens_and_ends():
    _, lm = seeded_lm(0)  # any weights
    prompt = np.array([[3, 4, 5, 6, 7], [8, 9, 0, 0, 0]])
    whole, _ = lm.generate(prompt, max_length=40)
    whole = to_numpy(whole)
    stop = int(whole[0, 7])  # a token the first row generates
    expected, _ = lm.generate(prompt, 40, stop_token_ids=(stop,))
    expected = to_numpy(expected)
    streamed = np.concatenate(
        list(lm.generate(prompt, 40, stop_token_ids=(stop,), stream=12)), 1
    )
    n = streamed.shape[1]
    np.testing.assert_array_equal(streamed, expected[:, :n])
    assert np.all(expected[:, n:] == 0)


@pytest.mark.tf_only("a tf.function of prompts of unknown length")
def test_rolling_cache_in_a_graph_of_unknown_length():
    # What a SavedModel serving strings of any length traces: a buffer
    # `(None, None)`, its length known at run time only.
    import tensorflow as tf

    _, lm = seeded_lm(0)  # any weights
    generate = tf.function(
        lambda ids: lm.generate(ids, sampler="greedy")[0],
        input_signature=[tf.TensorSpec([None, None], tf.int32)],
    )
    for width in (9, 45):
        prompt = np.zeros((2, width), "int32")
        prompt[0, : width - 4] = random_tokens(width - 4, seed=width)
        prompt[1, :3] = [3, 4, 5]
        expected, _ = lm.generate(prompt, sampler="greedy")
        np.testing.assert_array_equal(
            generate(prompt).numpy(), to_numpy(expected)
        )


def test_lengths_beyond_every_position_table_when_windowed():
    _, lm = seeded_lm(0)  # any weights
    tokens, _ = lm.generate(np.array([[3, 4]]), max_length=300)
    assert to_numpy(tokens).shape == (1, 300)


def test_learned_positions_limit_the_length_naming_the_layer():
    table = TokenAndPositionEmbedding(VOCAB, 12, 16, name="char_positions")
    _, lm = build_lm(embedding=table)
    with pytest.raises(ValueError, match=r"'char_positions'.*max_length=20"):
        lm.generate(np.array([[3, 4]]), max_length=20)


def test_sinks_need_a_windowed_block():
    # (`stream` needs no windowed block since issue 39: it streams over
    # full attention too, tests/generation/test_recurrent_cache.py.)
    _, lm = build_lm(windows=(None, None))
    block = lm.blocks[0].name
    with pytest.raises(ValueError, match=rf"block 0 \('{block}'.*=2"):
        lm.generate(np.array([[3, 4]]), 8, sink_tokens=2)


@pytest.mark.parametrize("value", [-1, 1.5, "2"])
def test_bad_sink_tokens_are_refused(value):
    _, lm = seeded_lm(0)  # any weights
    with pytest.raises(ValueError, match=rf"sink_tokens={value!r}"):
        lm.generate(np.array([[3, 4]]), 8, sink_tokens=value)


@pytest.mark.parametrize("value", [0, -2, 2.0])
def test_bad_stream_is_refused(value):
    _, lm = seeded_lm(0)  # any weights
    with pytest.raises(ValueError, match=rf"stream={value!r}"):
        lm.generate(np.array([[3, 4]]), 8, stream=value)


def test_beam_cannot_stream():
    _, lm = seeded_lm(0)  # any weights
    with pytest.raises(ValueError, match="sampler='beam'"):
        lm.generate(np.array([[3, 4]]), 8, sampler="beam", stream=True)


def layer_pairs(mods=None):
    """`(layer, wide twin, left bound, is_local)`: the windowed layer, the
    same weights without a window (the uncached reference takes the mask
    as `attention_mask`); each with the objects of `MODS[mods]`."""

    def extra():
        return MODS[mods]() if mods else {}

    mha = MultiHeadAttention(
        4, 4, sliding_window=4, num_key_value_heads=2, **extra()
    )
    wide_mha = MultiHeadAttention(4, 4, num_key_value_heads=2, **extra())
    local = LocalSelfAttention(4, 4, window_size=3, causal=True, **extra())
    wide_local = LocalSelfAttention(
        4, 4, window_size=14, causal=True, **extra()
    )
    return [(mha, wide_mha, 3, False), (local, wide_local, 3, True)]


@pytest.mark.parametrize("mods", [None] + sorted(MODS))
@pytest.mark.parametrize("sinks", [0, 2])
def test_layers_rolling_cache_equals_uncached_window(sinks, mods):
    """`MultiHeadAttention(sliding_window=4)` and `LocalSelfAttention(
    window_size=3, causal=True)` with a rolling cache, one step and five
    at a time, against the uncached layer under the mask "window or first
    `sinks` keys" (with the same score and mask objects: they see the
    sinks' and the ring's positions)."""
    x = np.random.default_rng(0).normal(size=(2, 14, 8)).astype("float32")
    i, j = np.arange(14)[:, None], np.arange(14)[None]
    for layer, wide, left, is_local in layer_pairs(mods):

        def run(attention, inputs, **kwargs):
            if is_local:
                return attention(inputs, **kwargs)
            return attention(inputs, inputs, use_causal_mask=True, **kwargs)

        run(layer, x)
        run(wide, x)
        wide.set_weights(layer.get_weights())
        mask = (j <= i) & ((i - j <= left) | (j < sinks))
        expected = to_numpy(run(wide, x, attention_mask=mask))
        kv_heads = layer.num_key_value_heads or layer.num_heads
        for chunk in (1, 5):
            cache = np.zeros((2, 2, sinks + left + 1, kv_heads, 4), "float32")
            outs = []
            for start in range(0, 14, chunk):
                y, cache = run(
                    layer,
                    x[:, start : start + chunk],
                    cache=cache,
                    cache_update_index=start,
                    cache_sink_tokens=sinks,
                )
                outs.append(to_numpy(y))
            np.testing.assert_allclose(
                np.concatenate(outs, 1), expected, atol=2e-6
            )


def test_rolling_cache_without_a_window_is_refused():
    layer = MultiHeadAttention(2, 4, name="full_attention")
    x = np.ones((1, 1, 8), "float32")
    with pytest.raises(ValueError, match="windowed.*'full_attention'"):
        layer(
            x,
            x,
            cache=np.zeros((1, 2, 4, 2, 4), "float32"),
            cache_update_index=0,
            cache_sink_tokens=0,
        )


@pytest.mark.parametrize("steps", [1, 5])
def test_output_spec_gives_the_scores_shape_of_the_rolling_cache(steps):
    # The keys of a rolling-cache call are the slots, then the call's own:
    # scores `(batch, heads, T, S + T)`, not `(T, S)`.
    x = np.ones((2, steps, 8), "float32")
    cache = np.zeros((2, 2, 6, 2, 4), "float32")
    rolling = dict(cache=cache, cache_update_index=7, cache_sink_tokens=1)
    mha = MultiHeadAttention(4, 4, sliding_window=4, num_key_value_heads=2)
    local = LocalSelfAttention(
        4, 4, window_size=3, causal=True, num_key_value_heads=2
    )
    block = TransformerDecoderBlock(
        4,
        16,
        cross_attention=False,
        key_dim=4,
        num_key_value_heads=2,
        window_size=4,
    )
    block(x)
    block_rolling = {f"self_attention_{k}": v for k, v in rolling.items()}
    calls = [
        (mha, (x, x), rolling),
        (local, (x,), rolling),
        (block, (x,), block_rolling),
    ]
    for layer, inputs, kwargs in calls:
        kwargs = dict(kwargs, return_attention_scores=True)
        _, scores, new_cache = layer(*inputs, **kwargs)
        symbolic = [keras.KerasTensor(a.shape) for a in inputs]
        spec = layer.compute_output_spec(*symbolic, **kwargs)
        assert tuple(scores.shape) == (2, 4, steps, 6 + steps), layer.name
        assert tuple(spec[1].shape) == tuple(scores.shape), layer.name
        assert tuple(spec[2].shape) == tuple(new_cache.shape), layer.name
