"""`from_keras_hub` on tiny random keras-hub encoders whose positions are
relative: DeBERTa-v3 (disentangled attention: log buckets of 6 up to
distance 16, on sequences of 20, so that the exact, log-spaced and
clipped rows are read; one relative table shared by the layers),
RoFormer-v2 (interleaved rotary, scale-only RMS norms, post-norm; with
and without biases), ESM-2 (rotary, pre-norm, the layer norm before the
blocks, padding id 1) and ESM-1 (learned positions read from row
`pad_token_id`, no biases, ReLU). Equal outputs, copied weights, the
attention of every layer, `.keras` round trip with `safe_mode=True`, the
options refused by name. Backend-neutral.

keras-hub 0.32's RoFormer-v2 and ESM mask padded *queries* instead of
padded keys on TensorFlow and JAX (their real tokens attend to the
padding): they are compared without padding on every backend, and with
padding on PyTorch, where keras-hub masks the keys."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier
from tiers import reload_tier

import keras_attention
from keras_attention.interop import from_keras_hub

keras_hub = pytest.importorskip("keras_hub")
pytestmark = family_tier()

VOCAB, LENGTH, HEADS, HIDDEN = 20, 8, 2, 16
TOLERANCE = 1e-5


def tiny(name, **kwargs):
    models = keras_hub.models
    common = dict(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=HEADS,
        hidden_dim=HIDDEN,
        intermediate_dim=24,
    )
    if name == "deberta_v3":
        return models.DebertaV3Backbone(
            max_sequence_length=16, bucket_size=6, **common, **kwargs
        )
    if name == "roformer_v2":
        arguments = dict(head_size=8, max_wavelength=100, use_bias=False)
        arguments.update(kwargs)
        return models.RoformerV2Backbone(**common, **arguments)
    if name == "roformer_v2_bias":  # biases, GELU
        return models.RoformerV2Backbone(
            head_size=8, use_bias=True, activation="gelu", **common, **kwargs
        )
    if name == "esm2":
        arguments = dict(
            use_pre_layer_norm=True, pad_token_id=1, max_wavelength=100
        )
        arguments.update(kwargs)
        return models.ESM2Backbone(**common, **arguments)
    if name == "esm1":
        return models.ESMBackbone(
            position_embedding_type="absolute",
            max_sequence_length=16,
            pad_token_id=1,
            use_bias=False,
            activation="relu",
            **common,
            **kwargs,
        )
    raise ValueError(name)


FAMILIES = ("roformer_v2", "roformer_v2_bias", "esm2", "esm1")
PAD = {"roformer_v2": 0, "roformer_v2_bias": 0, "esm2": 1, "esm1": 1}
# DeBERTa-v3: past the saturation (16) of 6 buckets up to distance 16; a
# right-padded row, a left-padded one.
DEBERTA_LENGTH = 20
DEBERTA_PADDING = np.array([[1] * 13 + [0] * 7, [0] * 6 + [1] * 14], "int32")


def perturbed(backbone):
    """Noise on every weight: the norms' ones and zeros would hide a
    swapped weight."""
    rng = np.random.default_rng(7)
    for weight in backbone.weights:
        noise = rng.normal(scale=0.1, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)
    return backbone


@pytest.fixture(scope="module")
def converted():
    """`converted(name)`: `(backbone, model)`, built once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            keras.utils.set_random_seed(1)
            backbone = perturbed(tiny(name))
            cache[name] = backbone, from_keras_hub(backbone)
        return cache[name]

    return get


def deberta_inputs(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, DEBERTA_PADDING.shape).astype("int32")
    return {"token_ids": ids * DEBERTA_PADDING, "padding_mask": DEBERTA_PADDING}


def test_deberta_v3_equal_outputs_with_padding(converted):
    backbone, model = converted("deberta_v3")
    inputs = deberta_inputs()
    ours, theirs = to_numpy(model(inputs)), to_numpy(backbone(inputs))
    assert ours.shape == theirs.shape == (2, DEBERTA_LENGTH, HIDDEN)
    real = DEBERTA_PADDING == 1
    assert np.abs(ours - theirs).max(-1)[real].max() <= TOLERANCE


def test_deberta_v3_one_relative_table_and_attention_of_every_layer(
    converted,
):
    backbone, model = converted("deberta_v3")
    blocks = [model.get_layer(f"transformer_layer_{i}") for i in range(2)]
    bias = blocks[0].self_attention.score_mod
    assert blocks[1].self_attention.score_mod is bias
    assert sum(w.path.endswith("embeddings") for w in model.weights) == 2
    np.testing.assert_array_equal(
        to_numpy(bias.embeddings),
        to_numpy(backbone.relative_embeddings.rel_embeddings),
    )
    assert not {id(w) for w in backbone.weights} & {
        id(w) for w in model.weights
    }
    maps = keras_attention.visualization.collect_attention(
        model, deberta_inputs()
    )
    shape = (2, HEADS, DEBERTA_LENGTH, DEBERTA_LENGTH)
    assert [w.shape for w in maps.values()] == [shape] * 2


def test_deberta_v3_keras_round_trip_safe_mode(converted, tmp_path):
    _, model = converted("deberta_v3")
    path = str(tmp_path / "deberta_v3.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    blocks = [reloaded.get_layer(f"transformer_layer_{i}") for i in range(2)]
    assert blocks[0].self_attention.score_mod is (
        blocks[1].self_attention.score_mod
    )
    inputs = deberta_inputs(seed=1)
    np.testing.assert_allclose(
        to_numpy(reloaded(inputs)), to_numpy(model(inputs)), atol=1e-6
    )


def make_inputs(name, padded=False, seed=0):
    """Token ids without the padding id (or, `padded`, a right-padded row
    and a left-padded one) and, for RoFormer-v2, two segments."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, VOCAB, (2, LENGTH)).astype("int32")
    if padded:
        ids[0, 5:] = PAD[name]
        ids[1, :3] = PAD[name]
    inputs = {"token_ids": ids}
    if name.startswith("roformer"):
        segments = (np.arange(LENGTH) >= 3).astype("int32")
        inputs["segment_ids"] = np.repeat(segments[None], 2, 0)
    return inputs


@pytest.mark.parametrize("name", FAMILIES)
def test_equal_outputs_without_padding(converted, name):
    backbone, model = converted(name)
    assert sorted(model.input) == sorted(backbone.input)
    inputs = make_inputs(name)
    ours, theirs = to_numpy(model(inputs)), to_numpy(backbone(inputs))
    assert ours.shape == theirs.shape == (2, LENGTH, HIDDEN)
    assert np.abs(ours - theirs).max() <= TOLERANCE


@pytest.mark.parametrize("name", ("roformer_v2", "esm2"))
def test_padded_keys_are_masked(converted, name):
    """Ours masks the padded keys: a real token's output is that of its
    row without the padding. keras-hub equals it on PyTorch, where it
    masks the keys too (on TensorFlow and JAX it masks the queries)."""
    backbone, model = converted(name)
    inputs = make_inputs(name, padded=True)
    ours = to_numpy(model(inputs))
    real = inputs["token_ids"] != PAD[name]
    alone = {k: v[:1, :5] for k, v in inputs.items()}
    np.testing.assert_allclose(
        ours[0, :5], to_numpy(model(alone))[0], atol=TOLERANCE
    )
    if keras.backend.backend() == "torch":
        theirs = to_numpy(backbone(inputs))
        assert np.abs(ours - theirs).max(-1)[real].max() <= TOLERANCE


def test_roformer_rotary_is_interleaved(converted):
    """RoFormer rotates features 2i and 2i + 1 together: the converted
    query kernel holds each head's even features, then its odd ones."""
    backbone, model = converted("roformer_v2")
    theirs = to_numpy(
        backbone.get_layer("transformer_layer_0").attention_layer.q_dense.kernel
    ).reshape(HIDDEN, HEADS, 8)
    ours = to_numpy(
        model.get_layer("transformer_layer_0").self_attention.query_dense.kernel
    )
    np.testing.assert_array_equal(ours[..., :4], theirs[..., 0::2])
    np.testing.assert_array_equal(ours[..., 4:], theirs[..., 1::2])


@pytest.mark.parametrize("name", ("roformer_v2", "esm2"))
def test_weights_copied_and_attention_of_every_layer(converted, name):
    backbone, model = converted(name)
    assert not {id(w) for w in backbone.weights} & {
        id(w) for w in model.weights
    }
    inputs = make_inputs(name)
    maps = keras_attention.visualization.collect_attention(model, inputs)
    assert [w.shape for w in maps.values()] == [(2, HEADS, LENGTH, LENGTH)] * 2


def _round_trip(model, name, tmp_path):
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    inputs = make_inputs(name, padded=True)
    np.testing.assert_allclose(
        to_numpy(reloaded(inputs)), to_numpy(model(inputs)), atol=1e-6
    )


def test_keras_round_trip_safe_mode(converted, tmp_path):
    _round_trip(converted("roformer_v2")[1], "roformer_v2", tmp_path)


@reload_tier("roformer_v2")
@pytest.mark.parametrize("name", ("esm2", "esm1"))
def test_esm_keras_round_trip_safe_mode(converted, name, tmp_path):
    _round_trip(converted(name)[1], name, tmp_path)


def doubled(x):
    """An activation Keras has no name for."""
    return x * 2.0


@pytest.mark.parametrize("name", ("roformer_v2", "esm2"))
def test_activation_without_a_keras_name_is_refused(name):
    with pytest.raises(ValueError, match="activation"):
        from_keras_hub(tiny(name, activation=doubled))
