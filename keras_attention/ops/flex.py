"""The flex path: PyTorch's FlexAttention kernels
(`torch.nn.attention.flex_attention`, compiled by `torch.compile`: C++
through inductor on a CPU, Triton on CUDA) run the package's score and
mask functions fused, with block sparsity.

What this module does (the torch calls themselves, the compiled kernel
and the block-mask cache are in `_backend_flex.py`):

- every mask source of a call (a `mask_mod`, `causal`, an attention
  mask, key and query padding) becomes one mask function on the kernel's
  indices (`_KernelMask`), and a block mask built from it once per shape
  and mask (bound tensors, such as segment ids, included: their values
  are part of the cache key) and kept: the kernel skips the blocks it
  masks entirely and evaluates the function only on partial ones, as
  arithmetic on the indices for bands, documents (the ids compared) and
  padding, as a table of the mask's entries otherwise;
- a score object becomes the kernel's `score_mod`: a relative bias
  (`relative_bias`: ALiBi, T5's buckets) one table lookup, or arithmetic
  when it is linear in the distance (causal ALiBi), soft-capping
  (`tanh_soft_cap`) one `tanh`, any other score function called on the
  kernel's scalars (absolute positions, float32 scores);
- learned sinks are one more key (index `T_k`) whose score is the sink's
  logit and whose value is zero: exact, and without the log-sum-exp the
  CPU kernels do not return;
- the package's rules hold: a row with nothing to attend to gives zeros
  (the kernel's own rule; `-inf` scores count as masked), float16 and
  bfloat16 scores are float32 in the kernels, float64 is refused (the
  kernels compute float32 at most: the other paths keep float64).

On a CPU FlexAttention has no backward pass and returns no log-sum-exp
(torch 2.13): the path runs there only for calls that need no gradient
(`torch.no_grad()`, `model.predict`, generation, or inputs and weights
that require none) and no `return_lse`. On CUDA it has both.

The automatic choice (`prefers_flex`) takes it for a score function, or
for a mask whose blocks are at most `FLEX_MAX_DENSITY` visited, from
`FLEX_MIN_LENGTH` queries and keys: plain causal attention and padding
keep PyTorch's SDPA kernels (the fused path), which are faster there.
A kernel is compiled per shape, dtype and score/mask function at its
first call (seconds on a CPU) and reused after.

Axes: b - batch, i/j - query/key positions, h - query heads, g -
key/value heads, d/e - key/value head dims.
"""

import functools
import hashlib
import types
import warnings
import weakref

import keras
import numpy as np
from keras import ops

from keras_attention.ops import _backend_flex
from keras_attention.ops import captured
from keras_attention.ops import fused
from keras_attention.ops import scoring

# The automatic choice takes the flex path from this many queries and
# keys: below, a compilation per shape (~5 s on a CPU) costs more than it
# saves, and decoding steps of one query stay on SDPA. Measured (rough:
# torch 2.13, 1 thread, CPU time, loaded 2-core machine; causal documents
# and soft-capping against the path taken without flex): once compiled,
# flex is faster from T = 256 (documents 0.89x, soft-cap 0.47x), saving
# per call 0.2-2.4 ms at 256, 1.4-1.8 at 512, 2.8-8.7 at 1,024: from
# 1,024 a compilation pays for itself in ~600-1,800 calls of a shape.
# `KERAS_BACKEND=torch python benchmarks/programmable_attention.py
# --tables thresholds`.
FLEX_MIN_LENGTH = 1024
# ... and, for a mask without a score function, when at most this share
# of the blocks is visited (SDPA's dense-mask kernel visits them all,
# about twice as fast per block as FlexAttention's on a CPU).
FLEX_MAX_DENSITY = 0.5
# The kernel gets contiguous copies of the (b, h, T, d) views of our
# (b, T, h, d) query and keys, the views of the values (`kernel_copies`).
# It reads those views strided, slower: rough (torch 2.13, 1 thread, CPU
# time, loaded machine; T = 2,048, kernel time on the views less on
# contiguous tensors, x a copy's time): the queries 3.4x (documents, 1.5
# key blocks a query block) and 3.3x (window 512, 4.4), the keys 1.6x
# (each key block visited by 1.5 query blocks) and 5x (4.4), the values
# none measurable. So the query is always copied, the values never.
# A key copy pays where each key block is read more than this many times.
FLEX_COPY_MIN_KEY_READS = 1.0


class _KernelMask:
    """Every mask source of a call as one `mask(batch, head, q_idx,
    kv_idx)` on the kernel's indices (queries from 0; the sink's key at
    `kv_len`): elementwise, so it runs on the kernel's scalars and on our
    broadcast grids (the block mask's evaluation) alike."""

    def __init__(self, request, offset, kv_len, sink):
        self.mask_mod, self.causal = request.mask_mod, request.causal
        self.q_len = request.query.shape[1]
        self.offset, self.kv_len, self.sink = offset, kv_len, sink
        self.attention_mask = _tensor(request.attention_mask, "bool")
        self.key_mask = _tensor(request.key_mask, "bool")
        self.query_mask = _tensor(request.query_mask, "bool")

    @property
    def masks(self):
        """Whether anything masks (else the kernel needs no block mask)."""
        return any(
            x is not None and x is not False
            for x in (
                self.mask_mod,
                self.causal,
                self.attention_mask,
                self.key_mask,
                self.query_mask,
            )
        )

    def fingerprint(self):
        """What the mask depends on, for the block-mask cache."""
        return (
            _fingerprint(self.mask_mod),
            bool(self.causal),
            self.offset,
            self.kv_len,
            self.sink,
            _fingerprint(self.attention_mask),
            _fingerprint(self.key_mask),
            _fingerprint(self.query_mask),
        )

    def __call__(self, batch, head, q_idx, kv_idx):
        position = q_idx + self.offset
        kv = ops.minimum(kv_idx, self.kv_len - 1)  # The sink's key: clipped.
        out = []
        if self.mask_mod is not None:
            out.append(self.mask_mod(batch, head, position, kv))
        if self.causal:
            out.append(scoring.causal(position, kv))
        if self.attention_mask is not None:
            m = self.attention_mask
            out.append(
                m[
                    batch * int(m.shape[0] > 1),
                    head * int(m.shape[1] > 1),
                    q_idx * int(m.shape[2] > 1),
                    kv * int(m.shape[3] > 1),
                ]
            )
        if self.key_mask is not None:
            out.append(self.key_mask[batch, kv])
        if self.query_mask is not None:
            out.append(self.query_mask[batch, q_idx])
        result = functools.reduce(lambda a, b: a & b, out)
        if self.sink:
            result = result | (kv_idx == self.kv_len)
        return result

    def parts(self):
        """`(band, ids)` when the whole mask is arithmetic on the indices
        with no mask tensor but padding: `band` `(left, right)`, keys
        `position - left <= kv <= position + right` (None: unbounded
        there; causal masks, sliding windows, their intersection:
        `mask_band`), `ids` the segment ids of its document masks
        (`document_ids()`), parts of an `and_parts()`; else None."""
        if self.attention_mask is not None:
            return None
        left, right, ids = None, None, []
        parts = [] if self.mask_mod is None else _conjuncts(self.mask_mod)
        if self.causal:
            parts.append(None)
        for part in parts:
            bounds = (None, 0) if part is None else fused.mask_band(part)
            documents = _document_ids(part) if bounds is None else None
            if bounds is None and documents is None:
                return None
            if documents is not None:
                ids.append(_tensor(documents, "int32"))
                continue
            left, right = (
                a if b is None else b if a is None else min(a, b)
                for a, b in zip((left, right), bounds)
            )
        return (left, right), ids

    def kernel(self):
        """The kernel's `mask_mod` as arithmetic on the indices when the
        mask is so (`parts`: bands, documents, padding), else None (the
        table). No table reads: the kernels compute it right and faster
        (1.6x at 8k for a window of 512), and the ids and padding are
        read by plain indexing (inductor computed `index_select`, Keras's
        `ops.take`, wrongly in a `mask_mod`)."""
        parts = self.parts()
        if parts is None:
            return None
        (left, right), ids = parts
        offset, kv_len, sink = self.offset, self.kv_len, self.sink
        q_len = self.q_len
        key_mask, query_mask = self.key_mask, self.query_mask

        def clipped(x, low, high, last):  # Only where it may be needed.
            return x if 0 <= low and high <= last else ops.clip(x, 0, last)

        def arithmetic_mask(batch, head, q_idx, kv_idx):
            # No operation that does nothing (an offset of 0, row 0 of
            # one example's ids): the kernel computes each on its
            # partial blocks.
            position = q_idx + offset if offset else q_idx
            terms = []
            if left is not None:
                terms.append(kv_idx >= position - left)
            if right is not None:
                terms.append(
                    kv_idx <= (position + right if right else position)
                )
            for table in ids:
                row = batch if table.shape[0] > 1 else 0
                last = table.shape[1] - 1
                q = clipped(position, offset, offset + q_len - 1, last)
                kv = clipped(kv_idx, 0, kv_len - 1 + int(sink), last)
                terms.append(table[row, q] == table[row, kv])
            if key_mask is not None:
                terms.append(key_mask[batch, ops.minimum(kv_idx, kv_len - 1)])
            if query_mask is not None:
                terms.append(query_mask[batch, q_idx])
            out = functools.reduce(lambda a, b: a & b, terms or [kv_idx >= 0])
            if sink:
                out = out | (kv_idx == kv_len)
            return out

        return arithmetic_mask

    def evaluate(self, batch, heads, q_start, q_stop, kv_len):
        """The mask of queries `q_start:q_stop` over every key, bool
        `(b|1, h|1, rows, kv_len)` (our grid of the kernel's indices)."""
        grid = scoring.Grid.dense(
            batch, heads, q_stop - q_start, kv_len, q_offset=q_start
        )
        m = scoring.evaluate_mask(self, grid)
        return ops.broadcast_to(
            m, (m.shape[0], m.shape[1], q_stop - q_start, kv_len)
        )


class _KernelScore:
    """The kernel's `score_mod`: the score object through its fast path
    when it has one, and the sink's logit on the sink's key."""

    def __init__(self, request, offset, kv_len, q_len):
        self.offset, self.kv_len = offset, kv_len
        self.score_mod, self.table, self.cap = request.score_mod, None, None
        self.slope = None
        relative = scoring.split_relative_bias(request.score_mod)
        cap = scoring.split_soft_cap(request.score_mod)
        if relative is not None:
            # Distances `q - kv` from `offset - (kv_len - 1)` up.
            _, params = scoring.split_score_mod(request.score_mod)
            low = offset - (kv_len - 1)
            distance = ops.arange(low, offset + q_len, dtype="int32")
            self.table = ops.cast(relative(params, distance), "float32")
            self.slope = _linear_slope(self.table, distance)
        elif cap is not None:
            self.cap = cap
        self.sinks = _tensor(request.sink_logits, "float32")

    def __call__(self, score, batch, head, q_idx, kv_idx):
        kv = kv_idx  # The sink's key: clipped.
        if self.sinks is not None:
            kv = ops.minimum(kv_idx, self.kv_len - 1)
        if self.slope is not None:  # A bias linear in the distance.
            slope = self.slope[head * int(self.slope.shape[0] > 1)]
            distance = ops.cast(q_idx + self.offset - kv, "float32")
            score = score + slope * distance
        elif self.table is not None:
            table = self.table
            row = head * int(table.shape[0] > 1)
            score = score + table[row, q_idx - kv + (self.kv_len - 1)]
        elif self.cap is not None:
            score = self.cap * ops.tanh(score / self.cap)
        elif self.score_mod is not None:
            position = q_idx + self.offset
            score = self.score_mod(score, batch, head, position, kv)
            score = ops.cast(score, "float32")
        if self.sinks is None:
            return score
        return ops.where(kv_idx == self.kv_len, self.sinks[head], score)


def _linear_slope(table, distance):
    """The slope per head `(heads | 1,)` of a relative bias `table` that
    is exactly `slope * distance` at every distance (ALiBi's causal
    form: the kernel then computes it, no table reads), else None.
    Checked in NumPy (float32, as the kernel's product): one copy of the
    table rather than a Keras op each step, on every call."""
    table_np = ops.convert_to_numpy(table)
    distance = ops.convert_to_numpy(distance).astype("float32")
    one = distance == 1.0
    if not one.any():
        return None
    slope = table_np[:, int(one.argmax())]
    if not np.array_equal(table_np, slope[:, None] * distance[None, :]):
        return None
    # Its own tensor: a view of the table traced into the kernel is a
    # buffer inductor's CPU lowering refuses.
    return ops.convert_to_tensor(slope.copy())


def _conjuncts(mask_mod):
    """The masks `mask_mod` is the logical and of (its `and_parts()`,
    flattened, when the class defining them defines `__call__` too), else
    `[mask_mod]`."""
    method = scoring.declared_method(mask_mod, "and_parts")
    if method is None:
        return [mask_mod]
    return [p for part in method() for p in _conjuncts(part)]


def _document_ids(mask_mod):
    """The segment ids of a document mask (`document_ids()`: the mask is
    `ids[b, q] == ids[b, kv]`), else None."""
    method = scoring.declared_method(mask_mod, "document_ids")
    return None if method is None else method()


def _tensor(x, dtype):
    if x is None:
        return None
    return ops.cast(ops.convert_to_tensor(x), dtype)


def query_offset(request):
    """The query offset as a Python int (a tensor's value: the block mask
    and the relative-bias table depend on it)."""
    offset = request.query_offset
    if isinstance(offset, int):
        return offset
    return int(ops.convert_to_numpy(offset))


_WARNED = set()


def warn_once(reason):
    """One `UserWarning` per distinct `reason` that FlexAttention could
    not run a call (another path runs it instead)."""
    if reason in _WARNED:
        return
    _WARNED.add(reason)
    warnings.warn(
        "keras_attention: score and mask functions run on another "
        f"attention path, not in FlexAttention's kernels: {reason}.",
        UserWarning,
        stacklevel=4,
    )


# Tensors of at most this many bytes are their own digest (their bytes:
# faster to hash than a hash to compute, and exact); larger ones a hash.
FLEX_DIGEST_RAW_BYTES = 1 << 16


def tensor_digest(x):
    """A digest of a tensor's dtype, shape and values (block-mask cache
    keys: the tensors a mask function reads, such as segment ids)."""
    array = x if isinstance(x, np.ndarray) else _backend_flex.host_array(x)
    if array is None:
        array = ops.convert_to_numpy(x)
    values = array.tobytes()  # C order, whatever the strides.
    if len(values) > FLEX_DIGEST_RAW_BYTES:
        values = hashlib.blake2b(values, digest_size=16).digest()
    return (array.dtype, array.shape, values)


class _Identity:
    """A cache-key part compared by identity (it keeps `obj` alive, so
    its id cannot be reused by another object while the key exists)."""

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.obj is self.obj


_PLAIN = (str, bytes, int, float, bool, complex, type(None), type)
_PLAIN_TYPES = frozenset(_PLAIN)


def _fingerprint(obj, depth=0):
    """A hashable summary of what a mask function computes: its code, the
    values it reads (closure cells, defaults, attributes, partial
    arguments, the globals its code names) and the contents of the
    tensors among them (`tensor_digest`); what it cannot look
    into, by identity."""
    kind = type(obj)
    if kind in _PLAIN_TYPES:  # The common kinds first: one test each.
        return obj
    if kind is tuple or kind is list:
        if depth > 6:
            return _Identity(obj)
        return (kind.__name__,) + tuple(_fingerprint(x, depth + 1) for x in obj)
    if isinstance(obj, _PLAIN) or isinstance(obj, np.generic):
        return obj
    if isinstance(obj, (np.ndarray, keras.Variable)) or ops.is_tensor(obj):
        return ("tensor", tensor_digest(obj))
    if depth > 6 or isinstance(obj, (keras.layers.Layer, types.ModuleType)):
        return _Identity(obj)
    deeper = functools.partial(_fingerprint, depth=depth + 1)
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__,) + tuple(map(deeper, obj))
    if isinstance(obj, dict):
        return ("dict",) + tuple((k, deeper(v)) for k, v in obj.items())
    if isinstance(obj, functools.partial):
        return ("partial", deeper(obj.func), deeper(obj.args))
    if isinstance(obj, types.MethodType):
        return ("method", deeper(obj.__func__), deeper(obj.__self__))
    if isinstance(obj, types.FunctionType):
        cells = tuple(c.cell_contents for c in obj.__closure__ or ())
        names = obj.__code__.co_names
        scope = {n: obj.__globals__[n] for n in names if n in obj.__globals__}
        scope = {n: v for n, v in scope.items() if not callable(v)}
        return (obj.__code__, deeper(cells), deeper(obj.__defaults__)) + (
            deeper(scope),
        )
    if hasattr(obj, "__dict__"):
        return (type(obj), deeper(dict(vars(obj))))
    return _Identity(obj)


def _reads_gradient(request):
    """Whether the call is recorded for a gradient: under
    `torch.is_grad_enabled()`, an input, a score layer's weight or a
    tensor a plain score function reads requires one."""
    if not _backend_flex.flex_grad_enabled():  # Inference: nothing to walk.
        return False
    tensors = [request.query, request.key, request.value]
    tensors.append(request.sink_logits)
    score_mod = request.score_mod
    if isinstance(score_mod, scoring.AtPositions):
        score_mod = score_mod.fn
    tensors += list(getattr(score_mod, "trainable_variables", ()) or ())
    reads = not isinstance(score_mod, keras.layers.Layer) and (
        captured.closes_over_tensors(score_mod)
    )
    return _backend_flex.flex_needs_gradient(tensors, reads)


def can_run(request):
    """None when the flex path can run `request`, else the reason."""
    return _cannot_run(request, _backend_flex.flex_unavailable())


def _cannot_run(request, reason):
    """`can_run` when FlexAttention is unavailable here for `reason`
    (None: it is)."""
    dtype = keras.backend.standardize_dtype(request.query.dtype)
    dtypes = {x.dtype for x in (request.query, request.key, request.value)}
    if len(dtypes) > 1:  # The same dtype in other containers: one name.
        dtypes = {keras.backend.standardize_dtype(x) for x in dtypes}
    if reason is None and request.needs_weights:
        reason = (
            "it computes no attention weights: it cannot return them or "
            "apply dropout to them"
        )
    elif reason is None and dtype == "float64":
        reason = (
            "FlexAttention's kernels compute in float32 at most, and "
            "float64 stays float64 (the 'dense' and 'blockwise' paths)"
        )
    elif reason is None and len(dtypes) > 1:
        reason = "the query, key and value must share one dtype"
    elif reason is None and request.window is not None:
        reason = "it takes a sliding window as a mask function"
    elif reason is None and not request.static_lengths:
        reason = "it needs the lengths when called"
    elif reason is None:
        on_gpu, version = _backend_flex.flex_on_gpu(request.query)
        reason = None if on_gpu else _cpu_refusal(request, version)
    if reason is None:
        return None
    return (
        f"implementation='flex' cannot run this attention: {reason}. "
        f"Received: query.dtype={dtype!r}, "
        f"query.shape={tuple(request.query.shape)!r}, "
        f"return_lse={request.return_lse!r}, "
        f"return_weights={request.return_weights!r}"
    )


def _cpu_refusal(request, version):
    """What FlexAttention's CPU kernels (torch `version`) cannot do for
    `request`."""
    if request.return_lse:
        return (
            f"FlexAttention's CPU kernels return no log-sum-exp (torch "
            f"{version}); it does on CUDA"
        )
    if _reads_gradient(request):
        return (
            f"FlexAttention has no backward pass on a CPU (torch {version})"
            ", and this call is recorded for a gradient (an input or weight "
            "requires grad under `torch.is_grad_enabled()`): run inference "
            "under `torch.no_grad()`, or train on CUDA"
        )
    return None


# The block mask the automatic choice (`prefers_flex`) found for a
# request, taken by the call that follows (`flex_attention`): one lookup
# a call (its cache key hashes the bound tensors' contents).
_CHOSEN = {}  # "entry": (weakref to the request, offset, sink, result)


def _block_mask(request, offset, sink, chosen=False):
    """The call's block mask (None when nothing masks) and the share of
    its blocks the kernel visits, from `_backend_flex`'s cache; with
    `chosen`, the one `prefers_flex` just found for `request`."""
    entry = _CHOSEN.pop("entry", None)  # One read: threads may race.
    if chosen and entry is not None and entry[0]() is request:
        if entry[1:3] == (offset, sink):
            return entry[3]
    query, kv_len = request.query, request.key.shape[1]
    mask = _KernelMask(request, offset, kv_len, sink)
    result = None, 1.0
    if mask.masks:
        b, h, q_len = query.shape[0], query.shape[2], query.shape[1]
        total = kv_len + int(sink)
        result = _backend_flex.flex_block_mask(
            lambda start, stop: mask.evaluate(b, h, start, stop, total),
            (b, h, mask.fingerprint()),
            (q_len, total),
            query,
            mask_mod=mask.kernel,
        )
    return result


def prefers_flex(request):
    """Whether the automatic choice takes the flex path for `request`: on
    PyTorch, with a score or mask function, at least `FLEX_MIN_LENGTH`
    queries and keys, when the path can run it (`can_run`) and, for a
    mask alone that SDPA could run, when at most `FLEX_MAX_DENSITY` of
    its blocks are visited. Where FlexAttention cannot be compiled, one
    warning says so (`warn_once`)."""
    if keras.backend.backend() != "torch":
        return False
    if request.score_mod is None and request.mask_mod is None:
        return False
    if not request.static_lengths:
        return False
    if min(request.query.shape[1], request.key.shape[1]) < FLEX_MIN_LENGTH:
        return False
    unavailable = _backend_flex.flex_unavailable()
    if unavailable is not None:
        warn_once(unavailable)
        return False
    if _cannot_run(request, unavailable) is not None:
        return False
    if request.score_mod is not None or request.needs_lse:
        return True  # The other paths run it op by op.
    sink, offset = request.sink_logits is not None, query_offset(request)
    result = _block_mask(request, offset, sink)
    _CHOSEN["entry"] = (weakref.ref(request), offset, sink, result)
    return result[1] <= FLEX_MAX_DENSITY


def flex_attention(request):
    """Runs `request` (an `AttentionRequest` the path can run: `can_run`)
    in FlexAttention's kernels: the output `(b, i, h, e)`, then the
    log-sum-exp `(b, h, i)` (float32) when `request.return_lse`; learned
    sinks applied. `_backend_flex.FlexCompileError` when the kernel cannot
    be compiled (the table then runs another path)."""
    query, key, value = request.query, request.key, request.value
    q_len, kv_len = query.shape[1], key.shape[1]
    offset = query_offset(request)
    sink = request.sink_logits is not None
    block_mask, density = _block_mask(request, offset, sink, chosen=True)
    trivial = request.score_mod is None and not sink
    score = None if trivial else _KernelScore(request, offset, kv_len, q_len)
    if sink:  # The sink's key: zero key and value, its logit as score.
        pad = [[0, 0], [0, 1], [0, 0], [0, 0]]
        key, value = ops.pad(key, pad), ops.pad(value, pad)
    return _backend_flex.flex_attention(
        query,
        key,
        value,
        score,
        block_mask,
        float(request.scale),
        bool(request.return_lse),
        kernel_copies(
            density,
            q_len,
            query.shape[2] // key.shape[2],
            None if block_mask is None else block_mask.BLOCK_SIZE[0],
        ),
    )


def kernel_copies(density, q_len, groups=1, block=None):
    """Whether the kernel gets contiguous copies of the query, key and
    value (else their views), for a block mask visiting `density` of its
    blocks of `block` queries (`_backend_flex.FLEX_BLOCK` by default) and
    `groups` query heads a key head: the query always, the
    keys where each of their blocks is visited by more than
    `FLEX_COPY_MIN_KEY_READS` query blocks (then the copy costs less than
    reading them strided), the values never."""
    block = block or _backend_flex.FLEX_BLOCK
    reads = density * -(-q_len // block) * groups
    return True, reads > FLEX_COPY_MIN_KEY_READS, False
