"""Keras 3.15's own `GroupQueryAttention` scenarios, as a drop-in contract.

Every scenario of `keras/src/layers/attention/grouped_query_attention_test.py`
(Keras 3.15.1) restated for `keras_attention.layers.GroupQueryAttention`:
the constructor (positional order included), config, state counts, shape
rules and errors, mask propagation, masking, the sliding window, the
attention-step hook scenarios (already in `test_programmable_layers.py`
for the grouped case), and numbers: our layer holding Keras's weights
(`set_weights`) gives Keras's outputs and scores. Flash-attention-only
scenarios (JAX/torch GPU kernels) are left out.
"""

import keras
import numpy as np
import pytest
from keras import ops
from keras.src.testing.test_case import get_seed_generators

from keras_attention.layers import GroupQueryAttention

RNG = np.random.default_rng(3)
Keras = keras.layers.GroupQueryAttention


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def pair(*args, **kwargs):
    return Keras(*args, **kwargs), GroupQueryAttention(*args, **kwargs)


def same_weights(theirs, ours, *args, **kwargs):
    theirs(*args, **kwargs)
    ours(*args, **kwargs)
    assert [w.shape for w in ours.weights] == [w.shape for w in theirs.weights]
    ours.set_weights(theirs.get_weights())


@pytest.mark.parametrize(
    "kwargs,trainable,seeds",
    [
        ({}, 8, 0),
        (dict(use_bias=False, dropout=0.5), 4, 1),
        (dict(use_gate=True), 10, 0),
        (dict(use_bias=False, dropout=0.5, use_gate=True), 5, 1),
    ],
)
def test_basics_state_and_config(kwargs, trainable, seeds):
    init = dict(num_query_heads=2, num_key_value_heads=2, head_dim=2, **kwargs)
    layer = GroupQueryAttention(**init)
    q, v = RNG.normal(size=(2, 8, 16)), RNG.normal(size=(2, 4, 16))
    out = layer(q, v)
    assert tuple(out.shape) == (2, 8, 16)
    assert len(layer.trainable_weights) == trainable
    assert len(layer.non_trainable_weights) == 0
    assert len(get_seed_generators(layer)) == seeds
    assert layer.supports_masking
    config = layer.get_config()
    for key, value in Keras(**init).get_config().items():
        if key not in ("name",):
            assert config[key] == value, key
    revived = GroupQueryAttention.from_config(config)
    assert revived.get_config() == config


def test_positional_order_is_keras():
    theirs, ours = pair(4, 8, 2, 0.0, False)
    assert (ours.head_dim, ours.num_query_heads) == (4, 8)
    assert (ours.num_key_value_heads, ours.use_bias) == (2, False)
    assert ours.num_repeats == theirs.num_repeats == 4


@pytest.mark.parametrize(
    "query_dims,value_dims,key_dims,heads,kv_heads",
    [
        ((4, 8), (2, 8), None, 2, 2),
        ((4, 8), (2, 8), (2, 3), 2, 2),
        ((4, 8), (2, 8), None, 4, 2),
        ((4, 8), (2, 8), (2, 3), 4, 2),
        ((4, 8), (2, 8), None, 4, 1),
        ((4, 8), (2, 8), (2, 3), 4, 1),
    ],
)
def test_compute_output_shape(
    query_dims, value_dims, key_dims, heads, kv_heads
):
    layer = GroupQueryAttention(
        num_query_heads=heads, num_key_value_heads=kv_heads, head_dim=2
    )
    q_shape, v_shape = (7,) + query_dims, (7,) + value_dims
    k_shape = (7,) + key_dims if key_dims else None
    key = np.ones(k_shape) if k_shape else None
    out = layer(query=np.ones(q_shape), value=np.ones(v_shape), key=key)
    assert tuple(out.shape) == layer.compute_output_shape(
        q_shape, v_shape, k_shape
    )


@pytest.mark.parametrize(
    "query_shape,value_shape,key_shape",
    [
        # Keras's `key_shape=2` (an int) too: the query/value check
        # comes first and raises.
        pytest.param((2, 4, 8), (2, 2, 7), 2, id="query_value_dim_mismatch"),
        pytest.param(
            (2, 4, 8), (2, 2, 8), (2, 1, 7), id="key_value_dim_mismatch"
        ),
    ],
)
@pytest.mark.parametrize("by_name", [False, True])
def test_shape_mismatch_error(query_shape, value_shape, key_shape, by_name):
    # Keras 3.15's `test_shape_mismatch_error_*`, positionally (as Keras
    # calls it) and by name.
    layer = GroupQueryAttention(
        num_query_heads=4, num_key_value_heads=4, head_dim=2
    )
    with pytest.raises(ValueError, match="must be equal"):
        if by_name:
            layer.compute_output_shape(
                query_shape=query_shape,
                value_shape=value_shape,
                key_shape=key_shape,
            )
        else:
            layer.compute_output_shape(query_shape, value_shape, key_shape)


def test_query_and_value_feature_sizes_must_agree_at_build():
    layer = GroupQueryAttention(2, 2, 2)
    with pytest.raises(ValueError, match="must be equal"):
        layer(np.ones((1, 3, 8)), np.ones((1, 3, 7)))


def test_heads_must_divide():
    with pytest.raises(ValueError, match="divisible"):
        GroupQueryAttention(
            head_dim=2, num_query_heads=3, num_key_value_heads=2
        )
    with pytest.raises(ValueError, match="sliding_window"):
        GroupQueryAttention(2, 2, 2, sliding_window=0)


def test_symbolic_shapes():
    layer = GroupQueryAttention(
        num_query_heads=4, num_key_value_heads=2, head_dim=8
    )
    query, value = keras.Input((10, 32)), keras.Input((15, 32))
    out, scores = layer(query, value, return_attention_scores=True)
    assert tuple(out.shape) == (None, 10, 32)
    assert tuple(scores.shape) == (None, 4, 10, 15)
    assert tuple(layer(query, value).shape) == (None, 10, 32)


def test_initializer_gives_sublayers_different_kernels():
    layer = GroupQueryAttention(
        num_query_heads=16,
        num_key_value_heads=16,
        head_dim=64,
        use_gate=True,
        kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
    )
    layer.build((2, 4, 8), (2, 4, 8))
    query = np_(layer._query_dense.kernel)
    for other in ("_key_dense", "_value_dense", "_gate_dense"):
        assert not np.allclose(query, np_(getattr(layer, other).kernel))


@pytest.mark.parametrize("use_gate", [False, True])
def test_query_mask_propagation(use_gate):
    layer = GroupQueryAttention(2, 2, 2, use_gate=use_gate)
    query = np.array([[1, 2, 3, 0, 0], [3, 3, 1, 1, 2], [1, 0, 0, 0, 0]])
    masked = keras.layers.Embedding(4, 8, mask_zero=True)(query)
    out = layer(query=masked, value=RNG.normal(size=(3, 3, 8)))
    np.testing.assert_array_equal(
        np_(keras.src.backend.get_keras_mask(out)), query > 0
    )


@pytest.mark.parametrize("use_gate", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_masking_matches_keras_with_the_same_weights(causal, use_gate):
    theirs, ours = pair(
        head_dim=2, num_query_heads=4, num_key_value_heads=2, use_gate=use_gate
    )
    query = np.array([[1, 2, 3, 0, 0], [3, 3, 1, 1, 2], [1, 2, 1, 3, 0]])
    value = np.array([[5, 4, 0], [3, 1, 0], [2, 1, 1]])
    q = keras.layers.Embedding(4, 8, mask_zero=True)(query)
    v = keras.layers.Embedding(6, 8, mask_zero=True)(value)
    same_weights(theirs, ours, query=q, value=v)
    kw = dict(query=q, value=v, use_causal_mask=causal)
    want, got = theirs(**kw), ours(**kw)
    rows = query > 0  # padded queries: zeros here, uniform in Keras
    np.testing.assert_allclose(np_(got)[rows], np_(want)[rows], atol=1e-5)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_outputs_and_scores_equal_keras(kv_heads):
    theirs, ours = pair(8, 4, kv_heads, use_gate=kv_heads == 2)
    q = RNG.normal(size=(2, 6, 16)).astype("float32")
    v = RNG.normal(size=(2, 5, 16)).astype("float32")
    k = RNG.normal(size=(2, 5, 12)).astype("float32")
    same_weights(theirs, ours, q, v, k)
    want = theirs(q, v, k, return_attention_scores=True)
    got = ours(q, v, k, return_attention_scores=True)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np_(a), np_(b), atol=1e-5)


def test_sliding_window_equals_keras_and_serializes():
    theirs, ours = pair(
        head_dim=4, num_query_heads=4, num_key_value_heads=2, sliding_window=3
    )
    x = np.random.RandomState(0).randn(1, 6, 8).astype("float32")
    same_weights(theirs, ours, x, x)
    _, scores = ours(x, x, use_causal_mask=True, return_attention_scores=True)
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    inside = (j <= i) & (i - j < 3)
    assert np.all(np_(scores)[0, 0][inside] > 0)
    assert np.all(np_(scores)[0, 0][~inside] == 0)
    np.testing.assert_allclose(
        np_(ours(x, x, use_causal_mask=True)),
        np_(theirs(x, x, use_causal_mask=True)),
        atol=1e-5,
    )
    config = ours.get_config()
    assert config["sliding_window"] == 3
    assert GroupQueryAttention.from_config(config).sliding_window == 3


def test_causal_only_equals_the_explicit_mask():
    layer = GroupQueryAttention(
        head_dim=4, num_query_heads=4, num_key_value_heads=2
    )
    x = np.random.RandomState(0).randn(2, 5, 16).astype("float32")
    fast = layer(x, x, use_causal_mask=True)
    slow = layer(x, x, attention_mask=np.tril(np.ones((1, 5, 5), bool)))
    np.testing.assert_allclose(np_(fast), np_(slow), atol=1e-5)


def test_causal_only_skipped_for_subclass():
    # Keras 3.15's `test_causal_only_skipped_for_subclass`: a subclass with
    # Keras's earlier `_compute_attention` signature (no
    # `return_attention_scores`, no `use_causal_mask`) is called, and gets
    # the causal mask as `attention_mask`, not None; the numbers are
    # Keras's causal ones.
    seen = {}

    class Sub(GroupQueryAttention):
        def _compute_attention(
            self, query, key, value, attention_mask=None, training=None
        ):
            seen["mask_is_none"] = attention_mask is None
            return super()._compute_attention(
                query, key, value, attention_mask, training
            )

    layer = Sub(head_dim=4, num_query_heads=4, num_key_value_heads=2)
    x = np.random.RandomState(0).randn(2, 5, 16).astype("float32")
    out = layer(x, x, use_causal_mask=True)
    assert seen["mask_is_none"] is False
    theirs = Keras(head_dim=4, num_query_heads=4, num_key_value_heads=2)
    theirs(x, x)
    theirs.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        np_(out), np_(theirs(x, x, use_causal_mask=True)), atol=1e-5
    )


def test_correctness_numbers():
    # Keras's test_correctness (no flash attention), float32.
    head_dim = heads = 8
    query = np.identity(head_dim)[None]
    value = np.reshape(np.arange(64), (1, 8, 8)) / 100.0
    layer = GroupQueryAttention(head_dim, heads, heads)
    layer.build(query.shape, query.shape, value.shape)
    kernel = np.repeat(np.identity(head_dim)[:, None, :], heads, axis=1)
    bias = np.zeros((heads, head_dim))
    layer.set_weights([kernel, bias] * 3 + [kernel, np.zeros((head_dim,))])
    out, scores = layer(
        query=query, value=value, key=query, return_attention_scores=True
    )
    want = np.array([2.406, 2.440, 2.473, 2.504, 2.535, 2.568, 2.602, 2.633])
    np.testing.assert_allclose(
        np_(out), np.tile(want[None, :, None], (1, 1, 8)), atol=1e-2
    )
    diag = np.where(np.eye(8, dtype=bool), 0.1691, 0.1187)
    np.testing.assert_allclose(
        np_(scores), np.tile(diag[None, None], (1, 8, 1, 1)), atol=1e-2
    )


def test_keras_model_saves_and_reloads(tmp_path):
    q = keras.Input((6, 16))
    layer = GroupQueryAttention(4, 4, 2, use_gate=True)
    model = keras.Model(q, layer(q, q, use_causal_mask=True))
    x = RNG.normal(size=(2, 6, 16)).astype("float32")
    path = str(tmp_path / "gqa.keras")
    model.save(path)
    revived = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(np_(revived(x)), np_(model(x)), atol=1e-6)
