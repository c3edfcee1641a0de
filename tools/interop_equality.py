"""Measures how equal `keras_attention.interop.from_keras_hub` models are
to their keras-hub backbones, and their logits and greedy generation to
keras-hub's `CausalLM` tasks (T5's `T5Seq2SeqLM`).

Random backbones (no downloads) of 4 layers, hidden size 64 (4 heads; 2
key/value heads for the Llama-style families, Mistral's, Mixtral's and
Gemma 2's windows 16, Gemma 2's attention soft-cap 5 and final soft-cap
30; Llama 3.1's RoPE frequency adjustment over a pretraining length of
16 and Mistral's RoPE scaling factor 4; Gemma's query scaling by
`(hidden / heads) ** -0.5` set on its attention layers; Phi-3's LongRoPE
over a pretraining length of 32; Gemma 3 with 6 layers (5 windowed, 16,
to 1 global with RoPE scaling 8); Gemma 4 with 6 layers (sliding and
full alternating, window 16, heads of 16 and 32, K = V on the full
layers, the last two sharing the keys and values of layers 2 and 3);
Qwen 3 windowed (16) on TensorFlow
only; Mixtral and Qwen3-MoE with 4 experts, top 2 (Qwen3-MoE's layer 0
dense); T5 1.1 with heads of 16; SmolLM3 without RoPE on layer 3;
gpt-oss with its window 16 on the odd layers and YaRN of factor 32;
Qwen 3.5 with gated delta nets on layers 0-2 and gated attention on
layer 3, windowed (16) on TensorFlow only; ALBERT with embeddings of 32
projected to 64 and 4 layers as 2 groups of 2 shared layers (8 layer
calls of 4 blocks); ELECTRA with embeddings of 32 projected to 64; Qwen
2 with its q, k, v biases and RoPE scaling 2; Qwen-MoE and Qwen 3.5-MoE
with 4 experts, top 2, and the gated shared expert; Falcon's ALiBi;
noise added to every weight, so that norms are not the identity):

- hidden states: a batch of 4 sequences of 64 tokens with padding
  (right-padded rows, and a left-padded one for the causal models and
  the encoders without token types; T5:
  both stacks right-padded; for ViT, 4 random 32 x 32 images; ESM-2
  and RoFormer-v2 without padding, as keras-hub masks their padded
  queries, not keys, on TensorFlow and JAX), the
  largest absolute difference of each output over the real positions;
- logits (causal families, T5's decoder): the same batch, our
  `interop.causal_lm_generator(model).logits` (T5: `seq2seq_generator`)
  of the last block's output against keras-hub's
  `<Family>CausalLM(backbone, preprocessor=None)` (`T5Seq2SeqLM`), the
  largest absolute difference over the real positions;
- greedy generation (causal families, T5): 4 right-padded prompts of 8,
  5, 3 and 6 tokens completed to 32 tokens by our
  `causal_lm_generator(model).generate(..., sampler="greedy")` and by
  keras-hub's `CausalLM.generate` (greedy; Qwen 3.5, Qwen 3.5-MoE and
  GPT-NeoX: greedy decoding driven by keras-hub's forward pass, as their
  `generate` prefills the gated delta rule over the padded buffer, or
  rotates a cached step's query at position 0), the number of generated
  tokens that are equal (T5: the prompts as sources, targets of 1 to 3
  tokens from the start token 0 completed to 32).

One backend (Markdown rows, or `--json`; `--only TEXT` for the
families whose name contains TEXT):

    KERAS_BACKEND=jax python tools/interop_equality.py

All three, each in a subprocess, into the table that
docs/guides/pretrained.md includes:

    python tools/interop_equality.py --markdown PATH

with PATH docs/_generated/interop_equality.md.

`from_huggingface` against transformers (tools/hf_equality.py, on the
cases of tests/interop/hf_cases.py, this backend), into the table that
docs/guides/checkpoints.md includes:

    python tools/interop_equality.py --huggingface PATH

with PATH docs/_generated/hf_equality.md.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# keras-hub's T5 attention drops Keras masks (it takes its own).
warnings.filterwarnings("ignore", message=".*does not support masking")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
from keras.ops import convert_to_numpy as to_numpy  # noqa: E402

from keras_attention.interop import causal_lm_generator  # noqa: E402
from keras_attention.interop import from_keras_hub  # noqa: E402
from keras_attention.interop import seq2seq_generator  # noqa: E402

LENGTH, BATCH, VOCAB = 64, 4, 100
REAL_LENGTHS = (64, 40, 17, 50)
PROMPT_LENGTHS, PROMPT_LENGTH, NEW_TOKENS = (8, 5, 3, 6), 8, 24
TARGET_PROMPT_LENGTHS = (1, 3, 1, 2)  # T5: the start token, maybe more
AUDIO_SAMPLES, AUDIO_LENGTHS = 16000, (16000, 10000, 6000, 12000)  # Moonshine
BACKENDS = ("tensorflow", "jax", "torch")
LABELS = {"tensorflow": "TF", "jax": "JAX", "torch": "torch"}


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
        "RoBERTa": models.RobertaBackbone(
            num_heads=4, max_sequence_length=LENGTH, **common
        ),
        "XLM-RoBERTa": models.XLMRobertaBackbone(
            num_heads=4, max_sequence_length=LENGTH, **common
        ),
        "DistilBERT": models.DistilBertBackbone(
            num_heads=4, max_sequence_length=LENGTH, **common
        ),
        # Embeddings of 32 projected to 64; 2 groups of 2 shared layers,
        # each group run twice (8 layer calls of 4 blocks).
        "ALBERT (2 groups of 2 shared layers, embedding 32)": (
            models.AlbertBackbone(
                num_heads=4,
                embedding_dim=32,
                num_groups=2,
                num_inner_repetitions=2,
                max_sequence_length=LENGTH,
                **common,
            )
        ),
        "ELECTRA (embedding 32)": models.ElectraBackbone(
            vocab_size=VOCAB,
            num_layers=4,
            num_heads=4,
            hidden_dim=64,
            embedding_dim=32,
            intermediate_dim=128,
            max_sequence_length=LENGTH,
        ),
        "GPT-2": models.GPT2Backbone(
            num_heads=4, max_sequence_length=LENGTH, **common
        ),
        "OPT": models.OPTBackbone(
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
        # Parallel residual; 25 % of each head's 16 features rotated.
        "GPT-NeoX (parallel residual, 25 % rotary)": models.GPTNeoXBackbone(
            num_heads=4, rotary_percentage=0.25, **common
        ),
        # ALiBi added before the 1 / sqrt(head_dim) scaling.
        "Falcon (ALiBi)": models.FalconBackbone(
            num_attention_heads=4, **common
        ),
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
        # Layers 4 and 5 (sliding, full) read the keys and values of
        # layers 2 and 3; K = V on the full layers (1 key/value head of
        # 32), heads of 16 on the sliding ones (window 16).
        "Gemma 4 (2 layers sharing KV, K = V, two head sizes)": (
            models.Gemma4Backbone(
                head_dim=16,
                global_head_dim=32,
                num_global_key_value_heads=1,
                image_size=None,
                sliding_window_size=16,
                sliding_window_pattern=2,
                num_kv_shared_layers=2,
                use_double_wide_mlp=True,
                **dict(llama_style, num_layers=6),
            )
        ),
        # Gated delta nets on layers 0-2, gated attention on layer 3
        # (keras-hub's default pattern), half of each head rotated;
        # windowed on TF only, as Qwen 3.
        "Qwen 3.5 (3 gated delta : 1 gated attention)": (
            models.Qwen3_5Backbone(
                head_dim=16,
                partial_rotary_factor=0.5,
                sliding_window_size=(
                    16 if keras.backend.backend() == "tensorflow" else None
                ),
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                **llama_style,
            )
        ),
        # Qwen 2: biases on q, k, v (none on the output); no window
        # (keras-hub 0.32's generate fails with one on TensorFlow).
        "Qwen 2 (q, k, v biases; RoPE scaling 2)": models.Qwen2Backbone(
            rope_scaling_factor=2.0, tie_word_embeddings=False, **llama_style
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
        # Every layer sparse, with the sigmoid-gated shared expert.
        "Qwen-MoE (4 experts, top 2, shared expert)": models.QwenMoeBackbone(
            moe_intermediate_dim=64,
            shared_expert_intermediate_dim=96,
            num_experts=4,
            top_k=2,
            norm_top_k_prob=True,
            **llama_style,
        ),
        # Qwen 3.5's layers (3 gated delta : 1 gated attention), each with
        # 4 experts, top 2, and the gated shared expert; windowed (16) on
        # TensorFlow only, as Qwen 3.5.
        "Qwen 3.5-MoE (3 gated delta : 1 gated attention)": (
            models.Qwen3_5MoeBackbone(
                head_dim=16,
                partial_rotary_factor=0.5,
                sliding_window_size=(
                    16 if keras.backend.backend() == "tensorflow" else None
                ),
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                moe_intermediate_dim=64,
                shared_expert_intermediate_size=96,
                num_experts=4,
                top_k=2,
                vocabulary_size=VOCAB,
                num_layers=4,
                hidden_dim=64,
                num_query_heads=4,
                num_key_value_heads=2,
            )
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
        # BART: one token table for both stacks, learned positions, post-norm.
        "BART": models.BartBackbone(
            num_heads=4, max_sequence_length=LENGTH, **common
        ),
        # T5Gemma: Gemma 2's blocks in both stacks, a window of 16 on the
        # decoder's even layers, soft-caps, query scaling, untied logits.
        "T5Gemma": models.T5GemmaBackbone(
            vocabulary_size=VOCAB,
            sliding_window=16,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            query_pre_attn_scalar=16.0,
            tie_word_embeddings=False,
            **{
                f"{stack}_{key}": value
                for stack in ("encoder", "decoder")
                for key, value in dict(
                    hidden_dim=64,
                    intermediate_dim=128,
                    num_layers=4,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    head_dim=16,
                    layer_types=["sliding_attention", "full_attention"] * 2,
                ).items()
            },
        ),
        # Moonshine: raw audio (1 s: 40 frames), 0.62 of each head rotated.
        "Moonshine": models.MoonshineBackbone(
            vocabulary_size=VOCAB,
            filter_dim=64,
            encoder_num_layers=4,
            decoder_num_layers=4,
            hidden_dim=64,
            intermediate_dim=128,
            encoder_num_heads=4,
            decoder_num_heads=4,
            partial_rotary_factor=0.62,
        ),
        # Whisper: 128 log-mel frames of 8 bins -> 64 encoder positions.
        "Whisper": models.WhisperBackbone(
            num_heads=4,
            num_mels=8,
            max_encoder_sequence_length=2 * LENGTH,
            max_decoder_sequence_length=LENGTH,
            **common,
        ),
        "ViT": models.ViTBackbone(
            image_shape=(32, 32, 3),
            patch_size=4,
            num_layers=4,
            num_heads=4,
            hidden_dim=64,
            mlp_dim=128,
        ),
        "DeiT": models.DeiTBackbone(
            image_shape=(32, 32, 3),
            patch_size=4,
            num_layers=4,
            num_heads=4,
            hidden_dim=64,
            intermediate_dim=128,
        ),
        # 4 registers, layer scale; positions interpolated from 64 x 64.
        "DINOv2": models.DINOV2Backbone(
            patch_size=4,
            num_layers=4,
            hidden_dim=64,
            num_heads=4,
            intermediate_dim=128,
            layer_scale_init_value=0.1,
            num_register_tokens=4,
            image_shape=(32, 32, 3),
            position_embedding_shape=(64, 64, 3),
        ),
        # Quick GELU; the text tower causal, pooled at its largest id.
        "CLIP": models.CLIPBackbone(
            models.CLIPVisionEncoder(4, 64, 4, 4, 128, image_shape=(32, 32, 3)),
            models.CLIPTextEncoder(
                VOCAB, 64, 64, 4, 4, 128, max_sequence_length=16
            ),
            projection_dim=32,
        ),
        # CLIP with its final vision norm on the pooled class token and
        # the text pooled at its first end token (id 2).
        "MetaCLIP 2": models.MetaCLIP2Backbone(
            models.MetaCLIP2VisionEncoder(
                4, 64, 4, 4, 128, image_shape=(32, 32, 3)
            ),
            models.MetaCLIP2TextEncoder(
                VOCAB, 64, 64, 4, 4, 128, max_sequence_length=16
            ),
            projection_dim=32,
        ),
        # Attention pooling (a probe), gelu_approximate; the text pooled
        # at its last token (16 tokens: its full length).
        "SigLIP": models.SigLIPBackbone(
            models.SigLIPVisionEncoder(
                4, 64, 4, 4, 128, image_shape=(32, 32, 3)
            ),
            models.SigLIPTextEncoder(
                VOCAB, 64, 64, 4, 4, 128, max_sequence_length=16
            ),
        ),
        # DeBERTa-v3: log buckets of 16 up to 32, saturated within 64.
        "DeBERTa-v3 (16 buckets up to 32)": models.DebertaV3Backbone(
            num_heads=4, max_sequence_length=32, bucket_size=16, **common
        ),
        # ESM-2: rotary, the layer norm before the blocks, padding id 1.
        "ESM-2": models.ESM2Backbone(
            num_heads=4, use_pre_layer_norm=True, pad_token_id=1, **common
        ),
        # RoFormer-v2: interleaved rotary, scale-only norms, no biases.
        "RoFormer-v2": models.RoformerV2Backbone(
            num_heads=4, head_size=16, **common
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


def image_inputs(backbone, rng):
    """4 random images of the backbone's input shape and, for an
    image-text backbone, 4 sequences of 16 random token ids (no padding:
    CLIP and SigLIP take none)."""
    shape = tuple(backbone.input["images"].shape[1:])
    out = {"images": rng.normal(size=(BATCH, *shape)).astype("float32")}
    if "token_ids" in backbone.input:
        out["token_ids"] = rng.integers(1, VOCAB, (BATCH, 16)).astype("int32")
    return out


def inputs(backbone, rng):
    if not isinstance(backbone.input, dict):  # ViT: 4 images, 65 tokens
        return rng.normal(size=(BATCH, 32, 32, 3)).astype("float32")
    if "images" in backbone.input:  # DINOv2; CLIP, SigLIP: and text
        return image_inputs(backbone, rng)
    if "encoder_input_values" in backbone.input:  # Moonshine: raw audio
        samples = (
            np.arange(AUDIO_SAMPLES)[None] < np.array(AUDIO_LENGTHS)[:, None]
        )
        padding = _padding(causal=False)
        ids = rng.integers(1, VOCAB, (BATCH, LENGTH)).astype("int32")
        audio = rng.normal(size=(BATCH, AUDIO_SAMPLES, 1)) * samples[..., None]
        return {
            "encoder_input_values": audio.astype("float32"),
            "encoder_padding_mask": samples,
            "decoder_token_ids": ids * padding,
            "decoder_padding_mask": padding.astype(bool),
        }
    if "encoder_features" in backbone.input:  # Whisper: log-mel frames
        frames = rng.normal(size=(BATCH, 2 * LENGTH, 8)).astype("float32")
        padding = _padding(causal=False)
        ids = rng.integers(1, VOCAB, (BATCH, LENGTH)).astype("int32")
        return {
            "encoder_features": frames,
            "decoder_token_ids": ids * padding,
            "decoder_padding_mask": padding,
        }
    if "encoder_token_ids" in backbone.input:  # T5
        out = {}
        for stack in ("encoder", "decoder"):
            padding = _padding(causal=False)
            ids = rng.integers(1, VOCAB, (BATCH, LENGTH)).astype("int32")
            out[f"{stack}_token_ids"] = ids * padding
            out[f"{stack}_padding_mask"] = padding
        return out
    if "padding_mask" not in backbone.input:
        # RoFormer-v2, ESM: the mask is read from the token ids (padding
        # id 0, ESM's `pad_token_id`), and keras-hub masks the padded
        # queries, not keys, on TF and JAX: ids above 1, no padding.
        out = {"token_ids": rng.integers(2, VOCAB, (BATCH, LENGTH))}
        if "segment_ids" in backbone.input:
            segments = (np.arange(LENGTH)[None] >= 10).astype("int32")
            out["segment_ids"] = np.repeat(segments, BATCH, 0)
        return {k: v.astype("int32") for k, v in out.items()}
    causal = "segment_ids" not in backbone.input
    padding = _padding(causal)
    ids = rng.integers(1, VOCAB, (BATCH, LENGTH)).astype("int32") * padding
    out = {"token_ids": ids, "padding_mask": padding}
    if "position_ids" in backbone.input:  # Gemma 4: positions 0 .. T - 1
        positions = np.broadcast_to(np.arange(LENGTH), ids.shape)
        out["position_ids"] = positions.astype("int32")
    if not causal:
        segments = (np.arange(LENGTH)[None] >= 10).astype("int32")
        out["segment_ids"] = np.repeat(segments, BATCH, 0) * padding
    return out


def perturb(backbone, rng):
    for weight in backbone.weights:
        if weight.path.endswith("inv_freq"):
            continue  # SmolLM3's stored RoPE frequencies (of rope_theta)
        if not keras.backend.is_float_dtype(weight.dtype):
            continue  # CLIP's and SigLIP's stored position ids
        noise = rng.normal(scale=0.1, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)


def hidden_errors(ours, theirs, data):
    """`{output: largest |difference| over the real positions}`."""
    if not isinstance(theirs, dict):
        ours, theirs = {"sequence_output": ours}, {"sequence_output": theirs}
    if not isinstance(data, dict):  # images: no padding
        ours = to_numpy(ours["sequence_output"])
        theirs = to_numpy(theirs["sequence_output"])
        return {"sequence_output": float(np.abs(ours - theirs).max())}
    out = {}
    frames = theirs.get("encoder_attention_mask")  # Moonshine's real frames
    for key in sorted(theirs):
        stack = key.split("_")[0]  # T5's `encoder_...` / `decoder_...`
        mask = data.get(f"{stack}_padding_mask", data.get("padding_mask"))
        if frames is not None and stack == "encoder":
            if key == "encoder_attention_mask":  # how many differ
                differ = to_numpy(ours[key]) != to_numpy(frames).astype(bool)
                out[key] = float(differ.sum())
                continue
            mask = to_numpy(frames)
        diff = np.abs(to_numpy(ours[key]) - to_numpy(theirs[key]))
        if mask is None:  # RoFormer-v2, ESM: no padding
            mask = np.ones(diff.shape[:2], bool)
        real = mask.astype(bool)
        out[key] = float(diff[real].max() if diff.ndim == 3 else diff.max())
    return out


def _input_names(model):
    """The names of a model's inputs (a dict's keys; none for one tensor
    or a list: images, audio)."""
    inputs = model.input
    return set(inputs) if isinstance(inputs, dict) else set()


def task(backbone):
    """keras-hub's language-model task on `backbone` (`<Family>CausalLM`,
    T5's `T5Seq2SeqLM`), or None (BERT, ViT)."""
    name = type(backbone).__name__.replace("Backbone", "CausalLM")
    if isinstance(backbone, keras_hub.models.T5Backbone):
        name = "T5Seq2SeqLM"
    elif "decoder_token_ids" in _input_names(backbone):  # BART, T5Gemma
        name = type(backbone).__name__.replace("Backbone", "Seq2SeqLM")
    cls = getattr(keras_hub.models, name, None)
    return None if cls is None else cls(backbone=backbone, preprocessor=None)


def generator(model):
    """Our generator on the converted `model` (causal, or T5's)."""
    if "encoder_token_ids" in _input_names(model):
        return seq2seq_generator(model, jit_compile=False)
    return causal_lm_generator(model, jit_compile=False)


def logits_error(model, theirs, data):
    """Largest |difference| of the logits over the real positions: the
    last block's output through our generator's head (`logits`) vs
    keras-hub's task called on the same inputs."""
    ours = generator(model)
    last_block = keras.Model(model.input, ours.blocks[-1].output)
    diff = np.abs(
        to_numpy(ours.logits(last_block(data))) - to_numpy(theirs(data))
    )
    mask = data.get("decoder_padding_mask", data.get("padding_mask"))
    return float(diff[mask.astype(bool)].max())


def prompts(rng):
    """Right-padded prompts (keras-hub's layout) in a buffer of
    `PROMPT_LENGTH + NEW_TOKENS` positions."""
    ids = np.zeros((len(PROMPT_LENGTHS), PROMPT_LENGTH + NEW_TOKENS), "int32")
    for row, n in enumerate(PROMPT_LENGTHS):
        ids[row, :n] = rng.integers(1, VOCAB, n)
    return ids


def t5_greedy_agreement(model, theirs, rng):
    """`(equal, generated)` for T5: sources as the causal prompts, targets
    started by the padding id 0 marked real (T5's start), one to three
    target tokens given, completed to `PROMPT_LENGTH + NEW_TOKENS`."""
    sources = prompts(rng)[:, :PROMPT_LENGTH]
    shape = (len(PROMPT_LENGTHS), PROMPT_LENGTH + NEW_TOKENS)
    targets = np.zeros(shape, "int32")
    start = np.zeros(targets.shape, bool)
    for row, n in enumerate(TARGET_PROMPT_LENGTHS):
        targets[row, 1:n] = rng.integers(1, VOCAB, n - 1)
        start[row, :n] = True
    theirs.compile(sampler="greedy")
    want = theirs.generate(
        {
            "encoder_token_ids": sources,
            "encoder_padding_mask": sources != 0,
            "decoder_token_ids": targets,
            "decoder_padding_mask": start,
        },
        stop_token_ids=None,
    )["decoder_token_ids"]
    got, _ = generator(model).generate(
        sources, targets, max_length=targets.shape[1], padding_mask=start
    )
    equal = to_numpy(got)[~start] == to_numpy(want)[~start]
    return int(equal.sum()), int((~start).sum())


def forward_greedy(backbone, ids, lengths):
    """Greedy decoding driven by the backbone's forward pass: run on the
    growing right-padded buffer, each row's next token the argmax of the
    logits (the reverse embedding) at its last real token."""
    tokens, lengths = np.array(ids), np.array(lengths)
    rows, width = np.arange(len(tokens)), tokens.shape[1]
    while lengths.min() < width:
        mask = np.arange(width)[None] < lengths[:, None]
        hidden = to_numpy(
            backbone({"token_ids": tokens * mask, "padding_mask": mask})
        )
        last = hidden[rows, lengths - 1]
        logits = to_numpy(backbone.token_embedding(last, reverse=True))
        grow = lengths < width
        tokens[rows[grow], lengths[grow]] = logits.argmax(-1)[grow]
        lengths = lengths + grow
    return tokens


# keras-hub tasks whose `generate` is not greedy decoding of their own
# forward pass (compared with the latter).
FORWARD_GREEDY = tuple(
    getattr(keras_hub.models, name)
    for name in ("Qwen3_5CausalLM", "Qwen3_5MoeCausalLM", "GPTNeoXCausalLM")
)


def greedy_agreement(model, theirs, rng):
    """`(equal, generated)`: how many of the generated tokens of our
    greedy `causal_lm_generator(...).generate` equal keras-hub's
    `CausalLM.generate` (greedy) on the same prompts."""
    ids = prompts(rng)
    mask = ids != 0
    theirs.compile(sampler="greedy")
    data = {"token_ids": ids, "padding_mask": mask}
    if isinstance(theirs, FORWARD_GREEDY):
        # Their generate differs from their forward pass: Qwen 3.5's
        # (and 3.5-MoE's) prefills the gated delta rule over the padded
        # buffer (docs/pretrained/qwen3_5.md), GPT-NeoX's rotates a cached
        # step's query at position 0 (docs/pretrained/gpt_neox.md):
        # greedy decoding driven by their forward pass instead.
        want = forward_greedy(theirs.backbone, ids, mask.sum(-1))
    elif isinstance(
        theirs,
        (keras_hub.models.Gemma3CausalLM, keras_hub.models.Gemma4CausalLM),
    ):
        # keras-hub 0.32's Gemma3CausalLM.generate (and Gemma 4's) needs a
        # preprocessor:
        # its generate function, called directly.
        want = theirs.make_generate_function()(data)["token_ids"]
    else:
        want = theirs.generate(data, stop_token_ids=None)["token_ids"]
    ours = causal_lm_generator(model, jit_compile=False)
    got, _ = ours.generate(
        ids, max_length=ids.shape[1], sampler="greedy", padding_mask=mask
    )
    new = ~mask
    equal = to_numpy(got)[new] == to_numpy(want)[new]
    return int(equal.sum()), int(new.sum())


def measure(name, backbone, rng):
    """One family's figures on the current backend, a JSON-able dict."""
    start = time.perf_counter()
    perturb(backbone, rng)
    data = inputs(backbone, rng)
    model = from_keras_hub(backbone)
    found = {
        "family": name,
        "backbone": type(backbone).__name__,
        "hidden": hidden_errors(model(data), backbone(data), data),
    }
    theirs = task(backbone)
    if theirs is not None:
        found["logits"] = logits_error(model, theirs, data)
        agreement = (
            t5_greedy_agreement
            if isinstance(theirs, keras_hub.models.Seq2SeqLM)
            else greedy_agreement
        )
        found["greedy"] = agreement(model, theirs, rng)
    found["seconds"] = round(time.perf_counter() - start, 1)
    return found


def run_backend(only=None):
    """Every family (or those whose name contains `only`) on the current
    backend: a list of `measure` dicts."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    results = []
    for name, backbone in backbones().items():
        if only and only.lower() not in name.lower():
            continue
        results.append(measure(name, backbone, rng))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def _number(value):
    return "0" if value == 0 else f"{value:.1e}"


def _hidden_cell(per_backend):
    """`a, b, c` per backend; outputs named when there are several."""
    keys = list(per_backend[0]["hidden"])
    if len(keys) == 1:
        return ", ".join(_number(r["hidden"][keys[0]]) for r in per_backend)
    return "; ".join(
        f"`{key}` " + ", ".join(_number(r["hidden"][key]) for r in per_backend)
        for key in keys
    )


def _logits_cell(per_backend):
    if "logits" not in per_backend[0]:
        return "—"
    return ", ".join(_number(r["logits"]) for r in per_backend)


def _greedy_cell(per_backend):
    if "greedy" not in per_backend[0]:
        return "—"
    return ", ".join(f"{r['greedy'][0]}/{r['greedy'][1]}" for r in per_backend)


def markdown(results, backends=BACKENDS):
    """One Markdown table from `{backend: run_backend()}`."""
    names = ", ".join(LABELS[b] for b in backends)
    lines = [
        f"| family | hidden states ({names}) | logits ({names}) "
        f"| greedy tokens equal ({names}) |",
        "|---|---|---|---|",
    ]
    for rows in zip(*(results[b] for b in backends)):
        family = f"{rows[0]['family']} (`{rows[0]['backbone']}`)"
        lines.append(
            f"| {family} | {_hidden_cell(rows)} | {_logits_cell(rows)} "
            f"| {_greedy_cell(rows)} |"
        )
    return "\n".join(lines) + "\n"


def run_all(path):
    """Runs every backend in a subprocess and writes the table to `path`."""
    results = {}
    for backend in BACKENDS:
        start = time.perf_counter()
        env = dict(os.environ, KERAS_BACKEND=backend)
        done = subprocess.run(
            [sys.executable, __file__, "--json"],
            env=env,
            stdout=subprocess.PIPE,
            check=True,
            text=True,
        )
        results[backend] = json.loads(done.stdout)
        seconds = time.perf_counter() - start
        print(f"{backend}: {seconds:.0f} s", file=sys.stderr, flush=True)
    with open(path, "w", encoding="utf-8") as file:
        file.write(markdown(results))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        help="run TensorFlow, JAX and PyTorch (subprocesses), write the table",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="the current backend's figures as JSON on stdout",
    )
    parser.add_argument(
        "--only", help="the families whose name contains this text"
    )
    parser.add_argument(
        "--huggingface",
        metavar="PATH",
        help="from_huggingface against transformers on the cases of "
        "tests/interop/hf_cases.py (this backend; tools/hf_equality.py), "
        "write the table",
    )
    args = parser.parse_args()
    if args.huggingface:
        import hf_equality  # tools/hf_equality.py, beside this script

        hf_equality.run(args.huggingface)
        return
    if args.markdown:
        run_all(args.markdown)
        return
    results = run_backend(args.only)
    if args.json:
        print(json.dumps(results))
        return
    backend = keras.backend.backend()
    print(markdown({backend: results}, backends=(backend,)), end="")


if __name__ == "__main__":
    main()
