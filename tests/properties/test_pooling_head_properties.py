"""`TokenPooling` and `ContrastiveLogits` under Hypothesis.

Draws: the batch, the length (1 to 7), the pooled position (`first`,
`last` with padding anywhere, whole rows padded included, or without a
mask; `eos` with an end token that may be missing or repeated, or the
largest id), the embeddings (rows of zeros included, scales from 1e-3 to
1e3), the learned log scale and bias.

Properties:

- `TokenPooling` returns exactly the NumPy row it names (zeros for a
  `last` row without a real token);
- `ContrastiveLogits` equals the float64 NumPy reference (normalized
  rows, `exp(scale) t v^T + bias`) to 1e-5 relative, is finite for zero
  rows, and its two outputs are each other's transpose.
"""

import keras
import numpy as np
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops

from keras_attention.layers import ContrastiveLogits
from keras_attention.layers import TokenPooling

BACKEND = keras.backend.backend()
DRAWS = settings(
    max_examples=max(
        3, settings.default.max_examples // (2 if BACKEND == "jax" else 1)
    ),
    deadline=None,
)
FEATURES = 3


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


@DRAWS
@given(st.data())
def test_token_pooling_returns_the_named_row(data):
    batch = data.draw(st.integers(1, 3))
    steps = data.draw(st.integers(1, 7))
    seed = data.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, steps, FEATURES)).astype("float32")
    position = data.draw(st.sampled_from(["first", "last", "eos", "max"]))
    rows = np.arange(batch)
    if position == "first":
        out, want = TokenPooling()(x), x[:, 0]
    elif position == "last":
        masked = data.draw(st.booleans())
        mask = rng.random((batch, steps)) < 0.6 if masked else None
        out = TokenPooling("last")(x, padding_mask=mask)
        if mask is None:
            want = x[:, -1]
        else:
            last = [max(np.flatnonzero(r), default=0) for r in mask]
            want = x[rows, last] * mask.any(-1)[:, None]
    else:
        ids = rng.integers(0, 4, (batch, steps)).astype("int32")
        if position == "eos":
            out = TokenPooling("eos", eos_token_id=3)(x, token_ids=ids)
            index = [np.argmax(r == 3) if (r == 3).any() else 0 for r in ids]
        else:
            out = TokenPooling("eos")(x, token_ids=ids)
            index = ids.argmax(-1)
        want = x[rows, index]
    np.testing.assert_array_equal(np_(out), want)


@DRAWS
@given(st.data())
def test_contrastive_logits_equal_the_reference(data):
    images = data.draw(st.integers(1, 4))
    texts = data.draw(st.integers(1, 4))
    seed = data.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    scale = data.draw(st.floats(-3.0, 5.0))
    use_bias = data.draw(st.booleans())
    bias = data.draw(st.floats(-10.0, 10.0)) if use_bias else 0.0
    magnitude = 10.0 ** data.draw(st.integers(-3, 3))
    v = rng.normal(size=(images, FEATURES)) * magnitude
    t = rng.normal(size=(texts, FEATURES)) * magnitude
    if data.draw(st.booleans()):
        v[0] = 0.0  # a zero embedding
    v, t = v.astype("float32"), t.astype("float32")
    head = ContrastiveLogits(scale, use_bias=use_bias, logit_bias=bias)
    image_logits, text_logits = head(v, t)
    image_logits, text_logits = np_(image_logits), np_(text_logits)
    norm = np.linalg.norm
    v64, t64 = v.astype("float64"), t.astype("float64")
    vn = v64 / np.maximum(norm(v64, axis=-1, keepdims=True), 1e-30)
    tn = t64 / np.maximum(norm(t64, axis=-1, keepdims=True), 1e-30)
    want = np.exp(np.float32(scale)) * tn @ vn.T + np.float32(bias)
    assert np.all(np.isfinite(text_logits))
    np.testing.assert_array_equal(image_logits, text_logits.T)
    atol = 1e-5 * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(text_logits, want, atol=atol)
