"""Blocks by composition: `self_attention=`, `feed_forward=` and the
decoder's `cross_attention=` take layers. A block given layers computes
the same as its norms and residuals wrapped around those very layers
(called on their own, the reference), for every kind of token mixer
(softmax attention, local, latent, linear, gated delta, a user's layer)
and feed-forward (`FeedForward`, `MixtureOfExperts`, a Keras `Dense`);
the layers round-trip through `.keras` files as nested configs; an
option that would configure a given layer is refused naming both; every
option of a block's config is a named parameter of its class; and a
mixer's sizes default from the block."""

import inspect

import keras
import numpy as np
import pytest
from keras import ops
from keras.ops import convert_to_numpy as to_numpy

import keras_attention as ka
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock
from keras_attention.layers import TokenMixer

B, T, F = 2, 5, 8
rng = np.random.default_rng(54)
X = rng.normal(size=(B, T, F)).astype("float32")
CONTEXT = rng.normal(size=(B, 4, 6)).astype("float32")
PADDING = np.array([[True] * T, [True] * (T - 2) + [False] * 2])


@keras.saving.register_keras_serializable(package="test_composition")
class CumulativeMean(TokenMixer, keras.layers.Layer):
    """A user's token mixer: the mean of the (unpadded) tokens so far."""

    def init_cache(self, batch_size, max_length, dtype=None):
        dtype = dtype or self.compute_dtype
        return (
            ops.zeros((batch_size, F), dtype),
            ops.zeros((batch_size, 1), dtype),
        )

    def call(
        self, inputs, padding_mask=None, cache=None, cache_update_index=None
    ):
        if padding_mask is None:
            padding_mask = ops.ones(ops.shape(inputs)[:2], "bool")
        keep = ops.cast(padding_mask, inputs.dtype)[..., None]
        sums = ops.cumsum(inputs * keep, axis=1)
        counts = ops.cumsum(keep, axis=1)
        if cache is not None:
            sums, counts = sums + cache[0][:, None], counts + cache[1][:, None]
        out = sums / ops.maximum(counts, 1.0)
        return out if cache is None else (out, (sums[:, -1], counts[:, -1]))


def _mixers():
    """`(name, make the self-attention layer, how to call it alone)`."""

    def as_self(layer):
        return lambda y, mask: layer(y, mask=mask)

    return {
        "self_attention": (
            lambda: ka.layers.SelfAttention(2, 4, causal=True, use_bias=False),
            as_self,
        ),
        "local": (
            lambda: ka.layers.LocalSelfAttention(
                2, 4, window_size=2, causal=True
            ),
            as_self,
        ),
        "multi_head": (
            lambda: ka.layers.MultiHeadAttention(2, 4, num_key_value_heads=1),
            lambda layer: (
                lambda y, mask: layer(
                    y, y, query_mask=mask, value_mask=mask, use_causal_mask=True
                )
            ),
        ),
        "latent": (
            lambda: ka.layers.MultiHeadLatentAttention(
                2,
                kv_lora_rank=4,
                qk_nope_head_dim=4,
                qk_rope_head_dim=2,
                v_head_dim=4,
            ),
            lambda layer: (
                lambda y, mask: layer(y, query_mask=mask, use_causal_mask=True)
            ),
        ),
        "linear": (
            lambda: ka.layers.LinearAttention(2, 4, decay="gated"),
            lambda layer: (
                lambda y, mask: layer(y, query_mask=mask, use_causal_mask=True)
            ),
        ),
        "gated_delta": (
            lambda: ka.layers.GatedDeltaNet(F, 2, 2, 4, 4, chunk_size=4),
            as_self,
        ),
        "user": (
            CumulativeMean,
            lambda layer: lambda y, mask: layer(y, padding_mask=mask),
        ),
    }


MIXERS = _mixers()
FEED_FORWARDS = {
    "feed_forward": lambda: ka.layers.FeedForward(12, activation="gelu"),
    "moe": lambda: ka.layers.MixtureOfExperts(3, 2, 6),
    "dense": lambda: keras.layers.Dense(F),
}


def _randomize_vectors(layer):
    """Non-trivial norm scales and biases (zeros and ones hide bugs)."""
    r = np.random.default_rng(7)
    for w in layer.weights:
        if len(w.shape) == 1:
            w.assign((1 + 0.3 * r.normal(size=w.shape)).astype(w.dtype))


def _pre_norm_reference(block, attend, x, mask):
    """`x + f(norm(x))` for the self-attention then the feed-forward,
    with the block's own norms and the given layers called alone."""
    attended = attend(block.self_attention_norm(x), mask)
    y = x + to_numpy(attended)
    return y + to_numpy(block.feed_forward(block.feed_forward_norm(y)))


@pytest.mark.parametrize("mixer", list(MIXERS))
def test_decoder_block_is_its_given_layers(mixer):
    make, caller = MIXERS[mixer]
    attention, feed_forward = make(), FEED_FORWARDS["feed_forward"]()
    block = TransformerDecoderBlock(
        cross_attention=False,
        norm_first=True,
        self_attention=attention,
        feed_forward=feed_forward,
    )
    out = to_numpy(block(X, padding_mask=PADDING))
    assert block.self_attention is attention
    assert block.feed_forward is feed_forward
    _randomize_vectors(block)
    out = to_numpy(block(X, padding_mask=PADDING))
    want = _pre_norm_reference(block, caller(attention), X, PADDING)
    np.testing.assert_allclose(out[PADDING], want[PADDING], 1e-5, 1e-5)


@pytest.mark.parametrize("name", list(FEED_FORWARDS))
def test_encoder_block_feed_forwards(name):
    feed_forward = FEED_FORWARDS[name]()
    attention = ka.layers.SelfAttention(2, 4)
    block = TransformerEncoderBlock(
        norm_first=True, self_attention=attention, feed_forward=feed_forward
    )
    block(X)
    _randomize_vectors(block)
    out = to_numpy(block(X))
    attend = MIXERS["self_attention"][1](attention)
    want = _pre_norm_reference(block, attend, X, None)
    np.testing.assert_allclose(out, want, 1e-5, 1e-5)


def test_decoder_cross_attention_layer_post_norm():
    """Post-norm, with a given cross-attention: each sublayer
    `norm(x + f(x))`, the cross-attention reading the context."""
    cross = ka.layers.CrossAttention(2, 4, qk_norm="rms")
    block = TransformerDecoderBlock(2, 16, cross_attention=cross)
    assert block.cross_attention is True
    block(X, CONTEXT)
    assert block.cross_attention_layer is cross
    _randomize_vectors(block)
    out, _, cross_scores = block(X, CONTEXT, return_attention_scores=True)
    y = to_numpy(
        block.self_attention_norm(X + to_numpy(block.self_attention(X)))
    )
    z = to_numpy(block.cross_attention_norm(y + to_numpy(cross(y, CONTEXT))))
    want = block.feed_forward_norm(z + to_numpy(block.feed_forward(z)))
    np.testing.assert_allclose(to_numpy(out), to_numpy(want), 1e-5, 1e-5)
    assert tuple(cross_scores.shape) == (B, 2, T, 4)


def test_a_mixer_sizes_default_from_the_block():
    """`mixer="gated_delta"` alone: one key and one value head per block
    head, each `features // num_heads` wide."""
    block = TransformerDecoderBlock(
        2, 32, cross_attention=False, mixer="gated_delta"
    )
    out = to_numpy(block(X))
    mixer = block.self_attention
    assert isinstance(mixer, ka.layers.GatedDeltaNet)
    sizes = (
        mixer.linear_num_key_heads,
        mixer.linear_num_value_heads,
        mixer.linear_key_head_dim,
        mixer.linear_value_head_dim,
        mixer.hidden_size,
    )
    assert sizes == (2, 2, F // 2, F // 2, F)
    assert out.shape == X.shape and np.isfinite(out).all()
    config = block.get_config()
    assert TransformerDecoderBlock.from_config(config).get_config() == config


@pytest.mark.parametrize("mixer", ["self_attention", "latent", "user"])
def test_given_layers_round_trip_through_keras_files(mixer, tmp_path):
    attention = MIXERS[mixer][0]()
    inputs = keras.Input((T, F))
    block = TransformerDecoderBlock(
        cross_attention=False,
        norm_first=True,
        normalization="rms_norm",
        self_attention=attention,
        feed_forward=ka.layers.MixtureOfExperts(3, 2, 6),
        name="block",
    )
    model = keras.Model(inputs, block(inputs))
    _randomize_vectors(block)
    config = block.get_config()
    assert config["self_attention"]["class_name"] == type(attention).__name__
    assert config["feed_forward"]["class_name"] == "MixtureOfExperts"
    # Only the options a built sublayer reads stay in the config.
    assert "qk_norm" not in config and "num_heads" not in config
    assert "moe" not in config and config["normalization"] == "rms_norm"
    path = str(tmp_path / "composed.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    layer = loaded.get_layer("block")
    assert type(layer.self_attention) is type(attention)
    np.testing.assert_allclose(
        to_numpy(loaded(X)), to_numpy(model(X)), 1e-6, 1e-6
    )


def test_given_cross_attention_round_trips(tmp_path):
    x, c = keras.Input((T, F)), keras.Input((4, 6))
    block = TransformerDecoderBlock(
        2, 16, cross_attention=ka.layers.CrossAttention(1, 8), name="block"
    )
    model = keras.Model([x, c], block(x, c))
    assert block.get_config()["cross_attention"]["class_name"] == (
        "CrossAttention"
    )
    path = str(tmp_path / "cross.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.get_layer("block").cross_attention_layer.num_heads == 1
    np.testing.assert_allclose(
        to_numpy(loaded([X, CONTEXT])), to_numpy(model([X, CONTEXT])), 1e-6
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(qk_norm="rms"), r"qk_norm='rms'.*self_attention=<"),
        (dict(window_size=2), r"window_size=2.*self_attention=<"),
        (dict(mixer="linear"), r"mixer='linear'.*self_attention=<"),
        (dict(num_heads=2), r"num_heads=2.*self_attention=<"),
        (dict(rotary_max_wavelength=100), r"wavelength=100.*self_attention"),
        (
            dict(latent_attention=dict(kv_lora_rank=4)),
            r"latent_attention=.*self_attention=<",
        ),
    ],
)
def test_options_of_a_given_self_attention_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerDecoderBlock(
            intermediate_dim=8,
            cross_attention=False,
            self_attention=ka.layers.SelfAttention(2, 4, causal=True),
            **kwargs,
        )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(moe=dict(num_experts=2, top_k=1)), r"moe=.*feed_forward=<"),
        (dict(intermediate_dim=8), r"intermediate_dim=8.*feed_forward=<"),
        (dict(activation="gelu"), r"activation='gelu'.*feed_forward=<"),
        (dict(gated_feed_forward=True), r"gated_feed_forward=True"),
    ],
)
def test_options_of_a_given_feed_forward_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerEncoderBlock(
            num_heads=2,
            feed_forward=ka.layers.FeedForward(8),
            **kwargs,
        )


def test_shared_attention_options_configure_the_built_cross_attention():
    """`qk_norm` configures every attention layer the block builds: with
    the self-attention given, the built cross-attention takes it."""
    block = TransformerDecoderBlock(
        2,
        16,
        qk_norm="rms",
        self_attention=ka.layers.SelfAttention(2, 4, causal=True),
    )
    block(X, CONTEXT)
    assert block.cross_attention_layer.qk_norm == "rms"
    assert block.self_attention.qk_norm is None
    with pytest.raises(ValueError, match=r"qk_norm='rms'.*cross_attention"):
        TransformerDecoderBlock(
            intermediate_dim=16,
            qk_norm="rms",
            self_attention=ka.layers.SelfAttention(2, 4, causal=True),
            cross_attention=ka.layers.CrossAttention(2, 4),
        )


def test_bad_layers_are_refused():
    with pytest.raises(TypeError, match="self_attention='attention'"):
        TransformerEncoderBlock(2, 8, self_attention="attention")
    with pytest.raises(TypeError, match="feed_forward=<function"):
        TransformerEncoderBlock(2, 8, feed_forward=lambda x: x)
    with pytest.raises(TypeError, match="cross_attention=<SelfAttention"):
        TransformerDecoderBlock(
            2, 8, cross_attention=ka.layers.SelfAttention(2, 4)
        )
    with pytest.raises(ValueError, match="causal=False.*causal=True"):
        TransformerDecoderBlock(
            intermediate_dim=8,
            cross_attention=False,
            self_attention=ka.layers.SelfAttention(2, 4),
        )
    with pytest.raises(ValueError, match="causal=True.*causal=False"):
        TransformerEncoderBlock(
            intermediate_dim=8,
            self_attention=ka.layers.SelfAttention(2, 4, causal=True),
        )
    with pytest.raises(ValueError, match="needs causal=True"):
        TransformerEncoderBlock(
            intermediate_dim=8,
            self_attention=ka.layers.GatedDeltaNet(F, 1, 1, 4, 4),
        )
    with pytest.raises(ValueError, match="needs causal=True"):
        TransformerEncoderBlock(
            intermediate_dim=8,
            self_attention=ka.layers.LinearAttention(2, 4, decay="gated"),
        )
    with pytest.raises(ValueError, match="num_heads=None"):
        TransformerEncoderBlock(intermediate_dim=8)
    with pytest.raises(ValueError, match="intermediate_dim=None"):
        TransformerDecoderBlock(2, cross_attention=False)
    user = TransformerDecoderBlock(
        intermediate_dim=8,
        cross_attention=False,
        self_attention=CumulativeMean(),
    )
    with pytest.raises(ValueError, match="return_attention_scores=True"):
        user(X, return_attention_scores=True)
    with pytest.raises(ValueError, match="`attention_mask` cannot apply"):
        user(X, attention_mask=np.ones((T, T), bool))


def _configs():
    """Blocks exercising every option group, built from options and from
    layers (made when the test runs)."""
    latent = dict(
        kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4
    )
    yield lambda: TransformerEncoderBlock(
        2, 8, window_size=2, global_projections=True, max_global_tokens=2
    )
    yield lambda: TransformerEncoderBlock(
        2, 8, score_mod=ka.scores.ALiBi(num_heads=2), qk_norm="rms"
    )
    yield lambda: TransformerEncoderBlock(
        self_attention=ka.layers.SelfAttention(2, 4),
        feed_forward=ka.layers.FeedForward(8),
    )
    yield lambda: TransformerDecoderBlock(
        2, 8, moe=dict(num_experts=2, top_k=1)
    )
    yield lambda: TransformerDecoderBlock(
        2, 8, cross_attention=False, latent_attention=latent
    )
    yield lambda: TransformerDecoderBlock(
        2, 8, cross_attention=False, mixer="linear", learned_sinks=False
    )
    yield lambda: TransformerDecoderBlock(
        2,
        8,
        rotary_max_wavelength=100,
        rotary_scaling={"scaling_factor": 2.0},
        rotary_fraction=0.5,
        attention_output_gate=True,
        sandwich_norm=True,
        learned_sinks=True,
        qk_norm_epsilon=1e-3,
    )
    yield lambda: TransformerDecoderBlock(
        cross_attention=ka.layers.CrossAttention(2, 4),
        self_attention=ka.layers.SelfAttention(2, 4, causal=True),
        feed_forward=ka.layers.FeedForward(8),
    )


BASE_LAYER_KEYS = {"name", "trainable", "dtype"}


@pytest.mark.parametrize("index", range(len(list(_configs()))))
def test_every_config_option_is_a_named_parameter(index):
    block = list(_configs())[index]()
    parameters = inspect.signature(type(block).__init__).parameters
    named = {
        name
        for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    options = set(block.get_config()) - BASE_LAYER_KEYS
    assert options <= named, sorted(options - named)
    # `**kwargs` only carries Keras's base Layer arguments.
    hidden = named - {"self"} - set(inspect.signature(_all_options).parameters)
    assert not hidden, sorted(hidden)


def _all_options(
    num_heads,
    intermediate_dim,
    cross_attention,
    causal,
    key_dim,
    num_key_value_heads,
    dropout,
    activation,
    norm_first,
    layer_norm_epsilon,
    rotary_max_wavelength,
    kernel_initializer,
    bias_initializer,
    window_size,
    global_projections,
    max_global_tokens,
    score_mod,
    mask_mod,
    normalization,
    use_bias,
    gated_feed_forward,
    sandwich_norm,
    rotary_scaling,
    attention_scale,
    qk_norm,
    qk_norm_epsilon,
    learned_sinks,
    rotary_fraction,
    moe,
    mixer,
    mixer_options,
    latent_attention,
    attention_output_gate,
    parallel_residual,
    self_attention,
    feed_forward,
):
    """The documented options of the blocks (signature only)."""


@pytest.mark.parametrize(
    "cls", [TransformerDecoderBlock, TransformerEncoderBlock]
)
def test_public_signatures_list_the_block_options(cls):
    """`help()` and IDEs show them: no option only reachable through
    `**kwargs` (which the base Layer's arguments use)."""
    parameters = inspect.signature(cls.__init__).parameters
    for name in (
        "qk_norm",
        "learned_sinks",
        "mixer",
        "mixer_options",
        "moe",
        "latent_attention",
        "attention_output_gate",
        "self_attention",
        "feed_forward",
        "normalization",
        "sandwich_norm",
    ):
        assert name in parameters, name
        assert f"{name}:" in cls.__doc__, name
