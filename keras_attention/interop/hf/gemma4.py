"""Hugging Face `gemma4_text` checkpoints: the config read into
`keras_attention.interop.gemma4.gemma4_text_model`'s arguments (the
builder of keras-hub's Gemma 4 converter), the tensors mapped layer by
layer (the shared layers have no key/value projections, the K = V ones
no value projection). Gemma 4's RMS norms multiply by `w` ("copy"), and
each layer's `layer_scalar` fills the `LayerScalar` after its block."""

from keras_attention.interop.gemma4 import gemma4_text_model
from keras_attention.interop.gemma4 import kv_sources
from keras_attention.interop.hf import Conversion

LAYER = "model.layers.{i}."
OURS = "decoder_block_{i}/"
SLIDING, FULL = "sliding_attention", "full_attention"

# Every layer's tensors -> ours.
LAYER_ROWS = (
    ("self_attn.q_proj.weight", "self_attention/query/kernel", "linear"),
    (
        "self_attn.o_proj.weight",
        "self_attention/attention_output/kernel",
        "linear_in2",
    ),
    ("self_attn.q_norm.weight", "self_attention/query_norm/scale", "copy"),
    ("input_layernorm.weight", "self_attention_norm/scale", "copy"),
    (
        "post_attention_layernorm.weight",
        "self_attention_post_norm/scale",
        "copy",
    ),
    ("pre_feedforward_layernorm.weight", "feed_forward_norm/scale", "copy"),
    (
        "post_feedforward_layernorm.weight",
        "feed_forward_post_norm/scale",
        "copy",
    ),
    ("mlp.gate_proj.weight", "feed_forward/gate_dense/kernel", "linear"),
    ("mlp.up_proj.weight", "feed_forward/intermediate_dense/kernel", "linear"),
    ("mlp.down_proj.weight", "feed_forward/output_dense/kernel", "linear"),
)
# A layer that computes its keys (not a reader of shared ones).
KEY_ROWS = (
    ("self_attn.k_proj.weight", "self_attention/key/kernel", "linear"),
    ("self_attn.k_norm.weight", "self_attention/key_norm/scale", "copy"),
)
VALUE_ROWS = (
    ("self_attn.v_proj.weight", "self_attention/value/kernel", "linear"),
)
# The `LayerScalar` after each block: its output's scale, shape `(1,)`.
SCALAR_ROW = (LAYER + "layer_scalar", "layer_scalar_{i}/layer_scalar", "copy")
MODEL_ROWS = (
    ("model.embed_tokens.weight", "token_embedding/embeddings", "copy"),
    ("model.norm.weight", "final_normalization/scale", "copy"),
)
# The tied head (saved anyway by some writers).
IGNORED = ("lm_head.weight",)

# Options this converter does not build: (name, the values that mean
# "off").
REFUSED = (
    ("hidden_size_per_layer_input", (None, 0)),
    ("enable_moe_block", (None, False)),
    ("use_bidirectional_attention", (None, False)),
    ("attention_bias", (None, False)),
    ("hidden_activation", (None, "gelu_pytorch_tanh")),
    ("tie_word_embeddings", (None, True)),
)


def _rope(config, kind):
    """`(wavelength, linear factor, partial rotary factor)` of a kind of
    layer from the nested `rope_parameters` ("default" or
    "proportional")."""
    defaults = {
        SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
        FULL: {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1_000_000.0,
        },
    }
    params = dict((config.get("rope_parameters") or defaults).get(kind, {}))
    kind_name = params.pop("rope_type", "default")
    theta = float(params.pop("rope_theta", defaults[kind]["rope_theta"]))
    factor = float(params.pop("factor", 1.0))
    fraction = float(params.pop("partial_rotary_factor", 1.0))
    if kind_name not in ("default", "proportional") or params:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: RoPE "
            f"{kind_name!r} with {sorted(params)!r} of the {kind} layers is "
            "not supported (supported: 'default', 'proportional' with "
            "rope_theta, factor, partial_rotary_factor)."
        )
    if kind_name == "default" and fraction != 1.0:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: "
            "partial_rotary_factor with RoPE 'default' is not supported."
        )
    return theta, factor, fraction


def _layer_sizes(config, types):
    """`(global_head_dim, num_global_key_value_heads)` from
    `per_layer_config` (the full layers' overrides, one for all);
    `ValueError` for overrides of sliding layers or unequal ones."""
    overrides = {
        int(i): dict(v)
        for i, v in (config.get("per_layer_config") or {}).items()
    }
    head_dim, heads = (
        config.head_dim(),
        int(config.require("num_key_value_heads")),
    )
    found = set()
    for i, kind in enumerate(types):
        own = overrides.get(i, {})
        if kind == SLIDING and own:
            raise ValueError(
                f"config.json of model_type {config.model_type!r}: "
                f"per_layer_config of sliding layer {i} ({own!r}) is not "
                "supported."
            )
        if kind == FULL:
            found.add(
                (
                    int(own.get("head_dim", head_dim)),
                    int(own.get("num_key_value_heads", heads)),
                )
            )
    if len(found) > 1:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: full layers "
            f"of different sizes {sorted(found)!r} are not supported."
        )
    return found.pop() if found else (head_dim, heads)


def gemma4_arguments(config):
    """`gemma4_text_model`'s `config` from a `gemma4_text` `HFConfig`."""
    for name, off in REFUSED:
        config.refuse(name, off)
    layers = int(config.require("num_hidden_layers"))
    pattern = [SLIDING if (i + 1) % 6 else FULL for i in range(layers)]
    types = config.layer_types(pattern)
    global_head_dim, global_heads = _layer_sizes(config, types)
    k_eq_v = bool(config.get("attention_k_eq_v", False))
    if not k_eq_v and global_heads != int(
        config.require("num_key_value_heads")
    ):
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: other "
            "key/value heads on the full layers without attention_k_eq_v "
            "are not supported."
        )
    local_theta, local_factor, local_fraction = _rope(config, SLIDING)
    global_theta, global_factor, global_fraction = _rope(config, FULL)
    if local_fraction != 1.0:
        raise ValueError(
            f"config.json of model_type {config.model_type!r}: partial "
            "rotary positions on the sliding layers are not supported."
        )
    window = config.get("sliding_window")
    return {
        "vocabulary_size": int(config.require("vocab_size")),
        "num_layers": layers,
        "num_query_heads": int(config.require("num_attention_heads")),
        "num_key_value_heads": int(config.require("num_key_value_heads")),
        "num_global_key_value_heads": global_heads if k_eq_v else None,
        "hidden_dim": int(config.require("hidden_size")),
        "intermediate_dim": int(config.require("intermediate_size")),
        "head_dim": config.head_dim(),
        "global_head_dim": global_head_dim,
        "layer_norm_epsilon": float(config.get("rms_norm_eps", 1e-6)),
        "dropout": 0.0,
        "layer_types": types,
        # transformers masks `q - kv < sliding_window`: keras-hub's band.
        "sliding_window_size": None if window is None else int(window),
        "local_rope_wavelength": local_theta,
        "global_rope_wavelength": global_theta,
        "local_rope_scaling_factor": local_factor,
        "global_rope_scaling_factor": global_factor,
        "global_rope_partial_rotary_factor": global_fraction,
        "attention_logit_soft_cap": None,
        "final_logit_soft_cap": config.get("final_logit_softcapping"),
        "num_kv_shared_layers": int(config.get("num_kv_shared_layers", 0)),
        "use_double_wide_mlp": bool(config.get("use_double_wide_mlp")),
    }


def weight_table(arguments):
    """The rows of every layer (concrete indices: the shared layers
    read no keys or values, the K = V layers no values)."""
    sources = kv_sources(
        arguments["layer_types"], arguments["num_kv_shared_layers"]
    )
    rows = list(MODEL_ROWS)
    for i, kind in enumerate(arguments["layer_types"]):
        own = LAYER_ROWS
        if i not in sources:
            own += KEY_ROWS
            k_eq_v = (
                kind == FULL
                and arguments["num_global_key_value_heads"] is not None
            )
            if not k_eq_v:
                own += VALUE_ROWS
        rows += [
            ((LAYER + theirs).format(i=i), (OURS + ours).format(i=i), how)
            for theirs, ours, how in own
        ]
        rows.append(tuple(part.format(i=i) for part in SCALAR_ROW))
    return tuple(rows)


def convert_gemma4(config, dtype):
    """A `gemma4_text` checkpoint's model: `gemma4_text_model` (see
    `interop.gemma4.convert_gemma4`) with positions `0 .. T - 1` (inputs
    `token_ids`, `padding_mask`). Refused by name: per-layer inputs
    (`hidden_size_per_layer_input`), the MoE block, bidirectional
    attention, attention biases, other activations, an untied head,
    other RoPE types, per-layer sizes other than the full layers' own.

    References:
        - Gemma Team, 2026, Gemma 4 (transformers' `gemma4`).
    """
    arguments = gemma4_arguments(config)
    model = gemma4_text_model(
        arguments, dtype, config.model_type, position_ids=False
    )
    return Conversion(
        model, weight_table(arguments), arguments["num_layers"], IGNORED
    )
