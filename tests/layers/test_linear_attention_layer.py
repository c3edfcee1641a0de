"""`LinearAttention`: the shared harness and mask test, the whole layer
against a NumPy reference (projections, the recurrence of
`tests/linear_attention_reference.py`, the output norm) for each decay,
decoding token by token from the cache, a left-padded prompt, the
implied attention weights and `collect_attention`, a callable feature
map in the config, and argument errors."""

import keras
import linear_attention_reference as ref
import numpy as np
import pytest
from harness import run_layer_test
from harness import run_mask_test
from keras import ops

from keras_attention.layers import LinearAttention
from keras_attention.layers.linear_attention import retention_log_decays
from keras_attention.visualization import collect_attention

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(39)
HIDDEN = 8
X = RNG.normal(size=(2, 7, HIDDEN)).astype("float32")
VALID = np.array([[True] * 7, [True] * 5 + [False] * 2])


def np_(x):
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def _layer(**kwargs):
    kwargs = dict(dict(num_heads=2, key_dim=4, value_dim=3), **kwargs)
    layer = LinearAttention(**kwargs)
    layer.build(X.shape)
    rng = np.random.default_rng(1)
    for w in layer.weights:  # non-trivial biases and norm scales
        if len(w.shape) == 1 or w.path.endswith("bias"):
            w.assign((1 + 0.3 * rng.normal(size=w.shape)).astype(w.dtype))
    return layer


_JITTED = {}


def _call(layer, x, **kwargs):
    """`layer(x, **kwargs)`; on JAX through `jax.jit`, compiled once per
    layer and arguments (eager JAX compiles every op for every new
    shape)."""
    if BACKEND != "jax":
        return layer(x, **kwargs)
    import jax

    tensors = {k: v for k, v in kwargs.items() if hasattr(v, "shape")}
    static = {k: v for k, v in kwargs.items() if k not in tensors}
    key = (id(layer), tuple(sorted(static.items())), tuple(sorted(tensors)))
    if key not in _JITTED:

        def run(trainable, non_trainable, x, tensors):
            return layer.stateless_call(
                trainable, non_trainable, x, **tensors, **static
            )[0]

        _JITTED[key] = jax.jit(run)
    return _JITTED[key](
        [v.value for v in layer.trainable_variables],
        [v.value for v in layer.non_trainable_variables],
        x,
        tensors,
    )


# --- The shared harness ------------------------------------------------------


def test_harness():
    run_layer_test(
        LinearAttention,
        dict(num_heads=2, key_dim=4, decay="gated", chunk_size=4),
        dict(query=X),
        call_kwargs=dict(use_causal_mask=True),
        expected_output_shape=X.shape,
        expected_num_trainable_weights=11,
        expected_num_seed_generators=0,
    )


# On JAX in the slow tier: 9 s of eager compiles for checks that do not
# depend on the backend (config, weights layout, output specs).
def _slow_on_jax(test):
    if BACKEND != "jax":
        return test
    return pytest.mark.slow("the second harness case; the first runs on JAX")(
        test
    )


@_slow_on_jax
def test_harness_normalised_retention_without_bias():
    """The other weights layout (no gate, no norm, no biases); the
    first case runs SavedModel, `fit` and mixed precision."""
    run_layer_test(
        LinearAttention,
        dict(
            num_heads=2,
            key_dim=4,
            value_dim=2,
            feature_map="relu",
            normalize=True,
            decay="retention",
            use_bias=False,
            chunk_size=3,
        ),
        dict(query=X),
        call_kwargs=dict(use_causal_mask=True, return_attention_scores=True),
        expected_output_shape=(X.shape, (2, 2, 7, 7)),
        expected_num_trainable_weights=4,
        run_saved_model=False,
        run_fit=False,
        run_mixed_precision=False,
    )


def test_masks():
    run_mask_test(
        LinearAttention,
        dict(num_heads=2, key_dim=4, decay="gated", chunk_size=4),
        ("query",),
        ("query_mask",),
        call_kwargs=dict(use_causal_mask=True),
        causal=True,
    )


# --- An independent NumPy reference ------------------------------------------


def _dense(dense, x):
    kernel = np_(dense.kernel).astype("float64")
    y = np.einsum(dense.equation, x, kernel)
    return y if dense.bias is None else y + np_(dense.bias)


def layer_reference(layer, x, valid=None, causal=True, segment_ids=None):
    """The layer in float64 from its equations, and the implied weights."""
    q, k, v = (
        _dense(d, x)
        for d in (layer.query_dense, layer.key_dense, layer.value_dense)
    )
    decay = None
    if layer.decay == "retention":
        decay = retention_log_decays(layer.num_heads)
    elif layer.decay == "gated":
        logits = _dense(layer.decay_gate, x)
        decay = -np.logaddexp(0.0, -logits) / layer.gate_logit_normalizer
    kwargs = dict(
        feature_map=layer.feature_map,
        decay=decay,
        key_mask=valid,
        normalize=layer.normalize,
        segment_ids=segment_ids,
    )
    heads, _, _ = ref.linear_attention(q, k, v, causal=causal, **kwargs)
    weights = ref.weights(q, k, **kwargs) if causal else None
    if valid is not None:
        heads = np.where(valid[..., None, None], heads, 0.0)
        if weights is not None:
            weights = np.where(valid[:, None, :, None], weights, 0.0)
    if layer.output_norm is not None:
        mean_square = np.mean(heads**2, -1, keepdims=True)
        heads = heads / np.sqrt(mean_square + layer.norm_epsilon)
        heads = heads * np_(layer.output_norm.scale)
    return _dense(layer.output_dense, heads), weights


CASES = [
    dict(),
    dict(decay="retention", feature_map="identity"),
    dict(decay="gated", normalize=True, feature_map="relu"),
]


@pytest.mark.parametrize("kwargs", CASES, ids=["plain", "retention", "gated"])
def test_matches_numpy_reference(kwargs):
    layer = _layer(chunk_size=3, **kwargs)
    out, weights = _call(
        layer,
        X,
        query_mask=VALID,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    expected, expected_weights = layer_reference(layer, X, VALID)
    np.testing.assert_allclose(np_(out)[VALID], expected[VALID], atol=2e-5)
    np.testing.assert_allclose(np_(weights), expected_weights, atol=2e-5)


def test_non_causal_and_packed_documents():
    layer = _layer(normalize=True)
    ids = np.array([[0] * 3 + [1] * 4, [2] * 7])
    out = _call(layer, X, segment_ids=ids, query_mask=VALID)
    expected, _ = layer_reference(layer, X, VALID, False, ids)
    np.testing.assert_allclose(np_(out)[VALID], expected[VALID], atol=2e-5)


# --- Decoding ----------------------------------------------------------------


@pytest.mark.parametrize("normalize", [False, True])
def test_cached_decoding_equals_one_call(normalize):
    """A prompt of 3 tokens, then one token at a time: the outputs of
    the whole sequence, and the cache is the final state."""
    layer = _layer(decay="gated", normalize=normalize, feature_map="relu")
    full = np_(_call(layer, X, use_causal_mask=True))
    cache = layer.initial_cache(2)
    assert tuple(cache.shape) == (2, 2, 4, 3 + normalize)
    out, cache = _call(
        layer, X[:, :3], cache=cache, cache_update_index=0, use_causal_mask=True
    )
    steps = [np_(out)]
    for t in range(3, 7):
        out, cache = _call(
            layer,
            X[:, t : t + 1],
            cache=cache,
            cache_update_index=np.int32(t),
            use_causal_mask=True,
        )
        steps.append(np_(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=2e-5)
    assert keras.backend.standardize_dtype(cache.dtype) == "float32"


def test_left_padded_prompt_leaves_the_state_of_the_unpadded_one():
    layer = _layer(decay="gated")
    padded = np.concatenate([RNG.normal(size=(1, 2, HIDDEN)) * 9, X[:1]], 1)
    mask = np.array([[False] * 2 + [True] * 7])
    _, cache = _call(
        layer,
        padded.astype("float32"),
        query_mask=mask,
        cache=layer.initial_cache(1),
        use_causal_mask=True,
    )
    _, expected = _call(
        layer, X[:1], cache=layer.initial_cache(1), use_causal_mask=True
    )
    np.testing.assert_allclose(np_(cache), np_(expected), atol=2e-5)


def test_mixed_precision_cache_stays_float32():
    layer = LinearAttention(2, 4, decay="gated", dtype="mixed_bfloat16")
    y, cache = layer(
        X, cache=np.zeros((2, 2, 4, 4), "float32"), use_causal_mask=True
    )
    assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(cache.dtype) == "float32"
    spec = layer.compute_output_spec(
        keras.KerasTensor(X.shape), cache=keras.KerasTensor((2, 2, 4, 4))
    )
    assert [s.dtype for s in spec] == ["bfloat16", "float32"]


# --- Recording ---------------------------------------------------------------


def test_collect_attention_records_the_implied_weights():
    inputs = keras.Input((7, HIDDEN))
    layer = LinearAttention(2, 4, decay="retention", name="linear")
    x = layer(inputs, use_causal_mask=True)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    maps = collect_attention(model, X)
    assert list(maps) == ["linear"]
    _, weights = layer(X, use_causal_mask=True, return_attention_scores=True)
    np.testing.assert_allclose(maps["linear"], np_(weights), atol=1e-6)
    meta = maps.metadata["linear"]
    assert meta["kind"] == "self" and meta["causal"]
    assert np.all(np.triu(maps["linear"][0, 0], 1) == 0)


# --- Config and errors -------------------------------------------------------


def test_callable_feature_map_round_trips():
    layer = LinearAttention(2, 4, feature_map=keras.activations.softplus)
    y = np_(layer(X, use_causal_mask=True))
    config = keras.saving.serialize_keras_object(layer)
    again = keras.saving.deserialize_keras_object(config)
    assert again.feature_map is keras.activations.softplus
    again.set_weights(layer.get_weights())
    np.testing.assert_allclose(np_(again(X, use_causal_mask=True)), y)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(decay="retnet"), "`decay` must be one of"),
        (dict(feature_map="softmax"), "`feature_map` must be one of"),
        (dict(feature_map="identity", normalize=True), "non-negative"),
        (dict(gate_logit_normalizer=0), "`gate_logit_normalizer` must be"),
        (dict(chunk_size=0), "`chunk_size` must be"),
        (dict(value_dim=2.5), "`value_dim` must be"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinearAttention(**dict(dict(num_heads=2, key_dim=4), **kwargs))


def test_call_errors():
    layer = LinearAttention(2, 4, decay="gated")
    with pytest.raises(ValueError, match="needs `use_causal_mask=True`"):
        layer(X)
    cache = layer.initial_cache(2)
    with pytest.raises(ValueError, match="no per-token keys"):
        layer(
            X, cache=cache, use_causal_mask=True, return_attention_scores=True
        )
    with pytest.raises(ValueError, match="`cache` must have shape"):
        layer(X, cache=np.zeros((2, 2, 4, 5), "float32"), use_causal_mask=True)
    with pytest.raises(ValueError, match="`cache_update_index` must be"):
        layer(X, cache=cache, cache_update_index=-1, use_causal_mask=True)
    with pytest.raises(ValueError, match="`query_mask` must be"):
        layer(X, query_mask=VALID[:, :3], use_causal_mask=True)
