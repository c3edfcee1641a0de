"""Measures how equal `keras_attention.interop.from_keras_hub` models are
to their keras-hub backbones, on the current Keras backend.

Random backbones (no downloads) of 4 layers, hidden size 64 (4 heads; 2
key/value heads for Llama, Mistral and Gemma, Mistral's and Gemma 2's
windows 16, Gemma 2's attention soft-cap 5; Llama 3.1's RoPE frequency
adjustment over a pretraining length of 16 and Mistral's RoPE scaling
factor 4; Gemma's query
scaling by `(hidden / heads) ** -0.5` set on its attention layers; T5
1.1 with heads of 16; SmolLM3 without RoPE on layer 3; gpt-oss with
its window 16 on the odd layers and YaRN of factor 32; noise
added to every weight, so that norms are not the identity), a batch of 4
sequences of 64 tokens with padding (right-padded rows, and a left-padded
one for the causal models; T5: both stacks right-padded; for ViT, 4
random 32 x 32 images); prints
the largest absolute difference of each output over the real positions,
as a Markdown table row per family:

    KERAS_BACKEND=jax python tools/interop_equality.py

The figures are those of docs/guides/pretrained.md.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
from keras.ops import convert_to_numpy as to_numpy  # noqa: E402

from keras_attention.interop import from_keras_hub  # noqa: E402

LENGTH, BATCH, VOCAB = 64, 4, 100
REAL_LENGTHS = (64, 40, 17, 50)


def backbones():
    models = keras_hub.models
    common = dict(
        vocabulary_size=VOCAB, num_layers=4, hidden_dim=64, intermediate_dim=128
    )
    llama_style = dict(num_query_heads=4, num_key_value_heads=2, **common)
    return {
        "BERT": models.BertBackbone(
            num_heads=4, max_sequence_length=LENGTH, **common
        ),
        "GPT-2": models.GPT2Backbone(
            num_heads=4, max_sequence_length=LENGTH, **common
        ),
        "Llama": models.LlamaBackbone(**llama_style),
        "Mistral": models.MistralBackbone(sliding_window=16, **llama_style),
        "Gemma": models.GemmaBackbone(head_dim=16, **llama_style),
        "Gemma 2": models.GemmaBackbone(
            head_dim=16,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            attention_logit_soft_cap=5.0,
            final_logit_soft_cap=30.0,
            use_sliding_window_attention=True,
            sliding_window_size=16,
            **llama_style,
        ),
        "Llama 3.1 (RoPE scaling)": models.Llama3Backbone(
            rope_frequency_adjustment_factor=8.0,
            rope_low_freq_factor=1.0,
            rope_high_freq_factor=4.0,
            rope_pretraining_sequence_length=16,
            **llama_style,
        ),
        "Mistral (RoPE scaling 4)": models.MistralBackbone(
            sliding_window=16, rope_scaling_factor=4.0, **llama_style
        ),
        "Gemma (query scaling)": _query_scaled(
            models.GemmaBackbone(
                head_dim=16, query_head_dim_normalize=False, **llama_style
            )
        ),
        "BLOOM": models.BloomBackbone(num_heads=4, **common),
        "Phi-3 (LongRoPE)": models.Phi3Backbone(
            rope_scaling_type="su",
            rope_scaling_short_factor=[1.0 + 0.1 * k for k in range(8)],
            rope_scaling_long_factor=[2.0 + 0.5 * k for k in range(8)],
            max_sequence_length=256,
            pretraining_sequence_length=32,
            **llama_style,
        ),
        "Gemma 3": models.Gemma3Backbone(
            head_dim=16,
            image_size=None,
            vision_encoder=None,
            use_sliding_window_attention=True,
            sliding_window_size=16,
            global_rope_scaling_factor=8.0,
            **dict(llama_style, num_layers=6),
        ),
        # keras-hub 0.32's Qwen3Attention drops its window where Keras
        # has a fused attention op (JAX, PyTorch): windowed on TF only.
        "Qwen 3": models.Qwen3Backbone(
            head_dim=16,
            sliding_window_size=(
                16 if keras.backend.backend() == "tensorflow" else None
            ),
            **llama_style,
        ),
        "Mixtral (4 experts, top 2)": models.MixtralBackbone(
            sliding_window=16, num_experts=4, top_k=2, **llama_style
        ),
        "Qwen3-MoE (layer 0 dense)": models.Qwen3MoeBackbone(
            head_dim=16,
            moe_intermediate_dim=64,
            num_experts=4,
            top_k=2,
            mlp_only_layers=[0],
            sliding_window_size=None,
            **llama_style,
        ),
        # Learned sinks, a window of 16 on layers 1 and 3, YaRN.
        "gpt-oss (window 16 on odd layers, YaRN 32)": models.GptOssBackbone(
            sliding_window=16,
            rope_scaling_factor=32.0,
            num_experts=4,
            top_k=2,
            **llama_style,
        ),
        "T5 1.1": models.T5Backbone(
            num_heads=4, key_value_dim=16, activation="gelu", **common
        ),
        "ViT": models.ViTBackbone(
            image_shape=(32, 32, 3),
            patch_size=4,
            num_layers=4,
            num_heads=4,
            hidden_dim=64,
            mlp_dim=128,
        ),
        # SmolLM3-3B's pattern: no RoPE on every fourth layer (NoPE).
        "SmolLM3 (NoPE layer 3)": models.SmolLM3Backbone(
            vocabulary_size=VOCAB,
            hidden_dim=64,
            intermediate_dim=128,
            num_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            attention_bias=False,
            attention_dropout=0.0,
            rope_layer_enabled_list=[True, True, True, False],
            layer_types=["attention"] * 4,
            mlp_bias=False,
            layer_norm_epsilon=1e-6,
            max_position_embeddings=LENGTH,
            rope_theta=10000.0,
            partial_rotary_factor=1.0,
        ),
    }


def _query_scaled(backbone):
    """keras-hub 0.32's Gemma decoder block drops the backbone's
    `query_head_dim_normalize`: set it on the attention layers."""
    for layer in backbone.transformer_layers:
        layer.attention.query_head_dim_normalize = False
    return backbone


def _padding(causal):
    padding = np.zeros((BATCH, LENGTH), "int32")
    for row, n in enumerate(REAL_LENGTHS):
        if causal and row == BATCH - 1:
            padding[row, LENGTH - n :] = 1  # left padding
        else:
            padding[row, :n] = 1
    return padding


def inputs(backbone, rng):
    if not isinstance(backbone.input, dict):  # ViT: 4 images, 65 tokens
        return rng.normal(size=(BATCH, 32, 32, 3)).astype("float32")
    if "encoder_token_ids" in backbone.input:  # T5
        out = {}
        for stack in ("encoder", "decoder"):
            padding = _padding(causal=False)
            ids = rng.integers(1, VOCAB, (BATCH, LENGTH)).astype("int32")
            out[f"{stack}_token_ids"] = ids * padding
            out[f"{stack}_padding_mask"] = padding
        return out
    causal = "segment_ids" not in backbone.input
    padding = _padding(causal)
    ids = rng.integers(1, VOCAB, (BATCH, LENGTH)).astype("int32") * padding
    out = {"token_ids": ids, "padding_mask": padding}
    if not causal:
        segments = (np.arange(LENGTH)[None] >= 10).astype("int32")
        out["segment_ids"] = np.repeat(segments, BATCH, 0) * padding
    return out


def perturb(backbone, rng):
    for weight in backbone.weights:
        if weight.path.endswith("inv_freq"):
            continue  # SmolLM3's stored RoPE frequencies (of rope_theta)
        noise = rng.normal(scale=0.1, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)


def errors(backbone, rng):
    perturb(backbone, rng)
    data = inputs(backbone, rng)
    ours, theirs = from_keras_hub(backbone)(data), backbone(data)
    if not isinstance(theirs, dict):
        ours, theirs = {"sequence_output": ours}, {"sequence_output": theirs}
    if not isinstance(data, dict):  # images: no padding
        ours = to_numpy(ours["sequence_output"])
        theirs = to_numpy(theirs["sequence_output"])
        return {"sequence_output": float(np.abs(ours - theirs).max())}
    out = {}
    for key in sorted(theirs):
        stack = key.split("_")[0]  # T5's `encoder_...` / `decoder_...`
        mask = data.get(f"{stack}_padding_mask", data.get("padding_mask"))
        real = mask.astype(bool)
        diff = np.abs(to_numpy(ours[key]) - to_numpy(theirs[key]))
        out[key] = float(diff[real].max() if diff.ndim == 3 else diff.max())
    return out


def main():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    backend = keras.backend.backend()
    print("| family | backend | largest difference (real positions) |")
    print("|---|---|---|")
    for name, backbone in backbones().items():
        found = errors(backbone, rng)
        text = ", ".join(f"`{k}` {v:.1e}" for k, v in found.items())
        print(f"| {name} | {backend} | {text} |", flush=True)


if __name__ == "__main__":
    main()
