"""A user's token mixer decodes under the generators with no change to
the library (issue 54): a cumulative mean implementing the cache protocol
(`keras_attention.layers.TokenMixer`) with `(sum, count)` as its cache,
put in a block beside softmax attention, gives the greedy tokens of an
uncached argmax loop over the model, with left and right padding
(every backend)."""

import keras
import numpy as np
import pytest
from keras import ops
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.generation import CausalLMGenerator
from keras_attention.generation import init_cache
from keras_attention.layers import TokenMixer

VOCAB, PAD = 13, 12  # id 0: masked by the embedding (left padding)


class CumulativeMean(TokenMixer, keras.layers.Layer):
    """`y_t = Dense(mean of the unpadded x_s, s <= t)`; its cache: the
    running `(sum, count)`, of constant size."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True  # per position: the mask passes on

    def build(self, inputs_shape):
        self.features = inputs_shape[-1]
        self.dense = keras.layers.Dense(self.features, name="dense")
        self.dense.build(inputs_shape)

    def init_cache(self, batch_size, max_length, dtype=None):
        dtype = dtype or self.compute_dtype
        return (
            ops.zeros((batch_size, self.features), dtype),
            ops.zeros((batch_size, 1), dtype),
        )

    def call(
        self,
        inputs,
        padding_mask=None,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        if padding_mask is None:
            padding_mask = ops.ones(ops.shape(inputs)[:2], "bool")
        keep = ops.cast(padding_mask, inputs.dtype)[..., None]
        sums = ops.cumsum(inputs * keep, axis=1)
        counts = ops.cumsum(keep, axis=1)
        if cache is not None:
            sums = sums + ops.expand_dims(cache[0], 1)
            counts = counts + ops.expand_dims(cache[1], 1)
        outputs = self.dense(sums / ops.maximum(counts, 1.0))
        if cache is None:
            return outputs
        return outputs, (sums[:, -1], counts[:, -1])


def build_lm():
    """Embedding, a block of the user's mixer, a block of rotary softmax
    attention, head: `(model, generator)`."""
    keras.utils.set_random_seed(54)
    embedding = keras.layers.Embedding(VOCAB, 8, mask_zero=True)
    blocks = [
        TransformerDecoderBlock(
            intermediate_dim=16,
            cross_attention=False,
            self_attention=CumulativeMean(),
            norm_first=True,
        ),
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
    return model, CausalLMGenerator(
        embedding, blocks, head, pad_token_id=PAD, jit_compile=False
    )


def uncached_greedy(model, prompt, prompt_mask, max_length):
    """The argmax loop over the whole model, no cache: each position's
    token from the logits of the prefix before it."""
    ids = np.full((prompt.shape[0], max_length), PAD, "int32")
    ids[:, : prompt.shape[1]] = prompt
    keep = np.zeros(ids.shape, bool)
    keep[:, : prompt.shape[1]] = prompt_mask
    start = int(prompt_mask.sum(axis=1).min())
    for t in range(start, max_length):
        logits = to_numpy(model(ids[:, :t]))[:, -1]
        ids[:, t] = np.where(keep[:, t], ids[:, t], logits.argmax(-1))
    return ids


def prompts():
    """Left-padded (ids 0 the embedding masks), full and right-padded
    prompts, and their mask."""
    prompt = np.array(
        [[0, 0, 5, 6, 7], [3, 4, 5, 6, 7], [9, 10, PAD, PAD, PAD]], "int32"
    )
    return prompt, prompt != PAD


def test_the_user_mixer_caches_its_sum_and_count():
    _, lm = build_lm()
    mixer_cache, attention_cache = init_cache(lm.blocks, 3, 9)
    assert [tuple(t.shape) for t in mixer_cache[0]] == [(3, 8), (3, 1)]
    assert tuple(attention_cache[0]["keys_values"].shape) == (3, 2, 9, 2, 4)


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
