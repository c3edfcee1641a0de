"""`from_huggingface`'s DeepSeek converters (`hf/deepseek_v3.py`,
`hf/deepseek_v32.py`) beyond the equality cases of `hf_cases.py`: the
multi-token-prediction layers stored after the last are left unread (and
nothing else is), and the options they cannot apply are refused by name.
Random checkpoints of the expected tensors (`weights.expected_shapes`);
no transformers. Fast tier: TensorFlow."""

import json

import numpy as np
import pytest
from hf_cases import CASES
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier

from keras_attention.interop import from_huggingface
from keras_attention.interop import huggingface
from keras_attention.interop.hf import configs
from keras_attention.interop.hf import weights

pytestmark = family_tier()
safetensors_numpy = pytest.importorskip("safetensors.numpy")

V3 = dict(CASES["deepseek_v3"]["config"], model_type="deepseek_v3")
V32 = dict(CASES["deepseek_v32"]["config"], model_type="deepseek_v32")


def _write(directory, config, extra=()):
    """A random checkpoint of `config` (its converter's expected tensors,
    plus the names `extra`) written into `directory`."""
    conversion = huggingface.MODEL_TYPES[config["model_type"]](
        configs.HFConfig(config), "float32"
    )
    shapes = weights.expected_shapes(
        conversion.model, conversion.table, conversion.num_layers
    )
    rng = np.random.default_rng(0)
    tensors = {
        name: rng.normal(size=shape).astype("float32")
        for name, shape in shapes.items()
    }
    tensors.update({name: np.ones((2, 3), "float32") for name in extra})
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    safetensors_numpy.save_file(tensors, str(directory / "model.safetensors"))
    return tensors


def test_the_multi_token_prediction_layer_is_left_unread(tmp_path):
    config = dict(V3, num_nextn_predict_layers=1)
    mtp = ("model.layers.2.eh_proj.weight", "model.layers.2.enorm.weight")
    tensors = _write(tmp_path / "mtp", config, mtp)
    model = from_huggingface(tmp_path / "mtp")
    bias = model.get_layer("transformer_layer_1").feed_forward.score_correction
    np.testing.assert_array_equal(
        to_numpy(bias),
        tensors["model.layers.1.mlp.gate.e_score_correction_bias"],
    )
    # A tensor past the prediction layers is no layer of the model.
    _write(tmp_path / "extra", config, ("model.layers.3.eh_proj.weight",))
    with pytest.raises(ValueError, match="model.layers.3.eh_proj.weight"):
        from_huggingface(tmp_path / "extra")


@pytest.mark.parametrize(
    "config, match",
    [
        (dict(V3, quantization_config={"quant_method": "fp8"}), "quantiz"),
        (dict(V3, num_key_value_heads=2), "num_key_value_heads=2"),
        (dict(V3, hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(V3, partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
        (dict(V3, n_group=3), "num_groups"),
        (dict(V32, q_lora_rank=None), "q_lora_rank=None"),
        (dict(V32, layer_types=["full_attention"] * 2), "layer_types"),
        (dict(V32, mlp_layer_types=["dense", "moe"]), "mlp_layer_types"),
    ],
    ids=[
        "fp8",
        "kv_heads",
        "activation",
        "partial_rotary",
        "groups",
        "v32_no_query_latent",
        "v32_layer_types",
        "v32_mlp_layer_types",
    ],
)
def test_what_cannot_apply_is_refused_by_name(config, match):
    converter = huggingface.MODEL_TYPES[config["model_type"]]
    with pytest.raises(ValueError, match=match):
        converter(configs.HFConfig(config), "float32")
