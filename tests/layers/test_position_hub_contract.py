"""keras-hub 0.32's own position-layer scenarios, as a drop-in contract.

Every scenario of keras-hub's tests of `RotaryEmbedding`,
`SinePositionEncoding`, `PositionEmbedding` and `TokenAndPositionEmbedding`
(`keras_hub/src/layers/modeling/*_test.py`) restated against our layers:
construction with keras-hub's arguments (positional order included),
shapes of rank 3 and 4 (static and dynamic), float16, callable
initializers, `start_index` step by step, `positions=`, the permuted axes
of rotary, RoPE scaling, and the mask. Where a scenario has numbers, our
layer (holding keras-hub's weights where it has any) is compared with
keras-hub's layer on the same input, and with keras-hub's own expected
values where the test has them.
"""

import inspect

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.layers import PositionEmbedding
from keras_attention.layers import RotaryEmbedding
from keras_attention.layers import SinusoidalPositionEncoding
from keras_attention.layers import TokenAndPositionEmbedding

hub = pytest.importorskip("keras_hub")
HubRotary = hub.layers.RotaryEmbedding
HubSine = hub.layers.SinePositionEncoding
HubPosition = hub.layers.PositionEmbedding
HubTokenAndPosition = hub.layers.TokenAndPositionEmbedding

RNG = np.random.default_rng(5)
OURS = {
    "rotary": RotaryEmbedding,
    "sine": SinusoidalPositionEncoding,
    "position": PositionEmbedding,
}
THEIRS = {"rotary": HubRotary, "sine": HubSine, "position": HubPosition}
ARGS = {"rotary": {}, "sine": {}, "position": {"sequence_length": 128}}


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def data(*shape):
    return RNG.uniform(size=shape).astype("float32")


def twins(kind, **kwargs):
    """Our layer and keras-hub's, built on the same input shape, ours
    holding keras-hub's weights."""
    kwargs = {**ARGS[kind], **kwargs}
    return OURS[kind](**kwargs), THEIRS[kind](**kwargs)


def assert_same(ours, theirs, x, **call):
    theirs_out = theirs(x, **call)
    ours(x, **call)
    ours.set_weights(theirs.get_weights())
    np.testing.assert_allclose(
        np_(ours(x, **call)), np_(theirs_out), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("kind", sorted(OURS))
@pytest.mark.parametrize("shape", [(2, 4, 6), (1, 2, 4, 6), (2, 8, 4, 6)])
def test_layer_behaviors_rank_3_and_4(kind, shape):
    # keras-hub: test_layer_behaviors, test_layer_behaviors_4d.
    ours, theirs = twins(kind)
    x = data(*shape)
    assert tuple(ours(x).shape) == shape
    assert_same(ours, theirs, x)
    assert len(ours.trainable_weights) == len(theirs.trainable_weights)


@pytest.mark.parametrize("kind", sorted(OURS))
@pytest.mark.parametrize(
    "shape", [(100, 32), (None, 32), (None, 100, 32), (None, None, 30)]
)
def test_symbolic_output_shapes(kind, shape):
    # keras-hub: test_static_layer_output_shape,
    # test_dynamic_layer_output_shape, test_multi_dimension_layer_output_shape,
    # test_more_than_3_dimensions_dynamic.
    ours, theirs = twins(kind)
    inputs = keras.Input(shape=shape)
    assert ours(inputs).shape == theirs(inputs).shape == (None,) + shape


@pytest.mark.parametrize("kind", sorted(OURS))
def test_float16_dtype(kind):
    # keras-hub: test_float16_dtype.
    ours, _ = twins(kind, dtype="float16")
    outputs = ours(keras.Input(shape=(21, 32)))
    assert outputs.shape == (None, 21, 32)
    assert outputs.dtype == "float16"


@pytest.mark.parametrize("kind", sorted(OURS))
def test_start_index_step_by_step_equals_the_full_pass(kind):
    # keras-hub: test_start_index.
    ours, theirs = twins(kind)
    x = data(2, 3, 4)
    full = np_(ours(x))
    steps = [np_(ours(x[:, i : i + 1], start_index=i)) for i in range(3)]
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-6)
    assert_same(ours, theirs, x[:, 1:2], start_index=1)


def test_dynamic_layer_slicing_in_a_model():
    # keras-hub: PositionEmbedding.test_dynamic_layer_slicing.
    inputs = keras.Input(shape=(None, 30))
    model = keras.Model(inputs, PositionEmbedding(sequence_length=40)(inputs))
    out = model.predict(np.ones((1, 17, 30)), verbose=0)
    assert out.shape == (1, 17, 30)


def custom_init(shape, dtype=None):
    count = int(np.prod(shape))
    return ops.reshape(ops.arange(count, dtype=dtype), shape)


def test_callable_initializer():
    # keras-hub: PositionEmbedding.test_callable_initializer.
    inputs = keras.Input(shape=(4, 3))
    layer = PositionEmbedding(sequence_length=4, initializer=custom_init)
    model = keras.Model(inputs, layer(inputs))
    out = model.predict(np.zeros((2, 4, 3)), verbose=0)
    expected = np.broadcast_to(np.arange(12).reshape(4, 3), (2, 4, 3))
    np.testing.assert_allclose(out, expected)


def test_callable_initializer_of_token_and_position_embedding():
    layer = TokenAndPositionEmbedding(
        5, 4, 3, embeddings_initializer=custom_init
    )
    out = np_(layer(np.array([[0, 4]])))
    tokens = np.arange(15).reshape(5, 3)
    positions = np.arange(12).reshape(4, 3)
    np.testing.assert_allclose(out[0], tokens[[0, 4]] + positions[:2])


def test_sine_correct_values():
    # keras-hub: SinePositionEncoding.test_output_correct_values.
    out = np_(SinusoidalPositionEncoding()(data(1, 4, 6)))
    expected_3 = [0.14112, -0.98999, 0.13879, 0.99032, 0.00646, 0.99997]
    np.testing.assert_allclose(out[0, 0], [0, 1, 0, 1, 0, 1], atol=0.01)
    np.testing.assert_allclose(out[0, 3], expected_3, atol=0.01, rtol=0.01)


def test_rotary_correct_values():
    # keras-hub: RotaryEmbedding.test_output_correct_values.
    model = keras.Sequential([keras.Input(shape=(4, 6)), RotaryEmbedding()])
    out = np_(model(np.ones((1, 4, 6), "float32")))
    expected_3 = [-1.1311, 0.8515, 0.9935, -0.8489, 1.1291, 1.0064]
    np.testing.assert_allclose(out[0, 0], np.ones(6), atol=0.01)
    np.testing.assert_allclose(out[0, 3], expected_3, atol=0.01, rtol=0.01)


def test_rotary_permuted_axes():
    # keras-hub: RotaryEmbedding.test_permuted_axes.
    x = data(2, 3, 4)
    out = np_(RotaryEmbedding(3)(x))
    permuted = RotaryEmbedding(3, sequence_axis=-1, feature_axis=-2)(
        np.transpose(x, (0, 2, 1))
    )
    np.testing.assert_allclose(
        out, np.transpose(np_(permuted), (0, 2, 1)), atol=1e-6
    )


def test_rotary_positions_array():
    # keras-hub: RotaryEmbedding.test_positions_array (Flax reference):
    # both positions 0, so the output is the input.
    x = np.random.default_rng(0).standard_normal((1, 2, 1, 16))
    x = x.astype("float32")
    positions = np.array([0.0, 0.0], "float32")
    ours = np_(RotaryEmbedding()(x, positions=positions))
    np.testing.assert_allclose(ours, np_(HubRotary()(x, positions=positions)))
    np.testing.assert_allclose(ours, x, atol=1e-6)


# keras-hub: test_rope_scaling (HF Llama linear scaling, factor 2) and
# test_rope_scaling_with_kv_cache (factor 5, index 12): the last row.
SCALING = [
    (2.0, (1, 3, 2, 4), 0, [-0.301168621, 0.98995018, 1.381773233, 1.00995]),
    (5.0, (1, 1, 2, 4), 12, [-1.412856817, 0.975714266, -0.0619307, 1.02371]),
]


@pytest.mark.parametrize("factor, shape, start, expected_row", SCALING)
def test_rope_scaling(factor, shape, start, expected_row):
    x = np.ones(shape, "float32")
    ours = np_(RotaryEmbedding(scaling_factor=factor)(x, start_index=start))
    theirs = np_(HubRotary(scaling_factor=factor)(x, start_index=start))
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    np.testing.assert_allclose(ours[0, -1, 0], expected_row, atol=1e-5)


@pytest.mark.parametrize("kind", ["position", "sine"])
@pytest.mark.parametrize("batched", [False, True])
def test_positions_argument(kind, batched):
    ours, theirs = twins(kind)
    x = data(2, 5, 8)
    positions = np.array([[3, 1, 0, 4, 2], [0, 1, 2, 0, 1]], "int32")
    positions = positions if batched else positions[0]
    assert_same(ours, theirs, x, positions=positions)


def test_token_and_position_layer_behaviors():
    # keras-hub: TokenAndPositionEmbedding.test_layer_behaviors ("ones":
    # every output is 1 + 1).
    layer = TokenAndPositionEmbedding(
        vocabulary_size=5,
        sequence_length=4,
        embedding_dim=3,
        embeddings_initializer="ones",
    )
    out = np_(layer(RNG.integers(0, 5, size=(2, 4))))
    np.testing.assert_allclose(out, np.full((2, 4, 3), 2.0))
    assert len(layer.trainable_weights) == 2


def test_token_and_position_mask_propagation():
    # keras-hub: TokenAndPositionEmbedding.test_mask_propagation.
    layer = TokenAndPositionEmbedding(5, 4, 3, mask_zero=True)
    ids = np.array([[1, 0], [1, 0]])
    mask = keras.ops.convert_to_numpy(layer.compute_mask(ids))
    np.testing.assert_array_equal(mask, ids != 0)
    symbolic = layer(keras.Input((None,), dtype="int32"))
    assert getattr(symbolic, "_keras_mask", None) is not None


@pytest.mark.parametrize("tie_weights", [True, False])
def test_token_and_position_positional_order_and_weights(tie_weights):
    # keras-hub's order: (vocabulary_size, sequence_length, embedding_dim,
    # tie_weights, embeddings_initializer, mask_zero): the same positional
    # call means the same layer, with the same weights and logits.
    args = (7, 6, 4, tie_weights, "uniform", True)
    ours = TokenAndPositionEmbedding(*args)
    theirs = HubTokenAndPosition(*args)
    assert ours.tie_weights is tie_weights and ours.mask_zero is True
    ids = np.array([[3, 1, 0, 2]])
    theirs_out = np_(theirs(ids))
    ours(ids)
    assert [w.shape for w in ours.weights] == [w.shape for w in theirs.weights]
    ours.set_weights(theirs.get_weights())
    np.testing.assert_allclose(np_(ours(ids)), theirs_out, atol=1e-6)
    hidden = data(1, 4, 4)
    np.testing.assert_allclose(
        np_(ours.token_embedding(hidden, reverse=True)),
        np_(theirs.token_embedding(hidden, reverse=True)),
        atol=1e-6,
    )
    positions = np.array([[2, 0, 1, 3]])
    np.testing.assert_allclose(
        np_(ours(ids, positions=positions)),
        np_(theirs(ids, positions=positions)),
        atol=1e-6,
    )


def test_token_and_position_config_round_trip_keeps_tie_weights():
    layer = TokenAndPositionEmbedding(7, 6, 4, False, mask_zero=True)
    clone = TokenAndPositionEmbedding.from_config(layer.get_config())
    assert clone.tie_weights is False and clone.mask_zero is True
    clone(np.array([[1, 2]]))
    assert len(clone.trainable_weights) == 3  # tokens, reverse, positions


def _positional(cls):
    """`(name, default)` of each argument of `cls.__init__` that can be
    passed by position, in order."""
    kinds = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )
    params = inspect.signature(cls.__init__).parameters.values()
    return [(p.name, p.default) for p in params if p.kind in kinds][1:]


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (RotaryEmbedding, HubRotary),
        (SinusoidalPositionEncoding, HubSine),
        (PositionEmbedding, HubPosition),
        (TokenAndPositionEmbedding, HubTokenAndPosition),
    ],
)
def test_positional_signature_starts_with_keras_hubs(ours, theirs):
    # The same positional call means the same layer: keras-hub's
    # arguments first, in keras-hub's order (ours may follow).
    theirs_args = _positional(theirs)
    assert _positional(ours)[: len(theirs_args)] == theirs_args


# keras-hub's `denominator_dim` (Gemma 4: the head size, larger than the
# rotated part): theta_k = max_wavelength ** (-2k / denominator_dim).
@pytest.mark.parametrize("denominator_dim", [None, 4, 8, 12, 32])
@pytest.mark.parametrize("rope_type", ["linear", "dynamic"])
def test_rotary_denominator_dim_equals_keras_hub(denominator_dim, rope_type):
    x = data(2, 5, 3, 8)
    # Positionally: keras-hub's 10 arguments in keras-hub's order.
    args = (500, 2.0, rope_type, 32.0, 1.0, 4096, True, 1, -1)
    args = args + (denominator_dim,)
    ours, theirs = RotaryEmbedding(*args), HubRotary(*args)
    assert ours.denominator_dim == denominator_dim
    for call in (
        dict(start_index=3),
        dict(positions=np.array([4, 0, 1, 9, 2])),
    ):
        np.testing.assert_allclose(
            np_(ours(x, **call)), np_(theirs(x, **call)), atol=2e-5
        )
    revived = RotaryEmbedding.from_config(ours.get_config())
    assert revived.denominator_dim == denominator_dim
    # A keras-hub config loads into ours.
    from_hub = RotaryEmbedding.from_config(theirs.get_config())
    np.testing.assert_allclose(np_(from_hub(x)), np_(ours(x)), atol=0)
