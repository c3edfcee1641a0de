"""Local attention at T = 32,768 runs forward and backward in bounded
memory. A dense masked version could not: one float32 score matrix of this
length is T * T * 4 bytes = 4 GiB per head and example."""

import textwrap

import pytest
from peak_growth import peak_growth_mib

_SCRIPT = textwrap.dedent(
    """
    import resource
    import numpy as np
    import tensorflow as tf
    from keras_attention.layers import LocalSelfAttention

    def peak_mib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

    T, HEADS, KEY_DIM, WINDOW = 32768, 2, 8, 32
    layer = LocalSelfAttention(HEADS, KEY_DIM, window_size=WINDOW)
    x = np.random.default_rng(0).normal(size=(1, T, 16))
    x = tf.constant(x, tf.float32)
    layer(x[:, :8])

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(layer(x) ** 2)
        return loss, tape.gradient(loss, [x] + layer.trainable_weights)

    before = peak_mib()
    loss, grads = step(x)
    assert np.isfinite(loss.numpy())
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)
    print(before, peak_mib())
    """
)


@pytest.mark.tf_only
def test_local_attention_32k_forward_backward_memory():
    grown = peak_growth_mib(_SCRIPT)
    # Dense: 2 heads x 4 GiB for the scores alone (and as much again for
    # the softmax and its gradient). Banded: a few (T x (B + 2w)) tensors.
    dense_scores_mib = 2 * 32768 * 32768 * 4 / 2**20
    assert grown < 1024, f"forward+backward grew peak RSS by {grown:.0f} MiB"
    assert grown < dense_scores_mib / 16
