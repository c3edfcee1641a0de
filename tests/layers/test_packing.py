"""Packed sequences: `segment_ids=` on the self-attention layers and the
blocks, positions that restart per document, and RoPE scaling.

- a packed batch gives the outputs and the weight gradients of its
  documents run one by one (dense and blockwise paths; rotary positions
  restarted by `segment_positions`);
- `segment_positions` against a NumPy loop;
- `RotaryEmbedding`'s `positions=`, `scaling_factor` / `rope_type`
  (linear, dynamic, YaRN) and `sequence_axis` / `feature_axis` equal
  keras-hub's `RotaryEmbedding`;
- argument errors.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import blocks
from keras_attention import layers as ka
from keras_attention import masks
from keras_attention.ops import attention as attention_lib

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(21)
F = 8
LENGTHS = [3, 5, 4]
T = sum(LENGTHS)
IDS = np.repeat(np.arange(len(LENGTHS)), LENGTHS)[None].astype("int32")
X = RNG.normal(size=(1, T, F)).astype("float32")


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def pieces(x):
    starts = np.cumsum([0] + LENGTHS[:-1])
    return [x[:, s : s + n] for s, n in zip(starts, LENGTHS)]


LAYERS = {
    "SelfAttention": lambda: ka.SelfAttention(
        2, 4, causal=True, rotary_max_wavelength=100
    ),
    "LocalSelfAttention": lambda: ka.LocalSelfAttention(
        2, 4, window_size=(2, 1), block_size=2
    ),
    "TransformerEncoderBlock": lambda: blocks.TransformerEncoderBlock(
        2, 16, rotary_max_wavelength=100
    ),
    "TransformerDecoderBlock": lambda: blocks.TransformerDecoderBlock(
        2, 16, cross_attention=False, rotary_max_wavelength=100
    ),
}


def _out(y):
    return y[0] if isinstance(y, (tuple, list)) else y


def _build(layer):
    """Builds `layer` for `X`: symbolically on JAX (no eager op compiled),
    by a call elsewhere."""
    if layer.built:
        return
    if BACKEND == "jax":
        layer(keras.KerasTensor(X.shape))
    else:
        layer(X)


def _outputs(layer, calls):
    """`_out(layer(x, **kw))` for each `(x, kw)` of `calls`, as NumPy. On
    JAX each call is one jitted program (eager JAX compiles every op for
    every document's length): the layer is built symbolically first."""
    if BACKEND != "jax":
        return [np_(_out(layer(x, **kw))) for x, kw in calls]
    import jax

    _build(layer)
    return [np_(jax.jit(lambda: _out(layer(x, **kw)))()) for x, kw in calls]


@pytest.mark.parametrize("path", ["dense", "blockwise"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_packed_batch_equals_documents_one_by_one(name, path):
    layer = LAYERS[name]()
    options = dict(query_block=4, key_block=4) if path == "blockwise" else {}
    with attention_lib.implementation_scope(
        None if path == "dense" else path, **options
    ):
        (packed,) = _outputs(layer, [(X, dict(segment_ids=IDS))])
    alone = _outputs(layer, [(x, {}) for x in pieces(X)])
    np.testing.assert_allclose(packed, np.concatenate(alone, 1), atol=2e-5)


def _weight_gradients(layer, inputs_and_kwargs):
    """Gradients of sum(out^2) summed over calls, w.r.t. the weights."""
    weights = layer.trainable_weights
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = 0.0
            for x, kw in inputs_and_kwargs:
                loss += tf.reduce_sum(_out(layer(x, **kw)) ** 2)
        return [np_(g) for g in tape.gradient(loss, weights)]
    if BACKEND == "jax":
        import jax

        def loss(values):
            mapping = list(zip(weights, values))
            total = 0.0
            with keras.StatelessScope(state_mapping=mapping):
                for x, kw in inputs_and_kwargs:
                    total += ops.sum(_out(layer(x, **kw)) ** 2)
            return total

        # One compiled program (eager JAX compiles every op of the forward
        # and backward passes for every document's length).
        grads = jax.jit(jax.grad(loss))([w.value for w in weights])
        return [np_(g) for g in grads]
    for w in weights:
        w.value.grad = None
    loss = sum(
        ops.sum(_out(layer(x, **kw)) ** 2) for x, kw in inputs_and_kwargs
    )
    loss.backward()
    return [np_(w.value.grad) for w in weights]


def test_packed_gradients_equal_the_documents_gradients():
    layer = LAYERS["SelfAttention"]()
    _build(layer)
    packed = _weight_gradients(layer, [(X, dict(segment_ids=IDS))])
    alone = _weight_gradients(layer, [(x, {}) for x in pieces(X)])
    for a, b in zip(packed, alone):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_padded_tokens_do_not_change_the_documents():
    ids = np.concatenate([IDS, -np.ones((1, 3), "int32")], 1)
    x = np.concatenate([X, RNG.normal(size=(1, 3, F)) * 100], 1)
    valid = ids >= 0
    layer = LAYERS["SelfAttention"]()
    out, ref = _outputs(
        layer,
        [
            (x.astype("float32"), dict(mask=valid, segment_ids=ids)),
            (X, dict(segment_ids=IDS)),
        ],
    )
    np.testing.assert_allclose(out[:, :T], ref, atol=2e-5)


def test_segment_positions_restart_in_each_document():
    rng = np.random.default_rng(0)
    for _ in range(20):
        ids = np.sort(rng.integers(0, 5, size=(3, 17)), axis=1)
        want = np.zeros_like(ids)
        for b in range(3):
            for i in range(1, 17):
                same = ids[b, i] == ids[b, i - 1]
                want[b, i] = want[b, i - 1] + 1 if same else 0
        np.testing.assert_array_equal(np_(masks.segment_positions(ids)), want)
    np.testing.assert_array_equal(
        np_(masks.segment_positions(np.array([4, 4, 2]))), [0, 1, 0]
    )


def test_segment_positions_in_a_model_of_unknown_length():
    # `fit` on padded batches traces with (None, None) shapes: the
    # positions must not need the static length (it used to crash).
    ids = keras.Input((None,), dtype="int32")
    model = keras.Model(ids, masks.segment_positions(ids))
    got = model.predict(np.array([[7, 7, 1, 1, 1, 3]], "int32"), verbose=0)
    np.testing.assert_array_equal(got, [[0, 1, 0, 1, 2, 0]])
    assert keras.backend.standardize_dtype(got.dtype) == "int32"
    if keras.backend.backend() == "tensorflow":  # the shape stays known
        import tensorflow as tf

        @tf.function
        def shape_of(x):
            return masks.segment_positions(x).shape

        assert tuple(shape_of(tf.zeros((2, 5), "int32"))) == (2, 5)


def test_segment_ids_are_checked():
    layer = ka.SelfAttention(2, 4)
    with pytest.raises(ValueError, match="segment_ids"):
        layer(X, segment_ids=IDS[:, :-1])
    with pytest.raises(TypeError, match="segment_ids"):
        layer(X, segment_ids=IDS.astype("float32"))
    mha = ka.MultiHeadAttention(2, 4)
    with pytest.raises(ValueError, match="segment_ids"):
        mha(X, X[:, :5], segment_ids=IDS)


# RotaryEmbedding against keras-hub -------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(scaling_factor=4.0),
        dict(scaling_factor=4.0, rope_type="dynamic"),
        dict(scaling_factor=8.0, rope_type="yarn"),
        dict(
            scaling_factor=2.0,
            rope_type="yarn",
            beta_fast=16.0,
            beta_slow=2.0,
            original_max_position_embeddings=256,
            truncate=False,
        ),
        dict(sequence_axis=2, feature_axis=1),
    ],
)
def test_rotary_equals_keras_hub(kwargs):
    keras_hub = pytest.importorskip("keras_hub")
    x = RNG.normal(size=(2, 16, 3, 6)).astype("float32")
    if kwargs.get("feature_axis") == 1:
        x = RNG.normal(size=(2, 16, 6)).astype("float32")
    ours = ka.RotaryEmbedding(max_wavelength=500, **kwargs)
    theirs = keras_hub.layers.RotaryEmbedding(max_wavelength=500, **kwargs)
    np.testing.assert_allclose(
        np_(ours(x, start_index=3)), np_(theirs(x, start_index=3)), atol=2e-5
    )
    positions = RNG.integers(0, 40, size=(2, x.shape[ours._axes(x.shape)[0]]))
    np.testing.assert_allclose(
        np_(ours(x, positions=positions)),
        np_(theirs(x, positions=positions)),
        atol=2e-5,
    )
    revived = ka.RotaryEmbedding.from_config(ours.get_config())
    np.testing.assert_allclose(np_(revived(x)), np_(ours(x)), atol=0)


def test_rotary_positions_equal_start_index():
    rope = ka.RotaryEmbedding()
    x = RNG.normal(size=(2, 5, 2, 8)).astype("float32")
    np.testing.assert_allclose(
        np_(rope(x, positions=np.arange(7, 12))),
        np_(rope(x, start_index=7)),
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(scaling_factor=0.5), "scaling_factor"),
        (dict(rope_type="ntk"), "rope_type"),
        (dict(sequence_axis=1.5), "sequence_axis"),
        (dict(original_max_position_embeddings=0), "original_max"),
    ],
)
def test_rotary_arguments_are_checked(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=name):
        ka.RotaryEmbedding(**kwargs)
    with pytest.raises(ValueError, match="positions"):
        ka.RotaryEmbedding()(np.ones((1, 3, 4)), positions=np.ones((1, 1, 3)))


# The position layers' positions= (keras-hub's argument) -----------------


def test_position_layers_take_positions_like_keras_hub():
    keras_hub = pytest.importorskip("keras_hub")
    x = RNG.normal(size=(2, 6, 8)).astype("float32")
    positions = np.array([[0, 1, 2, 0, 1, 0], [3, 4, 5, 6, 7, 8]])
    ours = ka.SinusoidalPositionEncoding()
    theirs = keras_hub.layers.SinePositionEncoding()
    np.testing.assert_allclose(
        np_(ours(x, positions=positions)),
        np_(theirs(x, positions=positions)),
        atol=1e-5,
    )
    np.testing.assert_allclose(
        np_(ours(x, positions=np.arange(2, 8))),
        np_(ours(x, start_index=2)),
        atol=1e-6,
    )
    table = ka.PositionEmbedding(sequence_length=10)
    table(x)
    got = np_(table(x, positions=positions))
    rows = np_(table.position_embeddings)[positions]
    np.testing.assert_allclose(got, rows, atol=0)
    np.testing.assert_allclose(
        np_(table(x, positions=np.arange(6))), np_(table(x)), atol=0
    )
    with pytest.raises(ValueError, match="positions"):
        table(x, positions=np.zeros((1, 1, 6), "int32"))
