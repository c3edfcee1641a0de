"""Greedy generation of converted decoder-only keras-hub models with our
cached generator (`interop.causal_lm_generator`) gives the tokens of
keras-hub's `CausalLM.generate` on the same prompts. Backend-neutral."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier

from keras_attention.interop import causal_lm_generator
from keras_attention.interop import from_keras_hub
from keras_attention.interop import seq2seq_generator

keras_hub = pytest.importorskip("keras_hub")
pytestmark = family_tier()

VOCAB, LENGTH = 30, 10
# Right-padded prompts (keras-hub's layout) of 3 and 5 tokens.
PROMPTS = np.array([[5, 7, 9] + [0] * 7, [3, 4, 11, 12, 13] + [0] * 5], "int32")


def tiny(name):
    models = keras_hub.models
    common = dict(
        vocabulary_size=VOCAB, num_layers=2, hidden_dim=16, intermediate_dim=16
    )
    llama_style = dict(num_query_heads=4, num_key_value_heads=2, **common)
    if name == "gpt2":
        backbone = models.GPT2Backbone(
            num_heads=4, max_sequence_length=LENGTH, **common
        )
        return backbone, models.GPT2CausalLM
    if name == "llama":
        return models.LlamaBackbone(**llama_style), models.LlamaCausalLM
    if name == "llama31":  # RoPE scaling: the blocks' rotary_scaling
        backbone = models.Llama3Backbone(
            rope_frequency_adjustment_factor=8.0,
            rope_low_freq_factor=1.0,
            rope_high_freq_factor=4.0,
            rope_pretraining_sequence_length=8,
            **llama_style,
        )
        return backbone, models.Llama3CausalLM
    if name == "mistral_scaled":
        backbone = models.MistralBackbone(
            sliding_window=3, rope_scaling_factor=4.0, **llama_style
        )
        return backbone, models.MistralCausalLM
    if name == "gemma":
        backbone = models.GemmaBackbone(head_dim=4, **llama_style)
        return backbone, models.GemmaCausalLM
    if name == "gemma2":
        backbone = models.GemmaBackbone(
            head_dim=4,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            attention_logit_soft_cap=1.0,
            final_logit_soft_cap=2.0,
            use_sliding_window_attention=True,
            sliding_window_size=3,
            **llama_style,
        )
        return backbone, models.GemmaCausalLM
    if name == "bloom":
        backbone = models.BloomBackbone(num_heads=4, **common)
        return backbone, models.BloomCausalLM
    if name == "gemma3":  # 5 windowed layers : 1 global, QK-norm.
        backbone = models.Gemma3Backbone(
            head_dim=4,
            image_size=None,
            vision_encoder=None,
            use_sliding_window_attention=True,
            sliding_window_size=3,
            **dict(llama_style, num_layers=6, intermediate_dim=32),
        )
        return backbone, models.Gemma3CausalLM
    if name == "phi3":
        # LongRoPE ("su") over a pretraining length the generation does not
        # pass (past it, keras-hub's cached generation and its forward
        # disagree: `convert_phi3` says why).
        backbone = models.Phi3Backbone(
            rope_scaling_type="su",
            rope_scaling_short_factor=[1.0, 1.3],
            rope_scaling_long_factor=[1.5, 4.0],
            max_sequence_length=64,
            pretraining_sequence_length=LENGTH,
            **llama_style,
        )
        return backbone, models.Phi3CausalLM
    if name == "qwen3":  # QK-norm; a window shorter than the outputs.
        backbone = models.Qwen3Backbone(
            head_dim=4, sliding_window_size=4, **llama_style
        )
        return backbone, models.Qwen3CausalLM
    if name == "mixtral":  # experts; a window shorter than the outputs
        backbone = models.MixtralBackbone(
            num_experts=4, top_k=2, sliding_window=3, **llama_style
        )
        return backbone, models.MixtralCausalLM
    if name == "qwen3_moe":  # a dense layer, an MoE layer
        # keras-hub 0.32's Qwen3MoeAttention drops its window where Keras
        # has a fused attention op (JAX, PyTorch): a window on TF only.
        window = 4 if keras.backend.backend() == "tensorflow" else None
        backbone = models.Qwen3MoeBackbone(
            head_dim=4,
            sliding_window_size=window,
            moe_intermediate_dim=8,
            num_experts=4,
            top_k=2,
            mlp_only_layers=[0],
            **llama_style,
        )
        return backbone, models.Qwen3MoeCausalLM
    if name == "smollm3":  # RoPE on layers 0-2, none on layer 3 (NoPE)
        backbone = models.SmolLM3Backbone(
            vocabulary_size=VOCAB,
            hidden_dim=16,
            intermediate_dim=16,
            num_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            attention_bias=False,
            attention_dropout=0.0,
            rope_layer_enabled_list=[True, True, True, False],
            layer_types=["attention"] * 4,
            mlp_bias=False,
            layer_norm_epsilon=1e-6,
            max_position_embeddings=32,
            rope_theta=10000.0,
            partial_rotary_factor=1.0,
        )
        return backbone, models.SmolLM3CausalLM
    if name == "gpt_oss":  # sinks, YaRN; layer 1 windowed: a mixed cache
        backbone = models.GptOssBackbone(
            num_experts=4,
            top_k=2,
            sliding_window=3,
            rope_scaling_factor=4.0,
            **llama_style,
        )
        return backbone, models.GptOssCausalLM
    # A window shorter than the outputs: our generator's rolling cache.
    backbone = models.MistralBackbone(sliding_window=3, **llama_style)
    return backbone, models.MistralCausalLM


# Every family on TensorFlow and PyTorch. On JAX, keras-hub's `generate`
# compiles a whole XLA while loop per family (~5-8 s each on the idle
# 2-core machine): the fast tier keeps one family per cache kind our
# generator picks (full: GPT-2, Llama; rolling: Mistral; mixed: Gemma 3;
# mixed with learned sinks and experts: gpt-oss); the others run on JAX
# with SLOW=1, and `tools/interop_equality.py` measures every family on
# the three backends (docs/_generated/interop_equality.md).
JAX_FAST = ("gpt2", "llama", "mistral", "gemma3", "gpt_oss")
FAMILIES = (
    "gpt2",
    "llama",
    "llama31",
    "mistral",
    "mistral_scaled",
    "gemma",
    "gemma2",
    "bloom",
    "qwen3",
    "gemma3",
    "phi3",
    "gpt_oss",
    "smollm3",
    "mixtral",
    "qwen3_moe",
)


def _family(name):
    if keras.backend.backend() != "jax" or name in JAX_FAST:
        return name
    reason = "on JAX: one family per cache kind in the fast tier (JAX_FAST)"
    return pytest.param(name, marks=pytest.mark.slow(reason))


@pytest.mark.parametrize("name", [_family(name) for name in FAMILIES])
def test_greedy_tokens_equal_keras_hub(name):
    keras.utils.set_random_seed(2)
    backbone, causal_lm_class = tiny(name)
    padding_mask = PROMPTS != 0
    theirs = causal_lm_class(backbone=backbone, preprocessor=None)
    theirs.compile(sampler="greedy")
    inputs = {"token_ids": PROMPTS, "padding_mask": padding_mask}
    if name == "gemma3":
        # keras-hub 0.32's Gemma3CausalLM.generate needs a preprocessor
        # (it fails without one): its generate function, called directly.
        want = theirs.make_generate_function()(inputs)["token_ids"]
    else:
        want = theirs.generate(inputs, stop_token_ids=None)["token_ids"]
    ours = causal_lm_generator(from_keras_hub(backbone), jit_compile=False)
    got, _ = ours.generate(
        PROMPTS, max_length=LENGTH, sampler="greedy", padding_mask=padding_mask
    )
    np.testing.assert_array_equal(to_numpy(got), to_numpy(want))


def test_not_a_converted_decoder_only_model():
    ids = keras.Input((None,), dtype="int32")
    hidden = keras.layers.Embedding(VOCAB, 8)(ids)
    model = keras.Model(ids, keras.layers.LayerNormalization()(hidden))
    with pytest.raises(ValueError, match="decoder-only"):
        causal_lm_generator(model)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.filterwarnings("ignore:Layer .* does not support masking")
def test_t5_greedy_tokens_equal_keras_hub(tied):
    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.T5Backbone(
        vocabulary_size=VOCAB,
        num_layers=2,
        num_heads=4,
        hidden_dim=16,
        intermediate_dim=32,
        key_value_dim=6,
        activation="gelu",
        tie_embedding_weights=tied,
    )
    rng = np.random.default_rng(0)
    for weight in backbone.weights:  # varied tokens, not one repeated
        noise = rng.normal(scale=0.5, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)
    sources = np.array(
        [[5, 7, 9, 4, 0, 0], [3, 4, 11, 12, 13, 8]], "int32"
    )  # right-padded with 0
    # T5 starts its targets with the padding id 0, marked real.
    prompts = np.zeros((2, LENGTH), "int32")
    prompts[1, 1] = 6  # a second prompt token in one row
    start = np.zeros((2, LENGTH), bool)
    start[:, 0] = True
    start[1, 1] = True
    theirs = keras_hub.models.T5Seq2SeqLM(backbone=backbone, preprocessor=None)
    theirs.compile(sampler="greedy")
    want = theirs.generate(
        {
            "encoder_token_ids": sources,
            "encoder_padding_mask": sources != 0,
            "decoder_token_ids": prompts,
            "decoder_padding_mask": start,
        },
        stop_token_ids=None,
    )["decoder_token_ids"]
    ours = seq2seq_generator(from_keras_hub(backbone), jit_compile=False)
    got, _ = ours.generate(
        sources, prompts, max_length=LENGTH, padding_mask=start
    )
    np.testing.assert_array_equal(to_numpy(got), to_numpy(want))
    assert len(np.unique(to_numpy(got)[:, 2:])) > 1  # not one token


def test_seq2seq_generator_refuses_a_decoder_only_model():
    backbone, _ = tiny("llama")
    with pytest.raises(ValueError, match="encoder-decoder"):
        seq2seq_generator(from_keras_hub(backbone))
