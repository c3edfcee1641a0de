"""`Seq2SeqAttention` as an extension point: a scorer written by a user
(here a scaled dot-product with a learned temperature) against a NumPy
reference, inside `AttentionRNNDecoder`, and through config and `.keras`."""

import keras
import numpy as np
import pytest
from keras import ops
from references import masked_softmax

import keras_attention
from keras_attention.layers import AttentionRNNDecoder
from keras_attention.layers import BahdanauAttention
from keras_attention.layers import LuongAttention
from keras_attention.layers import Seq2SeqAttention

RNG = np.random.default_rng(11)
Q = RNG.normal(size=(2, 4, 6)).astype("float32")
K = RNG.normal(size=(2, 7, 6)).astype("float32")
V = RNG.normal(size=(2, 7, 5)).astype("float32")
VALUE_MASK = np.array([[1] * 4 + [0] * 3, [1] * 7], bool)
QUERY_MASK = np.array([[1, 1, 1, 0], [1] * 4], bool)


@keras.saving.register_keras_serializable(package="test_seq2seq")
class ScaledDot(Seq2SeqAttention):
    """score(q_i, k_j) = t * q_i . k_j / sqrt(d), `t` a learned scalar."""

    def __init__(self, temperature=1.0, **kwargs):
        super().__init__(**kwargs)
        self.temperature = temperature

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        self.scale = self.add_weight(
            name="scale",
            shape=(),
            initializer=keras.initializers.Constant(self.temperature),
        )

    def prepare_memory(self, value, key=None):
        key = value if key is None else key
        return ops.cast(key, "float32")  # b j d

    def attend(
        self,
        query,
        memory,
        value,
        value_mask=None,
        query_mask=None,
        training=None,
        **kwargs,
    ):
        query = ops.cast(query, "float32") / np.sqrt(query.shape[-1])
        scores = ops.einsum("bid,bjd->bij", query, memory) * self.scale
        return self.apply_scores(
            scores, value, value_mask, query_mask, training
        )

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature}


def reference(query, key, value, value_mask, query_mask, temperature):
    scores = temperature * np.einsum("bid,bjd->bij", query, key)
    scores /= np.sqrt(query.shape[-1])
    weights = masked_softmax(
        scores, value_mask[:, None, :] & query_mask[:, :, None]
    )
    return weights @ value, weights


def np_(x):
    return ops.convert_to_numpy(x)


def test_is_the_public_registered_base():
    assert keras_attention.layers.Seq2SeqAttention is Seq2SeqAttention
    assert issubclass(BahdanauAttention, Seq2SeqAttention)
    assert issubclass(LuongAttention, Seq2SeqAttention)
    get_name = keras.saving.get_registered_name
    assert get_name(Seq2SeqAttention) == "keras_attention>Seq2SeqAttention"
    # The subclasses keep their registered names (saved files load).
    assert get_name(BahdanauAttention) == "keras_attention>BahdanauAttention"
    assert get_name(LuongAttention) == "keras_attention>LuongAttention"


def test_user_subclass_matches_reference_under_masks():
    layer = ScaledDot(temperature=0.7)
    context, weights = layer(
        Q,
        V,
        key=K,
        query_mask=QUERY_MASK,
        value_mask=VALUE_MASK,
        return_attention_scores=True,
    )
    want_c, want_w = reference(Q, K, V, VALUE_MASK, QUERY_MASK, 0.7)
    np.testing.assert_allclose(np_(weights), want_w, atol=1e-5)
    np.testing.assert_allclose(np_(context), want_c, atol=1e-5)
    # The padded query: zero weights and a zero context, no NaN.
    assert np.all(np_(weights)[0, 3] == 0) and np.all(np_(context)[0, 3] == 0)
    # One decoder step `(batch, dq)` with a `(batch,)` mask.
    context, weights = layer(
        Q[:, 1],
        V,
        key=K,
        value_mask=VALUE_MASK,
        return_attention_scores=True,
    )
    np.testing.assert_allclose(np_(weights), want_w[:, 1], atol=1e-5)
    np.testing.assert_allclose(np_(context), want_c[:, 1], atol=1e-5)
    assert tuple(layer(Q[:, 1], V, key=K).shape) == (2, 5)


def test_user_subclass_reads_keras_masks():
    ids = np.array([[3, 1, 4, 0, 0, 0, 0], [5, 9, 2, 6, 5, 3, 5]])
    value = keras.layers.Embedding(10, 6, mask_zero=True)(ids)
    layer = ScaledDot()
    got = layer(Q, value, return_attention_scores=True)[1]
    value_mask = ids > 0
    want = reference(
        Q, np_(value), np_(value), value_mask, np.ones((2, 4), bool), 1.0
    )[1]
    np.testing.assert_allclose(np_(got), want, atol=1e-5)


def test_user_subclass_dropout_is_handled_by_the_base():
    layer = ScaledDot(dropout=0.5, seed=1)
    context, weights = layer(Q, V, key=K, return_attention_scores=True)
    want_c, want_w = reference(
        Q, K, V, np.ones((2, 7), bool), np.ones((2, 4), bool), 1.0
    )
    np.testing.assert_allclose(np_(context), want_c, atol=1e-5)  # inference
    context, weights = layer(
        Q, V, key=K, return_attention_scores=True, training=True
    )
    np.testing.assert_allclose(np_(weights), want_w, atol=1e-5)
    assert not np.allclose(np_(context), want_c, atol=1e-3)


@pytest.mark.parametrize("style", ["bahdanau", "luong"])
def test_user_subclass_in_the_decoder(style):
    # The decoder's queries are its states (units = 5 = the memory size,
    # which a dot-product scorer needs).
    decoder = AttentionRNNDecoder(
        5,
        ScaledDot(temperature=0.5),
        attention_style=style,
        return_attention_scores=True,
    )
    targets = RNG.normal(size=(2, 4, 3)).astype("float32")
    outputs, history = decoder(targets, V, memory_mask=VALUE_MASK)
    assert tuple(outputs.shape) == (2, 4, 5)
    history = np_(history)
    np.testing.assert_allclose(history.sum(-1), 1.0, atol=1e-5)
    assert np.all(history[0, :, 4:] == 0)  # masked source steps
    # Step by step (memory prepared once) gives the teacher-forced run.
    states = decoder.get_initial_state(2)
    prepared = decoder.prepare_memory(V)
    for t in range(4):
        out, states, weights = decoder.step(
            targets[:, t],
            states,
            V,
            memory_mask=VALUE_MASK,
            step_index=t,
            prepared_memory=prepared,
        )
        np.testing.assert_allclose(np_(out), np_(outputs)[:, t], atol=1e-5)
        np.testing.assert_allclose(np_(weights), history[:, t], atol=1e-5)


def test_user_subclass_config_and_keras_file(tmp_path):
    layer = ScaledDot(temperature=0.3, dropout=0.1, seed=4, name="scorer")
    config = layer.get_config()
    revived = ScaledDot.from_config(config)
    assert revived.get_config() == config
    assert config["temperature"] == 0.3 and config["dropout"] == 0.1

    targets = keras.Input((None, 3))
    memory = keras.Input((7, 5))
    outputs = AttentionRNNDecoder(5, ScaledDot(temperature=0.3))(
        targets, memory
    )
    model = keras.Model([targets, memory], outputs)
    model.layers[-1].attention.scale.assign(0.8)
    y = RNG.normal(size=(2, 4, 3)).astype("float32")
    want = np_(model([y, V]))
    path = str(tmp_path / "decoder.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    attention = loaded.layers[-1].attention
    assert type(attention) is ScaledDot and attention.temperature == 0.3
    np.testing.assert_allclose(float(np_(attention.scale)), 0.8, rtol=1e-6)
    np.testing.assert_allclose(np_(loaded([y, V])), want, atol=1e-5)


class OnlyMemory(Seq2SeqAttention):
    def prepare_memory(self, value, key=None):
        return key


def test_hooks_not_implemented_raise_a_clear_error():
    with pytest.raises(NotImplementedError, match=r"Seq2SeqAttention.*"):
        Seq2SeqAttention()(Q, V)
    with pytest.raises(NotImplementedError, match=r"prepare_memory\(value"):
        Seq2SeqAttention()(Q, V)
    with pytest.raises(NotImplementedError, match=r"OnlyMemory.*attend\("):
        OnlyMemory()(Q, V)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="dropout=1.5"):
        ScaledDot(dropout=1.5)
    with pytest.raises(
        ValueError, match=r"`query`.*query_shape=\(2, 4, 6, 1\)"
    ):
        ScaledDot().build((2, 4, 6, 1), (2, 7, 5))
    with pytest.raises(ValueError, match=r"query_shape=\(2, 4, None\)"):
        ScaledDot().build((2, 4, None), (2, 7, 5))
    with pytest.raises(ValueError, match=r"`value`.*value_shape=\(2, 7\)"):
        ScaledDot().build((2, 4, 6), (2, 7))
    with pytest.raises(ValueError, match=r"`key`.*key_shape=\(2, 7\)"):
        ScaledDot().build((2, 4, 6), (2, 7, 5), (2, 7))
    with pytest.raises(ValueError, match="same number of steps"):
        ScaledDot()(Q, V, key=K[:, :3])
    with pytest.raises(ValueError, match=r"value_mask.*\(2, 7, 5\)"):
        ScaledDot()(Q, V, key=K, value_mask=VALUE_MASK[:, :5])
    with pytest.raises(ValueError, match=r"query_mask.*one-step"):
        ScaledDot()(Q[:, 0], V, key=K, query_mask=QUERY_MASK)


# Hooks that break their contract (issue 23, item 9): the base class checks
# what `attend` and `prepare_memory` return and names the hook and rule.


class ShortContext(ScaledDot):
    """`attend` drops the last query: a context of the wrong length."""

    def attend(self, query, memory, value, **kwargs):
        context, weights = super().attend(query, memory, value, **kwargs)
        return context[:, :-1], weights


class BareContext(ScaledDot):
    """`attend` returns the context alone, not `(context, weights)`."""

    def attend(self, query, memory, value, **kwargs):
        return super().attend(query, memory, value, **kwargs)[0]


class WideWeights(ScaledDot):
    """`attend` returns weights over one source step too many."""

    def attend(self, query, memory, value, **kwargs):
        context, weights = super().attend(query, memory, value, **kwargs)
        return context, ops.pad(weights, [[0, 0], [0, 0], [0, 1]])


class NoMemory(ScaledDot):
    """`prepare_memory` forgets to return."""

    def prepare_memory(self, value, key=None):
        super().prepare_memory(value, key)


def test_attend_with_a_context_of_the_wrong_length_is_refused():
    # Was passed through: (2, 3, 5) where compute_output_spec said (2, 4, 5).
    with pytest.raises(
        ValueError,
        match=r"ShortContext\.attend` returned context .*\(2, 3, 5\).*"
        r"\(batch, Tq, dv\) = \(2, 4, 5\)",
    ):
        ShortContext()(Q, V, key=K)


def test_attend_returning_a_bare_tensor_is_refused():
    # Was unpacked along the batch axis: a (2, 4, 6) query gave (4, 5).
    with pytest.raises(
        TypeError,
        match=r"BareContext\.attend` must return a pair `\(context, "
        r"weights\)`.*returned a .* of shape \(2, 4, 5\)",
    ):
        BareContext()(Q, V, key=K)
    with pytest.raises(TypeError, match=r"BareContext\.attend"):
        BareContext()(Q[:, 0], V, key=K, return_attention_scores=True)


def test_attend_returning_weights_of_the_wrong_shape_is_refused():
    with pytest.raises(
        ValueError,
        match=r"WideWeights\.attend` returned weights .*\(2, 4, 8\).*"
        r"\(batch, Tq, Tv\) = \(2, 4, 7\)",
    ):
        WideWeights()(Q, V, key=K, return_attention_scores=True)
    # Weights that are not returned are not checked.
    assert tuple(WideWeights()(Q, V, key=K).shape) == (2, 4, 5)


def test_prepare_memory_returning_none_is_refused():
    with pytest.raises(TypeError, match=r"NoMemory\.prepare_memory` returned"):
        NoMemory()(Q, V, key=K)


def test_the_decoder_checks_the_hooks_too():
    targets = RNG.normal(size=(2, 4, 3)).astype("float32")
    with pytest.raises(TypeError, match=r"BareContext\.attend"):
        AttentionRNNDecoder(5, BareContext())(targets, V)
    decoder = AttentionRNNDecoder(
        5, ShortContext(), return_attention_scores=True
    )
    with pytest.raises(ValueError, match=r"ShortContext\.attend` returned"):
        decoder(targets, V)
    with pytest.raises(TypeError, match=r"NoMemory\.prepare_memory"):
        AttentionRNNDecoder(5, NoMemory())(targets, V)
