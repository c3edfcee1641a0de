"""Score objects: position biases and score transforms for `score_mod=`.

Each is a `score(score, batch, head, q_idx, kv_idx) -> score` object
(see `keras_attention.mods`) usable on every path (dense, blockwise,
banded) of `keras_attention.ops.dot_product_attention` and by every
attention layer and block through `score_mod=`:

- `ALiBi`: attention with linear biases (Press et al. 2022), causal or
  bidirectional, slopes as in the paper;
- `T5RelativeBias`: T5's learned bias of log-spaced relative-position
  buckets (Raffel et al. 2020), a layer with weights;
- `SoftCap`: Gemma 2's logit soft-capping, `cap * tanh(score / cap)`.
"""

from keras_attention.scores.alibi import ALiBi
from keras_attention.scores.alibi import alibi_slopes
from keras_attention.scores.soft_cap import SoftCap
from keras_attention.scores.t5_relative_bias import T5RelativeBias
from keras_attention.scores.t5_relative_bias import relative_position_bucket

__all__ = [
    "ALiBi",
    "SoftCap",
    "T5RelativeBias",
    "alibi_slopes",
    "relative_position_bucket",
]
