"""Plots of attention weights (matplotlib, imported only when plotting)."""

from keras_attention.visualization.plot_attention import plot_attention

__all__ = [
    "plot_attention",
]
