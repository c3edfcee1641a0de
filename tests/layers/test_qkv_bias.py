"""`MultiHeadAttention(use_bias="qkv")`: biases on the query, key, value
(and gate) projections, none on the output projection (Qwen 2). Against
a NumPy reference; cached decoding; config and `.keras` round trips;
refusals. Backend-neutral."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_attention as ka

B, T, HIDDEN, HEADS, KV_HEADS, KEY_DIM = 2, 5, 8, 4, 2, 4
X = np.random.default_rng(0).normal(size=(B, T, HIDDEN)).astype("float32")


def layer(**kwargs):
    mha = ka.layers.SelfAttention(
        HEADS,
        KEY_DIM,
        causal=True,
        use_bias="qkv",
        num_key_value_heads=KV_HEADS,
        **kwargs,
    )
    mha.build(X.shape)
    rng = np.random.default_rng(1)
    for weight in mha.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    return mha


def weights_of(mha):
    return {
        w.path.split("/", 1)[1]: ops.convert_to_numpy(w) for w in mha.weights
    }


def numpy_attention(x, w, gate=False):
    """Causal grouped-query attention with biased q, k, v (and gate)
    projections and an unbiased output projection."""

    def project(name):
        return (
            np.einsum("btd,dhk->bthk", x, w[f"{name}/kernel"])
            + (w[f"{name}/bias"])
        )

    q, k, v = project("query"), project("key"), project("value")
    k = np.repeat(k, HEADS // KV_HEADS, axis=2)
    v = np.repeat(v, HEADS // KV_HEADS, axis=2)
    scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(KEY_DIM)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    heads = np.einsum("bhqs,bshk->bqhk", probs, v)
    if gate:
        heads = heads / (1.0 + np.exp(-project("gate")))
    return np.einsum("bqhk,hkd->bqd", heads, w["attention_output/kernel"])


def test_biases_on_query_key_value_and_gate_not_on_the_output():
    mha = layer(use_gate=True)
    names = sorted(weights_of(mha))
    assert names == sorted(
        [
            f"{p}/{n}"
            for p in ("query", "key", "value", "gate")
            for n in (
                "kernel",
                "bias",
            )
        ]
        + ["attention_output/kernel"]
    )
    assert mha.use_bias == "qkv"


@pytest.mark.parametrize("gate", [False, True])
def test_equals_the_numpy_reference(gate):
    mha = layer(use_gate=gate)
    got = ops.convert_to_numpy(mha(X))
    want = numpy_attention(X.astype("float64"), weights_of(mha), gate)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_cached_decoding_equals_the_whole_sequence():
    mha = layer(rotary_max_wavelength=100.0)
    whole = ops.convert_to_numpy(mha(X))
    cache = mha.init_cache(B, T)
    steps = []
    for t in range(T):
        out, cache = mha(X[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), whole, atol=1e-5)


def test_config_and_keras_file_round_trips(tmp_path):
    mha = layer()
    clone = ka.layers.SelfAttention.from_config(mha.get_config())
    assert clone.use_bias == "qkv"
    inputs = keras.Input((None, HIDDEN))
    model = keras.Model(inputs, mha(inputs))
    path = str(tmp_path / "qkv_bias.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        ops.convert_to_numpy(reloaded(X)),
        ops.convert_to_numpy(model(X)),
        atol=1e-6,
    )


@pytest.mark.parametrize("value", ["qk", "True", 1, None])
def test_other_values_are_refused_by_name(value):
    with pytest.raises(ValueError, match="use_bias"):
        ka.layers.MultiHeadAttention(HEADS, KEY_DIM, use_bias=value)
