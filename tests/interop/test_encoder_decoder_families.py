"""`from_keras_hub` on tiny random keras-hub encoder-decoder backbones:
BART (a token table shared by both stacks, learned positions per stack,
post-norm, `layernorm_embedding`), Whisper (log-mel frames through its
convolutions, a fixed encoder position table, no key biases), T5Gemma
(Gemma 2's blocks, windows, soft-caps, a decoder narrower than the
encoder) and Moonshine (raw audio through its convolutions, the mask of
its frames, partial interleaved rotary, padded heads, SwiGLU). Each:
equal outputs of both stacks at the real positions with right and left
padding of the targets (of token sources too; audio right-padded), the
attention of every layer (self- and cross-), `.keras` round trip with
`safe_mode=True`, and `seq2seq_generator`'s greedy tokens equal to
keras-hub's `Seq2SeqLM.generate` / `MoonshineAudioToText.generate`
(Whisper, which has no keras-hub task: to greedy decoding driven by its
forward pass). Backend-neutral."""

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
# Of the largest |difference| at the real positions, relative to the
# largest |output| when above one (T5Gemma's sandwich-normed stacks reach
# about 6 here).
TOLERANCE = 1e-5


def randomized(backbone, scale=0.2):
    """Every weight drawn from NumPy (the same on every backend): kernels
    and tables of `scale`, norm scales about one, biases about zero. The
    norms' ones and zeros would hide a swapped weight; the greedy tokens
    vary."""
    rng = np.random.default_rng(7)
    for weight in backbone.weights:
        if weight.path.endswith("inv_freq"):
            continue  # Moonshine's stored RoPE frequencies (of rope_theta)
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


def whisper():
    # 16 log-mel frames of 4 bins -> 8 encoder positions.
    return keras_hub.models.WhisperBackbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=HEADS,
        hidden_dim=HIDDEN,
        intermediate_dim=32,
        num_mels=4,
        max_encoder_sequence_length=2 * LENGTH,
        max_decoder_sequence_length=LENGTH,
    )


def t5gemma():
    # Gemma 2's options on: a window on layer 0 (decoder: 3 keys before a
    # query; the encoder ignores it, as keras-hub's), soft-caps, grouped
    # queries, the query scaling, an untied logits table, and a decoder
    # narrower than the encoder (its cross-attention reads 16 features).
    stacks = {
        "encoder": dict(hidden_dim=HIDDEN, intermediate_dim=32),
        "decoder": dict(hidden_dim=12, intermediate_dim=24),
    }
    config = {
        f"{stack}_{key}": value
        for stack, sizes in stacks.items()
        for key, value in dict(
            num_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=4,
            layer_types=["sliding_attention", "full_attention"],
            **sizes,
        ).items()
    }
    return keras_hub.models.T5GemmaBackbone(
        vocabulary_size=VOCAB,
        sliding_window=3,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=30.0,
        query_pre_attn_scalar=8.0,
        tie_word_embeddings=False,
        **config,
    )


def moonshine():
    # Partial rotary (0.62 of heads padded from 8 to 12 features: 6
    # rotated), biases, a GELU encoder and a SwiGLU decoder.
    return keras_hub.models.MoonshineBackbone(
        vocabulary_size=VOCAB,
        filter_dim=HIDDEN,
        encoder_num_layers=2,
        decoder_num_layers=2,
        hidden_dim=HIDDEN,
        intermediate_dim=32,
        encoder_num_heads=HEADS,
        decoder_num_heads=HEADS,
        feedforward_expansion_factor=2,
        pad_head_dim_to_multiple_of=6,
        partial_rotary_factor=0.62,
        attention_bias=True,
    )


# Moonshine's frontend turns 2,560 samples into 5 frames, 1,800 into 3.
SAMPLES = 2560
AUDIO_LENGTHS = np.array([[SAMPLES], [1800]])


def audio_sources(seed=11):
    """Two clips of raw audio, the second right-padded, and their mask."""
    rng = np.random.default_rng(seed)
    mask = np.arange(SAMPLES)[None] < AUDIO_LENGTHS
    values = rng.normal(size=(2, SAMPLES, 1)) * mask[..., None]
    return {
        "encoder_input_values": values.astype("float32"),
        "encoder_padding_mask": mask,
    }


def audio_inputs(seed=0):
    rng = np.random.default_rng(seed)
    targets = target_inputs(rng)
    return {
        **audio_sources(seed),
        "decoder_token_ids": targets["decoder_token_ids"],
        "decoder_padding_mask": targets["decoder_padding_mask"].astype(bool),
    }


def token_inputs(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, VOCAB, (2, LENGTH)).astype("int32")
    return {
        "encoder_token_ids": ids * SOURCE_PADDING,
        "encoder_padding_mask": SOURCE_PADDING,
        **target_inputs(rng),
    }


def target_inputs(rng):
    targets = rng.integers(2, VOCAB, (2, LENGTH)).astype("int32")
    return {
        "decoder_token_ids": targets * TARGET_PADDING,
        "decoder_padding_mask": TARGET_PADDING,
    }


def feature_inputs(seed=0):
    """Whisper: 16 frames of 4 log-mel bins (all real)."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(2, 2 * LENGTH, 4)).astype("float32")
    return {"encoder_features": features, **target_inputs(rng)}


def prompts(pad):
    """Prompts of a start token (2), one token more in the second row,
    padded with `pad`, and their mask."""
    tokens = np.full((2, LENGTH), pad, "int32")
    tokens[:, 0], tokens[1, 1] = 2, 6
    start = np.zeros((2, LENGTH), bool)
    start[:, 0], start[1, 1] = True, True
    return tokens, start


def token_sources(pad):
    """`make_sources()` of two token sources, one right-padded with `pad`:
    `(the generator's sources, keras-hub's encoder inputs)`."""

    def make():
        ids = np.array([[5, 7, 9, 4, pad, pad], [3, 4, 11, 12, 13, 8]])
        ids = ids.astype("int32")
        return ids, {
            "encoder_token_ids": ids,
            "encoder_padding_mask": ids != pad,
        }

    return make


def encoder_inputs(make):
    """`make_sources()` of encoder inputs that are the sources too."""

    def sources():
        inputs = make()
        return inputs, inputs

    return sources


def task_greedy(task_name, pad, make_sources=None):
    """Greedy tokens of keras-hub's task `keras_hub.models.<task_name>` on
    two sources (`make_sources()`; default: `token_sources(pad)`) and
    `prompts(pad)`. The returned function's `sources()` gives the
    generator's sources."""
    make_sources = make_sources or token_sources(pad)

    def generate(backbone):
        sources, inputs = make_sources()
        tokens, start = prompts(pad)
        task = getattr(keras_hub.models, task_name)(
            backbone=backbone, preprocessor=None
        )
        task.compile(sampler="greedy", jit_compile=False)
        want = task.generate(
            {
                **inputs,
                "decoder_token_ids": tokens,
                "decoder_padding_mask": start,
            },
            stop_token_ids=None,
        )["decoder_token_ids"]
        return (sources, tokens, start), to_numpy(want)

    generate.sources = lambda: make_sources()[0]
    return generate


def forward_greedy(make_sources, pad=0):
    """Greedy decoding driven by keras-hub's forward pass (keras-hub 0.32
    has no Whisper task): the whole buffer through the backbone at each
    step, the next token the argmax of the decoder's output at the
    previous position through the token table reversed; the prompts'
    tokens kept where their mask is set, as keras-hub's samplers do."""

    def generate(backbone):
        sources = make_sources()
        tokens, start = prompts(pad)
        tokens = tokens.copy()
        for position in range(start.sum(-1).min(), LENGTH):
            hidden = backbone(
                {
                    **sources,
                    "decoder_token_ids": tokens,
                    "decoder_padding_mask": np.ones_like(tokens),
                }
            )["decoder_sequence_output"][:, position - 1]
            logits = backbone.token_embedding(hidden, reverse=True)
            chosen = to_numpy(logits).argmax(-1)
            free = ~start[:, position]
            tokens[free, position] = chosen[free]
        return (sources, prompts(pad)[0], start), tokens

    generate.sources = make_sources
    return generate


def whisper_sources():
    rng = np.random.default_rng(11)
    return {
        "encoder_features": rng.normal(size=(2, 2 * LENGTH, 4)).astype(
            "float32"
        )
    }


# name -> its tiny backbone, its inputs, its greedy reference, its padding
# id and how many attention layers it has (encoder self, decoder self and
# cross).
FAMILIES = {
    "bart": dict(
        make=bart,
        inputs=token_inputs,
        greedy=task_greedy("BartSeq2SeqLM", 1),
        pad=1,
        attention=6,
    ),
    "moonshine": dict(
        make=moonshine,
        inputs=audio_inputs,
        greedy=task_greedy(
            "MoonshineAudioToText", 0, encoder_inputs(audio_sources)
        ),
        pad=0,
        attention=6,
        scale=0.5,  # varied greedy tokens
    ),
    "t5gemma": dict(
        make=t5gemma,
        inputs=token_inputs,
        greedy=task_greedy("T5GemmaSeq2SeqLM", 0),
        pad=0,
        attention=6,
    ),
    "whisper": dict(
        make=whisper,
        inputs=feature_inputs,
        greedy=forward_greedy(whisper_sources),
        pad=0,
        attention=6,
    ),
}
# Families whose converted layers another family's `.keras` reload covers.
RELOAD_COVERED = {
    # Gemma 2's reload covers sandwich norms, soft-caps, windows, grouped
    # queries; T5's cross-attention.
    "t5gemma": "gemma",
    # Whisper's reload covers audio frontends of Keras layers; Qwen 3.5's
    # the partial rotary (`rotary_fraction`); ConvolutionPaddingMask's
    # round trip is in its own tests.
    "moonshine": "whisper",
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
            family = FAMILIES[name]
            backbone = randomized(family["make"](), family.get("scale", 0.2))
            cache[name] = backbone, from_keras_hub(backbone)
        return cache[name]

    return get


def masks(inputs, theirs):
    """The real positions of each output: the padding masks of the inputs,
    or the encoder's frames that keras-hub marks real (Moonshine's
    `encoder_attention_mask`); an encoder without either: every position."""
    encoder = inputs.get("encoder_padding_mask")
    if "encoder_attention_mask" in theirs:
        encoder = to_numpy(theirs["encoder_attention_mask"])
    return {
        "encoder_sequence_output": encoder,
        "decoder_sequence_output": inputs["decoder_padding_mask"],
    }


def real_positions_error(ours, theirs, real):
    """The largest |difference| at the real positions over the largest
    |output| (at least one)."""
    errors = []
    for key, mask in real.items():
        a, b = to_numpy(ours[key]), to_numpy(theirs[key])
        assert np.isfinite(a).all()
        if mask is not None:
            a, b = a[mask.astype(bool)], b[mask.astype(bool)]
        errors.append(np.abs(a - b).max() / max(1.0, np.abs(b).max()))
    return max(errors)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_equal_outputs_with_padding(converted, name):
    backbone, model = converted(name)
    inputs = FAMILIES[name]["inputs"]()
    assert sorted(model.input) == sorted(backbone.input)
    assert sorted(model.output) == sorted(backbone.output)
    ours, theirs = model(inputs), backbone(inputs)
    error = real_positions_error(ours, theirs, masks(inputs, theirs))
    assert error <= TOLERANCE, error
    if "encoder_attention_mask" in theirs:  # Moonshine's frames
        np.testing.assert_array_equal(
            to_numpy(ours["encoder_attention_mask"]),
            to_numpy(theirs["encoder_attention_mask"]).astype(bool),
        )


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_greedy_tokens_equal_keras_hub(converted, name):
    backbone, model = converted(name)
    family = FAMILIES[name]
    (sources, tokens, start), want = family["greedy"](backbone)
    ours = seq2seq_generator(
        model, pad_token_id=family["pad"], jit_compile=False
    )
    got, _ = ours.generate(sources, tokens, padding_mask=start)
    np.testing.assert_array_equal(to_numpy(got), want)
    assert len(np.unique(want[:, 2:])) > 1  # not one token repeated


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_attention_of_every_layer(converted, name):
    backbone, model = converted(name)
    inputs = FAMILIES[name]["inputs"]()
    maps = keras_attention.visualization.collect_attention(model, inputs)
    assert len(maps) == FAMILIES[name]["attention"]
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
    inputs = FAMILIES[name]["inputs"](seed=3)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    expected, got = model(inputs), reloaded(inputs)
    for key in expected:
        np.testing.assert_allclose(
            to_numpy(got[key]), to_numpy(expected[key]), atol=1e-6
        )
    assert len(reloaded.weights) == len(model.weights)
    # The generator reads the reloaded graph as the converted one.
    family = FAMILIES[name]
    sources = family["greedy"].sources()
    tokens, start = prompts(family["pad"])
    outputs = [
        seq2seq_generator(
            m, pad_token_id=family["pad"], jit_compile=False
        ).generate(sources, tokens, padding_mask=start)[0]
        for m in (model, reloaded)
    ]
    np.testing.assert_array_equal(*map(to_numpy, outputs))


def test_bart_shares_one_token_table(converted):
    """Both stacks read one table, the decoder's logits table: as many
    weights as keras-hub's."""
    backbone, model = converted("bart")
    assert len(model.weights) == len(backbone.weights)
    tables = [w for w in model.weights if "token_embedding" in w.path]
    assert len(tables) == 1


def test_whisper_key_biases_hold_zeros(converted):
    """Whisper's key projections have no bias: ours hold zeros, one per
    attention layer beside keras-hub's weights."""
    backbone, model = converted("whisper")
    biases = [w for w in model.weights if w.path.endswith("/key/bias")]
    assert len(biases) == FAMILIES["whisper"]["attention"]
    assert all(not np.any(to_numpy(b)) for b in biases)
    assert len(model.weights) == len(backbone.weights) + len(biases)
    table = model.get_layer("encoder_position_embedding")
    assert not table.trainable  # the fixed sinusoids, as keras-hub's


def test_encoder_inputs_generator_refuses_wrong_sources(converted):
    """Sources of an audio encoder: its inputs by name, one row per
    prompt; the decoder's learned positions bound the outputs' length."""
    _, model = converted("whisper")
    generator = seq2seq_generator(model, jit_compile=False)
    assert generator.source_names == ("encoder_features",)
    frames = whisper_sources()["encoder_features"]
    tokens, start = prompts(0)
    with pytest.raises(ValueError, match="encoder's inputs"):
        generator.generate({"features": frames}, tokens, padding_mask=start)
    with pytest.raises(ValueError, match="one row per prompt"):
        generator.generate(frames[:1], tokens, padding_mask=start)
    with pytest.raises(ValueError, match="max_length"):
        generator.generate(frames, tokens, max_length=LENGTH + 1)
    with pytest.raises(ValueError, match=r"\(batch, T\)"):
        generator.generate(frames, tokens[0], padding_mask=start[0])
