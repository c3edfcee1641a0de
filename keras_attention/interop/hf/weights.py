"""The weight-table walker: a Hugging Face checkpoint's tensors into a
model's weights, by a family's table, written once for every family.

A table is a tuple of rows `(their name, our path, transform)`, or
`(their name, our path, transform, order)`:

- `their name`: a tensor name of the checkpoint; `{i}` stands for the
  layer index (the row then holds for layers `0 .. num_layers - 1`).
  A tuple of names: tensors of one shape read as one, concatenated
  along their first axis (a layer's experts' `gate_proj` and `up_proj`
  into one stacked kernel, Kimi's three `q/k/v_conv1d`). A `OneOf` of
  names: one tensor that checkpoints name in either way, the first the
  checkpoint holds is read;
- `order` (optional): the stored rows in our order, `order[r]` the
  stored row (of the concatenation) that is our row `r`: a fused tensor
  interleaved per head group (Qwen3-Next's `in_proj_qkvz`);
- `our path`: the weight's `path` in our model (`{i}` likewise), or a
  tuple of paths: the tensor is then a fused one (Phi-3's `qkv_proj`,
  `gate_up_proj`), split along its first axis into one piece per path,
  each of the size its transform expects;
- `transform`: a name of `TRANSFORMS`, how the stored tensor becomes
  ours, and what stored shape it expects of our weight's shape:

  - "copy": the same shape (embeddings, norm scales, biases of Dense);
  - "linear": a torch `Linear` weight `(out, in)` to a Keras kernel whose
    first axis is the input `(in, ...)`: transposed, then reshaped
    (`q_proj` to `(hidden, heads, head_dim)`, `gate_proj` to
    `(hidden, intermediate)`, `lm_head` to the reverse embedding);
  - "linear_in2": the same for a kernel whose first two axes are the
    input (`o_proj` to `(heads, head_dim, hidden)`);
  - "flat": a vector reshaped (a projection's bias `(heads * head_dim,)`
    to `(heads, head_dim)`);
  - "norm_plus_one": an RMS norm stored as `scale - 1` (Gemma's
    `x * (1 + w)`) to Keras's `x * scale`.
  - "interleaved_gate_up": gate and up columns interleaved on the last
    axis (gpt-oss's stacked experts' `gate_up_proj` `(experts, hidden,
    2 * intermediate)` and its bias, `[g0, u0, g1, u1, ...]`) to ours,
    gate columns first (`[g..., u...]`), read an expert at a time.
  - "depthwise_conv": a torch depthwise `Conv1d` weight `(channels, 1,
    width)` to `(channels, width)`;
  - "experts_linear": torch `Linear` weights `(out, in)` of each expert,
    stacked along the first axis `(experts * out, in)` (a tuple of
    names), to a kernel `(experts, in, out)`, transposed expert by
    expert;

  or a `Transform(expect, fill)` of the family's own.

Every row's tensor must be in the checkpoint with the expected shape
(`ValueError` naming it and both shapes, before anything is read), and
every weight of the model must get exactly one value; the checkpoint's
tensors that no row reads must be named by the family's `ignored`
patterns (`fnmatch`: recomputed RoPE tables, a tied head stored anyway),
else they are refused too. Tensors are read one at a time, in the order
of the checkpoint's files, in chunks of `CHUNK_BYTES`, each cast to the
weight's dtype and written into the weight in place
(`keras_attention.ops.assign_slice`): loading holds the model's weights
and a chunk, not a whole tensor besides them.
"""

import collections
import fnmatch

import ml_dtypes
import numpy as np

from keras_attention.ops import assign_slice

# Bytes of a stored tensor read (and cast, as float32 at most) at a time:
# a tensor is written into its weight chunk by chunk, in place
# (`keras_attention.ops.assign_slice`), never held whole besides it.
CHUNK_BYTES = 4 * 2**20


def _chunks(rows, row_bytes):
    """`(start, stop)` ranges of at most `CHUNK_BYTES` over `rows`."""
    step = max(1, CHUNK_BYTES // max(1, row_bytes))
    return [(a, min(rows, a + step)) for a in range(0, rows, step)]


def _expected_copy(shape):
    return tuple(shape)


def _expected_linear(shape, inputs=1):
    inner = int(np.prod(shape[:inputs], dtype=np.int64))
    outer = int(np.prod(shape[inputs:], dtype=np.int64))
    return (outer, inner)


def _row_bytes(shape, axis=0):
    """The bytes, as float32 at most, of one index of `shape`'s `axis`."""
    return int(np.prod(shape[axis + 1 :], dtype=np.int64)) * 4


def _fill_copy(read, shape, dtype, plus_one=False):
    """The stored tensor (of `shape`, or of its rows flattened), its rows
    in pieces `(0, start, rows)` of `shape[1:]` and `dtype`; `plus_one`:
    `1 + w` in float32 first."""
    if not shape:  # A scalar: read as one row.
        yield None, 0, read(0, 1).reshape(()).astype(dtype)
        return
    for a, b in _chunks(shape[0], _row_bytes(shape)):
        rows = read(a, b).reshape((b - a,) + tuple(shape[1:]))
        if plus_one:
            rows = rows.astype("float32") + np.float32(1)
        yield 0, a, rows.astype(dtype, copy=False)


def _fill_flat(read, shape, dtype):
    """A stored vector into `shape`, in pieces along its first axis."""
    if not shape:
        yield None, 0, read(0, 1).reshape(()).astype(dtype)
        return
    size = int(np.prod(shape[1:], dtype=np.int64))
    for a, b in _chunks(shape[0], _row_bytes(shape)):
        rows = read(a * size, b * size).astype(dtype, copy=False)
        yield 0, a, rows.reshape((b - a,) + tuple(shape[1:]))


def _fill_linear(read, shape, dtype, inputs=1):
    """A torch `Linear` weight `(out, in)`, read by rows, transposed into a
    Keras kernel of `shape` (its first `inputs` axes the input), in pieces
    along its first output axis `inputs` (the stored rows of a few output
    indices, transposed)."""
    shape = tuple(shape)
    inner = _expected_linear(shape, inputs)[1]
    if len(shape) == inputs:  # No output axis: one stored row.
        yield None, 0, read(0, 1).reshape(shape).astype(dtype)
        return
    size = int(np.prod(shape[inputs + 1 :], dtype=np.int64))
    for a, b in _chunks(shape[inputs], size * inner * 4):
        rows = read(a * size, b * size)  # ((b - a) * size, inner)
        piece = np.ascontiguousarray(rows.T, dtype=dtype)
        piece = piece.reshape(shape[:inputs] + (b - a,) + shape[inputs + 1 :])
        yield inputs, a, piece


def _fill_interleaved_gate_up(read, shape, dtype):
    """Stored rows whose last axis interleaves gate and up columns
    `[g0, u0, g1, u1, ...]` as rows of `shape` whose last axis has the
    gate columns first, `[g..., u...]`, in pieces along the first axis
    (an expert at least)."""
    pairs = tuple(shape[1:-1]) + (shape[-1] // 2, 2)
    for a, b in _chunks(shape[0], _row_bytes(shape)):
        rows = read(a, b).reshape((b - a,) + pairs)
        rows = np.swapaxes(rows, -1, -2).reshape((b - a,) + tuple(shape[1:]))
        yield 0, a, rows.astype(dtype, copy=False)


def _expected_experts(shape):
    outer = int(np.prod(shape[2:], dtype=np.int64))
    return (shape[0] * outer, shape[1])


def _fill_experts_linear(read, shape, dtype):
    """Each expert's torch `Linear` weight `(out, in)` (stacked rows
    `(experts * out, in)`) transposed into a kernel `(experts, in,
    out)`."""
    experts, inner = shape[0], shape[1]
    outer = int(np.prod(shape[2:], dtype=np.int64))
    out = np.empty((experts, inner, outer), dtype)
    for e in range(experts):
        for a, b in _chunks(outer, inner * out.itemsize):
            out[e, :, a:b] = read(e * outer + a, e * outer + b).T
    return out.reshape(shape)


# A family's own transform: `expect(our shape)` -> the stored shape,
# `fill(read, our shape, dtype)` -> our value.
Transform = collections.namedtuple("Transform", ("expect", "fill"))

# name -> (stored shape for our weight's shape, `fill(read, shape, dtype)`
# -> our value: `read(a, b)` gives the stored rows `a .. b - 1`; the value
# is an array of `shape`, or pieces `(axis, start, piece)` written into
# the weight in place, so that only a chunk is held besides the model).
TRANSFORMS = {
    "copy": (_expected_copy, _fill_copy),
    "linear": (_expected_linear, _fill_linear),
    "linear_in2": (
        lambda shape: _expected_linear(shape, 2),
        lambda read, shape, dtype: _fill_linear(read, shape, dtype, 2),
    ),
    "flat": (lambda shape: (int(np.prod(shape, dtype=np.int64)),), _fill_flat),
    "norm_plus_one": (
        _expected_copy,
        lambda read, shape, dtype: _fill_copy(read, shape, dtype, True),
    ),
    "interleaved_gate_up": (_expected_copy, _fill_interleaved_gate_up),
    "depthwise_conv": (
        lambda shape: (shape[0], 1) + tuple(shape[1:]),
        _fill_copy,
    ),
    "experts_linear": (_expected_experts, _fill_experts_linear),
}


def concrete_rows(table, num_layers):
    """The table's rows for layers `0 .. num_layers - 1`: `{their name
    (a tuple of names for tensors read as one): (our paths (a tuple),
    transform, order or None)}`."""
    rows = {}
    for row in table:
        theirs, ours, transform = row[:3]
        order = row[3] if len(row) > 3 else None
        if not isinstance(transform, Transform) and transform not in TRANSFORMS:
            raise ValueError(
                f"Weight table row {theirs!r}: transform {transform!r} is "
                f"not one of {sorted(TRANSFORMS)}."
            )
        paths = (ours,) if isinstance(ours, str) else tuple(ours)
        names = (theirs,) if isinstance(theirs, str) else tuple(theirs)
        layered = any("{i}" in name for name in names)
        for i in range(num_layers) if layered else (None,):
            key = tuple(n if i is None else n.format(i=i) for n in names)
            if isinstance(theirs, OneOf):
                key = (OneOf(key),)
            rows[key[0] if len(key) == 1 else key] = (
                tuple(p if i is None else p.format(i=i) for p in paths),
                transform,
                order,
            )
    return rows


class OneOf(tuple):
    """A row's alternative names of one tensor, the first that the
    checkpoint holds is read (Kimi Linear's dense MLPs: `mlp.` in
    Moonshot's files, `block_sparse_moe.` as transformers saves them)."""


def _sources(key):
    """The tensor names of a row's key (one name, a tuple, or all the
    alternatives of a `OneOf`)."""
    return (key,) if isinstance(key, str) else key


def _resolve(checkpoint, key, expected, paths):
    """The name a `OneOf` key reads (the first the checkpoint holds;
    `ValueError` naming them all when none); other keys as they are."""
    if not isinstance(key, OneOf):
        return key
    for name in key:
        if name in checkpoint:
            return name
    raise ValueError(
        f"The checkpoint has none of the tensors {list(key)!r} (one "
        f"expected of shape {expected!r} for {paths[0]!r})."
    )


def _transform(transform):
    """`(expect, fill)` of a row's transform (a name or a `Transform`)."""
    if isinstance(transform, Transform):
        return transform
    return TRANSFORMS[transform]


def _expected(weights, transform):
    """The stored shape that fills `weights` (one, or the pieces of a
    fused tensor, split along its first axis) by `transform`."""
    expect = _transform(transform)[0]
    pieces = [expect(tuple(w.shape)) for w in weights]
    if len(pieces) == 1:
        return pieces[0]
    return (sum(p[0] for p in pieces),) + tuple(pieces[0][1:])


def _each(shape, count):
    """The shape of each of `count` tensors that make `shape` when
    concatenated along their first axis (None: it does not divide)."""
    if count == 1:
        return tuple(shape)
    if not shape or shape[0] % count:
        return None
    return (shape[0] // count,) + tuple(shape[1:])


def expected_shapes(model, table, num_layers):
    """`{their name: stored shape}` that `table` reads into `model`: the
    checkpoint a family's converter expects (tests and benchmarks write
    random ones with it)."""
    ours = {w.path: w for w in model.weights}
    shapes = {}
    for key, (paths, transform, _) in concrete_rows(table, num_layers).items():
        shape = _expected([ours[p] for p in paths], transform)
        names = key[:1] if isinstance(key, OneOf) else _sources(key)
        shapes.update({name: _each(shape, len(names)) for name in names})
    return shapes


def _check_row(checkpoint, key, paths, expected, order):
    """`ValueError` for a row whose tensors are missing or of another
    shape than `expected` (their concatenation's), or whose `order` is
    not a permutation of its rows."""
    names = _sources(key)
    each = _each(expected, len(names))
    if each is None or (
        order is not None
        and sorted(int(r) for r in order) != list(range(expected[0]))
    ):
        raise ValueError(
            f"Weight table row {key!r}: {len(names)} tensors of one shape "
            f"with rows ordered by {order!r} cannot make {expected!r} (a "
            "converter error)."
        )
    for name in names:
        if name not in checkpoint:
            raise ValueError(
                f"The checkpoint has no tensor {name!r} (expected of shape "
                f"{each!r} for {paths[0]!r})."
            )
        stored = tuple(checkpoint.shape(name))
        if stored != each:
            raise ValueError(
                f"Tensor {name!r} has shape {stored!r} in the checkpoint "
                f"but {each!r} is expected (for {', '.join(paths)})."
            )


def _plan(model, checkpoint, rows, ignored):
    """`[(their name(s), [our weights], transform, order)]` after every
    check."""
    ours = {w.path: w for w in model.weights}
    plan, used = [], {}
    for key, (paths, transform, order) in rows.items():
        missing = [p for p in paths if p not in ours]
        if missing:
            raise ValueError(
                f"The weight table maps {key!r} to {missing!r}, which the "
                f"model {model.name!r} does not have (a converter error)."
            )
        weights = [ours[p] for p in paths]
        expected = _expected(weights, transform)
        key = _resolve(checkpoint, key, expected, paths)
        _check_row(checkpoint, key, paths, expected, order)
        for path in paths:
            if path in used:
                raise ValueError(
                    f"Two tensors map to {path!r}: {used[path]!r} and "
                    f"{key!r} (a converter error)."
                )
            used[path] = key
        plan.append((key, weights, transform, order))
    left = sorted(set(ours) - set(used))
    if left:
        raise ValueError(
            f"No tensor of the weight table fills {left!r} of model "
            f"{model.name!r} (a converter error)."
        )
    read = {name for key in rows for name in _sources(key)}
    unread = [
        name
        for name in checkpoint.names()
        if name not in read
        and not any(fnmatch.fnmatchcase(name, p) for p in ignored)
    ]
    if unread:
        raise ValueError(
            f"The checkpoint has tensors its converter does not read: "
            f"{unread[:10]!r}{' ...' if len(unread) > 10 else ''} (an "
            "unsupported variant of the architecture)."
        )
    position = {name: k for k, name in enumerate(checkpoint.names())}
    return sorted(plan, key=lambda row: position[_sources(row[0])[0]])


def _reader(checkpoint, key, order):
    """`read(a, b)`: rows `a .. b - 1` of the row's tensors concatenated
    along their first axis, our row `r` being their row `order[r]` when
    an `order` is given; read as runs of consecutive stored rows."""
    names = _sources(key)
    if len(names) == 1 and order is None:
        return lambda a, b: checkpoint.read_rows(names[0], a, b)
    each = checkpoint.shape(names[0])[0]

    def read(a, b):
        index = np.arange(a, b) if order is None else np.asarray(order[a:b])
        if not len(index):
            return checkpoint.read_rows(names[0], 0, 0)
        source, row = np.divmod(index, each)
        breaks = np.flatnonzero((np.diff(index) != 1) | (np.diff(source) != 0))
        starts = np.concatenate([[0], breaks + 1])
        stops = np.concatenate([breaks + 1, [len(index)]])
        parts = [
            checkpoint.read_rows(
                names[int(source[s])], int(row[s]), int(row[s] + e - s)
            )
            for s, e in zip(starts, stops)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    return read


def load_weights(model, checkpoint, table, num_layers, ignored=()):
    """Assigns `model`'s weights from `checkpoint` (a
    `keras_attention.interop.checkpoint.Checkpoint`) by `table` (rows
    `(their name(s), our path(s), transform[, order])`, module
    docstring), for layers `0 .. num_layers - 1`; `ignored`: `fnmatch`
    patterns of tensors left unread on purpose. Every check runs before
    the first tensor is read.

    Raises:
        ValueError: a missing tensor or one of another shape (naming it
            and both shapes), a tensor no row reads, a weight no row
            fills.
    """
    rows = concrete_rows(table, num_layers)
    for key, weights, transform, order in _plan(
        model, checkpoint, rows, ignored
    ):
        expect, fill = _transform(transform)
        rows_of = _reader(checkpoint, key, order)
        first = 0
        for weight in weights:  # a fused tensor: one row range each
            count = expect(tuple(weight.shape))[0]

            def read(a, b, first=first):
                return rows_of(first + a, first + b)

            value = fill(read, tuple(weight.shape), _numpy_dtype(weight))
            _write(weight, value)
            del value
            first += count


def _write(weight, value):
    """Writes a transform's value into `weight`: an array of its shape
    (assigned whole), or pieces `(axis, start, piece)`, each written in
    place (`axis` None: the whole value)."""
    if isinstance(value, np.ndarray):
        weight.assign(value)
        return
    for axis, start, piece in value:
        if axis is None:
            weight.assign(piece)
        else:
            assign_slice(weight, piece, start, axis)


def _numpy_dtype(weight):
    """The NumPy dtype of a Keras variable (bfloat16 through
    `ml_dtypes`)."""
    name = weight.dtype
    return np.dtype(getattr(ml_dtypes, name, None) or name)
