"""keras-hub's `Gemma3Backbone` (text) rebuilt from `keras_attention`
blocks."""

from keras_attention.interop.gemma import build_gemma_style
from keras_attention.interop.gemma import gemma_config
from keras_attention.interop.gemma import sandwich_norm
from keras_attention.mods.masks import KerasSlidingWindowMask
from keras_attention.scores.soft_cap import SoftCap

# The Gemma table (`keras_attention.interop.gemma.WEIGHT_TABLE`): Gemma 3's
# layers and weights have the same names, and its QK-norms are
# `attention/query_norm` and `attention/key_norm` on both sides (their
# scales, as every Gemma RMS scale, stored as `scale - 1`).

# keras-hub's rotary wavelengths: local (windowed) and global layers.
LOCAL_ROPE_WAVELENGTH = 10_000.0
GLOBAL_ROPE_WAVELENGTH = 1_000_000.0


def is_local(get, i):
    """Whether layer `i` of a Gemma 3 config `get` is windowed (local):
    five local layers, then one global (`i % 6 < 5`), when
    `use_sliding_window_attention`."""
    return bool(get.get("use_sliding_window_attention")) and i % 6 < 5


def _attention_option(backbone, i, name, default):
    """Layer `i`'s attention attribute `name` (what keras-hub computes
    with), else `default`."""
    layers = getattr(backbone, "transformer_layers", None) or ()
    attention = getattr(layers[i], "attention", None) if layers else None
    value = getattr(attention, name, None)
    return default if value is None else value


def convert_gemma3(backbone):
    """A `keras.Model` of `keras_attention` blocks equal to a keras-hub
    `Gemma3Backbone` without vision encoder (text), holding a copy of its
    weights.

    The Gemma-style model of `keras_attention.interop.gemma` (the tied,
    scaled token embedding; pre-norm blocks with RMS norms, grouped-query
    attention with `key_dim=head_dim`, a GeGLU feed-forward of
    `intermediate_dim`; the final norm) with Gemma 3's attention: QK-norm
    (the self-attention's `qk_norm="rms"`, scales `1 + scale`); five windowed
    layers for one global (`i % 6 < 5`, when
    `use_sliding_window_attention`), the window as
    `mask_mod=KerasSlidingWindowMask(sliding_window_size)`; rotary
    wavelength 10,000 on the windowed layers and 1,000,000 on the global
    ones, each with its scaling factor (`local_rope_scaling_factor`,
    `global_rope_scaling_factor`: position interpolation, the self-attention's
    `rotary_scaling`); the optional soft-caps and post-norms as Gemma 2's.
    Embedding models (`is_embedding_model`, bidirectional attention) and
    vision encoders are refused.

    Args:
        backbone: a built `keras_hub.models.Gemma3Backbone` (text only).

    Returns:
        The converted `keras.Model`.

    Example:

    >>> import keras_hub
    >>> from keras_attention.interop.gemma3 import convert_gemma3
    >>> backbone = keras_hub.models.Gemma3Backbone(
    ...     vocabulary_size=20, image_size=None, num_layers=1,
    ...     num_query_heads=4, num_key_value_heads=2, hidden_dim=16,
    ...     intermediate_dim=32, head_dim=4, vision_encoder=None)
    >>> convert_gemma3(backbone).output.shape
    (None, None, 16)

    References:
        - Gemma Team, 2025, "Gemma 3 Technical Report".
    """
    get = backbone.get_config()
    for name in ("vision_encoder", "is_embedding_model"):
        if get.get(name):
            raise ValueError(
                "Only Gemma 3's text decoder converts: "
                f"`{name}` must be unset. Received: {name}={get[name]!r}"
            )
    if get.get("use_bidirectional_attention"):
        raise ValueError(
            "Gemma 3 with bidirectional attention (embedding models) does "
            "not convert. Received: use_bidirectional_attention=True"
        )
    sandwich = sandwich_norm(get)
    soft_cap = get.get("attention_logit_soft_cap")
    window = int(get.get("sliding_window_size") or 0)
    config = gemma_config(backbone)
    use_qk_norm = bool(get.get("use_query_key_norm", True))

    def layer_attention(i):
        local = is_local(get, i)
        factor = get.get(
            "local_rope_scaling_factor"
            if local
            else "global_rope_scaling_factor"
        )
        kwargs = dict(
            rotary_max_wavelength=_attention_option(
                backbone,
                i,
                "rope_wavelength",
                LOCAL_ROPE_WAVELENGTH if local else GLOBAL_ROPE_WAVELENGTH,
            ),
        )
        if factor is not None and float(factor) != 1.0:
            kwargs["rotary_scaling"] = {"scaling_factor": float(factor)}
        if use_qk_norm:
            kwargs["qk_norm"] = "rms"
            kwargs["qk_norm_epsilon"] = _attention_option(
                backbone, i, "layer_norm_epsilon", config["layer_norm_epsilon"]
            )
        if not _attention_option(backbone, i, "query_head_dim_normalize", True):
            kwargs["attention_scale"] = (
                config["hidden_dim"] // config["num_query_heads"]
            ) ** -0.5
        if soft_cap is not None:
            kwargs["score_mod"] = SoftCap(soft_cap)
        if local:
            kwargs["mask_mod"] = KerasSlidingWindowMask(window)
        return kwargs

    return build_gemma_style(
        backbone, config, layer_attention, sandwich_norm=sandwich
    )
