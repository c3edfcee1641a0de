"""Hugging Face `qwen3_next` checkpoints: Qwen3-Next's gated delta net and
gated attention layers with a mixture of experts and its gated shared
expert, built by the keras-hub Qwen 3.5 converters' builder
(`interop.qwen3_5.qwen3_5_style_model`)."""

from keras_attention.interop import _common
from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import configs
from keras_attention.interop.hf import mixtral
from keras_attention.interop.qwen3_5 import qwen3_5_style_model

LAYER_TYPES = ("linear_attention", "full_attention")
# The config class's defaults, for fields a config.json may leave out.
DEFAULTS = dict(
    head_dim=256,
    partial_rotary_factor=0.25,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    decoder_sparse_step=1,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    num_experts_per_tok=10,
    num_experts=512,
    norm_topk_prob=True,
    full_attention_interval=4,
)
# Real checkpoints also hold the multi-token-prediction head, which
# transformers does not load either.
IGNORED = ("mtp.*",)


def _get(config, name):
    return config.get(name, DEFAULTS[name])


def layer_types(config):
    """`layer_types` (each "linear_attention" or "full_attention"), else
    transformers' default: every `full_attention_interval`-th layer full."""
    layers = int(config.require("num_hidden_layers"))
    interval = int(_get(config, "full_attention_interval"))
    default = [
        "linear_attention" if (i + 1) % interval else "full_attention"
        for i in range(layers)
    ]
    types = list(config.get("layer_types", default))
    if len(types) != layers or set(types) - set(LAYER_TYPES):
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            f"layer_types={types!r} must give one of {LAYER_TYPES} for each "
            f"of its {layers} layers."
        )
    return types


def sparse_layers(config):
    """The layers whose feed-forward is the mixture of experts (the others'
    is the dense SwiGLU MLP), as transformers decides it."""
    layers = int(config.require("num_hidden_layers"))
    dense = set(config.get("mlp_only_layers", []))
    step = int(_get(config, "decoder_sparse_step"))
    experts = int(_get(config, "num_experts"))
    return [
        i not in dense and experts > 0 and (i + 1) % step == 0
        for i in range(layers)
    ]


def _rope(config, head_dim):
    """The attention's rotary arguments: `configs.rope_arguments` with
    Qwen3-Next's default `partial_rotary_factor` 0.25; `ValueError` for a
    share that rotates an odd number of features."""
    values = dict(config.values)
    params = values.get("rope_parameters")
    if not (params or {}).get("partial_rotary_factor"):
        values.setdefault(
            "partial_rotary_factor", DEFAULTS["partial_rotary_factor"]
        )
    rope = configs.rope_arguments(configs.HFConfig(values))
    rotated = int(head_dim * rope["rotary_fraction"])
    if rotated % 2 or rotated < 2:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            f"partial_rotary_factor={rope['rotary_fraction']!r} rotates "
            f"{rotated} features of heads of {head_dim}; an even number of "
            "at least 2 is supported."
        )
    return rope


def model_config(config):
    """`qwen3_5_style_model`'s `config` of a `qwen3_next` `HFConfig`,
    refusing what the model does not support by name."""
    config.refuse("hidden_act", ("silu", "swish"), "silu")
    config.refuse("attention_bias", (False,), False)
    head_dim = int(_get(config, "head_dim"))
    rope = _rope(config, head_dim)
    epsilon = float(config.get("rms_norm_eps", 1e-6))
    out = dict(
        vocabulary_size=int(config.require("vocab_size")),
        num_layers=int(config.require("num_hidden_layers")),
        hidden_dim=int(config.require("hidden_size")),
        intermediate_dim=int(config.require("intermediate_size")),
        layer_norm_epsilon=epsilon,
        qk_norm_epsilon=epsilon,
        dropout=0.0,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        layer_types=layer_types(config),
        num_query_heads=int(config.require("num_attention_heads")),
        num_key_value_heads=int(
            config.get("num_key_value_heads", config.get("num_attention_heads"))
        ),
        head_dim=head_dim,
        rope_max_wavelength=rope["rotary_max_wavelength"],
        rotary_scaling=rope["rotary_scaling"],
        partial_rotary_factor=rope["rotary_fraction"],
        sliding_window_size=None,
        hidden_activation="silu",
    )
    for name in (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    ):
        out[name] = int(_get(config, name))
    return out


def moe_arguments(config):
    """The `MixtureOfExperts` of the sparse layers: softmax routing over
    all experts, the top `num_experts_per_tok` (renormalized with
    `norm_topk_prob`), SwiGLU experts, the shared expert scaled by its
    sigmoid gate; the load-balancing loss with `output_router_logits`
    (transformers adds it only then)."""
    coefficient = None
    if config.get("output_router_logits", False):
        coefficient = float(config.get("router_aux_loss_coef", 0.001))
    return dict(
        num_experts=int(_get(config, "num_experts")),
        top_k=int(_get(config, "num_experts_per_tok")),
        intermediate_dim=int(_get(config, "moe_intermediate_size")),
        routing="softmax_topk",
        normalize_top_k=bool(_get(config, "norm_topk_prob")),
        shared_expert_dim=int(_get(config, "shared_expert_intermediate_size")),
        shared_expert_gate=True,
        router_aux_loss_coef=coefficient,
    )


def grouped_order(groups, pieces):
    """The row order of a tensor stored group by group, each group the
    `pieces` (row counts) in turn, read as all groups' first piece, then
    all groups' second, ...: `order[r]` the stored row of our row `r`."""
    size = sum(pieces)
    order = []
    for k, count in enumerate(pieces):
        start = sum(pieces[:k])
        for g in range(groups):
            first = g * size + start
            order.extend(range(first, first + count))
    return tuple(order)


def _linear_rows(i, arguments):
    """The gated delta net's rows of layer `i`. transformers'
    `in_proj_qkvz` holds, per key head, its query, key, values and output
    gates (`z`) side by side, and `in_proj_ba` its betas and decays: both
    reordered into our `in_proj_qkv` (all queries, keys, values: the
    convolution's channels, as its `conv1d` stores them) and `in_proj_z`,
    `in_proj_b` and `in_proj_a`."""
    theirs = f"model.layers.{i}.linear_attn."
    ours = f"transformer_layer_{i}/self_attention/"
    heads = arguments["linear_num_key_heads"]
    ratio = arguments["linear_num_value_heads"] // heads
    keys = arguments["linear_key_head_dim"]
    values = ratio * arguments["linear_value_head_dim"]
    return (
        (
            theirs + "in_proj_qkvz.weight",
            (ours + "in_proj_qkv/kernel", ours + "in_proj_z/kernel"),
            "linear",
            grouped_order(heads, (keys, keys, values, values)),
        ),
        (
            theirs + "in_proj_ba.weight",
            (ours + "in_proj_b/kernel", ours + "in_proj_a/kernel"),
            "linear",
            grouped_order(heads, (ratio, ratio)),
        ),
        (theirs + "conv1d.weight", ours + "conv1d_kernel", "depthwise_conv"),
        (theirs + "dt_bias", ours + "dt_bias", "copy"),
        (theirs + "A_log", ours + "A_log", "copy"),
        (theirs + "norm.weight", ours + "norm/scale", "copy"),
        (theirs + "out_proj.weight", ours + "out_proj/kernel", "linear"),
    )


def _attention_rows(i, arguments):
    """The gated attention's rows of layer `i`: `q_proj` holds each head's
    query then its output gate, split into our `query` and `gate`
    kernels; the QK-norms scale by `1 + w`."""
    theirs = f"model.layers.{i}.self_attn."
    ours = f"transformer_layer_{i}/self_attention/"
    head_dim = arguments["head_dim"]
    return (
        (
            theirs + "q_proj.weight",
            (ours + "query/kernel", ours + "gate/kernel"),
            "linear",
            grouped_order(arguments["num_query_heads"], (head_dim, head_dim)),
        ),
        (theirs + "k_proj.weight", ours + "key/kernel", "linear"),
        (theirs + "v_proj.weight", ours + "value/kernel", "linear"),
        (
            theirs + "o_proj.weight",
            ours + "attention_output/kernel",
            "linear_in2",
        ),
        (theirs + "q_norm.weight", ours + "query_norm/scale", "norm_plus_one"),
        (theirs + "k_norm.weight", ours + "key_norm/scale", "norm_plus_one"),
    )


def shared_expert_rows(theirs, ours, shared, shared_gate=None):
    """A shared expert's rows: `theirs + shared`'s `gate_proj` and
    `up_proj` (read as one) into our `shared_gate_up_kernel` (gate
    columns first), its `down_proj` into `shared_down_kernel`, and its
    gate `theirs + shared_gate` (when named) into `shared_gate_kernel`."""
    rows = (
        (
            (
                f"{theirs}{shared}.gate_proj.weight",
                f"{theirs}{shared}.up_proj.weight",
            ),
            ours + "shared_gate_up_kernel",
            "linear",
        ),
        (
            f"{theirs}{shared}.down_proj.weight",
            ours + "shared_down_kernel",
            "linear",
        ),
    )
    if shared_gate:
        rows += (
            (
                f"{theirs}{shared_gate}.weight",
                ours + "shared_gate_kernel",
                "linear",
            ),
        )
    return rows


def dense_rows(theirs, ours):
    """A SwiGLU MLP's rows (`gate_proj`, `up_proj`, `down_proj`)."""
    return tuple(
        (f"{theirs}{name}_proj.weight", f"{ours}{dense}/kernel", "linear")
        for name, dense in (
            ("gate", "gate_dense"),
            ("up", "intermediate_dense"),
            ("down", "output_dense"),
        )
    )


def weight_table(arguments, sparse, num_experts):
    """The table of a `qwen3_next` checkpoint: per layer its mixer's rows
    (`_linear_rows` or `_attention_rows`), its feed-forward's and its
    norms (`1 + w`, as the final norm); the embedding and the head."""
    table = (
        ("model.embed_tokens.weight", "token_embedding/embeddings", "copy"),
        (
            "model.norm.weight",
            "sequence_output_layernorm/scale",
            "norm_plus_one",
        ),
    )
    if not arguments["tie_word_embeddings"]:
        table += (
            ("lm_head.weight", "token_embedding/reverse_embeddings", "linear"),
        )
    for i, kind in enumerate(arguments["layer_types"]):
        theirs, ours = f"model.layers.{i}.", f"transformer_layer_{i}/"
        rows = _linear_rows if kind == "linear_attention" else _attention_rows
        table += rows(i, arguments)
        table += (
            (
                theirs + "input_layernorm.weight",
                ours + "self_attention_norm/scale",
                "norm_plus_one",
            ),
            (
                theirs + "post_attention_layernorm.weight",
                ours + "feed_forward_norm/scale",
                "norm_plus_one",
            ),
        )
        if sparse[i]:
            table += mixtral.expert_rows(i, "mlp.", num_experts)
            table += shared_expert_rows(
                theirs + "mlp.",
                ours + "feed_forward/",
                "shared_expert",
                "shared_expert_gate",
            )
        else:
            table += dense_rows(theirs + "mlp.", ours + "feed_forward/")
    return table


def convert_qwen3_next(config, dtype):
    """A `qwen3_next` checkpoint's model: `qwen3_5_style_model` (the
    keras-hub Qwen 3.5 converters' builder) with Qwen3-Next's options.

    - Its `layer_types`: `GatedDeltaNet`s on "linear_attention" layers
      (`linear_*` sizes, `hidden_act` after the convolution, the output
      norm's epsilon `rms_norm_eps`), gated attention on
      "full_attention" layers (`SelfAttention(use_gate=True)`,
      grouped-query, `head_dim`, QK-norm, partial rotary positions,
      `partial_rotary_factor` 0.25 by default, the RoPE types of
      `configs.rope_arguments`).
    - Its feed-forwards: a `MixtureOfExperts` on the sparse layers
      (`sparse_layers`: `decoder_sparse_step`, `mlp_only_layers`,
      `num_experts`) with its softmax routing, `norm_topk_prob` and the
      shared expert scaled by its sigmoid gate (`moe_arguments`); the
      dense SwiGLU MLP of `intermediate_size` on the others.
    - Its `1 + w` RMS norms (blocks, QK-norms, the final norm) read as
      `w + 1`; the gated delta nets' gated output norm scales by `w`.
    - The tied or untied head.

    `attention_bias` and activations other than silu are refused by
    name; the multi-token-prediction tensors (`mtp.*`) are left unread,
    as transformers leaves them.

    Padding: transformers zeroes padded tokens before each gated delta
    net, so they add nothing to its state or convolution; ours takes them
    out of the sequence. The real tokens' outputs are the same, left or
    right padded.

    References:
        - Qwen Team, 2025, "Qwen3-Next" (model release).
        - Yang, Kautz & Hatamizadeh, 2025, "Gated Delta Networks:
          Improving Mamba2 with Delta Rule".
        - Qiu et al., 2025, "Gated Attention for Large Language Models".
    """
    arguments = model_config(config)
    sparse = sparse_layers(config)
    moe = moe_arguments(config)

    def layer_feed_forward(i):
        if not sparse[i]:
            return None
        return _common.mixture_of_experts(moe, dtype)

    model = qwen3_5_style_model(
        arguments, dtype, config.model_type, layer_feed_forward
    )
    ignored = IGNORED
    if arguments["tie_word_embeddings"]:
        ignored += ("lm_head.weight",)
    return Conversion(
        model,
        weight_table(arguments, sparse, moe["num_experts"]),
        arguments["num_layers"],
        ignored,
    )
