"""The prefill of a prompt buffer (issue 54): when every block's cache
keeps a slot per position (`TokenMixer.cache_overwrites_positions`), the
generators write the buffer in chunks of `PREFILL_CHUNK` positions (one
call when it is shorter), as the full-cache route did before the one
decoding route; otherwise in chunks and steps. Both
give the same tokens and the same hidden states, with left and right
padding; each layer says what its cache is."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.generation import CausalLMGenerator
from keras_attention.generation import _generator
from keras_attention.layers import GatedDeltaNet
from keras_attention.layers import LinearAttention
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import MultiHeadLatentAttention
from keras_attention.layers import SelfAttention
from keras_attention.layers import TokenMixer

VOCAB, PAD, FEATURES = 17, 16, 16


def built(layer, features=FEATURES):
    layer(np.zeros((1, 4, features), "float32"))
    return layer


def test_each_layer_says_whether_its_cache_is_one_slot_per_position():
    attention = built(SelfAttention(2, 8, causal=True))
    assert attention.cache_overwrites_positions(attention.init_cache(2, 9))
    local = built(LocalSelfAttention(2, 8, 3, causal=True))
    assert local.cache_overwrites_positions(local.init_cache(2, 9))
    ring = local.init_cache(2, 9, sink_tokens=1)
    assert not local.cache_overwrites_positions(ring)
    latent = built(MultiHeadLatentAttention(2, 4, 4, 4, 4))
    assert latent.cache_overwrites_positions(latent.init_cache(2, 9))
    for mixer in (
        built(LinearAttention(2, 8)),
        built(GatedDeltaNet(FEATURES, 2, 2, 8, 8)),
    ):
        assert not mixer.cache_overwrites_positions(mixer.init_cache(2, 9))
    # A user's mixer that does not say: written in order, each once.
    assert not TokenMixer().cache_overwrites_positions(None)


def language_model(windowed):
    keras.utils.set_random_seed(7)
    embedding = keras.layers.Embedding(VOCAB, FEATURES)
    options = dict(cross_attention=False, norm_first=True)
    blocks = [
        TransformerDecoderBlock(
            2, 32, rotary_max_wavelength=100, window_size=window, **options
        )
        for window in ((None, 3) if windowed else (None, None))
    ]
    head = keras.layers.Dense(VOCAB)
    x = embedding(keras.Input((None,), dtype="int32"))
    for block in blocks:
        x = block(x)
    head(x)
    return CausalLMGenerator(
        embedding, blocks, head, pad_token_id=PAD, jit_compile=False
    )


def prompt_buffer():
    ids = np.array(
        [
            [3, 4, 5, 6, 7, 8, 9, 1, PAD, PAD],
            [2, 3, 4, PAD, PAD, PAD] + [PAD] * 4,
        ],
        "int32",
    )
    return ids, ids != PAD


@pytest.mark.parametrize("windowed", [False, True])
def test_one_call_prefill_equals_chunks_and_steps(windowed, monkeypatch):
    lm = language_model(windowed)
    ids, mask = prompt_buffer()
    cache = lm._new_cache(2, ids.shape[1])
    assert lm._overwrites_positions(cache)  # full caches: one slot each
    once = lm._prefill(ids, mask, cache, hidden=True)
    monkeypatch.setattr(
        _generator.Generator, "_overwrites_positions", lambda self, c: False
    )
    stepped = lm._prefill(ids, mask, lm._new_cache(2, ids.shape[1]), True)
    assert int(once[2]) == int(stepped[2]) == 3
    np.testing.assert_allclose(
        to_numpy(once[0]), to_numpy(stepped[0]), atol=1e-5
    )
    # The rest of the generation reads the caches: equal tokens.
    chunked = to_numpy(lm.generate(ids, max_length=10, cache="full")[0])
    monkeypatch.undo()
    lm._compiled.clear()  # traced (TensorFlow) with the chunks: anew
    whole = to_numpy(lm.generate(ids, max_length=10, cache="full")[0])
    np.testing.assert_array_equal(whole, chunked)


def test_a_ring_of_slots_is_prefilled_in_order(monkeypatch):
    lm = language_model(windowed=True)
    cache = lm._new_cache(2, 10, (("sink_tokens", 0),))
    assert not lm._overwrites_positions(cache)
    calls = []
    original = _generator.Generator._prefill_slots
    monkeypatch.setattr(
        _generator.Generator,
        "_prefill_slots",
        lambda *a: calls.append(1) or original(*a),
    )
    ids, _ = prompt_buffer()
    lm.generate(ids, max_length=10)  # "auto": rings for the window
    assert not calls
    lm.generate(ids, max_length=10, cache="full")
    assert calls


@pytest.mark.parametrize("bound", ["positions", "scores"])
@pytest.mark.parametrize("windowed", [False, True])
def test_no_prefill_call_is_wider_than_a_chunk(windowed, bound, monkeypatch):
    """A compiled loop holds its body's buffers whether or not it runs:
    a prefill call as wide as the buffer (or as a long window plus one)
    took GBs for a short prompt, and a chunk attends to the whole buffer
    (512 positions against 32,768: 1-1.8 GB beyond the caches). Chunks
    hold `PREFILL_CHUNK` positions and `PREFILL_SCORES` scores against
    the buffer at most. Slot chunks past the buffer's end move back to
    end with it, and both ways give the one-call results."""
    lm = language_model(windowed)
    ids = np.array([[3, 4, 5, 6, 7, 8, 9, 1, 2, PAD]] * 2, "int32")
    ids[1, 9] = 5  # shortest 9: chunks at 0, 4 and 6 (moved back)
    mask = ids != PAD
    cache = "auto" if windowed else "full"
    options = (("sink_tokens", 0),) if windowed else ()
    whole = lm._prefill(ids, mask, lm._new_cache(2, 10, options), True)
    widths = []
    original = _generator.Generator.call_with_cache
    if bound == "positions":
        monkeypatch.setattr(_generator, "PREFILL_CHUNK", 4)
    else:  # 4 positions against the buffer's 10
        monkeypatch.setattr(_generator, "PREFILL_SCORES", 49)
        monkeypatch.setattr(_generator, "MIN_PREFILL_CHUNK", 1)
    monkeypatch.setattr(
        _generator.Generator,
        "call_with_cache",
        lambda self, t, *a: widths.append(t.shape[1]) or original(self, t, *a),
    )
    chunked = lm._prefill(ids, mask, lm._new_cache(2, 10, options), True)
    assert widths and max(widths) <= 4
    assert int(chunked[2]) == int(whole[2]) == 9
    np.testing.assert_allclose(
        to_numpy(chunked[0]), to_numpy(whole[0]), atol=1e-5
    )
    lm._compiled.clear()
    tokens = to_numpy(lm.generate(ids, max_length=12, cache=cache)[0])
    monkeypatch.undo()
    lm._compiled.clear()
    expected = to_numpy(lm.generate(ids, max_length=12, cache=cache)[0])
    np.testing.assert_array_equal(tokens, expected)
