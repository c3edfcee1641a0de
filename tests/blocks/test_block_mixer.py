"""Transformer blocks with a linear-time token mixer (`mixer="linear"`,
`LinearAttention`; `mixer="gated_delta"`, `GatedDeltaNet`) in the
self-attention's place: the shared harness (config, `.keras` round trip
with safe_mode), the block equals the mixer layer called on its own
inside the block's norms and residuals, padding (left padding too) and
the Keras mask, step-by-step decoding over the recurrent cache, packed
documents, `collect_attention`, the non-causal encoder, and the
arguments refused beside a mixer."""

import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras.ops import convert_to_numpy as to_numpy

import keras_attention as ka
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock

B, T, F = 2, 6, 8
X = np.random.default_rng(39).normal(size=(B, T, F)).astype("float32")
DELTA = dict(
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=4,
    linear_value_head_dim=3,
    chunk_size=4,
)
MIXERS = {
    "gated_delta": DELTA,
    "linear": dict(decay="gated", chunk_size=4),
}


def block(mixer="gated_delta", cls=TransformerDecoderBlock, **kwargs):
    kwargs = dict(
        dict(norm_first=True, mixer=mixer, mixer_options=MIXERS[mixer]),
        **kwargs,
    )
    if cls is TransformerDecoderBlock:
        kwargs["cross_attention"] = False
    layer = cls(num_heads=2, intermediate_dim=12, **kwargs)
    layer(X)
    rng = np.random.default_rng(1)
    for w in layer.weights:  # non-trivial norm scales, biases, decays
        if len(w.shape) == 1:
            w.assign((1 + 0.3 * rng.normal(size=w.shape)).astype(w.dtype))
    return layer


@pytest.mark.parametrize("mixer", ["gated_delta", "linear"])
def test_harness_decoder_only(mixer):
    # GatedDeltaNet: 4 in-projections, the convolution, dt_bias, A_log,
    # the norm's scale, out_proj (9); LinearAttention (gated, use_bias):
    # q, k, v kernels and biases, the gate's kernel and bias, the output
    # norm's scale, the output kernel and bias (11). Then 2 layer norms
    # of 2 and the feed-forward's 2 kernels and 2 biases.
    mixer_weights = {"gated_delta": 9, "linear": 11}[mixer]
    run_layer_test(
        TransformerDecoderBlock,
        dict(
            num_heads=2,
            intermediate_dim=12,
            cross_attention=False,
            mixer=mixer,
            mixer_options=MIXERS[mixer],
        ),
        dict(inputs=X),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((B, T, F), (B, 2, T, T)),
        expected_num_trainable_weights=mixer_weights + 4 + 4,
        run_saved_model=False,
        run_fit=False,
        run_mixed_precision=False,
        skip_checks=dict(
            extreme_lengths="the mixers' own harnesses check lengths 1 and 0"
        ),
    )


def _alone(layer, mixer):
    """The block's mixer, rebuilt on its own from its config with the
    block's weights."""
    cls = ka.layers.GatedDeltaNet if mixer == "gated_delta" else None
    cls = cls or ka.layers.LinearAttention
    alone = cls.from_config(layer.self_attention.get_config())
    alone.build(X.shape)
    alone.set_weights(layer.self_attention.get_weights())
    return alone


@pytest.mark.parametrize("mixer", ["gated_delta", "linear"])
@pytest.mark.parametrize("norm_first", [True, False], ids=["pre", "post"])
def test_the_block_is_the_mixer_inside_norms_and_residuals(mixer, norm_first):
    layer = block(mixer, norm_first=norm_first)
    alone = _alone(layer, mixer)
    kwargs = {"use_causal_mask": True} if mixer == "linear" else {}
    ff = layer.feed_forward
    if norm_first:
        x = X + to_numpy(alone(layer.self_attention_norm(X), **kwargs))
        want = x + to_numpy(ff(layer.feed_forward_norm(x)))
    else:
        x = to_numpy(alone(X, **kwargs))
        x = to_numpy(layer.self_attention_norm(X + x))
        want = to_numpy(layer.feed_forward_norm(x + to_numpy(ff(x))))
    np.testing.assert_allclose(to_numpy(layer(X)), want, atol=1e-5)


def test_non_causal_linear_encoder_block_reads_the_whole_sequence():
    layer = block("linear", TransformerEncoderBlock, mixer_options={})
    alone = _alone(layer, "linear")
    x = X + to_numpy(alone(layer.self_attention_norm(X)))
    want = x + to_numpy(layer.feed_forward(layer.feed_forward_norm(x)))
    np.testing.assert_allclose(to_numpy(layer(X)), want, atol=1e-5)
    # Not causal: the first token reads the last one.
    later = X.copy()
    later[:, -1] *= -2.0  # not a shift, which the layer norm removes
    assert not np.allclose(to_numpy(layer(later))[:, 0], want[:, 0])


@pytest.mark.parametrize("mixer", ["gated_delta", "linear"])
def test_left_padding_and_the_keras_mask(mixer):
    """A left-padded row gives, at its tokens, the outputs of the same
    tokens right-padded (which a causal block computes as unpadded):
    padding neither writes nor decays the state, nor enters the
    convolution. The block passes the Keras mask on."""
    layer = block(mixer)
    valid = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)
    padded = np.full((B, T, F), 7.0, "float32")
    padded[0, 2:] = padded[1, :4] = X[0, :4]
    y = to_numpy(layer(padded, padding_mask=valid))
    np.testing.assert_allclose(y[0, 2:], y[1, :4], atol=1e-5)
    ids = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, F, mask_zero=True)(ids)
    out = layer(embedded)
    assert out._keras_mask is not None  # the Keras mask passed on
    model = keras.Model(ids, out)
    got = to_numpy(model(np.array([[0, 0, 3, 4, 5, 6], [3, 4, 5, 6, 0, 0]])))
    np.testing.assert_allclose(got[0, 2:], got[1, :4], atol=1e-5)


@pytest.mark.parametrize("mixer", ["gated_delta", "linear"])
def test_token_by_token_over_the_recurrent_cache(mixer):
    layer = block(mixer)
    full = to_numpy(layer(X))
    attention = layer.self_attention
    if mixer == "linear":
        cache = attention.initial_cache(B)
    else:
        cache = attention.init_cache(B)
    shapes = keras.tree.map_structure(lambda c: tuple(c.shape), cache)
    steps = []
    for i in range(0, T, 2):  # two tokens a call
        y, cache = layer(
            X[:, i : i + 2],
            self_attention_cache=cache,
            self_attention_cache_update_index=i,
        )
        steps.append(to_numpy(y))
    # The cache keeps its size whatever the length.
    assert keras.tree.map_structure(lambda c: tuple(c.shape), cache) == shapes
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("mixer", ["gated_delta", "linear"])
def test_packed_documents_equal_documents_one_by_one(mixer):
    layer = block(mixer)
    ids = np.array([[0, 0, 0, 0, 1, 1]] * B, "int32")
    alone = np.concatenate(
        [to_numpy(layer(X[:, :4])), to_numpy(layer(X[:, 4:]))], axis=1
    )
    packed = layer(X, segment_ids=ids)
    np.testing.assert_allclose(to_numpy(packed), alone, atol=1e-5)


@pytest.mark.parametrize("mixer", ["gated_delta", "linear"])
def test_collect_attention_records_the_mixer(mixer):
    layer = block(mixer)
    inputs = keras.Input((T, F))
    model = keras.Model(inputs, layer(inputs))
    maps = ka.visualization.collect_attention(model, X)
    (name,) = maps
    assert "self_attention" in name and maps.metadata[name]["causal"]
    _, weights = layer(X, return_attention_scores=True)
    np.testing.assert_allclose(maps[name], to_numpy(weights), atol=1e-6)


def test_config_and_keras_file_round_trip(tmp_path):
    layer = block("linear")
    config = layer.get_config()
    assert config["mixer"] == "linear"
    assert config["mixer_options"] == dict(MIXERS["linear"], use_bias=True)
    inputs = keras.Input((T, F))
    model = keras.Model(inputs, layer(inputs))
    path = str(tmp_path / "mixer.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(to_numpy(loaded(X)), to_numpy(model(X)), 1e-6)
    assert loaded.layers[-1].mixer == "linear"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(mixer="mamba"), ValueError, "mixer='mamba'"),
        (
            dict(mixer="attention", mixer_options=DELTA),
            ValueError,
            "mixer='attention'",
        ),
        (dict(cross_attention=True), ValueError, "cross_attention=True"),
        (dict(window_size=2), ValueError, "window_size=2"),
        (dict(learned_sinks=True), ValueError, "learned_sinks=True"),
        (
            dict(attention_output_gate=True),
            ValueError,
            "attention_output_gate=True",
        ),
        (dict(qk_norm="rms"), ValueError, "qk_norm='rms'"),
        (dict(rotary_max_wavelength=100), ValueError, "wavelength=100"),
        (dict(rotary_fraction=0.5), ValueError, "rotary_fraction=0.5"),
        (dict(key_dim=4), ValueError, "key_dim=4"),
        (dict(num_key_value_heads=1), ValueError, "num_key_value_heads=1"),
        (dict(attention_scale=1.0), ValueError, "attention_scale=1.0"),
        (dict(score_mod=ka.scores.ALiBi()), ValueError, "score_mod="),
        (
            dict(
                latent_attention=dict(
                    kv_lora_rank=6,
                    qk_nope_head_dim=4,
                    qk_rope_head_dim=2,
                    v_head_dim=3,
                )
            ),
            ValueError,
            "latent_attention=",
        ),
        (dict(mixer_options=[1]), TypeError, r"mixer_options=\[1\]"),
        (
            dict(mixer_options=dict(DELTA, hidden_size=8)),
            ValueError,
            "'hidden_size'",
        ),
        (
            dict(mixer_options=dict(linear_num_key_heads=1)),
            ValueError,
            "'linear_num_value_heads'",
        ),
        (
            dict(mixer_options=dict(DELTA, linear_key_head_dim=0)),
            ValueError,
            "linear_key_head_dim=0",
        ),
    ],
)
def test_arguments_that_cannot_apply_are_refused(kwargs, error, match):
    kwargs = dict(
        dict(
            num_heads=2,
            intermediate_dim=12,
            cross_attention=False,
            mixer="gated_delta",
            mixer_options=DELTA,
        ),
        **kwargs,
    )
    with pytest.raises(error, match=match):
        TransformerDecoderBlock(**kwargs)


def test_linear_options_and_call_arguments_refused():
    with pytest.raises(ValueError, match="'num_heads'"):
        TransformerDecoderBlock(
            2,
            12,
            cross_attention=False,
            mixer="linear",
            mixer_options=dict(num_heads=4),
        )
    with pytest.raises(ValueError, match="causal=False"):
        TransformerEncoderBlock(2, 12, mixer="gated_delta", mixer_options=DELTA)
    with pytest.raises(ValueError, match="decay='retention'.*causal=False"):
        TransformerEncoderBlock(
            2, 12, mixer="linear", mixer_options=dict(decay="retention")
        )
    layer = block("linear")
    with pytest.raises(ValueError, match="attention_mask="):
        layer(X, attention_mask=np.ones((T, T), bool))
    with pytest.raises(ValueError, match="positions="):
        layer(X, positions=np.arange(T))
