"""Transformer blocks with multi-head latent attention
(`latent_attention=`, DeepSeek-V2/V3's MLA): the shared harness (config,
`.keras` round trip), the self-attention is the `MultiHeadLatentAttention`
called on its own, padding masks (left padding too) and the Keras mask,
step-by-step decoding over the latent cache, packed documents,
`collect_attention`, and the options refused beside it."""

import re

import keras
import numpy as np
import pytest
from harness import run_layer_test
from harness import run_mask_test
from keras.ops import convert_to_numpy as to_numpy

import keras_attention as ka
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock

B, T, F = 2, 5, 8
X = np.random.default_rng(38).normal(size=(B, T, F)).astype("float32")
LATENT = dict(
    kv_lora_rank=6,
    qk_nope_head_dim=4,
    qk_rope_head_dim=2,
    v_head_dim=3,
    q_lora_rank=5,
    rope_theta=100.0,
)


def block(cls=TransformerDecoderBlock, **kwargs):
    kwargs = dict(dict(norm_first=True, latent_attention=LATENT), **kwargs)
    if cls is TransformerDecoderBlock:
        kwargs["cross_attention"] = False
    layer = cls(num_heads=2, intermediate_dim=12, **kwargs)
    layer(X)
    rng = np.random.default_rng(1)
    for w in layer.weights:  # non-trivial norm scales and biases
        if len(w.shape) == 1:
            w.assign((1 + 0.3 * rng.normal(size=w.shape)).astype(w.dtype))
    return layer


def test_harness_decoder_only():
    run_layer_test(
        TransformerDecoderBlock,
        dict(
            num_heads=2,
            intermediate_dim=12,
            cross_attention=False,
            use_bias=False,
            latent_attention=dict(
                LATENT,
                rotary_scaling=dict(
                    rope_type="yarn", scaling_factor=2.0, mscale_all_dim=1.0
                ),
            ),
        ),
        dict(inputs=X),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((B, T, F), (B, 2, T, T)),
        # MLA's 5 kernels and 2 norm scales (no biases: use_bias=False),
        # 2 layer norms of 2, the feed-forward's 2 kernels.
        expected_num_trainable_weights=13,
        run_saved_model=False,
        run_fit=False,
        run_mixed_precision=False,
        skip_checks=dict(
            extreme_lengths="MLA's own harness checks lengths 1 and 0"
        ),
    )


@pytest.mark.parametrize(
    "cls", [TransformerDecoderBlock, TransformerEncoderBlock]
)
def test_the_self_attention_is_the_latent_attention(cls):
    layer = block(cls)
    mla = layer.self_attention
    assert isinstance(mla, ka.layers.MultiHeadLatentAttention)
    assert mla.num_heads == 2 and mla.q_lora_rank == 5
    assert mla.attention_bias  # the block's use_bias (default True)
    valid = np.ones((B, T), bool)
    valid[1, :2] = False  # left padding: causal queries see it too
    # Pre-norm: y = x + mla(norm(x)); then x + ffn(norm(y)).
    normed = layer.self_attention_norm(X)
    attended = mla(normed, query_mask=valid, use_causal_mask=layer.causal)
    y = X + to_numpy(attended)
    want = y + to_numpy(layer.feed_forward(layer.feed_forward_norm(y)))
    got = to_numpy(layer(X, padding_mask=valid))
    np.testing.assert_allclose(got[valid], want[valid], atol=1e-5)


def test_masks():
    run_mask_test(
        TransformerDecoderBlock,
        dict(
            num_heads=2,
            intermediate_dim=12,
            cross_attention=False,
            latent_attention=LATENT,
        ),
        ("inputs",),
        ("padding_mask",),
        causal=True,
    )


@pytest.mark.tf_only(
    "the blocks' latent caches on every backend are "
    "tests/generation/test_latent_cache.py's (chunked passes through the "
    "blocks against the uncached model); 6 s more on JAX, its compiles"
)
def test_step_by_step_over_the_latent_cache_equals_the_full_pass():
    layer = block()
    valid = np.ones((B, T), bool)
    valid[0, 3:] = False  # right padding, masked as keys
    full = to_numpy(layer(X, padding_mask=valid))
    width = LATENT["kv_lora_rank"] + LATENT["qk_rope_head_dim"]
    cache = np.zeros((B, T, width), "float32")
    steps = []
    for i in range(T):
        y, cache = layer(
            X[:, i : i + 1],
            padding_mask=valid[:, i : i + 1],
            attention_mask=valid[:, None, :],
            self_attention_cache=cache,
            self_attention_cache_update_index=i,
        )
        steps.append(to_numpy(y))
    assert tuple(cache.shape) == (B, T, width)
    steps = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(steps[valid], full[valid], atol=1e-5)


@pytest.mark.tf_only(
    "the block's translation of `segment_ids` is backend-free; "
    "segment_mask and segment_positions on every backend are "
    "test_transformer_decoder_block.py's (12 s on JAX, its eager scan)"
)
def test_packed_documents_equal_documents_one_by_one():
    layer = block()
    ids = np.array([[0, 0, 0, 1, 1]] * B, "int32")
    alone = np.concatenate(
        [to_numpy(layer(X[:, :3])), to_numpy(layer(X[:, 3:]))], axis=1
    )
    packed = layer(X, segment_ids=ids)
    np.testing.assert_allclose(to_numpy(packed), alone, atol=1e-5)


def test_collect_attention_records_the_block():
    layer = block()
    inputs = keras.Input((T, F))
    model = keras.Model(inputs, layer(inputs))
    maps = ka.visualization.collect_attention(model, X)
    (name,) = maps
    assert "self_attention" in name and maps.metadata[name]["causal"]
    _, weights = layer(X, return_attention_scores=True)
    np.testing.assert_allclose(maps[name], to_numpy(weights), atol=1e-6)


def test_config_names_the_option():
    layer = block()
    config = layer.get_config()
    assert config["latent_attention"] == dict(
        LATENT, dropout=0.0, attention_bias=True
    )
    clone = TransformerDecoderBlock.from_config(config)
    clone(X)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_numpy(clone(X)), to_numpy(layer(X)), 1e-6)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(cross_attention=True), ValueError, "cross_attention=True"),
        (dict(window_size=2), ValueError, "window_size=2"),
        (dict(learned_sinks=True), ValueError, "learned_sinks=True"),
        (dict(qk_norm="rms"), ValueError, "qk_norm='rms'"),
        (dict(rotary_max_wavelength=100), ValueError, "wavelength=100"),
        (dict(rotary_fraction=0.5), ValueError, "rotary_fraction=0.5"),
        (dict(key_dim=4), ValueError, "key_dim=4"),
        (dict(num_key_value_heads=1), ValueError, "num_key_value_heads=1"),
        (dict(attention_scale=1.0), ValueError, "attention_scale=1.0"),
        (dict(score_mod=ka.scores.ALiBi()), ValueError, "score_mod="),
        (dict(latent_attention=[6, 4]), TypeError, r"=\[6, 4\]"),
        (
            dict(latent_attention=dict(LATENT, num_heads=2)),
            ValueError,
            "'num_heads'",
        ),
        (
            dict(latent_attention=dict(LATENT, qk_rope_head_dim=3)),
            ValueError,
            "qk_rope_head_dim=3",
        ),
    ],
)
def test_refusals_at_construction(kwargs, error, match):
    kwargs = dict(
        dict(cross_attention=False, latent_attention=LATENT), **kwargs
    )
    with pytest.raises(error, match=match):
        TransformerDecoderBlock(num_heads=2, intermediate_dim=12, **kwargs)


def test_refusals_at_call():
    layer = block()
    cache = np.zeros((B, T, 8), "float32")
    with pytest.raises(ValueError, match="cache_sink_tokens=1"):
        layer(
            X[:, :1],
            self_attention_cache=cache,
            self_attention_cache_update_index=0,
            self_attention_cache_sink_tokens=1,
        )
    with pytest.raises(ValueError, match="segment_ids"):
        layer(
            X[:, :1],
            segment_ids=np.zeros((B, 1), "int32"),
            self_attention_cache=cache,
            self_attention_cache_update_index=0,
        )
    with pytest.raises(ValueError, match=re.escape("index")):
        layer(
            X, self_attention_cache=cache, self_attention_cache_update_index=1
        )
