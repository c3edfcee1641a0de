"""Public Keras layers of `keras_attention`."""

from keras_attention.layers.attention_pooling import AttentionPooling
from keras_attention.layers.attention_rnn_decoder import AttentionRNNDecoder
from keras_attention.layers.bahdanau_attention import BahdanauAttention
from keras_attention.layers.cross_attention import CrossAttention
from keras_attention.layers.encoder_bridge import EncoderBridge
from keras_attention.layers.feed_forward import FeedForward
from keras_attention.layers.local_self_attention import LocalSelfAttention
from keras_attention.layers.luong_attention import LuongAttention
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.layers.position_embedding import PositionEmbedding
from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.layers.self_attention import CausalSelfAttention
from keras_attention.layers.self_attention import SelfAttention
from keras_attention.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)
from keras_attention.layers.transformer_decoder_block import (
    TransformerDecoderBlock,
)
from keras_attention.layers.transformer_encoder_block import (
    TransformerEncoderBlock,
)

__all__ = [
    "AttentionPooling",
    "AttentionRNNDecoder",
    "BahdanauAttention",
    "CrossAttention",
    "EncoderBridge",
    "FeedForward",
    "LocalSelfAttention",
    "LuongAttention",
    "MultiHeadAttention",
    "PositionEmbedding",
    "RotaryEmbedding",
    "CausalSelfAttention",
    "SelfAttention",
    "SinusoidalPositionEncoding",
    "TokenAndPositionEmbedding",
    "TransformerDecoderBlock",
    "TransformerEncoderBlock",
]
