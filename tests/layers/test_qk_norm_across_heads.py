"""`MultiHeadAttention(qk_norm="rms_across_heads")` (OLMo 2): one RMS norm
over all heads' projected queries (and one over all key heads), with a
scale per head and feature, before the rotary positions. Against a NumPy
reference (grouped-query, causal, padded, rotary), cached decoding equal
to the whole sequence, config and `.keras` round trips, refusals.
Backend-neutral."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

import keras_attention as ka

B, T, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2, 6, 16, 4, 2, 8
EPSILON, THETA = 1e-5, 100.0
X = np.random.default_rng(0).normal(size=(B, T, HIDDEN)).astype("float32")
PADDING = np.ones((B, T), bool)
PADDING[1, :2] = False  # left padding


def layer(**kwargs):
    mha = ka.layers.SelfAttention(
        HEADS,
        HEAD_DIM,
        causal=True,
        num_key_value_heads=KV_HEADS,
        rotary_max_wavelength=THETA,
        qk_norm="rms_across_heads",
        qk_norm_epsilon=EPSILON,
        **kwargs,
    )
    mha.build(X.shape)
    rng = np.random.default_rng(1)
    for weight in mha.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32") * 0.5)
    return mha


def numpy_attention(mha, x):
    w = {
        v.path.split("/", 1)[1]: to_numpy(v).astype("float64")
        for v in mha.weights
    }

    def project(name, heads):
        y = np.einsum("btd,dhk->bthk", x, w[f"{name}/kernel"])
        return y + w[f"{name}/bias"]

    def norm(name, y):  # over all heads' features at once
        flat = y.reshape(B, T, -1)
        rms = np.sqrt((flat**2).mean(-1, keepdims=True) + EPSILON)
        return (flat / rms).reshape(y.shape) * w[f"{name}/scale"]

    def rotate(y):
        inverse = THETA ** -(np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
        angles = np.arange(T)[:, None] * inverse[None]
        cos = np.cos(np.concatenate([angles, angles], -1))[None, :, None]
        sin = np.sin(np.concatenate([angles, angles], -1))[None, :, None]
        half = HEAD_DIM // 2
        rotated = np.concatenate([-y[..., half:], y[..., :half]], -1)
        return y * cos + rotated * sin

    q = rotate(norm("query_norm", project("query", HEADS)))
    k = rotate(norm("key_norm", project("key", KV_HEADS)))
    v = project("value", KV_HEADS)
    k = np.repeat(k, HEADS // KV_HEADS, axis=2)
    v = np.repeat(v, HEADS // KV_HEADS, axis=2)
    scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(HEAD_DIM)
    allowed = np.tril(np.ones((T, T), bool)) & PADDING[:, None, None, :]
    scores = np.where(allowed, scores, -np.inf)
    with np.errstate(invalid="ignore"):  # padded queries: no key at all
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
    heads = np.einsum("bhqs,bshk->bqhk", probs, v)
    out = np.einsum("bqhk,hkd->bqd", heads, w["attention_output/kernel"])
    return out + w["attention_output/bias"]


def test_equals_the_numpy_reference():
    mha = layer()
    assert tuple(mha.query_norm.weights[0].shape) == (HEADS, HEAD_DIM)
    assert tuple(mha.key_norm.weights[0].shape) == (KV_HEADS, HEAD_DIM)
    got = to_numpy(mha(X, padding_mask=PADDING))
    want = numpy_attention(mha, X.astype("float64"))
    np.testing.assert_allclose(got[PADDING], want[PADDING], atol=1e-4)
    # Not the per-head norm: another result with the same weights.
    per_head = ka.layers.SelfAttention(
        HEADS,
        HEAD_DIM,
        causal=True,
        num_key_value_heads=KV_HEADS,
        rotary_max_wavelength=THETA,
        qk_norm="rms",
        qk_norm_epsilon=EPSILON,
    )
    per_head.build(X.shape)
    for mine, theirs in zip(per_head.weights, mha.weights):
        value = to_numpy(theirs)
        mine.assign(value[0] if mine.shape != value.shape else value)
    other = to_numpy(per_head(X, padding_mask=PADDING))
    assert np.abs(other - got)[PADDING].max() > 1e-2


def test_cached_decoding_equals_the_whole_sequence():
    mha = layer()
    whole = to_numpy(mha(X))
    cache = mha.init_cache(B, T)
    steps = []
    for t in range(T):
        out, cache = mha(X[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), whole, atol=1e-5)


def test_config_and_keras_file_round_trips(tmp_path):
    mha = layer()
    assert mha.get_config()["qk_norm"] == "rms_across_heads"
    inputs = keras.Input((None, HIDDEN))
    model = keras.Model(inputs, mha(inputs))
    path = str(tmp_path / "olmo2_attention.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        to_numpy(reloaded(X)), to_numpy(model(X)), atol=1e-6
    )


def test_an_unknown_qk_norm_is_refused():
    with pytest.raises(ValueError, match="qk_norm='rms_all'"):
        ka.layers.SelfAttention(HEADS, HEAD_DIM, qk_norm="rms_all")
