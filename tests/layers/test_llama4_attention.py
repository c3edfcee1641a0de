"""Llama 4's attention options of `MultiHeadAttention`: attention
temperature tuning (`temperature_tuning`) against a NumPy reference, its
positions (`cache_update_index`, `positions`) and cached decoding; the
weightless QK-norm `qk_norm="l2"`; and a layer configured as Llama 4's
(NoPE with temperature tuning; rotary, chunked and L2-normed) equal to
transformers' `Llama4TextAttention` with copied weights, on unpadded
rows (transformers computes the temperature from the index in the padded
sequence)."""

import contextlib

import keras
import numpy as np
import pytest
from keras import ops
from references import multi_head_attention
from transformers_script import run_reference_script

from keras_attention import mods
from keras_attention.layers import SelfAttention

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 7, 16)).astype("float32")
TUNING = {"floor_scale": 2.0, "scale": 0.5}


def np_(x):
    return ops.convert_to_numpy(x)


def np_factors(positions, floor_scale=2.0, scale=0.5):
    return 1.0 + scale * np.log(1.0 + np.floor((positions + 1) / floor_scale))


def tuned(**options):
    layer = SelfAttention(
        2, 8, causal=True, temperature_tuning=TUNING, **options
    )
    layer(X[:, :1])
    return layer


def test_temperature_tuning_equals_numpy():
    layer = tuned()
    causal = np.tril(np.ones((7, 7), bool))[None, None]
    # The queries times the factor: the scale of the scores per query.
    scale = np_factors(np.arange(7))[None, None, :, None] / np.sqrt(8)
    want, _ = multi_head_attention(layer, X, X, mask=causal, scale=scale)
    np.testing.assert_allclose(np_(layer(X)), want, atol=1e-5)


def test_float64_temperature_factors_stay_float64():
    # Keras's JAX and torch `floor` return float32 for float64.
    from keras_attention.layers._projections import temperature_factors

    positions = np.array([0, 5, 1000, 123456])
    context = contextlib.nullcontext()
    if keras.backend.backend() == "jax":
        import jax

        context = jax.enable_x64(True)
    with context:
        factors = temperature_factors(positions, TUNING, "float64")
        dtype = keras.backend.standardize_dtype(factors.dtype)
        factors = np_(factors)[0, :, 0, 0]
    assert dtype == "float64"
    np.testing.assert_allclose(
        factors, np_factors(positions), rtol=1e-15, atol=0
    )


def _slow_on_jax(test):
    if keras.backend.backend() != "jax":
        return test
    return pytest.mark.slow(
        reason="JAX compiles each op per shape (3 s); the temperature "
        "formula is test_temperature_tuning_equals_numpy's on JAX too"
    )(test)


@_slow_on_jax
def test_temperature_positions_and_cache():
    layer = tuned()
    whole = np_(layer(X))
    # `positions` replace the index: shifted by 3, as the row's tokens
    # would be after 3 others.
    shifted = np_(layer(X, positions=np.arange(3, 10)))
    causal = np.tril(np.ones((7, 7), bool))[None, None]
    scale = np_factors(np.arange(3, 10))[None, None, :, None] / np.sqrt(8)
    want, _ = multi_head_attention(layer, X, X, mask=causal, scale=scale)
    np.testing.assert_allclose(shifted, want, atol=1e-5)
    cache = layer.init_cache(2, 7)
    got = []
    for start, stop in ((0, 3), (3, 4), (4, 7)):
        out, cache = layer(
            X[:, start:stop], cache=cache, cache_update_index=start
        )
        got.append(np_(out))
    np.testing.assert_allclose(np.concatenate(got, 1), whole, atol=1e-5)


def test_l2_qk_norm_has_no_weights_and_normalizes_each_head():
    layer = SelfAttention(2, 8, causal=True, qk_norm="l2", use_bias=False)
    layer(X[:, :1])
    assert layer.query_norm.weights == [] and layer.key_norm.weights == []
    assert len(layer.weights) == 4  # the four projections only
    q = np_(layer.query_dense(X)).astype("float64")
    normed = np_(layer.query_norm(layer.query_dense(X)))
    want = q / np.sqrt((q**2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(normed, want, atol=1e-5)


def test_config_round_trip_and_refusals():
    layer = tuned(qk_norm="l2")
    config = layer.get_config()
    assert config["temperature_tuning"] == TUNING
    clone = SelfAttention.from_config(config)
    clone(X[:, :1])
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(np_(clone(X)), np_(layer(X)), atol=1e-6)
    assert SelfAttention(2, 8, temperature_tuning={}).temperature_tuning == {
        "floor_scale": 8192.0,
        "scale": 0.1,
    }
    for bad in ({"floor": 2}, {"floor_scale": 0}, {"scale": -1.0}, 0.1):
        with pytest.raises(ValueError, match="floor_scale|scale|temperature"):
            SelfAttention(2, 8, temperature_tuning=bad)


# --- transformers' Llama4TextAttention --------------------------------------

CONFIG = dict(
    vocab_size=16,
    hidden_size=16,
    intermediate_size=16,
    intermediate_size_mlp=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    no_rope_layers=[1, 0],  # layer 0 rotary (chunked), layer 1 NoPE
    attention_chunk_size=3,
    attn_temperature_tuning=True,
    floor_scale=2,
    attn_scale=0.5,
    use_qk_norm=True,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 100.0},
)

# Runs in a subprocess: transformers imports torch, which must not share
# a process with TensorFlow.
_REFERENCE_SCRIPT = r"""
import json
import sys

import numpy as np
import torch
from transformers.models.llama4 import modeling_llama4 as m
from transformers.models.llama4.configuration_llama4 import Llama4TextConfig

config = Llama4TextConfig(**json.loads(sys.argv[1]))
config._attn_implementation = "eager"
x = torch.tensor(np.load(sys.argv[2])["x"])
batch, steps, _ = x.shape
freqs = m.Llama4TextRotaryEmbedding(config)(
    x, torch.arange(steps)[None].expand(batch, steps)
)
q, k = torch.arange(steps)[:, None], torch.arange(steps)[None]
torch.manual_seed(0)
out = {}
for i in range(config.num_hidden_layers):
    attention = m.Llama4TextAttention(config, i).eval()
    allowed = k <= q
    if config.layer_types[i] == "chunked_attention":
        size = config.attention_chunk_size
        allowed = allowed & (k // size == q // size)
    mask = torch.where(allowed, 0.0, float("-inf"))[None, None]
    with torch.no_grad():
        for name, p in attention.named_parameters():
            p.normal_(0.0, 0.3)
            out[f"{i}/{name}"] = p.numpy().copy()
        out[f"{i}/output"] = attention(x, freqs, mask)[0].numpy()
np.savez(sys.argv[3], **out)
"""


@pytest.fixture(scope="module")
def transformers_outputs():
    return run_reference_script(
        _REFERENCE_SCRIPT, CONFIG, "the Llama4TextAttention reference", x=X
    )


def llama4_layer(i, weights):
    """Our layer `i` of `CONFIG`, its weights those of transformers'."""
    rope = CONFIG["no_rope_layers"][i] == 1
    layer = SelfAttention(
        4,
        8,
        causal=True,
        num_key_value_heads=2,
        use_bias=False,
        rotary_max_wavelength=100.0 if rope else None,
        qk_norm="l2" if rope else None,
        qk_norm_epsilon=CONFIG["rms_norm_eps"],
        mask_mod=mods.ChunkedCausalMask(3) if rope else None,
        temperature_tuning=None if rope else TUNING,
    )
    layer(X[:, :1])
    # transformers rotates interleaved pairs (2m, 2m + 1), ours the halves
    # (m, m + 4): the same features of q and k reordered, the same scores.
    order = np.r_[0:8:2, 1:8:2] if rope else np.arange(8)

    def heads(name, count):
        w = weights[f"{i}/{name}.weight"].reshape(count, 8, 16)
        return w[:, order].transpose(2, 0, 1)

    layer.query_dense.kernel.assign(heads("q_proj", 4))
    layer.key_dense.kernel.assign(heads("k_proj", 2))
    value = weights[f"{i}/v_proj.weight"].reshape(2, 8, 16)
    layer.value_dense.kernel.assign(value.transpose(2, 0, 1))
    output = weights[f"{i}/o_proj.weight"].T.reshape(4, 8, 16)
    layer.output_dense.kernel.assign(output)
    return layer


@pytest.mark.slow(
    reason="a transformers subprocess (20 s); the llama4_text case of "
    "tests/interop/test_from_huggingface.py compares both kinds of layer "
    "in the fast tier, in the subprocess every case shares"
)
@pytest.mark.parametrize("i", [0, 1], ids=["chunked_rope_l2", "nope_tuned"])
def test_equals_transformers_llama4_text_attention(i, transformers_outputs):
    layer = llama4_layer(i, transformers_outputs)
    got = np_(layer(X))
    want = transformers_outputs[f"{i}/output"]
    np.testing.assert_allclose(got, want, atol=1e-4)
    # Cached decoding: the rotary layer over its chunk ring.
    options = {"sink_tokens": 0} if i == 0 else {}
    cache = layer.init_cache(2, 7, **options)
    pieces = []
    for start, stop in ((0, 4), (4, 5), (5, 7)):
        out, cache = layer(
            X[:, start:stop], cache=cache, cache_update_index=start
        )
        pieces.append(np_(out))
    np.testing.assert_allclose(np.concatenate(pieces, 1), want, atol=1e-4)


def test_the_tuning_changes_the_output():
    # Not vacuous: without the tuning the NoPE layer differs.
    layer = tuned()
    plain = SelfAttention(2, 8, causal=True)
    plain(X[:, :1])
    plain.set_weights(layer.get_weights())
    assert np.abs(np_(plain(X)) - np_(layer(X))).max() > 1e-3
