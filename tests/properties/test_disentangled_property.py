"""`layers.DisentangledSelfAttention` (with its
`scores.DisentangledRelativeBias`) under Hypothesis.

Draws: the heads (1 to 4) and key/value heads dividing them, the head
size, the buckets (2 to 9) and their distance (just past
`bucket_size // 2 + 1` to 40: sequences shorter and longer than the
buckets' saturation), the length (1, 6 or 13), the padding (anywhere,
whole rows padded included), the inputs' and weights' scales, the
table's layer norm on or off; and bad bucket arguments.

Properties:

- the layer equals the NumPy port of DeBERTa's attention
  (`tests/disentangled_reference.py`) at the real positions, outputs to
  1e-4 relative and weights to 1e-5;
- everything is finite, a padded query's weights are all zero, padded
  keys get no weight;
- a bad `bucket_size` or `max_distance` raises a `ValueError` naming it.
"""

import disentangled_reference as reference
import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from keras_attention.layers import DisentangledSelfAttention
from keras_attention.scores import DisentangledRelativeBias

BACKEND = keras.backend.backend()
DRAWS = settings(
    max_examples=max(
        3, settings.default.max_examples // (2 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)
FEATURES = 6


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


@DRAWS
@given(st.data())
def test_layer_equals_debertas_attention(data):
    heads = data.draw(st.integers(1, 4), label="heads")
    kv_heads = data.draw(
        st.sampled_from([h for h in range(1, heads + 1) if heads % h == 0]),
        label="kv_heads",
    )
    key_dim = data.draw(st.sampled_from([2, 3, 4]), label="key_dim")
    buckets = data.draw(st.integers(2, 9), label="bucket_size")
    distance = data.draw(
        st.integers(buckets // 2 + 2, 40), label="max_distance"
    )
    epsilon = data.draw(st.sampled_from([1e-7, None]), label="epsilon")
    steps = data.draw(st.sampled_from([1, 6, 13]), label="T")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    scale = data.draw(st.sampled_from([0.1, 1.0, 3.0]), label="scale")
    x = (scale * rng.normal(size=(2, steps, FEATURES))).astype("float32")
    padding = rng.random((2, steps)) < 0.7
    if data.draw(st.booleans(), label="a padded row"):
        padding[1] = False
    bias = DisentangledRelativeBias(
        FEATURES,
        bucket_size=buckets,
        max_distance=distance,
        layer_norm_epsilon=epsilon,
    )
    layer = DisentangledSelfAttention(
        heads, key_dim, score_mod=bias, num_key_value_heads=kv_heads
    )
    layer(x)
    for weight in layer.weights:
        noise = rng.normal(scale=0.5, size=weight.shape).astype("float32")
        weight.assign(np_(weight) + noise)
    out, weights = layer(x, mask=padding, return_attention_scores=True)
    out, weights = np_(out), np_(weights)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(weights))
    assert np.all(weights.transpose(0, 2, 1, 3)[~padding] == 0)
    assert np.all(weights.transpose(0, 3, 1, 2)[~padding] == 0)
    want, want_weights = reference.self_attention(
        reference.layer_weights(layer), x, padding, buckets, distance, epsilon
    )
    np.testing.assert_allclose(
        out[padding], want[padding], atol=1e-4, rtol=1e-4
    )
    np.testing.assert_allclose(
        weights.transpose(0, 2, 1, 3)[padding],
        want_weights.transpose(0, 2, 1, 3)[padding],
        atol=1e-5,
    )


@DRAWS
@given(
    buckets=st.integers(-2, 12),
    distance=st.integers(-2, 12),
)
def test_bad_bucket_arguments_are_refused_by_name(buckets, distance):
    good_buckets = buckets >= 2
    good_distance = distance >= 1 and distance - 1 > max(buckets, 0) // 2
    if good_buckets and good_distance:
        bias = DisentangledRelativeBias(
            4, bucket_size=buckets, max_distance=distance
        )
        assert bias.bucket_size == buckets
        return
    name = "bucket_size" if not good_buckets else "max_distance"
    with pytest.raises(ValueError, match=name):
        DisentangledRelativeBias(4, bucket_size=buckets, max_distance=distance)
