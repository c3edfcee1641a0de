"""Attention inspection: every layer's weights from a model, heatmaps
(matplotlib, imported only when plotting) and TensorBoard images."""

from keras_attention.layers.recording import AttentionRecording
from keras_attention.visualization.attention_html import AttentionExplorer
from keras_attention.visualization.attention_html import attention_html
from keras_attention.visualization.collect import AttentionMaps
from keras_attention.visualization.collect import collect_attention
from keras_attention.visualization.plot_attention import plot_attention
from keras_attention.visualization.tensorboard import AttentionTensorBoard

__all__ = [
    "AttentionExplorer",
    "AttentionRecording",
    "attention_html",
    "AttentionMaps",
    "AttentionTensorBoard",
    "collect_attention",
    "plot_attention",
]
