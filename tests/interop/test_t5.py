"""`from_keras_hub` on tiny random keras-hub `T5Backbone`s (T5 1.1's gated
feed-forward with tied embeddings, the original's plain one untied, heads
of 6 not `hidden / heads`): equal outputs of both stacks at the real
positions with padding, relative positions in every bucket (exact and
log-spaced, past `max_distance`), one relative bias per stack shared by
its blocks (also after a `.keras` round trip and through training),
copied weights, the attention of every layer, SavedModel (TensorFlow).
Backend-neutral."""

import harness
import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier

import keras_attention
from keras_attention.interop import from_keras_hub
from keras_attention.scores.t5_relative_bias import T5RelativeBias
from keras_attention.scores.t5_relative_bias import _bucket_table

keras_hub = pytest.importorskip("keras_hub")
# keras-hub's T5 attention warns when given a masked input.
pytestmark = family_tier() + [
    pytest.mark.filterwarnings(
        "ignore:Layer .* does not support masking:UserWarning"
    )
]

VOCAB, HEADS, HIDDEN = 20, 4, 16
# Source and target lengths past T5's 8 (bidirectional) / 16 (causal)
# exact distances, so that the log-spaced buckets are used.
SOURCE, TARGET = 24, 20
VARIANTS = {
    "t5.1.1": dict(use_gated_activation=True, activation="gelu"),
    "t5": dict(
        use_gated_activation=False,
        activation="relu",
        tie_embedding_weights=False,
    ),
}


def tiny(variant="t5.1.1", **kwargs):
    return keras_hub.models.T5Backbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=HEADS,
        hidden_dim=HIDDEN,
        intermediate_dim=32,
        key_value_dim=6,
        **VARIANTS[variant],
        **kwargs,
    )


def perturbed(backbone):
    """Noise on every weight: T5's norms start at one."""
    rng = np.random.default_rng(7)
    for weight in backbone.weights:
        noise = rng.normal(scale=0.1, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)
    return backbone


def make_inputs(seed=0):
    rng = np.random.default_rng(seed)
    # Right padding, a full row; the decoder's first token is real.
    encoder_padding = np.array([[1] * 17 + [0] * 7, [1] * SOURCE], "int32")
    decoder_padding = np.array([[1] * 12 + [0] * 8, [1] * TARGET], "int32")
    return {
        "encoder_token_ids": rng.integers(1, VOCAB, (2, SOURCE)).astype("int32")
        * encoder_padding,
        "encoder_padding_mask": encoder_padding,
        "decoder_token_ids": rng.integers(1, VOCAB, (2, TARGET)).astype("int32")
        * decoder_padding,
        "decoder_padding_mask": decoder_padding,
    }


def error_at_real_positions(ours, theirs, inputs):
    errors = []
    for stack in ("encoder", "decoder"):
        real = inputs[f"{stack}_padding_mask"].astype(bool)
        key = f"{stack}_sequence_output"
        ours_, theirs_ = to_numpy(ours[key]), to_numpy(theirs[key])
        assert np.isfinite(ours_).all()
        errors.append(np.abs(ours_[real] - theirs_[real]).max())
    return max(errors)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def converted(request):
    keras.utils.set_random_seed(2)
    backbone = perturbed(tiny(request.param))
    return backbone, from_keras_hub(backbone)


def test_buckets_equal_keras_hub_at_every_distance():
    attention = keras_hub.src.models.t5.t5_multi_head_attention
    relative = np.arange(-1000, 1001, dtype="int32")
    for bidirectional in (True, False):
        theirs = attention.T5MultiHeadAttention._relative_position_bucket(
            keras.ops.convert_to_tensor(relative),
            bidirectional=bidirectional,
            num_buckets=32,
            max_distance=128,
        )
        table = _bucket_table(bidirectional, 32, 128)  # -128 .. 128
        ours = table[np.clip(relative, -128, 128) + 128]
        np.testing.assert_array_equal(ours, to_numpy(theirs))


def test_same_inputs_and_outputs(converted):
    backbone, model = converted
    assert sorted(model.input) == sorted(backbone.input)
    assert sorted(model.output) == sorted(backbone.output)


def test_equal_outputs_with_padding(converted):
    backbone, model = converted
    inputs = make_inputs()
    error = error_at_real_positions(model(inputs), backbone(inputs), inputs)
    assert error <= 1e-5


def test_one_relative_bias_per_stack_shared_by_its_blocks(converted):
    backbone, model = converted
    blocks = [layer for layer in model.layers if hasattr(layer, "causal")]
    biases = {}
    for block in blocks:
        bias = block.self_attention.score_mod
        assert isinstance(bias, T5RelativeBias)
        biases.setdefault(block.causal, set()).add(id(bias))
    assert {k: len(v) for k, v in biases.items()} == {False: 1, True: 1}
    # Same number of weights as keras-hub's (one table per stack), none
    # of them theirs.
    assert len(model.weights) == len(backbone.weights)
    assert not {id(w) for w in backbone.weights} & {
        id(w) for w in model.weights
    }


def test_keras_round_trip_keeps_the_bias_shared(converted, tmp_path):
    _, model = converted
    inputs = make_inputs(seed=3)
    path = str(tmp_path / "t5.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    expected, got = model(inputs), reloaded(inputs)
    for key in expected:
        np.testing.assert_allclose(
            to_numpy(got[key]), to_numpy(expected[key]), atol=1e-6
        )
    encoder = [
        layer.self_attention.score_mod
        for layer in reloaded.layers
        if hasattr(layer, "causal") and not layer.causal
    ]
    assert len(encoder) == 2 and encoder[0] is encoder[1]
    assert len(reloaded.weights) == len(model.weights)


def test_a_training_step_moves_each_shared_table_once():
    keras.utils.set_random_seed(4)
    backbone = perturbed(tiny())
    model = from_keras_hub(backbone)
    inputs = make_inputs(seed=5)
    tables = [
        w for w in model.weights if w.path.endswith("relative_bias/embeddings")
    ]
    assert len(tables) == 2
    before = [to_numpy(t).copy() for t in tables]
    outputs = {
        k: keras.layers.Dense(1, name=f"head_{k[:3]}")(v)
        for k, v in model.output.items()
    }
    trainable = keras.Model(model.input, outputs)
    trainable.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    targets = {
        "encoder_sequence_output": np.ones((2, SOURCE, 1), "float32"),
        "decoder_sequence_output": np.ones((2, TARGET, 1), "float32"),
    }
    trainable.fit(inputs, targets, epochs=1, batch_size=2, verbose=0)
    for table, old in zip(tables, before):
        assert np.abs(to_numpy(table) - old).max() > 0
    # Every encoder block still reads the one (updated) table.
    encoder = model.get_layer("transformer_encoder_layer_1")
    assert encoder.self_attention.score_mod.embeddings is tables[0] or (
        encoder.self_attention.score_mod.embeddings is tables[1]
    )


def test_attention_of_every_layer(converted):
    _, model = converted
    inputs = make_inputs()
    maps = keras_attention.visualization.collect_attention(model, inputs)
    shapes = sorted(tuple(w.shape) for w in maps.values())
    # 2 encoder self-attentions, 2 decoder self- and 2 cross-attentions.
    assert shapes == sorted(
        [(2, HEADS, SOURCE, SOURCE)] * 2
        + [(2, HEADS, TARGET, TARGET)] * 2
        + [(2, HEADS, TARGET, SOURCE)] * 2
    )
    for weights in maps.values():
        rows = to_numpy(weights).sum(-1)
        assert np.all((np.abs(rows - 1) < 1e-5) | (np.abs(rows) < 1e-6))


@pytest.mark.tf_only("SavedModel export is the TensorFlow part's check")
def test_saved_model_export(converted):
    _, model = converted
    data = make_inputs(seed=6)
    names = sorted(data)
    inputs = [keras.Input((None,), dtype="int32", name=n) for n in names]
    outputs = model(dict(zip(names, inputs)))
    wrapped = keras.Model(inputs, [outputs[k] for k in sorted(outputs)])
    harness.check_saved_model(wrapped, [{n: data[n] for n in names}])


def test_listed_as_supported():
    assert "T5Backbone" in keras_attention.interop.supported_backbones()


def test_weight_copy_refuses_wrong_shapes_and_leftovers():
    from keras_attention.interop import _common

    backbone = tiny()
    model = from_keras_hub(backbone)
    embedding = backbone.token_embedding.embeddings
    ours = model.get_layer("token_embedding").embeddings
    norm = model.get_layer("encoder_output_layer_norm").scale
    with pytest.raises(ValueError, match="has shape .* but the converted"):
        _common.copy_pairs(backbone, model, [(embedding, norm, None)])
    with pytest.raises(ValueError, match="Two weights .* map to"):
        _common.copy_pairs(
            backbone, model, [(embedding, ours, None), (embedding, ours, None)]
        )
    with pytest.raises(ValueError, match="without a place: .*embeddings"):
        _common.copy_pairs(backbone, model, [])
