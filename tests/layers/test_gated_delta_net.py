"""`GatedDeltaNet` (Qwen3-Next / Qwen 3.5's gated delta rule mixer): the
shared harness; keras-hub's `Qwen3_5GatedDeltaNet` with its weights
copied as they are (`set_weights(hub.get_weights())`) and its config;
the NumPy layer (`tests/gated_delta_reference.py`); cached decoding,
token by token and after the prefill of a right-padded buffer (where
keras-hub's cached prefill runs over the padding); packed documents;
the implied attention matrix and `collect_attention`; argument errors;
low precision. Random masks and documents: the properties in
`tests/properties/test_gated_delta_rule_property.py`."""

import gated_delta_reference as ref
import keras
import numpy as np
import pytest
from harness import run_layer_test
from harness import run_mask_test
from keras import ops

from keras_attention.layers import GatedDeltaNet
from keras_attention.visualization import collect_attention

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(39)
CONFIG = dict(
    hidden_size=8,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=4,
    linear_value_head_dim=3,
)
X = RNG.normal(size=(2, 7, 8)).astype("float32")
# Row 0 left-padded, row 1 right-padded (a prompt buffer).
MASK = np.array([[False, False] + [True] * 5, [True] * 4 + [False] * 3])


def np_(x):
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def _jit(fn):
    """`fn` under `jax.jit` on JAX (one compiled program instead of one
    per operation and shape), as it is elsewhere."""
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn


def _layer(chunk_size=3, dtype=None, **kwargs):
    layer = GatedDeltaNet(
        **dict(CONFIG, **kwargs), chunk_size=chunk_size, dtype=dtype
    )
    layer.build((None, None, X.shape[-1]))
    rng = np.random.default_rng(1)
    # Non-trivial norm scale, decays and biases (ones and zeros hide
    # mistakes).
    layer.set_weights(
        [
            (0.6 * rng.normal(size=w.shape)).astype("float32")
            for w in layer.weights
        ]
    )
    return layer


# --- The shared harness ------------------------------------------------------


def test_harness():
    run_layer_test(
        GatedDeltaNet,
        dict(CONFIG, chunk_size=4),
        dict(inputs=X),
        expected_output_shape=X.shape,
        expected_num_trainable_weights=9,
        run_saved_model=False,  # test_saved_model (slow tier)
    )


@pytest.mark.tf_only("the export is the TensorFlow part's check")
@pytest.mark.slow(
    "the SavedModel export in a fresh process (~6 s); the fast tier runs "
    "every other harness check (`.keras` included) and the op in a "
    "TensorFlow graph of unknown length (tests/ops)"
)
def test_saved_model():
    run_layer_test(
        GatedDeltaNet,
        dict(CONFIG, chunk_size=4),
        dict(inputs=X),
        run_fit=False,
        run_mixed_precision=False,
    )


def test_masks():
    run_mask_test(
        GatedDeltaNet,
        dict(CONFIG, chunk_size=4),
        ("inputs",),
        ("mask",),
        causal=True,
    )


# --- keras-hub and the NumPy layer -------------------------------------------


@pytest.mark.skipif(
    BACKEND == "jax",
    reason="keras-hub's layer pads to its chunk of 64 and unrolls its "
    "63-step correction loop: ~7 s to compile on JAX; the op-level "
    "comparison with keras-hub (tests/ops/test_gated_delta_rule.py) and "
    "the NumPy layer run on JAX",
)
def test_equals_keras_hub_with_its_weights_and_config():
    from keras_hub.src.models.qwen3_5.qwen3_5_gated_delta_net import (
        Qwen3_5GatedDeltaNet,
    )

    hub = Qwen3_5GatedDeltaNet(**CONFIG, linear_conv_kernel_dim=4)
    hub.build((None, None, 8))
    rng = np.random.default_rng(2)
    hub.set_weights(
        [
            (0.6 * rng.normal(size=w.shape)).astype("float32")
            for w in hub.weights
        ]
    )
    # Its config builds ours, and its weights load as they are.
    ours = GatedDeltaNet.from_config(hub.get_config())
    ours.build((None, None, 8))
    ours.set_weights(hub.get_weights())
    assert [w.path.split("/", 1)[1] for w in ours.weights] == [
        w.path.split("/", 1)[1] for w in hub.weights
    ]
    # Row 0 left-padded, row 1 right-padded: equal outputs on the real
    # tokens (keras-hub zeroes padded inputs; ours takes them out).
    want = np_(_jit(lambda x, m: hub(x, attention_mask=m))(X, MASK))
    got = np_(ours(X, mask=MASK))
    np.testing.assert_allclose(got[MASK], want[MASK], rtol=1e-5, atol=1e-5)
    assert np.all(got[~MASK] == 0.0)


def test_equals_the_numpy_layer():
    layer = _layer()
    segments = np.array([[0, 0, 0, 1, 1, 1, 1], [2, 2, 3, 3, 3, 3, 3]])
    mask = MASK.copy()
    mask[0, 4] = False  # padding inside a row too
    out = np_(layer(X, mask=mask, segment_ids=segments))
    want, _, _ = ref.layer(ref.layer_weights(layer), CONFIG, X, mask, segments)
    np.testing.assert_allclose(out[mask], want[mask], rtol=1e-5, atol=1e-5)


# --- Cached decoding ----------------------------------------------------------


def test_cached_decoding_equals_the_whole_sequence():
    layer = _layer()
    whole = np_(layer(X, mask=MASK))
    # A prefill of 3 tokens, then token by token; padded steps (masked)
    # leave the cache as it is.
    cache = layer.init_cache(2)
    out, cache = layer(X[:, :3], mask=MASK[:, :3], cache=cache)
    pieces = [np_(out)]
    shapes = [tuple(c.shape) for c in cache]
    for t in range(3, 7):
        out, cache = layer(
            X[:, t : t + 1],
            mask=MASK[:, t : t + 1],
            cache=cache,
            cache_update_index=t,
        )
        pieces.append(np_(out))
        assert [tuple(c.shape) for c in cache] == shapes  # O(1) per token
    np.testing.assert_allclose(
        np.concatenate(pieces, 1), whole, rtol=1e-5, atol=1e-5
    )
    assert keras.backend.standardize_dtype(cache[1].dtype) == "float32"


def test_prefill_of_a_right_padded_buffer_continues_each_prompt():
    # Prompts of 4 and 7 tokens in a buffer of 7, then one more token for
    # row 0: its output is that of the prompt followed by the token, as if
    # the padding were not there (no convolution over it, no decay). The
    # cache after the prefill is the cache of the real tokens alone.
    layer = _layer()
    mask = np.array([[True] * 4 + [False] * 3, [True] * 7])
    empty = layer.init_cache(2)
    _, cache = layer(X, mask=mask, cache=empty)
    token = RNG.normal(size=(2, 1, 8)).astype("float32")
    step, _ = layer(token, cache=cache, cache_update_index=4)
    longer = X.copy()
    longer[0, 4] = token[0, 0]
    mask[0, 4] = True
    want = np_(layer(longer, mask=mask))[0, 4]
    np.testing.assert_allclose(np_(step)[0, 0], want, rtol=1e-5, atol=1e-5)
    mask[0, 4] = False
    _, _, alone = ref.layer(
        ref.layer_weights(layer), CONFIG, X, mask, cache=[np_(c) for c in empty]
    )
    for got, expected in zip(cache, alone):
        np.testing.assert_allclose(np_(got), expected, rtol=1e-5, atol=1e-6)


def test_packed_documents_equal_documents_one_by_one():
    layer = _layer()
    segments = np.array([[0, 0, 0, 1, 1, 1, 1], [2, 2, 3, 3, 3, 3, 3]])
    packed = np_(layer(X, segment_ids=segments))
    # Each document alone: its row with every other token padded out (two
    # documents per row, in a batch of two).
    for row, spans in ((0, [(0, 3), (3, 7)]), (1, [(0, 2), (2, 7)])):
        masks = np.zeros((2, 7), bool)
        for i, (a, b) in enumerate(spans):
            masks[i, a:b] = True
        alone = np_(layer(X[[row, row]], mask=masks))
        for i, (a, b) in enumerate(spans):
            np.testing.assert_allclose(
                packed[row, a:b], alone[i, a:b], rtol=1e-5, atol=1e-5
            )


# --- The attention matrix ---------------------------------------------------


def test_attention_matrix_and_collect_attention():
    layer = _layer()
    out, weights = layer(X, mask=MASK, return_attention_scores=True)
    weights = np_(weights)
    assert weights.shape == (2, 2, 7, 7)
    assert np.all(np.triu(weights, 1) == 0.0)
    np.testing.assert_allclose(np_(out), np_(layer(X, mask=MASK)), atol=1e-6)
    _, want, _ = ref.layer(ref.layer_weights(layer), CONFIG, X, MASK)
    np.testing.assert_allclose(weights, want, rtol=1e-4, atol=1e-5)
    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, layer(inputs))
    maps = collect_attention(model, X)
    (name,) = maps
    np.testing.assert_allclose(
        maps[name], np_(layer(X, return_attention_scores=True)[1]), atol=1e-6
    )
    assert maps.metadata[name]["causal"] is True
    with pytest.raises(ValueError, match="max_dense_length=4"):
        collect_attention(model, X, max_dense_length=4)


# --- Errors and precision -----------------------------------------------------


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(linear_num_value_heads=3, linear_num_key_heads=2), "multiple"),
        (dict(hidden_size=0), "`hidden_size` must be a positive integer"),
        (dict(linear_conv_kernel_dim=1.5), "`linear_conv_kernel_dim`"),
        (dict(hidden_activation="nope"), "`hidden_activation`"),
        (dict(layer_norm_epsilon=-1.0), "`layer_norm_epsilon`"),
        (dict(chunk_size=0), "`chunk_size` must be a positive integer"),
    ],
)
def test_bad_arguments_are_refused(change, match):
    with pytest.raises(ValueError, match=match):
        GatedDeltaNet(**dict(CONFIG, **change))


def test_bad_calls_are_refused():
    layer = _layer()
    cache = layer.init_cache(2)
    with pytest.raises(ValueError, match="`cache` must be a pair"):
        layer(X, cache=cache[0])
    with pytest.raises(ValueError, match=r"`cache\[0\]` must have shape"):
        layer(X, cache=(cache[0][:, :1], cache[1]))
    with pytest.raises(ValueError, match=r"`cache\[1\]` must have shape"):
        layer(X, cache=(cache[0], cache[1][:, :1]))
    with pytest.raises(ValueError, match="cannot apply to a cached call"):
        layer(X, cache=cache, return_attention_scores=True)
    with pytest.raises(ValueError, match="`cache_update_index` needs"):
        layer(X, cache_update_index=0)
    with pytest.raises(ValueError, match="`mask` must be a boolean mask"):
        layer(X, mask=MASK[:, :3])
    with pytest.raises(ValueError, match="`inputs` must have 8 features"):
        layer(X[..., :5])
    with pytest.raises(ValueError, match="`segment_ids` must have shape"):
        layer(X, segment_ids=np.zeros((2, 3), "int32"))
    with pytest.raises(TypeError, match="`segment_ids` must hold integers"):
        layer(X, segment_ids=np.zeros((2, 7), "float32"))


def test_bfloat16_layer_keeps_a_float32_state():
    layer = _layer(dtype="mixed_bfloat16")
    conv, state = layer.init_cache(2)
    assert keras.backend.standardize_dtype(conv.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(state.dtype) == "float32"
    out, (conv, state) = layer(X, mask=MASK, cache=(conv, state))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(state.dtype) == "float32"
    full = _layer()
    _, (_, want) = full(X, mask=MASK, cache=full.init_cache(2))
    np.testing.assert_allclose(np_(state), np_(want), atol=0.1)
