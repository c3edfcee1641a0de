"""Masked softmax, fill values, score dtypes and mask shaping.

The rules every attention computation of the package shares (dense,
blockwise, local and the layers' own scorers):
- mask True means "may attend";
- masked scores are filled with a large negative *finite* value
  (`mask_fill_value`), never `-inf`;
- the scores `q k^T` of float16 / bfloat16 inputs are formed in float32
  (`score_dtype`) and the softmax runs in float32 whatever the compute
  dtype;
- a query row with no key to attend to gets all-zero weights, never NaN
  and never uniform weights.

Axes in comments: b - batch, h - heads, i/j - query/key positions.
"""

import keras
import numpy as np
from keras import ops


def mask_fill_value(dtype):
    """A large negative *finite* score for masked positions of `dtype`.

    Half of the dtype's lowest value: adding a bias to it cannot overflow to
    `-inf` (as a fixed `-1e9` does in float16).

    Example:

    >>> import keras_attention
    >>> keras_attention.ops.mask_fill_value("float16")
    -32752.0
    """
    dtype = str(getattr(dtype, "name", dtype))
    if dtype == "bfloat16":
        return -1.6e38
    return float(np.finfo(np.dtype(dtype)).min) / 2.0


def score_dtype(dtype):
    """The dtype attention scores are formed in: float32 for float16 inputs
    (whose range, 65,504, scores can overflow), the input dtype otherwise.

    bfloat16 has float32's exponent range, so its scores cannot overflow
    and stay in bfloat16 (the fast matmuls of CPUs with AVX512_BF16/AMX and
    of accelerators); the softmax still runs in float32.
    """
    dtype = keras.backend.standardize_dtype(dtype)
    return "float32" if dtype == "float16" else dtype


def masked_softmax(scores, mask=None, axis=-1):
    """Softmax over `axis` in float32 with masked entries set to exactly 0.

    Rows where `mask` is all False get all-zero weights.

    Args:
        scores: float tensor of any dtype.
        mask: optional boolean tensor broadcastable to `scores`.
        axis: the axis to normalize over.

    Returns:
        float32 tensor shaped like `scores`.

    Example:

    >>> import numpy as np
    >>> import keras_attention
    >>> weights = keras_attention.ops.masked_softmax(
    ...     np.zeros((2, 3), "float32"),
    ...     mask=np.array([[True, True, False], [False, False, False]]))
    >>> np.asarray(weights).tolist()
    [[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]
    """
    scores = ops.cast(scores, "float32")
    if mask is None:
        return ops.softmax(scores, axis=axis)
    mask = ops.cast(mask, "bool")
    # An additive bias of the mask's own shape (its gradient is the
    # identity, where a `where` on the scores needs a select), and rows
    # that see nothing zeroed by a per-row factor (masked entries are
    # already exactly 0: exp of the fill value underflows).
    bias = ops.where(mask, 0.0, mask_fill_value("float32"))
    weights = ops.softmax(scores + bias, axis=axis)
    valid = ops.any(mask, axis=axis, keepdims=True)
    return weights * ops.cast(valid, "float32")


def as_4d_mask(mask):
    """Brings a `(i, j)`, `(b, i, j)` or `(b, h, i, j)` mask to rank 4
    (boolean, `(b|1, h|1, i, j)`); None stays None."""
    if mask is None:
        return None
    mask = ops.cast(mask, "bool")
    rank = len(mask.shape)
    if rank == 2:
        return mask[None, None]
    if rank == 3:
        return mask[:, None]
    if rank == 4:
        return mask
    raise ValueError(
        "An attention mask must have rank 2, 3 or 4. "
        f"Received: mask.shape={tuple(mask.shape)!r}"
    )
