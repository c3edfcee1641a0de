"""Tests of `python -m examples.classify_images`: attention rollout against a
NumPy reference, the data split, the models (2-D attention over a feature
map with `attention_axes=(1, 2)`), and a tiny end-to-end run (training,
metrics JSON, attention PNGs, explorer)."""

import json
import struct

import example_output
import numpy as np
import pytest

TRAINS = "trains the example end to end (TensorFlow data pipeline)"


def _png_size(path):
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def _random_attention(rng, batch, heads, length):
    w = rng.random((batch, heads, length, length)) ** 4
    return w / w.sum(-1, keepdims=True)


def _reference_rollout(attentions):
    """Abnar & Zuidema (2020), one example and one matrix at a time."""
    batch, _, length, _ = attentions[0].shape
    out = np.zeros((batch, length, length))
    for b in range(batch):
        rollout = np.eye(length)
        for layer in attentions:
            a = 0.5 * layer[b].mean(axis=0) + 0.5 * np.eye(length)
            a = a / a.sum(axis=1, keepdims=True)
            rollout = a @ rollout
        out[b] = rollout
    return out


def test_attention_rollout_matches_numpy_reference():
    from examples.classify_images.attention_maps import attention_rollout

    rng = np.random.default_rng(0)
    attentions = [_random_attention(rng, 2, 3, 5) for _ in range(3)]
    rollout = attention_rollout(attentions)
    assert rollout.shape == (2, 5, 5) and rollout.dtype == np.float32
    np.testing.assert_allclose(
        rollout, _reference_rollout(attentions), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-5)
    # One layer without the residual term: the head average itself.
    np.testing.assert_allclose(
        attention_rollout(attentions[:1], residual=False),
        attentions[0].mean(1),
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="attentions"):
        attention_rollout([])


def test_image_maps_cls_and_pooling():
    from examples.classify_images.attention_maps import attention_rollout
    from examples.classify_images.attention_maps import image_maps

    rng = np.random.default_rng(1)
    grid = (2, 3)
    layers = {f"encoder_block_{i}/self_attention": None for i in range(2)}
    # [CLS] model: 1 + 6 tokens.
    maps = {name: _random_attention(rng, 2, 4, 7) for name in layers}
    drawn = image_maps(maps, list(layers), grid)
    assert drawn["heads"].shape == (2, 4, 2, 3)
    assert drawn["rollout"].shape == (2, 2, 3)
    last = maps["encoder_block_1/self_attention"]
    np.testing.assert_allclose(
        drawn["heads"][1, 2].ravel(), last[1, 2, 0, 1:], atol=1e-6
    )
    np.testing.assert_allclose(drawn["rollout"].sum((1, 2)), 1.0, atol=1e-5)
    cls_row = attention_rollout(list(maps.values()))[:, 0, 1:]
    np.testing.assert_allclose(
        drawn["rollout"].reshape(2, -1),
        cls_row / cls_row.sum(-1, keepdims=True),
        atol=1e-6,
    )
    # Pooling model: 6 tokens, pooling weights (b, 1, 1, T).
    maps = {name: _random_attention(rng, 2, 4, 6) for name in layers}
    pool = rng.dirichlet(np.ones(6), size=2)
    maps["pooling"] = pool[:, None, None, :]
    drawn = image_maps(maps, list(layers), grid, pooling_name="pooling")
    assert drawn["heads"].shape == (2, 1, 2, 3)
    expected = np.einsum(
        "bi,bij->bj", pool, _reference_rollout(list(maps.values())[:2])
    )
    np.testing.assert_allclose(
        drawn["rollout"].reshape(2, -1), expected, atol=1e-5
    )
    np.testing.assert_allclose(drawn["rollout"].sum((1, 2)), 1.0, atol=1e-5)


def test_sincos_2d_encodes_rows_and_columns():
    from examples.classify_images.model import sincos_2d

    table = sincos_2d(2, 3, 8)
    assert table.shape == (6, 8)
    # Row-major patches: patches 0..2 share the row half, 0 and 3 the
    # column half.
    np.testing.assert_allclose(table[0, :4], table[2, :4])
    np.testing.assert_allclose(table[0, 4:], table[3, 4:])
    np.testing.assert_allclose(table[0], [0, 0, 1, 1, 0, 0, 1, 1])
    with pytest.raises(ValueError, match="dim=6"):
        sincos_2d(2, 2, 6)


def test_stratified_split_is_fixed_and_disjoint():
    from examples.classify_images.data import stratified_split

    labels = np.repeat(np.arange(4), 25)
    train, val, test = stratified_split(labels, 0.2, 0.1)
    again = stratified_split(labels, 0.2, 0.1)
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again))
    everything = np.concatenate([train, val, test])
    assert np.array_equal(np.sort(everything), np.arange(100))
    assert len(test) == 20 and len(val) == 8
    assert np.all(np.bincount(labels[test]) == 5)


@pytest.mark.parametrize("position", ["learned", "sincos"])
def test_feature_map_model_attends_over_both_spatial_axes(position):
    import keras

    from examples.classify_images.model import build_model
    from keras_attention.visualization import collect_attention

    model = build_model(
        "feature_map",
        pooling="attention",
        image_size=16,
        num_classes=3,
        patch_size=4,
        hidden_dim=8,
        num_layers=1,
        num_heads=2,
        position=position,
    )
    attention = model.get_layer("spatial_block_0_attention")
    assert attention.attention_axes == (1, 2)
    images = np.random.default_rng(0).random((2, 16, 16, 1), "float32")
    logits = keras.ops.convert_to_numpy(model(images))
    assert logits.shape == (2, 3) and np.all(np.isfinite(logits))
    maps = collect_attention(model, images)
    # 4×4 feature map: every one of the 16 cells attends to all 16.
    weights = maps["spatial_block_0_attention"]
    assert weights.shape == (2, 2, 16, 16)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert maps["pooling"].shape == (2, 1, 1, 16)


def test_model_choices_are_checked():
    from examples.classify_images.model import build_model

    with pytest.raises(ValueError, match="pooling='cls'"):
        build_model("feature_map", pooling="cls", image_size=8, num_classes=2)
    with pytest.raises(ValueError, match="model='resnet'"):
        build_model("resnet", image_size=8, num_classes=2)
    with pytest.raises(ValueError, match="patch_size=3"):
        build_model("vit", image_size=8, num_classes=2, patch_size=3)


@pytest.mark.tf_only(reason=TRAINS)
def test_fashion_mnist_without_download_is_a_clear_error(tmp_path):
    from examples.classify_images import data

    with pytest.raises(ValueError, match="--download"):
        data.load_splits("fashion_mnist", 28, str(tmp_path), download=False)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    return example_output.quick_run(tmp_path_factory, "classify_images")


@pytest.mark.tf_only(reason=TRAINS)
def test_quick_run_reports_accuracy(quick_run):
    assert len(quick_run["history"]["loss"]) == 2
    accuracy = quick_run["test_accuracy"]
    assert isinstance(accuracy, float) and 0.0 <= accuracy <= 1.0
    with open(quick_run["metrics_path"]) as f:
        metrics = json.load(f)
    assert metrics["test_accuracy"] == pytest.approx(accuracy)
    assert metrics["dataset"] == "digits" and metrics["test_images"] == 60


@pytest.mark.tf_only(reason=TRAINS)
def test_quick_run_prints_no_warnings(quick_run):
    # It used to print Keras's "`shuffle=True` was passed, but will be ignored".
    output = quick_run["output"]
    assert "backend: tensorflow" in output.log  # the run's own messages
    found = output.problems()
    assert not found, "\n".join(found)


@pytest.mark.tf_only(reason=TRAINS)
def test_quick_run_draws_attention_maps(quick_run):
    assert len(quick_run["plots"]) == 2
    for path, (width, height) in quick_run["plots"]:
        assert _png_size(path) == (width, height)
        assert width > 300 and height > 100
    drawn = quick_run["maps"]
    # --quick: 32×32 images in 4×4 patches, 2 heads, [CLS] pooling.
    assert drawn["heads"].shape == (2, 2, 8, 8)
    assert drawn["rollout"].shape == (2, 8, 8)
    np.testing.assert_allclose(drawn["rollout"].sum((1, 2)), 1.0, atol=1e-5)
    with open(quick_run["explorer"], encoding="utf-8") as f:
        html = f.read()
    assert html.startswith("<!DOCTYPE html>")
    assert "encoder_block_1/self_attention" in html and "r7c7" in html


def test_parse_args_defaults_follow_the_model():
    from examples.classify_images import __main__ as classify_images

    args = classify_images.parse_args([])
    assert (args.model, args.pooling, args.image_size) == ("vit", "cls", 32)
    assert args.num_layers == 4 and args.augment
    args = classify_images.parse_args(["--model", "feature_map"])
    assert (args.pooling, args.num_layers) == ("attention", 2)
    assert (
        classify_images.parse_args(["--dataset", "fashion_mnist"]).image_size
        == 28
    )
    with pytest.raises(SystemExit):
        classify_images.parse_args(
            ["--model", "feature_map", "--pooling", "cls"]
        )
