"""Tests of `python -m examples.inspect_pretrained` on local keras-hub
presets saved from tiny random backbones (nothing is downloaded): a BERT
with its WordPiece tokenizer and a GPT-2 without one (random token ids),
the equality printed, the statistics, the explorer and the heatmaps."""

import json
import os

import example_output
import numpy as np
import pytest

pytestmark = pytest.mark.tf_only
keras_hub = pytest.importorskip("keras_hub")

VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "because",
    "it",
    "was",
    "tired",
    ".",
]


def _run(argv):
    from examples.inspect_pretrained.__main__ import main

    with example_output.captured() as output:
        results = main(argv)
    return results, output


@pytest.fixture(scope="module")
def bert_preset(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bert_preset"))
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(VOCABULARY),
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=16,
    )
    backbone.save_to_preset(path)
    keras_hub.models.BertTokenizer(
        vocabulary=VOCABULARY, lowercase=True
    ).save_to_preset(path)
    return path


def test_bert_preset_with_its_tokenizer(bert_preset, tmp_path, capsys):
    results, output = _run(
        ["--preset", bert_preset, "--output-dir", str(tmp_path)]
    )
    printed = capsys.readouterr().out
    assert "BertBackbone" in printed and "max |ours - keras-hub|" in printed
    assert "(equal within" in printed
    assert results["equal"] and results["max_difference"] <= 1e-5
    tokens = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "because"]
    assert results["tokens"][: len(tokens)] == tokens
    assert results["tokens"][-1] == "[SEP]"
    assert [layer["layer"] for layer in results["layers"]] == [
        "transformer_layer_0/self_attention",
        "transformer_layer_1/self_attention",
    ]
    n = len(results["tokens"])
    for layer in results["layers"]:
        assert len(layer["entropy"]) == 2
        assert all(0 <= e <= np.log(n) + 1e-6 for e in layer["entropy"])
        assert all(0 <= d <= n - 1 for d in layer["distance"])
        assert all(0 <= p <= 1 for p in layer["first"] + layer["self"])
        assert f"{layer['layer']} mean entropy" in printed
        with open(layer["heatmap"], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(tmp_path / "attention.html", encoding="utf-8") as f:
        html = f.read()
    assert "transformer_layer_1/self_attention" in html
    with open(tmp_path / "stats.json") as f:
        assert json.load(f)["backbone"] == "BertBackbone"
    assert not output.problems()


def test_gpt2_preset_without_a_tokenizer(tmp_path):
    preset = str(tmp_path / "gpt2_preset")
    keras_hub.models.GPT2Backbone(
        vocabulary_size=40,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=12,
    ).save_to_preset(preset)
    out = tmp_path / "out"
    results, _ = _run(["--preset", preset, "--output-dir", str(out)])
    assert results["backbone"] == "GPT2Backbone" and results["equal"]
    # Random ids, as many as the backbone's positions allow.
    assert len(results["tokens"]) == 12
    (layer,) = results["layers"]
    assert os.path.isfile(out / "heatmaps" / "layer_00.png")
    assert os.path.isfile(out / "attention.html")
    assert all(0 <= p <= 1 for p in layer["first"])


# The families of issue 38 (QK-norm, interleaved windows, LongRoPE):
# tiny random backbones saved as presets, no tokenizer.
MODERN = {
    "Qwen3Backbone": dict(head_dim=4, sliding_window_size=None),
    "Gemma3Backbone": dict(
        head_dim=4,
        image_size=None,
        vision_encoder=None,
        use_sliding_window_attention=True,
        sliding_window_size=3,
    ),
    # Learned sinks, experts (one layer: the full-attention one).
    "GptOssBackbone": dict(num_experts=4, top_k=2, sliding_window=3),
    # Experts routed top-k-then-softmax (Mixtral) and softmax-then-top-k
    # (Qwen3-MoE).
    "MixtralBackbone": dict(num_experts=4, top_k=2, sliding_window=3),
    "Qwen3MoeBackbone": dict(
        head_dim=4, moe_intermediate_dim=8, num_experts=4, top_k=2
    ),
    # Gated attention, half of each head rotated (one layer: the
    # full-attention one; a gated delta net's matrix is no softmax).
    "Qwen3_5Backbone": dict(
        head_dim=4,
        partial_rotary_factor=0.5,
        layer_types=["full_attention"],
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=4,
        linear_value_head_dim=4,
    ),
    "Phi3Backbone": dict(
        rope_scaling_type="su",
        rope_scaling_short_factor=[1.0, 1.2],
        rope_scaling_long_factor=[2.0, 3.0],
        max_sequence_length=32,
        pretraining_sequence_length=4,
    ),
}


@pytest.mark.parametrize("name", sorted(MODERN))
def test_modern_families_without_a_tokenizer(name, tmp_path):
    preset = str(tmp_path / "preset")
    cls = getattr(keras_hub.models, name)
    cls(
        vocabulary_size=40,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=8,
        intermediate_dim=16,
        **MODERN[name],
    ).save_to_preset(preset)
    out = tmp_path / "out"
    results, _ = _run(
        ["--preset", preset, "--output-dir", str(out), "--length", "8"]
    )
    assert results["backbone"] == name and results["equal"]
    (layer,) = results["layers"]
    assert os.path.isfile(out / "attention.html")
    assert all(0 <= p <= 1 for p in layer["first"])


def test_smollm3_with_a_nope_layer(tmp_path):
    # SmolLM3 names its arguments its own way; layer 1 without RoPE.
    preset = str(tmp_path / "preset")
    keras_hub.models.SmolLM3Backbone(
        vocabulary_size=40,
        hidden_dim=8,
        intermediate_dim=16,
        num_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        attention_bias=False,
        attention_dropout=0.0,
        rope_layer_enabled_list=[True, False],
        layer_types=["attention"] * 2,
        mlp_bias=False,
        layer_norm_epsilon=1e-6,
        max_position_embeddings=32,
        rope_theta=10000.0,
        partial_rotary_factor=1.0,
    ).save_to_preset(preset)
    out = tmp_path / "out"
    results, _ = _run(
        ["--preset", preset, "--output-dir", str(out), "--length", "8"]
    )
    assert results["backbone"] == "SmolLM3Backbone" and results["equal"]
    assert len(results["layers"]) == 2
    assert os.path.isfile(out / "attention.html")


@pytest.mark.parametrize(
    "preset, message",
    [
        ("./no_such_directory", "No keras-hub preset in the directory"),
        ("no_such_preset_name", "Unknown keras-hub preset"),
    ],
)
def test_missing_preset_says_how_to_get_one(preset, message, capsys):
    from examples.inspect_pretrained.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--preset", preset])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert message in error
    if preset.startswith("."):
        assert "save_to_preset" in error


def test_statistics_of_a_known_pattern():
    from examples.inspect_pretrained.stats import head_statistics

    identity = np.eye(4)[None]
    first = np.zeros((1, 4, 4))
    first[..., 0] = 1.0
    stats = head_statistics(np.concatenate([identity, first]))
    np.testing.assert_allclose(stats["entropy"], [0, 0], atol=1e-12)
    np.testing.assert_allclose(stats["self"], [1, 0.25])
    np.testing.assert_allclose(stats["first"], [0.25, 1])
    np.testing.assert_allclose(stats["distance"], [0, 1.5])
    with pytest.raises(ValueError, match="weights.shape"):
        head_statistics(np.ones((4, 4)))


@pytest.mark.filterwarnings("ignore:Layer .* does not support masking")
def test_t5_preset_encoder_decoder_and_cross_attention(tmp_path):
    preset = str(tmp_path / "t5_preset")
    keras_hub.models.T5Backbone(
        vocabulary_size=40,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
    ).save_to_preset(preset)
    out = tmp_path / "out"
    results, _ = _run(
        ["--preset", preset, "--output-dir", str(out), "--length", "10"]
    )
    assert results["backbone"] == "T5Backbone" and results["equal"]
    assert len(results["tokens"]) == 10
    names = [layer["layer"] for layer in results["layers"]]
    assert names == [
        "transformer_encoder_layer_0/self_attention",
        "transformer_decoder_layer_0/self_attention",
        "transformer_decoder_layer_0/cross_attention",
    ]
    for index, layer in enumerate(results["layers"]):
        assert os.path.isfile(out / "heatmaps" / f"layer_{index:02d}.png")
        assert all(0 <= p <= 1 for p in layer["first"] + layer["self"])
    # The decoder's self-attention is causal: the first query sees only
    # itself.
    assert results["layers"][1]["distance"][0] <= 9
