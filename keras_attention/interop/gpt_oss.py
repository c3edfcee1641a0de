"""keras-hub's `GptOssBackbone` rebuilt from `keras_attention` blocks."""

from keras_attention.interop import _common
from keras_attention.interop.llama import llama_style_config
from keras_attention.interop.llama import llama_style_model
from keras_attention.layers import mixture_of_experts

# Their weight path prefix -> ours (`{i}`: the layer index). The attention
# (projections with biases, `sinks`) and the norms' `scale` have the same
# names and shapes on both sides; the experts are renamed one by one.
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    (
        "transformer_layer_{i}/self_attention",
        "transformer_layer_{i}/self_attention",
    ),
    (
        "transformer_layer_{i}/input_layernorm",
        "transformer_layer_{i}/self_attention_norm",
    ),
    (
        "transformer_layer_{i}/post_attention_layernorm",
        "transformer_layer_{i}/feed_forward_norm",
    ),
    (
        "transformer_layer_{i}/sparse_moe_block/router/router_dense/kernel",
        "transformer_layer_{i}/feed_forward/router_kernel",
    ),
    (
        "transformer_layer_{i}/sparse_moe_block/router/router_dense/bias",
        "transformer_layer_{i}/feed_forward/router_bias",
    ),
    (
        "transformer_layer_{i}/sparse_moe_block/experts/gate_up_proj",
        "transformer_layer_{i}/feed_forward/gate_up_kernel",
    ),
    (
        "transformer_layer_{i}/sparse_moe_block/experts/gate_up_proj_bias",
        "transformer_layer_{i}/feed_forward/gate_up_bias",
    ),
    (
        "transformer_layer_{i}/sparse_moe_block/experts/down_proj",
        "transformer_layer_{i}/feed_forward/down_kernel",
    ),
    (
        "transformer_layer_{i}/sparse_moe_block/experts/down_proj_bias",
        "transformer_layer_{i}/feed_forward/down_bias",
    ),
    ("sequence_output_layernorm", "sequence_output_layernorm"),
)

# keras-hub 0.32's `GptOssAttention` builds its YaRN rotary embedding with
# these (gpt-oss's `rope_parameters`), whatever the backbone's config.
YARN = dict(
    beta_fast=32.0,
    beta_slow=1.0,
    original_max_position_embeddings=4096,
    truncate=False,
)


def is_windowed(i):
    """Whether layer `i` of a gpt-oss stack has the sliding window
    (keras-hub: every other layer, the odd ones)."""
    return i % 2 == 1


def yarn_rotary_scaling(backbone):
    """The self-attention's `rotary_scaling` equal to gpt-oss's rotary embedding
    (YaRN of `rope_scaling_factor`, with the beta and pretraining-length
    arguments its attention layers were built with), or None for a factor
    of 1 (YaRN then computes plain RoPE)."""
    factor = float(_common.config_value(backbone, "rope_scaling_factor"))
    if factor == 1.0:
        return None
    rotary = None
    for layer in getattr(backbone, "transformer_layers", ()):
        attention = getattr(layer, "self_attention_layer", None)
        rotary = getattr(attention, "rotary_embedding_layer", rotary)
    arguments = {
        name: getattr(rotary, name, default) for name, default in YARN.items()
    }
    return dict(scaling_factor=factor, rope_type="yarn", **arguments)


def _moe_arguments(backbone):
    """The `MixtureOfExperts` arguments of the backbone's first sparse MoE block
    (every layer has one alike: gpt-oss's routing, clamped GLU experts
    with biases)."""
    block = backbone.transformer_layers[0].sparse_moe_block
    kwargs, _, _ = mixture_of_experts.hub_arguments_and_weights(block)
    kwargs.pop("dtype")  # the block's own
    return kwargs


def _deinterleave_gate_up(path, value):
    """keras-hub's gate/up columns `[g0, u0, g1, u1, ...]` as our `[g...,
    u...]` (`gate_up_proj` and its bias); other weights as they are."""
    if path.endswith(("gate_up_proj", "gate_up_proj_bias")):
        return mixture_of_experts.deinterleave_gate_up(value)
    return value


def gpt_oss_model(config, dtype, name, key_dim, rotary_scaling, windows, moe):
    """The gpt-oss model of its config alone, shared by this keras-hub
    converter and `from_huggingface`'s (`interop/hf/gpt_oss.py`):
    `llama_style_model` (pre-norm RMS-norm blocks; grouped-query
    attention with rotary positions and `config["attention_bias"]` on
    its four projections) with learned attention sinks
    (`learned_sinks=True`) on every layer, layer `i`'s causal
    `window_size` `windows[i]` (None: full attention; else a
    `LocalSelfAttention`) and, as every layer's feed-forward, a
    `MixtureOfExperts` of the arguments `moe` (gpt-oss's routing and
    clamped GLU experts with biases). Its weights are the layers'
    initial ones: the caller fills them.

    Args:
        config: `llama_style_model`'s `config`.
        dtype: the layers' dtype policy.
        name: the model's name.
        key_dim: the head size.
        rotary_scaling: the self-attention's `rotary_scaling` (YaRN's
            dict, or None).
        windows: one `window_size` (or None) per layer.
        moe: `MixtureOfExperts` arguments (without `dtype`).

    Returns:
        The `keras.Model` (inputs `token_ids`, `padding_mask`).
    """

    def layer_attention(i):
        return dict(learned_sinks=True, window_size=windows[i])

    return llama_style_model(
        config,
        dtype=dtype,
        name=name,
        key_dim=key_dim,
        rotary_scaling=rotary_scaling,
        layer_attention=layer_attention,
        layer_feed_forward=lambda i: _common.mixture_of_experts(moe, dtype),
    )


def convert_gpt_oss(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `GptOssBackbone`, holding a copy of its weights.

    Inputs `token_ids`, `padding_mask` (int `(batch, T)`); output the
    sequence output `(batch, T, hidden)`. An untied token embedding,
    pre-norm `TransformerDecoderBlock`s with RMS norms
    (`normalization="rms_norm"`, `layer_norm_epsilon`), grouped-query
    attention with biases (`use_bias=True`, `key_dim=head_dim`) and
    learned attention sinks (`learned_sinks=True`: one logit per head in
    each softmax's denominator, keras-hub's `sinks`), rotary positions
    with gpt-oss's YaRN (`rotary_scaling={"rope_type": "yarn",
    "scaling_factor": rope_scaling_factor, "beta_fast": 32, "beta_slow":
    1, "original_max_position_embeddings": 4096, "truncate": False}`; none for a
    factor of 1), the sliding window on the odd layers (1, 3, ...) as a causal
    `LocalSelfAttention`'s `window_size = sliding_window` (keras-hub keeps keys
    `j >= i - sliding_window`, `sliding_window + 1` of them; a banded
    `LocalSelfAttention` with the sinks), full attention on the even ones; a
    mixture-of-experts feed-forward (a `MixtureOfExperts`: gpt-oss's routing, a
    softmax over the `top_k` largest router logits, and its clamped-GLU experts
    with biases; `gate_up_proj` de-interleaved); the final RMS norm.

    Our `CausalLMGenerator` decodes it with a mixed cache: a rolling one
    for the windowed layers, a full one for the others.

    Args:
        backbone: a built `keras_hub.models.GptOssBackbone`.

    Returns:
        The converted `keras.Model`.

    Raises:
        ValueError: an odd head size (keras-hub then rotates all but the
            last feature of each head, which does not convert).

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.gpt_oss import convert_gpt_oss
    >>> backbone = keras_hub.models.GptOssBackbone(
    ...     vocabulary_size=20, num_layers=2, num_query_heads=4,
    ...     num_key_value_heads=2, hidden_dim=16, intermediate_dim=8,
    ...     num_experts=4, top_k=2, sliding_window=3)
    >>> model = convert_gpt_oss(backbone)
    >>> [model.get_layer(f"transformer_layer_{i}").self_attention.cache_window()
    ...  for i in range(2)]
    [None, 3]

    References:
        - OpenAI, 2025, "gpt-oss-120b & gpt-oss-20b Model Card".
        - Peng et al., 2023, "YaRN: Efficient Context Window Extension of
          Large Language Models".
        - Xiao et al., 2023, "Efficient Streaming Language Models with
          Attention Sinks".
    """
    get = backbone.get_config()
    config = llama_style_config(backbone)
    head_dim = get.get("head_dim") or (
        config["hidden_dim"] // config["num_query_heads"]
    )
    if head_dim % 2:
        raise ValueError(
            "gpt-oss with an odd head size does not convert (keras-hub "
            "rotates all but one feature of each head). Received: "
            f"head_dim={head_dim!r}"
        )
    window = get.get("sliding_window")
    window = int(window) if window else None  # keras-hub: 0 or None, off
    config["attention_bias"] = True
    model = gpt_oss_model(
        config,
        backbone.dtype_policy,
        backbone.name,
        key_dim=head_dim,
        rotary_scaling=yarn_rotary_scaling(backbone),
        windows=[
            window if is_windowed(i) else None
            for i in range(config["num_layers"])
        ],
        moe=_moe_arguments(backbone),
    )
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    _common.copy_weights(backbone, model, prefixes, _deinterleave_gate_up)
    return model
