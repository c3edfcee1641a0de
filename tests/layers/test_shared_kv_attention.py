"""`SharedKVSelfAttention` and `KVShare` (Gemma 4's attention): a NumPy
reference of a source with values from keys and the value norm, of a
reader attending to its keys and values, and of the proportional partial
rotary positions; cached calls (the `TokenMixer`
protocol, the reader's cache empty) equal to the uncached ones with
padding; the refusals."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention.layers.shared_kv_attention import KVShare
from keras_attention.layers.shared_kv_attention import SharedKVSelfAttention

# JAX compiles each eager op per shape: the tests calling the layers take
# ~25 s there, so they run in its slow tier (TensorFlow
# and PyTorch run them in the fast tier, tests/interop/test_gemma4.py
# decodes the layers on TensorFlow).
jax_slow = (
    pytest.mark.slow(reason="JAX compiles each eager op per shape (~25 s)")
    if keras.backend.backend() == "jax"
    else (lambda test: test)
)
RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 6, 8)).astype("float32")
WAVELENGTH = 100.0


def np_(x):
    return np.asarray(ops.convert_to_numpy(x), "float64")


def pair(**source_options):
    """A source (2 heads of 4, 1 key/value head, QK-norm, rotary) and its
    reader, built, with noisy weights."""
    share = KVShare("s")
    common = dict(
        num_key_value_heads=1,
        rotary_max_wavelength=WAVELENGTH,
        qk_norm="rms",
        use_bias=False,
        kv_share=share,
    )
    source = SharedKVSelfAttention(
        2, 4, causal=True, kv_share_role="source", **common, **source_options
    )
    reader = SharedKVSelfAttention(
        2, 4, causal=True, kv_share_role="reader", **common
    )
    for layer in (source, reader):
        layer.build(X.shape)
        rng = np.random.default_rng(len(layer.weights))
        for w in layer.weights:
            w.assign(np_(w) + rng.normal(scale=0.3, size=w.shape))
    return source, reader


def rms(x, scale=None):
    y = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6)
    return y if scale is None else y * scale


def rope(x, pairs=None):
    """`(b, T, h, d)` rotated: pairs (k, k + d/2), angles p * theta_k,
    theta_k = WAVELENGTH ** (-2k / d); only the first `pairs` pairs
    (the others with angle 0) when given (Gemma 4's proportional RoPE)."""
    d = x.shape[-1]
    theta = WAVELENGTH ** (-np.arange(0, d, 2) / d)
    if pairs is not None:
        theta[pairs:] = 0.0
    angle = np.arange(x.shape[1])[:, None] * theta  # (T, d/2)
    cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def weights(layer):
    return {w.path.split("/")[-2]: np_(w) for w in layer.weights}


def attend(q, k, v, out):
    """Causal attention of `q` `(b, T, 2, d)` on one key/value head."""
    scores = np.einsum("bthd,bsd->bhts", q, k[:, :, 0]) / np.sqrt(4)
    t = q.shape[1]
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    heads = np.einsum("bhts,bsd->bthd", p, v[:, :, 0])
    return np.einsum("bthd,hde->bte", heads, out)


@jax_slow
def test_source_and_reader_equal_a_numpy_reference():
    source, reader = pair(values_from_keys=True, value_norm="rms")
    ws, wr = weights(source), weights(reader)
    assert sorted(ws) == [
        "attention_output",
        "key",
        "key_norm",
        "query",
        "query_norm",
    ]
    assert sorted(wr) == ["attention_output", "query", "query_norm"]
    x = X.astype("float64")
    raw = np.einsum("btd,dhk->bthk", x, ws["key"])
    k = rope(rms(raw, ws["key_norm"]))
    v = rms(raw)  # K = V: the raw key projection, then the v-norm

    def query(w):
        return rope(
            rms(np.einsum("btd,dhk->bthk", x, w["query"]), w["query_norm"])
        )

    want_source = attend(query(ws), k, v, ws["attention_output"])
    want_reader = attend(query(wr), k, v, wr["attention_output"])
    got_source = source(X)
    got_reader = reader(X)  # after its source: its keys and values
    np.testing.assert_allclose(np_(got_source), want_source, atol=1e-5)
    np.testing.assert_allclose(np_(got_reader), want_reader, atol=1e-5)


@jax_slow
def test_proportional_rotary_equals_a_numpy_reference():
    """Heads of 8, a quarter rotated: pair (0, 4) only, at the frequency
    of the whole head (plain `rotary_fraction` would rotate features 0
    and 1 together)."""
    layer = SharedKVSelfAttention(
        2,
        8,
        causal=True,
        use_bias=False,
        rotary_max_wavelength=WAVELENGTH,
        rotary_fraction=0.25,
        proportional_rotary=True,
    )
    layer.build(X.shape)
    w = weights(layer)
    x = X.astype("float64")
    q = rope(np.einsum("btd,dhk->bthk", x, w["query"]), pairs=1)
    k = rope(np.einsum("btd,dhk->bthk", x, w["key"]), pairs=1)
    v = np.einsum("btd,dhk->bthk", x, w["value"])
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(8)
    scores = np.where(np.tril(np.ones((6, 6), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    heads = np.einsum("bhts,bshd->bthd", p, v)
    want = np.einsum("bthd,hde->bte", heads, w["attention_output"])
    np.testing.assert_allclose(np_(layer(X)), want, atol=1e-5)


@jax_slow
def test_cached_calls_equal_the_uncached_with_padding():
    source, reader = pair(value_norm="rms")
    mask = np.array([[1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]], bool)
    want_source = np_(source(X, padding_mask=mask))
    want_reader = np_(reader(X, padding_mask=mask))
    source_cache = source.init_cache(2, 6)
    reader_cache = reader.init_cache(2, 6)
    assert reader_cache == ()  # the source's cache holds the entries
    assert reader.cache_overwrites_positions(reader_cache)
    got_source, got_reader = [], []
    for start, stop in ((0, 3), (3, 4), (4, 5), (5, 6)):
        kwargs = dict(
            cache_update_index=start, padding_mask=mask[:, start:stop]
        )
        y, source_cache = source(X[:, start:stop], cache=source_cache, **kwargs)
        got_source.append(np_(y))
        y, reader_cache = reader(X[:, start:stop], cache=reader_cache, **kwargs)
        assert reader_cache == ()
        got_reader.append(np_(y))
    for got, want in ((got_source, want_source), (got_reader, want_reader)):
        got = np.concatenate(got, axis=1)
        np.testing.assert_allclose(got[mask], want[mask], atol=1e-5)


@jax_slow
def test_a_reader_without_its_source_in_the_pass_is_refused():
    source, reader = pair()
    source(X)
    reader(X)  # reads the publication, which is then dropped
    with pytest.raises(ValueError, match="must run before it"):
        reader(X)
    source(X)
    with pytest.raises(ValueError, match="'cache' wanted"):
        reader(X[:, :1], cache=(), cache_update_index=0)


@jax_slow
@pytest.mark.parametrize(
    "sizes, match",
    [
        (dict(num_key_value_heads=2), r"num_key_value_heads=2"),
        (dict(key_dim=2, num_heads=4), r"key_dim=2"),
        (dict(value_dim=2), r"value_dim=2"),
    ],
)
def test_a_reader_of_other_sizes_than_its_source_is_refused(sizes, match):
    # The source: 2 heads of 4, one key/value head. A reader's other key
    # heads were broadcast silently, other sizes failed inside a matmul.
    source, _ = pair()
    options = dict(num_heads=2, key_dim=4, num_key_value_heads=1)
    options.update(sizes)
    reader = SharedKVSelfAttention(
        **options,
        causal=True,
        kv_share=source.kv_share,
        kv_share_role="reader",
    )
    reader.build(X.shape)
    source(X)
    with pytest.raises(ValueError, match=f"the source's.*{match}"):
        reader(X)
    _, cache = source(X, cache=source.init_cache(2, 6), cache_update_index=0)
    with pytest.raises(ValueError, match=f"the source's.*{match}"):
        reader(X, cache=(), cache_update_index=0)


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(kv_share_role="source"), "kv_share_role"),
        (dict(kv_share=KVShare(), kv_share_role="both"), "kv_share_role"),
        (
            dict(kv_share=KVShare(), kv_share_role="reader", value_norm="rms"),
            "value_norm",
        ),
        (dict(value_norm="l2"), "value_norm"),
        (dict(values_from_keys=True, value_dim=2), "value_dim"),
        (dict(proportional_rotary=True), "rotary_max_wavelength"),
    ],
)
def test_bad_arguments_are_refused_by_name(options, match):
    with pytest.raises(ValueError, match=match):
        SharedKVSelfAttention(2, 4, **options)


def test_a_rolling_cache_is_refused():
    layer = SharedKVSelfAttention(2, 4, causal=True, value_norm="rms")
    layer.build(X.shape)
    with pytest.raises(ValueError, match="sink_tokens=0"):
        layer.init_cache(1, 6, sink_tokens=0)


def test_config_round_trip():
    source, _ = pair(values_from_keys=True, value_norm="rms")
    config = source.get_config()
    clone = SharedKVSelfAttention.from_config(config)
    assert clone.values_from_keys and clone.value_norm == "rms"
    assert isinstance(clone.kv_share, KVShare)
    assert clone.kv_share_role == "source"
    assert keras.saving.serialize_keras_object(clone)["class_name"] == (
        "SharedKVSelfAttention"
    )
