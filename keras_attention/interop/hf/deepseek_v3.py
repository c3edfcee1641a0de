"""Hugging Face `deepseek_v3` checkpoints: multi-head latent attention
(`MultiHeadLatentAttention`) and a mixture of experts with shared experts
and DeepSeek's grouped sigmoid routing (`MixtureOfExperts(routing=
"sigmoid_topk")`), after `first_k_dense_replace` dense layers. The reading
and the model builder are shared with `deepseek_v32` (`hf.deepseek_v32`),
which adds the lightning indexer."""

from keras_attention.interop import _common
from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import configs
from keras_attention.interop.hf import llama
from keras_attention.layers.multi_head_latent_attention import (
    MultiHeadLatentAttention,
)

LAYER, OURS = llama.LAYER, llama.OURS
ATTENTION = OURS + "self_attention/"
FEED_FORWARD = OURS + "feed_forward/"

# transformers' `DeepseekV3Config` defaults of the fields read here, for a
# config.json that leaves them out.
DEFAULTS = dict(
    moe_intermediate_size=2048,
    n_shared_experts=1,
    n_routed_experts=256,
    routed_scaling_factor=2.5,
    kv_lora_rank=512,
    q_lora_rank=1536,
    qk_rope_head_dim=64,
    v_head_dim=128,
    qk_nope_head_dim=128,
    n_group=8,
    topk_group=4,
    num_experts_per_tok=8,
    first_k_dense_replace=3,
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_interleave=True,
    attention_bias=False,
    num_nextn_predict_layers=1,
)


def value(config, name, defaults=DEFAULTS):
    """The config's `name`, transformers' default when absent."""
    return config.get(name, defaults.get(name))


# The latent attention's tensors (`DeepseekV3Attention`), ours by name.
ATTENTION_TABLE = tuple(
    (LAYER + f"self_attn.{name}.weight", ATTENTION + f"{name}/{part}", how)
    for name, part, how in (
        ("kv_a_proj_with_mqa", "kernel", "linear"),
        ("kv_a_layernorm", "scale", "copy"),
        ("kv_b_proj", "kernel", "linear"),
        ("o_proj", "kernel", "linear"),
    )
)
# Queries through the low-rank bottleneck (`q_lora_rank`), or one
# projection.
Q_LORA_TABLE = tuple(
    (LAYER + f"self_attn.{name}.weight", ATTENTION + f"{name}/{part}", how)
    for name, part, how in (
        ("q_a_proj", "kernel", "linear"),
        ("q_a_layernorm", "scale", "copy"),
        ("q_b_proj", "kernel", "linear"),
    )
)
Q_TABLE = (
    (LAYER + "self_attn.q_proj.weight", ATTENTION + "q_proj/kernel", "linear"),
)
# `attention_bias`: the biases of `q_a_proj`, `kv_a_proj_with_mqa`,
# `o_proj` (never of `q_proj`, `q_b_proj`, `kv_b_proj`).
ATTENTION_BIAS = ("q_a_proj", "kv_a_proj_with_mqa", "o_proj")
# The dense layers' SwiGLU (`DeepseekV3MLP`).
DENSE_TABLE = tuple(
    (LAYER + f"mlp.{theirs}_proj.weight", FEED_FORWARD + f"{ours}/kernel", how)
    for theirs, ours, how in (
        ("gate", "gate_dense", "linear"),
        ("up", "intermediate_dense", "linear"),
        ("down", "output_dense", "linear"),
    )
)
NORM_TABLE = (
    (
        LAYER + "input_layernorm.weight",
        OURS + "self_attention_norm/scale",
        "copy",
    ),
    (
        LAYER + "post_attention_layernorm.weight",
        OURS + "feed_forward_norm/scale",
        "copy",
    ),
)
MODEL_TABLE = (
    ("model.embed_tokens.weight", "token_embedding/embeddings", "copy"),
    ("model.norm.weight", "sequence_output_layernorm/scale", "copy"),
)


def moe_table(i, num_experts):
    """The rows of MoE layer `i` (`DeepseekV3MoE` as `save_pretrained`
    writes it: one `gate_proj`, `up_proj`, `down_proj` per expert):
    the router and its score-correction bias, each expert's gate and up
    projections stacked into `gate_up_kernel` and its down projections
    into `down_kernel` (`"experts_linear"`), the shared experts' gate and
    up projections into `shared_gate_up_kernel`."""
    layer, ours = LAYER.format(i=i), FEED_FORWARD.format(i=i)
    experts = layer + "mlp.experts.{j}.{name}_proj.weight"
    gate_up = tuple(
        experts.format(j=j, name=name)
        for j in range(num_experts)
        for name in ("gate", "up")
    )
    down = tuple(experts.format(j=j, name="down") for j in range(num_experts))
    shared = layer + "mlp.shared_experts.{}_proj.weight"
    return (
        (layer + "mlp.gate.weight", ours + "router_kernel", "linear"),
        (
            layer + "mlp.gate.e_score_correction_bias",
            ours + "score_correction_bias",
            "copy",
        ),
        (gate_up, ours + "gate_up_kernel", "experts_linear"),
        (down, ours + "down_kernel", "experts_linear"),
        (
            (shared.format("gate"), shared.format("up")),
            ours + "shared_gate_up_kernel",
            "linear",
        ),
        (shared.format("down"), ours + "shared_down_kernel", "linear"),
    )


def deepseek_arguments(config, dense, defaults=DEFAULTS):
    """The sizes and options of a DeepSeek config (`HFConfig`) as
    `deepseek_model` takes them; `dense`: whether each layer's
    feed-forward is the dense SwiGLU (else the mixture of experts).
    `ValueError` naming an option the conversion cannot apply."""
    heads = int(config.require("num_attention_heads"))
    config.refuse("num_key_value_heads", (heads,), heads)
    config.refuse("hidden_act", ("silu", "swish"), "silu")
    if config.get("quantization_config") is not None:
        raise ValueError(
            f"config.json of model_type {config.model_type!r} has a "
            "quantization_config (FP8 weights and their scales): "
            "dequantize the checkpoint first (unsupported here)."
        )
    rope = configs.rope_arguments(config)
    if rope["rotary_fraction"] != 1.0:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            f"partial_rotary_factor={rope['rotary_fraction']!r} is not "
            "supported (DeepSeek rotates all `qk_rope_head_dim` features; "
            "supported: [1.0])."
        )
    # null: queries through one `q_proj` (absent: the default rank).
    q_lora_rank = config.values.get("q_lora_rank", defaults["q_lora_rank"])
    latent = dict(
        kv_lora_rank=int(value(config, "kv_lora_rank", defaults)),
        qk_nope_head_dim=int(value(config, "qk_nope_head_dim", defaults)),
        qk_rope_head_dim=int(value(config, "qk_rope_head_dim", defaults)),
        v_head_dim=int(value(config, "v_head_dim", defaults)),
        q_lora_rank=None if q_lora_rank is None else int(q_lora_rank),
        rope_theta=rope["rotary_max_wavelength"],
        rope_interleave=bool(value(config, "rope_interleave", defaults)),
        attention_bias=bool(value(config, "attention_bias", defaults)),
        rotary_scaling=rope["rotary_scaling"],
    )
    experts = int(value(config, "n_routed_experts", defaults))
    moe = dict(
        num_experts=experts,
        top_k=int(value(config, "num_experts_per_tok", defaults)),
        intermediate_dim=int(value(config, "moe_intermediate_size", defaults)),
        routing="sigmoid_topk",
        normalize_top_k=bool(value(config, "norm_topk_prob", defaults)),
        num_groups=int(value(config, "n_group", defaults)),
        top_k_groups=int(value(config, "topk_group", defaults)),
        score_correction_bias=True,
        routed_scaling_factor=float(
            value(config, "routed_scaling_factor", defaults)
        ),
        shared_expert_dim=int(value(config, "n_shared_experts", defaults))
        * int(value(config, "moe_intermediate_size", defaults)),
    )
    return dict(
        vocabulary_size=int(config.require("vocab_size")),
        num_layers=int(config.require("num_hidden_layers")),
        num_heads=heads,
        hidden_dim=int(config.require("hidden_size")),
        intermediate_dim=int(config.require("intermediate_size")),
        layer_norm_epsilon=float(value(config, "rms_norm_eps", defaults)),
        tie_word_embeddings=bool(
            value(config, "tie_word_embeddings", defaults)
        ),
        dense=list(dense),
        latent=latent,
        moe=moe,
    )


def first_dense(config, defaults=DEFAULTS):
    """Each layer's feed-forward kind by `first_k_dense_replace`: dense
    (True) for the first ones, the mixture of experts after."""
    layers = int(config.require("num_hidden_layers"))
    first = int(value(config, "first_k_dense_replace", defaults))
    return [i < first for i in range(layers)]


def deepseek_model(arguments, dtype, name, indexer=None):
    """The DeepSeek model of `deepseek_arguments`: a token embedding
    (`ReversibleEmbedding`, tied or not), pre-norm
    `TransformerDecoderBlock`s with RMS norms named `transformer_layer_{i}`,
    each composed of a causal `MultiHeadLatentAttention` (with the
    `indexer` dict of DeepSeek-V3.2 when given) and either the dense
    SwiGLU `FeedForward` or the `MixtureOfExperts`, then the final RMS
    norm `sequence_output_layernorm`. Initial weights: the caller fills
    them."""

    def sublayers(i):
        attention = MultiHeadLatentAttention(
            num_heads=arguments["num_heads"],
            **arguments["latent"],
            indexer=indexer,
            dtype=dtype,
            name="self_attention",
        )
        if arguments["dense"][i]:
            feed_forward = _common.feed_forward(
                arguments["intermediate_dim"],
                activation="silu",
                gated=True,
                use_bias=False,
                dtype=dtype,
            )
        else:
            feed_forward = _common.mixture_of_experts(arguments["moe"], dtype)
        return attention, feed_forward

    return _common.rms_decoder_model(
        len(arguments["dense"]),
        sublayers,
        vocabulary_size=arguments["vocabulary_size"],
        hidden_dim=arguments["hidden_dim"],
        tie_word_embeddings=arguments["tie_word_embeddings"],
        epsilon=arguments["layer_norm_epsilon"],
        dtype=dtype,
        name=name,
    )


def deepseek_table(arguments, attention_rows=()):
    """The weight table of `deepseek_model(arguments)`: embeddings and
    norms, each layer's latent attention (its query rows by
    `q_lora_rank`, biases with `attention_bias`, and `attention_rows`:
    more rows per layer, `{i}` for its index), its dense feed-forward or
    mixture of experts, the untied head."""
    latent = arguments["latent"]
    per_layer = ATTENTION_TABLE + NORM_TABLE + tuple(attention_rows)
    per_layer += Q_TABLE if latent["q_lora_rank"] is None else Q_LORA_TABLE
    if latent["attention_bias"]:
        names = ATTENTION_BIAS[int(latent["q_lora_rank"] is None) :]
        per_layer += tuple(
            (LAYER + f"self_attn.{n}.bias", ATTENTION + f"{n}/bias", "copy")
            for n in names
        )
    table = MODEL_TABLE + per_layer
    for i, dense in enumerate(arguments["dense"]):
        if dense:
            table += tuple(
                (theirs.format(i=i), ours.format(i=i), how)
                for theirs, ours, how in DENSE_TABLE
            )
        else:
            table += moe_table(i, arguments["moe"]["num_experts"])
    if not arguments["tie_word_embeddings"]:
        table += llama.HEAD_TABLE
    return table


def deepseek_ignored(config, arguments, defaults=DEFAULTS):
    """The tensors left unread: the multi-token-prediction layers after
    the last (`num_nextn_predict_layers`, which transformers does not
    build), stored RoPE tables, a tied model's stored head."""
    layers = arguments["num_layers"]
    extra = max(
        int(config.get(name, defaults.get("num_nextn_predict_layers", 0)))
        for name in ("num_nextn_predict_layers", "num_mtp_layers")
    )
    ignored = tuple(
        f"model.layers.{n}.*" for n in range(layers, layers + extra)
    )
    return ignored + llama.llama_style_ignored(arguments)


def convert_deepseek_v3(config, dtype):
    """A `deepseek_v3` checkpoint's model (`deepseek_model`): per layer a
    causal `MultiHeadLatentAttention` (`q_lora_rank`, also None: one
    `q_proj`; `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`,
    `v_head_dim`, `rope_interleave`, `attention_bias`; the RoPE of either
    config layout, DeepSeek's YaRN with `mscale` / `mscale_all_dim`
    scaling cos, sin and the softmax scale as `DeepseekV3Attention`),
    then the dense SwiGLU on the first `first_k_dense_replace` layers and
    a `MixtureOfExperts` on the others (`n_routed_experts`,
    `num_experts_per_tok`, sigmoid scores chosen with
    `e_score_correction_bias` within the `topk_group` best of `n_group`
    groups, `norm_topk_prob`, `routed_scaling_factor`, `n_shared_experts`
    shared experts); the tied or untied head. The multi-token-prediction
    layers stored after the last layer are left unread, as transformers
    does.

    Refused by name (`ValueError`): `quantization_config` (FP8
    checkpoints: dequantize them first), `num_key_value_heads` other than
    `num_attention_heads`, `hidden_act` other than SiLU, a
    `partial_rotary_factor`, RoPE types and keys `configs.rope_arguments`
    does not read, routing sizes `MixtureOfExperts` refuses.

    References:
        - DeepSeek-AI, 2024, "DeepSeek-V3 Technical Report" (arXiv
          2412.19437).
    """
    arguments = deepseek_arguments(config, first_dense(config))
    model = deepseek_model(arguments, dtype, config.model_type)
    return Conversion(
        model,
        deepseek_table(arguments),
        arguments["num_layers"],
        deepseek_ignored(config, arguments),
    )
