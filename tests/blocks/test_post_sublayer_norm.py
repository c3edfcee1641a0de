"""The blocks' `sandwich_norm="post"` (OLMo 2's reordered norm): each
sublayer's output normalized before the residual sum, no norm before the
sublayer, `x + Norm(a(x))` then `x + Norm'(f(x))`. Against a NumPy
reference (decoder: causal, with padding; encoder; a decoder with
cross-attention), no pre-norm weights, cached decoding through the
block's cache, the config and `.keras` round trips, refusals.
Backend-neutral."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock

B, T, D, H, K, F = 2, 6, 8, 2, 4, 12
X = np.random.default_rng(0).normal(size=(B, T, D)).astype("float32")
PADDING = np.ones((B, T), bool)
PADDING[1, 4:] = False  # right padding


def block(cls=TransformerDecoderBlock, **kwargs):
    options = dict(
        num_heads=H,
        intermediate_dim=F,
        key_dim=K,
        norm_first=True,
        normalization="rms_norm",
        sandwich_norm="post",
    )
    if cls is TransformerDecoderBlock:
        options["cross_attention"] = False
    layer = cls(**dict(options, **kwargs))
    layer.build(X.shape)
    rng = np.random.default_rng(1)
    for weight in layer.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32") * 0.5)
    return layer


def numpy_block(layer, x, padding, causal):
    w = {
        v.path.split("/", 1)[1]: to_numpy(v).astype("float64")
        for v in layer.weights
    }

    def norm(name, x):
        rms = np.sqrt((x**2).mean(-1, keepdims=True) + 1e-5)
        return x / rms * w[f"{name}/scale"]

    def project(name, x):
        kernel = w[f"self_attention/{name}/kernel"]
        return (
            np.einsum("btd,dhk->bthk", x, kernel)
            + w[f"self_attention/{name}/bias"]
        )

    q, k, v = (project(n, x) for n in ("query", "key", "value"))
    scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(K)
    allowed = padding[:, None, None, :]
    if causal:
        allowed = allowed & np.tril(np.ones((T, T), bool))
    scores = np.where(allowed, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    heads = np.einsum("bhqs,bshk->bqhk", probs, v)
    attention = (
        np.einsum(
            "bqhk,hkd->bqd", heads, w["self_attention/attention_output/kernel"]
        )
        + w["self_attention/attention_output/bias"]
    )
    x = x + norm("self_attention_post_norm", attention)
    hidden = np.maximum(
        x @ w["feed_forward/intermediate_dense/kernel"]
        + w["feed_forward/intermediate_dense/bias"],
        0.0,
    )
    ff = (
        hidden @ w["feed_forward/output_dense/kernel"]
        + w["feed_forward/output_dense/bias"]
    )
    return x + norm("feed_forward_post_norm", ff)


@pytest.mark.parametrize(
    "cls, causal",
    [(TransformerDecoderBlock, True), (TransformerEncoderBlock, False)],
)
def test_equals_the_numpy_reference(cls, causal):
    layer = block(cls)
    names = {v.path.split("/", 1)[1].split("/")[0] for v in layer.weights}
    assert "self_attention_norm" not in names
    assert "feed_forward_norm" not in names
    assert {"self_attention_post_norm", "feed_forward_post_norm"} <= names
    got = to_numpy(layer(X, padding_mask=PADDING))
    want = numpy_block(layer, X.astype("float64"), PADDING, causal)
    np.testing.assert_allclose(got[PADDING], want[PADDING], atol=1e-4)


def test_cross_attention_has_only_its_post_norm():
    layer = TransformerDecoderBlock(
        num_heads=H,
        intermediate_dim=F,
        norm_first=True,
        sandwich_norm="post",
    )
    context = np.ones((B, 3, D), "float32")
    out = layer(X, context)
    assert out.shape == X.shape
    names = {v.path.split("/", 1)[1].split("/")[0] for v in layer.weights}
    assert "cross_attention_post_norm" in names
    assert "cross_attention_norm" not in names


def test_cached_decoding_equals_the_whole_sequence():
    layer = block(rotary_max_wavelength=100.0)
    whole = to_numpy(layer(X))
    cache = layer.init_cache(B, T)
    steps = []
    for t in range(T):
        out, cache = layer(X[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), whole, atol=1e-5)


def test_config_and_keras_file_round_trips(tmp_path):
    layer = block()
    assert layer.get_config()["sandwich_norm"] == "post"
    clone = TransformerDecoderBlock.from_config(layer.get_config())
    assert clone.sandwich_norm == "post"
    inputs = keras.Input((None, D))
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "post_norm.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        to_numpy(reloaded(X)), to_numpy(model(X)), atol=1e-6
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(norm_first=False), "norm_first"),
        (dict(sandwich_norm="pre"), "sandwich_norm='pre'"),
    ],
)
def test_refusals_name_the_argument(kwargs, match):
    options = dict(
        num_heads=H,
        intermediate_dim=F,
        norm_first=True,
        cross_attention=False,
        sandwich_norm="post",
    )
    with pytest.raises(ValueError, match=match):
        TransformerDecoderBlock(**dict(options, **kwargs))
