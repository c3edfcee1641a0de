"""Additive (Bahdanau) attention trains on a shape whose direct broadcast
needs several GB: batch 4, Tq 128, Tv 1,024, 1,024 units. The
`(batch, Tq, Tv, units)` tanh tensor alone is 4 * 128 * 1024 * 1024 * 4
bytes = 2 GiB, kept for the backward pass, which needs as much again for its
gradient."""

import textwrap

import pytest
from peak_growth import peak_growth_mib

B, TQ, TV, UNITS = 4, 128, 1024, 1024

_SCRIPT = textwrap.dedent(
    f"""
    import resource
    import numpy as np
    import tensorflow as tf
    import keras
    from keras_attention.layers import BahdanauAttention

    def peak_mib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    rng = np.random.default_rng(0)
    query = tf.constant(rng.normal(size=({B}, {TQ}, 32)), tf.float32)
    memory = tf.constant(rng.normal(size=({B}, {TV}, 32)), tf.float32)
    layer = BahdanauAttention({UNITS})
    layer(query[:, :2], memory[:, :3])
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def train_step(query, memory):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(query, memory) ** 2)
        grads = tape.gradient(loss, layer.trainable_weights)
        optimizer.apply(grads, layer.trainable_weights)
        return loss, grads

    train_step.get_concrete_function(query, memory)
    before = peak_mib()
    loss, grads = train_step(query, memory)
    assert np.isfinite(loss.numpy())
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)
    print(before, peak_mib())
    """
)


@pytest.mark.tf_only
def test_bahdanau_trains_in_bounded_memory():
    grown = peak_growth_mib(_SCRIPT)
    broadcast_mib = B * TQ * TV * UNITS * 4 / 2**20  # one (b, Tq, Tv, u) tensor
    # The broadcast keeps >= 2 such tensors (tanh and its gradient): 4 GiB.
    assert grown < 768, f"a training step grew peak RSS by {grown:.0f} MiB"
    assert grown < broadcast_mib / 2
