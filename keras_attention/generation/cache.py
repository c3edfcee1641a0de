"""Model-level key/value caches: the per-block caches stacked in one tensor.

Layout: `(batch, num_layers, 2, max_length, kv_heads, key_dim)`; block `l`
reads `cache[:, l]`, the `(batch, 2, max_length, kv_heads, key_dim)` cache of
`MultiHeadAttention` (keys at `[:, 0]`, values at `[:, 1]`).
"""

from keras import ops


def self_attention_cache_shape(block):
    """`(2, kv_heads, key_dim)` of a built block's self-attention cache."""
    attention = block.self_attention
    kv_heads = attention.num_key_value_heads or attention.num_heads
    return 2, kv_heads, attention.key_dim


def init_cache(blocks, batch_size, max_length, dtype="float32"):
    """Zeros `(batch, num_layers, 2, max_length, kv_heads, key_dim)`.

    Every block must be built and have the same `kv_heads` and `key_dim`.
    """
    shapes = {self_attention_cache_shape(b) for b in blocks}
    if len(shapes) != 1:
        raise ValueError(
            "All blocks must have the same self-attention cache shape "
            f"(kv_heads, key_dim) to share one cache. Received: {sorted(shapes)!r}"
        )
    two, kv_heads, key_dim = shapes.pop()
    shape = (batch_size, len(blocks), two, max_length, kv_heads, key_dim)
    return ops.zeros(shape, dtype=dtype)


def stack_caches(caches):
    """Stacks per-block `(batch, 2, T, kv_heads, key_dim)` caches on axis 1."""
    return ops.stack(list(caches), axis=1)
