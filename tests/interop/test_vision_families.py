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
from tiers import reload_tier

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


def max_tower_difference(model, backbone, data, outputs=("layer_norm",) * 2):
    """The largest difference of the two towers' outputs: ours (the
    outputs of the layers `vision_{outputs[0]}`, `text_{outputs[1]}`)
    against the backbone's `vision_encoder` and `text_encoder`."""
    names = [f"{t}_{o}" for t, o in zip(("vision", "text"), outputs)]
    towers = keras.Model(
        model.input, [model.get_layer(name).output for name in names]
    )
    vision, text = towers(data)
    theirs_vision = backbone.vision_encoder({"images": data["images"]})
    theirs_text = backbone.text_encoder({"token_ids": data["token_ids"]})
    return max(
        max_difference(vision, theirs_vision), max_difference(text, theirs_text)
    )


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


@reload_tier("ViT")
def test_deit_keras_round_trip_safe_mode(deit_converted, tmp_path):
    check_round_trip(deit_converted[1], IMAGES, tmp_path)


def test_deit_channels_first_is_refused(deit_converted, monkeypatch):
    backbone = deit_converted[0]
    monkeypatch.setattr(backbone, "data_format", "channels_first")
    with pytest.raises(ValueError, match="data_format='channels_first'"):
        from_keras_hub(backbone)


# DINOv2: layer scale, register tokens, positions interpolated from a
# larger `position_embedding_shape` (then trained: noise on them too).


def dinov2(**kwargs):
    options = dict(
        patch_size=4,
        num_layers=2,
        hidden_dim=8,
        num_heads=2,
        intermediate_dim=16,
        layer_scale_init_value=0.1,
        num_register_tokens=2,
        image_shape=(16, 16, 3),
        position_embedding_shape=(32, 32, 3),
    )
    return keras_hub.models.DINOV2Backbone(**{**options, **kwargs})


@pytest.fixture(scope="module")
def dinov2_converted():
    keras.utils.set_random_seed(4)
    backbone = perturbed(dinov2())
    return backbone, from_keras_hub(backbone)


def test_dinov2_equal_outputs_and_attention_of_every_layer(dinov2_converted):
    backbone, model = dinov2_converted
    data = {"images": IMAGES}
    assert max_difference(model(data), backbone(data)) <= 1e-5
    assert attention_maps(model, data) == [(2, 2, 19, 19)] * 2
    scale = model.get_layer("transformer_layer_1").feed_forward
    theirs = backbone.get_layer("encoder").layers[1].layer_scale2.lambda1
    np.testing.assert_array_equal(
        to_numpy(scale.layer_scale_weight), to_numpy(theirs)
    )


def test_dinov2_reload_keeps_the_trained_positions(dinov2_converted, tmp_path):
    """The converted model stores the interpolated positions it adds
    (trained here: noise), so its reload equals the backbone; keras-hub
    re-interpolates on reload."""
    backbone, model = dinov2_converted
    check_round_trip(model, {"images": IMAGES}, tmp_path)
    positions = model.get_layer("position_embedding").position_embeddings
    theirs = backbone.get_layer("embeddings").interpolated_position_embeddings
    np.testing.assert_array_equal(to_numpy(positions), to_numpy(theirs)[0])


def test_dinov2_swiglu_without_registers():
    backbone = dinov2(use_swiglu_ffn=True, num_register_tokens=0, num_layers=1)
    backbone = perturbed(backbone)
    model = from_keras_hub(backbone)
    data = {"images": IMAGES}
    assert max_difference(model(data), backbone(data)) <= 1e-5


def test_dinov2_drop_path_is_refused(dinov2_converted, monkeypatch):
    backbone = dinov2_converted[0]
    monkeypatch.setattr(backbone, "drop_path_rate", 0.1)
    with pytest.raises(ValueError, match="drop_path_rate=0.1"):
        from_keras_hub(backbone)


# CLIP: both towers (the text one causal, pooled at its end token, the
# largest id), quick GELU, the projections and the head. Token ids
# right- and left-padded with 0 (CLIP takes no padding mask).

TOKEN_IDS = np.array(
    [[5, 7, 3, 19, 0, 0, 0, 0], [0, 0, 0, 4, 2, 8, 6, 19]], "int32"
)


def clip():
    m = keras_hub.models
    return m.CLIPBackbone(
        m.CLIPVisionEncoder(
            8, 8, 2, 2, 16, image_shape=(16, 16, 3), name="vision"
        ),
        m.CLIPTextEncoder(20, 8, 8, 2, 2, 16, max_sequence_length=8),
        projection_dim=6,
    )


@pytest.fixture(scope="module")
def clip_converted():
    keras.utils.set_random_seed(5)
    backbone = perturbed(clip())
    ids = backbone.vision_encoder.embedding.position_ids
    ids.assign(np.arange(ids.shape[1])[None])  # as in the presets
    return backbone, from_keras_hub(backbone)


def test_clip_equal_outputs_and_attention_of_both_towers(clip_converted):
    backbone, model = clip_converted
    data = {"images": IMAGES, "token_ids": TOKEN_IDS}
    ours, theirs = model(data), backbone(data)
    assert max_difference(ours, theirs) <= 1e-5
    assert to_numpy(ours["text_logits"]).shape == (2, 2)
    assert max_tower_difference(model, backbone, data) <= 1e-5
    maps = keras_attention.visualization.collect_attention(model, data)
    assert {name: tuple(w.shape) for name, w in maps.items()} == {
        **{
            f"vision_transformer_layer_{i}/self_attention": (2, 2, 5, 5)
            for i in (0, 1)
        },
        **{
            f"text_transformer_layer_{i}/self_attention": (2, 2, 8, 8)
            for i in (0, 1)
        },
    }


def test_clip_keras_round_trip_safe_mode(clip_converted, tmp_path):
    data = {"images": IMAGES, "token_ids": TOKEN_IDS}
    check_round_trip(clip_converted[1], data, tmp_path)


def test_clip_intermediate_output_is_refused(clip_converted, monkeypatch):
    encoder = clip_converted[0].text_encoder
    monkeypatch.setattr(encoder, "intermediate_output_index", 0)
    with pytest.raises(ValueError, match="intermediate_output_index=0"):
        from_keras_hub(clip_converted[0])


# SigLIP: attention pooling (a probe attending to the patches), patch
# biases, no class token, gelu_approximate, the text pooled at its last
# token (its full length), the head's learned bias.


def siglip():
    m = keras_hub.models
    return m.SigLIPBackbone(
        m.SigLIPVisionEncoder(8, 8, 2, 2, 16, image_shape=(16, 16, 3)),
        m.SigLIPTextEncoder(
            20,
            8,
            8,
            2,
            2,
            16,
            max_sequence_length=8,
            projection_dim=8,
            name="text",
        ),
    )


@pytest.fixture(scope="module")
def siglip_converted():
    keras.utils.set_random_seed(6)
    backbone = perturbed(siglip())
    return backbone, from_keras_hub(backbone)


def test_siglip_equal_outputs_and_attention_of_both_towers(siglip_converted):
    backbone, model = siglip_converted
    data = {"images": IMAGES, "token_ids": TOKEN_IDS}
    assert max_difference(model(data), backbone(data)) <= 1e-5
    outputs = ("pooling", "projection")
    assert max_tower_difference(model, backbone, data, outputs) <= 1e-5
    maps = keras_attention.visualization.collect_attention(model, data)
    assert {name: tuple(w.shape) for name, w in maps.items()} == {
        **{
            f"vision_transformer_layer_{i}/self_attention": (2, 2, 4, 4)
            for i in (0, 1)
        },
        "vision_head_attention": (2, 2, 1, 4),
        **{
            f"text_transformer_layer_{i}/self_attention": (2, 2, 8, 8)
            for i in (0, 1)
        },
    }


@reload_tier("CLIP")
def test_siglip_keras_round_trip_safe_mode(siglip_converted, tmp_path):
    data = {"images": IMAGES, "token_ids": TOKEN_IDS}
    check_round_trip(siglip_converted[1], data, tmp_path)


# MetaCLIP 2: CLIP with the vision tower's final norm on the pooled class
# token and the text pooled at its first end token (id 2; none in the
# second text: position 0, as keras-hub).

META_TOKEN_IDS = np.array(
    [[5, 7, 3, 2, 0, 0, 0, 0], [0, 0, 4, 6, 8, 9, 7, 5]], "int32"
)


@pytest.fixture(scope="module")
def metaclip_2_converted():
    m = keras_hub.models
    keras.utils.set_random_seed(7)
    backbone = m.MetaCLIP2Backbone(
        m.MetaCLIP2VisionEncoder(8, 8, 2, 2, 16, image_shape=(16, 16, 3)),
        m.MetaCLIP2TextEncoder(20, 8, 8, 2, 2, 16, max_sequence_length=8),
        projection_dim=6,
    )
    return perturbed(backbone), from_keras_hub(backbone)


def test_metaclip_2_equal_outputs_and_attention(metaclip_2_converted):
    backbone, model = metaclip_2_converted
    data = {"images": IMAGES, "token_ids": META_TOKEN_IDS}
    assert max_difference(model(data), backbone(data)) <= 1e-5
    outputs = ("transformer_layer_1", "layer_norm")
    assert max_tower_difference(model, backbone, data, outputs) <= 1e-5
    assert len(attention_maps(model, data)) == 4


@reload_tier("CLIP")
def test_metaclip_2_keras_round_trip_safe_mode(metaclip_2_converted, tmp_path):
    data = {"images": IMAGES, "token_ids": META_TOKEN_IDS}
    check_round_trip(metaclip_2_converted[1], data, tmp_path)
