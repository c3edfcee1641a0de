"""Hugging Face `gemma`, `gemma2` and `gemma3_text` checkpoints: the
config read into `keras_attention.interop.gemma.gemma_style_model`'s
arguments (the builder keras-hub's Gemma converters use), the tensors
mapped by `WEIGHT_TABLE` (Gemma 2 and 3 add `POST_NORM_TABLE`, Gemma 3
`QK_NORM_TABLE`). Gemma's RMS norms multiply by `1 + w`: their scales
are loaded as `w + 1` ("norm_plus_one")."""

from keras_attention.interop.gemma import gemma_style_model
from keras_attention.interop.hf import Conversion
from keras_attention.interop.hf import configs
from keras_attention.interop.hf import llama
from keras_attention.layers.activations import gelu_approximate
from keras_attention.scores.soft_cap import SoftCap

LAYER = "model.layers.{i}."
OURS = "decoder_block_{i}/"

# The projections as Llama's; the norms `1 + w`. Gemma 1's
# `post_attention_layernorm` is the feed-forward's pre-norm.
WEIGHT_TABLE = tuple(
    (
        theirs,
        ours.replace("transformer_layer_{i}/", OURS),
        transform,
    )
    for theirs, ours, transform in llama.WEIGHT_TABLE
    if "layernorm" not in theirs and theirs != "model.norm.weight"
) + (
    (
        LAYER + "input_layernorm.weight",
        OURS + "self_attention_norm/scale",
        "norm_plus_one",
    ),
    ("model.norm.weight", "final_normalization/scale", "norm_plus_one"),
)
GEMMA1_NORM_TABLE = (
    (
        LAYER + "post_attention_layernorm.weight",
        OURS + "feed_forward_norm/scale",
        "norm_plus_one",
    ),
)
# Gemma 2 and 3: a norm before and after each sublayer (our blocks'
# `sandwich_norm`).
POST_NORM_TABLE = tuple(
    (LAYER + f"{theirs}.weight", OURS + f"{ours}/scale", "norm_plus_one")
    for theirs, ours in (
        ("post_attention_layernorm", "self_attention_post_norm"),
        ("pre_feedforward_layernorm", "feed_forward_norm"),
        ("post_feedforward_layernorm", "feed_forward_post_norm"),
    )
)
# Gemma 3's QK-norms (one `head_dim` scale each, `1 + w`).
QK_NORM_TABLE = tuple(
    (
        LAYER + f"self_attn.{theirs}_norm.weight",
        OURS + f"self_attention/{ours}_norm/scale",
        "norm_plus_one",
    )
    for theirs, ours in (("q", "query"), ("k", "key"))
)
ATTENTION_BIAS_TABLE = tuple(
    (theirs, ours.replace("transformer_layer_{i}/", OURS), transform)
    for theirs, ours, transform in llama.ATTENTION_BIAS_TABLE
)

# transformers' Gemma 3 rotary wavelengths when the config has none.
GEMMA3_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}


def _activation(config):
    """Gemma's feed-forward activation: transformers' Gemma (1) reads
    `hidden_act` and takes its legacy "gelu" for the tanh approximation;
    Gemma 2 and 3 read `hidden_activation` as it says."""
    if config.model_type == "gemma":
        if config.get("hidden_act") == "gelu":
            return gelu_approximate
        return configs.activation(config, default="gelu_pytorch_tanh")
    return configs.activation(
        config, "hidden_activation", default="gelu_pytorch_tanh"
    )


def gemma_arguments(config):
    """`gemma_style_model`'s `config` from a Gemma `HFConfig`."""
    if config.get("use_bidirectional_attention"):
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            "use_bidirectional_attention=True (embedding models) is not "
            "supported."
        )
    return {
        "vocabulary_size": int(config.require("vocab_size")),
        "num_layers": int(config.require("num_hidden_layers")),
        "num_query_heads": int(config.require("num_attention_heads")),
        "num_key_value_heads": int(
            config.get("num_key_value_heads", config.get("num_attention_heads"))
        ),
        "hidden_dim": int(config.require("hidden_size")),
        "intermediate_dim": int(config.require("intermediate_size")),
        "head_dim": config.head_dim(),
        "layer_norm_epsilon": float(config.get("rms_norm_eps", 1e-6)),
        "dropout": 0.0,
        "final_logit_soft_cap": config.get("final_logit_softcapping"),
        "activation": _activation(config),
        "attention_bias": bool(config.get("attention_bias", False)),
    }


def _gemma3_rope(config, layer_type):
    """Gemma 3's rotary arguments of a kind of layer: transformers 5's
    nested `rope_parameters`, or transformers 4's `rope_theta` (global
    layers, with `rope_scaling`) and `rope_local_base_freq` (windowed
    layers, unscaled)."""
    if config.get("rope_parameters") is None:
        values = dict(config.values)
        if layer_type == "sliding_attention":
            values["rope_scaling"] = None
            values["rope_theta"] = config.get(
                "rope_local_base_freq", GEMMA3_THETA[layer_type]
            )
        config = configs.HFConfig(values)
    return configs.rope_arguments(
        config, layer_type, default_theta=GEMMA3_THETA[layer_type]
    )


def _layer_types(config):
    """transformers' default `layer_types`: Gemma 2 alternates windowed
    and global layers (from a windowed one), Gemma 3 five windowed for
    one global (`sliding_window_pattern`); Gemma 1 has no windows."""
    layers = int(config.require("num_hidden_layers"))
    if config.model_type == "gemma":
        return ["full_attention"] * layers
    pattern = 2
    if config.model_type == "gemma3_text":
        pattern = int(config.get("sliding_window_pattern", 6))
    return [
        "sliding_attention" if (i + 1) % pattern else "full_attention"
        for i in range(layers)
    ]


def convert_gemma(config, dtype):
    """A `gemma`, `gemma2` or `gemma3_text` checkpoint's model:
    `gemma_style_model` (the tied token table scaled by
    `sqrt(hidden_size)`, GeGLU of `intermediate_size`, norms `1 + w`)
    with each generation's options: Gemma 2's and 3's post-norms
    (`sandwich_norm`), windowed layers (`layer_types`, `window_size =
    sliding_window - 1`), soft-caps (`attn_logit_softcapping` as a
    `SoftCap` score object, `final_logit_softcapping` on the logits),
    query scaling `query_pre_attn_scalar ** -0.5`; Gemma 3's QK-norm
    and a rotary wavelength (and scaling) per kind of layer.
    `use_bidirectional_attention` is refused.

    References:
        - Gemma Team, 2024, "Gemma: Open Models Based on Gemini Research
          and Technology".
        - Gemma Team, 2024, "Gemma 2: Improving Open Language Models at a
          Practical Size".
        - Gemma Team, 2025, "Gemma 3 Technical Report".
    """
    arguments = gemma_arguments(config)
    later = config.model_type != "gemma"
    types = config.layer_types(_layer_types(config))
    windows = llama.layer_windows(config, config.get("sliding_window"), types)
    soft_cap = config.get("attn_logit_softcapping") if later else None
    scale = None
    if later:
        scalar = float(config.get("query_pre_attn_scalar", 256))
        if scalar != arguments["head_dim"]:
            scale = scalar**-0.5
    rope = {}
    for kind in set(types):
        if config.model_type == "gemma3_text":
            rope[kind] = _gemma3_rope(config, kind)
        else:
            rope[kind] = configs.rope_arguments(config)

    def layer_attention(i):
        own = dict(rope[types[i]])
        if own.pop("rotary_fraction") != 1.0:
            raise ValueError(
                f"config.json of model_type {config.model_type!r}: "
                "partial_rotary_factor is not supported."
            )
        if windows[i] is not None:
            own["window_size"] = windows[i]
        if soft_cap is not None:
            own["score_mod"] = SoftCap(float(soft_cap))
        if scale is not None:
            own["attention_scale"] = scale
        if config.model_type == "gemma3_text":
            own["qk_norm"] = "rms"
            own["qk_norm_epsilon"] = arguments["layer_norm_epsilon"]
        return own

    model = gemma_style_model(
        arguments,
        dtype,
        config.model_type,
        layer_attention,
        sandwich_norm=later,
    )
    table = WEIGHT_TABLE + (POST_NORM_TABLE if later else GEMMA1_NORM_TABLE)
    if config.model_type == "gemma3_text":
        table += QK_NORM_TABLE
    if arguments["attention_bias"]:
        table += ATTENTION_BIAS_TABLE
    ignored = llama.IGNORED + ("lm_head.weight",)
    if not config.get("tie_word_embeddings", True):
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            "tie_word_embeddings=False is not supported (Gemma ties its "
            "head to the token table)."
        )
    return Conversion(model, table, arguments["num_layers"], ignored)
