"""The blocks' `latent_attention` option (private to `blocks`): the
self-attention a `MultiHeadLatentAttention` (DeepSeek-V2/V3's MLA), its
checks, and the block's self-attention arguments as MLA takes them.

MLA brings its own head shape (`qk_nope_head_dim`, `qk_rope_head_dim`,
`v_head_dim`), rotary positions (`rope_theta`, `rope_interleave`,
`rotary_scaling`) and softmax scale, and has no window, score or mask
objects, QK-norm or learned sinks: the block's arguments for those are
refused beside it rather than ignored.
"""

from keras_attention import masks as masks_lib
from keras_attention.layers.multi_head_latent_attention import (
    MultiHeadLatentAttention,
)
from keras_attention.utils import keras_utils

# Arguments of `MultiHeadLatentAttention` that the block gives.
FROM_BLOCK = (
    "num_heads",
    "kernel_initializer",
    "bias_initializer",
    "dtype",
    "name",
)


# The block's arguments that cannot apply to MLA, and their unset values.
REFUSED = dict(
    key_dim=None,
    num_key_value_heads=None,
    window_size=None,
    score_mod=None,
    mask_mod=None,
    qk_norm=None,
    learned_sinks=False,
    attention_output_gate=False,
    rotary_max_wavelength=None,
    rotary_scaling=None,
    rotary_fraction=1.0,
    attention_scale=None,
)


def check_latent_attention(latent_attention, block):
    """The blocks' `latent_attention`: None, or a dict of
    `MultiHeadLatentAttention` arguments, checked by building one and
    returned as a plain dict with the block's `dropout` and `use_bias`
    (as `attention_bias`) filled in where not given.

    The block's arguments of `REFUSED` (read from `block`, whose
    `__init__` set them) cannot apply to MLA: one that is set is refused,
    naming it and its value.
    """
    if latent_attention is None:
        return None
    if not isinstance(latent_attention, dict):
        raise TypeError(
            "`latent_attention` must be None or a dict of "
            "MultiHeadLatentAttention arguments (kv_lora_rank, "
            "qk_nope_head_dim, qk_rope_head_dim, v_head_dim, ...). "
            f"Received: latent_attention={latent_attention!r}"
        )
    refused = sorted(set(FROM_BLOCK) & set(latent_attention))
    if refused:
        raise ValueError(
            f"`latent_attention` takes MLA's own arguments; {refused} come "
            f"from the block. Received: latent_attention={latent_attention!r}"
        )
    for name, unset in REFUSED.items():
        value = getattr(block, name)
        if value is not unset and value != unset:
            raise ValueError(
                "With `latent_attention` the self-attention is a "
                "MultiHeadLatentAttention, which has its own head shape, "
                "rotary positions and scale, and no window, score or mask "
                f"objects, QK-norm or sinks: `{name}` cannot apply. "
                f"Received: {name}={value!r}, "
                f"latent_attention={latent_attention!r}"
            )
    defaults = dict(dropout=block.dropout, attention_bias=block.use_bias)
    latent_attention = dict(defaults, **latent_attention)
    MultiHeadLatentAttention(num_heads=1, **latent_attention)  # its checks
    return latent_attention


def make_latent_attention(block):
    """The block's self-attention, a `MultiHeadLatentAttention` named
    `self_attention` (the weight path of saved files)."""
    clone = keras_utils.clone_initializer
    return MultiHeadLatentAttention(
        num_heads=block.num_heads,
        **block.latent_attention,
        kernel_initializer=clone(block.kernel_initializer),
        bias_initializer=clone(block.bias_initializer),
        dtype=block.dtype_policy,
        name="self_attention",
    )


def latent_call_kwargs(kwargs, causal):
    """The block's self-attention arguments (`mask`, `attention_mask`,
    `cache`, `segment_ids`, ...) as `MultiHeadLatentAttention.call` takes
    them: `mask` as `query_mask`, `causal` as `use_causal_mask`, and
    `segment_ids` as a document mask and restarting rotary positions
    (uncached calls)."""
    kwargs = dict(kwargs)
    if kwargs.pop("mod_inputs", None) is not None:
        raise ValueError(
            "`mod_inputs` feed score and mask objects, which a block with "
            "`latent_attention` has none of. Received: mod_inputs given"
        )
    segment_ids = kwargs.pop("segment_ids", None)
    if segment_ids is not None:
        if kwargs.get("cache") is not None:
            raise ValueError(
                "`segment_ids` (packed documents) apply to uncached calls; "
                "with a cache, pass `attention_mask` and `positions`. "
                "Received: segment_ids and self_attention_cache"
            )
        documents = masks_lib.segment_mask(segment_ids)
        mask = kwargs.get("attention_mask")
        if mask is not None and len(mask.shape) == 4:
            documents = documents[:, None]
        kwargs["attention_mask"] = masks_lib.combine_masks(mask, documents)
        if kwargs.get("positions") is None:
            kwargs["positions"] = masks_lib.segment_positions(segment_ids)
    kwargs["query_mask"] = kwargs.pop("mask", None)
    kwargs["use_causal_mask"] = causal
    return kwargs


def cache_length(cache, latent):
    """The positions of a self-attention cache: axis 1 of a latent cache
    `(batch, max_length, width)`, axis 2 of keys and values `(batch, 2,
    max_length, kv_heads, key_dim)`."""
    return cache.shape[1] if latent else cache.shape[2]
