"""`TokenMixer`: the cache protocol of the layers that mix a sequence's
positions (self-attention and its linear-time replacements), the one
contract that blocks and `keras_attention.generation` decode through."""

from keras import ops

from keras_attention.utils import attention_checks


class TokenMixer:
    """The cache protocol of a token mixer: a mixin for a Keras layer that
    mixes the positions of a causal sequence `(batch, T, features)` and
    can decode it incrementally over a cache of its own.

    `MultiHeadAttention` (so `SelfAttention`, `LocalSelfAttention`, ...),
    `MultiHeadLatentAttention`, `LinearAttention` and `GatedDeltaNet`
    implement it; so may a user's layer, `class MyMixer(TokenMixer,
    keras.layers.Layer)`, which then decodes in a block under
    `keras_attention.generation` with no change to the library. Blocks
    and generators never look inside a cache: they make it with
    `init_cache`, hand it back to the layer at each call and keep what
    the layer returns.

    The contract:

    - `init_cache(batch_size, max_length, dtype=None, **options)` returns
      the layer's empty cache for `batch_size` sequences of at most
      `max_length` positions: any nest (tuple, list, dict) of tensors,
      every one with the batch on its first axis (beam search repeats and
      gathers a cache along it) and none of zero size. `dtype` is the
      compute dtype of what it caches (the layer's when None). What it
      holds is the layer's business: keys and values of `max_length`
      positions and their key mask, a ring of slots, a latent, a
      recurrent state. The one option a library layer reads is
      `sink_tokens` (an int >= 0, given only to a layer whose
      `cache_window()` is not None, and never when the caller wants a
      cache of `max_length` positions): a ring of `sink_tokens +
      cache_window() + 1` slots instead, the first `sink_tokens`
      positions kept beside the window.
    - `layer(inputs, cache=cache, cache_update_index=index,
      padding_mask=mask, training=None)` runs the `T` tokens `inputs`
      `(batch, T, features)` at positions `index .. index + T - 1`, each
      query seeing the positions up to its own (causal), and returns
      `(outputs, cache)`: the outputs `(batch, T, features)` and the
      updated cache (same structure, shapes and dtypes). Positions are
      written in order and each once: the calls on one cache cover `0 ..
      index - 1` before one at `index`. `index` is an int or an int32
      scalar tensor (symbolic inside a compiled loop). `mask` (boolean
      `(batch, T)`, None for all True) covers this call's tokens only:
      a False token is padding, never attended to, now or at any later
      call, nor written into a recurrent state; its own output is
      unspecified. The layer keeps its cache's key mask itself (the
      caller never passes one).
    - Without a cache, `layer(inputs, padding_mask=mask, training=None)`
      returns the outputs of a whole sequence, the same as the cached
      calls give token by token.
    - `cache_window()`: how many earlier positions a query sees (an int),
      or None for all of them (the default).
    - `cache_overwrites_positions(cache)`: True when `cache` keeps one
      slot per position, which a call at that position overwrites (keys
      and values of `max_length` positions, a latent per position): a
      call may then run past the positions it must write, and a later
      call at those positions writes them anew. Generators then write a
      whole prompt buffer in one call (a long prompt's prefill) and
      resume at the shortest prompt's end. False (the default) for a
      cache that accumulates (a recurrent state, a ring of slots): those
      are written in order, each position once.

    Example: a cumulative mean, its cache `(sum, count)`:

    >>> import keras
    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_attention.layers import TokenMixer
    >>> class CumulativeMean(TokenMixer, keras.layers.Layer):
    ...     def init_cache(self, batch_size, max_length, dtype=None):
    ...         return (ops.zeros((batch_size, 4), dtype or "float32"),
    ...                 ops.zeros((batch_size, 1), dtype or "float32"))
    ...     def call(self, inputs, padding_mask=None, cache=None,
    ...              cache_update_index=None, training=None):
    ...         if padding_mask is None:
    ...             padding_mask = ops.ones(ops.shape(inputs)[:2], "bool")
    ...         keep = ops.cast(padding_mask, inputs.dtype)[..., None]
    ...         sums = ops.cumsum(inputs * keep, axis=1)
    ...         counts = ops.cumsum(keep, axis=1)
    ...         if cache is not None:
    ...             total, count = cache
    ...             sums = sums + ops.expand_dims(total, 1)
    ...             counts = counts + ops.expand_dims(count, 1)
    ...         out = sums / ops.maximum(counts, 1.0)
    ...         if cache is None:
    ...             return out
    ...         return out, (sums[:, -1], counts[:, -1])
    >>> layer = CumulativeMean()
    >>> x = np.arange(12, dtype="float32").reshape(1, 3, 4)
    >>> cache = layer.init_cache(1, 3)
    >>> y0, cache = layer(x[:, :2], cache=cache, cache_update_index=0)
    >>> y1, cache = layer(x[:, 2:], cache=cache, cache_update_index=2)
    >>> whole = ops.convert_to_numpy(layer(x))
    >>> np.allclose(ops.convert_to_numpy(y1), whole[:, 2:])
    True
    """

    def init_cache(self, batch_size, max_length, dtype=None, **options):
        """The layer's empty cache (see the class's contract).

        Args:
            batch_size: int (or int scalar tensor), the sequences.
            max_length: int, the positions the cache must hold.
            dtype: the dtype of what is cached; the layer's compute
                dtype when None.
            **options: `sink_tokens` (int >= 0) for a layer with a
                `cache_window()`: a ring of slots instead.

        Returns:
            A nest of tensors, each with the batch on its first axis.
        """
        raise NotImplementedError(
            f"{type(self).__name__} implements no cache: define "
            "`init_cache(batch_size, max_length, dtype=None)` (see "
            "`keras_attention.layers.TokenMixer`)."
        )

    def cache_window(self):
        """How many earlier positions a query sees in a cache, or None
        for every earlier position (the default)."""
        return None

    def cache_overwrites_positions(self, cache):
        """Whether `cache` (this layer's `init_cache`'s) keeps one slot
        per position that a call at that position overwrites, so that a
        call may run past the positions it must write (see the class's
        contract). False, the safe default: positions written in order,
        each once."""
        del cache
        return False


def padding_mask_and(padding_mask, name, mask):
    """The mask a token mixer's call applies when it takes both the
    protocol's `padding_mask` and its own mask argument `name` (`mask`,
    which Keras fills from the inputs' Keras mask, or `query_mask`): the
    two and-ed, so that neither is dropped (a token is padding when
    either says so); the one given, else None. Array-likes are taken;
    masks of different static shapes are refused, naming both."""
    padding_mask, mask = attention_checks.as_tensors(
        padding_mask=padding_mask, **{name: mask}
    )
    if padding_mask is None or mask is None:
        return mask if padding_mask is None else padding_mask
    shapes = tuple(padding_mask.shape), tuple(mask.shape)
    if None not in shapes[0] + shapes[1] and shapes[0] != shapes[1]:
        raise ValueError(
            f"`padding_mask` and `{name}` are and-ed: they must have one "
            f"shape. Received: padding_mask.shape={shapes[0]!r}, "
            f"{name}.shape={shapes[1]!r}"
        )
    return ops.logical_and(
        ops.cast(padding_mask, "bool"), ops.cast(mask, "bool")
    )
