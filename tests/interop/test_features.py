"""The library's features on converted keras-hub models: the
memory-efficient paths on inputs longer than the dense threshold, the
attention explorer, the layout map. Backend-neutral."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier

import keras_attention
from keras_attention.interop import from_keras_hub

keras_hub = pytest.importorskip("keras_hub")
pytestmark = family_tier()

VOCAB = 50
# 256 * 256 keys > 32768: the attention runs blockwise (or banded, for
# Mistral's window) instead of materialising the scores.
LONG = 256


def tiny(name, max_sequence_length=16):
    models = keras_hub.models
    common = dict(
        vocabulary_size=VOCAB, num_layers=2, hidden_dim=16, intermediate_dim=16
    )
    llama_style = dict(num_query_heads=4, num_key_value_heads=2, **common)
    if name == "bert":
        return models.BertBackbone(
            num_heads=4, max_sequence_length=max_sequence_length, **common
        )
    if name == "llama":
        return models.LlamaBackbone(**llama_style)
    return models.MistralBackbone(sliding_window=32, **llama_style)


@pytest.mark.parametrize("name", ["bert", "llama", "mistral"])
def test_long_inputs_on_the_memory_efficient_paths(name):
    keras.utils.set_random_seed(4)
    backbone = tiny(name, max_sequence_length=LONG)
    model = from_keras_hub(backbone)
    rng = np.random.default_rng(0)
    padding = np.ones((2, LONG), "int32")
    padding[1, 200:] = 0
    data = {
        "token_ids": rng.integers(1, VOCAB, (2, LONG)).astype("int32")
        * padding,
        "padding_mask": padding,
    }
    if name == "bert":
        data["segment_ids"] = np.zeros((2, LONG), "int32")
    ours, theirs = model(data), backbone(data)
    if isinstance(ours, dict):
        ours, theirs = ours["sequence_output"], theirs["sequence_output"]
    real = padding.astype(bool)
    error = np.abs(to_numpy(ours)[real] - to_numpy(theirs)[real]).max()
    assert error <= 1e-5


def test_attention_explorer_of_every_layer_and_head(tmp_path):
    keras.utils.set_random_seed(4)
    backbone = tiny("bert")
    model = from_keras_hub(backbone)
    data = {
        "token_ids": np.array([[2, 7, 9, 11, 3, 0]], "int32"),
        "segment_ids": np.zeros((1, 6), "int32"),
        "padding_mask": np.array([[1, 1, 1, 1, 1, 0]], "int32"),
    }
    maps = keras_attention.visualization.collect_attention(model, data)
    assert [w.shape for w in maps.values()] == [(1, 4, 6, 6)] * 2
    path = tmp_path / "explorer.html"
    tokens = ["[CLS]", "the", "cat", "sat", "[SEP]", "[PAD]"]
    keras_attention.visualization.attention_html(maps, tokens, path=str(path))
    assert path.stat().st_size > 0


def test_layout_map_shards_every_attention_and_feed_forward_kernel():
    keras.utils.set_random_seed(4)
    model = from_keras_hub(tiny("llama"))
    mesh = keras.distribution.DeviceMesh(
        shape=(1, 1), axis_names=("batch", "model"), devices=["cpu:0"]
    )
    layout_map = keras_attention.distribution.get_layout_map(mesh)
    sharded = {
        w.path.split("/", 1)[1]
        for w in model.weights
        if w.path.startswith("transformer_layer_0/")
        and layout_map[w.path] is not None
    }
    assert sharded == {
        "self_attention/query/kernel",
        "self_attention/key/kernel",
        "self_attention/value/kernel",
        "self_attention/attention_output/kernel",
        "feed_forward/intermediate_dense/kernel",
        "feed_forward/gate_dense/kernel",
        "feed_forward/output_dense/kernel",
    }


@pytest.mark.filterwarnings("ignore:Layer .* does not support masking")
def test_t5_long_inputs_blockwise_with_the_shared_relative_bias():
    # 256 source and target tokens: past T5's maximum distance (128) and
    # the dense threshold, so the relative bias runs on the blockwise
    # path (its per-distance fast path), causally in the decoder.
    keras.utils.set_random_seed(4)
    backbone = keras_hub.models.T5Backbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=4,
        hidden_dim=16,
        intermediate_dim=32,
        activation="gelu",
    )
    rng = np.random.default_rng(1)
    for weight in backbone.weights:  # a bias table that is not ~0
        noise = rng.normal(scale=0.3, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)
    model = from_keras_hub(backbone)
    padding = np.ones((2, LONG), "int32")
    padding[1, 180:] = 0
    data = {}
    for stack in ("encoder", "decoder"):
        ids = rng.integers(1, VOCAB, (2, LONG)).astype("int32") * padding
        data[f"{stack}_token_ids"] = ids
        data[f"{stack}_padding_mask"] = padding
    ours, theirs = model(data), backbone(data)
    real = padding.astype(bool)
    for key in ours:
        error = np.abs(to_numpy(ours[key])[real] - to_numpy(theirs[key])[real])
        assert error.max() <= 1e-5, key


@pytest.mark.filterwarnings("ignore:Layer .* does not support masking")
def test_layout_map_shards_t5_cross_attention_too():
    keras.utils.set_random_seed(4)
    backbone = keras_hub.models.T5Backbone(
        vocabulary_size=VOCAB,
        num_layers=1,
        num_heads=4,
        hidden_dim=16,
        intermediate_dim=32,
    )
    model = from_keras_hub(backbone)
    mesh = keras.distribution.DeviceMesh(
        shape=(1, 1), axis_names=("batch", "model"), devices=["cpu:0"]
    )
    layout_map = keras_attention.distribution.get_layout_map(mesh)
    prefix = "transformer_decoder_layer_0/"
    sharded = {
        w.path[len(prefix) :]
        for w in model.weights
        if w.path.startswith(prefix) and layout_map[w.path] is not None
    }
    attention = {
        f"{name}/{part}/kernel"
        for name in ("self_attention", "cross_attention")
        for part in ("query", "key", "value", "attention_output")
    }
    feed_forward = {
        f"feed_forward/{name}/kernel"
        for name in ("intermediate_dense", "gate_dense", "output_dense")
    }
    assert sharded == attention | feed_forward
