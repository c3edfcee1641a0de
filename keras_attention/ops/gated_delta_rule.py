"""`gated_delta_rule`: the gated delta rule of Gated DeltaNet (Yang,
Kautz & Hatamizadeh 2025), the linear-time token mixer of Qwen3-Next
and Qwen 3.5, and its form with a decay per key channel, Kimi delta
attention (Kimi Linear), chunked for training and recurrent for
decoding.

The kernels are in `_gated_delta_kernel.py` (a decay per head, and the
recurrent form of both) and `_channel_delta_kernel.py` (a decay per
key channel); this module checks the arguments and prepares the
tensors.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attention.ops import _channel_delta_kernel
from keras_attention.ops import _gated_delta_kernel as kernel
from keras_attention.ops import _scope
from keras_attention.utils import validation
from keras_attention.utils.keras_utils import constant


def _shape(x):
    return tuple(x.shape)


def _agree(a, b):
    """Whether two dimensions agree (an unknown one agrees with all)."""
    return a is None or b is None or a == b


def _arrays(*values, floatx=False):
    """`values`, the array-likes among them (Python lists: no `shape`)
    as NumPy arrays, as Keras's ops take them; tensors and None as they
    are. Python floats become Keras's float type with `floatx` (the
    sequences, whose dtype is the computation's, as `keras.ops` converts
    them), else float64 (exact until cast to the computation's dtype)."""
    arrays = []
    for x in values:
        if x is not None and not hasattr(x, "shape"):
            x = np.asarray(x)
            if floatx and x.dtype == np.float64:
                x = x.astype(keras.backend.floatx())
        arrays.append(x)
    return arrays


def _check_same(name, got, want, layout):
    ok = len(got) == len(want) and all(_agree(a, b) for a, b in zip(got, want))
    if not ok:
        raise ValueError(
            f"`{name}` must have shape {layout} = {want!r}. "
            f"Received: {name}.shape={got!r}"
        )


def _check_tensors(query, key, value, g, beta):
    """`(key_heads, value_heads)` of well-shaped inputs; `ValueError`
    naming the argument otherwise."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        validation.check_numeric_input(name, x)
        if len(x.shape) != 4 or x.shape[-1] is None:
            raise ValueError(
                f"`{name}` must have shape (batch, T, heads, dim) with a "
                f"known dim. Received: {name}.shape={_shape(x)!r}"
            )
    _check_same("key", _shape(key), _shape(query), "query's shape")
    b, t, hk, _ = _shape(query)
    hv = value.shape[2]
    _check_same("value", _shape(value)[:2], (b, t), "(batch, T) of the query's")
    if hk is not None and hv is not None and hv % hk:
        raise ValueError(
            "`value` must have a multiple of the query/key heads (value "
            f"head `i` reads key head `i // (value_heads // key_heads)`). "
            f"Received: value.shape={_shape(value)!r}, "
            f"query.shape={_shape(query)!r}"
        )
    for name, x in (("g", g), ("beta", beta)):
        validation.check_numeric_input(name, x)
    _check_same("beta", _shape(beta), (b, t, hv), "(batch, T, value_heads)")
    if len(g.shape) == 4:  # a decay per key channel
        want = (b, t, hv, query.shape[3])
        _check_same("g", _shape(g), want, "(batch, T, value_heads, key_dim)")
    else:
        _check_same("g", _shape(g), (b, t, hv), "(batch, T, value_heads)")
    return hk, hv


def _check_options(chunk_size, return_state):
    chunk_size = validation.check_positive_int(
        "chunk_size", chunk_size, allow_none=True
    )
    return chunk_size, validation.check_bool("return_state", return_state)


def _check_state(initial_state, query, value):
    if initial_state is None:
        return
    want = (query.shape[0], value.shape[2], query.shape[3], value.shape[3])
    _check_same(
        "initial_state",
        _shape(initial_state),
        want,
        "(batch, value_heads, key_dim, value_dim)",
    )


def _check_positions(name, x, query, dtype_kind):
    if x is None:
        return
    _check_same(name, _shape(x), _shape(query)[:2], "(batch, T)")
    dtype = keras.backend.standardize_dtype(x.dtype)
    ok = dtype == "bool" if dtype_kind == "bool" else "int" in dtype
    if not ok:
        what = "booleans" if dtype_kind == "bool" else "integers"
        raise TypeError(
            f"`{name}` must hold {what}. Received: {name}.dtype={dtype!r}"
        )


def _document_starts(segment_ids, batch_and_time):
    """`(b, t)` float: 1.0 where a token's segment id differs from the
    previous token's (a packed document starts), else 0.0."""
    if segment_ids is None:
        return ops.zeros(batch_and_time, "float32")
    ids = ops.convert_to_tensor(segment_ids)
    changed = ops.not_equal(ids[:, 1:], ids[:, :-1])
    starts = ops.concatenate([ops.zeros_like(changed[:, :1]), changed], 1)
    return ops.cast(starts, "float32")


def _where(real, x):
    """`x` `(b, h, t, ...)` where `real` `(b, 1, t)` is True, else 0."""
    if len(x.shape) == 4:
        real = real[..., None]
    return ops.where(real, x, ops.zeros_like(x))


def _repeat_heads(x, repeats):
    """`(b, h, t, d)` -> `(b, h * repeats, t, d)`, head `i` from head `i //
    repeats` (`ops.repeat`'s order; a broadcast, whose gradient on
    TensorFlow builds no tensor of rank > 5 as `repeat`'s does)."""
    b, h, t, d = ops.shape(x)
    x = ops.broadcast_to(x[:, :, None], (b, h, repeats, t, d))
    return ops.reshape(x, (b, h * repeats, t, d))


def _heads_first(x, dtype):
    """`(b, t, h, ...)` -> `(b, h, t, ...)` in `dtype`."""
    axes = (0, 2, 1) + tuple(range(3, len(x.shape)))
    return ops.transpose(ops.cast(x, dtype), axes)


def gated_delta_rule(
    query,
    key,
    value,
    g,
    beta,
    chunk_size=64,
    initial_state=None,
    return_state=False,
    segment_ids=None,
    key_mask=None,
):
    """The gated delta rule (Gated DeltaNet), in linear time, with a
    decay per head or per key channel (Kimi delta attention).

    A state `S` of `(key_dim, value_dim)` per head is decayed, corrected
    toward the current value (the delta rule: the value `S^T k_t` the
    state recalls for the key is moved toward `v_t` by the write strength
    `beta_t`) and read by the query:

        S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
        o_t = S_t^T q_t / sqrt(key_dim)

    (the paper's `S_t = S_{t-1} a_t (I - beta_t k_t k_t^T) + beta_t v_t
    k_t^T` with the state transposed, as keras-hub and fla store it).
    With a decay per key channel (`g` of `(batch, T, value_heads,
    key_dim)`: Kimi delta attention, KDA, Kimi Linear's mixer) each row
    `d` of the state decays by its own `exp(g_t[d])` before the delta
    rule's correction:

        S_t = (I - beta_t k_t k_t^T) diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T

    (transformers' `KimiLinearDeltaAttention`, fla's `chunk_kda`).

    `chunk_size` (an int) computes it in chunks (the WY / UT-transform
    form: one lower-triangular solve per chunk, the state carried from
    chunk to chunk by one matrix product), for training and prefill;
    `chunk_size=None` runs the recurrence token by token (decoding one
    step; it keeps every step's state, `O(T key_dim value_dim)` memory).
    Both give the same result (float rounding aside) for every chunk
    size; `T` need not be a multiple of it (padded internally), and a
    static `T` shorter than `chunk_size` is one chunk of `T`.

    Conventions (keras-hub's `Qwen3_5GatedDeltaNet`):
    - the queries are scaled by `1 / sqrt(key_dim)` here; their and the
      keys' L2 normalisation (which the rule needs to be stable, `|k| <=
      1`) is the caller's: `ka.layers.GatedDeltaNet` does it;
    - `g` is the log of the decay (`<= 0`, `exp(g)` in (0, 1]), `beta`
      the write strength in (0, 1); exponentials are only ever taken of
      sums of `g` (`<= 0`), so no decay overflows;
    - the state is `(batch, value_heads, key_dim, value_dim)`;
    - the recurrence runs in float32 (float64 for float64 inputs), the
      state included, whatever the inputs' dtype (bfloat16, float16);
      the outputs have the query's dtype, the state the computation's;
    - the chunked form with a decay per channel keeps a `(chunk_size,
      chunk_size)` matrix of decays per key channel: `O(T chunk_size
      key_dim)` memory per head (16 or 32 are good chunk sizes there).

    Args:
        query: `(batch, T, heads, key_dim)`.
        key: `(batch, T, heads, key_dim)`.
        value: `(batch, T, value_heads, value_dim)`; `value_heads` a
            multiple of `heads` (value head `i` reads query/key head `i //
            (value_heads // heads)`, as Qwen 3.5's repeated heads).
        g: `(batch, T, value_heads)`, log decay (`<= 0`) per head, or
            `(batch, T, value_heads, key_dim)`, one per key channel.
        beta: `(batch, T, value_heads)`, write strength in (0, 1).
        chunk_size: positive int (default 64), the chunk length of the
            chunked form; None: the recurrent form.
        initial_state: optional `(batch, value_heads, key_dim,
            value_dim)` state before the first token (zeros when None),
            e.g. the state a previous call returned.
        return_state: bool, also return the state after the last token.
        segment_ids: optional integer `(batch, T)`: packed documents, a
            run of equal ids being one document; the state is reset to
            zero where the id changes (the initial state belongs to the
            first document), so a packed row gives what its documents
            give one by one.
        key_mask: optional boolean `(batch, T)`, False on padding: a
            padded token neither writes nor decays the state, and its
            output is zero. A row with no real token and no initial
            state gives zeros.

    Returns:
        The outputs `(batch, T, value_heads, value_dim)` in the query's
        dtype; with `return_state`, `(outputs, state)`.

    Example:

    >>> import numpy as np
    >>> from keras_attention.ops import gated_delta_rule
    >>> rng = np.random.default_rng(0)
    >>> q, k = rng.normal(size=(2, 1, 10, 2, 4)).astype("float32")
    >>> k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    >>> v = rng.normal(size=(1, 10, 2, 3)).astype("float32")
    >>> g = -rng.uniform(size=(1, 10, 2)).astype("float32")
    >>> beta = rng.uniform(size=(1, 10, 2)).astype("float32")
    >>> out, state = gated_delta_rule(q, k, v, g, beta, chunk_size=4,
    ...                               return_state=True)
    >>> tuple(out.shape), tuple(state.shape)
    ((1, 10, 2, 3), (1, 2, 4, 3))
    >>> step = gated_delta_rule(q, k, v, g, beta, chunk_size=None)
    >>> bool(np.allclose(out, step, atol=1e-5))
    True

    References:
        - Yang, Kautz & Hatamizadeh, 2025, "Gated Delta Networks:
          Improving Mamba2 with Delta Rule" (ICLR 2025, arXiv
          2412.06464).
        - Yang et al., 2024, "Parallelizing Linear Transformers with the
          Delta Rule over Sequence Length" (NeurIPS 2024, arXiv
          2406.06484): the chunked WY / UT-transform form.
    """
    _scope.refuse_in_exclusive_scope(
        "`gated_delta_rule`", "its kernel is its own"
    )
    query, key, value = _arrays(query, key, value, floatx=True)
    g, beta, initial_state, segment_ids, key_mask = _arrays(
        g, beta, initial_state, segment_ids, key_mask
    )
    hk, hv = _check_tensors(query, key, value, g, beta)
    chunk_size, return_state = _check_options(chunk_size, return_state)
    _check_state(initial_state, query, value)
    q, k, v, g_, beta_, start = _prepare(
        query, key, value, g, beta, segment_ids, key_mask
    )
    if initial_state is None:
        shape = ops.shape(v)
        state = ops.zeros((shape[0], hv, k.shape[-1], v.shape[-1]), q.dtype)
    else:
        state = ops.cast(initial_state, q.dtype)
    if chunk_size is None:
        out, state = kernel.recurrent(q, k, v, g_, beta_, start, state)
    else:
        t = query.shape[1]
        if t is not None and t > 0:
            chunk_size = min(chunk_size, t)
        chunked = kernel.chunked
        if len(g.shape) == 4:
            chunked = _channel_delta_kernel.chunked
        out, state = chunked(
            q, k, v, g_, beta_, start, state, chunk_size=chunk_size
        )
    out = ops.transpose(out, (0, 2, 1, 3))
    if key_mask is not None:
        real = ops.convert_to_tensor(key_mask)[:, :, None, None]
        out = ops.where(real, out, ops.zeros_like(out))
    out = ops.cast(out, query.dtype)
    return (out, state) if return_state else out


def _prepare(query, key, value, g, beta, segment_ids, key_mask):
    """The kernels' inputs: `(q, k, v, g, beta, start)` heads first in
    the compute dtype (float32, float64 for float64 inputs), the queries
    scaled, query/key heads repeated to the value heads, padded tokens
    zeroed (`g = beta = 0`: no decay, no write), `start` the document
    starts `(b, t)`. `value` may be None (`v` is then None)."""
    _check_positions("segment_ids", segment_ids, query, "int")
    _check_positions("key_mask", key_mask, query, "bool")
    tensors = [x for x in (query, key, value) if x is not None]
    dtypes = {keras.backend.standardize_dtype(x.dtype) for x in tensors}
    dtype = "float64" if "float64" in dtypes else "float32"
    scale = 1.0 / math.sqrt(query.shape[-1])
    q = _heads_first(query, dtype) * constant(scale, dtype)
    k = _heads_first(key, dtype)
    hk, hv = query.shape[2], g.shape[2]
    if hk != hv:
        q, k = _repeat_heads(q, hv // hk), _repeat_heads(k, hv // hk)
    v = None if value is None else _heads_first(value, dtype)
    g, beta = _heads_first(g, dtype), _heads_first(beta, dtype)
    if key_mask is not None:
        # Padded tokens: no decay (g = 0), no write (beta = 0), and zero
        # vectors (a NaN there must not reach the state through 0 * NaN).
        real = ops.convert_to_tensor(key_mask)[:, None, :]
        q, k, g, beta = (_where(real, x) for x in (q, k, g, beta))
        v = None if v is None else _where(real, v)
    shape = ops.shape(query)
    start = _document_starts(segment_ids, (shape[0], shape[1]))
    return q, k, v, g, beta, ops.cast(start, dtype)


def implied_attention(query, key, g, beta, segment_ids=None, key_mask=None):
    """The attention matrix `W` `(batch, value_heads, T, T)` the gated
    delta rule applies to the values from a zero state: `gated_delta_rule(
    query, key, value, g, beta, ...) = W v` for every `value` (the rule
    is linear in the values; `W` lower triangular, zero on padded rows
    and columns). `O(T^2)` memory: for short sequences (the explorer's).
    Arguments as `gated_delta_rule`'s (`g` per head or per key channel);
    float32 (float64 in float64)."""
    query, key = _arrays(query, key, floatx=True)
    g, beta, segment_ids, key_mask = _arrays(g, beta, segment_ids, key_mask)
    q, k, _, g, beta, start = _prepare(
        query, key, None, g, beta, segment_ids, key_mask
    )
    implied = kernel.implied_attention
    if len(g.shape) == 4:  # a decay per key channel
        implied = _channel_delta_kernel.implied_attention
    weights = implied(q, k, g, beta, start)
    if key_mask is not None:
        real = ops.convert_to_tensor(key_mask)[:, None, :, None]
        weights = ops.where(real, weights, ops.zeros_like(weights))
    return weights
