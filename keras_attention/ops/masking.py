"""Mask shaping (and, re-exported from `scoring`, the masked softmax,
fill values, score and softmax dtypes).

The rules every attention computation of the package shares (dense,
blockwise, local and the layers' own scorers):
- mask True means "may attend";
- masked scores are filled with a large negative *finite* value
  (`mask_fill_value` of the softmax dtype), never `-inf`;
- the scores `q k^T` of float16 inputs are formed in float32
  (`score_dtype`) and the softmax runs in at least float32 whatever the
  compute dtype (`softmax_dtype`: float64 stays float64);
- a query row with no key to attend to gets all-zero weights, never NaN
  and never uniform weights.

Axes in comments: b - batch, h - heads, i/j - query/key positions.
"""

from keras import ops

# The rules live in `scoring`, the one module that forms and masks scores;
# these names stay importable from here.
from keras_attention.ops.scoring import mask_fill_value  # noqa: F401
from keras_attention.ops.scoring import masked_softmax  # noqa: F401
from keras_attention.ops.scoring import score_dtype  # noqa: F401
from keras_attention.ops.scoring import softmax_dtype  # noqa: F401


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
