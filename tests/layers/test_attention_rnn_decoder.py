import keras
import numpy as np
import pytest
from harness import run_layer_test
from harness import run_mask_test
from keras import ops

from keras_attention.layers import AttentionRNNDecoder
from keras_attention.layers import BahdanauAttention
from keras_attention.layers import CausalSelfAttention
from keras_attention.layers import CrossAttention
from keras_attention.layers import EncoderBridge
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import LuongAttention
from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import SelfAttention

RNG = np.random.default_rng(5)
Y = RNG.normal(size=(2, 5, 4)).astype("float32")  # embedded targets
M = RNG.normal(size=(2, 7, 6)).astype("float32")  # encoder states
S0 = RNG.normal(size=(2, 8)).astype("float32") * 0.5
Y_MASK = np.array([[1, 1, 1, 0, 0], [1] * 5], bool)
M_MASK = np.array([[1] * 4 + [0] * 3, [1] * 7], bool)


def np_(x):
    return ops.convert_to_numpy(x)


def make(style, cell, attention=None, **kwargs):
    if attention is None:
        attention = (
            BahdanauAttention(6)
            if style == "bahdanau"
            else LuongAttention("general", alignment="local-m", window=2)
        )
    return AttentionRNNDecoder(
        8, attention, cell=cell, attention_style=style, **kwargs
    )


def test_harness_bahdanau_gru():
    run_layer_test(
        AttentionRNNDecoder,
        dict(
            units=8,
            attention=BahdanauAttention(6),
            return_attention_scores=True,
        ),
        dict(inputs=Y, memory=M, initial_state=S0),
        expected_output_shape=((2, 5, 8), (2, 5, 7)),
        expected_num_trainable_weights=3 + 4,  # GRU cell + attention
    )


def test_harness_luong_lstm():
    run_layer_test(
        AttentionRNNDecoder,
        dict(
            units=8,
            attention=LuongAttention(
                "concat", units=5, alignment="local-p", window=2
            ),
            cell="lstm",
            attention_style="luong",
            return_state=True,
        ),
        dict(inputs=Y, memory=M),
        expected_output_shape=((2, 5, 8), (2, 8), (2, 8), (2, 8)),
        expected_num_trainable_weights=3 + 4 + 1,  # LSTM + attention + W_c
    )


def test_masks():
    run_mask_test(
        AttentionRNNDecoder,
        dict(units=8, attention=BahdanauAttention(6)),
        ("inputs", "memory"),
        ("mask", "memory_mask"),
    )


@pytest.mark.parametrize("style", ["bahdanau", "luong"])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_step_by_step_equals_teacher_forcing(style, cell):
    decoder = make(style, cell, return_attention_scores=True, return_state=True)
    initial = [S0] if cell == "gru" else [S0, -S0]
    outputs, alignment, *final = decoder(
        Y, M, initial_state=initial, mask=Y_MASK, memory_mask=M_MASK
    )
    states = decoder.get_initial_state(2, initial)
    prepared = decoder.prepare_memory(M)
    for t in range(Y.shape[1]):
        out, states, weights = decoder.step(
            Y[:, t],
            states,
            M,
            memory_mask=M_MASK,
            step_index=t,
            prepared_memory=prepared,
        )
        valid = Y_MASK[:, t]
        np.testing.assert_allclose(
            np_(out)[valid], np_(outputs)[valid, t], atol=1e-5
        )
        np.testing.assert_allclose(
            np_(weights)[valid], np_(alignment)[valid, t], atol=1e-5
        )
        # Padded target steps output zeros and have no alignment.
        assert np.all(np_(outputs)[~valid, t] == 0)
        assert np.all(np_(alignment)[~valid, t] == 0)
        if t == 2:  # example 0's last real step: its final state
            for f, s in zip(final, states):
                np.testing.assert_allclose(np_(f)[0], np_(s)[0], atol=1e-5)
    for f, s in zip(final, states):
        np.testing.assert_allclose(np_(f)[1], np_(s)[1], atol=1e-5)


def test_bahdanau_style_reference():
    # c_t = a(s_{t-1}, h);  s_t = GRU(s_{t-1}, [y_t; c_t])
    decoder = make("bahdanau", "gru")
    out = np_(decoder(Y, M, initial_state=S0, memory_mask=M_MASK))
    s = S0
    for t in range(Y.shape[1]):
        c = decoder.attention(s, M, value_mask=M_MASK)
        s, _ = decoder.rnn_cell(np.concatenate([Y[:, t], np_(c)], -1), [s])
        s = np_(s)
        np.testing.assert_allclose(out[:, t], s, atol=1e-5)


@pytest.mark.parametrize("input_feeding", [True, False])
def test_luong_style_reference(input_feeding):
    # h_t = LSTM(h_{t-1}, [y_t; h~_{t-1}]);  h~_t = tanh(W_c [c_t; h_t])
    decoder = make(
        "luong",
        "lstm",
        attention=LuongAttention("dot"),
        input_feeding=input_feeding,
    )
    out = np_(
        decoder(Y, np.concatenate([M, M[..., :2]], -1), memory_mask=M_MASK)
    )
    memory = np.concatenate([M, M[..., :2]], -1)
    states = [np.zeros((2, 8), "float32")] * 2
    feed = np.zeros((2, 8), "float32")
    w_c = np_(decoder.attentional_dense.kernel)
    for t in range(Y.shape[1]):
        x = np.concatenate([Y[:, t], feed], -1) if input_feeding else Y[:, t]
        h, states = decoder.rnn_cell(x, states)
        h = np_(h)
        c = np_(decoder.attention(h, memory, value_mask=M_MASK))
        feed = np.tanh(np.concatenate([c, h], -1) @ w_c)
        np.testing.assert_allclose(out[:, t], feed, atol=1e-5)


def test_cross_attention_and_fully_padded_source():
    decoder = AttentionRNNDecoder(
        8, CrossAttention(2, 4), return_attention_scores=True
    )
    mask = M_MASK.copy()
    mask[0] = False
    out, alignment = decoder(Y, M, memory_mask=mask)
    assert np.all(np.isfinite(np_(out)))
    assert np.all(np_(alignment)[0] == 0)
    np.testing.assert_allclose(np_(alignment)[1].sum(-1), 1.0, atol=1e-5)
    states = decoder.get_initial_state(2)
    step_out, states, weights = decoder.step(
        Y[:, 0], states, M, memory_mask=mask
    )
    np.testing.assert_allclose(np_(step_out), np_(out)[:, 0], atol=1e-5)
    for style in ("bahdanau", "luong"):
        out = make(style, "gru")(Y, M, memory_mask=mask)
        assert np.all(np.isfinite(np_(out)))


@pytest.mark.tf_only
def test_tf_function_xla_variable_lengths():
    import tensorflow as tf

    decoder = make("luong", "gru", return_attention_scores=True)
    fn = tf.function(
        lambda y, m: decoder(y, m), jit_compile=True, reduce_retracing=True
    )
    for steps, source in ((5, 7), (3, 4)):
        y, m = Y[:, :steps], M[:, :source]
        for a, b in zip(fn(y, m), decoder(y, m)):
            np.testing.assert_allclose(np_(a), np_(b), atol=1e-5)


def test_seq2seq_fit_and_greedy_decoding():
    """The README model: BiGRU encoder + bridge + Bahdanau decoder."""
    vocab, emb, units = 12, 8, 16
    src = keras.Input((None,), dtype="int32")
    tgt = keras.Input((None,), dtype="int32")
    src_embedding = keras.layers.Embedding(vocab, emb, mask_zero=True)
    tgt_embedding = keras.layers.Embedding(vocab, emb, mask_zero=True)
    memory, fh, bh = keras.layers.Bidirectional(
        keras.layers.GRU(units, return_sequences=True, return_state=True)
    )(src_embedding(src))
    s0 = EncoderBridge(units)(fh, bh)
    decoder = AttentionRNNDecoder(units, BahdanauAttention(units))
    hidden = decoder(tgt_embedding(tgt), memory, initial_state=s0)
    logits = keras.layers.Dense(vocab)(hidden)
    model = keras.Model([src, tgt], logits)
    model.compile(
        "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    x = RNG.integers(3, vocab, size=(16, 6)).astype("int32")  # copy task
    x[:4, 4:] = 0
    y_in = np.concatenate(
        [np.ones((16, 1), "int32"), x[:, :-1]], 1
    )  # 1 = <start>
    history = model.fit([x, y_in], x, epochs=2, batch_size=8, verbose=0)
    assert np.isfinite(history.history["loss"][-1])

    # Greedy decoding with the trained weights, one step at a time.
    encoder = keras.Model(src, [memory, s0])
    mem, state = encoder(x[:2])
    mem_mask = x[:2] != 0
    states = decoder.get_initial_state(2, state)
    token = np.ones((2,), "int32")
    step_logits = []
    for t in range(6):
        out, states, _ = decoder.step(
            tgt_embedding(token),
            states,
            mem,
            memory_mask=mem_mask,
            step_index=t,
        )
        step_logits.append(np_(model.layers[-1](out)))
        token = np.argmax(step_logits[-1], -1).astype("int32")
    # Feeding the greedy tokens back through teacher forcing agrees.
    tokens = np.argmax(np.stack(step_logits, 1), -1)
    forced_in = np.concatenate([np.ones((2, 1), "int32"), tokens[:, :-1]], 1)
    forced = np_(model([x[:2], forced_in]))
    np.testing.assert_allclose(np.stack(step_logits, 1), forced, atol=1e-4)


def test_errors():
    with pytest.raises(ValueError, match="units=0"):
        AttentionRNNDecoder(0, BahdanauAttention(4))
    with pytest.raises(ValueError, match="attention="):
        AttentionRNNDecoder(8, "bahdanau")
    with pytest.raises(ValueError, match="cell='rnn'"):
        AttentionRNNDecoder(8, BahdanauAttention(4), cell="rnn")
    with pytest.raises(ValueError, match="cell="):
        AttentionRNNDecoder(8, BahdanauAttention(4), cell=keras.layers.Dense(3))
    with pytest.raises(ValueError, match="attention_style='transformer'"):
        AttentionRNNDecoder(
            8, BahdanauAttention(4), attention_style="transformer"
        )
    with pytest.raises(ValueError, match="dropout=2"):
        AttentionRNNDecoder(8, BahdanauAttention(4), dropout=2)
    with pytest.raises(ValueError, match="inputs_shape"):
        AttentionRNNDecoder(8, BahdanauAttention(4))(Y[:, 0], M)
    with pytest.raises(ValueError, match="memory_shape"):
        AttentionRNNDecoder(8, BahdanauAttention(4))(Y, M[:, 0])


@pytest.mark.parametrize(
    "attention",
    [
        SelfAttention(2, 4),
        CausalSelfAttention(2, 4),
        LocalSelfAttention(2, 4, window_size=2),
        keras.layers.Dense(4),
    ],
)
def test_self_attention_is_refused_at_construction(attention):
    # Defect 4: accepted, then a TypeError from deep inside at call.
    with pytest.raises(
        ValueError, match=r"CrossAttention.*Received: attention=<"
    ):
        AttentionRNNDecoder(8, attention)


@pytest.mark.parametrize("style", ["bahdanau", "luong"])
def test_multi_head_attention_as_the_attention(style):
    # Defect 4: `MultiHeadAttention` was accepted, then failed at call
    # (`context_mask`). It attends over the memory like CrossAttention.
    decoder = AttentionRNNDecoder(
        8,
        MultiHeadAttention(2, 4),
        attention_style=style,
        return_attention_scores=True,
    )
    out, alignment = decoder(Y, M, initial_state=S0, memory_mask=M_MASK)
    out, alignment = np_(out), np_(alignment)
    # Reference: the same layers, one step at a time by hand.
    mha, cell = decoder.attention, decoder.rnn_cell
    s, feed = S0, None
    for t in range(Y.shape[1]):
        if (
            style == "bahdanau"
        ):  # c_t = a(s_{t-1}, h);  s_t = f(s_{t-1}, [y_t; c_t])
            c, scores = mha(
                s[:, None], M, value_mask=M_MASK, return_attention_scores=True
            )
            s, _ = cell(np.concatenate([Y[:, t], np_(c)[:, 0]], -1), [s])
            s = expected = np_(s)
        else:  # h_t = f(h_{t-1}, [y_t; h~_{t-1}]);  h~_t = tanh(W_c [c_t; h_t])
            feed = np.zeros((2, 8), "float32") if feed is None else feed
            s, _ = cell(np.concatenate([Y[:, t], feed], -1), [s])
            s = np_(s)
            c, scores = mha(
                s[:, None], M, value_mask=M_MASK, return_attention_scores=True
            )
            w_c = np_(decoder.attentional_dense.kernel)
            feed = expected = np.tanh(
                np.concatenate([np_(c)[:, 0], s], -1) @ w_c
            )
        np.testing.assert_allclose(out[:, t], expected, atol=1e-5)
        np.testing.assert_allclose(
            alignment[:, t], np_(scores)[:, :, 0].mean(1), atol=1e-6
        )
    assert np.all(
        alignment[~np.broadcast_to(M_MASK[:, None], alignment.shape)] == 0
    )
    states = decoder.get_initial_state(2, S0)
    step_out, _, _ = decoder.step(Y[:, 0], states, M, memory_mask=M_MASK)
    np.testing.assert_allclose(np_(step_out), out[:, 0], atol=1e-5)


def test_cell_and_units_must_agree_at_construction():
    # Defect 8: accepted, then failed naming an internal layer.
    with pytest.raises(
        ValueError, match=r"units=8.*cell=<GRUCell.*output size 5"
    ):
        AttentionRNNDecoder(
            8, BahdanauAttention(4), cell=keras.layers.GRUCell(5)
        )
    with pytest.raises(ValueError, match=r"units=8.*cell=<LSTMCell"):
        AttentionRNNDecoder(
            8,
            LuongAttention("dot"),
            attention_style="luong",
            cell=keras.layers.LSTMCell(6),
        )
    decoder = AttentionRNNDecoder(
        8, BahdanauAttention(4), cell=keras.layers.LSTMCell(8)
    )
    assert tuple(decoder(Y, M).shape) == (2, 5, 8)


def test_string_flags_are_refused():
    # Defect 8: "False" from a CLI or YAML was taken as True.
    for flag in ("input_feeding", "return_attention_scores", "return_state"):
        with pytest.raises(ValueError, match=f"{flag}='False'"):
            AttentionRNNDecoder(8, BahdanauAttention(4), **{flag: "False"})


def test_wrongly_sized_masks_name_the_argument():
    # Defect 8: these ended in opaque broadcasting errors inside the loop.
    decoder = make("bahdanau", "gru")
    with pytest.raises(ValueError, match=r"`mask`.*\(2, 5, 4\).*\(2, 4\)"):
        decoder(Y, M, mask=Y_MASK[:, :4])
    with pytest.raises(ValueError, match=r"memory_mask.*\(2, 7, 6\).*\(2, 6\)"):
        decoder(Y, M, memory_mask=M_MASK[:, :6])
    states = decoder.get_initial_state(2)
    with pytest.raises(ValueError, match=r"memory_mask.*\(2, 7, 6\).*\(2, 6\)"):
        decoder.step(Y[:, 0], states, M, memory_mask=M_MASK[:, :6])


def test_keras_mask_of_the_targets_is_read():
    # With two tensor arguments Keras fills `memory_mask` but not `mask`:
    # the target's own Keras mask must still be honoured (eager and
    # functional), padded steps output zeros.
    ids = np.array([[3, 4, 5, 0, 0], [1, 2, 3, 4, 5]], "int32")
    embedding = keras.layers.Embedding(8, 4, mask_zero=True)
    decoder = make("luong", "gru")
    explicit = np_(decoder(np_(embedding(ids)), M, mask=ids != 0))
    assert np.all(explicit[0, 3:] == 0) and np.all(explicit[0, :3] != 0)
    np.testing.assert_allclose(
        np_(decoder(embedding(ids), M)), explicit, atol=1e-6
    )
    tokens = keras.Input((None,), dtype="int32")
    memory = keras.Input((None, 6))
    model = keras.Model([tokens, memory], decoder(embedding(tokens), memory))
    np.testing.assert_allclose(np_(model([ids, M])), explicit, atol=1e-6)


def test_keras_hub_samplers_drive_step():
    """The README's migration example: `BeamSearchDecoder` -> a keras_hub
    sampler over `step`, the states, memory and mask as its cache."""
    keras_hub = pytest.importorskip("keras_hub")
    vocab = 9
    embedding = keras.layers.Embedding(vocab, 4)
    decoder = make("bahdanau", "gru")
    head = keras.layers.Dense(vocab)
    head(decoder(embedding(np.ones((2, 1), "int32")), M))  # build
    cache = (tuple(decoder.get_initial_state(2, S0)), M, M_MASK)

    def next(prompt, cache, index):
        states, mem, mem_mask = cache
        out, states, _ = decoder.step(
            embedding(prompt[:, index - 1]),
            list(states),
            mem,
            memory_mask=mem_mask,
            step_index=index - 1,
        )
        return head(out), None, (tuple(states), mem, mem_mask)

    prompt = np.zeros((2, 6), "int32")
    prompt[:, 0] = 1
    greedy = np_(
        keras_hub.samplers.GreedySampler()(next, prompt, cache=cache, index=1)
    )
    # Reference: argmax decoding by hand.
    states, token, expected = (
        decoder.get_initial_state(2, S0),
        prompt[:, 0],
        [prompt[:, 0]],
    )
    for t in range(5):
        out, states, _ = decoder.step(
            embedding(token), states, M, memory_mask=M_MASK, step_index=t
        )
        token = np.argmax(np_(head(out)), -1).astype("int32")
        expected.append(token)
    np.testing.assert_array_equal(greedy, np.stack(expected, 1))
    beams = keras_hub.samplers.BeamSampler(num_beams=3, return_all_beams=True)
    tokens, log_probs = beams(next, prompt, cache=cache, index=1)
    assert tuple(tokens.shape) == (2, 3, 6) and np.all(
        np_(tokens)[:, :, 0] == 1
    )
    assert np.all(np.diff(np_(log_probs), axis=-1) <= 1e-6)  # best beam first


def test_attention_built_for_other_queries_is_refused():
    attention = BahdanauAttention(4)
    attention(np.ones((2, 5), "float32"), M)  # built for queries of size 5
    with pytest.raises(ValueError, match=r"queries of size 5.*units=8"):
        AttentionRNNDecoder(8, attention)(Y, M)
    mha = MultiHeadAttention(2, 4)
    mha(np.ones((2, 1, 5), "float32"), M)
    with pytest.raises(ValueError, match=r"queries of size 5.*units=8"):
        AttentionRNNDecoder(8, mha)(Y, M)
