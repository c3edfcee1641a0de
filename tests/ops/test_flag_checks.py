"""The bool flags of `dot_product_attention` and `local_attention`
(`return_lse`, `return_weights`, `causal`) are checked as every other
flag of the package (`validation.check_bool`): `"False"`, `1` or None
are refused naming the argument and its value, never read as
`bool(...)`; NumPy bools are taken.
"""

import re

import numpy as np
import pytest
from keras import ops

import keras_attention as ka

RNG = np.random.default_rng(4)
X = RNG.normal(size=(1, 5, 2, 4)).astype("float32")
NOT_BOOLS = ["False", "True", 1, 0, None, 1.0]


def refused(name, value):
    return pytest.raises(ValueError, match=re.escape(f"{name}={value!r}"))


@pytest.mark.parametrize("value", NOT_BOOLS)
@pytest.mark.parametrize("name", ["return_lse", "return_weights", "causal"])
def test_dot_product_attention_refuses_flags_that_are_not_bools(name, value):
    with refused(name, value):
        ka.ops.dot_product_attention(X, X, X, **{name: value})


@pytest.mark.parametrize("value", NOT_BOOLS)
@pytest.mark.parametrize("name", ["return_lse", "return_weights"])
def test_local_attention_refuses_flags_that_are_not_bools(name, value):
    with refused(name, value):
        ka.ops.local_attention(X, X, X, 2, **{name: value})


def test_the_deprecated_name_of_causal_is_checked_too():
    with refused("causal", "yes"):
        ka.ops.dot_product_attention(X, X, X, is_causal="yes")


def test_numpy_bools_are_taken():
    out, lse = ka.ops.dot_product_attention(
        X, X, X, return_lse=np.True_, causal=np.True_
    )
    want, want_lse = ka.ops.dot_product_attention(
        X, X, X, return_lse=True, causal=True
    )
    np.testing.assert_allclose(ops.convert_to_numpy(out), want, atol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(lse), want_lse, atol=1e-6)
    out = ka.ops.local_attention(X, X, X, 2, return_lse=np.False_)
    want = ka.ops.local_attention(X, X, X, 2)
    np.testing.assert_allclose(ops.convert_to_numpy(out), want, atol=1e-6)
