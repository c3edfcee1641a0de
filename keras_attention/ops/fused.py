"""The fused attention path: `keras.ops.dot_product_attention` (flash /
cuDNN kernels on a GPU, PyTorch's fused CPU kernels), with this
package's masking rules (rows that attend to nothing give zeros, padded
queries zeros) and its precision rules (low-precision scores in float32
where a kernel would not, float64 through the dense path).

Axes: b - batch, i/j - query/key positions, h - query heads, g -
key/value heads, d/e - key/value head dims.
"""

import keras
import numpy as np
from keras import ops

from keras_attention import masks
from keras_attention.ops import _backend
from keras_attention.ops import scoring
from keras_attention.ops.dense import dense_attention
from keras_attention.ops.dense import dense_mask


def fused_attention(
    query,
    key,
    value,
    mask,
    is_causal,
    causal_offset,
    key_padding,
    query_padding,
    scale=1.0,
    band=None,
):
    """`keras.ops.dot_product_attention` (flash / cuDNN where available).

    `band`: `(left, right)` (`mask_band`), keys `q - left .. q + right`
    of each query's absolute position `q` (None: unbounded), and-ed with
    the other masks. On JAX on a GPU, a causal mask, a left window and
    padding masks (as sequence lengths) go to cuDNN's kernel
    (`jax.nn.dot_product_attention(implementation="cudnn")`,
    `_cudnn_arguments`); what it cannot take runs as before.

    Rows that may attend to nothing would give NaN, zeros or (through the
    additive mask Keras builds) uniform weights, depending on the kernel:
    they attend to everything instead and their result is zeroed
    afterwards. Padded
    queries are zeroed afterwards too, so that they never densify the mask:
    causal attention with query padding alone still runs as `is_causal`,
    and key padding alone stays a `(b, 1, 1, j)` mask on torch.

    Low precision: JAX's kernels form float16 / bfloat16 scores in float32
    (`preferred_element_type`), cuDNN / flash kernels accumulate in
    float32. TensorFlow's kernel does not, and Keras's torch backend turns
    a boolean mask into an additive one in the input dtype (-45850 in
    float16, which float32 scores of large float16 inputs exceed): those
    compute in float32. float64 stays float64 (on JAX and torch, whose
    kernel calls would compute it in float32, through the dense path).
    """
    dtype = keras.backend.standardize_dtype(query.dtype)
    if band is not None and (
        _cudnn_arguments(query, key, mask, is_causal, causal_offset, band)
        is None
    ):  # A dense mask, for the other kernels.
        mask = masks.combine_masks(
            mask, _band_mask(query, key, causal_offset, band)
        )
        band = None
    if isinstance(scale, float):
        # A NumPy float64 (a Python float still): TensorFlow's kernel casts
        # a Python float to float64 through float32.
        scale = np.float64(scale)
    if dtype == "float64" and keras.backend.result_type(dtype) != dtype:
        # Keras's JAX and torch kernel calls compute float64 in float32
        # (their type promotion), and no fused kernel takes float64: the
        # dense path.
        mask = dense_mask(
            mask,
            query,
            key,
            is_causal,
            causal_offset,
            key_padding,
            query_padding,
        )
        return dense_attention(query, key, value, mask, scale, None, False)
    if _backend.fused_attention_upcasts(dtype):
        query, key, value = (
            ops.cast(x, "float32") for x in (query, key, value)
        )
        out = fused_attention(
            query,
            key,
            value,
            mask,
            is_causal,
            causal_offset,
            key_padding,
            query_padding,
            scale,
        )
        return ops.cast(out, dtype)
    h, g = query.shape[2], key.shape[2]
    if g == 1 and h > 1:  # Some backends only broadcast 1 < g < h groups.
        key, value = ops.repeat(key, h, axis=2), ops.repeat(value, h, axis=2)
    d, e = query.shape[-1], value.shape[-1]
    if d != e:  # Kernels want one head size: zero padding changes nothing.
        size = max(d, e)
        query, key, value = (_pad_head(x, size) for x in (query, key, value))
        out = fused_attention(
            query,
            key,
            value,
            mask,
            is_causal,
            causal_offset,
            key_padding,
            query_padding,
            scale,
            band,
        )
        return out[..., :e]
    arguments = _cudnn_arguments(
        query, key, mask, is_causal, causal_offset, band
    )
    if arguments is None:
        out, valid = _fused_core(
            query,
            key,
            value,
            mask,
            is_causal,
            causal_offset,
            key_padding,
            scale,
        )
    else:
        out, valid = _cudnn_core(
            query, key, value, key_padding, query_padding, scale, arguments
        )
    if query_padding is not None:  # (b, i) -> (b, i, 1, 1)
        rows = ops.cast(query_padding, "bool")[:, :, None, None]
        valid = rows if valid is None else ops.logical_and(valid, rows)
    if valid is None:
        return out
    return ops.where(valid, out, ops.zeros_like(out))


def _fused_core(
    query, key, value, mask, is_causal, causal_offset, padding, scale
):
    """The fused call without query padding: the output `(b, i, h, e)` and
    the rows that attend to something, `(b|1, i, h|1, 1)` bool or None
    (every row)."""
    simple_causal = (
        is_causal
        and isinstance(causal_offset, int)
        and causal_offset == 0
        and mask is None
        and padding is None
        and query.shape[1] == key.shape[1]
    )
    if simple_causal:
        out = ops.dot_product_attention(
            query, key, value, scale=scale, is_causal=True
        )
        return out, None
    dense = dense_mask(mask, query, key, is_causal, causal_offset, padding)
    if dense is None:
        return ops.dot_product_attention(query, key, value, scale=scale), None
    # b - batch, h - heads, i/j - query/key positions.
    valid = ops.any(dense, axis=-1, keepdims=True)  # (b|1, h|1, i|1, 1)
    dense = ops.logical_or(dense, ops.logical_not(valid))
    if not _backend.fused_mask_broadcasts():
        # This backend's kernel wants the mask's query and key axes.
        dense = ops.broadcast_to(
            dense,
            (
                ops.shape(query)[0] if dense.shape[0] != 1 else 1,
                dense.shape[1],
                ops.shape(query)[1],
                ops.shape(key)[1],
            ),
        )
    out = ops.dot_product_attention(query, key, value, mask=dense, scale=scale)
    return out, ops.transpose(valid, (0, 2, 1, 3))  # (b|1, i|1, h|1, 1)


def _pad_head(x, size):
    """Zero-pads the head axis of `(b, T, heads, dim)` to `size`."""
    return ops.pad(x, [[0, 0]] * 3 + [[0, size - x.shape[-1]]])


# cuDNN (JAX on a GPU) -------------------------------------------------------


def mask_band(mask_mod):
    """`(left, right)` of a mask object that says it is a band of keys
    `q_idx - left <= kv_idx <= q_idx + right` (`band_bounds()`: a causal
    mask, a sliding window, their intersection; None: unbounded), else
    None (also when a subclass overrides `__call__` but not
    `band_bounds`)."""
    method = scoring.declared_method(mask_mod, "band_bounds")
    return None if method is None else method()


def _band_mask(query, key, offset, band):
    """`band` as a dense `(1, 1, i, j)` mask on absolute positions."""
    q = ops.arange(ops.shape(query)[1], dtype="int32") + offset
    kv = ops.arange(ops.shape(key)[1], dtype="int32")
    unbounded = 2**31 - 1
    left, right = (unbounded if x is None else x for x in band)
    return scoring.in_window(q[:, None], kv[None, :], left, right)[None, None]


def _cudnn_arguments(query, key, mask, is_causal, offset, band=None):
    """The keyword arguments of `jax.nn.dot_product_attention` for cuDNN
    (`scale` and the sequence lengths aside), or None when its kernel
    cannot run the call: JAX on a GPU, float16 / bfloat16
    (`_backend.CUDNN_DTYPES`), no dense mask, a causal mask or band on
    positions from 0 with as many queries as keys (cuDNN's causal mask
    is aligned at the top left), and a band with no keys after the query
    (cuDNN takes a window on the left only)."""
    if not _backend.cudnn_available(query.dtype) or mask is not None:
        return None
    left, right = band if band is not None else (None, None)
    right = 0 if is_causal else right
    if band is None and not is_causal:
        return {"is_causal": False}
    tq, tk = query.shape[1], key.shape[1]
    if right != 0 or not (isinstance(offset, int) and offset == 0):
        return None
    if tq is None or tq != tk:
        return None
    window = None if left is None or left >= tk else (int(left), 0)
    return {"is_causal": True, "local_window_size": window}


def _prefix_lengths(padding):
    """`(lengths, prefix)` of a padding mask `(b, T)`: the number of True
    entries per row (int32) and whether every row is True on its first
    `length` entries only (a scalar bool): sequence lengths then say
    what the mask says."""
    padding = ops.cast(padding, "bool")
    lengths = ops.sum(ops.cast(padding, "int32"), axis=1)
    steps = ops.arange(ops.shape(padding)[1], dtype="int32")[None, :]
    prefix = ops.all(ops.equal(padding, steps < lengths[:, None]))
    return lengths, prefix


def _cudnn_core(query, key, value, key_padding, query_padding, scale, args):
    """cuDNN's kernel with `args` (`_cudnn_arguments`), the padding masks
    as sequence lengths when they are prefixes (checked when run:
    `ops.cond`, else the other kernels); `(output, None)`, rows with no
    key zeroed. The other kernels when cuDNN refuses the call (its shapes
    or head size, an old cuDNN) while tracing."""
    lengths, prefixes, band = {}, [], None
    if key_padding is not None:
        kv, prefix = _prefix_lengths(key_padding)
        lengths["key_value_seq_lengths"], prefixes = kv, [prefix]
    if query_padding is not None:
        q_lengths, prefix = _prefix_lengths(query_padding)
        lengths["query_seq_lengths"] = q_lengths
        prefixes.append(prefix)
    if args.get("local_window_size") is not None:
        band = (args["local_window_size"][0], 0)
    elif args["is_causal"]:
        band = (None, 0)

    def others():
        mask = None if band is None else _band_mask(query, key, 0, band)
        out, valid = _fused_core(
            query, key, value, mask, False, 0, key_padding, scale
        )
        if valid is None:
            return out
        return ops.where(valid, out, ops.zeros_like(out))

    arguments = dict(args, scale=float(scale), **lengths)
    if not _backend.cudnn_attention(query, key, value, arguments, True):
        return others(), None

    def cudnn():
        out = _backend.cudnn_attention(query, key, value, arguments)
        if key_padding is None:
            return out
        # Rows whose band holds no key (a length 0, or every key of the
        # window padded) give zeros.
        low = 0
        if band is not None and band[0] is not None:
            rows = ops.arange(ops.shape(query)[1], dtype="int32")
            low = ops.maximum(rows - band[0], 0)[None, :]
        valid = low < lengths["key_value_seq_lengths"][:, None]
        if not isinstance(low, int):
            valid = ops.reshape(valid, (-1, ops.shape(query)[1], 1, 1))
        else:
            valid = ops.reshape(valid, (-1, 1, 1, 1))
        return ops.where(valid, out, ops.zeros_like(out))

    if not prefixes:
        return cudnn(), None
    prefix = prefixes[0]
    if len(prefixes) > 1:
        prefix = ops.logical_and(prefixes[0], prefixes[1])
    return ops.cond(prefix, cudnn, others), None
