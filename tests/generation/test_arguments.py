"""Generator arguments checked before any graph is built (both backends)."""

import functools
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


# The model pieces are built once per configuration (`functools.lru_cache`)
# and shared: every call of `causal_lm` / `seq2seq` makes a new generator of
# them (its own compiled loops), and no test changes them. Seeded, so that
# they do not depend on which test builds them first.
@functools.lru_cache(maxsize=None)
def _causal_lm_pieces():
    keras.utils.set_random_seed(0)
    embedding = TokenAndPositionEmbedding(VOCAB, POSITIONS, 8, mask_zero=True)
    block = TransformerDecoderBlock(2, 8, cross_attention=False)
    head = keras.layers.Dense(VOCAB)
    head(block(embedding(np.ones((1, 3), "int32"))))  # build
    return embedding, block, head


def causal_lm(**kwargs):
    embedding, block, head = _causal_lm_pieces()
    kwargs.setdefault("jit_compile", False)
    return CausalLMGenerator(embedding, [block], head, **kwargs)


@functools.lru_cache(maxsize=None)
def _seq2seq_pieces(source_positions):
    keras.utils.set_random_seed(source_positions)
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
    return encoder, embedding, block, head


def seq2seq(source_positions=POSITIONS, **kwargs):
    encoder, embedding, block, head = _seq2seq_pieces(source_positions)
    kwargs.setdefault("jit_compile", False)
    return Seq2SeqGenerator(encoder, embedding, [block], head, **kwargs)


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
    # Issue 26: attention sinks and streaming (decoder-only models);
    # issue 38: the mixed cache (`cache`).
    assert params(CausalLMGenerator.generate) == [
        "self",
        "token_ids",
    ] + tail + [
        "sink_tokens",
        "stream",
        "cache",
    ]
    assert (
        params(Seq2SeqGenerator.generate)
        == [
            "self",
            "encoder_token_ids",
            "decoder_token_ids",
        ]
        + tail
    )


# Issue 23, items 5-8 and 15: the arguments of `generate` and of the
# constructors are checked before any graph is built.


def test_max_length_shorter_than_the_prompts_is_a_value_error():
    # Used to return the (1, 6) prompt for max_length=3, without a word.
    prompt = np.array([[1, 5, 6, 7, 8, 9]])
    with pytest.raises(
        ValueError,
        match=re.escape("max_length=3, token_ids.shape[1]=6"),
    ):
        causal_lm().generate(prompt, max_length=3)
    with pytest.raises(
        ValueError,
        match=re.escape("max_length=5, decoder_token_ids.shape[1]=6"),
    ):
        seq2seq().generate(np.array([[4, 5, 0]]), prompt, max_length=5)
    # Equal lengths are fine: the outputs are (batch, max_length).
    out, mask = causal_lm().generate(np.array([[1, 5, 0]]), max_length=3)
    assert tuple(out.shape) == tuple(mask.shape) == (1, 3)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_prompts_without_a_token_are_value_errors(jit_compile):
    # Used to fail inside the loop (`while/Slice`) without XLA and to
    # return garbage tokens with it.
    lm = causal_lm(jit_compile=jit_compile)
    prompt = np.array([[1, 2, 0], [0, 0, 0], [4, 0, 0], [0, 0, 0]])
    with pytest.raises(
        ValueError, match=r"rows \[1, 3\] of `token_ids` have none"
    ):
        lm.generate(prompt, max_length=6)
    with pytest.raises(ValueError, match=r"rows \[0\] of `padding_mask`"):
        lm.generate(
            np.array([[1, 2, 0]]),
            padding_mask=np.array([[False, False, False]]),
        )
    with pytest.raises(ValueError, match="rows \\[0\\] of `token_ids`"):
        lm.generate(np.zeros((1, 0), "int32"), max_length=4)  # length 0
    with pytest.raises(
        ValueError, match="rows \\[0\\] of `decoder_token_ids` have none"
    ):
        seq2seq(jit_compile=jit_compile).generate(
            np.array([[4, 5, 0]]), np.array([[0, 0]]), max_length=4
        )


def test_left_padded_prompts_are_value_errors():
    # Used to generate from the padding (the loop starts at the shortest
    # prompt's length) and attend to the padded keys.
    lm = causal_lm()
    with pytest.raises(ValueError, match=r"right-padded.*rows \[1\]"):
        lm.generate(np.array([[1, 2, 0], [0, 3, 4]]), max_length=5)
    with pytest.raises(ValueError, match=r"right-padded.*rows \[0\]"):
        lm.generate(
            np.array([[1, 2, 3]]),
            padding_mask=np.array([[True, False, True]]),
            max_length=5,
        )


def test_one_dimensional_prompt_is_one_example():
    # Used to raise `IndexError: tuple index out of range`.
    lm = causal_lm()
    out, mask = lm.generate(np.array([1, 5, 0]), max_length=5)
    batched, _ = lm.generate(np.array([[1, 5, 0]]), max_length=5)
    assert tuple(out.shape) == tuple(mask.shape) == (5,)
    np.testing.assert_array_equal(to_numpy(out), to_numpy(batched)[0])
    out, _ = lm.generate([1, 5, 0], 5, padding_mask=[True, True, False])
    np.testing.assert_array_equal(to_numpy(out), to_numpy(batched)[0])
    translator = seq2seq()
    out, _ = translator.generate(np.array([4, 5, 0]), np.array([1]), 4)
    batched, _ = translator.generate(np.array([[4, 5, 0]]), [[1]], 4)
    assert tuple(out.shape) == (4,)
    np.testing.assert_array_equal(to_numpy(out), to_numpy(batched)[0])
    for prompt in (np.int32(3), np.ones((1, 2, 3), "int32")):
        shape = re.escape(f"{prompt!r}" if prompt.ndim == 0 else "(1, 2, 3)")
        with pytest.raises(ValueError, match=f"(?s)`token_ids`.*{shape}"):
            lm.generate(prompt, max_length=4)
    with pytest.raises(ValueError, match=r"encoder_token_ids.shape=\(1, 3\)"):
        translator.generate(np.array([[4, 5, 0]]), np.array([1]), 4)
    with pytest.raises(ValueError, match=r"encoder_token_ids.shape=\(2, 3\)"):
        translator.generate(np.ones((2, 3), "int32"), [[1]], 4)


@pytest.mark.parametrize(
    "pad_token_id", [None, "0", -1, 1.0, True, np.bool_(False), VOCAB]
)
def test_pad_token_id_must_be_a_token_id(pad_token_id):
    # None used to fail at `generate` ("Attempt to convert a value
    # (None)"), "0" was not checked.
    with pytest.raises(
        ValueError, match=re.escape(f"pad_token_id={pad_token_id!r}")
    ):
        causal_lm(pad_token_id=pad_token_id)
    with pytest.raises(
        ValueError, match=re.escape(f"pad_token_id={pad_token_id!r}")
    ):
        seq2seq(pad_token_id=pad_token_id)


def test_numpy_integers_are_taken_as_python_ints():
    lm = causal_lm(pad_token_id=np.int64(0))
    assert type(lm.pad_token_id) is int
    prompt = np.array([[1, 2, 0]], "int64")
    expected = to_numpy(lm.generate(prompt, 6, stop_token_ids=(3,))[0])
    out, _ = lm.generate(
        prompt, max_length=np.int64(6), stop_token_ids=(np.int32(3),)
    )
    np.testing.assert_array_equal(to_numpy(out), expected)
    out, _ = lm.generate(
        prompt.astype("uint8"), np.int16(6), stop_token_ids=np.array([3])
    )
    np.testing.assert_array_equal(to_numpy(out), expected)
    assert list(lm._compiled) == [("greedy", (3,))]  # one loop for all
    for max_length in (np.bool_(True), True, np.float64(6.0), "6"):
        with pytest.raises(ValueError, match="max_length="):
            lm.generate(prompt, max_length=max_length)


@pytest.mark.parametrize(
    "token_ids",
    [
        [[1, 2], [3]],  # ragged
        np.array([[1.0, 2.0]]),
        np.array([[True, False]]),
        "1 2",
        None,
        np.array([[1, -2]]),
        np.array([[1, VOCAB]]),
        np.array([[1, 2**40]]),  # would wrap around in int32
        np.zeros((0, 3), "int32"),
    ],
)
def test_prompts_must_be_token_ids(token_ids):
    with pytest.raises(ValueError, match="`token_ids`"):
        causal_lm().generate(token_ids, max_length=4)


@pytest.mark.parametrize(
    "padding_mask",
    [
        np.ones((1, 4), bool),
        np.ones((2, 3), bool),
        np.ones((3,), bool),
        np.ones((1, 3), "float32"),
        "all",
    ],
)
def test_padding_mask_must_match_the_prompts(padding_mask):
    with pytest.raises(ValueError, match=r"`padding_mask`.*\(1, 3\)"):
        causal_lm().generate(np.array([[1, 2, 0]]), padding_mask=padding_mask)


@pytest.mark.parametrize(
    "stop_token_ids", [3, "3", (3, "4"), (-1,), (VOCAB,), (3.0,), {3: 1}]
)
def test_stop_token_ids_must_be_a_tuple_of_token_ids(stop_token_ids):
    with pytest.raises(
        ValueError, match=re.escape(f"stop_token_ids={stop_token_ids!r}")
    ):
        causal_lm().generate(
            np.array([[1, 2]]), 4, stop_token_ids=stop_token_ids
        )


@pytest.mark.parametrize("sampler", [None, "nope", "Greedy", 3, {}])
def test_sampler_must_be_a_keras_hub_sampler_or_its_name(sampler):
    with pytest.raises(ValueError, match=re.escape(f"sampler={sampler!r}")):
        causal_lm().generate(np.array([[1, 2]]), 4, sampler=sampler)


def test_model_pieces_are_checked():
    lm = causal_lm()
    embedding, blocks, head = lm.embedding, lm.blocks, lm.head
    for kwargs, name in [
        (dict(embedding=None), "embedding=None"),
        (dict(blocks=None), "blocks=None"),
        (dict(blocks=blocks[0]), "blocks=<"),
        (dict(blocks=[]), "blocks=[]"),
        (dict(blocks=[3]), "blocks=[3]"),
        (dict(head=None), "head=None"),
        (dict(head=[]), "head=[]"),
        (dict(head=[head[0], 3]), "head=["),
    ]:
        parts = dict(embedding=embedding, blocks=blocks, head=head)
        with pytest.raises(ValueError, match=re.escape(name)):
            CausalLMGenerator(**{**parts, **kwargs})
    translator = seq2seq()
    with pytest.raises(ValueError, match="encoder=None"):
        Seq2SeqGenerator(
            None, translator.embedding, translator.blocks, translator.head
        )
    unbuilt = CausalLMGenerator(
        embedding, [TransformerDecoderBlock(2, 8, cross_attention=False)], head
    )
    with pytest.raises(ValueError, match=r"unbuilt blocks at positions \[0\]"):
        unbuilt.generate(np.array([[1, 2]]), max_length=4)


def test_plain_callables_are_accepted_as_embedding_and_head():
    lm = causal_lm()
    table = lm.embedding

    def embed(ids, start_index=0):
        return table(ids, start_index=start_index)

    def head(hidden):
        return lm.head[0](hidden)

    plain = CausalLMGenerator(embed, lm.blocks, head, jit_compile=False)
    prompt = np.array([[1, 2, 0, 0]])
    np.testing.assert_array_equal(
        to_numpy(plain.generate(prompt)[0]), to_numpy(lm.generate(prompt)[0])
    )


def after_first_stop(tokens, prompt_length, stop, pad):
    """`tokens` (one row, stop tokens not applied) padded after the first
    stop token generated after the prompt; and the mask."""
    tokens, mask = np.array(tokens), np.ones(len(tokens), bool)
    stops = np.flatnonzero(np.isin(tokens[prompt_length:], stop))
    if stops.size:
        tokens[prompt_length + stops[0] + 1 :] = pad
        mask[prompt_length + stops[0] + 1 :] = False
    return tokens, mask


@pytest.mark.parametrize("explicit_mask", [False, True])
def test_a_stop_token_in_the_padding_does_not_stop_generation(explicit_mask):
    # The keras_hub samplers stop once every row holds a stop token at a
    # position it generates: a buffer padded with a stop token (the
    # pad_token_id, often the end token too; or anything under an explicit
    # padding_mask) used to stop before the first step, returning the
    # prompt (found by tests/properties/test_generation_properties.py).
    pad = 4
    lm = causal_lm(pad_token_id=pad)
    prompt = np.array([[1, 3, pad, pad, pad, pad]])
    full = to_numpy(lm.generate(prompt)[0])[0]
    assert full[2] != pad  # else the test would prove nothing
    kwargs = {}
    if explicit_mask:
        stop = (9, 5)
        prompt = np.where(prompt == pad, 9, prompt)
        kwargs["padding_mask"] = prompt != 9
    else:
        stop = (pad, 5)
    tokens, mask = lm.generate(prompt, stop_token_ids=stop, **kwargs)
    expected, expected_mask = after_first_stop(full, 2, stop, pad)
    np.testing.assert_array_equal(to_numpy(tokens)[0], expected)
    np.testing.assert_array_equal(to_numpy(mask)[0], expected_mask)


@pytest.mark.tf_only("tf.function: prompts as symbolic tensors")
def test_symbolic_prompts_are_checked_for_rank_dtype_and_length():
    # As the language-model export calls it: the batch unknown.
    import tensorflow as tf

    lm = causal_lm()
    prompt = np.array([[1, 2, 0, 0], [3, 0, 0, 0]], "int32")
    eager = [to_numpy(x) for x in lm.generate(prompt, stop_token_ids=(5,))]
    traced = tf.function(
        lambda ids: lm.generate(ids, stop_token_ids=(5,)),
        input_signature=[tf.TensorSpec([None, 4], tf.int32)],
    )
    for got, want in zip(traced(prompt), eager):
        np.testing.assert_array_equal(to_numpy(got), want)

    def trace(spec, **kwargs):
        return tf.function(
            lambda ids: lm.generate(ids, **kwargs), input_signature=[spec]
        ).get_concrete_function()

    unknown_length = tf.TensorSpec([None, None], tf.int32)
    with pytest.raises(ValueError, match=r"max_length=6"):
        trace(unknown_length, max_length=6)
    trace(unknown_length)  # no max_length: the outputs keep the length
    with pytest.raises(ValueError, match="(?s)`token_ids`.*dtype float32"):
        trace(tf.TensorSpec([None, 4], tf.float32))
    with pytest.raises(ValueError, match=r"(?s)`token_ids`.*\(None, 4, 2\)"):
        trace(tf.TensorSpec([None, 4, 2], tf.int32))
    with pytest.raises(ValueError, match=r"max_length=3, token_ids.shape"):
        trace(tf.TensorSpec([None, 4], tf.int32), max_length=3)
