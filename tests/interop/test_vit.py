"""`from_keras_hub` on a tiny random keras-hub `ViTBackbone` (images in,
no padding): equal outputs, copied weights, attention of every layer,
`.keras` round trip with `safe_mode=True`, SavedModel (TensorFlow), the
options refused by name. Backend-neutral."""

import harness
import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier

import keras_attention
from keras_attention.interop import from_keras_hub

keras_hub = pytest.importorskip("keras_hub")
pytestmark = family_tier()

IMAGES = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")


def tiny(**kwargs):
    return keras_hub.models.ViTBackbone(
        image_shape=(8, 8, 3),
        patch_size=4,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        mlp_dim=16,
        **kwargs,
    )


@pytest.fixture(scope="module")
def converted():
    keras.utils.set_random_seed(3)
    backbone = tiny()
    rng = np.random.default_rng(7)
    for weight in backbone.weights:  # no identity norms, a nonzero token
        noise = rng.normal(scale=0.1, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)
    return backbone, from_keras_hub(backbone)


def test_equal_outputs(converted):
    backbone, model = converted
    assert model.input.name == "images"
    ours, theirs = to_numpy(model(IMAGES)), to_numpy(backbone(IMAGES))
    assert ours.shape == theirs.shape == (2, 5, 8)
    assert np.abs(ours - theirs).max() <= 1e-5


def test_weights_copied_and_attention_of_every_layer(converted):
    backbone, model = converted
    theirs = {id(w) for w in backbone.weights}
    assert not theirs & {id(w) for w in model.weights}
    maps = keras_attention.visualization.collect_attention(model, IMAGES)
    assert [w.shape for w in maps.values()] == [(2, 2, 5, 5)] * 2


def test_keras_round_trip_safe_mode(converted, tmp_path):
    _, model = converted
    path = str(tmp_path / "vit.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        to_numpy(reloaded(IMAGES)), to_numpy(model(IMAGES)), atol=1e-6
    )


@pytest.mark.tf_only("SavedModel export is the TensorFlow part's check")
def test_saved_model_export(converted):
    _, model = converted
    images = keras.Input((8, 8, 3), name="images")
    wrapped = keras.Model([images], model(images))  # the harness's layout
    harness.check_saved_model(wrapped, [{"images": IMAGES}])


@pytest.mark.parametrize(
    "argument, value",
    [("use_class_token", False), ("use_mlp_bias", False)],
)
def test_unconverted_options_are_refused_by_name(argument, value):
    with pytest.raises(ValueError, match=argument):
        from_keras_hub(tiny(**{argument: value}))
