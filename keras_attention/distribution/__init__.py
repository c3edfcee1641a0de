"""Sharding of the library's layers on the Keras distribution API.

`get_layout_map` returns the `keras.distribution.LayoutMap` (keras-hub's
backbone convention) that `keras.distribution.ModelParallel` uses to shard
the attention projections by heads and the feed-forward networks
Megatron-style. `ring_attention` shards the sequence instead (context
parallelism: key/value blocks circulate around a mesh axis), and the
`ContextParallel` distribution runs the library's attention layers that
way under `model.fit` (the guide "Long sequences across devices"). The
Keras distribution API runs on the JAX backend; on TensorFlow use
`tf.distribute` (see the "Scaling out" guide).
"""

from keras_attention.distribution.context_parallel import ContextParallel
from keras_attention.distribution.layout_map import get_layout_map
from keras_attention.distribution.ring_attention import ring_attention

__all__ = ["ContextParallel", "get_layout_map", "ring_attention"]
