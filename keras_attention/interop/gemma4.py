"""keras-hub's `Gemma4Backbone` (text) rebuilt from `keras_attention`
blocks, with its KV sharing across layers, K = V global layers and head
sizes per layer type."""

import numpy as np

from keras_attention.interop import _common
from keras_attention.interop.gemma import final_norm_model
from keras_attention.interop.gemma import gemma_config
from keras_attention.interop.gemma import scaled_token_embedding
from keras_attention.interop.gemma import transpose_qkv
from keras_attention.layers.activations import gelu_approximate
from keras_attention.layers.shared_kv_attention import KVShare
from keras_attention.layers.shared_kv_attention import SharedKVSelfAttention
from keras_attention.mods.masks import KerasSlidingWindowMask
from keras_attention.scores.soft_cap import SoftCap

# keras-hub's default rotary wavelengths: local (windowed) and global.
LOCAL_ROPE_WAVELENGTH = 10_000.0
GLOBAL_ROPE_WAVELENGTH = 1_000_000.0

# Their weight path prefix -> ours (`{i}`: the layer index). Gemma 4's RMS
# norms scale by `scale` (not Gemma 1-3's `1 + scale`): copied as they
# are; the query/key/value kernels `(heads, hidden, head_dim)` are
# transposed to ours, `(hidden, heads, head_dim)`.
WEIGHT_TABLE = (
    ("token_embedding", "token_embedding"),
    ("decoder_block_{i}/attention", "decoder_block_{i}/self_attention"),
    (
        "decoder_block_{i}/pre_attention_norm",
        "decoder_block_{i}/self_attention_norm",
    ),
    (
        "decoder_block_{i}/post_attention_norm",
        "decoder_block_{i}/self_attention_post_norm",
    ),
    (
        "decoder_block_{i}/ffw_gating",
        "decoder_block_{i}/feed_forward/gate_dense",
    ),
    (
        "decoder_block_{i}/ffw_gating_2",
        "decoder_block_{i}/feed_forward/intermediate_dense",
    ),
    (
        "decoder_block_{i}/ffw_linear",
        "decoder_block_{i}/feed_forward/output_dense",
    ),
    ("decoder_block_{i}/pre_ffw_norm", "decoder_block_{i}/feed_forward_norm"),
    (
        "decoder_block_{i}/post_ffw_norm",
        "decoder_block_{i}/feed_forward_post_norm",
    ),
    ("final_normalization", "final_normalization"),
    # Each block's output scale (shape `()`, ours `(1,)`).
    ("decoder_block_{i}/layer_scalar", "layer_scalar_{i}/layer_scalar"),
)

# Options of the backbone this converter does not build: (config name,
# the value that means "off", what it is). Any other value is refused.
REFUSED = (
    ("vision_encoder", None, "the vision encoder (text only converts)"),
    ("audio_encoder", None, "the audio encoder (text only converts)"),
    ("is_embedding_model", False, "the embedding model's pooling heads"),
    ("use_bidirectional_attention", False, "bidirectional attention"),
    (
        "hidden_size_per_layer_input",
        0,
        "per-layer inputs (the per-layer token embedding and gates)",
    ),
    ("enable_moe_block", False, "the parallel mixture-of-experts block"),
)


def transform_weight(path, value):
    """A Gemma 4 weight as our layers hold it: the query/key/value kernels
    transposed to `(hidden, heads, head_dim)`, a block's `layer_scalar`
    as shape `(1,)`, the rest as it is."""
    if path.endswith("/layer_scalar"):
        return np.reshape(value, (1,))
    return transpose_qkv(path, value)


def kv_sources(layer_types, num_kv_shared_layers):
    """`{reader layer: source layer}`: each of the last
    `num_kv_shared_layers` layers reads the keys and values of the last
    earlier layer of its type (`"full_attention"` or
    `"sliding_attention"`) among the layers that are not shared
    (keras-hub's and transformers' rule)."""
    first = len(layer_types) - num_kv_shared_layers
    sources = {}
    for i in range(first, len(layer_types)):
        earlier = [j for j in range(first) if layer_types[j] == layer_types[i]]
        if not earlier:
            raise ValueError(
                f"Layer {i} shares the keys and values of an earlier "
                f"{layer_types[i]!r} layer, and the first {first} layers "
                "have none. Received: "
                f"num_kv_shared_layers={num_kv_shared_layers!r}, "
                f"layer_types={list(layer_types)!r}"
            )
        sources[i] = earlier[-1]
    return sources


def gemma4_text_model(config, dtype, name, position_ids=True):
    """The Gemma 4 text model of its config alone (what the keras-hub
    converter and `from_huggingface` share): the tied token embedding
    (its reverse projection soft-capped by `final_logit_soft_cap`) scaled
    by `sqrt(hidden_dim)`; one pre- and post-normed decoder block per
    layer (`decoder_block_{i}`), its self-attention a
    `SharedKVSelfAttention` (QK-norm, `value_norm="rms"`,
    `attention_scale=1`, rotary positions of the layer's type, the window
    of sliding layers as a `KerasSlidingWindowMask`; K = V and
    `num_global_key_value_heads` on global layers when set; the last
    `num_kv_shared_layers` layers reading their source's keys and
    values), its feed-forward a GeGLU (twice as wide on the shared layers
    with `use_double_wide_mlp`), the block's whole output (residual
    included) times its `layer_scalar` (a `LayerScalar`,
    `layer_scalar_{i}`); the final RMS norm.

    Args:
        config: dict: `vocabulary_size`, `num_layers`, `num_query_heads`,
            `num_key_value_heads`, `num_global_key_value_heads` (None:
            no K = V), `hidden_dim`, `intermediate_dim`, `head_dim`,
            `global_head_dim` (None: `head_dim`), `layer_norm_epsilon`,
            `dropout`, `layer_types`, `sliding_window_size` (None: no
            window), `local_rope_wavelength`, `global_rope_wavelength`,
            `local_rope_scaling_factor`, `global_rope_scaling_factor`,
            `global_rope_partial_rotary_factor` (below 1: the global
            layers' `rotary_fraction` with `proportional_rotary`),
            `attention_logit_soft_cap`, `final_logit_soft_cap`,
            `num_kv_shared_layers`, `use_double_wide_mlp`.
        dtype: the layers' dtype policy.
        name: the model's name.
        position_ids: bool, a third input `position_ids` `(batch, T)`:
            each token's rotary position (keras-hub's input); False:
            positions `0 .. T - 1`.

    Returns:
        A `keras.Model`, inputs `token_ids`, `padding_mask` (and
        `position_ids`), output the final norm's.
    """
    types = list(config["layer_types"])
    sources = kv_sources(types, config["num_kv_shared_layers"])
    shares = {
        j: KVShare(f"decoder_block_{j}") for j in sorted(set(sources.values()))
    }
    names = ("token_ids", "padding_mask")
    inputs = _common.token_inputs(*names, *(("position_ids",) * position_ids))
    x = scaled_token_embedding(config, dtype, inputs["token_ids"])
    for i, kind in enumerate(types):
        is_global = kind == "full_attention"
        wide = config["use_double_wide_mlp"] and i in sources
        x = _common.decoder_block(
            f"decoder_block_{i}",
            _attention(config, i, is_global, sources, shares, dtype),
            _common.feed_forward(
                config["intermediate_dim"] * (2 if wide else 1),
                activation=gelu_approximate,
                dropout=config["dropout"],
                use_bias=False,
                gated=True,
                dtype=dtype,
            ),
            dropout=config["dropout"],
            norm_first=True,
            layer_norm_epsilon=config["layer_norm_epsilon"],
            normalization="rms_norm",
            sandwich_norm=True,
            dtype=dtype,
        )(
            x,
            padding_mask=inputs["padding_mask"],
            positions=inputs.get("position_ids"),
        )
        x = _common.LayerScalar(dtype=dtype, name=f"layer_scalar_{i}")(x)
    return final_norm_model(config, dtype, name, inputs, x)


def _attention(config, i, is_global, sources, shares, dtype):
    """Layer `i`'s `SharedKVSelfAttention` (see `gemma4_text_model`)."""
    prefix = "global" if is_global else "local"
    k_eq_v = is_global and config["num_global_key_value_heads"] is not None
    head_dim = config["head_dim"]
    if is_global and config["global_head_dim"] is not None:
        head_dim = config["global_head_dim"]
    kwargs = dict(
        num_key_value_heads=(
            config["num_global_key_value_heads"]
            if k_eq_v
            else config["num_key_value_heads"]
        ),
        rotary_max_wavelength=float(config[f"{prefix}_rope_wavelength"]),
        attention_scale=1.0,
        qk_norm="rms",
        qk_norm_epsilon=config["layer_norm_epsilon"],
        dropout=config["dropout"],
        use_bias=False,
        dtype=dtype,
    )
    fraction = config["global_rope_partial_rotary_factor"] if is_global else 1
    if float(fraction) != 1.0:  # keras-hub's and transformers' layout
        kwargs.update(rotary_fraction=float(fraction), proportional_rotary=True)
    factor = config[f"{prefix}_rope_scaling_factor"]
    if factor is not None and float(factor) != 1.0:
        kwargs["rotary_scaling"] = {"scaling_factor": float(factor)}
    if config["attention_logit_soft_cap"] is not None:
        kwargs["score_mod"] = SoftCap(config["attention_logit_soft_cap"])
    if not is_global and config["sliding_window_size"] is not None:
        kwargs["mask_mod"] = KerasSlidingWindowMask(
            int(config["sliding_window_size"])
        )
    if i in sources:
        kwargs.update(kv_share=shares[sources[i]], kv_share_role="reader")
    else:
        kwargs.update(values_from_keys=k_eq_v, value_norm="rms")
        if i in shares:
            kwargs.update(kv_share=shares[i], kv_share_role="source")
    return SharedKVSelfAttention(
        config["num_query_heads"],
        head_dim,
        causal=True,
        name="self_attention",
        **kwargs,
    )


def _refuse_unsupported(get):
    for name, off, what in REFUSED:
        value = get.get(name, off)
        if value != off and not (off == 0 and not value):
            raise ValueError(
                f"Gemma 4's {what} does not convert: `{name}` must be "
                f"{off!r}. Received: {name}={value!r}"
            )
    layers, shared = get["num_layers"], get.get("num_kv_shared_layers") or 0
    if shared >= layers:
        raise ValueError(
            "Gemma 4 with every layer's keys and values shared (an "
            "assistant model, fed by another's cache) does not convert: "
            "`num_kv_shared_layers` must be below `num_layers`. Received: "
            f"num_kv_shared_layers={shared!r}, num_layers={layers!r}"
        )


def gemma4_config(backbone):
    """The dict of `gemma4_text_model` from a `Gemma4Backbone`."""
    get = backbone.get_config()
    _refuse_unsupported(get)
    config = gemma_config(backbone)  # with `dropout`, `final_logit_soft_cap`
    window = None
    if get.get("use_sliding_window_attention", True):
        window = int(get.get("sliding_window_size") or 512)
    config.update(
        num_global_key_value_heads=get.get("num_global_key_value_heads"),
        global_head_dim=get.get("global_head_dim"),
        layer_types=list(backbone.layer_types),
        sliding_window_size=window,
        local_rope_wavelength=(
            get.get("local_rope_wavelength") or LOCAL_ROPE_WAVELENGTH
        ),
        global_rope_wavelength=(
            get.get("global_rope_wavelength") or GLOBAL_ROPE_WAVELENGTH
        ),
        local_rope_scaling_factor=get.get("local_rope_scaling_factor"),
        global_rope_scaling_factor=get.get("global_rope_scaling_factor"),
        global_rope_partial_rotary_factor=(
            get.get("global_rope_partial_rotary_factor") or 1.0
        ),
        attention_logit_soft_cap=get.get("attention_logit_soft_cap"),
        num_kv_shared_layers=get.get("num_kv_shared_layers") or 0,
        use_double_wide_mlp=bool(get.get("use_double_wide_mlp")),
    )
    return config


def convert_gemma4(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `Gemma4Backbone` without vision or audio encoder (text), holding a
    copy of its weights (`gemma4_text_model` lists the layers).

    Gemma 4's distinctive attention, each an option of
    `SharedKVSelfAttention`: the last `num_kv_shared_layers` layers read
    the keys and values of the last earlier non-shared layer of their
    type (`kv_share`; a shared layer keeps no cache, so the generation
    cache holds each shared entry once); global layers with
    `num_global_key_value_heads` take their values from the key
    projection (`values_from_keys`, K = V) with that many key/value
    heads; values are RMS-normed without weight (`value_norm="rms"`);
    global layers have `global_head_dim` heads, sliding ones `head_dim`,
    and rotate `global_rope_partial_rotary_factor` of each head in
    Gemma 4's proportional layout (`proportional_rotary`).
    The model takes the backbone's inputs, `token_ids`, `padding_mask`
    and `position_ids` (each token's rotary position); generation
    (`interop.causal_lm_generator`) counts positions from 0.

    Refused by name (`ValueError`): vision and audio encoders, embedding
    models, bidirectional attention, per-layer inputs
    (`hidden_size_per_layer_input`), the MoE block, every layer shared
    (`num_kv_shared_layers >= num_layers`). Each block's `layer_scalar`
    (its whole output's scale, residual included) is copied into the
    `LayerScalar` after it.

    Args:
        backbone: a built `keras_hub.models.Gemma4Backbone` (text only).

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.gemma4 import convert_gemma4
    >>> backbone = keras_hub.models.Gemma4Backbone(
    ...     vocabulary_size=20, image_size=None, num_layers=2,
    ...     num_query_heads=2, num_key_value_heads=1, hidden_dim=8,
    ...     intermediate_dim=16, head_dim=4, sliding_window_pattern=2,
    ...     num_kv_shared_layers=0)
    >>> convert_gemma4(backbone).output.shape
    (None, None, 8)

    References:
        - Gemma Team, 2026, Gemma 4 (keras-hub's and transformers'
          `gemma4`).
    """
    config = gemma4_config(backbone)
    model = gemma4_text_model(config, backbone.dtype_policy, backbone.name)
    prefixes = _common.layer_prefixes(WEIGHT_TABLE, config["num_layers"])
    pairs = []
    ours = {w.path: w for w in model.weights}
    for weight in backbone.weights:
        target = ours.get(_common.our_path(weight.path, prefixes))
        if target is not None:
            value = transform_weight(weight.path, _common.numpy_value(weight))
            pairs.append((weight, target, value))
    _common.copy_pairs(backbone, model, pairs)
    return model
