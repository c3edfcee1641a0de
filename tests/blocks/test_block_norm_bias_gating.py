"""The blocks' `normalization`, `use_bias`, `gated_feed_forward` options
and `FeedForward(gated=True)`: the forms of Llama-style models."""

import contextlib

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.layers import FeedForward

X = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
LLAMA_STYLE = dict(
    normalization="rms_norm",
    use_bias=False,
    gated_feed_forward=True,
    activation="silu",
    norm_first=True,
)


def blocks(**kwargs):
    return [
        TransformerEncoderBlock(2, 16, causal=True, **kwargs),
        TransformerDecoderBlock(2, 16, cross_attention=False, **kwargs),
    ]


@pytest.mark.parametrize("block", blocks(), ids=["encoder", "decoder"])
def test_defaults_keep_the_layout(block):
    block(X)
    names = [w.path.split("/", 1)[1] for w in block.weights]
    assert "self_attention_norm/beta" in names
    assert "self_attention/query/bias" in names
    assert not any("gate_dense" in n for n in names)
    config = block.get_config()
    assert config["normalization"] == "layer_norm"
    assert config["use_bias"] is True
    assert config["gated_feed_forward"] is False


@pytest.mark.parametrize(
    "block", blocks(**LLAMA_STYLE), ids=["encoder", "decoder"]
)
def test_llama_style_weights_and_round_trip(block):
    y = block(X)
    names = sorted(w.path.split("/", 1)[1] for w in block.weights)
    assert names == sorted(
        [
            "self_attention/query/kernel",
            "self_attention/key/kernel",
            "self_attention/value/kernel",
            "self_attention/attention_output/kernel",
            "self_attention_norm/scale",
            "feed_forward/intermediate_dense/kernel",
            "feed_forward/gate_dense/kernel",
            "feed_forward/output_dense/kernel",
            "feed_forward_norm/scale",
        ]
    )
    clone = type(block).from_config(block.get_config())
    clone(X)
    clone.set_weights(block.get_weights())
    np.testing.assert_allclose(to_numpy(clone(X)), to_numpy(y), atol=1e-6)


def test_rms_norm_is_keras_rms_normalization():
    block = TransformerEncoderBlock(2, 16, normalization="rms_norm")
    block(X)
    assert isinstance(block.self_attention_norm, keras.layers.RMSNormalization)
    assert block.self_attention_norm.epsilon == block.layer_norm_epsilon


@pytest.mark.parametrize(
    "name, value",
    [
        ("normalization", "batch_norm"),
        ("use_bias", "yes"),
        ("gated_feed_forward", 1.5),
    ],
)
def test_bad_options_name_the_argument(name, value):
    with pytest.raises((ValueError, TypeError), match=name):
        TransformerEncoderBlock(2, 16, **{name: value})


def test_gated_feed_forward_formula():
    ffn = FeedForward(16, activation="silu", gated=True)
    y = to_numpy(ffn(X))
    w1, b1 = (to_numpy(w) for w in ffn.intermediate_dense.weights)
    wg, bg = (to_numpy(w) for w in ffn.gate_dense.weights)
    w2, b2 = (to_numpy(w) for w in ffn.output_dense.weights)
    gate = X @ wg + bg
    hidden = gate / (1 + np.exp(-gate)) * (X @ w1 + b1)
    np.testing.assert_allclose(y, hidden @ w2 + b2, atol=1e-5)
    clone = FeedForward.from_config(ffn.get_config())
    assert clone.gated is True
    assert FeedForward(16).get_config()["gated"] is False


@pytest.mark.parametrize(
    "block",
    [
        TransformerEncoderBlock(2, 16, norm_first=True, sandwich_norm=True),
        TransformerDecoderBlock(2, 16, norm_first=True, sandwich_norm=True),
    ],
    ids=["encoder", "decoder"],
)
def test_sandwich_norm(block):
    context = X[:, :3]
    cross = isinstance(block, TransformerDecoderBlock)
    y = block(X, context) if cross else block(X)
    names = {w.path.split("/", 1)[1] for w in block.weights}
    want = {"self_attention_post_norm/gamma", "feed_forward_post_norm/gamma"}
    if cross:
        want.add("cross_attention_post_norm/gamma")
    assert want <= names
    # x + Post(Attention(Pre(x))), then x + Post'(FFN(Pre'(x))).
    if not cross:
        h = X + to_numpy(
            block.self_attention_post_norm(
                block.self_attention(block.self_attention_norm(X))
            )
        )
        h = h + to_numpy(
            block.feed_forward_post_norm(
                block.feed_forward(block.feed_forward_norm(h))
            )
        )
        np.testing.assert_allclose(to_numpy(y), h, atol=1e-5)
    clone = type(block).from_config(block.get_config())
    assert clone.sandwich_norm is True
    assert TransformerEncoderBlock(2, 16).get_config()["sandwich_norm"] is False


def test_attention_scale_reaches_every_attention_layer():
    block = TransformerDecoderBlock(2, 16, attention_scale=1.0)
    context = X[:, :3]
    _, weights, cross_weights = block(X, context, return_attention_scores=True)
    assert block.self_attention.attention_scale == 1.0
    assert block.cross_attention_layer.attention_scale == 1.0
    # Unscaled scores: the self-attention equals a default-scaled layer
    # whose query kernel is multiplied by sqrt(key_dim) = 2.
    plain = TransformerDecoderBlock(2, 16)
    plain(X, context)
    plain.set_weights(block.get_weights())
    kernel = plain.self_attention.query_dense.kernel
    kernel.assign(kernel * 2.0)
    _, plain_weights, _ = plain(X, context, return_attention_scores=True)
    np.testing.assert_allclose(
        to_numpy(weights), to_numpy(plain_weights), atol=1e-6
    )
    clone = TransformerDecoderBlock.from_config(block.get_config())
    assert clone.attention_scale == 1.0
    default = TransformerEncoderBlock(2, 16).get_config()
    assert default["attention_scale"] is None
    with pytest.raises(ValueError, match="attention_scale.*-1"):
        TransformerEncoderBlock(2, 16, attention_scale=-1)


def test_attention_output_gate():
    """Gated attention (Qwen 3.5): the self-attention's `use_gate`; its
    sublayer equals the NumPy gated attention; cached decoding equals the
    whole sequence; config round trip; refused beside MLA."""
    import references

    block = TransformerDecoderBlock(
        2,
        16,
        cross_attention=False,
        num_key_value_heads=1,
        rotary_max_wavelength=100,
        attention_output_gate=True,
        **LLAMA_STYLE,
    )
    y = to_numpy(block(X))
    attention = block.self_attention
    assert attention.use_gate is True
    assert block.get_config()["attention_output_gate"] is True
    assert "self_attention/gate/kernel" in [
        w.path.split("/", 1)[1] for w in block.weights
    ]
    # Without rotary positions the sublayer is the NumPy reference's.
    plain = TransformerDecoderBlock(
        2, 16, cross_attention=False, attention_output_gate=True
    )
    plain(X)
    causal = np.tril(np.ones((5, 5), bool))
    want, _ = references.multi_head_attention(
        plain.self_attention, X, X, mask=causal
    )
    got = to_numpy(plain.self_attention(X))
    np.testing.assert_allclose(got, want, atol=1e-5)
    # Token by token with a cache: the whole sequence's outputs.
    cache = np.zeros((2, 2, 5, 1, 4), "float32")
    steps = []
    for i in range(5):
        out, cache = block(
            X[:, i : i + 1],
            self_attention_cache=cache,
            self_attention_cache_update_index=i,
        )
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), y, atol=1e-5)
    clone = TransformerDecoderBlock.from_config(block.get_config())
    clone(X)
    clone.set_weights(block.get_weights())
    np.testing.assert_allclose(to_numpy(clone(X)), y, atol=1e-6)
    assert (
        TransformerDecoderBlock(2, 16).get_config()["attention_output_gate"]
        is False
    )
    with pytest.raises(ValueError, match="attention_output_gate"):
        TransformerDecoderBlock(2, 16, attention_output_gate="yes")
    mla = dict(
        kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4
    )
    with pytest.raises(ValueError, match="attention_output_gate"):
        TransformerDecoderBlock(
            2, 16, latent_attention=mla, attention_output_gate=True
        )


@pytest.mark.parametrize("normalization", ["rms_norm", "layer_norm"])
def test_float64_kda_block_equals_numpy_norms_and_feed_forward(normalization):
    # Keras's JAX and torch `mean` (its norms) and torch `matmul` (a
    # `Dense` without bias) compute float64 in float32.
    options = dict(LLAMA_STYLE, normalization=normalization)
    x = X.astype("float64")
    context = contextlib.nullcontext()
    if keras.backend.backend() == "jax":
        import jax

        context = jax.enable_x64(True)
    with context:
        block = TransformerDecoderBlock(
            2,
            16,
            cross_attention=False,
            mixer="kda",
            dtype="float64",
            **options,
        )
        block.build(x.shape)
        rng = np.random.default_rng(1)
        for w in block.weights:  # no ones and zeros in the norms
            w.assign(rng.normal(size=w.shape) * 0.5)
        got = to_numpy(block(x))
        w = {v.path.split("/", 1)[1]: to_numpy(v) for v in block.weights}

        def norm(v, name):
            if normalization == "rms_norm":
                ms = (v**2).mean(-1, keepdims=True)
                return v / np.sqrt(ms + 1e-5) * w[f"{name}/scale"]
            centered = v - v.mean(-1, keepdims=True)
            var = (centered**2).mean(-1, keepdims=True)
            y = centered / np.sqrt(var + 1e-5)
            return y * w[f"{name}/gamma"] + w[f"{name}/beta"]

        mixed = to_numpy(block.self_attention(norm(x, "self_attention_norm")))
    h = x + mixed
    u = norm(h, "feed_forward_norm")
    a = u @ w["feed_forward/gate_dense/kernel"]  # silu(u W_g) * (u W_i)
    hidden = (
        a / (1 + np.exp(-a)) * (u @ w["feed_forward/intermediate_dense/kernel"])
    )
    want = h + hidden @ w["feed_forward/output_dense/kernel"]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
