"""`Seq2SeqAttention`: the public base of the encoder-decoder attention layers
(`BahdanauAttention`, `LuongAttention`, or a scorer of your own) that
`AttentionRNNDecoder` drives one step at a time."""

import keras
from keras import ops

from keras_attention.layers import recording
from keras_attention.ops import masked_softmax
from keras_attention.utils import validation


@keras.saving.register_keras_serializable(package="keras_attention")
class Seq2SeqAttention(recording.AttentionRecording, keras.layers.Layer):
    """Base class of encoder-decoder ("seq2seq") attention layers.

    A query `q_i` (a decoder state) attends to the source steps `j` of an
    encoder's output: keys `k_j` score it, values `v_j` are averaged:

        a_ij = softmax_j(score(q_i, k_j))   (over the unmasked source steps)
        c_i  = sum_j a_ij v_j

    A subclass writes the score in two hooks; everything else is done
    here, as Keras's `Attention` is the base of `AdditiveAttention`.
    `BahdanauAttention` and `LuongAttention` are such subclasses, and
    `AttentionRNNDecoder` accepts any of them: it calls `prepare_memory`
    once per source and `attend` at every decoding step.

    Axes: `b` batch, `Tq` (`i`) queries, `Tv` (`j`) source steps, `dq`,
    `dk`, `dv` the feature sizes of queries, keys and values.

    Hooks (a subclass implements both):

    - `prepare_memory(value, key)`: processes the keys once per source
      sentence (e.g. the projection `W_k k_j`), never the query.
      `value` is `(b, Tv, dv)` and `key` `(b, Tv, dk)`, both in the
      layer's compute dtype (the layer and `AttentionRNNDecoder` pass
      `key=value` when the caller gave no keys; treat `key=None` the
      same way).
      Returns the "memory": a tensor (or a nest of tensors) that is
      passed as it is to `attend`, e.g. `(b, Tv, units)`.
    - `attend(query, memory, value, value_mask=None, query_mask=None,
      training=None, return_weights=True, **kwargs)`: scores a rank-3
      `query` `(b, Tq, dq)` (one decoding step arrives as `Tq = 1`)
      against `memory = prepare_memory(value, key)` and returns
      `(context, weights)`: the context `(b, Tq, dv)` and the weights
      `(b, Tq, Tv)` in float32 (they may be None when
      `return_weights=False`). `value_mask` `(b, Tv)` and `query_mask`
      `(b, Tq)` are boolean or None. `**kwargs` must be accepted: it
      receives the extra call arguments of the subclass (and
      `positions`, the target step, from `AttentionRNNDecoder`); a
      scorer that does not need them ignores them. Most scorers compute
      the scores `(b, Tq, Tv)` and return
      `self.apply_scores(scores, value, value_mask, query_mask,
      training)`, which does the masked softmax, the dropout and the
      weighted sum.

    The base class handles: one-step queries `(b, dq)` (run as
    `(b, 1, dq)`, then squeezed back); casting the inputs to the compute
    dtype; `key` defaulting to `value`; the shape checks (a `ValueError`
    naming `query`, `value` or `key`, at build and again at call time);
    the mask checks (a `ValueError` naming `query_mask` or
    `value_mask`); Keras masks of `query` and `value` (read into
    `query_mask` and `value_mask`); what the hooks return (`attend` a
    pair `(context, weights)` of shapes `(b, Tq, dv)` and `(b, Tq, Tv)`,
    `prepare_memory` anything but None; else a `TypeError` or
    `ValueError` names the hook and the rule); dropout on the weights (in
    `apply_scores`); `return_attention_scores` (the weights cast to the
    compute dtype); the output specs for symbolic (functional) calls;
    and `dropout` and `seed` in the config. A subclass that creates
    weights overrides `build(query_shape, value_shape, key_shape=None)`
    and calls `super().build(...)` first (the shape checks); one with
    call arguments of its own overrides `call` and passes them to
    `attend` through `_call(..., **kwargs)`, as `LuongAttention` does
    with `positions`. Register a subclass
    (`keras.saving.register_keras_serializable`) to save it in `.keras`
    files.

    Args:
        dropout: float in [0, 1), dropout on the attention weights.
        seed: optional int, seed of the dropout.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(batch, Tq, dq)` (a whole target sequence) or
            `(batch, dq)` (one decoder step).
        value: `(batch, Tv, dv)`, the encoder states.
        key: optional `(batch, Tv, dk)`; defaults to `value`.
        query_mask: optional boolean `(batch, Tq)` (`(batch,)` for a
            one-step query); padded queries get zero weights and a zero
            context. Read from the Keras mask.
        value_mask: optional boolean `(batch, Tv)`, True on real source
            steps. Read from the Keras mask.
        return_attention_scores: bool, also return the weights.
        training: bool, dropout on or off.

    Returns:
        The context `(batch, Tq, dv)` (or `(batch, dv)`), then, if
        requested, the weights `(batch, Tq, Tv)` (or `(batch, Tv)`).

    Example:

    A scaled dot-product scorer, `score(q_i, k_j) = q_i . k_j / sqrt(dq)`
    (computed in float32, so that float16 states cannot overflow):

    >>> import numpy as np
    >>> from keras import ops
    >>> import keras_attention
    >>> class ScaledDotAttention(keras_attention.layers.Seq2SeqAttention):
    ...     def prepare_memory(self, value, key=None):
    ...         key = value if key is None else key
    ...         return ops.cast(key, "float32")  # b j d
    ...     def attend(self, query, memory, value, value_mask=None,
    ...                query_mask=None, training=None, **kwargs):
    ...         query = ops.cast(query, "float32") / query.shape[-1] ** 0.5
    ...         scores = ops.einsum("bid,bjd->bij", query, memory)
    ...         return self.apply_scores(
    ...             scores, value, value_mask, query_mask, training)
    >>> attention = ScaledDotAttention()
    >>> query = np.ones((2, 3, 4), "float32")
    >>> memory = np.ones((2, 5, 4), "float32")
    >>> memory_mask = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    >>> context, weights = attention(
    ...     query, memory, value_mask=memory_mask,
    ...     return_attention_scores=True)
    >>> tuple(context.shape)
    (2, 3, 4)
    >>> np.round(np.asarray(weights)[:, 0], 2)   # first query
    array([[0.5, 0.5, 0. , 0. , 0. ],
           [0.2, 0.2, 0.2, 0.2, 0.2]], dtype=float32)

    The decoder takes it as any other attention (its queries, the decoder
    states of size `units`, must match the keys' size here):

    >>> decoder = keras_attention.layers.AttentionRNNDecoder(
    ...     4, ScaledDotAttention())
    >>> targets = np.ones((2, 6, 3), "float32")  # embedded targets
    >>> tuple(decoder(targets, memory, memory_mask=memory_mask).shape)
    (2, 6, 4)

    References:
        - Bahdanau, Cho & Bengio, 2015, "Neural Machine Translation by
          Jointly Learning to Align and Translate".
        - Luong, Pham & Manning, 2015, "Effective Approaches to
          Attention-based Neural Machine Translation".
    """

    def __init__(self, dropout=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.dropout = validation.check_rate("dropout", dropout)
        self.seed = validation.check_seed("seed", seed)
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(
            rate=self.dropout, seed=self.seed, dtype=self.dtype_policy
        )

    def build(self, query_shape, value_shape, key_shape=None):
        """Checks the shapes (see the class docstring); a subclass that
        creates weights calls it first."""
        key_shape = value_shape if key_shape is None else key_shape
        self._query_features = self._check_shapes(
            query_shape, value_shape, key_shape
        )
        # The feature sizes the subclass's weights are built for (checked
        # again at every call).
        self._built_features = (
            query_shape[-1],
            value_shape[-1],
            key_shape[-1],
        )

    def _check_call_inputs(self, query, value, key):
        """At call time: the build-time checks again (a layer built on
        `(None, None, d)` inputs could not compare the lengths then), the
        feature sizes of the build and numeric dtypes; `ValueError` or
        `TypeError` naming `query`, `value` or `key`."""
        inputs = (("query", query), ("value", value), ("key", key))
        for name, x in inputs:
            if x is not None:
                validation.check_numeric_input(name, x)
        key_shape = value.shape if key is None else key.shape
        self._check_shapes(query.shape, value.shape, key_shape)
        built = getattr(self, "_built_features", None)
        if built is None:
            return
        for (name, x), size in zip(inputs, built):
            if x is not None:
                validation.check_built_features(name, x.shape, size)
        if key is None:  # `key` defaults to `value`.
            validation.check_built_features(
                "key", value.shape, built[2], "value"
            )

    def _check_shapes(self, query_shape, value_shape, key_shape):
        """`ValueError` naming the input unless the shapes fit; returns the
        query's feature size."""
        query_features = validation.check_sequence_shape(
            "query",
            query_shape,
            ranks=(2, 3),
            layout="(batch, Tq, features) or (batch, features)",
        )
        for name, shape in (("value", value_shape), ("key", key_shape)):
            validation.check_sequence_shape(
                name, shape, layout="(batch, Tv, features)"
            )
        if (
            None not in (value_shape[1], key_shape[1])
            and value_shape[1] != key_shape[1]
        ):
            raise ValueError(
                "`key` and `value` must have the same number of steps. "
                f"Received: key_shape={tuple(key_shape)}, "
                f"value_shape={tuple(value_shape)}"
            )
        return query_features

    def _check_masks(self, query, value, query_mask, value_mask):
        """`ValueError` naming the mask unless it fits its input's axes
        (a one-step query `(batch, features)` takes a `(batch,)` mask)."""
        one_step = len(query.shape) == 2
        validation.check_padding_mask(
            "query_mask",
            query_mask,
            query,
            "query (one-step)" if one_step else "query",
        )
        validation.check_padding_mask("value_mask", value_mask, value, "value")

    def _dropout_weights(self, weights, training):
        if self.dropout > 0:
            return self._dropout_layer(weights, training=training)
        return weights

    def apply_scores(
        self, scores, value, value_mask=None, query_mask=None, training=None
    ):
        """Softmax of `scores` over the unmasked source steps, dropout,
        then the weighted sum `c_i = sum_j a_ij v_j`.

        Args:
            scores: `(batch, Tq, Tv)` scores (any float dtype).
            value: `(batch, Tv, dv)`.
            value_mask: optional boolean `(batch, Tv)`.
            query_mask: optional boolean `(batch, Tq)`.
            training: bool, dropout on or off.

        Returns:
            `(context, weights)`: `(batch, Tq, dv)` in `value`'s dtype and
            float32 `(batch, Tq, Tv)` (the weights before dropout; rows
            of masked queries, or with every source step masked, are 0).
        """
        mask = None
        if value_mask is not None:
            mask = ops.cast(value_mask, "bool")[:, None, :]  # b 1 j
        if query_mask is not None:
            q = ops.cast(query_mask, "bool")[:, :, None]  # b i 1
            mask = q if mask is None else ops.logical_and(mask, q)
        weights = masked_softmax(scores, mask)  # b i j, float32
        kept = ops.cast(self._dropout_weights(weights, training), value.dtype)
        context = ops.einsum("bij,bjd->bid", kept, value)
        return context, weights

    def prepare_memory(self, value, key=None):
        """Hook: processes the keys once per source (see the class
        docstring); the result is passed to `attend` as `memory`."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement `prepare_memory(value, "
            "key)`, the `Seq2SeqAttention` hook that processes the keys "
            "once per source (it may return `key` unchanged)."
        )

    def attend(
        self,
        query,
        memory,
        value,
        value_mask=None,
        query_mask=None,
        training=None,
        return_weights=True,
        **kwargs,
    ):
        """Hook: the context `(b, Tq, dv)` and float32 weights
        `(b, Tq, Tv)` of a rank-3 `query`, with `memory =
        prepare_memory(value, key)` (see the class docstring); the
        weights may be None when `return_weights=False`."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement `attend(query, memory, "
            "value, value_mask=None, query_mask=None, training=None, "
            "**kwargs)`, the `Seq2SeqAttention` hook that scores the "
            "queries and returns `(context, weights)`."
        )

    def _run_prepare_memory(self, value, key):
        """`prepare_memory(value, key)`, checked: `TypeError` naming the
        hook when it returns None (a forgotten `return`)."""
        memory = self.prepare_memory(value, key)
        if memory is None:
            raise TypeError(
                f"`{type(self).__name__}.prepare_memory` returned None. The "
                "`Seq2SeqAttention` hook must return the memory (a tensor or "
                "a nest of tensors) that `attend` reads; return `key` "
                "unchanged when there is nothing to precompute."
            )
        return memory

    def _run_attend(self, query, memory, value, return_weights=True, **kwargs):
        """`attend(query, memory, value, ...)`, with what it returns
        checked against the hook's contract: a pair `(context, weights)`,
        the context `(b, Tq, dv)` and, when `return_weights`, the weights
        `(b, Tq, Tv)` (`query` is rank 3 here). A `TypeError` (not a pair)
        or `ValueError` (a wrong shape) names the hook and the rule;
        dimensions unknown at trace time are not compared."""
        result = self.attend(
            query, memory, value, return_weights=return_weights, **kwargs
        )
        name = f"`{type(self).__name__}.attend`"
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise TypeError(
                f"{name} must return a pair `(context, weights)` (the "
                "`Seq2SeqAttention` hook contract; `apply_scores` returns "
                f"one). It returned {_describe(result)}."
            )
        context, weights = result
        batch, steps = query.shape[0], query.shape[1]
        expected = {
            "context": ((batch, steps, value.shape[-1]), "(batch, Tq, dv)"),
            "weights": ((batch, steps, value.shape[1]), "(batch, Tq, Tv)"),
        }
        for part, tensor in (("context", context), ("weights", weights)):
            if part == "weights" and not return_weights:
                continue
            want, layout = expected[part]
            shape = getattr(tensor, "shape", None)
            if shape is None or not _shape_matches(tuple(shape), want):
                raise ValueError(
                    f"{name} returned {part} {_describe(tensor)}; the hook "
                    f"must return {part} of shape {layout} = {want!r} for "
                    f"query.shape={tuple(query.shape)!r} and "
                    f"value.shape={tuple(value.shape)!r}."
                )
        return context, weights

    def _call(
        self,
        query,
        value,
        key,
        query_mask,
        value_mask,
        return_attention_scores,
        training,
        **kwargs,
    ):
        """The work of `call`; `kwargs` go to `attend`."""
        self._check_call_inputs(query, value, key)
        self._check_masks(query, value, query_mask, value_mask)
        # Integer (or any non-compute-dtype) inputs are computed in the
        # layer's compute dtype: cast to an int dtype, the weights would
        # round to zero.
        dtype = self.compute_dtype
        query, value = ops.cast(query, dtype), ops.cast(value, dtype)
        key = value if key is None else ops.cast(key, dtype)
        single = len(query.shape) == 2
        if single:
            query = query[:, None, :]
            query_mask = None if query_mask is None else query_mask[:, None]
        memory = self._run_prepare_memory(value, key)
        context, weights = self._run_attend(
            query,
            memory,
            value,
            value_mask=value_mask,
            query_mask=query_mask,
            training=training,
            return_weights=return_attention_scores,
            **kwargs,
        )
        if not return_attention_scores:
            return context[:, 0] if single else context
        weights = ops.cast(weights, self.compute_dtype)
        if single:
            context, weights = context[:, 0], weights[:, 0]
        return context, weights

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        return self._call(
            query,
            value,
            key,
            query_mask,
            value_mask,
            return_attention_scores,
            training,
        )

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook (`layers/recording.py`): the
        alignment `(batch, 1, Tq, Tv)` (one step: `Tq` = 1)."""
        weights = recording.numpy_weights(scores)
        weights = weights[:, None] if weights.ndim == 2 else weights
        query_mask = recording.padding_mask(
            arguments.get("query_mask"), arguments.get("query")
        )
        if query_mask is not None and query_mask.ndim == 1:
            query_mask = query_mask[:, None]  # a one-step query
        meta = dict(
            kind="cross",
            query_mask=query_mask,
            key_mask=recording.padding_mask(
                arguments.get("value_mask"), arguments.get("value")
            ),
            causal=False,
            window=None,
        )
        return weights[:, None], meta

    def compute_output_spec(
        self, query, value, key=None, return_attention_scores=False, **kwargs
    ):
        lead = tuple(query.shape[:-1])
        context = keras.KerasTensor(
            lead + (value.shape[-1],), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return context
        weights = keras.KerasTensor(
            lead + (value.shape[1],), dtype=self.compute_dtype
        )
        return context, weights

    def get_config(self):
        config = super().get_config()
        config.update({"dropout": self.dropout, "seed": self.seed})
        return config


def _describe(value):
    """`value` in an error message: its type, and its shape if it has one."""
    shape = getattr(value, "shape", None)
    if shape is None:
        return f"a {type(value).__name__}"
    return f"a {type(value).__name__} of shape {tuple(shape)!r}"


def _shape_matches(shape, want):
    """`shape` has `want`'s rank and agrees on every dimension known in
    both (None: unknown)."""
    return len(shape) == len(want) and all(
        s is None or w is None or s == w for s, w in zip(shape, want)
    )
