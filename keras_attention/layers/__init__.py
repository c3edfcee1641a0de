"""Public Keras layers of `keras_attention`."""

from keras_attention.layers.attention_pooling import AttentionPooling
from keras_attention.layers.cross_attention import CrossAttention
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.layers.self_attention import CausalSelfAttention
from keras_attention.layers.self_attention import SelfAttention
