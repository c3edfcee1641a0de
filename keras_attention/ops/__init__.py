"""Backend-agnostic attention maths (pure functions of tensors, no weights)."""

from keras_attention.ops.attention import dot_product_attention
from keras_attention.ops.attention import mask_fill_value
from keras_attention.ops.attention import masked_softmax
