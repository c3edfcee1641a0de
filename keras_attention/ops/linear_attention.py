"""Linear attention (Katharopoulos et al. 2020), with RetNet's retention
and gated linear attention's decays: `linear_attention`.

Softmax attention `softmax(q k^T) v` costs `O(T^2)`. With a feature map
`phi` in place of the exponential, the keys and values fold into a
state of fixed size that grows by one outer product per step:

    S_t = exp(a_t) S_{t-1} + phi(k_t) v_t^T          (key_dim, value_dim)
    o_t = phi(q_t)^T S_t / sqrt(key_dim)

so a sequence costs `O(T)` time and a decoding step `O(1)`, whatever
the length. `a_t <= 0` is the log of the decay: none (`a_t = 0`, plain
linear attention), one per head (RetNet's retention, `exp(a) = gamma_h`)
or one per head and step (gated linear attention, a gate computed from
the input). Unrolled, `o_i = sum_{j <= i} exp(a_{j+1} + ... + a_i)
phi(q_i) . phi(k_j) v_j / sqrt(key_dim)`: attention with the weights
`w_ij = exp(sum_{j < s <= i} a_s) phi(q_i) . phi(k_j) / sqrt(key_dim)`.

Normalised form (`normalize=True`, Katharopoulos et al.'s): a second
state `z_t = exp(a_t) z_{t-1} + phi(k_t)` divides the output,

    o_t = phi(q_t)^T S_t / phi(q_t)^T z_t,

so the weights of a row sum to 1 as a softmax's do (0 where the
denominator is 0: a query with no key). The unnormalised form is the
default: RetNet, gated linear attention, flash-linear-attention and
Qwen3-Next use it with a normalisation layer on the output, because
the denominator can come close to 0 and its gradients grow without
bound (Qin et al. 2022); `keras_attention.layers.LinearAttention` adds
that norm.

Two forms give the same result (up to float rounding): the recurrent
one above, a loop over the steps (decoding, `chunk_size=None`), and the
chunked one (training): the sequence is cut into chunks of
`chunk_size` steps; inside a chunk, attention is the masked, decayed
quadratic form; between chunks, the state is carried by a scan over the
chunks. Decays enter only as differences of cumulative log decays
inside a chunk, each `<= 0`, masked before `exp`: no overflow however
strong the decay or long the sequence (`_linear_attention_kernel.py`).
"""

import math

import keras
import numpy as np
from keras import ops

from keras_attention.ops import _linear_attention_kernel as kernel
from keras_attention.ops import _scope
from keras_attention.ops.scoring import softmax_dtype
from keras_attention.utils import attention_checks
from keras_attention.utils import validation
from keras_attention.utils.keras_utils import constant

FEATURE_MAPS = {
    "elu_plus_one": lambda x: ops.elu(x) + 1.0,
    "relu": ops.relu,
    "identity": lambda x: x,
}


def _shape(x):
    return tuple(x.shape)


def _check_inputs(query, key, value):
    for name, x in (("query", query), ("key", key), ("value", value)):
        validation.check_numeric_input(name, x)
        if len(x.shape) != 4:
            raise ValueError(
                f"`{name}` must have shape (batch, T, heads, dim). "
                f"Received: {name}.shape={_shape(x)!r}"
            )

    def differ(a, b):
        return a is not None and b is not None and a != b

    q, k, v = _shape(query), _shape(key), _shape(value)
    if any(differ(a, b) for a, b in zip(q, k)) or any(
        differ(a, b) for a, b in zip(q[:3], v[:3])
    ):
        raise ValueError(
            "`query` and `key` must have the same shape (batch, T, heads, "
            "key_dim), and `value` the same (batch, T, heads). Received: "
            f"query.shape={q!r}, key.shape={k!r}, value.shape={v!r}"
        )
    if q[-1] is None or v[-1] is None:
        raise ValueError(
            "`query` and `value` must have a known last axis (key_dim, "
            f"value_dim). Received: query.shape={q!r}, value.shape={v!r}"
        )


def _check_feature_map(feature_map, normalize):
    if callable(feature_map):
        return feature_map
    if feature_map not in FEATURE_MAPS:
        raise ValueError(
            f"`feature_map` must be one of {sorted(FEATURE_MAPS)!r} or a "
            f"callable. Received: feature_map={feature_map!r}"
        )
    if normalize and feature_map == "identity":
        raise ValueError(
            "`normalize=True` needs non-negative features (its denominator "
            "phi(q).z changes sign and crosses 0 otherwise): use "
            "`feature_map='elu_plus_one'` or `'relu'`. Received: "
            f"feature_map={feature_map!r}, normalize={normalize!r}"
        )
    return FEATURE_MAPS[feature_map]


def _check_decay(decay, query, causal, dtype):
    """`decay` as `(b, t, h)` in `dtype`, or None."""
    if decay is None:
        return None
    if not causal:
        raise ValueError(
            "`decay` needs `causal=True`: it weighs each key by the steps "
            "between it and the query, and the global sum of "
            "`causal=False` has no such order. Received: decay of shape "
            f"{_shape(decay) if hasattr(decay, 'shape') else decay!r}, "
            f"causal={causal!r}"
        )
    if isinstance(decay, (list, tuple, np.ndarray, float, int)):
        values = np.asarray(decay, dtype="float64")
        if not np.all(np.isfinite(values)) or np.any(values > 0):
            raise ValueError(
                "`decay` holds log decays: finite values <= 0 (the state "
                "is multiplied by exp(decay) <= 1 at each step). "
                f"Received: decay={decay!r}"
            )
    if not hasattr(decay, "shape"):
        decay = np.asarray(decay)
    b, t, h = _shape(query)[:3]
    shape = _shape(decay)
    per_head = len(shape) == 1 and shape[0] in (None, h)
    per_step = len(shape) == 3 and all(
        s is None or w is None or s == w for s, w in zip(shape, (b, t, h))
    )
    if not (per_head or per_step):
        raise ValueError(
            "`decay` must have shape (heads,) = "
            f"({h},) (one per head, RetNet's retention) or (batch, T, "
            f"heads) = {(b, t, h)!r} (one per step, gated linear "
            f"attention). Received: decay.shape={shape!r}"
        )
    decay = ops.cast(decay, dtype)
    if per_head:
        return ops.broadcast_to(decay, ops.shape(query)[:3])
    return decay


def _check_mask(name, mask, query, integers):
    if mask is None:
        return None
    mask = ops.convert_to_tensor(mask)
    shape, want = _shape(mask), _shape(query)[:2]
    if len(shape) != 2 or any(
        a is not None and b is not None and a != b for a, b in zip(shape, want)
    ):
        raise ValueError(
            f"`{name}` must have shape (batch, T) = {want!r}. "
            f"Received: {name}.shape={shape!r}"
        )
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if integers and not keras.backend.is_int_dtype(dtype):
        raise TypeError(
            f"`{name}` must be integers. Received: {name}.dtype={dtype!r}"
        )
    return mask


def _state_shape(query, value):
    b, _, h, d = _shape(query)
    return (b, h, d, _shape(value)[-1])


def _check_state(initial_state, query, value, normalize, dtype):
    """The initial state as one `(b, h, d, e)` tensor in `dtype` (the
    normaliser appended as a last value column when `normalize`)."""
    want = _state_shape(query, value)
    b, h, d, e = want
    if initial_state is None:
        shape = ops.shape(query)
        zeros = (shape[0], h, d, e + (1 if normalize else 0))
        return ops.zeros(zeros, dtype)
    parts = initial_state
    wants = (want, (b, h, d)) if normalize else (want,)
    if not normalize:
        parts = (initial_state,)
    ok = isinstance(parts, (tuple, list)) and len(parts) == len(wants)
    if ok:
        parts = [p if hasattr(p, "shape") else np.asarray(p) for p in parts]
        ok = all(
            len(p.shape) == len(w)
            and all(
                a is None or c is None or a == c for a, c in zip(p.shape, w)
            )
            for p, w in zip(parts, wants)
        )
    if not ok:
        layout = (
            "a tuple (S, z) of shapes (batch, heads, key_dim, value_dim) = "
            f"{want!r} and (batch, heads, key_dim) = {(b, h, d)!r}"
            if normalize
            else f"shape (batch, heads, key_dim, value_dim) = {want!r}"
        )
        got = (
            [_shape(p) for p in parts]
            if isinstance(parts, (tuple, list))
            else type(initial_state).__name__
        )
        raise ValueError(
            f"`initial_state` must be {layout} with normalize={normalize!r}. "
            f"Received: initial_state of shape(s) {got!r}"
        )
    parts = [ops.cast(p, dtype) for p in parts]
    if normalize:
        return ops.concatenate([parts[0], parts[1][..., None]], axis=-1)
    return parts[0]


def _causal(q, k, v, a, doc, state, chunk_size):
    t = q.shape[1]
    if chunk_size is None or t == 1:
        return kernel.recurrent(q, k, v, a, doc, state)
    if t is not None:
        chunk_size = min(chunk_size, t)
    return kernel.chunked(q, k, v, a, doc, state, chunk_size)


def _global(q, k, v, doc, state, chunk_size):
    """`causal=False`: every query reads the keys of its document. With
    documents, the causal pass plus the causal pass over the reversed
    sequence, less the key counted twice (the query's own)."""
    if doc is None:
        return kernel.global_sum(q, k, v, state)
    forward, final = _causal(q, k, v, None, doc, state, chunk_size)
    flip = [ops.flip(x, axis=1) for x in (q, k, v, doc)]
    backward, _ = _causal(*flip[:3], None, flip[3], state * 0, chunk_size)
    own = ops.sum(q * k, axis=-1, keepdims=True) * v
    return forward + ops.flip(backward, axis=1) - own, final


def linear_attention(
    query,
    key,
    value,
    feature_map="elu_plus_one",
    causal=True,
    decay=None,
    chunk_size=64,
    initial_state=None,
    return_state=False,
    segment_ids=None,
    key_mask=None,
    normalize=False,
):
    """Linear attention, linear in the sequence length: Katharopoulos et
    al.'s, RetNet's retention or gated linear attention (see the module
    docstring for the recurrence and the two forms).

    `S_t = exp(a_t) S_{t-1} + phi(k_t) v_t^T`, `o_t = phi(q_t)^T S_t /
    sqrt(key_dim)` (normalised: `o_t = phi(q_t)^T S_t / phi(q_t)^T
    z_t`, `z_t = exp(a_t) z_{t-1} + phi(k_t)`).

    Conventions: `query`/`key`/`value` `(batch, T, heads, dim)`; the
    feature-mapped queries are scaled by `1 / sqrt(key_dim)` inside the
    op (as flash-linear-attention's `scale`: for `"relu"` and
    `"identity"` the same as scaling the queries first; in the
    normalised form it cancels); the state `(batch, heads, key_dim,
    value_dim)` (keras-hub's layout); `decay` in log space (`<= 0`). A
    padded key (`key_mask` False) neither writes nor decays the state;
    the output at a padded step reads the state as it stands there (a
    layer masks it). A row whose keys are all padded gives zeros (with
    no initial state), in both forms. Float16 and bfloat16 inputs are
    computed, and the state kept, in float32 (float64 inputs in
    float64); the output has the query's dtype.

    Args:
        query: `(batch, T, heads, key_dim)`.
        key: `(batch, T, heads, key_dim)`.
        value: `(batch, T, heads, value_dim)`.
        feature_map: `"elu_plus_one"` (`elu(x) + 1`, default,
            Katharopoulos et al.'s), `"relu"`, `"identity"` (no map:
            RetNet, gated linear attention) or a callable applied to the
            queries and keys (elementwise or over the last axis,
            keeping `key_dim`).
        causal: bool, query `t` reads keys `<= t` (default). False: every
            query reads the sum over all (unpadded) keys of its
            document; no `decay` then.
        decay: optional log decays `a <= 0`: `(heads,)`, one per head
            (RetNet: `log(gamma_h)`), or `(batch, T, heads)`, one per
            step (gated linear attention's gate, `log_sigmoid` of a
            projection). Values given as NumPy are checked (finite,
            `<= 0`); a positive tensor value makes the state grow.
        chunk_size: positive int, the chunk length of the chunked form
            (capped at `T`; a tuning constant, the result does not depend
            on it), or None: the recurrent form (one step at a time; what
            a one-step call runs anyway; differentiated, it keeps every
            step's state: for decoding and checks). Defaults to 64.
        initial_state: optional state before the first step, as
            `return_state` gives it: `(batch, heads, key_dim,
            value_dim)`; with `normalize`, the tuple `(S, z)`, `z`
            `(batch, heads, key_dim)`. The first document of
            `segment_ids` goes on from it.
        return_state: bool, also return the state after the last step
            (float32, float64 for float64 inputs): passing it as
            `initial_state` to a call on the following steps continues
            the sequence (two halves give the result of one call).
        segment_ids: optional integers `(batch, T)`: packed documents. A
            document starts where the id changes from one step to the
            next (the state is reset there, as if each document ran
            alone); padding with its own id is a document of its own.
        key_mask: optional boolean `(batch, T)`, True on real tokens.
        normalize: bool, the normalised form (default False: see the
            module docstring for why). Not with `feature_map="identity"`.

    Returns:
        The output `(batch, T, heads, value_dim)` in the query's dtype;
        with `return_state`, `(output, state)`, `state` `(batch, heads,
        key_dim, value_dim)`, or `(S, z)` with `normalize`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 1, 10, 2, 4)).astype("float32")
    >>> decay = np.log([0.9, 0.99])  # RetNet-like, one per head
    >>> attend = keras_attention.ops.linear_attention
    >>> out = attend(q, k, v, decay=decay, chunk_size=4)
    >>> tuple(out.shape)
    (1, 10, 2, 4)
    >>> step = attend(q, k, v, decay=decay, chunk_size=None)  # recurrent
    >>> bool(np.allclose(out, step, atol=1e-5))
    True
    >>> first, state = attend(q[:, :6], k[:, :6], v[:, :6], decay=decay,
    ...                       return_state=True)
    >>> tuple(state.shape)
    (1, 2, 4, 4)
    >>> rest = attend(q[:, 6:], k[:, 6:], v[:, 6:], decay=decay,
    ...               initial_state=state)
    >>> bool(np.allclose(rest, out[:, 6:], atol=1e-5))
    True

    References:
        - Katharopoulos et al., 2020, "Transformers are RNNs: Fast
          Autoregressive Transformers with Linear Attention".
        - Sun et al., 2023, "Retentive Network: A Successor to Transformer
          for Large Language Models".
        - Yang et al., 2024, "Gated Linear Attention Transformers with
          Hardware-Efficient Training".
        - Qin et al., 2022, "The Devil in Linear Transformer".
    """
    query, key, value = attention_checks.as_tensors(
        query=query, key=key, value=value
    )
    _scope.refuse_in_exclusive_scope(
        "`linear_attention`", "its kernel is its own"
    )
    _check_inputs(query, key, value)
    causal = validation.check_bool("causal", causal)
    normalize = validation.check_bool("normalize", normalize)
    return_state = validation.check_bool("return_state", return_state)
    chunk_size = validation.check_positive_int(
        "chunk_size", chunk_size, allow_none=True
    )
    phi = _check_feature_map(feature_map, normalize)
    out_dtype = keras.backend.standardize_dtype(query.dtype)
    dtypes = {keras.backend.standardize_dtype(x.dtype) for x in (key, value)}
    dtype = softmax_dtype("float64" if "float64" in dtypes else out_dtype)
    q, k, v = (ops.cast(x, dtype) for x in (query, key, value))
    a = _check_decay(decay, q, causal, dtype)
    key_mask = _check_mask("key_mask", key_mask, q, integers=False)
    segment_ids = _check_mask("segment_ids", segment_ids, q, integers=True)
    state = _check_state(initial_state, q, v, normalize, dtype)
    value_dim = v.shape[-1]
    q = phi(q) * constant(1.0 / math.sqrt(q.shape[-1]), dtype)
    k = phi(k)
    if key_mask is not None:
        valid = ops.cast(key_mask, "bool")
        k = ops.where(valid[..., None, None], k, ops.zeros_like(k))
        v = ops.where(valid[..., None, None], v, ops.zeros_like(v))
        if a is not None:
            a = ops.where(valid[..., None], a, ops.zeros_like(a))
    if normalize:
        v = ops.concatenate([v, ops.ones_like(v[..., :1])], axis=-1)
    doc = None if segment_ids is None else kernel.document_index(segment_ids)
    if q.shape[1] == 0:
        o, final = ops.zeros_like(v), state
    elif causal:
        o, final = _causal(q, k, v, a, doc, state, chunk_size)
    else:
        o, final = _global(q, k, v, doc, state, chunk_size)
    if normalize:
        o = _divide(o[..., :value_dim], o[..., value_dim:])
        final = (final[..., :value_dim], final[..., value_dim])
    o = ops.cast(o, out_dtype)
    return (o, final) if return_state else o


def _divide(numerator, denominator):
    """`numerator / denominator`, 0 where the denominator is 0 (no NaN,
    also in the gradient)."""
    nonzero = ops.not_equal(denominator, 0.0)
    safe = ops.where(nonzero, denominator, ops.ones_like(denominator))
    return ops.where(nonzero, numerator / safe, ops.zeros_like(numerator))


def linear_attention_weights(
    query,
    key,
    feature_map="elu_plus_one",
    causal=True,
    decay=None,
    segment_ids=None,
    key_mask=None,
    normalize=False,
):
    """The attention matrix `linear_attention` applies, `(batch, heads,
    T, T)` in float32 (float64 for float64 inputs): `w_ij = exp(a_{j+1}
    + ... + a_i) phi(q_i) . phi(k_j) / sqrt(key_dim)` on the keys query
    `i` reads (0 elsewhere), divided by its row sum with `normalize`.
    `linear_attention(...)` equals `einsum("bhij,bjhe->bihe", w, value)`
    (with no initial state). `O(T^2)` time and memory: for plotting and
    checking short sequences. Arguments as `linear_attention`'s.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> from keras_attention.ops.linear_attention import (
    ...     linear_attention_weights)
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 1, 5, 2, 4)).astype("float32")
    >>> w = linear_attention_weights(q, k, normalize=True)
    >>> w = keras.ops.convert_to_numpy(w)
    >>> bool(np.allclose(np.sum(w, -1), 1.0, atol=1e-5))
    True
    >>> out = keras_attention.ops.linear_attention(q, k, v, normalize=True)
    >>> bool(np.allclose(np.einsum("bhij,bjhe->bihe", w, v), out, atol=1e-5))
    True
    """
    _check_inputs(query, key, key)
    causal = validation.check_bool("causal", causal)
    normalize = validation.check_bool("normalize", normalize)
    phi = _check_feature_map(feature_map, normalize)
    dtype = softmax_dtype(query.dtype)
    q, k = ops.cast(query, dtype), ops.cast(key, dtype)
    a = _check_decay(decay, q, causal, dtype)
    key_mask = _check_mask("key_mask", key_mask, q, integers=False)
    segment_ids = _check_mask("segment_ids", segment_ids, q, integers=True)
    q = phi(q) * constant(1.0 / math.sqrt(q.shape[-1]), dtype)
    k = phi(k)
    if key_mask is not None:
        valid = ops.cast(key_mask, "bool")
        k = ops.where(valid[..., None, None], k, ops.zeros_like(k))
        if a is not None:
            a = ops.where(valid[..., None], a, ops.zeros_like(a))
    doc = None if segment_ids is None else kernel.document_index(segment_ids)
    w = kernel.implied_weights(q, k, a, doc, causal)
    if normalize:
        w = _divide(w, ops.sum(w, axis=-1, keepdims=True))
    return w
