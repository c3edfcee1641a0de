"""`gated_delta_rule` and its implied attention matrix take every
argument as Python lists (array-likes), as `linear_attention` and
Keras's ops do: the call with lists returns what the call with NumPy
arrays returns (it raised `AttributeError: 'list' object has no
attribute 'shape'` for `g`, `beta`, `key_mask`, `segment_ids`), and a
list of the wrong shape or kind is refused naming the argument."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.ops import gated_delta_rule
from keras_attention.ops.gated_delta_rule import implied_attention

RNG = np.random.default_rng(7)
B, T, H, D, E = 2, 5, 2, 3, 2
Q = RNG.normal(size=(B, T, H, D)).astype("float32")
K = RNG.normal(size=(B, T, H, D))
K = (K / np.linalg.norm(K, axis=-1, keepdims=True)).astype("float32")
V = RNG.normal(size=(B, T, H, E)).astype("float32")
G = -RNG.uniform(0, 1, size=(B, T, H)).astype("float32")
BETA = RNG.uniform(0.1, 0.9, size=(B, T, H)).astype("float32")
STATE = RNG.normal(size=(B, H, D, E)).astype("float32")
MASK = np.array([[True] * T, [True, False, True, True, False]])
IDS = np.array([[0, 0, 1, 1, 1], [3, 3, 3, 4, 4]], "int32")
ARRAYS = dict(
    g=G, beta=BETA, key_mask=MASK, segment_ids=IDS, initial_state=STATE
)


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def call(chunk_size, q=Q, k=K, v=V, **given):
    kwargs = dict(ARRAYS, **given)
    return gated_delta_rule(
        q, k, v, chunk_size=chunk_size, return_state=True, **kwargs
    )


@pytest.mark.parametrize("chunk_size", [2, None])
def test_list_arguments_equal_arrays(chunk_size):
    want, want_state = call(chunk_size)
    lists = {name: x.tolist() for name, x in ARRAYS.items()}
    out, state = call(chunk_size, **lists)
    np.testing.assert_allclose(np_(out), np_(want), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np_(state), np_(want_state), atol=1e-6)
    # The sequences as lists too (Python floats: float32, as Keras's ops).
    out = call(chunk_size, Q.tolist(), K.tolist(), V.tolist(), **lists)[0]
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    np.testing.assert_allclose(np_(out), np_(want), rtol=1e-6, atol=1e-6)


def test_implied_attention_takes_lists():
    want = implied_attention(Q, K, G, BETA, segment_ids=IDS, key_mask=MASK)
    got = implied_attention(
        Q.tolist(),
        K.tolist(),
        G.tolist(),
        BETA.tolist(),
        segment_ids=IDS.tolist(),
        key_mask=MASK.tolist(),
    )
    np.testing.assert_allclose(np_(got), np_(want), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "name,value,error",
    [
        ("g", G[:, :3].tolist(), ValueError),
        ("key_mask", MASK.astype("int32").tolist(), TypeError),
        ("segment_ids", (IDS + 0.5).tolist(), TypeError),
        ("beta", [[["x"] * H] * T] * B, TypeError),
    ],
)
def test_wrong_lists_are_refused_naming_them(name, value, error):
    with pytest.raises(error, match=f"`{name}`"):
        call(2, **{name: value})
