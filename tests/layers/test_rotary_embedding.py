import numpy as np
import pytest
from harness import run_layer_test
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import RotaryEmbedding


def rope_reference(x, positions, max_wavelength=10000):
    """RoFormer rotation of the halves (x1, x2) of the last axis, NumPy."""
    d = x.shape[-1]
    theta = max_wavelength ** (-2.0 * np.arange(d // 2) / d)
    angle = positions[:, None] * theta[None, :]  # (T, d/2)
    shape = (1, len(positions)) + (1,) * (x.ndim - 3) + (d // 2,)
    cos, sin = np.cos(angle).reshape(shape), np.sin(angle).reshape(shape)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def test_harness_rotary():
    x = np.random.default_rng(0).normal(size=(2, 5, 2, 8)).astype("float32")
    run_layer_test(
        RotaryEmbedding,
        dict(max_wavelength=100),
        dict(inputs=x),
        expected_output_shape=(2, 5, 2, 8),
        expected_num_trainable_weights=0,
        run_fit=False,  # no weights to train
    )


def test_matches_reference_with_start_index():
    x = np.random.default_rng(1).normal(size=(2, 4, 3, 6)).astype("float32")
    out = to_numpy(RotaryEmbedding(max_wavelength=50)(x, start_index=7))
    np.testing.assert_allclose(
        out, rope_reference(x, np.arange(7, 11), 50), atol=1e-5
    )


def test_rotation_preserves_norms_and_is_relative():
    rng = np.random.default_rng(2)
    rope = RotaryEmbedding()
    q = rng.normal(size=(1, 1, 1, 16)).astype("float32")
    k = rng.normal(size=(1, 1, 1, 16)).astype("float32")

    def rotated(x, m):
        return to_numpy(rope(x, start_index=m))[0, 0, 0]

    np.testing.assert_allclose(
        np.linalg.norm(rotated(q, 13)), np.linalg.norm(q), rtol=1e-5
    )
    # q_m . k_n depends only on m - n.
    dots = [rotated(q, m) @ rotated(k, m - 3) for m in (3, 10, 40, 200)]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-4, atol=1e-4)
    assert not np.isclose(rotated(q, 10) @ rotated(k, 5), dots[0], atol=1e-3)


def test_errors():
    with pytest.raises(ValueError, match="max_wavelength=0"):
        RotaryEmbedding(max_wavelength=0)
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding()(np.ones((1, 2, 5), "float32"))
    with pytest.raises(ValueError, match="inputs_shape"):
        RotaryEmbedding()(np.ones((2, 4), "float32"))


# Rotary inside MultiHeadAttention (`rotary_max_wavelength`).


def test_harness_mha_rotary():
    rng = np.random.default_rng(3)
    run_layer_test(
        MultiHeadAttention,
        dict(num_heads=2, key_dim=4, rotary_max_wavelength=100),
        dict(
            query=rng.normal(size=(2, 5, 8)).astype("float32"),
            value=rng.normal(size=(2, 5, 8)).astype("float32"),
        ),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 5, 8), (2, 2, 5, 5)),
        expected_num_trainable_weights=8,
    )


def test_mha_rotary_reference():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    layer = MultiHeadAttention(
        num_heads=2, key_dim=4, rotary_max_wavelength=100
    )
    out, scores = layer(x, x, return_attention_scores=True)
    wq, bq, wk, bk = [to_numpy(w) for w in layer.get_weights()[:4]]
    pos = np.arange(5, dtype="float64")
    q = rope_reference(np.einsum("bid,dhk->bihk", x, wq) + bq, pos, 100)
    k = rope_reference(np.einsum("bjd,dhk->bjhk", x, wk) + bk, pos, 100)
    logits = np.einsum("bihk,bjhk->bhij", q, k) / 2.0
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(to_numpy(scores), expected, atol=1e-5)
    assert len(layer.weights) == 8  # rotary adds no weights


def test_mha_rotary_cache_matches_full_pass():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    layer = MultiHeadAttention(
        num_heads=4, key_dim=4, num_key_value_heads=2, rotary_max_wavelength=100
    )
    full = to_numpy(layer(x, x, use_causal_mask=True))
    cache = np.zeros((2, 2, 6, 2, 4), "float32")
    steps = []
    for t in range(6):
        y, cache = layer(
            x[:, t : t + 1],
            x[:, t : t + 1],
            use_causal_mask=True,
            cache=cache,
            cache_update_index=t,
        )
        steps.append(to_numpy(y))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_mha_rotary_off_by_default():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    assert layer.get_config()["rotary_max_wavelength"] is None
    assert layer._rotary is None


def test_llama3_frequencies_match_keras_hub():
    keras_hub = pytest.importorskip("keras_hub")
    from keras_hub.src.models.llama.llama_rotary_embedding import (
        LlamaRotaryEmbedding,
    )

    x = np.random.default_rng(0).normal(size=(1, 12, 2, 32)).astype("float32")
    for length in (8, 64, 8192):
        theirs = LlamaRotaryEmbedding(
            max_wavelength=500000,
            frequency_adjustment_factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            pretraining_sequence_length=length,
        )
        ours = RotaryEmbedding(
            max_wavelength=500000,
            scaling_factor=8.0,
            rope_type="llama3",
            original_max_position_embeddings=length,
        )
        np.testing.assert_allclose(
            to_numpy(ours(x, start_index=100)),
            to_numpy(theirs(x, start_index=100)),
            atol=2e-4,
        )
    assert keras_hub is not None


def test_llama3_factors_are_checked():
    with pytest.raises(ValueError, match="high_freq_factor"):
        RotaryEmbedding(rope_type="llama3", low_freq_factor=4.0)
    layer = RotaryEmbedding(rope_type="llama3", high_freq_factor=8.0)
    assert RotaryEmbedding.from_config(layer.get_config()).high_freq_factor == 8


def test_mha_rotary_scaling_option():
    x = np.random.default_rng(1).normal(size=(1, 6, 8)).astype("float32")
    plain = MultiHeadAttention(2, 4, rotary_max_wavelength=100)
    scaled = MultiHeadAttention(
        2, 4, rotary_max_wavelength=100, rotary_scaling={"scaling_factor": 2}
    )
    plain(x, x)
    scaled(x, x)
    scaled.set_weights(plain.get_weights())
    assert plain.get_config()["rotary_scaling"] is None
    config = scaled.get_config()
    assert config["rotary_scaling"] == {"scaling_factor": 2}
    assert MultiHeadAttention.from_config(config)._rotary.scaling_factor == 2
    # Position interpolation: positions 0, 2, 4 with the factor are
    # positions 0, 1, 2 without it.
    q = np.random.default_rng(2).normal(size=(1, 3, 2, 4)).astype("float32")
    np.testing.assert_allclose(
        to_numpy(scaled._rotary(q, positions=np.array([0, 2, 4]))),
        to_numpy(plain._rotary(q)),
        atol=1e-5,
    )
    with pytest.raises(TypeError, match="rotary_scaling"):
        MultiHeadAttention(2, 4, rotary_max_wavelength=100, rotary_scaling=2.0)
    with pytest.raises(ValueError, match="unknown"):
        MultiHeadAttention(
            2, 4, rotary_max_wavelength=100, rotary_scaling={"factor": 2}
        )
    with pytest.raises(ValueError, match="rotary_max_wavelength"):
        MultiHeadAttention(2, 4, rotary_scaling={"scaling_factor": 2})
    with pytest.raises(ValueError, match="scaling_factor"):
        MultiHeadAttention(
            2,
            4,
            rotary_max_wavelength=100,
            rotary_scaling={"scaling_factor": 0},
        )


# `positions=` of the wrong shape (issue 36, defect 7): a `ValueError`
# naming `positions` and both shapes, not a backend's Reshape/Mul error.


@pytest.mark.parametrize("shape", [(3,), (5,), (3, 4), (2, 5), (1, 1, 4), ()])
@pytest.mark.parametrize("permuted", [False, True])
def test_positions_of_another_shape_are_refused(shape, permuted):
    x = np.ones((2, 4, 6), "float32")
    rope = RotaryEmbedding()
    if permuted:  # positions along `sequence_axis`, wherever it is
        x = np.transpose(x, (0, 2, 1))
        rope = RotaryEmbedding(sequence_axis=-1, feature_axis=1)
    with pytest.raises(ValueError, match="positions") as info:
        rope(x, positions=np.zeros(shape, "int32"))
    message = str(info.value)
    assert repr(shape) in message and repr(x.shape) in message


@pytest.mark.parametrize("permuted", [False, True])
def test_positions_of_each_accepted_shape_match_the_reference(permuted):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 4, 3, 6)).astype("float32")
    # Any real positions rotate: negative and fractional ones too.
    for positions in (
        np.array([-3.0, 0.5, 2.0, 1e3]),
        np.array([[2, 0, 1, 3]]),
        np.array([[0, 1, 2, 3], [9, -9, 4, 4]]),
    ):
        rows = np.broadcast_to(np.atleast_2d(positions), (2, 4))
        want = np.stack(
            [rope_reference(x[b : b + 1], rows[b], 100)[0] for b in range(2)]
        )
        if permuted:
            rope = RotaryEmbedding(100, sequence_axis=3, feature_axis=1)
            got = np.transpose(
                to_numpy(
                    rope(np.transpose(x, (0, 3, 2, 1)), positions=positions)
                ),
                (0, 3, 2, 1),
            )
        else:
            got = to_numpy(RotaryEmbedding(100)(x, positions=positions))
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-5)


# `denominator_dim` (keras-hub's 10th argument; issue 36, defect 10).


def test_denominator_dim_reference_and_checks():
    x = np.random.default_rng(7).normal(size=(1, 5, 2, 8)).astype("float32")
    for denominator in (4, 8, 16, np.int64(32)):
        rope = RotaryEmbedding(50, denominator_dim=denominator)
        d = x.shape[-1]
        theta = 50.0 ** (-2.0 * np.arange(d // 2) / int(denominator))
        angle = np.arange(5)[:, None] * theta[None]
        cos = np.cos(angle)[None, :, None]
        sin = np.sin(angle)[None, :, None]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        want = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        np.testing.assert_allclose(to_numpy(rope(x)), want, atol=1e-5)
        assert type(rope.get_config()["denominator_dim"]) is int
    np.testing.assert_allclose(
        to_numpy(RotaryEmbedding(50, denominator_dim=8)(x)),
        to_numpy(RotaryEmbedding(50)(x)),
        atol=0,
    )
    for bad in (0, -2, 2.5, "8", True):
        with pytest.raises(ValueError, match=f"denominator_dim={bad!r}"):
            RotaryEmbedding(denominator_dim=bad)
    # keras-hub's YaRN ignores it; here it is refused, not ignored.
    with pytest.raises(ValueError, match="denominator_dim"):
        RotaryEmbedding(rope_type="yarn", denominator_dim=8)


def test_configs_saved_before_denominator_dim_still_load():
    # `get_config()` of the layer before `denominator_dim` (commit
    # 2e0d974): no `denominator_dim` key; `low_freq_factor` and
    # `high_freq_factor` by name.
    old = {
        "name": "rotary_embedding",
        "trainable": True,
        "dtype": "float32",
        "max_wavelength": 500000,
        "scaling_factor": 8.0,
        "rope_type": "llama3",
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 64,
        "truncate": True,
        "low_freq_factor": 2.0,
        "high_freq_factor": 6.0,
        "sequence_axis": 1,
        "feature_axis": -1,
    }
    layer = RotaryEmbedding.from_config(old)
    assert layer.denominator_dim is None
    assert (layer.low_freq_factor, layer.high_freq_factor) == (2.0, 6.0)
    config = layer.get_config()
    assert config["denominator_dim"] is None
    assert {k: config[k] for k in old if k != "dtype"} == {
        k: v for k, v in old.items() if k != "dtype"
    }
