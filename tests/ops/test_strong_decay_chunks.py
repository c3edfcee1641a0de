"""The chunked forms of `linear_attention` and `gated_delta_rule` under
strong decays: the result does not depend on `chunk_size` and equals
the NumPy recurrence (`tests/linear_attention_reference.py`,
`tests/gated_delta_reference.py`) to 2e-6 of the largest output in
float32 (the recurrence is 1e-7 off; the property asks 1e-5).

Inside a chunk the decay from key `j` to query `i` is `exp(a_{j+1} +
... + a_i)`. Formed as the difference `L_i - L_j` of two cumulative sums,
it cancels: after a log decay of -1e4 both are ~-1e4 and float32's
spacing there is 1e-3, a relative error of 1e-3 in every weight
(measured: 4e-4 with `chunk_size=16`, 2e-3 with 64; a single -100
already gave 7e-6), while the recurrence stays exact to 1e-7. The
implied attention matrices are checked too (they span the whole
sequence as one chunk). Random layouts and decays down to -1e4: the
property `tests/properties/test_chunk_decay_property.py`.
"""

import gated_delta_reference as gdr
import keras
import linear_attention_reference as lar
import numpy as np
import pytest
from keras import ops

import keras_attention as ka
from keras_attention.ops.gated_delta_rule import implied_attention
from keras_attention.ops.linear_attention import linear_attention_weights

BACKEND = keras.backend.backend()
B, T, H, D, E = 1, 40, 2, 4, 3
RNG = np.random.default_rng(536)
Q, K = RNG.normal(size=(2, B, T, H, D)).astype("float32")
K_UNIT = (K / np.linalg.norm(K, axis=-1, keepdims=True)).astype("float32")
V = RNG.normal(size=(B, T, H, E)).astype("float32")
BETA = RNG.uniform(0.1, 0.9, size=(B, T, H)).astype("float32")
MILD = np.log(RNG.uniform(0.8, 1.0, size=(B, T, H))).astype("float32")


def decays(kind):
    a = MILD.copy()
    if kind == "every_10":
        a[:, 3::10] = -1e4  # a chunk's later keys after a -1e4
    else:
        a[:, 17, 0] = -100.0
    return a


def np_(x):
    return np.asarray(ops.convert_to_numpy(ops.cast(x, "float32")))


def close(got, want, rtol=2e-6):
    scale = float(np.max(np.abs(want)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


KINDS = ["every_10", "single_100"]
CHUNKS = [16, 64, 7, None]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk_size", CHUNKS)
def test_linear_attention(kind, chunk_size):
    a = decays(kind)
    out, state = ka.ops.linear_attention(
        Q, K, V, decay=a, chunk_size=chunk_size, return_state=True
    )
    want, want_state, _ = lar.linear_attention(Q, K, V, decay=a)
    close(np_(out), want)
    close(np_(state), want_state)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk_size", CHUNKS)
def test_gated_delta_rule(kind, chunk_size):
    g = decays(kind)
    out, state = ka.ops.gated_delta_rule(
        Q, K_UNIT, V, g, BETA, chunk_size=chunk_size, return_state=True
    )
    want, want_state = gdr.gated_delta_rule(Q, K_UNIT, V, g, BETA)
    close(np_(out), want)
    close(np_(state), want_state)


def test_implied_matrices():
    """The attention matrices span the sequence as one chunk."""
    a = decays("every_10")[:, :16]
    q, k, k_unit = Q[:, :16], K[:, :16], K_UNIT[:, :16]
    weights = linear_attention_weights(q, k, decay=a)
    close(np_(weights), lar.weights(q, k, decay=a))
    matrix = implied_attention(q, k_unit, a, BETA[:, :16])
    close(np_(matrix), gdr.attention_matrix(q, k_unit, a, BETA[:, :16]))
