"""Built-in mask objects: causal, sliding windows, chunks, prefix-LM and
documents (segment ids).

Each is a `MaskMod`: `mask(batch, head, q_idx, kv_idx) -> bool` on index
tensors broadcastable to `(batch, heads, queries, keys)`, True where the
query may attend to the key, on absolute positions.
"""

import keras
from keras import ops

from keras_attention.masks import window_bounds
from keras_attention.mods.base import PACKAGE
from keras_attention.mods.base import MaskMod
from keras_attention.ops import scoring
from keras_attention.utils import validation


def _gather(table, batch, position):
    """`table[batch, position]` for a `(b, T)` tensor and index tensors
    broadcastable to each other (positions clipped to `[0, T)`: keys
    outside the sequence are masked by the paths themselves)."""
    table = ops.convert_to_tensor(table)
    length = ops.shape(table)[1]
    position = ops.clip(position, 0, length - 1)
    flat = ops.reshape(table, (-1,))
    return ops.take(flat, batch * length + position)


@keras.saving.register_keras_serializable(package=PACKAGE)
class CausalMask(MaskMod):
    """Query `i` may attend to keys `j <= i` (absolute positions).

    Example:

    >>> import numpy as np
    >>> from keras_attention import mods
    >>> q, kv = np.arange(3)[:, None], np.arange(3)[None, :]
    >>> mods.CausalMask()(0, 0, q, kv).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    """

    def __call__(self, batch, head, q_idx, kv_idx):
        return scoring.causal(q_idx, kv_idx)

    def band_bounds(self):
        return (None, 0)


@keras.saving.register_keras_serializable(package=PACKAGE)
class SlidingWindowMask(MaskMod):
    """This library's window rule: query `i` may attend to keys
    `i - left <= j <= i + right` (`LocalSelfAttention`'s `window_size`).

    Args:
        window_size: int (`left = right = window_size`) or a pair
            `(left, right)` of non-negative ints.
        causal: bool: `right = 0`.

    Not Keras's `sliding_window=w` (`|i - j| < w`, that is
    `window_size=w - 1`): see `KerasSlidingWindowMask`.
    """

    def __init__(self, window_size, causal=False):
        self.left, self.right = window_bounds(window_size, causal)
        self.window_size = window_size
        self.causal = bool(causal)

    def __call__(self, batch, head, q_idx, kv_idx):
        return scoring.in_window(q_idx, kv_idx, self.left, self.right)

    def band_bounds(self):
        return (self.left, self.right)

    def get_config(self):
        size = self.window_size
        size = list(size) if isinstance(size, (tuple, list)) else size
        return {"window_size": size, "causal": self.causal}


@keras.saving.register_keras_serializable(package=PACKAGE)
class KerasSlidingWindowMask(MaskMod):
    """Keras's `MultiHeadAttention(sliding_window=w)` rule: query `i` may
    attend to keys with `|i - j| < w` (`w - 1` keys each side, the query
    included). `SlidingWindowMask(w - 1)` is the same mask.

    Args:
        sliding_window: positive int `w`.
    """

    def __init__(self, sliding_window):
        validation.check_positive_int("sliding_window", sliding_window)
        self.sliding_window = int(sliding_window)

    def __call__(self, batch, head, q_idx, kv_idx):
        w = self.sliding_window - 1
        return scoring.in_window(q_idx, kv_idx, w, w)

    def band_bounds(self):
        return (self.sliding_window - 1, self.sliding_window - 1)

    def get_config(self):
        return {"sliding_window": self.sliding_window}


@keras.saving.register_keras_serializable(package=PACKAGE)
class ChunkedCausalMask(MaskMod):
    """Causal attention inside fixed chunks of `chunk_size` positions:
    query `i` may attend to keys `j <= i` with `j // chunk_size ==
    i // chunk_size` (Llama 4's chunked attention).

    Given to an attention layer (`SelfAttention(..., causal=True,
    mask_mod=ChunkedCausalMask(c))`), the blockwise path skips the tiles
    between chunks, and the layer's generation cache holds one chunk:
    its `lookback()` is `c - 1`, so `cache_window()` is too, and
    `init_cache(..., sink_tokens=0)` (what generation's `cache="auto"`
    asks) makes a ring of `c` slots, position `p` in slot `p % c`, the
    keys of earlier chunks masked.

    Args:
        chunk_size: positive int.

    Example:

    >>> import numpy as np
    >>> from keras_attention import mods
    >>> q, kv = np.arange(4)[:, None], np.arange(4)[None, :]
    >>> mods.ChunkedCausalMask(2)(0, 0, q, kv).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 0, 1, 0],
           [0, 0, 1, 1]])
    """

    def __init__(self, chunk_size):
        validation.check_positive_int("chunk_size", chunk_size)
        self.chunk_size = int(chunk_size)

    def __call__(self, batch, head, q_idx, kv_idx):
        same = (q_idx // self.chunk_size) == (kv_idx // self.chunk_size)
        return scoring.causal(q_idx, kv_idx) & same

    def lookback(self):
        """A query sees at most the `chunk_size - 1` positions before it
        in its chunk."""
        return self.chunk_size - 1

    def get_config(self):
        return {"chunk_size": self.chunk_size}


@keras.saving.register_keras_serializable(package=PACKAGE)
class PrefixLMMask(MaskMod):
    """Prefix-LM: bidirectional inside a prefix, causal after it: query
    `i` may attend to key `j` when `j <= i` or `j < prefix_length`.

    Args:
        prefix_length: a non-negative int (the same for every example),
            or None: then a `(batch,)` integer tensor per call, through
            the layer's `mod_inputs={"prefix_length": ...}` (or `bind`).
    """

    def __init__(self, prefix_length=None):
        validation.check_non_negative_int(
            "prefix_length", prefix_length, allow_none=True
        )
        self.prefix_length = (
            None if prefix_length is None else int(prefix_length)
        )
        self.inputs = () if prefix_length is not None else ("prefix_length",)

    def __call__(self, batch, head, q_idx, kv_idx):
        if self.prefix_length is None:
            raise ValueError(
                "PrefixLMMask() without a `prefix_length` needs one per "
                "call: pass mod_inputs={'prefix_length': lengths} to the "
                "layer, or call `.bind(prefix_length=lengths)`."
            )
        return scoring.causal(q_idx, kv_idx) | (kv_idx < self.prefix_length)

    def _bind(self, prefix_length):
        return _PrefixLMPerExample(prefix_length)

    def get_config(self):
        return {"prefix_length": self.prefix_length}


class _PrefixLMPerExample:
    """`PrefixLMMask` bound to per-example prefix lengths `(batch,)`."""

    def __init__(self, prefix_length):
        self.prefix_length = ops.reshape(
            ops.cast(ops.convert_to_tensor(prefix_length), "int32"), (-1,)
        )

    def __call__(self, batch, head, q_idx, kv_idx):
        prefix = ops.take(self.prefix_length, batch)
        return scoring.causal(q_idx, kv_idx) | (kv_idx < prefix)


@keras.saving.register_keras_serializable(package=PACKAGE)
class DocumentMask(MaskMod):
    """Packed sequences: a query may attend only to keys of its own
    document, given per token by integer segment ids `(batch, T)` at call
    time (`mod_inputs={"segment_ids": ids}`, or `.bind(segment_ids=ids)`).

    Combine with `CausalMask` for causal packed training:
    `and_masks(CausalMask(), DocumentMask())`. Keys and queries share the
    ids (self-attention; a cache's keys are absolute positions of the same
    ids).

    Example:

    >>> import numpy as np
    >>> from keras_attention import mods
    >>> ids = np.array([[0, 0, 1, 1]])
    >>> q, kv = np.arange(4)[:, None], np.arange(4)[None, :]
    >>> mask = mods.DocumentMask().bind(segment_ids=ids)
    >>> np.asarray(mask(0, 0, q, kv)).astype(int)
    array([[1, 1, 0, 0],
           [1, 1, 0, 0],
           [0, 0, 1, 1],
           [0, 0, 1, 1]])
    """

    inputs = ("segment_ids",)

    def __call__(self, batch, head, q_idx, kv_idx):
        raise ValueError(
            "DocumentMask needs the segment ids of each call: pass "
            "mod_inputs={'segment_ids': ids} to the layer, or call "
            "`.bind(segment_ids=ids)`."
        )

    def _bind(self, segment_ids):
        ids = ops.convert_to_tensor(segment_ids)
        if len(ids.shape) != 2:
            raise ValueError(
                "`segment_ids` must have shape (batch, T). "
                f"Received: segment_ids.shape={tuple(ids.shape)!r}"
            )
        return _Documents(ops.cast(ids, "int32"))


class _Documents:
    """`DocumentMask` bound to segment ids `(batch, T)`."""

    def __init__(self, segment_ids):
        self.segment_ids = segment_ids

    def __call__(self, batch, head, q_idx, kv_idx):
        ids = self.segment_ids
        return _gather(ids, batch, q_idx) == _gather(ids, batch, kv_idx)

    def document_ids(self):
        """The segment ids `(batch, T)` (int32): the mask is `ids[b, q]
        == ids[b, kv]`, positions clipped to `[0, T)` (a kernel may
        compare them itself: the flex path)."""
        return self.segment_ids
