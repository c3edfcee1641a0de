"""The tiny Hugging Face configs of `from_huggingface`'s tests and of
`tools/interop_equality.py --huggingface`, in one place: one case per
family (a `model_type` and its `config.json` fields), each family's
distinctive options on. `hf_reference.py` builds the transformers model
of a case from them (random weights, `torch.manual_seed`), saves it and
writes its outputs; the tests and the tool convert the saved checkpoint
and compare. No transformers import here: the TensorFlow process reads
this module too."""

VOCAB = 24
NEW_TOKENS = 8  # greedy tokens generated per prompt
# A batch of 2 x 8: row 0 right-padded (5 real tokens), row 1 left-padded
# (6 real tokens); padding id 0.
TOKEN_IDS = (
    (5, 7, 9, 3, 11, 0, 0, 0),
    (0, 0, 4, 8, 15, 2, 6, 13),
)
PADDING_MASK = (
    (1, 1, 1, 1, 1, 0, 0, 0),
    (0, 0, 1, 1, 1, 1, 1, 1),
)
# Prompts of the greedy comparison (unpadded; our generator pads them
# on the right, transformers generates each alone).
PROMPTS = ((5, 7, 9), (3, 4, 11, 12, 13))
# Token types (BERT's `token_type_ids`, our `segment_ids`) of the
# encoders whose config has more than one type; the others get none.
SEGMENT_IDS = (
    (0, 0, 1, 1, 1, 0, 0, 0),
    (0, 0, 0, 0, 1, 1, 1, 1),
)
# The encoders' model types: `hf_reference.py` builds them with
# `AutoModel` (the base model, no LM head) and generates nothing; their
# cases say `greedy=False`.
ENCODERS = ("bert", "modernbert", "roberta")

# A case: `model_type`, `config` (config.json's fields) and optionally
# `noise` (the std of the noise `hf_reference.py` adds to every weight;
# default `NOISE`: Gemma 2 and 3, whose post-norms leave the residual to
# the scaled embedding, take smaller weights for varied greedy tokens)
# and `greedy` (False: greedy tokens not compared, the case says why)
# and `noise_buffers` (suffixes of buffer names that get the noise too:
# DeepSeek-style score-correction biases) and `sharpen_indexer` (True:
# DeepSeek-V3.2's indexers get clear gaps, `hf_indexer.py`)
# and `hidden_rows` (the rows of `TOKEN_IDS` whose hidden states are
# compared, all by default: Llama 4 compares its unpadded row only);
# `about`: its distinctive options, for the docs' table.
NOISE = 0.1

# The fields most tiny configs share: 2 layers, hidden size 16, 4 query
# heads of 8 (an explicit `head_dim` other than hidden / heads), 2
# key/value heads; `initializer_range` large enough, with the noise
# `hf_reference.py` adds to every weight (norm scales included), for
# varied greedy tokens.
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    initializer_range=0.5,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
)

# The families whose config has no `head_dim` (Phi-3, SmolLM3, Qwen 2,
# OLMo 2): heads of 32 / 4 = 8.
NO_HEAD_DIM = {k: v for k, v in COMMON.items() if k != "head_dim"}
NO_HEAD_DIM["hidden_size"] = 32

PHI3 = dict(
    NO_HEAD_DIM,
    sliding_window=4,
    original_max_position_embeddings=16,
    partial_rotary_factor=0.5,
    rope_parameters=dict(
        rope_type="longrope",
        rope_theta=1e4,
        partial_rotary_factor=0.5,
        short_factor=[1.0, 1.5],
        long_factor=[2.0, 3.0],
    ),
)

# The encoders' tiny configs: 2 layers, hidden size 32, 4 heads of 8.
ENCODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    initializer_range=0.5,
    pad_token_id=0,
)

# DeepSeek-V3's sizes, tiny (`deepseek_v3`, `deepseek_v32`).
DEEPSEEK_V3 = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    intermediate_size=32,
    moe_intermediate_size=8,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=8,
    q_lora_rank=12,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=6,
    rope_interleave=True,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_group=4,
    topk_group=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=1e4,
        factor=4.0,
        original_max_position_embeddings=16,
        beta_fast=4.0,
        beta_slow=1.0,
        mscale=0.8,
        mscale_all_dim=1.0,
    ),
    max_position_embeddings=64,
    initializer_range=0.5,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
)

CASES = {
    # BERT: token types, the exact (erf) GELU, layer norm epsilon 1e-6;
    # positions from the first column, padding included.
    "bert": dict(
        model_type="bert",
        about="token types (segment_ids), exact GELU, epsilon 1e-6; "
        "encoder: no greedy",
        config=dict(
            ENCODER, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-6
        ),
        greedy=False,
    ),
    # DeepSeek-V3: latent attention (key/value latent 8, query latent 12,
    # interleaved rope pairs of 4) with YaRN (factor 4 over 16 positions,
    # mscale 0.8 / mscale_all_dim 1: cos, sin and the softmax scale);
    # layer 0 dense, layer 1 the MoE: 8 experts in 4 groups of which 2
    # are kept, the top 3 by sigmoid score plus a (noised) correction
    # bias, renormalized and scaled by 2.5, a shared expert; untied head.
    "deepseek_v3": dict(
        model_type="deepseek_v3",
        about="MLA (query latent, interleaved rope), YaRN with mscale; "
        "dense layer 0, MoE layer 1 (8 experts in 4 groups, 2 kept, top 3 "
        "by sigmoid + correction bias, scaled 2.5, a shared expert)",
        config=DEEPSEEK_V3,
        noise_buffers=("e_score_correction_bias",),
    ),
    # DeepSeek-V3's other options: one `q_proj` (no query latent), rope
    # halves, attention biases, plain RoPE, every layer a MoE without
    # group limit nor renormalization, a tied head. Greedy tokens are
    # compared on "deepseek_v3" (the same cache and generator).
    "deepseek_v3_q_proj": dict(
        model_type="deepseek_v3",
        about="no query latent (q_proj), rope halves, attention biases, "
        "plain RoPE, all layers MoE (one group, not renormalized), tied "
        "head; greedy compared on deepseek_v3",
        config=dict(
            DEEPSEEK_V3,
            q_lora_rank=None,
            rope_interleave=False,
            attention_bias=True,
            first_k_dense_replace=0,
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            routed_scaling_factor=1.0,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=1e4),
        ),
        noise_buffers=("e_score_correction_bias",),
        greedy=False,
    ),
    # DeepSeek-V3.2: V3's with attention biases and the lightning indexer
    # (2 heads of 8, each query reads its top 4 keys), its weights set for
    # clear gaps between the index scores (`hf_indexer.py`,
    # `sharpen_indexer`; the smallest gap is checked).
    "deepseek_v32": dict(
        model_type="deepseek_v32",
        about="V3's with attention biases, plus the lightning indexer (2 "
        "heads of 8, top 4 keys per query)",
        config=dict(
            {k: v for k, v in DEEPSEEK_V3.items() if k != "rope_interleave"},
            attention_bias=True,
            index_n_heads=2,
            index_head_dim=8,
            index_topk=4,
        ),
        noise_buffers=("e_score_correction_bias",),
        sharpen_indexer=True,
    ),
    # Kimi Linear: a Kimi delta attention layer (2 heads of 4, short
    # convolutions of 3) then an MLA layer without positions (NoPE; key
    # and value latent of 8, no query latent); layer 0 a dense MLP, layer
    # 1 DeepSeek-V3's MoE: 4 experts in 2 groups of which 1 is kept, the
    # top 2 by sigmoid score plus a (noised) correction bias,
    # renormalized and scaled by 2.446, a shared expert; untied head.
    # Weights of 0.2 (not 0.5): the MoE's large activations would amplify
    # float32 rounding of both sides' chunked delta rules to 1e-5.
    "kimi_linear": dict(
        model_type="kimi_linear",
        about="KDA layer + NoPE MLA layer; dense layer 0, MoE layer 1 (4 "
        "experts in 2 groups, 1 kept, top 2 by sigmoid + correction bias, "
        "scaled 2.446, a shared expert); untied head",
        config=dict(
            vocab_size=VOCAB,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=8,
            qk_nope_head_dim=4,
            qk_rope_head_dim=4,
            v_head_dim=6,
            linear_num_heads=2,
            linear_head_dim=4,
            linear_conv_kernel_dim=3,
            layer_types=["linear_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse"],
            num_local_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            moe_intermediate_size=8,
            n_shared_experts=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.446,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            max_position_embeddings=64,
            initializer_range=0.2,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=None,
        ),
        noise_buffers=("e_score_correction_bias",),
    ),
    # Llama 3.1's RoPE scaling over a pretraining length of 8 (both of
    # its frequency bands and the smoothed one for head_dim 8), biases on
    # the attention and feed-forward projections, an untied head.
    "llama": dict(
        model_type="llama",
        about="Llama 3.1 RoPE scaling, attention and MLP biases, "
        "head_dim 8, untied head",
        config=dict(
            COMMON,
            rms_norm_eps=1e-5,
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8,
            ),
        ),
    ),
    # Sliding window 3 on every layer (our rolling cache), tied head.
    # Llama 4: layer 0 rotary, L2 QK-norm, chunks of 3 (shorter than the
    # test's 8 and 13 positions), a dense feed-forward of
    # intermediate_size_mlp; layer 1 NoPE with temperature tuning (floor
    # 2, scale 0.5: it varies within the test's positions) and a mixture
    # of 4 experts, top 2 by sigmoid, plus a shared expert. The hidden
    # states of the right-padded row only: transformers takes the
    # temperature from the padded index and the chunks from the tokens'
    # positions, so its left-padded row is neither the same tokens alone
    # nor our index-based chunks (docs/guides/checkpoints.md).
    "llama4_text": dict(
        model_type="llama4_text",
        about="chunked attention (3), NoPE + temperature tuning, L2 "
        "QK-norm, MoE (sigmoid top 2, shared expert) on layer 1; "
        "unpadded row compared",
        config=dict(
            COMMON,
            intermediate_size_mlp=24,
            no_rope_layers=[1, 0],
            attention_chunk_size=3,
            attn_temperature_tuning=True,
            floor_scale=2,
            attn_scale=0.5,
            use_qk_norm=True,
            interleave_moe_layer_step=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=1e4),
        ),
        hidden_rows=(0,),
    ),
    "mistral": dict(
        model_type="mistral",
        about="sliding window 3 (rolling cache), tied head",
        config=dict(
            COMMON, sliding_window=3, tie_word_embeddings=True, rope_theta=1e4
        ),
    ),
    # Mixtral: 4 experts in every layer, top 2 (the softmax over all 4,
    # the 2 largest renormalized), per-expert w1/w3/w2 tensors; sliding
    # window 4 (less than the 8 positions and the generated lengths).
    "mixtral": dict(
        model_type="mixtral",
        about="4 experts top-2 in every layer (softmax, renormalized), "
        "sliding window 4, untied head",
        config=dict(
            COMMON,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=4,
            tie_word_embeddings=False,
            rope_theta=1e4,
        ),
    ),
    # Per-head QK-norm, biases on the four attention projections, layer
    # 1 windowed (max_window_layers=1), linear RoPE scaling, tied head.
    "qwen3": dict(
        model_type="qwen3",
        about="per-head QK-norm, attention biases, layer 1 windowed (3), "
        "linear RoPE 2, tied head",
        config=dict(
            COMMON,
            attention_bias=True,
            use_sliding_window=True,
            sliding_window=3,
            max_window_layers=1,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="linear", factor=2.0, rope_theta=1e4
            ),
        ),
    ),
    # Qwen3-MoE: per-head QK-norm; layer 1 sparse (6 experts of width 8,
    # top 2, not renormalized), layer 0 dense by decoder_sparse_step 2
    # (`mlp_only_layers`: test_hf_moe.py); sliding window 5 on every
    # layer (use_sliding_window), untied head.
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        about="QK-norm, 6 experts top-2 (not renormalized) on layer 1, "
        "layer 0 dense (decoder_sparse_step 2), window 5, untied head",
        config=dict(
            COMMON,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            norm_topk_prob=False,
            decoder_sparse_step=2,
            use_sliding_window=True,
            sliding_window=5,
            tie_word_embeddings=False,
            rope_theta=1e4,
        ),
    ),
    # Qwen3-Next: a gated delta net layer (2 key heads of 4, 4 value
    # heads of 6: `in_proj_qkvz` interleaved per key head; convolution
    # of 3) then a gated attention layer (output gate, QK-norm 1 + w,
    # partial rotary 0.5); layer 0 a MoE (4 experts, top 2, renormalized,
    # a shared expert gated by a sigmoid), layer 1 dense (mlp_only_layers);
    # norms 1 + w, untied head. Weights of 0.2, as Kimi Linear's.
    "qwen3_next": dict(
        model_type="qwen3_next",
        about="gated delta net layer (key heads 2, value heads 4, "
        "interleaved qkvz) + gated attention layer (QK-norm 1 + w, partial "
        "rotary 0.5); MoE layer 0 (4 experts top 2, sigmoid-gated shared "
        "expert), dense layer 1; untied head",
        config=dict(
            COMMON,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=4,
            linear_value_head_dim=6,
            linear_conv_kernel_dim=3,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=8,
            shared_expert_intermediate_size=12,
            norm_topk_prob=True,
            mlp_only_layers=[1],
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5
            ),
            initializer_range=0.2,
        ),
    ),
    # Biases on q, k, v (not o), layer 1 windowed, untied head.
    "qwen2": dict(
        model_type="qwen2",
        about="biases on q, k, v but not o, layer 1 windowed (3), untied head",
        config=dict(
            NO_HEAD_DIM,
            use_sliding_window=True,
            sliding_window=3,
            max_window_layers=1,
            tie_word_embeddings=False,
            rope_theta=1e4,
        ),
    ),
    # Gemma 1: embedding scale, norms 1 + w, GeGLU (tanh), tied head.
    "gemma": dict(
        model_type="gemma",
        about="embedding scale, norms 1 + w, GeGLU (tanh), tied head",
        config=dict(COMMON),
    ),
    # Gemma 2: soft-caps that bite, windows on layer 0, post-norms,
    # query scaling by query_pre_attn_scalar (6, not head_dim 8).
    "gemma2": dict(
        model_type="gemma2",
        about="soft-caps 1 and 2, window 3 on layer 0, post-norms, "
        "query_pre_attn_scalar 6",
        config=dict(
            COMMON,
            sliding_window=3,
            attn_logit_softcapping=1.0,
            final_logit_softcapping=2.0,
            query_pre_attn_scalar=6,
            initializer_range=0.05,
        ),
        noise=0.05,
    ),
    # Gemma 3: QK-norm, a windowed and a global layer, a RoPE per kind of
    # layer (global: 1e6 with linear scaling 2; windowed: 1e4).
    "gemma3_text": dict(
        model_type="gemma3_text",
        about="QK-norm, windowed + global layer, RoPE per layer type "
        "(global 1e6, linear 2)",
        config=dict(
            COMMON,
            sliding_window=3,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=6,
            rope_parameters=dict(
                full_attention=dict(
                    rope_type="linear", factor=2.0, rope_theta=1e6
                ),
                sliding_attention=dict(rope_type="default", rope_theta=1e4),
            ),
            initializer_range=0.05,
        ),
        noise=0.05,
    ),
    # Gemma 4: layers 2 (sliding) and 3 (full) read the keys and values
    # of layers 0 and 1; K = V on the full layers (1 key/value head of
    # 16), heads of 8 on the sliding ones (window 3); proportional RoPE
    # rotating a quarter of the full layers' heads (1e6), 1e4 on the
    # sliding ones; wide feed-forwards on the shared layers; the final
    # soft-cap. No per-layer inputs (refused).
    "gemma4_text": dict(
        model_type="gemma4_text",
        about="KV shared across layers, K = V (1 key/value head), heads "
        "of 8 and 16, windowed + full layers, proportional RoPE, layer "
        "scalars other than 1",
        config=dict(
            COMMON,
            num_hidden_layers=4,
            layer_types=["sliding_attention", "full_attention"] * 2,
            sliding_window=3,
            global_head_dim=16,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            hidden_size_per_layer_input=0,
            final_logit_softcapping=3.0,
            rope_parameters=dict(
                full_attention=dict(
                    rope_type="proportional",
                    partial_rotary_factor=0.25,
                    rope_theta=1e6,
                ),
                sliding_attention=dict(rope_type="default", rope_theta=1e4),
            ),
            initializer_range=0.05,
        ),
        noise=0.05,
        # Each layer's `layer_scalar` (1 when built) gets the noise too.
        noise_buffers=("layer_scalar",),
    ),
    # gpt-oss: learned sinks; layer 0 windowed (3), layer 1 full; 4
    # experts, top 2 (a softmax over the 2 largest router logits), the
    # clamped GLU with non-default alpha and a limit that bites, biases,
    # the interleaved gate/up columns; YaRN of factor 4 over a
    # pretraining length of 64 (head_dim 8: one frequency kept, one
    # ramped without truncation, two interpolated; cos and sin scaled);
    # attention biases, untied head.
    "gpt_oss": dict(
        model_type="gpt_oss",
        about="sinks, window 3 on layer 0 + full layer 1, 4 experts top-2 "
        "(clamped GLU alpha 1.5 / limit 2, biases, interleaved gate/up), "
        "YaRN 4 (truncate off), attention biases, untied head",
        config=dict(
            COMMON,
            num_local_experts=4,
            num_experts_per_tok=2,
            swiglu_alpha=1.5,
            swiglu_limit=2.0,
            sliding_window=3,
            layer_types=["sliding_attention", "full_attention"],
            attention_bias=True,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=1e4,
                factor=4.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    # ModernBERT: layer 0 global (theta 1000), layer 1 local (window 4:
    # 2 each side, less than the 8 positions; theta 10), GeGLU (exact
    # GELU), no biases, no attention norm on layer 0.
    "modernbert": dict(
        model_type="modernbert",
        about="global layer 0 + local layer 1 (window 4: 2 each side), "
        "RoPE theta 1000 / 10, GeGLU, no biases; encoder: no greedy",
        config=dict(
            ENCODER,
            global_attn_every_n_layers=2,
            local_attention=4,
            global_rope_theta=1000.0,
            local_rope_theta=10.0,
            hidden_activation="gelu",
            initializer_range=0.2,
            bos_token_id=None,
            eos_token_id=None,
            cls_token_id=None,
            sep_token_id=None,
        ),
        greedy=False,
    ),
    # OLMo 2: norms after the sublayers only, QK-norm over all heads,
    # attention biases, untied head.
    "olmo2": dict(
        model_type="olmo2",
        about="norms after each sublayer only, QK-norm over all heads, "
        "attention biases, untied head",
        config=dict(NO_HEAD_DIM, attention_bias=True, rope_theta=1e4),
    ),
    # Phi-3: fused qkv and gate/up projections, LongRoPE (short factors
    # within a pretraining length of 16, which the forward and the
    # generation stay within; the attention factor of 64 / 16), partial
    # rotary (half of each head), sliding window 4.
    "phi3": dict(
        model_type="phi3",
        about="fused qkv/gate_up, LongRoPE (short), partial rotary 0.5, "
        "window 4",
        config=PHI3,
    ),
    # The same past its pretraining length (2): the forward takes the long
    # factors. Greedy tokens are not compared: transformers' Phi-3
    # recomputes its cache with the long factors when a generation
    # crosses the length, our cached generator keeps the keys it rotated
    # (docs/guides/checkpoints.md).
    "phi3_long": dict(
        model_type="phi3",
        about="LongRoPE past its pretraining length (long factors); "
        "greedy not compared (see the guide)",
        config=dict(PHI3, original_max_position_embeddings=2),
        greedy=False,
    ),
    # RoBERTa: position ids from the token ids (pads at pad_token_id,
    # real tokens from pad_token_id + 1, left padding included), one
    # token type (no segment_ids), tanh GELU.
    "roberta": dict(
        model_type="roberta",
        about="positions from the non-pad token ids (offset pad + 1), one "
        "token type, tanh GELU; encoder: no greedy",
        config=dict(ENCODER, type_vocab_size=1, hidden_act="gelu_new"),
        greedy=False,
    ),
    # SmolLM3: layer 1 without RoPE (NoPE) and windowed (3), attention
    # biases, tied head.
    "smollm3": dict(
        model_type="smollm3",
        about="layer 1 NoPE and windowed (3), attention biases, tied head",
        config=dict(
            NO_HEAD_DIM,
            no_rope_layers=[1, 0],
            use_sliding_window=True,
            sliding_window=3,
            attention_bias=True,
            rope_theta=1e4,
        ),
    ),
}


def case_names():
    """The case names, sorted."""
    return sorted(CASES)
