"""`from_keras_hub` on tiny random keras-hub BERT-style encoders (configs
in `TINY`): equal outputs at the real positions with right and left
padding, copied weights, the attention of every layer call, `.keras`
round trip with `safe_mode=True`, the options refused by name.
Backend-neutral.

- RoBERTa and XLM-R: the exact GELU, epsilon 1e-5, no token types.
- DistilBERT: no token types, no pooler.
- ALBERT: a factorized embedding (8 -> 16), two groups of two shared
  layers, each group run twice: 8 layer calls of 4 blocks.
- ELECTRA: a factorized embedding (8 -> 16), and without it.
"""

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

VOCAB, LENGTH, HEADS, HIDDEN = 20, 8, 4, 16
# A right-padded row, a left-padded one and a full one. The pooled output
# (of the first token) is compared on the rows whose first token is real.
PADDING = np.array([[1] * 5 + [0] * 3, [0] * 3 + [1] * 5, [1] * 8], "int32")
FIRST_REAL = PADDING[:, 0] == 1
TOLERANCE = 1e-5


COMMON = dict(
    num_layers=2,
    num_heads=HEADS,
    hidden_dim=HIDDEN,
    intermediate_dim=16,
    max_sequence_length=LENGTH,
)
FAMILIES = (
    "roberta",
    "xlm_roberta",
    "distil_bert",
    "albert",
    "electra",
)
# Families whose converted layers another family's `.keras` reload covers.
RELOAD_COVERED = {
    # BERT's: `TokenAndPositionEmbedding`, post-norm blocks (and ViT's:
    # the exact GELU by name).
    "roberta": "bert",
    "xlm_roberta": "bert",
    "distil_bert": "bert",
    "electra": "albert",  # a projection `Dense`, segments, the pooler
}


def tiny(name, **kwargs):
    arguments = dict(COMMON, **kwargs)
    models = keras_hub.models
    if name == "roberta":
        return models.RobertaBackbone(vocabulary_size=VOCAB, **arguments)
    if name == "xlm_roberta":
        return models.XLMRobertaBackbone(vocabulary_size=VOCAB, **arguments)
    if name == "distil_bert":
        return models.DistilBertBackbone(vocabulary_size=VOCAB, **arguments)
    if name == "albert":
        albert = dict(num_layers=4, num_groups=2, num_inner_repetitions=2)
        albert.update(embedding_dim=8, vocabulary_size=VOCAB)
        return models.AlbertBackbone(**{**arguments, **albert, **kwargs})
    if name == "electra":
        electra = dict(embedding_dim=8, vocab_size=VOCAB)
        return models.ElectraBackbone(**{**arguments, **electra, **kwargs})
    raise ValueError(name)


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


def make_inputs(backbone, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, PADDING.shape).astype("int32")
    inputs = {"token_ids": ids * PADDING, "padding_mask": PADDING}
    if "segment_ids" in backbone.input:
        segments = rng.integers(0, 2, PADDING.shape).astype("int32")
        inputs["segment_ids"] = segments * PADDING
    return inputs


def as_dict(outputs):
    if isinstance(outputs, dict):
        return {k: to_numpy(v) for k, v in outputs.items()}
    return {"sequence_output": to_numpy(outputs)}


def real_positions_error(ours, theirs):
    """Largest |difference|: hidden states at the real positions, the
    pooled output on the rows whose first token is real."""
    real = PADDING.astype(bool)
    errors = [np.abs(ours["sequence_output"] - theirs["sequence_output"])]
    errors = [errors[0][real].max()]
    if "pooled_output" in theirs:
        pooled = ours["pooled_output"] - theirs["pooled_output"]
        errors.append(np.abs(pooled[FIRST_REAL]).max())
    return max(errors)


def layer_calls(backbone):
    """How many times the backbone calls an encoder layer (ALBERT: each
    group `num_layers // num_groups` times, its layers each time)."""
    return backbone.num_layers * getattr(backbone, "num_inner_repetitions", 1)


def their_layers(backbone):
    """The backbone's encoder layers, each once (ALBERT's: by group)."""
    layers = []
    for entry in backbone.transformer_layers:
        layers.extend(entry if isinstance(entry, list) else [entry])
    return layers


@pytest.mark.parametrize("name", FAMILIES)
def test_equal_outputs_with_padding(converted, name):
    backbone, model = converted(name)
    assert sorted(model.input) == sorted(backbone.input)
    inputs = make_inputs(backbone)
    theirs, ours = as_dict(backbone(inputs)), as_dict(model(inputs))
    assert sorted(ours) == sorted(theirs)
    assert real_positions_error(ours, theirs) <= TOLERANCE
    for value in ours.values():
        assert np.isfinite(value).all()  # padded positions included


@pytest.mark.parametrize("name", FAMILIES)
def test_weights_copied_once_not_shared(converted, name):
    backbone, model = converted(name)
    assert len(model.weights) == len(backbone.weights)
    assert not {id(w) for w in backbone.weights} & {
        id(w) for w in model.weights
    }
    blocks = [layer for layer in model.layers if hasattr(layer, "causal")]
    assert [b.name for b in blocks] == [x.name for x in their_layers(backbone)]


@pytest.mark.parametrize("name", FAMILIES)
def test_attention_of_every_layer_call(converted, name):
    backbone, model = converted(name)
    inputs = make_inputs(backbone)
    maps = keras_attention.visualization.collect_attention(model, inputs)
    assert len(maps) == layer_calls(backbone)  # a map per layer call
    key_mask = PADDING.astype(bool)[:, None, None, :]
    for weights in maps.values():
        assert weights.shape == (3, HEADS, LENGTH, LENGTH)
        assert not weights[np.broadcast_to(~key_mask, weights.shape)].any()
    paths = [maps.metadata[key]["path"] for key in maps]
    blocks = [layer for layer in model.layers if hasattr(layer, "causal")]
    calls_per_block = layer_calls(backbone) // len(blocks)
    for block in blocks:
        path = f"{block.name}/self_attention"
        assert paths.count(path) == calls_per_block


def test_albert_order_of_shared_layer_calls(converted):
    """keras-hub's order: each group in turn, run `num_layers //
    num_groups` times over its layers."""
    backbone, model = converted("albert")
    maps = keras_attention.visualization.collect_attention(
        model, make_inputs(backbone)
    )
    order = [maps.metadata[key]["path"].split("/")[0] for key in maps]
    group_0 = ["group_0_inner_layer_0", "group_0_inner_layer_1"] * 2
    group_1 = ["group_1_inner_layer_0", "group_1_inner_layer_1"] * 2
    assert order == group_0 + group_1


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=reload_tier(RELOAD_COVERED[name]))
        if name in RELOAD_COVERED
        else name
        for name in FAMILIES
    ],
)
def test_keras_round_trip_safe_mode(converted, name, tmp_path):
    backbone, model = converted(name)
    inputs = make_inputs(backbone, seed=3)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    expected, got = as_dict(model(inputs)), as_dict(reloaded(inputs))
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], atol=1e-6)
    blocks = [layer for layer in reloaded.layers if hasattr(layer, "causal")]
    assert len(blocks) == len(
        [layer for layer in model.layers if hasattr(layer, "causal")]
    )  # ALBERT's shared blocks stay shared


def test_electra_without_factorized_embedding():
    keras.utils.set_random_seed(1)
    backbone = perturbed(tiny("electra", embedding_dim=HIDDEN))
    model = from_keras_hub(backbone)
    assert "embeddings_projection" not in [layer.name for layer in model.layers]
    inputs = make_inputs(backbone)
    error = real_positions_error(
        as_dict(model(inputs)), as_dict(backbone(inputs))
    )
    assert error <= TOLERANCE


@pytest.mark.parametrize("name", ["roberta", "albert"])
def test_an_activation_without_a_name_is_refused_by_name(name):
    backbone = tiny(name)
    layer = their_layers(backbone)[0]
    doubled = lambda x: keras.activations.gelu(x) * 2.0  # noqa: E731
    layer.activation = doubled  # its config, and what it computes:
    layer._feedforward_intermediate_dense.activation = doubled
    with pytest.raises(ValueError, match="activation"):
        from_keras_hub(backbone)


def test_layer_options_are_read_from_the_layers():
    """The blocks' options come from keras-hub's layers, not from the
    family: pre-norm layers (`normalize_first`, read at call time) convert
    to pre-norm blocks."""
    keras.utils.set_random_seed(1)
    backbone = perturbed(tiny("roberta"))
    for layer in backbone.transformer_layers:
        layer.normalize_first = True
    model = from_keras_hub(backbone)
    assert model.get_layer("transformer_layer_0").norm_first
    inputs = make_inputs(backbone)
    theirs = as_dict(backbone(inputs))
    assert real_positions_error(as_dict(model(inputs)), theirs) <= TOLERANCE
    post_norm = perturbed(tiny("roberta"))  # the same weights
    assert real_positions_error(as_dict(post_norm(inputs)), theirs) > 1e-3
