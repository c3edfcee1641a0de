"""Generators under Hypothesis: every draw either gives the reference
result or raises `ValueError`/`TypeError` naming an argument it got wrong.

Draws cover the constructors' arguments (the model pieces, `pad_token_id`,
`jit_compile`) and `generate`'s (prompts of rank 0 to 3, lengths 0 and 1,
batch 0, right/left padding, rows of padding only, ids outside the
vocabulary, NumPy scalars and dtypes, strings, None, negative and huge
numbers, Python lists, backend tensors, explicit padding masks (int or
bool, padded positions holding any id), stop tokens (the pad id among
them), samplers by name or object).

Two kinds of properties per generator: valid draws must return
`(batch, max_length)` outputs (`(max_length,)` for one `(T,)` prompt)
equal to the reference: greedy decoding without a cache, the whole model
run on the growing sequences in a Python loop, prompt tokens kept,
padding after the first generated stop token; draws wrong for a
non-empty set of arguments must raise naming one of them (never another
exception, a wrong shape, or an argument silently ignored).

Where the reference's two best logits are within `TIE` of each other, the
cached logits may rank them the other way (float rounding): the row is
compared up to that step only.

Cost: tiny models built once per module; the reference runs the model on
one fixed `(ROWS, POSITIONS)` buffer (causal attention: later positions do
not change earlier logits), so that JAX compiles it once. XLA generation
(TensorFlow's default) is one fixed-shape property, compiled once. On JAX,
where `generate` compiles its loop at every new shape (seconds), the
reference properties draw 3 examples (`fewer`). About 25 s per backend
in the "ci" profile on 2 cores.
"""

import functools
import re

import keras
import numpy as np
import pytest
from hypothesis import event
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.generation import CausalLMGenerator
from keras_attention.generation import Seq2SeqGenerator
from keras_attention.layers import TokenAndPositionEmbedding

keras_hub = pytest.importorskip("keras_hub")

BACKEND = keras.backend.backend()
VOCAB, POSITIONS, SOURCE_POSITIONS = 7, 8, 5
ROWS = 3  # the most prompts a draw has
PADS = (0, 4)  # the generators' pad_token_id
# (pad_token_id, mask_zero): an embedding that masks id 0 (the model masks
# prompt and generated 0s alike) goes with pad_token_id=0.
LM_VARIANTS = ((0, False), (4, False), (0, True))
TIE = 1e-4
GREEDY = keras_hub.samplers.GreedySampler()  # one object: one loop


def fewer(divisor, jax_divisor=None):
    """A fraction of the profile's examples (5 at least), for costly
    properties; on JAX `jax_divisor`'s (3 at least): there each `generate`
    of a new shape or stop token compiles its `while` loop (about 2 s on
    the CI machine)."""
    least = 5
    if BACKEND == "jax" and jax_divisor is not None:
        divisor, least = jax_divisor, 3
    return settings(
        max_examples=max(least, settings.default.max_examples // divisor)
    )


# The models, built once.


@functools.cache
def lm_pieces(mask_zero=False):
    keras.utils.set_random_seed(3)
    embedding = TokenAndPositionEmbedding(
        VOCAB, POSITIONS, 8, mask_zero=mask_zero
    )
    block = TransformerDecoderBlock(
        2, 16, cross_attention=False, num_key_value_heads=1
    )
    head = keras.layers.Dense(VOCAB)
    ids = keras.Input((None,), dtype="int32")
    model = keras.Model(ids, head(block(embedding(ids))))
    return model, embedding, [block], head


@functools.cache
def lm(pad_token_id=0, jit_compile=False, mask_zero=False):
    _, embedding, blocks, head = lm_pieces(mask_zero)
    return CausalLMGenerator(
        embedding, blocks, head, pad_token_id, jit_compile=jit_compile
    )


@functools.cache
def seq2seq_pieces():
    keras.utils.set_random_seed(4)
    source = keras.Input((None,), dtype="int32")
    target = keras.Input((None,), dtype="int32")
    source_embedding = TokenAndPositionEmbedding(
        VOCAB, SOURCE_POSITIONS, 8, mask_zero=True
    )
    encoder = keras.Model(
        source, TransformerEncoderBlock(2, 16)(source_embedding(source))
    )
    embedding = TokenAndPositionEmbedding(VOCAB, POSITIONS, 8)
    block = TransformerDecoderBlock(2, 16)
    head = keras.layers.Dense(VOCAB)
    context = encoder(source)
    hidden = block(
        embedding(target),
        context,
        context_padding_mask=keras.ops.not_equal(source, 0),
    )
    model = keras.Model([source, target], head(hidden))
    generator = Seq2SeqGenerator(
        encoder, embedding, [block], head, jit_compile=False
    )
    return model, generator


# The reference.


@functools.cache
def _predict(model):
    """`model` on a fixed-shape batch: compiled once on JAX (its eager
    calls are slow), the model itself elsewhere."""
    if BACKEND == "jax":
        return model.predict_on_batch
    return lambda *inputs: to_numpy(model(*inputs))


def greedy_reference(logits_of, prompts, max_length, stop_token_ids, pad):
    """Uncached greedy completion of `prompts` (lists of tokens).

    `logits_of(buffer)` gives the `(ROWS, POSITIONS, VOCAB)` logits of a
    `(ROWS, POSITIONS)` buffer. Returns `(tokens, mask, compared)`:
    `(batch, max_length)` arrays, and per row how many leading positions
    are certain (the rest follows a near tie).
    """
    buffer = np.full((ROWS, POSITIONS), pad, "int32")
    lengths = np.full(ROWS, POSITIONS)
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = prompt
        lengths[row] = len(prompt)
    compared = np.full(len(prompts), max_length)
    while np.any(lengths[: len(prompts)] < max_length):
        logits = logits_of(buffer)
        for row in range(len(prompts)):
            at = lengths[row]
            if at >= max_length:
                continue
            best = np.sort(logits[row, at - 1])[-2:]
            if best[1] - best[0] < TIE:
                compared[row] = min(compared[row], at)
            buffer[row, at] = int(np.argmax(logits[row, at - 1]))
            lengths[row] += 1
    tokens = buffer[: len(prompts), :max_length].copy()
    mask = np.ones_like(tokens, bool)
    for row, prompt in enumerate(prompts):
        generated = tokens[row, len(prompt) :]
        stops = np.flatnonzero(np.isin(generated, stop_token_ids or ()))
        if stops.size:
            after = len(prompt) + stops[0] + 1
            tokens[row, after:] = pad
            mask[row, after:] = False
    return tokens, mask, compared


def check_equal(out, expected, unbatched):
    """`out` (`(tokens, mask)` from `generate`) against the reference."""
    event(
        "generated"
        + (" (near tie)" if expected[2].min() < len(expected[0][0]) else "")
    )
    tokens, mask, compared = expected
    got_tokens, got_mask = (to_numpy(x) for x in out)
    shape = tokens.shape[1:] if unbatched else tokens.shape
    assert got_tokens.shape == got_mask.shape == shape
    assert got_mask.dtype == bool
    if unbatched:
        got_tokens, got_mask = got_tokens[None], got_mask[None]
    for row, n in enumerate(compared):
        np.testing.assert_array_equal(got_tokens[row, :n], tokens[row, :n])
        np.testing.assert_array_equal(got_mask[row, :n], mask[row, :n])


# Draws: each value with `wrong`, the names of the arguments that it gets
# wrong (empty when it is valid).

INT_TYPES = (int, np.int64, np.int32, np.uint8, np.int16)


def integer(value):
    """`value` as a Python int or a NumPy integer scalar."""
    return st.sampled_from(INT_TYPES).map(lambda kind: kind(value))


def not_pad(pad):
    """Token ids other than `pad`."""
    return st.integers(0, VOCAB - 2).map(lambda t: t + (t >= pad))


class Prompts:
    """A draw of prompts: `token_ids` and `padding_mask` (the arguments),
    `rows` (each prompt's tokens, for the reference), `length` (`T`),
    `unbatched` (one `(T,)` prompt) and `wrong`."""

    def __init__(self, rows, token_ids, padding_mask, length):
        self.rows, self.token_ids, self.padding_mask = rows, token_ids, None
        self.mask, self.length = padding_mask, length
        self.unbatched, self.wrong = False, set()

    def __repr__(self):
        return (
            f"Prompts(token_ids={self.token_ids!r}, "
            f"padding_mask={self.padding_mask!r}, rows={self.rows!r}, "
            f"wrong={self.wrong!r})"
        )


@st.composite
def right_padded(draw, pad, batch, length, explicit):
    """Valid `(batch, length)` prompts (NumPy), with an explicit mask or
    the mask `token_ids != pad`."""
    lengths = draw(
        st.lists(st.integers(1, length), min_size=batch, max_size=batch)
    )
    tokens = st.integers(0, VOCAB - 1)
    if not explicit:
        tokens = not_pad(pad)
    size = batch * length
    if explicit:  # padded positions may hold anything, pad ids are tokens
        ids = draw(st.lists(tokens, min_size=size, max_size=size))
        ids = np.array(ids, "int64").reshape(batch, length)
    else:
        ids = np.full((batch, length), pad, "int64")
    rows = []
    for row, n in enumerate(lengths):
        ids[row, :n] = draw(st.lists(tokens, min_size=n, max_size=n))
        rows.append(ids[row, :n].tolist())
    mask = np.arange(length) < np.array(lengths)[:, None]
    return Prompts(rows, ids, mask, length)


@st.composite
def prompts(draw, pad, wrong=(), max_rows=ROWS, max_length=6):
    """Prompts (`token_ids`, and `padding_mask` or None), valid, or wrong
    for the arguments named in `wrong` ("token_ids", "padding_mask")."""
    wrong = set(wrong)
    batch = draw(st.integers(1, max_rows))
    length = draw(st.integers(2 if wrong else 1, max_length))
    explicit = "padding_mask" in wrong or draw(st.booleans())
    p = draw(right_padded(pad, batch, length, explicit))
    ids, mask, row = p.token_ids, p.mask, draw(st.integers(0, batch - 1))
    # Rows of padding only, left padding and length 0 show through the
    # mask: `padding_mask` when given, else `token_ids`.
    through_mask = ["empty row", "left padding", "length 0"]
    if "token_ids" in wrong:
        flaws = ["out of vocabulary", "dtype", "rank", "not an array"]
        flaws += ["batch 0"] + ([] if explicit else through_mask)
        flaws += ["ragged"] if batch > 1 else []
        flaw = draw(st.sampled_from(flaws))
    elif "padding_mask" in wrong:
        flaw = draw(st.sampled_from(through_mask + ["not a mask"]))
    else:
        flaw = None
    if flaw == "empty row":
        mask[row] = False
        ids[row] = ids[row] if explicit else pad
    elif flaw == "left padding":
        mask[row] = np.arange(length) > 0
        if not explicit:
            tokens = st.lists(not_pad(pad), min_size=length, max_size=length)
            ids[row] = [pad] + draw(tokens)[1:]
    elif flaw == "length 0":
        ids, mask, p.length = ids[:, :0], mask[:, :0], 0
    elif flaw == "out of vocabulary":
        ids[row, 0] = draw(st.sampled_from([-1, VOCAB, 2**40, -(2**40)]))
    elif flaw == "dtype":
        ids = ids.astype(draw(st.sampled_from(["float32", "bool", "U3"])))
    elif flaw == "rank":
        ids = draw(st.sampled_from([ids[None], ids[0, 0]]))
    elif flaw == "not an array":
        ids = draw(st.sampled_from([None, "1 2 3", 3.5, {"ids": 1}]))
    elif flaw == "batch 0":
        ids, mask = ids[:0], mask[:0]
    elif flaw == "ragged":
        ids = [r.tolist() for r in ids]
        ids[row] = ids[row][:-1]
    if not wrong:  # any integer dtype and container, one (T,) prompt
        ids = ids.astype(draw(st.sampled_from(["int32", "int64", "uint8"])))
        if batch == 1 and draw(st.booleans()):
            ids, mask, p.unbatched = ids[0], mask[0], True
        kind = draw(st.sampled_from(["numpy", "list", "tensor"]))
        if kind == "list":
            ids = ids.tolist()
        elif kind == "tensor":
            ids = keras.ops.convert_to_tensor(ids)
    p.token_ids = ids
    if explicit:
        p.padding_mask = mask
        if flaw == "not a mask":
            p.padding_mask = draw(
                st.sampled_from(
                    [
                        np.ones(np.shape(mask)[:-1] + (9,), bool),
                        mask.astype("float32"),
                        "all",
                        mask[None],
                    ]
                )
            )
        elif draw(st.booleans()):
            p.padding_mask = mask.astype("int32").tolist()
    p.wrong = wrong
    return p


def max_lengths(length, wrong=False):
    """`max_length` for prompts of `length` tokens: valid, or `wrong`."""
    if wrong:
        bad = [0, -1, POSITIONS + 1, 2**63, 6.0, np.float64(6), "6", True]
        bad += [np.bool_(True), [6]] + ([length - 1] if length > 1 else [])
        return st.sampled_from(bad)
    return st.one_of(
        st.none(), st.integers(max(length, 1), POSITIONS).flatmap(integer)
    )


def stop_ids(wrong=False):
    """`stop_token_ids`: valid, or `wrong`."""
    if wrong:
        bad = [3, "3", (-1,), (VOCAB,), (3.0,), ("3",), {3: 1}, (True,)]
        return st.sampled_from(bad + [(2**40,), np.array([[3]])])
    token = st.integers(0, VOCAB - 1)
    return st.one_of(
        st.none(),
        st.just(()),
        st.tuples(token),
        st.lists(token, min_size=1, max_size=2),
        token.map(lambda t: np.array([t])),
        token.flatmap(integer).map(lambda t: (t,)),
    )


def samplers(wrong=False):
    """`sampler`: valid (by name or object), or `wrong`."""
    if wrong:
        return st.sampled_from([None, "nope", "Greedy", 3, {}])
    return st.sampled_from(["greedy", GREEDY])


def wrong_arguments(names):
    """A non-empty set of argument names."""
    return st.sets(st.sampled_from(sorted(names)), min_size=1)


def names_one_of(message, names):
    """Whether `message` names one of the arguments `names`."""
    return any(re.search(rf"(?<!\w){n}(?!\w)", message) for n in names)


def check_refused(call, wrong):
    """`call()` raises ValueError/TypeError naming one of `wrong`."""
    event(f"refused: {', '.join(sorted(wrong))}")
    with pytest.raises((ValueError, TypeError)) as info:
        call()
    message = str(info.value)
    assert names_one_of(message, wrong), (wrong, message)


# The decoder-only generator.

LM_ARGUMENTS = ("token_ids", "padding_mask", "max_length")
LM_ARGUMENTS += ("stop_token_ids", "sampler")


def lm_generate(data, wrong=()):
    """Draws `generate`'s arguments (wrong for the names in `wrong`) for
    one of the generators; returns `(call, prompts, pad, max_length,
    stop_token_ids, model)`."""
    pad, mask_zero = data.draw(st.sampled_from(LM_VARIANTS))
    p = data.draw(prompts(pad, set(wrong) & {"token_ids", "padding_mask"}))
    max_length = data.draw(max_lengths(p.length, "max_length" in wrong))
    stop = data.draw(stop_ids("stop_token_ids" in wrong))
    sampler = data.draw(samplers("sampler" in wrong))
    generator = lm(pad, mask_zero=mask_zero)

    def call():
        return generator.generate(
            p.token_ids,
            max_length=max_length,
            sampler=sampler,
            stop_token_ids=stop,
            padding_mask=p.padding_mask,
        )

    return call, p, pad, max_length, stop, lm_pieces(mask_zero)[0]


@fewer(1, jax_divisor=8)
@given(data=st.data())
def test_causal_lm_greedy_generation_equals_the_uncached_reference(data):
    call, p, pad, max_length, stop, model = lm_generate(data)
    stops = None if stop is None else [int(t) for t in np.ravel(stop)]
    expected = greedy_reference(
        _predict(model), p.rows, max_length or p.length, stops, pad
    )
    check_equal(call(), expected, p.unbatched)


@given(data=st.data())
def test_causal_lm_generate_names_a_wrong_argument(data):
    wrong = data.draw(wrong_arguments(LM_ARGUMENTS))
    call, *_ = lm_generate(data, wrong)
    check_refused(call, wrong)


@pytest.mark.tf_only("XLA generation: jit_compile is TensorFlow's")
@fewer(2)
@given(data=st.data())
def test_xla_generation_equals_the_uncached_reference(data):
    # One shape, (2, 4) -> (2, 6): the loop compiles once for all draws.
    generator = lm(0, jit_compile=True)
    explicit = data.draw(st.booleans())
    p = data.draw(right_padded(0, 2, 4, explicit))
    padding_mask = p.mask if explicit else None
    out = generator.generate(p.token_ids, 6, padding_mask=padding_mask)
    expected = greedy_reference(_predict(lm_pieces()[0]), p.rows, 6, None, 0)
    check_equal(out, expected, unbatched=False)


BAD_PIECES = {
    "embedding": lambda e, b, h: [None, 3, "embedding"],
    "blocks": lambda e, b, h: [None, [], b[0], [3], "blocks", [h]],
    "head": lambda e, b, h: [None, [], 3, [h, 3]],
    "pad_token_id": lambda e, b, h: (
        [None, "0", -1, VOCAB, 2**40, 1.0] + [True, np.bool_(False)]
    ),
    "jit_compile": lambda e, b, h: ["False", 0, None, 1.0],
}


@fewer(2)
@given(data=st.data())
def test_causal_lm_constructor_takes_or_names_its_arguments(data):
    _, embedding, blocks, head = lm_pieces()
    wrong = data.draw(st.sets(st.sampled_from(sorted(BAD_PIECES))))
    arguments = dict(
        embedding=embedding,
        blocks=blocks,
        head=head,
        pad_token_id=data.draw(st.sampled_from(PADS).flatmap(integer)),
        jit_compile=data.draw(st.sampled_from([False, np.bool_(False)])),
    )
    for name in wrong:
        bad = BAD_PIECES[name](embedding, blocks, head)
        arguments[name] = data.draw(st.sampled_from(bad))
    if wrong:
        check_refused(lambda: CausalLMGenerator(**arguments), wrong)
        return
    generator = CausalLMGenerator(**arguments)
    pad = arguments["pad_token_id"]
    assert type(generator.pad_token_id) is int and generator.pad_token_id == pad
    assert generator.jit_compile is False
    # pad_token_id is used: the prompt is its first token only.
    token = next(t for t in range(1, VOCAB) if t != pad)
    out = generator.generate(np.array([[token, pad, pad]]), max_length=4)
    expected = greedy_reference(
        _predict(lm_pieces()[0]), [[token]], 4, None, int(pad)
    )
    check_equal(out, expected, unbatched=False)


# The encoder-decoder generator.

SEQ2SEQ_ARGUMENTS = ("encoder_token_ids", "token_ids", "padding_mask")
SEQ2SEQ_ARGUMENTS += ("max_length",)


def seq2seq_generate(data, wrong=()):
    """Draws `generate`'s arguments (wrong for the names in `wrong`);
    returns `(call, prompts, sources, max_length)`."""
    _, generator = seq2seq_pieces()
    p = data.draw(
        prompts(0, set(wrong) & {"token_ids", "padding_mask"}, max_length=3)
    )
    batch = len(p.rows)
    source_length = data.draw(st.integers(0, SOURCE_POSITIONS))
    size = batch * source_length
    sources = data.draw(
        st.lists(st.integers(0, VOCAB - 1), min_size=size, max_size=size)
    )
    sources = np.array(sources, "int32").reshape(batch, source_length)
    encoder_ids = sources[0] if p.unbatched else sources
    if "encoder_token_ids" in wrong:
        encoder_ids = data.draw(
            st.sampled_from(
                [
                    sources[None],  # rank 3
                    np.ones((batch + 1, source_length), "int32"),
                    None,
                    "1 2",
                    -np.ones((batch, 2), "int32"),
                    np.ones((batch, 2), "float32"),
                    np.ones((batch, SOURCE_POSITIONS + 1), "int32"),
                ]
            )
        )
    max_length = data.draw(max_lengths(p.length, "max_length" in wrong))

    def call():
        return generator.generate(
            encoder_ids, p.token_ids, max_length, padding_mask=p.padding_mask
        )

    return call, p, sources, max_length


@fewer(2, jax_divisor=8)
@given(data=st.data())
def test_seq2seq_greedy_generation_equals_the_uncached_reference(data):
    call, p, sources, max_length = seq2seq_generate(data)
    model, _ = seq2seq_pieces()
    batch = len(p.rows)

    def logits_of(buffer):
        logits = to_numpy(model([sources, buffer[:batch]]))
        rest = np.zeros((ROWS - batch,) + logits.shape[1:], logits.dtype)
        return np.concatenate([logits, rest])

    expected = greedy_reference(
        logits_of, p.rows, max_length or p.length, None, 0
    )
    check_equal(call(), expected, p.unbatched)


@given(data=st.data())
def test_seq2seq_generate_names_a_wrong_argument(data):
    wrong = data.draw(wrong_arguments(SEQ2SEQ_ARGUMENTS))
    call, *_ = seq2seq_generate(data, wrong)
    # The prompts are `decoder_token_ids` here.
    wrong = {"decoder_token_ids" if n == "token_ids" else n for n in wrong}
    check_refused(call, wrong)
