"""Models of `from_huggingface` keep the library's features (issue 55
item 3's requirements, applied to them): a `.keras` save and reload with
`safe_mode=True` gives the same outputs, and `collect_attention` gives
one map per attention layer (causal, the sliding window of Gemma 3's
windowed layer, no weight on padding). Two families stand for the
others: Gemma 3 (windowed and global layers, RoPE per layer type,
QK-norm, `1 + w` norms) and OLMo 2 (norms after the sublayers only,
QK-norm across heads, attention biases, untied head), from their
`hf_cases.py` configs with random weights of the shapes the converter
reads (written with `safetensors.numpy`: no transformers, fast). Fast
tier: TensorFlow (`tiers.py`)."""

import json

import hf_cases
import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier

import keras_attention
from keras_attention.interop import from_huggingface
from keras_attention.interop import huggingface
from keras_attention.interop.hf import configs
from keras_attention.interop.hf import weights

safetensors_numpy = pytest.importorskip("safetensors.numpy")
pytestmark = family_tier()

CASES = ("gemma3_text", "olmo2")
INPUTS = {
    "token_ids": np.array(hf_cases.TOKEN_IDS, "int32"),
    "padding_mask": np.array(hf_cases.PADDING_MASK, "int32"),
}


def write_random_checkpoint(directory, config, seed=0):
    """`config.json` and random tensors of the names and shapes the
    family's converter reads for `config`."""
    conversion = huggingface.MODEL_TYPES[config["model_type"]](
        configs.HFConfig(config), "float32"
    )
    shapes = weights.expected_shapes(
        conversion.model, conversion.table, conversion.num_layers
    )
    rng = np.random.default_rng(seed)
    tensors = {
        name: (0.3 * rng.standard_normal(shape)).astype("float32")
        for name, shape in sorted(shapes.items())
    }
    (directory / "config.json").write_text(json.dumps(config))
    safetensors_numpy.save_file(tensors, str(directory / "model.safetensors"))


@pytest.fixture(scope="module", params=CASES)
def converted(request, tmp_path_factory):
    case = hf_cases.CASES[request.param]
    config = dict(case["config"], model_type=case["model_type"])
    directory = tmp_path_factory.mktemp(request.param)
    write_random_checkpoint(directory, config)
    keras.utils.set_random_seed(0)
    return request.param, config, from_huggingface(directory)


def test_keras_reload_safe_mode(converted, tmp_path):
    name, _, model = converted
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    want = to_numpy(model(INPUTS))
    assert np.isfinite(want).all() and want.std() > 0
    np.testing.assert_allclose(to_numpy(reloaded(INPUTS)), want, atol=1e-6)


def test_one_attention_map_per_attention_layer(converted):
    name, config, model = converted
    maps = keras_attention.visualization.collect_attention(model, INPUTS)
    blocks = [
        layer
        for layer in model.layers
        if isinstance(layer, keras_attention.blocks.TransformerDecoderBlock)
    ]
    assert len(maps) == len(blocks) == config["num_hidden_layers"]
    length = INPUTS["token_ids"].shape[1]
    heads = config["num_attention_heads"]
    real = INPUTS["padding_mask"].astype(bool)
    q, k = np.indices((length, length))
    windows = config.get("layer_types") or ["full_attention"] * len(maps)
    for attention, layer_type in zip(maps.values(), windows):
        assert attention.shape == (2, heads, length, length)
        # Causal, and no weight on a padded key.
        assert np.allclose(attention[..., q < k], 0.0)
        assert np.allclose(attention * ~real[:, None, None, :], 0.0)
        rows = attention.sum(-1).transpose(0, 2, 1)[real]  # real queries
        np.testing.assert_allclose(rows, 1.0, atol=1e-5)
        # transformers' sliding window: a query sees keys with
        # q - k < sliding_window.
        far = q - k >= config.get("sliding_window", length + 1)
        if layer_type == "sliding_attention":
            assert np.allclose(attention[..., far], 0.0)
        elif far.any():
            assert (attention[0][:, far & real[0][None, :]] > 0).any()
