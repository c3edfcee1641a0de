import keras
from keras import ops

from keras_attention import masks as masks_lib
from keras_attention.layers.self_attention import SelfAttention
from keras_attention.ops.local import banded_to_dense
from keras_attention.ops.local import local_attention
from keras_attention.utils import validation


def _refuse_unsupported(kwargs):
    """`MultiHeadAttention` options that have no meaning here."""
    for name, hint in (
        ("sliding_window", "use `window_size`"),
        ("attention_axes", "attention runs over the time axis only"),
    ):
        if kwargs.get(name) is not None:
            raise ValueError(
                f"`LocalSelfAttention` does not take `{name}` ({hint}). "
                f"Received: {name}={kwargs[name]!r}"
            )
    shape = kwargs.get("output_shape")
    if isinstance(shape, (tuple, list)) and len(shape) != 1:
        raise ValueError(
            "`LocalSelfAttention` takes an int `output_shape` (or a 1-tuple). "
            f"Received: output_shape={shape!r}"
        )


@keras.saving.register_keras_serializable(package="keras_attention")
class LocalSelfAttention(SelfAttention):
    """Sliding-window (local) multi-head self-attention, linear in length.

    Position `i` attends to positions `j` with `i - left <= j <= i + right`.
    Same weights, call arguments and outputs as `SelfAttention` with
    `attention_mask=keras_attention.masks.sliding_window_mask(T, window_size,
    causal)`, but only the band is computed: queries are processed in blocks
    that attend to their own and neighbouring key blocks, so time and memory
    grow as `O(T * (left + right))` and no `T x T` tensor is ever created.

    Args:
        num_heads: int, number of attention heads.
        key_dim: int, size of each query/key head.
        window_size: int (`left = right = window_size`) or a pair
            `(left, right)` of non-negative ints.
        causal: bool, if True `right = 0` (position `i` sees
            `i - left .. i`).
        block_size: optional int, number of queries per block (a speed
            knob; results do not depend on it). Defaults to
            `keras_attention.ops.local.default_block_size(left, right)`.
        **kwargs: the other arguments of `SelfAttention` /
            `MultiHeadAttention` (`value_dim`, `num_key_value_heads`,
            `dropout`, `use_bias`, `output_shape`, initializers, ...) and
            base layer arguments.

    Call arguments:
        inputs: `(batch, T, features)`.
        mask: optional boolean `(batch, T)` padding mask (read from the Keras
            mask of `inputs` when omitted); padded positions are neither
            attended to nor attend (zero weights), and the mask is
            propagated to the output.
        attention_mask: optional dense boolean mask `(T, T)`,
            `(batch, T, T)` or `(batch, heads, T, T)`, combined with the
            window and padding masks. Only its band is read, but such a mask
            is itself `O(T^2)`: prefer padding masks for long sequences.
        return_attention_scores: bool, also return the banded attention
            weights `(batch, heads, T, left + right + 1)`, where
            `[..., i, k]` is the weight of query `i` on key `i - left + k`;
            expand them with `scores_to_dense` for plotting.
        training: bool, dropout on or off.
        cache, cache_update_index: incremental decoding as in
            `SelfAttention`; with a cache the window is applied as a mask
            over the cache (each step costs `O(max_length)` anyway) and
            returned scores are dense `(batch, heads, Tq, max_length)`.

    Returns:
        `(batch, T, output_dim)`, then the banded scores if requested, then
        the updated cache if one was given.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.LocalSelfAttention(
    ...     num_heads=2, key_dim=4, window_size=2
    ... )
    >>> x = np.random.default_rng(0).normal(size=(1, 10, 8)).astype("float32")
    >>> y, scores = layer(x, return_attention_scores=True)
    >>> tuple(y.shape), tuple(scores.shape)
    ((1, 10, 8), (1, 2, 10, 5))
    >>> dense = layer.scores_to_dense(scores)
    >>> tuple(dense.shape), float(dense[0, 0, 0, 3])
    ((1, 2, 10, 10), 0.0)

    References:
        - Parmar et al., 2018, "Image Transformer" (local 1D attention in
          query blocks).
        - Child et al., 2019, "Generating Long Sequences with Sparse
          Transformers".
        - Beltagy et al., 2020, "Longformer: The Long-Document Transformer"
          (sliding-window attention).
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        window_size,
        causal=False,
        block_size=None,
        **kwargs,
    ):
        super().__init__(
            num_heads=num_heads, key_dim=key_dim, causal=causal, **kwargs
        )
        _refuse_unsupported(kwargs)
        self._left, self._right = masks_lib.window_bounds(
            window_size, self.causal
        )
        validation.check_positive_int("block_size", block_size, allow_none=True)
        if isinstance(window_size, list):
            window_size = tuple(window_size)
        self.window_size = window_size
        self.block_size = block_size

    @property
    def window_bounds(self):
        """`(left, right)`: query `i` sees keys `i - left .. i + right`."""
        return (self._left, self._right)

    def scores_to_dense(self, scores):
        """Banded scores `(..., T, left + right + 1)` -> dense `(..., T, T)`
        (zeros outside the window), for plotting short sequences."""
        return banded_to_dense(scores, self.window_bounds)

    def call(
        self,
        inputs,
        mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_update_index=None,
    ):
        mask = self._padding_mask(inputs, mask)
        if cache is not None:
            # Decoding: attention over the cache, the window as a mask.
            window = masks_lib.sliding_window_mask(
                ops.shape(inputs)[1],
                self.window_bounds,
                key_length=ops.shape(cache)[2],
                offset=0 if cache_update_index is None else cache_update_index,
            )
            if attention_mask is not None:
                self._check_attention_mask(attention_mask, inputs, cache[:, 0])
            return super().call(
                inputs,
                mask=mask,
                attention_mask=masks_lib.combine_masks(window, attention_mask),
                return_attention_scores=return_attention_scores,
                training=training,
                cache=cache,
                cache_update_index=cache_update_index,
            )
        if attention_mask is not None:
            self._check_attention_mask(attention_mask, inputs, inputs)

        def dropout_fn(weights):
            return self._dropout_layer(weights, training=training)

        result = local_attention(
            self._rotate(self._query_dense(inputs), 0),
            self._rotate(self._key_dense(inputs), 0),
            self._value_dense(inputs),
            self.window_bounds,
            query_mask=mask,
            key_mask=mask,
            attention_mask=attention_mask,
            block_size=self.block_size,
            dropout_fn=dropout_fn if self.dropout > 0 else None,
            return_weights=return_attention_scores,
        )
        if return_attention_scores:
            result, scores = result
        if self.use_gate:  # (b, t, h, e) * sigmoid(inputs W_g + b_g)
            gate = self._gate_dense(inputs)
            result = ops.multiply(result, ops.cast(gate, result.dtype))
        output = self._output_dense(result)
        return (output, scores) if return_attention_scores else output

    def compute_output_spec(
        self, inputs, return_attention_scores=False, cache=None, **kwargs
    ):
        if cache is not None:
            return super().compute_output_spec(
                inputs,
                return_attention_scores=return_attention_scores,
                cache=cache,
            )
        batch, steps = inputs.shape[0], inputs.shape[1]
        out_dim = self._output_shape or inputs.shape[-1]
        output = keras.KerasTensor(
            (batch, steps, out_dim), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return output
        band = self._left + self._right + 1
        scores = keras.KerasTensor(
            (batch, self.num_heads, steps, band), dtype=self.compute_dtype
        )
        return output, scores

    def get_config(self):
        config = super().get_config()
        config.update(
            {"window_size": self.window_size, "block_size": self.block_size}
        )
        return config
