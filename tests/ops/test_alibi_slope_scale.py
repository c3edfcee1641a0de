"""`ALiBi(slope_scale=...)`: every slope multiplied by a factor (Falcon
adds its ALiBi biases before scaling the scores by `1 / sqrt(head_dim)`:
its slopes are the paper's times that factor). Against NumPy on the
dense and blockwise paths (the blockwise one forms its tiles' biases from
`relative_bias`), in a layer through a `.keras` round trip; refusals.
Backend-neutral."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import layers as ka
from keras_attention import scores
from keras_attention.ops import attention as attention_lib

RNG = np.random.default_rng(3)
B, T, H, D = 2, 12, 4, 8
Q, K, V = (RNG.normal(size=(B, T, H, D)).astype("float32") for _ in "qkv")
QI, KJ = np.arange(T)[:, None], np.arange(T)[None, :]
SCALE = D**-0.5


def np_attention(bias, causal=True):
    s = np.einsum("bihd,bjhd->bhij", Q, K) / np.sqrt(D) + bias
    if causal:
        s = np.where(KJ <= QI, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhe->bihe", p, V)


@pytest.mark.parametrize(
    "path, options",
    [("dense", {}), ("blockwise", dict(query_block=4, key_block=4))],
)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_scaled_slopes_equal_numpy(path, options, bidirectional):
    slopes = SCALE * np.array(scores.alibi_slopes(H))[:, None, None]
    distance = np.abs(QI - KJ) if bidirectional else QI - KJ
    want = np_attention(-slopes * distance, causal=not bidirectional)
    alibi = scores.ALiBi(
        num_heads=H, bidirectional=bidirectional, slope_scale=SCALE
    )
    np.testing.assert_allclose(alibi.slopes, slopes[:, 0, 0], rtol=1e-6)
    with attention_lib.implementation_scope(path, **options):
        got = attention_lib.dot_product_attention(
            Q, K, V, causal=not bidirectional, score_mod=alibi
        )
    np.testing.assert_allclose(ops.convert_to_numpy(got), want, atol=2e-5)
    # The factor matters: the paper's slopes give other weights.
    plain = np_attention(-slopes / SCALE * distance, not bidirectional)
    assert np.abs(plain - want).max() > 1e-3


def test_keras_round_trip_keeps_the_factor(tmp_path):
    x = RNG.normal(size=(B, T, 16)).astype("float32")
    inputs = keras.Input((None, 16))
    layer = ka.SelfAttention(
        H, D, causal=True, score_mod=scores.ALiBi(slope_scale=SCALE)
    )
    model = keras.Model(inputs, layer(inputs))
    assert layer.score_mod.get_config()["slope_scale"] == SCALE
    path = str(tmp_path / "alibi.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        ops.convert_to_numpy(reloaded(x)),
        ops.convert_to_numpy(model(x)),
        atol=1e-6,
    )


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), "1"])
def test_a_bad_factor_is_refused_by_name(value):
    with pytest.raises(ValueError, match="slope_scale"):
        scores.ALiBi(num_heads=H, slope_scale=value)
