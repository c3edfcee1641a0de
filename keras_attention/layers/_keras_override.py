"""The adapter between `MultiHeadAttention` and `_compute_attention`
overrides written for Keras's layer.

This library's `_compute_attention` takes the masks structurally
(`query_mask`, `key_mask`, `use_causal_mask`, `query_offset`, bound
`score_mod`/`mask_mod`) so that no path builds a dense `(Tq, Tk)` mask it
does not need. A subclass written for Keras's `MultiHeadAttention`
overrides `_compute_attention(query, key, value, attention_mask=None,
training=None[, return_attention_scores])` and takes none of them:
`attention_step` folds every mask into one dense `attention_mask` for it,
and refuses a score function it could not apply.
"""

import inspect

from keras_attention.ops.dense import dense_mask

STRUCTURAL_ARGUMENTS = frozenset({"query_mask", "key_mask", "mask_mod"})


def takes_structure(method):
    """Whether a `_compute_attention` takes this library's structural
    keyword arguments (ours does; a Keras-style override may not)."""
    params = inspect.signature(method).parameters.values()
    names = {p.name for p in params}
    return (
        any(p.kind is p.VAR_KEYWORD for p in params)
        or STRUCTURAL_ARGUMENTS <= names
    )


def fold_masks(q, k, use_causal_mask=False, score_mod=None, **masks):
    """Every mask of a call as one dense bool `(b|1, h|1, Tq, Tk)` (None
    when nothing masks): for `_compute_attention` overrides with Keras's
    signature, which take `attention_mask` only."""
    return dense_mask(query=q, key=k, causal=use_causal_mask, **masks)


def attention_step(layer, q, k, v, return_scores, training, **kwargs):
    """Calls `layer._compute_attention`, or a Keras-style override of it
    (without the structural keyword arguments) with every mask folded
    into a dense `attention_mask`; the layer's learned sinks as
    `sink_logits` when it has them (refused for a step that does not
    take them).

    Returns what `_compute_attention` returns: `(result, scores)` (scores
    None unless `return_scores`), or for a Keras-style override that does
    not take `return_attention_scores`, whatever it returns.
    """
    step = layer._compute_attention
    sinks = layer._sink_logits()
    if sinks is not None:  # Learned sinks: only to steps that take them.
        kwargs["sink_logits"] = sinks
    _check_sinks_reach(layer, kwargs)
    # What the call asked, for steps that do not take the argument
    # (Keras's GroupedQueryAttention reads this attribute).
    layer._return_attention_scores = return_scores
    if takes_structure(type(layer)._compute_attention):
        return step(
            q,
            k,
            v,
            training=training,
            return_attention_scores=return_scores,
            **kwargs,
        )
    if kwargs.get("score_mod") is not None:
        raise ValueError(
            f"{type(layer).__name__}._compute_attention does not take "
            "`score_mod` (Keras's signature), so the layer's score "
            "function cannot reach it. Accept keyword arguments "
            "(`**kwargs`) and pass them on to "
            "`super()._compute_attention`."
        )
    mask = fold_masks(q, k, **kwargs)
    params = inspect.signature(step).parameters
    extra = {}
    if "return_attention_scores" in params:
        extra["return_attention_scores"] = return_scores
    return step(q, k, v, attention_mask=mask, training=training, **extra)


def _check_sinks_reach(layer, kwargs):
    """`ValueError` when the layer has learned sinks (`sink_logits` in
    `kwargs`) and its `_compute_attention` does not take them: they
    would be silently ignored."""
    if kwargs.get("sink_logits") is None:
        return
    params = inspect.signature(type(layer)._compute_attention).parameters
    if "sink_logits" in params or any(
        p.kind is p.VAR_KEYWORD for p in params.values()
    ):
        return
    raise ValueError(
        f"{type(layer).__name__}._compute_attention does not take "
        "`sink_logits`, so the layer's learned sinks cannot reach it. "
        "Received: learned_sinks=True"
    )
