"""`layers.DisentangledSelfAttention`: DeBERTa-v3's disentangled
self-attention against an independent NumPy port (the relative table
layer-normed, projected by the layer's own query and key projections,
`(q.k + q.pk[r] + k.pq[r]) / sqrt(3 d)`), with padding and grouped
keys; the shared harness (config, `.keras`, SavedModel, fit, mixed
precision) and masks; one relative table shared by two layers is one
weight, trained by both and reloaded as one; the refusals name their
argument."""

import disentangled_reference as reference
import keras
import numpy as np
import pytest
from harness import run_layer_test
from harness import run_mask_test
from keras import ops

from keras_attention.layers import DisentangledSelfAttention
from keras_attention.scores import DisentangledRelativeBias

RNG = np.random.default_rng(3)
# 12 steps past the saturation (10) of 4 buckets up to distance 10.
X = RNG.normal(size=(2, 12, 8)).astype("float32")
PADDING = np.array([[True] * 9 + [False] * 3, [False] * 2 + [True] * 10])


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def bias(**kwargs):
    return DisentangledRelativeBias(
        embedding_dim=8, bucket_size=4, max_distance=10, **kwargs
    )


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_equals_debertas_attention(kv_heads):
    layer = DisentangledSelfAttention(
        2, 4, score_mod=bias(), num_key_value_heads=kv_heads
    )
    layer(X)
    rng = np.random.default_rng(kv_heads)
    for weight in layer.weights:  # no identity norm, nonzero biases
        noise = rng.normal(scale=0.3, size=weight.shape).astype("float32")
        weight.assign(np_(weight) + noise)
    out, weights = layer(X, mask=PADDING, return_attention_scores=True)
    want, want_weights = reference.self_attention(
        reference.layer_weights(layer), X, PADDING, 4, 10, 1e-7
    )
    np.testing.assert_allclose(np_(out)[PADDING], want[PADDING], atol=2e-5)
    got = np_(weights).transpose(0, 2, 1, 3)[PADDING]
    np.testing.assert_allclose(
        got, want_weights.transpose(0, 2, 1, 3)[PADDING], atol=1e-6
    )


@pytest.mark.slow_on_jax(
    "18 s of JAX compilations (fit, export, mixed precision)"
)
def test_harness():
    run_layer_test(
        DisentangledSelfAttention,
        dict(num_heads=2, key_dim=4, score_mod=bias(), dropout=0.1),
        dict(inputs=X),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 12, 8), (2, 2, 12, 12)),
        expected_num_trainable_weights=11,  # 8 projections, table, norm
    )


def test_masks():
    run_mask_test(
        DisentangledSelfAttention,
        dict(num_heads=2, key_dim=4, score_mod=bias()),
        ("inputs",),
        ("mask",),
    )


def test_one_table_shared_by_two_layers_trains_saves_and_loads(tmp_path):
    shared = bias()
    inputs = keras.Input((12, 8))
    x = DisentangledSelfAttention(2, 4, score_mod=shared, name="a")(inputs)
    x = DisentangledSelfAttention(2, 4, score_mod=shared, name="b")(x)
    model = keras.Model(inputs, x)
    tables = [w for w in model.weights if w.path.endswith("embeddings")]
    assert len(tables) == 1
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = np_(shared.embeddings).copy()
    model.fit(X, np.ones_like(X), epochs=1, verbose=0)
    assert np.abs(np_(shared.embeddings) - before).max() > 0
    path = str(tmp_path / "shared.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    a, b = reloaded.get_layer("a"), reloaded.get_layer("b")
    assert a.score_mod is b.score_mod
    np.testing.assert_allclose(
        np_(reloaded(X)), np_(model(X)), atol=1e-6, rtol=1e-6
    )


@pytest.mark.parametrize(
    "arguments, error, name",
    [
        (dict(score_mod=None), TypeError, "score_mod"),
        (dict(rotary_max_wavelength=100), ValueError, "rotary_max_wavelength"),
        (dict(qk_norm="rms"), ValueError, "qk_norm"),
    ],
)
def test_options_that_cannot_apply_are_refused(arguments, error, name):
    with pytest.raises(error, match=name):
        DisentangledSelfAttention(2, 4, **{"score_mod": bias(), **arguments})


def test_bad_calls_are_refused_by_name():
    layer = DisentangledSelfAttention(2, 4, score_mod=bias())
    with pytest.raises(ValueError, match="embedding_dim"):
        layer(np.ones((1, 3, 6), "float32"))
    layer(X)
    with pytest.raises(ValueError, match="cache"):
        layer(X, cache=np.zeros((2, 2, 12, 2, 4), "float32"))
    with pytest.raises(ValueError, match="query"):
        layer(X, mod_inputs={"query": X})
