"""Backend-agnostic attention maths (pure functions of tensors, no weights)."""

from keras_attention.ops._backend import assign_slice
from keras_attention.ops._backend import broadcast_add
from keras_attention.ops._backend import compile_step
from keras_attention.ops._backend import compiled_kernel
from keras_attention.ops._backend import is_symbolic
from keras_attention.ops._backend import scan_carry
from keras_attention.ops._backend import zeros_for_initializers
from keras_attention.ops.additive import additive_scores
from keras_attention.ops.attention import dot_product_attention
from keras_attention.ops.attention import implementation_scope
from keras_attention.ops.gated_delta_rule import gated_delta_rule
from keras_attention.ops.global_local import global_local_attention
from keras_attention.ops.global_local import global_local_weights_to_dense
from keras_attention.ops.linear_attention import linear_attention
from keras_attention.ops.log_sum_exp import merge_attention
from keras_attention.ops.masking import mask_fill_value
from keras_attention.ops.masking import masked_softmax
from keras_attention.ops.segment import segment_softmax
from keras_attention.ops.sliding_window import banded_to_dense
from keras_attention.ops.sliding_window import dense_to_banded
from keras_attention.ops.sliding_window import effective_window
from keras_attention.ops.sliding_window import local_attention
from keras_attention.ops.topk_attention import topk_attention

__all__ = [
    "additive_scores",
    "assign_slice",
    "broadcast_add",
    "compile_step",
    "compiled_kernel",
    "dot_product_attention",
    "implementation_scope",
    "is_symbolic",
    "mask_fill_value",
    "masked_softmax",
    "banded_to_dense",
    "dense_to_banded",
    "effective_window",
    "gated_delta_rule",
    "global_local_attention",
    "global_local_weights_to_dense",
    "linear_attention",
    "local_attention",
    "merge_attention",
    "scan_carry",
    "segment_softmax",
    "topk_attention",
    "zeros_for_initializers",
]
