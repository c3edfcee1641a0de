"""`from_keras_hub` on tiny random keras-hub encoder-decoder backbones:
BART (a token table shared by both stacks, learned positions per stack,
post-norm, `layernorm_embedding`). Each: equal outputs of both stacks at
the real positions with right and left padding, the attention of every
layer (self- and cross-), `.keras` round trip with `safe_mode=True`,
and `seq2seq_generator`'s greedy tokens equal to keras-hub's
`Seq2SeqLM.generate`. Backend-neutral."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier
from tiers import reload_tier

import keras_attention
from keras_attention.interop import from_keras_hub
from keras_attention.interop import seq2seq_generator

keras_hub = pytest.importorskip("keras_hub")
pytestmark = family_tier()

VOCAB, HEADS, HIDDEN, LENGTH = 20, 2, 16, 8
# Right-padded and left-padded rows of sources and targets.
SOURCE_PADDING = np.array([[1] * 6 + [0] * 2, [0] * 2 + [1] * 6], "int32")
TARGET_PADDING = np.array([[1] * 5 + [0] * 3, [0] * 1 + [1] * 7], "int32")
TOLERANCE = 1e-5


def randomized(backbone, scale=0.2):
    """Every weight drawn from NumPy (the same on every backend): kernels
    and tables of `scale`, norm scales about one, biases about zero. The
    norms' ones and zeros would hide a swapped weight; the greedy tokens
    vary."""
    rng = np.random.default_rng(7)
    for weight in backbone.weights:
        noise = rng.normal(size=weight.shape)
        if weight.path.endswith(("gamma", "scale")):
            value = 1 + 0.1 * noise
        elif len(weight.shape) >= 2:
            value = scale * noise
        else:
            value = 0.1 * noise
        weight.assign(value.astype(weight.dtype))
    return backbone


def bart():
    return keras_hub.models.BartBackbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=HEADS,
        hidden_dim=HIDDEN,
        intermediate_dim=32,
        max_sequence_length=LENGTH,
    )


def token_inputs(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, VOCAB, (2, LENGTH)).astype("int32")
    targets = rng.integers(2, VOCAB, (2, LENGTH)).astype("int32")
    return {
        "encoder_token_ids": ids * SOURCE_PADDING,
        "encoder_padding_mask": SOURCE_PADDING,
        "decoder_token_ids": targets * TARGET_PADDING,
        "decoder_padding_mask": TARGET_PADDING,
    }


def task_greedy(task_class, pad):
    """Greedy tokens of keras-hub's task `task_class` on two sources
    (right-padded with `pad`) and prompts of a start token (2) and one
    prompt token more in the second row."""

    def generate(backbone):
        sources = np.array([[5, 7, 9, 4, pad, pad], [3, 4, 11, 12, 13, 8]])
        prompts = np.full((2, LENGTH), pad, "int32")
        prompts[:, 0], prompts[1, 1] = 2, 6
        start = np.zeros((2, LENGTH), bool)
        start[:, 0], start[1, 1] = True, True
        task = task_class(backbone=backbone, preprocessor=None)
        task.compile(sampler="greedy", jit_compile=False)
        want = task.generate(
            {
                "encoder_token_ids": sources.astype("int32"),
                "encoder_padding_mask": sources != pad,
                "decoder_token_ids": prompts,
                "decoder_padding_mask": start,
            },
            stop_token_ids=None,
        )["decoder_token_ids"]
        return (sources.astype("int32"), prompts, start), to_numpy(want)

    return generate


# name -> (backbone, inputs, greedy reference, padding id, attention
# layers: encoder self, decoder self and cross)
FAMILIES = {
    "bart": (
        bart,
        token_inputs,
        task_greedy(lambda **kw: keras_hub.models.BartSeq2SeqLM(**kw), 1),
        1,
    ),
}
# Families whose converted layers another family's `.keras` reload covers.
RELOAD_COVERED = {
    # T5's reload covers decoder blocks with cross-attention; GPT-2's and
    # BERT's the learned position tables, layer norms and dropouts.
    "bart": "t5",
}


@pytest.fixture(scope="module")
def converted():
    """`converted(name)`: `(backbone, model)`, built once per module."""
    cache = {}

    def get(name):
        if name not in cache:
            keras.utils.set_random_seed(1)
            backbone = randomized(FAMILIES[name][0]())
            cache[name] = backbone, from_keras_hub(backbone)
        return cache[name]

    return get


def masks(inputs, backbone):
    """The real positions of each output: the padding masks of the inputs
    (an encoder without one: every position)."""
    return {
        "encoder_sequence_output": inputs.get("encoder_padding_mask"),
        "decoder_sequence_output": inputs["decoder_padding_mask"],
    }


def real_positions_error(ours, theirs, real):
    errors = []
    for key, mask in real.items():
        a, b = to_numpy(ours[key]), to_numpy(theirs[key])
        assert np.isfinite(a).all()
        if mask is not None:
            a, b = a[mask.astype(bool)], b[mask.astype(bool)]
        errors.append(np.abs(a - b).max())
    return max(errors)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_equal_outputs_with_padding(converted, name):
    backbone, model = converted(name)
    inputs = FAMILIES[name][1]()
    assert sorted(model.input) == sorted(backbone.input)
    assert sorted(model.output) == sorted(backbone.output)
    error = real_positions_error(
        model(inputs), backbone(inputs), masks(inputs, backbone)
    )
    assert error <= TOLERANCE, error


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_greedy_tokens_equal_keras_hub(converted, name):
    backbone, model = converted(name)
    _, _, reference, pad = FAMILIES[name]
    (sources, prompts, start), want = reference(backbone)
    ours = seq2seq_generator(model, pad_token_id=pad, jit_compile=False)
    got, _ = ours.generate(sources, prompts, padding_mask=start)
    np.testing.assert_array_equal(to_numpy(got), want)
    assert len(np.unique(want[:, 2:])) > 1  # not one token repeated


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_attention_of_every_layer(converted, name):
    backbone, model = converted(name)
    inputs = FAMILIES[name][1]()
    maps = keras_attention.visualization.collect_attention(model, inputs)
    layers = len(backbone.encoder_transformer_layers) + 2 * len(
        backbone.decoder_transformer_layers
    )
    assert len(maps) == layers
    for weights in maps.values():
        rows = to_numpy(weights).sum(-1)
        assert np.all((np.abs(rows - 1) < 1e-5) | (np.abs(rows) < 1e-6))


def _reload_params():
    return [
        pytest.param(name, marks=reload_tier(RELOAD_COVERED[name]))
        if name in RELOAD_COVERED
        else name
        for name in sorted(FAMILIES)
    ]


@pytest.mark.parametrize("name", _reload_params())
def test_keras_round_trip(converted, name, tmp_path):
    _, model = converted(name)
    inputs = FAMILIES[name][1](seed=3)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    expected, got = model(inputs), reloaded(inputs)
    for key in expected:
        np.testing.assert_allclose(
            to_numpy(got[key]), to_numpy(expected[key]), atol=1e-6
        )
    assert len(reloaded.weights) == len(model.weights)


def test_bart_shares_one_token_table(converted):
    """Both stacks read one table, the decoder's logits table: as many
    weights as keras-hub's."""
    backbone, model = converted("bart")
    assert len(model.weights) == len(backbone.weights)
    tables = [w for w in model.weights if "token_embedding" in w.path]
    assert len(tables) == 1
