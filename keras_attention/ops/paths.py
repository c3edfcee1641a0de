"""The table of attention paths: one registry of name -> (function,
can-run predicate, options it takes), and the choice among them.

Every path computes the same attention (up to float rounding) under the
package's rules (`scoring.py`); they differ in memory, speed and what
they can do:

| name | module | |
|---|---|---|
| "dense" | `dense.py` | scores in memory; weights, dropout |
| "blockwise" | `blockwise.py` | query tiles, online softmax, O(T) memory |
| "fused" | `fused.py` | `keras.ops.dot_product_attention` kernels |
| "flex" | `flex.py` | PyTorch's FlexAttention: score and mask functions fused |
| "relative_sdpa" | `relative_sdpa.py` | a relative bias in SDPA (CPU) |
| "banded" | `sliding_window.py` | a sliding window in O(T * window) |
| "global_local" | `global_local.py` | a window plus global tokens |
| "topk" | `topk_attention.py` | each query on its top-k keys, O(T * k) |

A path runs one `AttentionRequest` (`path.run(request, **options)`, the
shared signature); `path.can_run(request)` returns None when it can, else
the reason, which a forced choice raises. `dot_product_attention`
chooses among the paths marked `op_level` (`choose`); the attention
layers ask the table for the banded path (`MultiHeadAttention` with a
`sliding_window`). "global_local" takes inputs no request carries (the
global tokens): `LocalSelfAttention` calls its `op` directly, and the
table lists it for lookup and documentation (`run` is None). So does
"topk", whose inputs name each query's keys (`indices`).

`implementation_scope` forces a path and its tuning options for the
calls made inside it, through a context variable (`current_scope()`),
not module state.
"""

import contextlib
import dataclasses

import keras
import numpy as np
from keras import ops

from keras_attention.ops import _backend
from keras_attention.ops import _backend_flex
from keras_attention.ops import _scope
from keras_attention.ops import captured
from keras_attention.ops import flex
from keras_attention.ops import relative_sdpa
from keras_attention.ops.blockwise import blockwise_attention
from keras_attention.ops.blockwise import keeps_probabilities
from keras_attention.ops.dense import dense_attention
from keras_attention.ops.dense import dense_mask
from keras_attention.ops.fused import fused_attention
from keras_attention.ops.fused import mask_band
from keras_attention.ops.global_local import global_local_attention
from keras_attention.ops.log_sum_exp import apply_sinks
from keras_attention.ops.masking import as_4d_mask
from keras_attention.ops.sliding_window import local_attention
from keras_attention.ops.topk_attention import topk_attention
from keras_attention.utils import keras_utils


@dataclasses.dataclass(frozen=True)
class AttentionRequest:
    """One attention computation, as every path takes it.

    Fields as `dot_product_attention`'s arguments (`attention_mask` as a
    4-D bool mask or None; `scale` a float); `window`: the left bound of
    a sliding window (`sliding_window - 1`) for the banded path, or None;
    `same_sequence`: the keys are the queries' sequence (self-attention),
    so their lengths agree even when unknown at trace time; `return_lse`:
    the caller wants the log-sum-exp; `sink_logits`: learned sinks `(h,)`
    or None (`log_sum_exp.py`: a path computes attention without them
    and returns its log-sum-exp, and `run_path` applies them).
    """

    @property
    def needs_lse(self):
        """Whether the path must return the log-sum-exp (asked for, or
        needed to apply learned sinks)."""
        return bool(self.return_lse) or self.sink_logits is not None

    query: object
    key: object
    value: object
    attention_mask: object = None
    scale: float = None
    dropout_fn: object = None
    return_weights: bool = False
    causal: bool = False
    query_offset: object = 0
    query_mask: object = None
    key_mask: object = None
    score_mod: object = None
    mask_mod: object = None
    window: int = None
    same_sequence: bool = False
    return_lse: bool = False
    sink_logits: object = None

    @property
    def needs_weights(self):
        """Whether the weights are formed (returned, or dropped out)."""
        return bool(self.return_weights) or self.dropout_fn is not None

    @property
    def static_lengths(self):
        """Whether both lengths are known at trace time."""
        return None not in (self.query.shape[1], self.key.shape[1])


@dataclasses.dataclass(frozen=True)
class AttentionPath:
    """One path of the table.

    Attributes:
        name: its name (`implementation=`).
        op: the module's public function.
        run: `run(request, **options)` -> the output, then the weights
            when `request.return_weights`, then the log-sum-exp `(b, h,
            i)` when `request.return_lse` or, on a path that does not
            apply learned sinks itself, when sinks need it
            (`request.needs_lse`) (a tuple when more than the output);
            None when the path takes inputs a request does not carry.
            `run_path` applies the sinks through the log-sum-exp for the
            paths that do not (`applies_sinks`).
        can_run: `can_run(request)` -> None, or the reason it cannot.
        options: the tuning options `run` takes (`implementation_scope`);
            results do not depend on them.
        op_level: whether `dot_product_attention` may choose it.
        applies_sinks: whether `run` applies `request.sink_logits`
            itself (else `run_path` does, through the log-sum-exp).
        exclusive: whether a scope that forces it binds every attention
            inside it (the ring: the inputs are sharded for it, another
            kernel would gather them): a call naming another path is
            refused, and the layers refuse what would run one
            (`exclusive_scope`).
    """

    name: str
    op: object
    run: object
    can_run: object
    options: tuple = ()
    op_level: bool = False
    applies_sinks: bool = False
    exclusive: bool = False


PATHS = {}


def register_path(path):
    """Adds `path` (an `AttentionPath`) to the table; `ValueError` if its
    name is taken."""
    if path.name in PATHS:
        raise ValueError(
            f"An attention path named {path.name!r} is registered already. "
            f"Received: path={path!r}"
        )
    PATHS[path.name] = path
    return path


def op_level_paths():
    """The names `dot_product_attention(implementation=...)` takes."""
    return tuple(name for name, path in PATHS.items() if path.op_level)


def path_options():
    """Every tuning option some path takes (`implementation_scope`)."""
    names = []
    for path in PATHS.values():
        names += [o for o in path.options if o not in names]
    return tuple(names)


# Forcing a path -------------------------------------------------------------


# The scope's state lives in `_scope.py` (the kernels refuse to run inside
# an exclusive scope and cannot import this module, which imports them).
ImplementationScope = _scope.ImplementationScope
current_scope = _scope.current_scope
exclusive_scope = _scope.exclusive_scope
refuse_in_exclusive_scope = _scope.refuse_in_exclusive_scope
release_exclusive_scope = _scope.release_exclusive_scope


def requested_path(implementation=None):
    """The path a call asks for: `implementation`, else the scope's (None:
    the automatic choice). `ValueError` when an exclusive scope is in
    effect and `implementation` names another path (it would run outside
    it, silently)."""
    exclusive = exclusive_scope()
    if exclusive is not None and implementation not in (None, exclusive):
        raise ValueError(
            f"Inside `implementation_scope({exclusive!r})` every attention "
            f"runs on the {exclusive!r} path (its inputs are laid out for "
            f"it: `ContextParallel` shards the sequence); "
            f"implementation={implementation!r} would run outside it. A "
            "layer asks for 'dense' to return attention weights or apply "
            "dropout to them, or for its `flash_attention` choice: turn "
            "those off inside the scope. Received: "
            f"implementation={implementation!r}"
        )
    return implementation or current_scope().name


def check_implementation(name):
    """`ValueError` unless `name` is None or an op-level path."""
    names = op_level_paths()
    if name is not None and name not in names:
        raise ValueError(
            f"`implementation` must be one of {names} or None. "
            f"Received: implementation={name!r}"
        )


@contextlib.contextmanager
def implementation_scope(name, **options):
    """Forces the implementation of `dot_product_attention` (for tests and
    benchmarks): "dense", "blockwise", "fused", "flex" or None (automatic).

    `options` tune the blockwise path (results do not depend on them):
    `query_block`, `key_block` (tile sizes) and `keep_probabilities`
    (reuse the forward's probabilities in the backward pass, or
    recompute them).

    Inside an exclusive path's scope (the "ring" of
    `keras_attention.distribution.ContextParallel`) only a scope of that
    same path may be opened: another name (None included) would run the
    attention inside it off the ring, on the gathered sequence, and is
    refused (`ValueError`).
    """
    check_implementation(name)
    allowed = path_options()
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(
            f"implementation_scope() options must be among "
            f"{allowed}. Received: {unknown!r}"
        )
    exclusive = exclusive_scope()
    if exclusive is not None and name != exclusive:
        distribution = keras.distribution.distribution()
        where = "" if distribution is None else f" ({distribution!r})"
        raise ValueError(
            f"Inside `implementation_scope({exclusive!r})`{where} every "
            f"attention runs on the {exclusive!r} path: context "
            "parallelism needs ring attention (the sequence is sharded "
            f"across devices), and implementation_scope({name!r}) would run "
            "the attention inside it on one device's kernel, over the "
            "gathered sequence. Open it outside the context-parallel scope, "
            f"or name {exclusive!r}. Received: name={name!r}"
        )
    exclusive = name is not None and PATHS[name].exclusive
    with _scope.forced(name, options, exclusive=exclusive):
        yield


def memory_efficient_implementation():
    """The implementation `dot_product_attention` uses to save memory on
    this machine: "fused" (flash / cuDNN kernels) when the JAX or torch
    backend has a GPU and on torch's CPU (flash kernels that keep only the
    log-sum-exp for the backward pass), else "blockwise"."""
    return "fused" if _backend.prefers_fused_attention() else "blockwise"


def run_path(name, request, **options):
    """Runs `request` on path `name` and applies its learned sinks:
    the output, then the weights if `request.return_weights`, then the
    log-sum-exp if `request.return_lse` (a tuple when more than one)."""
    path = PATHS[name]
    result = path.run(request, **options)
    has_lse = request.return_lse or (
        request.needs_lse and not path.applies_sinks
    )
    if not has_lse and not request.return_weights:
        return result
    result = list(result) if isinstance(result, (tuple, list)) else [result]
    output = result[0]
    weights = result[1] if request.return_weights else None
    lse = result[-1] if has_lse else None
    if request.sink_logits is not None and not path.applies_sinks:
        output, lse, weights = apply_sinks(
            output, lse, request.sink_logits, weights
        )
    results = (output,) + ((weights,) if request.return_weights else ())
    results += (lse,) if request.return_lse else ()
    return results[0] if len(results) == 1 else results


# The choice -----------------------------------------------------------------

# Below this many (query, key) pairs the dense path is as fast (one tile).
BLOCKWISE_MIN_PAIRS = 128 * 256


def choose(request, name=None):
    """The name of the op-level path that runs `request`: `name` (or the
    scope's) when forced, refused with its reason if it cannot run it;
    else the automatic choice (`automatic`)."""
    check_implementation(name)
    if name is None:
        return automatic(request)
    reason = PATHS[name].can_run(request)
    if reason is not None:
        raise ValueError(reason)
    if name == "blockwise" and not request.static_lengths:
        return "dense"  # Tiles need lengths known at trace time.
    return name


def automatic(request, flex_ok=True):
    """The automatic choice: weights: "dense"; "relative_sdpa" where
    `relative_sdpa.prefers_relative_sdpa` (PyTorch on a CPU, inference, a
    relative bias with a wide band mask at long lengths; `flex_ok`);
    "flex" where `flex.prefers_flex` (PyTorch, a score function or a
    sparse mask at long lengths; `flex_ok`); a score function reading a
    tensor that may carry a gradient where the blockwise path cannot
    pass it to its backward pass (`captured.refusal`): "dense"; "fused"
    where the backend prefers it and there is no score function;
    "blockwise" above `BLOCKWISE_MIN_PAIRS` static pairs; else
    "dense"."""
    score_mod = request.score_mod
    if request.needs_weights:
        return "dense"
    if flex_ok and relative_sdpa.prefers_relative_sdpa(request):
        return "relative_sdpa"
    if flex_ok and flex.prefers_flex(request):
        return "flex"
    if captured.refusal(score_mod) is not None:
        return "dense"
    fused_ok = score_mod is None and not request.needs_lse
    if _backend.prefers_fused_attention() and fused_ok:
        return "fused"
    tq, tk = request.query.shape[1], request.key.shape[1]
    if request.static_lengths and tq * tk > BLOCKWISE_MIN_PAIRS:
        return "blockwise"
    return "dense"


def _no_weights(name, request):
    if request.needs_weights:
        return (
            f"implementation={name!r} computes no attention weights: it "
            "cannot return them or apply dropout to them. Received: "
            f"return_weights={request.return_weights!r}, "
            f"dropout_fn={request.dropout_fn!r}"
        )
    return None


# The dense path -------------------------------------------------------------


def _run_dense(request):
    causal, offset = request.causal, request.query_offset
    # Causal alone with offset >= 0: every query sees key 0, no empty row.
    rows_nonempty = (
        causal
        and isinstance(offset, int)
        and offset >= 0
        and request.key_mask is None
        and request.query_mask is None
        and request.mask_mod is None
        and as_4d_mask(request.attention_mask) is None
    )
    mask = dense_mask(
        request.attention_mask,
        request.query,
        request.key,
        causal,
        offset,
        request.key_mask,
        request.query_mask,
    )
    return dense_attention(
        request.query,
        request.key,
        request.value,
        mask,
        request.scale,
        request.dropout_fn,
        request.return_weights,
        rows_nonempty=rows_nonempty,
        score_mod=request.score_mod,
        mask_mod=request.mask_mod,
        query_offset=offset,
        return_lse=request.needs_lse,
    )


# The blockwise path ---------------------------------------------------------

# Blockwise tiles (`blockwise_tiles`): every key in one tile up to this
# length, and scores of at most this many elements per batch element.
MAX_KEY_BLOCK = 8192
TILE_ELEMENTS = 2**21
KEPT_TILE_ELEMENTS = 2**23
MAX_QUERY_BLOCK = 512
SPARSE_KEY_BLOCK = 512


def blockwise_tiles(tq, tk, heads, causal=False, sparse=False):
    """The tile sizes `(query_block, key_block)` of the blockwise path.

    Every key up to `MAX_KEY_BLOCK` in one tile: a row of tiles is then
    one large matmul and one softmax op (no online softmax), the matmuls
    stay efficient and each op has few, large operands. The query tile is
    the largest power of two (64 to 512 rows) that keeps a tile's scores
    at `heads * query_block * key_block` elements per batch element within
    a budget: `KEPT_TILE_ELEMENTS` (32 MiB in float32) when the backward
    pass keeps the probabilities (`blockwise.keeps_probabilities`: short
    sequences, where fewer, larger tiles were faster on an idle machine),
    else `TILE_ELEMENTS` (8 MiB: O(T) memory). A causal call also keeps
    at least four rows of tiles and at most 256 rows per tile (the tiles
    above the diagonal are skipped: smaller tiles skip more). At most 128
    rows of tiles (tracing time: the tiles are unrolled). With a mask
    function (`sparse`), key tiles of at most `SPARSE_KEY_BLOCK` keys, so
    that the tiles it masks entirely can be skipped.
    """
    key_block = min(tk, SPARSE_KEY_BLOCK if sparse else MAX_KEY_BLOCK)
    budget = TILE_ELEMENTS
    if tq is not None and keeps_probabilities(tq * key_block, heads):
        budget = KEPT_TILE_ELEMENTS
    query_block = MAX_QUERY_BLOCK
    if causal and tq is not None:
        while query_block > 64 and (query_block > 256 or 4 * query_block > tq):
            query_block //= 2
    while query_block > 64 and heads * query_block * key_block > budget:
        query_block //= 2
    return max(query_block, -(-tq // 128)), max(key_block, -(-tk // 16))


def _run_blockwise(
    request, query_block=None, key_block=None, keep_probabilities=None
):
    """The blockwise path with `blockwise_tiles`' tile sizes unless given
    (results do not depend on them)."""
    query, key = request.query, request.key
    auto_q, auto_k = blockwise_tiles(
        query.shape[1],
        key.shape[1],
        query.shape[2],
        causal=bool(request.causal),
        sparse=request.mask_mod is not None,
    )
    options = {}
    if keep_probabilities is not None:
        options["keep_probabilities"] = keep_probabilities
    query = ops.multiply(
        query, keras_utils.constant(request.scale, query.dtype)
    )
    return blockwise_attention(
        query,
        key,
        request.value,
        query_block=query_block or auto_q,
        key_block=key_block or auto_k,
        score_mod=request.score_mod,
        mask_mod=request.mask_mod,
        mask=as_4d_mask(request.attention_mask),
        is_causal=request.causal,
        causal_offset=request.query_offset,
        key_padding=request.key_mask,
        query_padding=request.query_mask,
        return_lse=request.return_lse,
        sink_logits=request.sink_logits,
        **options,
    )


def _blockwise_can_run(request):
    # The tensors a plain score function reads are passed to the backward
    # pass explicitly (`captured.split_captured`), where they can be.
    reason = captured.refusal(request.score_mod)
    if reason is not None:
        return reason
    return _no_weights("blockwise", request)


# The fused path -------------------------------------------------------------


def _run_fused(request):
    """The kernel scales (no extra op and gradient); a mask function is
    evaluated into the kernel's mask, except a band (a causal or window
    object: `mask_band`), which cuDNN takes as such on a GPU. The kernels
    return no log-sum-exp (neither `keras.ops.dot_product_attention` nor
    a differentiable one of PyTorch's): when it is needed, a second pass
    computes it (`_lse`), which the automatic choice avoids by not
    choosing "fused" then."""
    mask = as_4d_mask(request.attention_mask)
    band = mask_band(request.mask_mod)  # A causal mask or window object.
    if request.mask_mod is not None and band is None:
        mask = dense_mask(
            mask,
            request.query,
            request.key,
            query_offset=request.query_offset,
            mask_mod=request.mask_mod,
        )
    output = fused_attention(
        request.query,
        request.key,
        request.value,
        scale=request.scale,
        mask=mask,
        is_causal=request.causal,
        causal_offset=request.query_offset,
        key_padding=request.key_mask,
        query_padding=request.query_mask,
        band=band,
    )
    if not request.needs_lse:
        return output
    return output, _lse(request)


def _lse(request):
    """The log-sum-exp alone of `request` (for the fused path): from the
    blockwise path's tiles when the lengths are static (memory O(T)),
    else from the dense scores; differentiable."""
    plain = dataclasses.replace(
        request,
        return_weights=False,
        dropout_fn=None,
        return_lse=True,
        sink_logits=None,
    )
    if plain.static_lengths:
        return _run_blockwise(plain)[-1]
    return _run_dense(plain)[-1]


def _fused_can_run(request):
    if request.score_mod is not None:
        return (
            "implementation='fused' takes no score function (the kernels "
            "have no hook for one): use 'blockwise' or 'dense'. Received: "
            f"score_mod={request.score_mod!r}"
        )
    return _no_weights("fused", request)


# The flex path --------------------------------------------------------------


def _run_flex(request):
    """FlexAttention's kernels (`flex.py`); where `torch.compile` fails on
    them, one warning and the path the automatic choice takes without
    them."""
    try:
        return flex.flex_attention(request)
    except _backend_flex.FlexCompileError as error:
        flex.warn_once(str(error))
    return run_path(automatic(request, flex_ok=False), request)


# The banded and global-local paths ------------------------------------------


def _run_banded(request):
    return local_attention(
        request.query,
        request.key,
        request.value,
        request.window,
        causal=bool(request.causal),
        query_mask=request.query_mask,
        key_mask=request.key_mask,
        attention_mask=request.attention_mask,
        dropout_fn=request.dropout_fn,
        scale=request.scale,
        return_weights=request.return_weights,
        return_lse=request.needs_lse,
    )


def _banded_can_run(request):
    """The banded path runs a plain sliding window: not with score or
    mask functions (the blockwise path skips the tiles outside the window
    then), not when the weights are returned, and only over the queries'
    own sequence."""
    problem = None
    if request.window is None:
        problem = "it needs a sliding window"
    elif request.return_weights:
        problem = "it returns no dense weights"
    elif request.score_mod is not None or request.mask_mod is not None:
        problem = "it takes no score or mask function"
    elif not request.same_sequence:
        tq, tk = request.query.shape[1], request.key.shape[1]
        if tq is None or tq != tk:
            problem = "the keys must be the queries' sequence"
    if problem is None:
        return None
    return (
        f"The banded path cannot run this attention: {problem}. Received: "
        f"window={request.window!r}, "
        f"query.shape={tuple(request.query.shape)!r}, "
        f"key.shape={tuple(request.key.shape)!r}"
    )


def _global_local_can_run(request):
    return (
        "The global-local path needs global tokens (`global_mask`), which "
        "an attention request does not carry: call "
        "`keras_attention.ops.global_local_attention` "
        "(`LocalSelfAttention` with a `global_mask` does)."
    )


register_path(
    AttentionPath(
        "dense", dense_attention, _run_dense, lambda request: None, (), True
    )
)
register_path(
    AttentionPath(
        "blockwise",
        blockwise_attention,
        _run_blockwise,
        _blockwise_can_run,
        ("query_block", "key_block", "keep_probabilities"),
        True,
        applies_sinks=True,
    )
)
register_path(
    AttentionPath(
        "fused", fused_attention, _run_fused, _fused_can_run, (), True
    )
)
register_path(
    AttentionPath("banded", local_attention, _run_banded, _banded_can_run)
)
register_path(
    AttentionPath(
        "flex", flex.flex_attention, _run_flex, flex.can_run, (), True, True
    )
)
register_path(
    AttentionPath(
        "relative_sdpa",
        relative_sdpa.relative_sdpa_attention,
        relative_sdpa.relative_sdpa_attention,
        relative_sdpa.can_run,
    )
)
register_path(
    AttentionPath(
        "global_local",
        global_local_attention,
        None,
        _global_local_can_run,
    )
)
register_path(
    AttentionPath(
        "topk",
        topk_attention,
        None,
        lambda request: (
            "The top-k path needs each query's key indices, which an "
            "attention request does not carry: call "
            "`keras_attention.ops.topk_attention` (`MultiHeadLatentAttention` "
            "with an `indexer` does)."
        ),
    )
)


def default_scale(query):
    """`1 / sqrt(d)` of queries `(b, i, h, d)`."""
    return 1.0 / float(np.sqrt(query.shape[-1]))
