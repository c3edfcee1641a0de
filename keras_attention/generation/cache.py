"""Model-level key/value caches: the per-block caches stacked in one tensor.

Layout: `(batch, num_layers, 2, max_length, kv_heads, key_dim)`; block `l`
reads `cache[:, l]`, the `(batch, 2, max_length, kv_heads, key_dim)` cache of
`MultiHeadAttention` (keys at `[:, 0]`, values at `[:, 1]`).
"""

from keras import ops


def self_attention_cache_shape(block):
    """`(2, kv_heads, key_dim)` of a built block's self-attention cache.

    Args:
        block: a built `keras_attention.blocks.TransformerDecoderBlock`.

    Returns:
        The tuple `(2, kv_heads, key_dim)` (keys and values).
    """
    attention = block.self_attention
    kv_heads = attention.num_key_value_heads or attention.num_heads
    return 2, kv_heads, attention.key_dim


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
