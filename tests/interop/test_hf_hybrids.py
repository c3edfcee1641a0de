"""What `from_huggingface`'s hybrid families (`qwen3_next`, `kimi_linear`)
add to the weight-table walker (`interop/hf/weights.py`), on tiny Keras
models and checkpoints written here (no transformers; cheap, every
backend): rows whose tensors are several (concatenated along their
first axis), rows whose stored rows are reordered (`order`: Qwen3-Next's
per-head-group interleaved projections), the `experts_linear` and
`depthwise_conv` transforms and a family's own `Transform`, each checked
against NumPy; their errors naming the tensor and both shapes. Then the
two converters' refusals by name, read from the config alone.
Their equality with transformers: `test_from_huggingface.py`."""

import json
import re

import hf_cases
import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import reload_tier

from keras_attention.interop import from_huggingface
from keras_attention.interop.checkpoint import Checkpoint
from keras_attention.interop.hf import configs
from keras_attention.interop.hf import kimi_linear
from keras_attention.interop.hf import weights
from keras_attention.interop.hf.kimi_linear import convert_kimi_linear
from keras_attention.interop.hf.qwen3_next import convert_qwen3_next
from keras_attention.interop.hf.qwen3_next import grouped_order
from keras_attention.interop.huggingface import MODEL_TYPES
from keras_attention.layers import MixtureOfExperts
from keras_attention.visualization import collect_attention

safetensors_numpy = pytest.importorskip("safetensors.numpy")

RNG = np.random.default_rng(7)


def _model():
    """Dense kernels `a` (4, 3), `b` (4, 2), `c` (4, 4) on one input, a
    `MixtureOfExperts` `moe` of 2 experts of 3, a table `conv/embeddings`
    (5, 3) and a norm scale `v/scale` (3,)."""
    x = keras.Input((None, 4))
    ids = keras.Input((None,), dtype="int32")
    outs = [
        keras.layers.Dense(n, use_bias=False, name=name)(x)
        for name, n in (("a", 3), ("b", 2), ("c", 4))
    ]
    outs.append(MixtureOfExperts(2, 1, 3, name="moe")(x))
    outs.append(keras.layers.RMSNormalization(name="v")(outs[0]))
    outs.append(keras.layers.Embedding(5, 3, name="conv")(ids))
    return keras.Model([x, ids], outs)


def _weight(model, path):
    return to_numpy(next(w for w in model.weights if w.path == path))


def _checkpoint(tmp_path, tensors):
    safetensors_numpy.save_file(
        {k: np.asarray(v, "float32") for k, v in tensors.items()},
        str(tmp_path / "model.safetensors"),
    )
    return Checkpoint(tmp_path)


# Their tensors: `fused` (5, 4) reordered into a and b; `x0`, `x1` (2, 4)
# read as one into c; each expert's gate/up `(3, 4)` and down `(4, 3)`;
# the router `(2, 4)`; a depthwise conv `(5, 1, 3)`; `a_log` (1, 1, 3, 1)
# by a family's own transform.
ORDER = (4, 0, 2, 1, 3)
A_LOG = weights.Transform(
    lambda shape: (1, 1) + tuple(shape) + (1,),
    lambda read, shape, dtype: read(0, 1).reshape(shape).astype(dtype),
)
TABLE = (
    ("fused", ("a/kernel", "b/kernel"), "linear", ORDER),
    (("x0", "x1"), "c/kernel", "linear"),
    ("router", "moe/router_kernel", "linear"),
    (
        ("e0.gate", "e0.up", "e1.gate", "e1.up"),
        "moe/gate_up_kernel",
        "experts_linear",
    ),
    (("e0.down", "e1.down"), "moe/down_kernel", "experts_linear"),
    ("dw", "conv/embeddings", "depthwise_conv"),
    ("a_log", "v/scale", A_LOG),
)


def _tensors():
    shapes = dict(
        fused=(5, 4),
        x0=(2, 4),
        x1=(2, 4),
        router=(2, 4),
        dw=(5, 1, 3),
        a_log=(1, 1, 3, 1),
    )
    for e in (0, 1):
        shapes.update({f"e{e}.gate": (3, 4), f"e{e}.up": (3, 4)})
        shapes[f"e{e}.down"] = (4, 3)
    return {k: RNG.normal(size=s).astype("float32") for k, s in shapes.items()}


def test_reordered_concatenated_and_expert_rows(tmp_path):
    model, tensors = _model(), _tensors()
    assert weights.expected_shapes(model, TABLE, 1) == {
        k: v.shape for k, v in tensors.items()
    }
    weights.load_weights(model, _checkpoint(tmp_path, tensors), TABLE, 1)
    fused = tensors["fused"][list(ORDER)]  # our row r: their row ORDER[r]
    np.testing.assert_array_equal(_weight(model, "a/kernel"), fused[:3].T)
    np.testing.assert_array_equal(_weight(model, "b/kernel"), fused[3:].T)
    both = np.concatenate([tensors["x0"], tensors["x1"]])
    np.testing.assert_array_equal(_weight(model, "c/kernel"), both.T)
    for e in (0, 1):  # gate columns, then up; each expert transposed
        gate_up = np.concatenate([tensors[f"e{e}.gate"], tensors[f"e{e}.up"]])
        np.testing.assert_array_equal(
            _weight(model, "moe/gate_up_kernel")[e], gate_up.T
        )
        np.testing.assert_array_equal(
            _weight(model, "moe/down_kernel")[e], tensors[f"e{e}.down"].T
        )
    np.testing.assert_array_equal(
        _weight(model, "conv/embeddings"), tensors["dw"][:, 0]
    )
    np.testing.assert_array_equal(
        _weight(model, "v/scale"), tensors["a_log"].ravel()
    )


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(x1=None), "no tensor 'x1' (expected of shape (2, 4)"),
        (
            dict(e1_up=np.zeros((2, 4))),
            "Tensor 'e1.up' has shape (2, 4) in the checkpoint but (3, 4)",
        ),
    ],
    ids=["missing", "misshapen"],
)
def test_a_part_of_a_row_is_named(tmp_path, change, match):
    tensors = _tensors()
    for name, value in change.items():
        name = name.replace("_", ".")
        tensors.pop(name)
        if value is not None:
            tensors[name] = value
    model = _model()
    before = [to_numpy(w) for w in model.weights]
    with pytest.raises(ValueError, match=re.escape(match)):
        weights.load_weights(model, _checkpoint(tmp_path, tensors), TABLE, 1)
    for old, w in zip(before, model.weights):  # checked before any read
        np.testing.assert_array_equal(to_numpy(w), old)


def test_an_order_that_is_no_permutation_is_a_converter_error(tmp_path):
    table = (("fused", ("a/kernel", "b/kernel"), "linear", (0, 0, 1, 2, 3)),)
    table += TABLE[1:]
    with pytest.raises(ValueError, match="a converter error"):
        weights.load_weights(
            _model(), _checkpoint(tmp_path, _tensors()), table, 1
        )


def test_grouped_order_reads_each_piece_of_every_group():
    # 2 groups of (q: 1, k: 1, v: 2) rows: [q0 k0 v0 v0 | q1 k1 v1 v1].
    assert grouped_order(2, (1, 1, 2)) == (0, 4, 1, 5, 2, 3, 6, 7)


# --- Refused by name (the config alone: no model is built) -------------------


@pytest.mark.parametrize(
    "converter,fields,match",
    [
        (convert_qwen3_next, dict(attention_bias=True), "attention_bias=True"),
        (convert_qwen3_next, dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (
            convert_qwen3_next,
            dict(layer_types=["linear_attention", "sliding_attention"]),
            "layer_types=",
        ),
        (
            convert_qwen3_next,
            dict(head_dim=8, partial_rotary_factor=0.375),
            "rotates 3 features",
        ),
        (convert_kimi_linear, dict(mla_use_nope=False), "mla_use_nope=False"),
        (
            convert_kimi_linear,
            dict(num_key_value_heads=1),
            "num_key_value_heads=1",
        ),
        (
            convert_kimi_linear,
            dict(moe_router_activation_func="softmax"),
            "moe_router_activation_func='softmax'",
        ),
        (convert_kimi_linear, dict(num_shared_experts=0), "num_shared_exp"),
        (
            convert_kimi_linear,
            dict(mlp_layer_types=["dense", "moe"]),
            "mlp_layer_types=",
        ),
    ],
)
def test_unsupported_options_are_refused_by_name(converter, fields, match):
    config = dict(
        model_type=converter.__name__[len("convert_") :],
        vocab_size=8,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        **fields,
    )
    with pytest.raises(ValueError, match=re.escape(match)):
        converter(configs.HFConfig(config), "float32")


def test_one_of_reads_the_name_the_checkpoint_holds(tmp_path):
    tensors = _tensors()
    table = ((weights.OneOf(("alt_fused", "fused")), *TABLE[0][1:]),) + TABLE[
        1:
    ]
    model = _model()
    weights.load_weights(model, _checkpoint(tmp_path, tensors), table, 1)
    fused = tensors["fused"][list(ORDER)]
    np.testing.assert_array_equal(_weight(model, "b/kernel"), fused[3:].T)
    assert "alt_fused" in weights.expected_shapes(model, table, 1)
    tensors.pop("fused")
    with pytest.raises(ValueError, match=re.escape("['alt_fused', 'fused']")):
        weights.load_weights(model, _checkpoint(tmp_path, tensors), table, 1)


def test_kimi_reads_moonshots_config_layout():
    # Moonshot's config.json: the linear attention's own dict (layers
    # counted from 1), `first_k_dense_replace`.
    config = configs.HFConfig(
        dict(
            model_type="kimi_linear",
            num_hidden_layers=3,
            first_k_dense_replace=2,
            linear_attn_config=dict(
                full_attn_layers=[2],
                kda_layers=[1, 3],
                num_heads=2,
                head_dim=4,
                short_conv_kernel_size=3,
            ),
        )
    )
    assert kimi_linear.layer_types(config) == [
        "linear_attention",
        "full_attention",
        "linear_attention",
    ]
    assert kimi_linear.mlp_layer_types(config) == ["dense", "dense", "sparse"]
    sizes = [
        kimi_linear._get(config, name)
        for name in ("linear_num_heads", "linear_head_dim")
    ]
    assert sizes + [kimi_linear._get(config, "linear_conv_kernel_dim")] == [
        2,
        4,
        3,
    ]


# --- The converted hybrids keep the library's features (slow tier) ----------


@reload_tier("qwen3_5_moe (gated delta nets) and the KDA / MLA layer tests")
@pytest.mark.parametrize("case", ["qwen3_next", "kimi_linear"])
def test_keras_reload_and_attention_maps(case, tmp_path):
    """A random checkpoint of the case's config (the shapes the converter
    reads): `.keras` save and reload with `safe_mode=True` gives the same
    outputs; `collect_attention` gives one map per layer (the delta
    rules' implied attention, MLA's weights), causal, zero on padded
    keys."""
    spec = hf_cases.CASES[case]
    config = dict(spec["config"], model_type=spec["model_type"])
    conversion = MODEL_TYPES[case](configs.HFConfig(config), "float32")
    shapes = weights.expected_shapes(
        conversion.model, conversion.table, conversion.num_layers
    )
    tensors = {k: 0.3 * RNG.normal(size=s) for k, s in shapes.items()}
    directory = tmp_path / case
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    _checkpoint(directory, tensors)
    model = from_huggingface(directory)
    inputs = {
        "token_ids": np.array(hf_cases.TOKEN_IDS, "int32"),
        "padding_mask": np.array(hf_cases.PADDING_MASK, "int32"),
    }
    path = str(tmp_path / f"{case}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    want = to_numpy(model(inputs))
    assert np.isfinite(want).all() and want.std() > 0
    np.testing.assert_allclose(to_numpy(reloaded(inputs)), want, atol=1e-6)
    maps = collect_attention(model, inputs)
    assert len(maps) == len(spec["config"]["layer_types"])
    real = np.array(hf_cases.PADDING_MASK).astype(bool)
    q, k = np.indices(real.shape[1:] * 2)
    for attention in maps.values():  # causal, no weight on a padded key
        assert np.allclose(attention[..., q < k], 0.0)
        assert np.allclose(attention * ~real[:, None, None, :], 0.0)
