"""Generator arguments checked before any graph is built (both backends)."""

import inspect
import re

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.generation import CausalLMGenerator
from keras_attention.generation import Seq2SeqGenerator
from keras_attention.generation._generator import position_capacity
from keras_attention.layers import RotaryEmbedding
from keras_attention.layers import TokenAndPositionEmbedding

VOCAB, POSITIONS = 11, 8


def causal_lm(embedding=None):
    embedding = embedding or TokenAndPositionEmbedding(
        VOCAB, POSITIONS, 8, mask_zero=True
    )
    block = TransformerDecoderBlock(2, 8, cross_attention=False)
    head = keras.layers.Dense(VOCAB)
    head(block(embedding(np.ones((1, 3), "int32"))))  # build
    return CausalLMGenerator(embedding, [block], head, jit_compile=False)


def seq2seq(source_positions=POSITIONS):
    src = keras.Input((None,), dtype="int32")
    source_embedding = TokenAndPositionEmbedding(
        VOCAB, source_positions, 8, mask_zero=True
    )
    encoder = keras.Model(
        src, TransformerEncoderBlock(2, 8)(source_embedding(src))
    )
    embedding = TokenAndPositionEmbedding(VOCAB, POSITIONS, 8, mask_zero=True)
    block = TransformerDecoderBlock(2, 8)
    head = keras.layers.Dense(VOCAB)
    head(
        block(
            embedding(np.ones((1, 3), "int32")), np.ones((1, 2, 8), "float32")
        )
    )
    return Seq2SeqGenerator(
        encoder, embedding, [block], head, jit_compile=False
    )


def test_position_capacity_is_found_in_layers_and_models():
    assert position_capacity(TokenAndPositionEmbedding(VOCAB, 5, 4)) == 5
    assert position_capacity(seq2seq(source_positions=6).encoder) == 6
    assert position_capacity(keras.layers.Embedding(VOCAB, 4)) is None
    assert position_capacity(RotaryEmbedding()) is None
    assert position_capacity(lambda ids: ids) is None


def test_max_length_beyond_the_position_table_is_a_value_error():
    # Used to die inside the graph (`position_embedding/Slice`).
    lm = causal_lm()
    prompt = np.array([[1, 2, 0, 0]])
    with pytest.raises(ValueError, match=r"max_length=12, sequence_length=8"):
        lm.generate(prompt, max_length=12)
    with pytest.raises(ValueError, match=re.escape("token_ids.shape[1]=9")):
        lm.generate(np.ones((1, 9), "int32"))
    with pytest.raises(ValueError, match=re.escape("max_length=0")):
        lm.generate(prompt, max_length=0)


def test_seq2seq_checks_target_and_source_lengths():
    translator = seq2seq(source_positions=6)
    source, target = np.array([[4, 5, 6, 0]]), np.array([[1, 0, 0]])
    with pytest.raises(ValueError, match=r"max_length=9, sequence_length=8"):
        translator.generate(source, target, max_length=9)
    with pytest.raises(
        ValueError,
        match=re.escape("encoder_token_ids.shape[1]=7, sequence_length=6"),
    ):
        translator.generate(np.ones((1, 7), "int32"), target, max_length=5)


def test_generation_within_the_position_table_runs():
    lm = causal_lm()
    out, mask = lm.generate(np.array([[1, 2, 0, 0]]), max_length=POSITIONS)
    assert tuple(out.shape) == (1, POSITIONS)
    assert to_numpy(out)[0, :2].tolist() == [1, 2]


def test_jit_compile_refuses_non_bools():
    embedding = TokenAndPositionEmbedding(VOCAB, POSITIONS, 8)
    block = TransformerDecoderBlock(2, 8, cross_attention=False)
    with pytest.raises(ValueError, match="jit_compile='False'"):
        CausalLMGenerator(
            embedding, [block], keras.layers.Dense(VOCAB), jit_compile="False"
        )


def test_generators_are_siblings_with_unchanged_signatures():
    assert not issubclass(Seq2SeqGenerator, CausalLMGenerator)
    assert not issubclass(CausalLMGenerator, Seq2SeqGenerator)
    assert CausalLMGenerator.__bases__ == Seq2SeqGenerator.__bases__

    def params(fn):
        return list(inspect.signature(fn).parameters)

    tail = ["max_length", "sampler", "stop_token_ids", "padding_mask"]
    assert params(CausalLMGenerator.generate) == ["self", "token_ids"] + tail
    assert (
        params(Seq2SeqGenerator.generate)
        == [
            "self",
            "encoder_token_ids",
            "decoder_token_ids",
        ]
        + tail
    )
