"""Score objects: position biases and score transforms for `score_mod=`.

Each is a `score(score, batch, head, q_idx, kv_idx) -> score` object
(see `keras_attention.mods`) usable on every path (dense, blockwise,
banded) of `keras_attention.ops.dot_product_attention` and by every
attention layer and block through `score_mod=`:

- `ALiBi`: attention with linear biases (Press et al. 2022), causal or
  bidirectional, slopes as in the paper;
- `T5RelativeBias`: T5's learned bias of log-spaced relative-position
  buckets (Raffel et al. 2020), a layer with weights;
- `SoftCap`: Gemma 2's logit soft-capping, `cap * tanh(score / cap)`;
- `DisentangledRelativeBias`: DeBERTa's content-to-position and
  position-to-content terms of log-bucketed relative positions (He et
  al. 2021), a layer holding the relative table, bound to the
  attention's heads per call (`layers.DisentangledSelfAttention`).
"""

from keras_attention.scores.alibi import ALiBi
from keras_attention.scores.alibi import alibi_slopes
from keras_attention.scores.disentangled import DisentangledRelativeBias
from keras_attention.scores.disentangled import log_bucket_index
from keras_attention.scores.soft_cap import SoftCap
from keras_attention.scores.t5_relative_bias import T5RelativeBias
from keras_attention.scores.t5_relative_bias import relative_position_bucket

__all__ = [
    "ALiBi",
    "DisentangledRelativeBias",
    "SoftCap",
    "T5RelativeBias",
    "alibi_slopes",
    "log_bucket_index",
    "relative_position_bucket",
]
