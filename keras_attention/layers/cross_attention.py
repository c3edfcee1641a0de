import keras

from keras_attention.layers import recording
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.utils import keras_utils
from keras_attention.utils import validation


@keras.saving.register_keras_serializable(package="keras_attention")
class CrossAttention(MultiHeadAttention):
    """Multi-head cross-attention: queries from a decoder, keys and values
    from an encoder's output (`context`).

    Same weights as `MultiHeadAttention` (key and value projections read
    `context`). The Keras masks of `query` and `context` are honoured; the
    query's mask is propagated to the output.

    Args:
        num_heads: int, number of attention heads.
        key_dim: int, size of each query/key head.
        **kwargs: the other arguments of `MultiHeadAttention`.

    Call arguments:
        query: `(batch, Tq, features)`.
        context: `(batch, Tc, context_features)`.
        query_mask, context_mask: optional boolean padding masks (read from
            the Keras masks when omitted).
        attention_mask: optional boolean `(Tq, Tc)`, `(batch, Tq, Tc)` or
            `(batch, heads, Tq, Tc)`.
        return_attention_scores: bool.
        training: bool.
        cache: optional precomputed context keys/values from
            `compute_cache(context)`, so that incremental decoding projects
            the encoder output once per source sentence.

    Returns:
        `(batch, Tq, output_dim)`, then the scores `(batch, heads, Tq, Tc)`
        if requested, then the cache if one was given.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.CrossAttention(num_heads=2, key_dim=4)
    >>> query = np.ones((2, 3, 8), "float32")
    >>> context = np.ones((2, 7, 6), "float32")
    >>> context_mask = np.array([[True] * 5 + [False] * 2, [True] * 7])
    >>> y, scores = layer(query, context, context_mask=context_mask,
    ...                   return_attention_scores=True)
    >>> tuple(y.shape), tuple(scores.shape)
    ((2, 3, 8), (2, 2, 3, 7))
    >>> # padded context
    >>> float(keras.ops.convert_to_numpy(scores)[0, :, :, 5:].max())
    0.0

    References:
        - Vaswani et al., 2017, "Attention Is All You Need".
    """

    attention_kind = "cross"

    def build(self, query_shape, context_shape):
        super().build(query_shape, context_shape)

    def call(
        self,
        query,
        context,
        query_mask=None,
        context_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        cache=None,
        mod_inputs=None,
    ):
        self._check_call_inputs(
            query, context, context, ("query", "context", "context")
        )
        # Keras fills `query_mask`/`context_mask` from the inputs' Keras
        # masks only when they are passed as tensors to `__call__`; read
        # them here too (direct `call`, nested layers).
        if query_mask is None:
            query_mask = keras_utils.keras_mask(query)
        if context_mask is None:
            context_mask = keras_utils.keras_mask(context)
        validation.check_padding_mask("query_mask", query_mask, query, "query")
        if context is not None:
            validation.check_padding_mask(
                "context_mask", context_mask, context, "context"
            )
        elif cache is not None:  # Keys/values precomputed: (b, 2, Tv, g, d).
            validation.check_padding_mask(
                "context_mask",
                context_mask,
                cache[:, 0],
                "cache[:, 0]",
                trailing=2,
            )
        return super().call(
            query=query,
            value=context,
            query_mask=query_mask,
            value_mask=context_mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            cache=cache,
            mod_inputs=mod_inputs,
        )

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook: see `MultiHeadAttention`."""
        meta = dict(
            kind="cross",
            query_mask=recording.padding_mask(
                arguments.get("query_mask"), arguments.get("query")
            ),
            key_mask=recording.padding_mask(
                arguments.get("context_mask"), arguments.get("context")
            ),
            causal=False,
            window=None,
        )
        return recording.numpy_weights(scores), meta

    def compute_output_spec(
        self,
        query,
        context,
        return_attention_scores=False,
        cache=None,
        **kwargs,
    ):
        return super().compute_output_spec(
            query,
            context,
            return_attention_scores=return_attention_scores,
            cache=cache,
        )
