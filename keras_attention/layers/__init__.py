"""Public Keras layers of `keras_attention`."""

from keras_attention.layers.activations import gelu_approximate
from keras_attention.layers.activations import quick_gelu
from keras_attention.layers.attention_pooling import AttentionPooling
from keras_attention.layers.attention_rnn_decoder import AttentionRNNDecoder
from keras_attention.layers.bahdanau_attention import BahdanauAttention
from keras_attention.layers.contrastive_logits import ContrastiveLogits
from keras_attention.layers.convolution_padding_mask import (
    ConvolutionPaddingMask,
)
from keras_attention.layers.cross_attention import CrossAttention
from keras_attention.layers.disentangled_self_attention import (
    DisentangledSelfAttention,
)
from keras_attention.layers.encoder_bridge import EncoderBridge
from keras_attention.layers.feed_forward import FeedForward
from keras_attention.layers.gated_delta_net import GatedDeltaNet
from keras_attention.layers.graph_attention import GraphAttention
from keras_attention.layers.group_query_attention import GroupQueryAttention
from keras_attention.layers.kimi_delta_attention import KimiDeltaAttention
from keras_attention.layers.lightning_indexer import LightningIndexer
from keras_attention.layers.linear_attention import LinearAttention
from keras_attention.layers.local_self_attention import LocalSelfAttention
from keras_attention.layers.luong_attention import LuongAttention
from keras_attention.layers.mixture_of_experts import MixtureOfExperts
from keras_attention.layers.multi_head_attention import MultiHeadAttention
from keras_attention.layers.multi_head_latent_attention import (
    MultiHeadLatentAttention,
)
from keras_attention.layers.position_embedding import PositionEmbedding
from keras_attention.layers.rotary_embedding import RotaryEmbedding
from keras_attention.layers.self_attention import CausalSelfAttention
from keras_attention.layers.self_attention import SelfAttention
from keras_attention.layers.seq2seq_attention import Seq2SeqAttention
from keras_attention.layers.shared_kv_attention import KVShare
from keras_attention.layers.shared_kv_attention import SharedKVSelfAttention
from keras_attention.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)
from keras_attention.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)
from keras_attention.layers.token_mixer import TokenMixer
from keras_attention.layers.token_pooling import TokenPooling

__all__ = [
    "AttentionPooling",
    "AttentionRNNDecoder",
    "BahdanauAttention",
    "ContrastiveLogits",
    "ConvolutionPaddingMask",
    "CrossAttention",
    "DisentangledSelfAttention",
    "EncoderBridge",
    "FeedForward",
    "GatedDeltaNet",
    "GraphAttention",
    "GroupQueryAttention",
    "KimiDeltaAttention",
    "KVShare",
    "LightningIndexer",
    "LinearAttention",
    "LocalSelfAttention",
    "LuongAttention",
    "MixtureOfExperts",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "PositionEmbedding",
    "RotaryEmbedding",
    "CausalSelfAttention",
    "SelfAttention",
    "Seq2SeqAttention",
    "SharedKVSelfAttention",
    "SinusoidalPositionEncoding",
    "TokenAndPositionEmbedding",
    "TokenMixer",
    "TokenPooling",
    "gelu_approximate",
    "quick_gelu",
]
