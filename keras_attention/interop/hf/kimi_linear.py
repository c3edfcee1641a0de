"""Hugging Face `kimi_linear` checkpoints (Moonshot's Kimi Linear): Kimi
delta attention layers interleaved with multi-head latent attention
layers without positions (NoPE), and DeepSeek-V3's mixture of experts
(sigmoid routing with a score-correction bias, expert groups, shared
experts) after the first dense layers."""

from keras_attention.interop import _common
from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import mixtral
from keras_attention.interop.hf import weights
from keras_attention.interop.hf.qwen3_next import shared_expert_rows
from keras_attention.layers.kimi_delta_attention import KimiDeltaAttention
from keras_attention.layers.multi_head_latent_attention import (
    MultiHeadLatentAttention,
)

LAYER_TYPES = ("linear_attention", "full_attention")
MLP_TYPES = ("dense", "sparse")
# transformers' defaults; each field is read under the checkpoint's name
# first (Moonshot's config.json, which transformers' `attribute_map`
# keeps), then transformers' own.
DEFAULTS = dict(
    num_experts=256,
    num_experts_per_token=8,
    num_shared_experts=1,
    num_expert_group=1,
    topk_group=1,
    moe_renormalize=True,
    moe_intermediate_size=1024,
    routed_scaling_factor=2.446,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    linear_num_heads=32,
    linear_head_dim=128,
    linear_conv_kernel_dim=4,
)
ALIASES = dict(
    num_experts="num_local_experts",
    num_experts_per_token="num_experts_per_tok",
    num_shared_experts="n_shared_experts",
    num_expert_group="n_group",
    moe_renormalize="norm_topk_prob",
)
# Moonshot's `linear_attn_config` keys -> transformers' fields.
LINEAR_CONFIG = dict(
    num_heads="linear_num_heads",
    head_dim="linear_head_dim",
    short_conv_kernel_size="linear_conv_kernel_dim",
)
# The forget gate's `A_log` `(1, 1, heads, 1)` to our `(heads,)`.
A_LOG = weights.Transform(
    lambda shape: (1, 1) + tuple(shape) + (1,),
    lambda read, shape, dtype: read(0, 1).reshape(shape).astype(dtype),
)


def _get(config, name):
    value = config.get(name)
    if value is None and name in ALIASES:
        value = config.get(ALIASES[name])
    linear = config.get("linear_attn_config") or {}
    for theirs, ours in LINEAR_CONFIG.items():
        if ours == name and value is None:
            value = linear.get(theirs)
    return DEFAULTS[name] if value is None else value


def layer_types(config):
    """Each layer's mixer: `layer_types`, else Moonshot's
    `linear_attn_config` (`full_attn_layers`, `kda_layers`, counted from
    1), else transformers' default (full attention on layers 4, 8, ...)."""
    layers = int(config.require("num_hidden_layers"))
    types = config.get("layer_types")
    linear = config.get("linear_attn_config") or {}
    if types is None and "full_attn_layers" in linear:
        types = [None] * layers
        for kind, key in zip(LAYER_TYPES, ("kda_layers", "full_attn_layers")):
            for number in linear.get(key, ()):
                types[int(number) - 1] = kind
    if types is None:
        types = [
            "full_attention" if i and i % 4 == 0 else "linear_attention"
            for i in range(layers)
        ]
    return _checked("layer_types", types, LAYER_TYPES, config)


def mlp_layer_types(config):
    """Each layer's feed-forward: `mlp_layer_types`, else dense on the
    first `first_k_dense_replace` (default 1) layers, sparse after."""
    layers = int(config.require("num_hidden_layers"))
    types = config.get("mlp_layer_types")
    if types is None:
        first = int(config.get("first_k_dense_replace", 1))
        types = ["dense" if i < first else "sparse" for i in range(layers)]
    return _checked("mlp_layer_types", types, MLP_TYPES, config)


def _checked(name, types, kinds, config):
    layers = int(config.require("num_hidden_layers"))
    types = list(types)
    if len(types) != layers or set(types) - set(kinds):
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            f"{name}={types!r} must give one of {kinds} for each of its "
            f"{layers} layers."
        )
    return types


def _refuse_unsupported(config):
    """The options Kimi Linear's converter refuses by name: activations
    other than silu, MLA with positions (`mla_use_nope=False`), key/value
    heads other than the heads, another router activation, MoE layers
    not every layer, no shared expert."""
    config.refuse("hidden_act", ("silu", "swish"), "silu")
    config.refuse("mla_use_nope", (True,), True)
    heads = config.require("num_attention_heads")
    config.refuse("num_key_value_heads", (heads,), heads)
    config.refuse("moe_router_activation_func", ("sigmoid",), "sigmoid")
    config.refuse("moe_layer_freq", (1,), 1)
    shared = int(_get(config, "num_shared_experts"))
    if shared < 1:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            f"num_shared_experts={shared!r} is not supported (at least 1)."
        )


def latent_arguments(config):
    """The `MultiHeadLatentAttention` of the full-attention layers:
    DeepSeek's MLA sizes, no rotary positions (`rope_theta=None`: Kimi
    Linear's MLA is NoPE, its shared rope key included), transformers'
    1e-6 latent norms."""
    q_lora_rank = config.get("q_lora_rank")
    return dict(
        num_heads=int(config.require("num_attention_heads")),
        kv_lora_rank=int(_get(config, "kv_lora_rank")),
        qk_nope_head_dim=int(_get(config, "qk_nope_head_dim")),
        qk_rope_head_dim=int(_get(config, "qk_rope_head_dim")),
        v_head_dim=int(_get(config, "v_head_dim")),
        q_lora_rank=None if q_lora_rank is None else int(q_lora_rank),
        rope_theta=None,
        attention_bias=bool(config.get("attention_bias", False)),
        rms_norm_eps=1e-6,
    )


def moe_arguments(config):
    """The `MixtureOfExperts` of the sparse layers: `"sigmoid_topk"`
    routing with the score-correction bias, `num_expert_group` groups of
    which `topk_group` are kept, renormalized with `moe_renormalize`,
    times `routed_scaling_factor`; SwiGLU experts; the shared experts as
    one ungated expert of `num_shared_experts * moe_intermediate_size`."""
    width = int(_get(config, "moe_intermediate_size"))
    return dict(
        num_experts=int(_get(config, "num_experts")),
        top_k=int(_get(config, "num_experts_per_token")),
        intermediate_dim=width,
        routing="sigmoid_topk",
        normalize_top_k=bool(_get(config, "moe_renormalize")),
        score_correction_bias=True,
        num_groups=int(_get(config, "num_expert_group")),
        top_k_groups=int(_get(config, "topk_group")),
        routed_scaling_factor=float(_get(config, "routed_scaling_factor")),
        shared_expert_dim=width * int(_get(config, "num_shared_experts")),
    )


def _mixer(config, kind, dtype):
    """Layer's self-attention: a `KimiDeltaAttention` or the NoPE MLA."""
    if kind == "linear_attention":
        return KimiDeltaAttention(
            int(config.require("hidden_size")),
            num_heads=int(_get(config, "linear_num_heads")),
            head_dim=int(_get(config, "linear_head_dim")),
            conv_kernel_size=int(_get(config, "linear_conv_kernel_dim")),
            hidden_activation="silu",
            layer_norm_epsilon=float(config.get("rms_norm_eps", 1e-5)),
            dtype=dtype,
            name="self_attention",
        )
    return MultiHeadLatentAttention(
        **latent_arguments(config), dtype=dtype, name="self_attention"
    )


def kimi_linear_model(config, dtype, types, mlp_types):
    """The model: a token embedding, pre-norm `TransformerDecoderBlock`s
    (RMS norms of `rms_norm_eps`) named `transformer_layer_{i}` whose
    self-attention is layer `i`'s mixer (`types`) and whose feed-forward
    is a SwiGLU `FeedForward` of `intermediate_size` ("dense") or the
    `MixtureOfExperts` ("sparse"), then the final RMS norm."""
    moe = moe_arguments(config)

    def sublayers(i):
        if mlp_types[i] == "sparse":
            feed_forward = _common.mixture_of_experts(moe, dtype)
        else:
            feed_forward = _common.feed_forward(
                int(config.require("intermediate_size")),
                activation="silu",
                use_bias=False,
                gated=True,
                dtype=dtype,
            )
        return _mixer(config, types[i], dtype), feed_forward

    return _common.rms_decoder_model(
        len(types),  # `mlp_types` as long (`_checked`)
        sublayers,
        vocabulary_size=int(config.require("vocab_size")),
        hidden_dim=int(config.require("hidden_size")),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        epsilon=float(config.get("rms_norm_eps", 1e-5)),
        dtype=dtype,
        name=config.model_type,
    )


def _delta_rows(theirs, ours):
    """A `KimiDeltaAttention`'s rows: its projections by name, the three
    short convolutions read as ours, `A_log` flattened."""
    rows = tuple(
        (f"{theirs}{name}.weight", f"{ours}{name}/kernel", "linear")
        for name in (
            "q_proj",
            "k_proj",
            "v_proj",
            "f_a_proj",
            "f_b_proj",
            "b_proj",
            "g_a_proj",
            "g_b_proj",
            "o_proj",
        )
    )
    return rows + (
        (
            tuple(f"{theirs}{c}_conv1d.weight" for c in "qkv"),
            ours + "conv1d_kernel",
            "depthwise_conv",
        ),
        (theirs + "dt_bias", ours + "dt_bias", "copy"),
        (theirs + "A_log", ours + "A_log", A_LOG),
        (theirs + "o_norm.weight", ours + "o_norm/scale", "copy"),
    )


def _latent_rows(theirs, ours, arguments):
    """A `MultiHeadLatentAttention`'s rows: transformers' names are
    ours."""
    names = ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    if arguments["q_lora_rank"] is None:
        names.append("q_proj")
    else:
        names += ["q_a_proj", "q_b_proj"]
    norms = ["kv_a_layernorm"] + (
        [] if arguments["q_lora_rank"] is None else ["q_a_layernorm"]
    )
    rows = tuple(
        (f"{theirs}{name}.weight", f"{ours}{name}/kernel", "linear")
        for name in names
    ) + tuple(
        (f"{theirs}{name}.weight", f"{ours}{name}/scale", "copy")
        for name in norms
    )
    if arguments["attention_bias"]:
        biased = ["kv_a_proj_with_mqa", "o_proj"]
        if arguments["q_lora_rank"] is not None:
            biased.append("q_a_proj")
        rows += tuple(
            (f"{theirs}{name}.bias", f"{ours}{name}/bias", "copy")
            for name in biased
        )
    return rows


def _dense_rows(theirs, ours):
    """A dense layer's SwiGLU MLP: under `mlp.` in Moonshot's checkpoints,
    under `block_sparse_moe.` as transformers saves it (its renaming of
    `block_sparse_moe.` to `mlp.` reversed for every layer)."""
    return tuple(
        (
            weights.OneOf(
                (
                    f"{theirs}{block}.{name}_proj.weight"
                    for block in ("mlp", "block_sparse_moe")
                )
            ),
            f"{ours}{dense}/kernel",
            "linear",
        )
        for name, dense in (
            ("gate", "gate_dense"),
            ("up", "intermediate_dense"),
            ("down", "output_dense"),
        )
    )


def weight_table(config, types, mlp_types):
    """The table of a `kimi_linear` checkpoint: per layer its mixer's
    rows (under `self_attn.`), its feed-forward's (the dense MLP,
    `_dense_rows`; the experts (`w1` gate, `w3` up, `w2` down), their router
    and its `e_score_correction_bias`, and the shared experts under
    `block_sparse_moe.`), its two norms; the embedding, final norm and
    head."""
    table = (
        ("model.embed_tokens.weight", "token_embedding/embeddings", "copy"),
        ("model.norm.weight", "sequence_output_layernorm/scale", "copy"),
    )
    if not config.get("tie_word_embeddings", False):
        table += (
            ("lm_head.weight", "token_embedding/reverse_embeddings", "linear"),
        )
    latent = latent_arguments(config)
    experts = int(_get(config, "num_experts"))
    for i, (kind, mlp) in enumerate(zip(types, mlp_types)):
        theirs, ours = f"model.layers.{i}.", f"transformer_layer_{i}/"
        attention = (theirs + "self_attn.", ours + "self_attention/")
        if kind == "linear_attention":
            table += _delta_rows(*attention)
        else:
            table += _latent_rows(*attention, latent)
        table += (
            (
                theirs + "input_layernorm.weight",
                ours + "self_attention_norm/scale",
                "copy",
            ),
            (
                theirs + "post_attention_layernorm.weight",
                ours + "feed_forward_norm/scale",
                "copy",
            ),
        )
        moe, feed_forward = theirs + "block_sparse_moe.", ours + "feed_forward/"
        if mlp == "dense":
            table += _dense_rows(theirs, feed_forward)
            continue
        table += mixtral.expert_rows(
            i, "block_sparse_moe.", experts, mixtral.MIXTRAL_NAMES
        )
        table += shared_expert_rows(moe, feed_forward, "shared_experts")
        table += (
            (
                moe + "gate.e_score_correction_bias",
                feed_forward + "score_correction_bias",
                "copy",
            ),
        )
    return table


def convert_kimi_linear(config, dtype):
    """A `kimi_linear` checkpoint's model (`kimi_linear_model`).

    - Its `layer_types` (or Moonshot's `linear_attn_config`):
      `keras_attention.layers.KimiDeltaAttention` on "linear_attention"
      layers (`linear_num_heads` heads of `linear_head_dim`, short
      convolutions of `linear_conv_kernel_dim`, output norm epsilon
      `rms_norm_eps`), a `MultiHeadLatentAttention` without rotary
      positions on "full_attention" layers (transformers' Kimi MLA is
      NoPE: `mla_use_nope`, refused when false; `q_lora_rank`,
      `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`,
      `v_head_dim`, `attention_bias`).
    - Its `mlp_layer_types` (or `first_k_dense_replace`): a SwiGLU MLP of
      `intermediate_size` on dense layers; on sparse ones a
      `MixtureOfExperts` with DeepSeek-V3's routing (`moe_arguments`).
    - Plain RMS norms (`x * w`), the tied or untied head.

    Refused by name: `hidden_act` other than silu, `num_key_value_heads`
    other than the heads (transformers' MLA has one key per head),
    `moe_router_activation_func` other than sigmoid, `moe_layer_freq`
    other than 1, no shared expert. The model has no rotary positions at
    all, so no RoPE field is read.

    Padding: transformers zeroes padded tokens before each KDA layer, so
    they add nothing to its state or convolutions; ours takes them out
    of the sequence. The real tokens' outputs are the same, left or
    right padded.

    References:
        - Kimi Team, 2025, "Kimi Linear: An Expressive, Efficient
          Attention Architecture" (arXiv 2510.26692).
    """
    _refuse_unsupported(config)
    types, mlp_types = layer_types(config), mlp_layer_types(config)
    model = kimi_linear_model(config, dtype, types, mlp_types)
    ignored = ()
    if config.get("tie_word_embeddings", False):
        ignored = ("lm_head.weight",)
    return Conversion(
        model,
        weight_table(config, types, mlp_types),
        len(types),
        ignored,
    )
