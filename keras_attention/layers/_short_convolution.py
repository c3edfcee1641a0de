"""The short causal depthwise convolution of `GatedDeltaNet`, with its
decoding state, that skips padded tokens and restarts at each packed
document.

    y_i = sum_{d=0}^{K-1} w[:, K-1-d] * x_{i-d}     (per channel)

where `x_{i-d}` is the `d`-th real token before `i` in `i`'s document
(zero when there is none); the `K - 1` inputs before the call (the
convolution state of a cache) precede the call's first token, in its
first document. Padded tokens are taken out of the sequence, not zeroed:
a token after padding sees the real tokens before the padding, so a
right-padded prompt buffer leaves the state of its last real tokens (the
state a decoding step continues from), and padding in the middle of a
row changes nothing. Without padding nor documents this is keras-hub's
`_causal_conv1d` (a zero-padded `depthwise_conv`).

Axes in comments: b - batch, t - positions, c - channels, K - kernel.
"""

from keras import ops

from keras_attention.ops import compiled_kernel


def _real_first(mask):
    """The order `(b, t)` that puts the real tokens of each row first,
    in their order (padded ones after), and the count of real tokens."""
    t = ops.shape(mask)[1]
    positions = ops.arange(t, dtype="int32")[None, :]
    order = ops.argsort(ops.where(mask, positions, positions + t), axis=-1)
    return order, ops.sum(ops.cast(mask, "int32"), axis=-1)


def _gather(x, indices):
    """`x[b, indices[b, t]]` along axis 1 (`x` of rank 2 or 3)."""
    if len(x.shape) == 3:
        indices = indices[..., None]
    return ops.take_along_axis(x, indices, axis=1)


@compiled_kernel
def causal_convolution(x, kernel, state, mask=None, documents=None):
    """`(y, new_state)` of the convolution above.

    Args:
        x: `(b, t, c)`, the inputs of this call.
        kernel: `(c, K)` (keras-hub's `conv1d_kernel`), tap `K - 1` on
            the current token.
        state: `(b, K - 1, c)`, the inputs before this call (zeros for
            none).
        mask: optional boolean `(b, t)`, False on padded tokens.
        documents: optional integer `(b, t)`, the document index of each
            token (non-decreasing, 0 for the document the state belongs
            to); taps never cross documents.

    Returns:
        `y` `(b, t, c)` (at a padded token: the output of the last real
        token before it, which nothing should read) and the new state
        `(b, K - 1, c)`: the last `K - 1` real inputs, the old state's
        included.
    """
    size = kernel.shape[-1]
    t = ops.shape(x)[1]
    kernel = ops.cast(kernel, x.dtype)
    order = count = None
    if mask is not None:
        order, count = _real_first(mask)
        x = _gather(x, order)
        if documents is not None:
            documents = _gather(documents, order)
    combined = ops.concatenate([ops.cast(state, x.dtype), x], axis=1)
    if documents is not None:
        lead = ops.zeros_like(documents[:, :1])
        documents = ops.concatenate([lead] * (size - 1) + [documents], 1)
        own = documents[:, size - 1 :]
    y = 0.0
    for tap in range(size):
        term = combined[:, tap : tap + t] * kernel[:, tap]
        if documents is not None and tap < size - 1:
            same = ops.equal(documents[:, tap : tap + t], own)
            term = term * ops.cast(same, x.dtype)[..., None]
        y = y + term
    if mask is None:
        return y, combined[:, t:]
    ranks = ops.maximum(ops.cumsum(ops.cast(mask, "int32"), axis=1) - 1, 0)
    y = _gather(y, ranks)
    steps = ops.arange(size - 1, dtype="int32")[None, :]
    new_state = _gather(combined, count[:, None] + steps)
    return y, new_state
