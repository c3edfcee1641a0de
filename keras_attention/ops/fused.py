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

from keras_attention.ops import _backend
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
):
    """`keras.ops.dot_product_attention` (flash / cuDNN where available).

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
        )
        return out[..., :e]
    out, valid = _fused_core(
        query, key, value, mask, is_causal, causal_offset, key_padding, scale
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
