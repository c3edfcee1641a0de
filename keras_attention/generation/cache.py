"""Model-level key/value caches: the per-block caches stacked in one tensor.

Layout: `(batch, num_layers, 2, max_length, kv_heads, key_dim)`; block `l`
reads `cache[:, l]`, the `(batch, 2, max_length, kv_heads, key_dim)` cache of
`MultiHeadAttention` (keys at `[:, 0]`, values at `[:, 1]`).

A rolling cache (models whose every self-attention is windowed) has the
same layout with `size = sink_tokens + window + 1` slots instead of
`max_length` positions (`rolling_cache_size`), plus the `(batch, size)`
boolean key mask of the slots (`init_rolling_cache`).

A block with latent attention (`latent_attention`,
`MultiHeadLatentAttention`) caches one latent of `kv_lora_rank +
qk_rope_head_dim` numbers per token instead of keys and values: those
blocks' caches are stacked apart, `(batch, num_latent_layers,
max_length, width)` (`init_latent_cache`), in the generators' mixed
cache.
"""

from keras import ops

from keras_attention.layers.multi_head_latent_attention import (
    MultiHeadLatentAttention,
)


def self_attention_cache_shape(block):
    """`(2, kv_heads, key_dim)` of a built block's self-attention cache.

    Args:
        block: a built `keras_attention.blocks.TransformerDecoderBlock`.

    Returns:
        The tuple `(2, kv_heads, key_dim)` (keys and values).
    """
    attention = block.self_attention
    width = latent_cache_width(block)
    if width is not None:
        raise ValueError(
            f"Block {block.name!r} has latent attention: its cache holds "
            f"one latent of {width!r} numbers per token, not keys and "
            "values (`init_latent_cache`; `CausalLMGenerator` keeps it in "
            "its mixed cache). Received: "
            f"self_attention={type(attention).__name__}"
        )
    kv_heads = attention.num_key_value_heads or attention.num_heads
    return 2, kv_heads, attention.key_dim


def latent_cache_width(block):
    """The numbers a block's latent self-attention caches per token,
    `kv_lora_rank + qk_rope_head_dim`, or None for keys and values.

    Args:
        block: a built `TransformerDecoderBlock`.

    Returns:
        int or None.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> block = keras_attention.blocks.TransformerDecoderBlock(
    ...     2, 16, cross_attention=False, latent_attention=dict(
    ...         kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2,
    ...         v_head_dim=4))
    >>> _ = block(np.ones((1, 3, 8), "float32"))  # build
    >>> keras_attention.generation.latent_cache_width(block)
    8
    """
    attention = block.self_attention
    if isinstance(attention, MultiHeadLatentAttention):
        return attention.cache_dim
    return None


def init_latent_cache(blocks, batch_size, max_length, dtype="float32"):
    """Zeros `(batch, num_layers, max_length, width)`: the stacked caches
    of blocks with latent attention, `width = kv_lora_rank +
    qk_rope_head_dim` (the same in every block).

    Args:
        blocks: list of built `TransformerDecoderBlock`s with
            `latent_attention`.
        batch_size: int (or scalar tensor), the batch size.
        max_length: int (or scalar tensor), the positions of the cache.
        dtype: the cache's dtype (the blocks' compute dtype).

    Returns:
        The stacked latent cache, zeros.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> block = keras_attention.blocks.TransformerDecoderBlock(
    ...     2, 16, cross_attention=False, latent_attention=dict(
    ...         kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2,
    ...         v_head_dim=4))
    >>> _ = block(np.ones((1, 3, 8), "float32"))  # build
    >>> cache = keras_attention.generation.init_latent_cache(
    ...     [block, block], 4, 10)
    >>> tuple(cache.shape)
    (4, 2, 10, 8)
    """
    widths = {latent_cache_width(block) for block in blocks}
    if None in widths or len(widths) != 1:
        raise ValueError(
            "Latent caches are stacked from blocks with latent attention "
            "of one width (kv_lora_rank + qk_rope_head_dim). Received: "
            f"widths {sorted(widths, key=str)!r}"
        )
    shape = (batch_size, len(blocks), max_length, widths.pop())
    return ops.zeros(shape, dtype=dtype)


def init_cache(blocks, batch_size, max_length, dtype="float32"):
    """Zeros `(batch, num_layers, 2, max_length, kv_heads, key_dim)`.

    Args:
        blocks: list of built `TransformerDecoderBlock`s, all with the same
            `kv_heads` and `key_dim`.
        batch_size: int (or scalar tensor), the batch size.
        max_length: int (or scalar tensor), the positions of the cache.
        dtype: the cache's dtype (the blocks' compute dtype).

    Returns:
        The stacked cache, zeros.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> block = keras_attention.blocks.TransformerDecoderBlock(
    ...     2, 16, cross_attention=False)
    >>> _ = block(np.ones((1, 3, 8), "float32"))  # build
    >>> cache = keras_attention.generation.init_cache([block, block], 4, 10)
    >>> tuple(cache.shape)
    (4, 2, 2, 10, 2, 4)
    """
    shapes = {self_attention_cache_shape(b) for b in blocks}
    if len(shapes) != 1:
        raise ValueError(
            "All blocks must have the same self-attention cache shape "
            "(kv_heads, key_dim) to share one cache. "
            f"Received: {sorted(shapes)!r}"
        )
    two, kv_heads, key_dim = shapes.pop()
    shape = (batch_size, len(blocks), two, max_length, kv_heads, key_dim)
    return ops.zeros(shape, dtype=dtype)


def stack_caches(caches):
    """Stacks per-block `(batch, 2, T, kv_heads, key_dim)` caches on axis 1.

    Args:
        caches: sequence of per-block caches (as the blocks return them).

    Returns:
        `(batch, num_layers, 2, T, kv_heads, key_dim)`.
    """
    return ops.stack(list(caches), axis=1)


def unwindowed_block(blocks):
    """The first block whose self-attention cannot use a rolling cache
    (not windowed), as `(index, block)`; None when every one can. Score
    and mask functions do not prevent it: they see the absolute position
    each slot holds.

    Args:
        blocks: list of built `TransformerDecoderBlock`s.

    Returns:
        `(index, block)` or None.
    """
    for index, block in enumerate(blocks):
        attention = block.self_attention
        window = getattr(attention, "cache_window", None)
        if window is None or window() is None:
            return index, block
    return None


def rolling_cache_size(blocks, sink_tokens=0):
    """Slots of the rolling cache of `blocks`: `sink_tokens` plus the
    largest self-attention window plus one (the query's own position).

    Args:
        blocks: list of built `TransformerDecoderBlock`s with windowed
            self-attention (`unwindowed_block(blocks)` is None).
        sink_tokens: int >= 0, the attention sinks kept beside the window.

    Returns:
        int.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> block = keras_attention.blocks.TransformerDecoderBlock(
    ...     2, 16, cross_attention=False, window_size=6)
    >>> _ = block(np.ones((1, 3, 8), "float32"))  # build
    >>> keras_attention.generation.rolling_cache_size([block], sink_tokens=4)
    11
    """
    windows = [block.self_attention.cache_window() for block in blocks]
    return sink_tokens + max(windows) + 1


def init_rolling_cache(blocks, batch_size, size, dtype="float32"):
    """An empty rolling cache: `(keys_values, slot_mask)`.

    Args:
        blocks: list of built `TransformerDecoderBlock`s (as `init_cache`).
        batch_size: int (or scalar tensor), the batch size.
        size: int, the slots (`rolling_cache_size`).
        dtype: the cache's dtype (the blocks' compute dtype).

    Returns:
        `keys_values`, zeros `(batch, num_layers, 2, size, kv_heads,
        key_dim)`, and `slot_mask`, boolean `(batch, size)`: True where the
        slot's token may be attended to (False for a token the embedding
        masks). Which position a slot holds follows from the positions
        written (`keras_attention.ops.rolling_cache.
        rolling_cache_positions`).

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> block = keras_attention.blocks.TransformerDecoderBlock(
    ...     2, 16, cross_attention=False, window_size=6)
    >>> _ = block(np.ones((1, 3, 8), "float32"))  # build
    >>> kv, slots = keras_attention.generation.init_rolling_cache(
    ...     [block, block], 4, 7)
    >>> tuple(kv.shape), tuple(slots.shape)
    ((4, 2, 2, 7, 2, 4), (4, 7))
    """
    keys_values = init_cache(blocks, batch_size, size, dtype)
    return keys_values, ops.ones((batch_size, size), "bool")
