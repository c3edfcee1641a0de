"""Blocks composed from library layers decode under the generators: a
stack of blocks given a `GatedDeltaNet`, a windowed `LocalSelfAttention`,
a `MultiHeadLatentAttention` and a `GroupQueryAttention` (with a
`MixtureOfExperts` feed-forward) as layers, not options, gives the greedy
tokens of an uncached argmax loop over the model, with left and right
padding: each layer brings its own cache (issue 54)."""

import keras
import numpy as np
from keras.ops import convert_to_numpy as to_numpy

import keras_attention as ka
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.generation import CausalLMGenerator

VOCAB, PAD, F = 13, 12, 8


def build_lm():
    keras.utils.set_random_seed(54)
    layers = ka.layers
    mixers = [
        layers.GatedDeltaNet(F, 1, 2, 4, 4, chunk_size=4),
        layers.LocalSelfAttention(
            2, 4, window_size=2, causal=True, rotary_max_wavelength=100
        ),
        layers.MultiHeadLatentAttention(
            2,
            kv_lora_rank=4,
            qk_nope_head_dim=4,
            qk_rope_head_dim=2,
            v_head_dim=4,
        ),
        layers.GroupQueryAttention(2, 4, num_key_value_heads=1),
    ]
    blocks = [
        TransformerDecoderBlock(
            cross_attention=False,
            norm_first=True,
            self_attention=mixer,
            feed_forward=layers.MixtureOfExperts(3, 2, 8)
            if i % 2
            else layers.FeedForward(16),
        )
        for i, mixer in enumerate(mixers)
    ]
    embedding = keras.layers.Embedding(VOCAB, F, mask_zero=True)
    head = keras.layers.Dense(VOCAB)
    ids = keras.Input((None,), dtype="int32")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    model = keras.Model(ids, head(x))
    return model, CausalLMGenerator(
        embedding, blocks, head, pad_token_id=PAD, jit_compile=False
    )


def uncached_greedy(model, prompt, prompt_mask, max_length):
    ids = np.full((prompt.shape[0], max_length), PAD, "int32")
    ids[:, : prompt.shape[1]] = prompt
    keep = np.zeros(ids.shape, bool)
    keep[:, : prompt.shape[1]] = prompt_mask
    for t in range(int(prompt_mask.sum(axis=1).min()), max_length):
        logits = to_numpy(model(ids[:, :t]))[:, -1]
        ids[:, t] = np.where(keep[:, t], ids[:, t], logits.argmax(-1))
    return ids


def test_composed_blocks_decode_as_the_uncached_loop():
    model, lm = build_lm()
    prompt = np.array(
        [[0, 0, 5, 6, 7], [3, 4, 5, 6, 7], [9, 10, PAD, PAD, PAD]], "int32"
    )
    mask = prompt != PAD
    want = uncached_greedy(model, prompt, mask, 10)
    tokens, _ = lm.generate(prompt, max_length=10, sampler="greedy")
    np.testing.assert_array_equal(to_numpy(tokens), want)
