"""Model-level caches: the tuple of the blocks' own caches.

Each block makes its cache (`TransformerDecoderBlock.init_cache`, which
asks its self-attention, a `keras_attention.layers.TokenMixer`, for its
own) and takes it back at each call; generation keeps them side by side
and never looks inside.
"""


def init_cache(blocks, batch_size, max_length, dtype=None, **options):
    """The empty caches of `blocks`, a tuple of one per block.

    Args:
        blocks: list of built `TransformerDecoderBlock`s.
        batch_size: int (or scalar tensor), the batch size.
        max_length: int, the positions of the caches.
        dtype: the caches' dtype; each block's compute dtype when None.
        **options: the blocks' `init_cache` options: `sink_tokens` (an
            int >= 0: a ring of `sink_tokens + window + 1` slots in each
            block with windowed self-attention), `context` and
            `context_padding_mask` (blocks with cross-attention).

    Returns:
        A tuple of the blocks' caches (what `call_with_cache` takes).

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> block = keras_attention.blocks.TransformerDecoderBlock(
    ...     2, 16, cross_attention=False)
    >>> _ = block(np.ones((1, 3, 8), "float32"))  # build
    >>> caches = keras_attention.generation.init_cache([block, block], 4, 10)
    >>> (self_attention_cache,) = caches[0]
    >>> len(caches), tuple(self_attention_cache["keys_values"].shape)
    (2, (4, 2, 10, 2, 4))
    """
    return tuple(
        block.init_cache(batch_size, max_length, dtype, **options)
        for block in blocks
    )
