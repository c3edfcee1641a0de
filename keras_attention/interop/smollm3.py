"""keras-hub's `SmolLM3Backbone` rebuilt from `keras_attention` blocks."""

import numpy as np

from keras_attention.interop import _common
from keras_attention.interop.llama import build_llama_style

# Layer `i`'s weights: their attribute path under
# `backbone.transformer_layers[i]` -> our weight path under
# `transformer_layer_{i}/`. By attribute, not by weight path: keras-hub
# 0.32 builds each layer's `o_proj` (and `rotary_emb`) outside the layer's
# name scope, so every layer's output kernel has the path `o_proj/kernel`.
# Their query/key/value kernels are `(hidden, heads * head_dim)`, ours
# `(hidden, heads, head_dim)` (the same numbers, reshaped).
LAYER_TABLE = (
    ("self_attn.q_proj.kernel", "self_attention/query/kernel"),
    ("self_attn.k_proj.kernel", "self_attention/key/kernel"),
    ("self_attn.v_proj.kernel", "self_attention/value/kernel"),
    ("self_attn.o_proj.kernel", "self_attention/attention_output/kernel"),
    ("input_layernorm.scale", "self_attention_norm/scale"),
    ("mlp.gate_proj.kernel", "feed_forward/gate_dense/kernel"),
    ("mlp.up_proj.kernel", "feed_forward/intermediate_dense/kernel"),
    ("mlp.down_proj.kernel", "feed_forward/output_dense/kernel"),
    ("post_attention_layernorm.scale", "feed_forward_norm/scale"),
)
# The weights outside the layers (their path -> ours; unique paths).
OUTER_TABLE = (
    ("token_embedding/embeddings", "token_embedding/embeddings"),
    ("sequence_output_layernorm/scale", "sequence_output_layernorm/scale"),
)


def uses_rope(backbone, i):
    """Whether layer `i` of a SmolLM3 backbone has rotary positions: its
    attention's `use_rope`, else keras-hub's rule
    (`rope_layer_enabled_list[i]`, True past the list's end)."""
    layers = getattr(backbone, "transformer_layers", None) or ()
    attention = getattr(layers[i], "self_attn", None) if layers else None
    if getattr(attention, "use_rope", None) is not None:
        return bool(attention.use_rope)
    enabled = backbone.get_config()["rope_layer_enabled_list"]
    return bool(enabled[i]) if i < len(enabled) else True


def _check_options(get):
    """`ValueError` for the options the converted blocks do not have."""
    for name in ("attention_bias", "mlp_bias"):
        if get.get(name):
            raise ValueError(
                f"SmolLM3 with `{name}` does not convert (our attention's "
                "`use_bias` sets the biases of all its projections, and "
                "keras-hub's output projection has none; its feed-forward "
                f"biases are not converted yet). Received: "
                f"{name}={get[name]!r}"
            )
    factor = get.get("partial_rotary_factor", 1.0)
    if factor is not None and float(factor) != 1.0:
        raise ValueError(
            "SmolLM3 converts with `partial_rotary_factor=1.0` only "
            "(keras-hub 0.32's SmolLM3 rotary embedding does not compute "
            f"with others). Received: partial_rotary_factor={factor!r}"
        )


def _inverse_frequencies(backbone, config, rope):
    """Their stored RoPE inverse frequencies (one variable per layer, not
    copied: our blocks compute them), checked against `rope_theta` on the
    layers that use them (`ValueError` otherwise)."""
    head_dim = config["hidden_dim"] // config["num_query_heads"]
    expected = 1.0 / (
        float(config["rope_max_wavelength"])
        ** (np.arange(0, head_dim, 2, dtype="float64") / head_dim)
    )
    variables = []
    for i, layer in enumerate(backbone.transformer_layers):
        variable = layer.self_attn.rotary_embedding.inv_freq
        variables.append(variable)
        stored = _common.numpy_value(variable)
        if rope[i] and not np.allclose(stored, expected, rtol=1e-5):
            raise ValueError(
                f"Layer {i}'s stored RoPE inverse frequencies "
                f"(`rotary_emb/inv_freq`) are not those of rope_theta="
                f"{config['rope_max_wavelength']!r}. Received: {stored!r}"
            )
    return variables


def _attribute(layer, dotted):
    for name in dotted.split("."):
        layer = getattr(layer, name)
    return layer


def _copy_smollm3_weights(backbone, model, config, rope):
    """Copies the backbone's weights into `model` by `LAYER_TABLE` and
    `OUTER_TABLE` (query/key/value kernels reshaped to ours)."""
    ours = {w.path: w for w in model.weights}
    theirs = {w.path: w for w in backbone.weights}
    pairs = [(theirs[a], ours[b], None) for a, b in OUTER_TABLE]
    for i, layer in enumerate(backbone.transformer_layers):
        for attribute, path in LAYER_TABLE:
            target = ours[f"transformer_layer_{i}/{path}"]
            value = _common.numpy_value(_attribute(layer, attribute))
            if value.size == int(np.prod(target.shape)):
                value = value.reshape(tuple(target.shape))
            pairs.append((_attribute(layer, attribute), target, value))
    _common.copy_pairs(
        backbone,
        model,
        pairs,
        recomputed=_inverse_frequencies(backbone, config, rope),
    )


def convert_smollm3(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `SmolLM3Backbone`, holding a copy of its weights.

    The Llama-style model of `keras_attention.interop.llama` (the tied
    token embedding, pre-norm blocks with RMS norms, no biases,
    grouped-query attention with heads of `hidden_dim //
    num_attention_heads`, a SwiGLU feed-forward, the final norm) with
    rotary positions (wavelength `rope_theta`) only on the layers whose
    `rope_layer_enabled_list` entry is True (True past the list's end, as
    keras-hub; SmolLM3-3B: every fourth layer is "NoPE"); the others get
    `rotary_max_wavelength=None`, no positions at all besides the causal
    mask. What maps to what: `LAYER_TABLE` (by attribute: keras-hub 0.32
    gives every layer's output projection the same weight path
    `o_proj/kernel`) and `OUTER_TABLE`; the stored RoPE inverse
    frequencies (`rotary_emb/inv_freq`) are checked against `rope_theta`,
    not copied. `attention_dropout`, which keras-hub's SmolLM3 attention
    never applies, and `layer_types`, which it stores without using, are
    not carried over. `attention_bias`, `mlp_bias` and a
    `partial_rotary_factor` other than 1 are refused (`ValueError`).

    Args:
        backbone: a built `keras_hub.models.SmolLM3Backbone`.

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.smollm3 import convert_smollm3
    >>> backbone = keras_hub.models.SmolLM3Backbone(
    ...     vocabulary_size=20, hidden_dim=8, intermediate_dim=16,
    ...     num_layers=2, num_attention_heads=2, num_key_value_heads=1,
    ...     attention_bias=False, attention_dropout=0.0,
    ...     rope_layer_enabled_list=[True, False],
    ...     layer_types=["attention"] * 2, mlp_bias=False,
    ...     layer_norm_epsilon=1e-6, max_position_embeddings=32,
    ...     rope_theta=10000.0, partial_rotary_factor=1.0)
    >>> model = convert_smollm3(backbone)
    >>> blocks = [model.get_layer(f"transformer_layer_{i}") for i in range(2)]
    >>> [block.self_attention.rotary_max_wavelength for block in blocks]
    [10000.0, None]

    References:
        - Hugging Face, 2025, "SmolLM3: smol, multilingual, long-context
          reasoner".
        - Kazemnejad et al., 2023, "The Impact of Positional Encoding on
          Length Generalization in Transformers" (NoPE).
    """
    get = backbone.get_config()
    _check_options(get)
    config = {
        "vocabulary_size": _common.config_value(backbone, "vocabulary_size"),
        "num_layers": _common.config_value(backbone, "num_layers"),
        "num_query_heads": _common.config_value(
            backbone, "num_attention_heads"
        ),
        "num_key_value_heads": _common.config_value(
            backbone, "num_key_value_heads"
        ),
        "hidden_dim": _common.config_value(backbone, "hidden_dim"),
        "intermediate_dim": _common.config_value(backbone, "intermediate_dim"),
        "rope_max_wavelength": float(
            _common.config_value(backbone, "rope_theta")
        ),
        "layer_norm_epsilon": _common.config_value(
            backbone, "layer_norm_epsilon"
        ),
        "dropout": 0.0,
        "tie_word_embeddings": bool(
            getattr(backbone.token_embedding, "tie_weights", True)
        ),
    }
    rope = [uses_rope(backbone, i) for i in range(config["num_layers"])]

    def layer_attention(i):
        return {} if rope[i] else {"rotary_max_wavelength": None}

    model = build_llama_style(
        backbone, config, table=None, layer_attention=layer_attention
    )
    _copy_smollm3_weights(backbone, model, config, rope)
    return model
