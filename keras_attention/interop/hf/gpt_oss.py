"""Hugging Face `gpt_oss` checkpoints (transformers' `GptOssForCausalLM`):
the model that the keras-hub gpt-oss converter builds
(`interop.gpt_oss.gpt_oss_model`: learned attention sinks, windowed and
full layers, a mixture of experts with biases and the clamped GLU, YaRN)
read from a `config.json`, its tensors mapped by `WEIGHT_TABLE`."""

from keras_attention.interop.gpt_oss import gpt_oss_model
from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import configs
from keras_attention.interop.hf import llama

LAYER, OURS = llama.LAYER, llama.OURS

# The Llama table without its feed-forward rows, plus the sinks (one
# logit per query head) and the experts: the router `(experts, hidden)`
# and its bias, the stacked experts' `gate_up_proj` `(experts, hidden,
# 2 * intermediate)` with gate and up columns interleaved (`[..., ::2]`
# the gate, `[..., 1::2]` the up projection) and its bias, `down_proj`
# `(experts, intermediate, hidden)` and its bias (ours as they are).
WEIGHT_TABLE = tuple(
    row for row in llama.WEIGHT_TABLE if ".mlp." not in row[0]
) + (
    (LAYER + "self_attn.sinks", OURS + "self_attention/sinks", "copy"),
    (
        LAYER + "mlp.router.weight",
        OURS + "feed_forward/router_kernel",
        "linear",
    ),
    (LAYER + "mlp.router.bias", OURS + "feed_forward/router_bias", "copy"),
    (
        LAYER + "mlp.experts.gate_up_proj",
        OURS + "feed_forward/gate_up_kernel",
        "interleaved_gate_up",
    ),
    (
        LAYER + "mlp.experts.gate_up_proj_bias",
        OURS + "feed_forward/gate_up_bias",
        "interleaved_gate_up",
    ),
    (
        LAYER + "mlp.experts.down_proj",
        OURS + "feed_forward/down_kernel",
        "copy",
    ),
    (
        LAYER + "mlp.experts.down_proj_bias",
        OURS + "feed_forward/down_bias",
        "copy",
    ),
)

# transformers' `GptOssConfig` defaults of the fields a config.json may
# lack (its `save_pretrained` writes them all); the sizes are required.
DEFAULTS = {
    "num_key_value_heads": 8,
    "head_dim": 64,
    "sliding_window": 128,
    "rms_norm_eps": 1e-5,
    "attention_bias": True,
    "tie_word_embeddings": False,
    "num_experts_per_tok": 4,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
}
DEFAULT_THETA = 150000.0
# Its RoPE when the config has neither `rope_parameters` nor
# `rope_scaling`.
DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


def gpt_oss_config(config):
    """`config` (an `HFConfig`) as transformers' `GptOssConfig` reads
    it: `DEFAULTS` for absent fields, `DEFAULT_ROPE` without a RoPE
    field, the experts' count from `num_local_experts` (or its alias
    `num_experts`); `hidden_act`, which transformers' gpt-oss does not
    read (its experts' GLU is fixed), left out. `ValueError` for a
    quantized checkpoint (`quantization_config`: MXFP4 blocks and scales,
    not read)."""
    values = dict(config.values)
    if values.get("quantization_config") is not None:
        method = dict(values["quantization_config"]).get("quant_method")
        raise ValueError(
            "config.json of model_type 'gpt_oss': quantization_config "
            f"(quant_method={method!r}) is not supported: quantized tensors "
            "are not read. Save a dequantized copy first (transformers: "
            "`GptOssForCausalLM.from_pretrained(path, quantization_config="
            "Mxfp4Config(dequantize=True))`, then `save_pretrained`)."
        )
    for name, value in DEFAULTS.items():
        values.setdefault(name, value)
    if "num_local_experts" not in values and "num_experts" in values:
        values["num_local_experts"] = values["num_experts"]
    if values.get("rope_parameters") is None and not values.get("rope_scaling"):
        values["rope_parameters"] = dict(DEFAULT_ROPE)
    values.pop("hidden_act", None)
    return configs.HFConfig(values)


def gpt_oss_windows(config):
    """Each layer's causal `window_size` (None: full attention):
    `sliding_window - 1` on the "sliding_attention" layers of
    `layer_types` (transformers' default: the even layers 0, 2, ...)."""
    layers = int(config.require("num_hidden_layers"))
    default = [
        "sliding_attention" if (i + 1) % 2 else "full_attention"
        for i in range(layers)
    ]
    return llama.layer_windows(config, config.get("sliding_window"), default)


def moe_arguments(config):
    """The `MixtureOfExperts` arguments of gpt-oss's feed-forward: a
    softmax over the `num_experts_per_tok` largest router logits
    (`routing="topk_softmax"`), a router bias, the clamped GLU
    (`swiglu_alpha`, `swiglu_limit`) with biases on the experts. No
    load-balancing loss: transformers computes its
    `router_aux_loss_coef` term for training (`output_router_logits`)
    only."""
    return dict(
        num_experts=int(config.require("num_local_experts")),
        top_k=int(config.require("num_experts_per_tok")),
        intermediate_dim=int(config.require("intermediate_size")),
        routing="topk_softmax",
        router_bias=True,
        activation="gpt_oss_glu",
        expert_bias=True,
        glu_alpha=float(config.require("swiglu_alpha")),
        glu_limit=float(config.require("swiglu_limit")),
    )


def convert_gpt_oss(config, dtype):
    """A `gpt_oss` checkpoint's model: the keras-hub converter's
    `gpt_oss_model` with the config's sizes, `head_dim`,
    `rms_norm_eps`, `attention_bias` (all four projections; default
    True), learned attention sinks on every layer, the windowed layers
    of `layer_types` as causal `LocalSelfAttention`s of `window_size =
    sliding_window - 1` (transformers masks `q - k < sliding_window`),
    the RoPE of either config layout (gpt-oss's YaRN: the
    self-attention's `rotary_scaling={"rope_type": "yarn", ...}`, cos
    and sin scaled by `0.1 ln(factor) + 1`; `rope_theta` default
    150000), the mixture of experts of `moe_arguments` (the interleaved
    `gate_up_proj` de-interleaved), the tied or untied head.

    Refused by name (`ValueError`): `quantization_config` (MXFP4
    checkpoints: dequantize them first), a `partial_rotary_factor`
    other than 1 (transformers' gpt-oss rotates whole heads), RoPE types
    and keys `configs.rope_arguments` does not read.

    References:
        - OpenAI, 2025, "gpt-oss-120b & gpt-oss-20b Model Card".
        - Peng et al., 2023, "YaRN: Efficient Context Window Extension of
          Large Language Models".
        - Xiao et al., 2023, "Efficient Streaming Language Models with
          Attention Sinks".
    """
    config = gpt_oss_config(config)
    rope = configs.rope_arguments(config, default_theta=DEFAULT_THETA)
    if rope["rotary_fraction"] != 1.0:
        raise ValueError(
            "config.json of model_type 'gpt_oss': partial_rotary_factor="
            f"{rope['rotary_fraction']!r} is not supported (transformers' "
            "gpt-oss rotates whole heads; supported: [1.0])."
        )
    arguments = dict(
        llama.llama_style_config(config, rope=rope),
        attention_bias=bool(config.get("attention_bias")),
        mlp_bias=False,
        layer_norm_epsilon=float(config.get("rms_norm_eps")),
    )
    model = gpt_oss_model(
        arguments,
        dtype,
        config.model_type,
        key_dim=config.head_dim(),
        rotary_scaling=rope["rotary_scaling"],
        windows=gpt_oss_windows(config),
        moe=moe_arguments(config),
    )
    return Conversion(
        model,
        llama.llama_style_table(arguments, WEIGHT_TABLE),
        arguments["num_layers"],
        llama.llama_style_ignored(arguments),
    )
