"""Kimi delta attention as a block mixer (`TransformerDecoderBlock(
mixer="kda")`, `KimiDeltaAttention` sized from the block) and its
decoding under `CausalLMGenerator`: the block builds the layer from its
own sizes and round-trips its config; it is the layer inside the block's
norms and residuals; the refusals (its sizes in `mixer_options`, a
non-causal encoder); its cache keeps a constant size; greedy tokens
equal an uncached argmax loop over the model with left- and
right-padded prompts, streamed too (TensorFlow in the slow tier,
PyTorch in the fast one; the JAX part runs no generation file)."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from test_user_mixer import PAD
from test_user_mixer import VOCAB
from test_user_mixer import prompts
from test_user_mixer import uncached_greedy

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.generation import CausalLMGenerator
from keras_attention.generation import init_cache
from keras_attention.layers import KimiDeltaAttention

F = 8
OPTIONS = dict(conv_kernel_size=3, chunk_size=4)
BACKEND = keras.backend.backend()
# Tracing the generation loops and the uncached model at each prefix
# length costs ~15 s on TensorFlow (37 s on the loaded 2-core machine),
# 5 s on PyTorch, which runs it in the fast tier.
COSTLY = (
    pytest.mark.slow("TensorFlow traces the loops; PyTorch runs it fast")
    if BACKEND == "tensorflow"
    else pytest.mark.skipif(False, reason="")
)


def kda_block(**kwargs):
    kwargs = dict(
        dict(norm_first=True, mixer="kda", mixer_options=OPTIONS), **kwargs
    )
    return TransformerDecoderBlock(2, 16, cross_attention=False, **kwargs)


def build_lm():
    """Embedding, a KDA block, a block of rotary softmax attention, head
    (Kimi Linear's pattern, short): `(model, generator)`."""
    keras.utils.set_random_seed(56)
    embedding = keras.layers.Embedding(VOCAB, F, mask_zero=True)
    blocks = [
        kda_block(),
        TransformerDecoderBlock(
            2,
            16,
            cross_attention=False,
            rotary_max_wavelength=100,
            norm_first=True,
        ),
    ]
    head = keras.layers.Dense(VOCAB)
    ids = keras.Input((None,), dtype="int32")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    model = keras.Model(ids, head(x))
    rng = np.random.default_rng(0)
    for w in blocks[0].self_attention.weights:  # decays and gates moved
        w.assign(rng.normal(size=w.shape).astype(w.dtype))
    return model, CausalLMGenerator(
        embedding, blocks, head, pad_token_id=PAD, jit_compile=False
    )


def test_the_block_builds_kda_from_its_sizes_and_config():
    block = kda_block()
    x = np.random.default_rng(1).normal(size=(2, 5, F)).astype("float32")
    y = to_numpy(block(x))
    layer = block.self_attention
    assert isinstance(layer, KimiDeltaAttention)
    assert (layer.hidden_size, layer.num_heads, layer.head_dim) == (F, 2, 4)
    assert (layer.conv_kernel_size, layer.chunk_size) == (3, 4)
    # It is the layer inside the block's (pre-)norm and residuals.
    alone = KimiDeltaAttention.from_config(layer.get_config())
    alone.build(x.shape)
    alone.set_weights(layer.get_weights())
    h = x + to_numpy(alone(block.self_attention_norm(x)))
    want = h + to_numpy(block.feed_forward(block.feed_forward_norm(h)))
    np.testing.assert_allclose(y, want, atol=1e-5)
    # The block's config builds the same block.
    again = TransformerDecoderBlock.from_config(block.get_config())
    again.build(x.shape)
    again.set_weights(block.get_weights())
    np.testing.assert_allclose(to_numpy(again(x)), y, atol=1e-6)
    # `key_dim` sets the head size, as for softmax attention.
    wide = kda_block(key_dim=3)
    wide.build(x.shape)
    assert wide.self_attention.head_dim == 3


def test_refusals():
    with pytest.raises(ValueError, match=r"\['num_heads'\] come from"):
        TransformerDecoderBlock(
            2,
            16,
            cross_attention=False,
            mixer="kda",
            mixer_options=dict(num_heads=4),
        )
    with pytest.raises(ValueError, match="`conv_kernel_size`"):
        kda_block(mixer_options=dict(conv_kernel_size=0))
    with pytest.raises(ValueError, match="KimiDeltaAttention runs in one"):
        TransformerEncoderBlock(2, 16, mixer="kda")
    with pytest.raises(ValueError, match="`window_size` cannot apply"):
        kda_block(window_size=2)


def test_the_cache_keeps_its_size():
    _, lm = build_lm()
    kda, attention = init_cache(lm.blocks, 3, 9)
    # The convolution's last K - 1 inputs of 3 H d channels, the state.
    assert [tuple(t.shape) for t in kda[0]] == [(3, 2, 24), (3, 2, 4, 4)]
    assert tuple(attention[0]["keys_values"].shape) == (3, 2, 9, 2, 4)


@COSTLY
@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")
def test_greedy_tokens_equal_the_uncached_argmax_loop():
    model, lm = build_lm()
    prompt, mask = prompts()
    want = uncached_greedy(model, prompt, mask, 12)
    tokens, _ = lm.generate(prompt, max_length=12, sampler="greedy")
    np.testing.assert_array_equal(to_numpy(tokens), want)
    # Streamed in pieces, the caches carried from piece to piece.
    pieces = list(lm.generate(prompt, max_length=12, stream=3))
    np.testing.assert_array_equal(np.concatenate(pieces, axis=1), want)
