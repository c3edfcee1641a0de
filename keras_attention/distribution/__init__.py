"""Sharding of the library's layers on the Keras distribution API.

`get_layout_map` returns the `keras.distribution.LayoutMap` (keras-hub's
backbone convention) that `keras.distribution.ModelParallel` uses to shard
the attention projections by heads and the feed-forward networks
Megatron-style. The Keras distribution API runs on the JAX backend; on
TensorFlow use `tf.distribute` (see the "Scaling out" guide).
"""

from keras_attention.distribution.layout_map import get_layout_map

__all__ = ["get_layout_map"]
