"""`from_keras_hub` on tiny random keras-hub vision backbones (DeiT,
DINOv2) and image-text backbones (CLIP, SigLIP): equal outputs, copied
weights, one attention map per attention layer, `.keras` round trip with
`safe_mode=True`, the options refused by name. Images only (no padding);
the text towers of CLIP and SigLIP take token ids without a padding mask,
as the backbones do. Backend-neutral; the fast tier runs on TensorFlow
(tests/interop/tiers.py)."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier

import keras_attention
from keras_attention.interop import from_keras_hub

keras_hub = pytest.importorskip("keras_hub")

pytestmark = family_tier()

RNG = np.random.default_rng(0)
IMAGES = RNG.normal(size=(2, 16, 16, 3)).astype("float32")


def perturbed(backbone, seed=7):
    """`backbone` with noise on every weight (no identity norms, no zero
    tokens or layer scales of one)."""
    rng = np.random.default_rng(seed)
    for weight in backbone.weights:
        if not keras.backend.is_float_dtype(weight.dtype):
            continue  # CLIP's and SigLIP's stored position ids
        noise = rng.normal(scale=0.1, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)
    return backbone


def max_difference(ours, theirs):
    if isinstance(theirs, dict):
        assert sorted(ours) == sorted(theirs)
        return max(max_difference(ours[k], theirs[k]) for k in theirs)
    ours, theirs = to_numpy(ours), to_numpy(theirs)
    assert ours.shape == theirs.shape
    return float(np.abs(ours - theirs).max())


def check_round_trip(model, data, tmp_path):
    path = str(tmp_path / f"{model.name}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    assert max_difference(reloaded(data), model(data)) <= 1e-6


def attention_maps(model, data):
    maps = keras_attention.visualization.collect_attention(model, data)
    return [tuple(w.shape) for w in maps.values()]


# DeiT: class and distillation tokens; no biases in the attention.


def deit(**kwargs):
    options = dict(
        image_shape=(16, 16, 3),
        patch_size=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        use_mha_bias=False,
        layer_norm_epsilon=1e-5,
    )
    return keras_hub.models.DeiTBackbone(**{**options, **kwargs})


@pytest.fixture(scope="module")
def deit_converted():
    keras.utils.set_random_seed(3)
    backbone = perturbed(deit())
    return backbone, from_keras_hub(backbone)


def test_deit_equal_outputs_and_attention_of_every_layer(deit_converted):
    backbone, model = deit_converted
    assert model.input.name == "images"
    assert max_difference(model(IMAGES), backbone(IMAGES)) <= 1e-5
    assert not {id(w) for w in backbone.weights} & {
        id(w) for w in model.weights
    }
    assert attention_maps(model, IMAGES) == [(2, 2, 6, 6)] * 2


def test_deit_keras_round_trip_safe_mode(deit_converted, tmp_path):
    check_round_trip(deit_converted[1], IMAGES, tmp_path)


def test_deit_channels_first_is_refused():
    backbone = deit(image_shape=(3, 16, 16), data_format="channels_first")
    with pytest.raises(ValueError, match="data_format"):
        from_keras_hub(backbone)
