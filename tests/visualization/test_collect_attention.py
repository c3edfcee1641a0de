"""collect_attention: every attention layer's weights, checked against
NumPy references (tests/references.py) under padding, causal and window
masks, for functional, Sequential, subclassed and reloaded models."""

import inspect
import re

import keras
import numpy as np
import pytest
import references
from keras import ops

from keras_attention import blocks
from keras_attention import layers
from keras_attention.visualization import AttentionMaps
from keras_attention.visualization import AttentionRecording
from keras_attention.visualization import collect
from keras_attention.visualization import collect_attention

ATOL = 2e-5
RNG = np.random.default_rng(0)
# b t: target ids (0 = padding) and source ids.
IDS = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 2]], "int32")
SRC = np.array([[1, 2, 3, 4, 0, 0], [5, 6, 7, 8, 9, 1]], "int32")
VALID = IDS > 0
SRC_VALID = SRC > 0


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def pair_mask(query_valid, key_valid):
    """(b, 1, i, j): real queries on real keys."""
    return (query_valid[:, :, None] & key_valid[:, None, :])[:, None]


def causal(t):
    return np.tril(np.ones((t, t), bool))


def embed(name, vocab=12, dim=8):
    return keras.layers.Embedding(vocab, dim, mask_zero=True, name=name)


def mha_model():
    """Every MHA-family layer reading the same embeddings."""
    ids = keras.Input((None,), dtype="int32", name="ids")
    src = keras.Input((None,), dtype="int32", name="src")
    x, ctx = embed("target_embedding")(ids), embed("source_embedding")(src)
    outputs = [
        layers.SelfAttention(2, 4, name="self")(x),
        layers.CausalSelfAttention(2, 4, name="causal")(x),
        layers.MultiHeadAttention(2, 4, name="mha_self")(x, x),
        layers.MultiHeadAttention(3, 4, name="mha_cross")(x, ctx),
        layers.CrossAttention(2, 4, name="cross")(x, ctx),
        layers.LocalSelfAttention(2, 4, window_size=1, name="local")(x),
    ]
    y = keras.layers.Concatenate()(outputs)
    return keras.Model([ids, src], keras.layers.Dense(1)(y))


@pytest.fixture(scope="module")
def mha():
    model = mha_model()
    return model, collect_attention(model, [IDS, SRC])


def test_mha_family_against_references(mha):
    model, maps = mha
    x = np_(model.get_layer("target_embedding")(IDS))
    ctx = np_(model.get_layer("source_embedding")(SRC))
    self_mask = pair_mask(VALID, VALID)
    band = np.abs(np.subtract.outer(np.arange(5), np.arange(5))) <= 1
    expected = {
        "self": (x, x, self_mask),
        "causal": (x, x, self_mask & causal(5)),
        "mha_self": (x, x, self_mask),
        "mha_cross": (x, ctx, pair_mask(VALID, SRC_VALID)),
        "cross": (x, ctx, pair_mask(VALID, SRC_VALID)),
        "local": (x, x, self_mask & band),
    }
    assert list(maps) == list(expected)
    assert isinstance(maps, AttentionMaps)
    for name, (query, value, mask) in expected.items():
        layer = model.get_layer(name)
        _, want = references.multi_head_attention(
            layer, query, value, mask=mask
        )
        got = maps[name]
        assert got.dtype == np.float32
        assert got.shape == want.shape, name
        np.testing.assert_allclose(got, want, atol=ATOL, err_msg=name)
        # Padded keys and padded queries get exactly 0.
        assert np.all(got[~np.broadcast_to(mask, got.shape)] == 0), name


def test_mha_family_metadata(mha):
    _, maps = mha
    meta = maps.metadata
    kinds = {name: m["kind"] for name, m in meta.items()}
    assert kinds == {
        "self": "self",
        "causal": "self",
        "mha_self": "self",
        "mha_cross": "cross",
        "cross": "cross",
        "local": "self",
    }
    # With cross entries, the causal self-attention is the target's.
    assert meta["causal"]["query_tokens"] == "target_tokens"
    assert meta["causal"]["causal"] is True
    assert (meta["self"]["query_tokens"], meta["self"]["key_tokens"]) == (
        "tokens",
        "tokens",
    )
    assert (meta["cross"]["query_tokens"], meta["cross"]["key_tokens"]) == (
        "target_tokens",
        "tokens",
    )
    assert meta["local"]["window"] == (1, 1)
    assert meta["mha_cross"]["num_heads"] == 3
    assert meta["cross"]["query_length"] == 5
    assert meta["cross"]["key_length"] == 6
    np.testing.assert_array_equal(meta["cross"]["query_mask"], VALID)
    np.testing.assert_array_equal(meta["cross"]["key_mask"], SRC_VALID)
    np.testing.assert_array_equal(meta["mha_cross"]["key_mask"], SRC_VALID)
    assert all(m["call_index"] == 0 for m in meta.values())


def test_model_is_left_unchanged(mha):
    model, _ = mha
    for layer in model.layers:
        assert "call" not in vars(layer)
    before = np_(model([IDS, SRC]))
    collect_attention(model, [IDS, SRC])
    np.testing.assert_allclose(np_(model([IDS, SRC])), before, atol=1e-6)


def test_reloaded_keras_file(mha, tmp_path):
    model, maps = mha
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    again = collect_attention(loaded, [IDS, SRC])
    assert list(again) == list(maps)
    for name in maps:
        np.testing.assert_allclose(again[name], maps[name], atol=1e-6)


def test_layers_selection_and_errors(mha):
    model, _ = mha
    maps = collect_attention(model, [IDS, SRC], layers=["cross", "local"])
    assert list(maps) == ["cross", "local"]
    with pytest.raises(ValueError, match="'nope'.*'mha_self'"):
        collect_attention(model, [IDS, SRC], layers="nope")
    with pytest.raises(ValueError, match="max_dense_length=4"):
        collect_attention(model, [IDS, SRC], max_dense_length=4)
    with pytest.raises(ValueError, match="max_dense_length=0"):
        collect_attention(model, [IDS, SRC], max_dense_length=0)


class Seq2SeqTransformer(keras.Model):
    """A subclassed encoder-decoder of transformer blocks."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.source_embedding = embed("source_embedding")
        self.target_embedding = embed("target_embedding")
        self.encoder = blocks.TransformerEncoderBlock(2, 16, name="encoder")
        self.decoder = blocks.TransformerDecoderBlock(2, 16, name="decoder")

    def call(self, inputs):
        src, ids = inputs
        context = self.encoder(self.source_embedding(src))
        return self.decoder(self.target_embedding(ids), context)


def test_transformer_blocks_in_a_subclassed_model():
    model = Seq2SeqTransformer()
    maps = collect_attention(model, (SRC, IDS))
    assert list(maps) == [
        "encoder/self_attention",
        "decoder/self_attention",
        "decoder/cross_attention",
    ]
    enc, dec = model.encoder, model.decoder
    src_x = np_(model.source_embedding(SRC))
    x = np_(model.target_embedding(IDS))
    src_mask = pair_mask(SRC_VALID, SRC_VALID)
    _, w = references.multi_head_attention(
        enc.self_attention, src_x, src_x, mask=src_mask
    )
    np.testing.assert_allclose(maps["encoder/self_attention"], w, atol=ATOL)
    context = references.encoder_block(enc, src_x, src_mask)
    self_mask = pair_mask(VALID, VALID) & causal(5)
    out, w = references.multi_head_attention(
        dec.self_attention, x, x, mask=self_mask
    )
    np.testing.assert_allclose(maps["decoder/self_attention"], w, atol=ATOL)
    # Post-norm: the cross-attention reads LN(x + self_attention(x)).
    y = references.layer_norm(x + out, dec.self_attention_norm)
    _, w = references.multi_head_attention(
        dec.cross_attention_layer,
        y,
        context,
        mask=pair_mask(VALID, SRC_VALID),
    )
    np.testing.assert_allclose(maps["decoder/cross_attention"], w, atol=ATOL)
    sides = {
        name: (m["kind"], m["query_tokens"], m["key_tokens"])
        for name, m in maps.metadata.items()
    }
    assert sides == {
        "encoder/self_attention": ("self", "tokens", "tokens"),
        "decoder/self_attention": ("self", "target_tokens", "target_tokens"),
        "decoder/cross_attention": ("cross", "target_tokens", "tokens"),
    }


def test_pooling_in_a_sequential_model():
    model = keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            embed("embedding"),
            layers.AttentionPooling(units=4, name="pool"),
            keras.layers.Dense(2),
        ]
    )
    maps = collect_attention(model, IDS)
    x = np_(model.get_layer("embedding")(IDS))
    _, want = references.attention_pooling(model.get_layer("pool"), x, VALID)
    assert maps["pool"].shape == (2, 1, 1, 5)
    np.testing.assert_allclose(maps["pool"][:, 0, 0], want, atol=ATOL)
    assert np.all(maps["pool"][:, 0, 0][~VALID] == 0)
    meta = maps.metadata["pool"]
    assert (meta["kind"], meta["query_tokens"], meta["key_tokens"]) == (
        "pooling",
        None,
        "tokens",
    )
    assert meta["query_mask"] is None
    np.testing.assert_array_equal(meta["key_mask"], VALID)


@pytest.mark.parametrize("style", ["bahdanau", "luong"])
def test_seq2seq_attention_called_directly(style):
    ids = keras.Input((None,), dtype="int32")
    src = keras.Input((None,), dtype="int32")
    query = embed("target_embedding")(ids)
    memory = embed("source_embedding")(src)
    if style == "bahdanau":
        attention = layers.BahdanauAttention(6, name="attention")
    else:
        attention = layers.LuongAttention("general", name="attention")
    model = keras.Model([ids, src], attention(query, memory))
    maps = collect_attention(model, [IDS, SRC])
    q = np_(model.get_layer("target_embedding")(IDS))
    m = np_(model.get_layer("source_embedding")(SRC))
    reference = references.bahdanau if style == "bahdanau" else references.luong
    _, want = reference(attention, q, m, SRC_VALID, VALID)
    assert maps["attention"].shape == (2, 1, 5, 6)
    np.testing.assert_allclose(maps["attention"][:, 0], want, atol=ATOL)
    meta = maps.metadata["attention"]
    assert (meta["kind"], meta["query_tokens"], meta["key_tokens"]) == (
        "cross",
        "target_tokens",
        "tokens",
    )


def test_attention_rnn_decoder_alignment():
    ids = keras.Input((None,), dtype="int32")
    src = keras.Input((None,), dtype="int32")
    memory = embed("source_embedding")(src)
    decoder = layers.AttentionRNNDecoder(
        8, layers.BahdanauAttention(6), name="decoder"
    )
    outputs = decoder(embed("target_embedding")(ids), memory)
    model = keras.Model([ids, src], outputs)
    maps = collect_attention(model, [IDS, SRC])
    assert list(maps) == ["decoder"]  # not its attention sublayer
    got = maps["decoder"]
    assert got.shape == (2, 1, 5, 6)
    # Step by step: each step's weights are Bahdanau's on the previous
    # state (the query) and the memory.
    x = np_(model.get_layer("target_embedding")(IDS))
    m = np_(model.get_layer("source_embedding")(SRC))
    states = decoder.get_initial_state(2)
    for t in range(5):
        query = np_(states[0])[:, None]
        _, want = references.bahdanau(
            decoder.attention, query, m, SRC_VALID, np.ones((2, 1), bool)
        )
        valid = VALID[:, t]
        np.testing.assert_allclose(got[valid, 0, t], want[valid, 0], atol=ATOL)
        assert np.all(got[~valid, 0, t] == 0)  # padded target steps
        _, states, _ = decoder.step(x[:, t], states, m, SRC_VALID, t)
    meta = maps.metadata["decoder"]
    assert (meta["kind"], meta["query_tokens"], meta["key_tokens"]) == (
        "decoder",
        "target_tokens",
        "tokens",
    )
    assert meta["heads_averaged"] is False
    assert decoder.return_attention_scores is False
    np.testing.assert_array_equal(meta["query_mask"], VALID)
    np.testing.assert_array_equal(meta["key_mask"], SRC_VALID)


class SharedAttention(keras.Model):
    """One layer called twice, once asking for the scores itself."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embed("embedding")
        self.attention = layers.SelfAttention(2, 4, name="shared")

    def call(self, ids):
        x = self.embedding(ids)
        y, scores = self.attention(x, return_attention_scores=True)
        return self.attention(y), scores


def test_shared_layer_calls_and_own_scores():
    model = SharedAttention()
    _, scores = model(IDS)
    maps = collect_attention(model, IDS)
    assert list(maps) == ["shared", "shared#2"]
    assert [m["call_index"] for m in maps.metadata.values()] == [0, 1]
    np.testing.assert_allclose(maps["shared"], np_(scores), atol=1e-6)
    assert not np.allclose(maps["shared#2"], maps["shared"])


@pytest.mark.parametrize("attention_axes", [1, (2,), None])
def test_attention_axes_layout_when_a_size_equals_num_heads(attention_axes):
    """The heads axis comes from the layer's layout, not from matching
    sizes: here axis 2 has `num_heads` (2) steps as well."""
    x = keras.Input((5, 2, 8))
    mha = layers.MultiHeadAttention(
        2, 4, attention_axes=attention_axes, name="axial"
    )
    model = keras.Model(x, mha(x, x))
    data = RNG.normal(size=(3, 5, 2, 8)).astype("float32")
    maps = collect_attention(model, data)
    _, scores = mha(data, data, return_attention_scores=True)
    scores = np_(scores)
    if attention_axes is None:  # (b, h, 5, 2, 5, 2): both axes flattened
        expected = scores.reshape(3, 2, 10, 10)
    elif attention_axes == 1:  # (b, 2 others, h, 5, 5)
        expected = scores.reshape(6, 2, 5, 5)
    else:  # (b, 5 others, h, 2, 2)
        expected = scores.reshape(15, 2, 2, 2)
    np.testing.assert_allclose(maps["axial"], expected, atol=ATOL)


class GlobalTokens(keras.Model):
    """`LocalSelfAttention` with global tokens (a `global_mask`): its
    scores are a dict of banded and global parts."""

    def __init__(self, max_global_tokens=None, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embed("embedding")
        self.attention = layers.LocalSelfAttention(
            2,
            4,
            window_size=1,
            global_projections=True,
            max_global_tokens=max_global_tokens,
            name="local",
        )

    def build(self, input_shape):
        # Built from shapes: a symbolic call with `max_global_tokens=None`
        # cannot run (the number of global slots must be static).
        ids_shape = tuple(input_shape[0])
        self.embedding.build(ids_shape)
        self.attention.build(ids_shape + (8,))

    def call(self, inputs):
        ids, is_global = inputs
        return self.attention(self.embedding(ids), global_mask=is_global)


@pytest.mark.parametrize("max_global_tokens", [None, 1])
def test_local_attention_with_global_tokens(max_global_tokens):
    is_global = np.zeros(IDS.shape, bool)
    is_global[:, 0] = True
    is_global[1, 3] = True  # beyond max_global_tokens=1: stays local
    model = GlobalTokens(max_global_tokens)
    maps = collect_attention(model, (IDS, is_global))
    layer = model.attention
    x = model.embedding(IDS)
    _, scores = layer(x, global_mask=is_global, return_attention_scores=True)
    want = np_(layer.scores_to_dense(scores))
    assert maps["local"].shape == (2, 2, 5, 5)
    np.testing.assert_allclose(maps["local"], want, atol=1e-6)
    sums = maps["local"].sum(-1)
    np.testing.assert_allclose(
        sums[np.broadcast_to(VALID[:, None], sums.shape)], 1, atol=1e-5
    )
    assert np.all(
        maps["local"][~np.broadcast_to(VALID[:, None], sums.shape)] == 0
    )
    # A global query attends to every real key; the window alone would not.
    np.testing.assert_array_equal(maps["local"][1, :, 0] > 0, True)
    meta = maps.metadata["local"]
    assert meta["window"] == (1, 1)
    effective = is_global.copy()
    if max_global_tokens == 1:
        effective[1, 3] = False
    np.testing.assert_array_equal(meta["global_mask"], effective)


def test_global_mask_is_none_without_global_tokens(mha):
    _, maps = mha
    assert all(m["global_mask"] is None for m in maps.metadata.values())


class SharedAndNamedLikeASecondCall(keras.Model):
    """A shared layer "attn" called twice and another layer really named
    "attn#2": three calls, three entries."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embed("embedding")
        self.shared = layers.SelfAttention(2, 4, name="attn")
        self.other = layers.SelfAttention(2, 4, name="attn#2")

    def build(self, ids_shape):
        # Built from shapes, not by a symbolic call: on TensorFlow a graph
        # refuses the name scope "attn#2" after Keras pushed it onto its
        # own stack, which then keeps this model's scope (in the weight
        # paths of every later layer).
        self.embedding.build(ids_shape)
        for layer in (self.shared, self.other):
            layer.build(tuple(ids_shape) + (8,))

    def call(self, ids):
        x = self.embedding(ids)
        return self.shared(self.other(self.shared(x)))


def test_keys_are_unique_whatever_the_layer_names():
    model = SharedAndNamedLikeASecondCall()
    maps = collect_attention(model, IDS)
    assert len(maps) == 3
    names = list(maps)
    assert len(set(names)) == 3
    layers_ = [maps.metadata[n]["path"] for n in names]
    assert layers_ == ["attn", "attn#2", "attn"]
    assert [maps.metadata[n]["call_index"] for n in names] == [0, 0, 1]
    # Each entry is its own call's weights.
    x = model.embedding(IDS)
    y, first = model.shared(x, return_attention_scores=True)
    z, second = model.other(y, return_attention_scores=True)
    _, third = model.shared(z, return_attention_scores=True)
    for name, want in zip(names, (first, second, third)):
        np.testing.assert_allclose(maps[name], np_(want), atol=1e-6)


@pytest.mark.parametrize(
    "layers_, error",
    [(5, TypeError), ([], ValueError), (("cross", 3), TypeError)],
)
def test_layers_of_the_wrong_type_name_the_argument(mha, layers_, error):
    model, _ = mha
    with pytest.raises(error, match=re.escape(f"layers={layers_!r}")):
        collect_attention(model, [IDS, SRC], layers=layers_)


# The recording hook: new layers are recorded without edits here --------


def test_subclass_using_the_attention_step_is_recorded():
    # A Keras-style subclass that only overrides the attention step (here:
    # a temperature on the scores) is recorded with the weights it used.
    class Tempered(layers.MultiHeadAttention):
        def _compute_attention(
            self, query, key, value, attention_mask=None, training=None
        ):
            query = query * 3.0
            return super()._compute_attention(
                query, key, value, attention_mask, training
            )

    inputs = keras.Input((5, 8))
    attention = Tempered(num_heads=2, key_dim=4, name="tempered")
    model = keras.Model(inputs, attention(inputs, inputs))
    x = RNG.normal(size=(2, 5, 8)).astype("float32")
    maps = collect_attention(model, x)
    _, expected = attention(x, x, return_attention_scores=True)
    assert list(maps) == ["tempered"]
    np.testing.assert_allclose(maps["tempered"], np_(expected), atol=ATOL)
    plain = layers.MultiHeadAttention(num_heads=2, key_dim=4)
    plain(x, x)
    plain.set_weights(attention.get_weights())
    _, untempered = plain(x, x, return_attention_scores=True)
    assert not np.allclose(maps["tempered"], np_(untempered), atol=1e-3)
    assert maps.metadata["tempered"]["kind"] == "self"


class _MeanAttention(AttentionRecording, keras.layers.Layer):
    """A layer that is none of the package's classes: it joins by deriving
    from `AttentionRecording` and implementing `call_with_attention`."""

    attention_kind = "self"

    def call(self, inputs):
        return ops.mean(inputs, axis=1, keepdims=True) + 0.0 * inputs

    def call_with_attention(self, call, args, kwargs, options):
        # Reached through the recording scope: no method of the instance
        # was replaced to get here.
        assert "call" not in self.__dict__
        outputs = call(*args, **kwargs)
        b, t = args[0].shape[0], args[0].shape[1]
        weights = np.full((b, 1, t, t), 1.0 / t, "float32")
        meta = dict(
            kind="self",
            query_mask=None,
            key_mask=None,
            causal=False,
            window=None,
        )
        return outputs, weights, meta


def test_a_new_layer_with_the_hook_is_recorded():
    # Recorded, outputs unchanged; its `call` passes straight through
    # outside `collect_attention`.
    inputs = keras.Input((4, 3))
    layer = _MeanAttention(name="mean")
    model = keras.Model(inputs, layer(inputs))
    x = RNG.normal(size=(2, 4, 3)).astype("float32")
    maps = collect_attention(model, x)
    assert list(maps) == ["mean"]
    np.testing.assert_allclose(maps["mean"], np.full((2, 1, 4, 4), 0.25))
    meta = maps.metadata["mean"]
    assert meta["layer"] == "_MeanAttention"
    assert (meta["query_tokens"], meta["key_tokens"]) == ("tokens", "tokens")
    assert "call" not in layer.__dict__
    np.testing.assert_allclose(
        np_(model(x)), np.repeat(x.mean(1, keepdims=True), 4, 1), atol=ATOL
    )


def test_a_subclass_calling_super_call_is_recorded_once():
    class Scaled(_MeanAttention):
        def call(self, inputs):
            return 2.0 * super().call(inputs)

    inputs = keras.Input((4, 3))
    model = keras.Model(inputs, Scaled(name="scaled")(inputs))
    x = RNG.normal(size=(2, 4, 3)).astype("float32")
    maps = collect_attention(model, x)
    assert list(maps) == ["scaled"]
    assert maps.metadata["scaled"]["call_index"] == 0


def test_a_layer_with_the_hook_but_not_the_mixin_is_refused():
    # Its `call` would never consult the recording scope: refused rather
    # than silently left out.
    class DuckAttention(keras.layers.Layer):
        def call(self, inputs):
            return inputs

        def call_with_attention(self, call, args, kwargs, options):
            raise AssertionError("never reached")

    inputs = keras.Input((4, 3))
    model = keras.Model(inputs, DuckAttention(name="duck")(inputs))
    x = RNG.normal(size=(2, 4, 3)).astype("float32")
    with pytest.raises(TypeError, match="'duck'.*AttentionRecording.*'Duck"):
        collect_attention(model, x)


def test_collect_imports_no_attention_layer_class():
    # The recorder knows layers only through the hook.
    source = inspect.getsource(collect)
    for name in (
        "MultiHeadAttention",
        "SelfAttention",
        "CrossAttention",
        "LocalSelfAttention",
        "AttentionRNNDecoder",
    ):
        assert f"import {name}" not in source
        assert f"isinstance(layer, {name})" not in source
