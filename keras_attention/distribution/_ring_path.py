"""The "ring" attention path: `ring_attention` in the table of paths
(`keras_attention/ops/paths.py`), so that every `dot_product_attention`
call (those of `MultiHeadAttention` and the blocks) runs as ring
attention inside `implementation_scope("ring", mesh=..., ...)`, the scope
`ContextParallel.scope()` enters.

What the path runs: self-attention over one sequence with the request's
causal rule, key and query masks, mask and score functions. What it
refuses (`can_run`, raised when the path is forced): weights and dropout
on them, a dense `attention_mask` (it cannot be split by devices: use
`key_mask` or a `mask_mod`), learned sinks, a log-sum-exp output, a
cache offset (cached decoding: generate outside the scope), keys of
another length. Shapes unknown while tracing (a functional model's
shape inference) run the automatic one-device choice: only shapes come
out of it.

The path is `exclusive` (`paths.exclusive_scope`): inside its scope a
call naming another implementation is refused, and so is what a layer
would run on another kernel (`MultiHeadAttention`'s returned scores,
dropout on the weights in training, `flash_attention`;
`LocalSelfAttention`'s global tokens). Sliding windows run on the ring,
as mask functions on global positions.
"""

from keras_attention.distribution import _ring_blocks
from keras_attention.distribution.ring_attention import ring_attention
from keras_attention.ops import paths


def _static(request):
    shapes = (request.query.shape, request.key.shape)
    return all(isinstance(d, int) for shape in shapes for d in shape)


def _can_run(request):
    problem = None
    received = ""  # the refused argument, first among what is received
    offset = request.query_offset
    if request.needs_weights:
        problem = "it computes no attention weights (nor dropout on them)"
    elif request.attention_mask is not None:
        problem = (
            "a dense `attention_mask` cannot be split across devices (use "
            "`key_mask`, `query_mask` or a `mask_mod`)"
        )
    elif request.sink_logits is not None:
        problem = (
            "it takes no learned sinks (`sink_logits`, which a layer's "
            "`learned_sinks=True` passes)"
        )
        received = f"sink_logits={request.sink_logits!r}, "
    elif request.return_lse:
        problem = "it returns no log-sum-exp"
        received = f"return_lse={request.return_lse!r}, "
    elif not (isinstance(offset, int) and offset == 0):
        problem = (
            "it runs no cache offset (cached decoding runs on one device: "
            "generate outside the context-parallel scope)"
        )
    elif _static(request) and request.query.shape[1] != request.key.shape[1]:
        problem = "the keys must be the queries' sequence (self-attention)"
    if problem is None:
        return None
    return (
        f"The ring attention path cannot run this attention: {problem}. "
        f"Received: {received}query.shape={tuple(request.query.shape)!r}, "
        f"key.shape={tuple(request.key.shape)!r}, "
        f"query_offset={offset!r}, return_weights="
        f"{request.return_weights!r}"
    )


def _run(request, mesh=None, sequence_axis="sequence", layout="striped"):
    if mesh is None:
        raise ValueError(
            "The ring attention path needs a mesh: "
            "`implementation_scope('ring', mesh=..., sequence_axis=...)`, "
            "or `keras_attention.distribution.ContextParallel(...).scope()`."
            " Received: mesh=None"
        )
    if not _static(request):
        return paths.run_path(paths.choose(request), request)
    return ring_attention(
        request.query,
        request.key,
        request.value,
        mesh,
        sequence_axis=sequence_axis,
        causal=bool(request.causal),
        mask_mod=request.mask_mod,
        score_mod=request.score_mod,
        layout=layout,
        scale=request.scale,
        query_mask=request.query_mask,
        key_mask=request.key_mask,
    )


RING = paths.register_path(
    paths.AttentionPath(
        _ring_blocks.RING_PATH,
        ring_attention,
        _run,
        _can_run,
        options=_ring_blocks.RING_OPTIONS,
        op_level=True,
        exclusive=True,
    )
)
