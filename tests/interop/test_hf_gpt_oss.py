"""What `test_from_huggingface.py`'s gpt_oss case does not show for
`from_huggingface`'s `gpt_oss` reading: the interleaved gate/up transform
against NumPy's `[..., ::2]` / `[..., 1::2]` over several row chunks,
transformers' `GptOssConfig` defaults (windows on the even layers,
`head_dim` 64, its YaRN), and the refusals by name (MXFP4
`quantization_config`, partial rotary). Config reading and NumPy only:
TensorFlow part only."""

import numpy as np
import pytest

from keras_attention.interop.hf import configs
from keras_attention.interop.hf import gpt_oss
from keras_attention.interop.hf import weights

pytestmark = pytest.mark.tf_only("config reading and NumPy: one backend")

TINY = dict(
    model_type="gpt_oss",
    vocab_size=12,
    hidden_size=8,
    intermediate_size=4,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    num_local_experts=3,
    num_experts_per_tok=2,
    sliding_window=3,
    max_position_embeddings=32,
    rope_parameters=dict(rope_type="default", rope_theta=1e4),
)


def filled(value, shape):
    """A transform's value: an array, or pieces `(axis, start, piece)`
    written into one."""
    if isinstance(value, np.ndarray):
        return value
    out = np.full(shape, np.nan, "float32")
    for axis, start, piece in value:
        index = [slice(None)] * len(shape)
        index[axis] = slice(start, start + piece.shape[axis])
        out[tuple(index)] = piece
    return out


def test_interleaved_gate_up_is_deinterleaved_chunk_by_chunk(monkeypatch):
    rng = np.random.default_rng(0)
    stored = rng.normal(size=(3, 5, 8)).astype("float32")
    monkeypatch.setattr(weights, "CHUNK_BYTES", stored[0].nbytes)  # 3 reads
    reads = []

    def read(a, b):
        reads.append((a, b))
        return stored[a:b]

    expect, fill = weights.TRANSFORMS["interleaved_gate_up"]
    assert expect((3, 5, 8)) == (3, 5, 8)
    out = filled(fill(read, (3, 5, 8), np.dtype("float32")), (3, 5, 8))
    want = np.concatenate([stored[..., ::2], stored[..., 1::2]], axis=-1)
    np.testing.assert_array_equal(out, want)
    assert reads == [(0, 1), (1, 2), (2, 3)]
    bias = stored[:, 0]  # (experts, 2 * intermediate)
    out = filled(fill(lambda a, b: bias[a:b], (3, 8), "float32"), (3, 8))
    np.testing.assert_array_equal(out[:, :4], bias[:, ::2])
    np.testing.assert_array_equal(out[:, 4:], bias[:, 1::2])


def test_transformers_defaults_are_read():
    values = {
        k: v
        for k, v in TINY.items()
        if k not in ("head_dim", "rope_parameters", "num_key_value_heads")
    }
    values["hidden_act"] = "gelu_fast"  # not read by transformers either
    config = gpt_oss.gpt_oss_config(configs.HFConfig(values))
    assert config.head_dim() == 64
    assert config.get("num_key_value_heads") == 8
    assert config.get("rope_parameters") == gpt_oss.DEFAULT_ROPE
    assert config.get("hidden_act") is None
    # transformers' default layer_types: the even layers slide.
    assert gpt_oss.gpt_oss_windows(config) == [2, None, 2, None]
    explicit = dict(
        values, layer_types=["full_attention"] * 3 + ["sliding_attention"]
    )
    windows = gpt_oss.gpt_oss_windows(
        gpt_oss.gpt_oss_config(configs.HFConfig(explicit))
    )
    assert windows == [None, None, None, 2]
    moe = gpt_oss.moe_arguments(config)
    assert (moe["glu_alpha"], moe["glu_limit"]) == (1.702, 7.0)
    assert moe["routing"] == "topk_softmax"


@pytest.mark.parametrize(
    "option, match",
    [
        (
            {"quantization_config": {"quant_method": "mxfp4"}},
            r"quantization_config \(quant_method='mxfp4'\).*dequantize",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1e4,
                    "partial_rotary_factor": 0.5,
                }
            },
            "partial_rotary_factor=0.5",
        ),
        (
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
            "'dynamic'",
        ),
    ],
)
def test_unsupported_options_are_refused_by_name(option, match):
    with pytest.raises(ValueError, match=match):
        gpt_oss.convert_gpt_oss(
            configs.HFConfig(dict(TINY, **option)), "float32"
        )
