"""What `test_from_huggingface.py`'s `qwen3_moe` and `mixtral` cases do not
show for `from_huggingface`'s mixture-of-experts reading: the per-expert
tensors read as one stacked kernel over several row chunks (against
NumPy), a Qwen3-MoE without experts (all layers dense), the options
refused by name, and the training settings left out of the layers. Config
reading and NumPy only: TensorFlow part only."""

import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.interop.checkpoint import Checkpoint
from keras_attention.interop.hf import configs
from keras_attention.interop.hf import mixtral
from keras_attention.interop.hf import qwen3_moe
from keras_attention.interop.hf import weights

pytestmark = pytest.mark.tf_only("config reading and NumPy: one backend")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

TINY = dict(
    vocab_size=12,
    hidden_size=8,
    intermediate_size=6,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    num_experts_per_tok=2,
    max_position_embeddings=32,
    rope_theta=1e4,
)
QWEN3_MOE = dict(
    TINY, model_type="qwen3_moe", num_experts=3, moe_intermediate_size=4
)
MIXTRAL = dict(TINY, model_type="mixtral", num_local_experts=3)


def test_per_expert_tensors_fill_the_stacked_kernels(tmp_path, monkeypatch):
    """Each expert's `gate_proj`, `up_proj` (`(intermediate, hidden)`)
    and `down_proj` land in our `gate_up_kernel[j]` (gate columns first)
    and `down_kernel[j]`, transposed; read in chunks smaller than one
    expert."""
    config = configs.HFConfig(dict(QWEN3_MOE, mlp_only_layers=[0]))
    conversion = qwen3_moe.convert_qwen3_moe(config, "float32")
    shapes = weights.expected_shapes(
        conversion.model, conversion.table, conversion.num_layers
    )
    rng = np.random.default_rng(0)
    tensors = {
        name: rng.normal(size=shape).astype("float32")
        for name, shape in shapes.items()
    }
    safetensors_numpy.save_file(tensors, str(tmp_path / "model.safetensors"))
    monkeypatch.setattr(weights, "CHUNK_BYTES", 3 * 8 * 4)  # 3 rows of 8
    weights.load_weights(
        conversion.model,
        Checkpoint(tmp_path),
        conversion.table,
        conversion.num_layers,
        conversion.ignored,
    )
    dense = conversion.model.get_layer("transformer_layer_0").feed_forward
    assert type(dense).__name__ == "FeedForward"  # mlp_only_layers
    moe = conversion.model.get_layer("transformer_layer_1").feed_forward
    theirs = "model.layers.1.mlp."
    for j in range(3):
        expert = theirs + f"experts.{j}."
        want = np.concatenate(
            [
                tensors[expert + "gate_proj.weight"].T,
                tensors[expert + "up_proj.weight"].T,
            ],
            axis=-1,
        )
        np.testing.assert_array_equal(to_numpy(moe.gate_up_kernel)[j], want)
        np.testing.assert_array_equal(
            to_numpy(moe.down_kernel)[j],
            tensors[expert + "down_proj.weight"].T,
        )
    np.testing.assert_array_equal(
        to_numpy(moe.router_kernel), tensors[theirs + "gate.weight"].T
    )


@pytest.mark.parametrize(
    "layers, step, dense, sparse",
    [(4, 2, [3], [1]), (3, 1, [1], [0, 2]), (3, 3, [], [2])],
)
def test_sparse_layers_follow_transformers_rule(layers, step, dense, sparse):
    """transformers' `Qwen3MoeDecoderLayer`: a mixture of experts where
    `i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0`."""
    config = configs.HFConfig(
        dict(
            QWEN3_MOE,
            num_hidden_layers=layers,
            decoder_sparse_step=step,
            mlp_only_layers=dense,
        )
    )
    assert qwen3_moe.sparse_layers(config) == sparse


def test_qwen3_moe_without_experts_is_dense():
    config = configs.HFConfig(dict(QWEN3_MOE, num_experts=0))
    conversion = qwen3_moe.convert_qwen3_moe(config, "float32")
    kinds = {
        type(conversion.model.get_layer(f"transformer_layer_{i}").feed_forward)
        for i in range(2)
    }
    assert {kind.__name__ for kind in kinds} == {"FeedForward"}
    assert not [row for row in conversion.table if "experts" in str(row[0])]


def test_training_settings_are_not_carried():
    """`router_aux_loss_coef` (transformers' loss over all layers at
    once) and `router_jitter_noise` are training settings: the layers
    add no loss and no noise (the module docstrings)."""
    config = configs.HFConfig(
        dict(MIXTRAL, router_aux_loss_coef=0.02, router_jitter_noise=0.1)
    )
    model = mixtral.convert_mixtral(config, "float32").model
    moe = model.get_layer("transformer_layer_0").feed_forward
    assert moe.router_aux_loss_coef is None
    assert moe.router_jitter_noise == 0.0
    assert (moe.num_experts, moe.top_k, moe.normalize_top_k) == (3, 2, True)


@pytest.mark.parametrize(
    "values, match",
    [
        (dict(MIXTRAL, hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(QWEN3_MOE, hidden_act="relu"), "hidden_act='relu'"),
        (dict(QWEN3_MOE, decoder_sparse_step=0), "decoder_sparse_step=0"),
        (dict(QWEN3_MOE, num_local_experts=4), "num_local_experts=4"),
        (dict(MIXTRAL, num_local_experts=None), "num_local_experts"),
        (dict(MIXTRAL, num_experts_per_tok=4), "num_experts_per_tok=4"),
    ],
)
def test_unsupported_options_are_refused_by_name(values, match):
    config = configs.HFConfig(values)
    convert = {
        "mixtral": mixtral.convert_mixtral,
        "qwen3_moe": qwen3_moe.convert_qwen3_moe,
    }[values["model_type"]]
    with pytest.raises(ValueError, match=match):
        convert(config, "float32")
