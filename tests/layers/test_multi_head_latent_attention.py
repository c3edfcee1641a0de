"""`MultiHeadLatentAttention` (DeepSeek-V2/V3's MLA): the shared harness,
equality with `transformers`' `DeepseekV3Attention` (weights copied), a
NumPy reference, cached decoding over a latent-only cache, the absorbed
form, attention weights and `collect_attention`, DeepSeek's YaRN
(`rotary_scaling` with `mscale`), explicit `positions`, argument errors
and low precision."""

import re

import keras
import numpy as np
import pytest
from harness import float64_enabled
from harness import run_layer_test
from harness import run_mask_test
from keras import ops
from references import multi_head_latent_attention
from transformers_script import run_reference_script

from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import MultiHeadLatentAttention
from keras_attention.visualization import collect_attention

RNG = np.random.default_rng(0)
HIDDEN = 16
X = RNG.normal(size=(2, 6, HIDDEN)).astype("float32")
SIZES = dict(
    num_heads=2,
    kv_lora_rank=8,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=3,
)
# DeepSeek's YaRN at a small scale: with p=4, theta=500 and these
# boundaries one frequency is extrapolated, the other interpolated.
YARN = dict(
    rope_type="yarn",
    scaling_factor=4.0,
    original_max_position_embeddings=16,
    beta_fast=4.0,
    beta_slow=1.0,
)


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32")).astype("float64")


def _layer(**kwargs):
    layer = MultiHeadLatentAttention(**dict(SIZES, **kwargs))
    layer.build(X.shape)
    rng = np.random.default_rng(1)
    # Non-trivial norm scales and biases (ones and zeros hide mistakes).
    for w in layer.weights:
        if len(w.shape) == 1:
            w.assign((1 + 0.3 * rng.normal(size=w.shape)).astype(w.dtype))
    return layer


# --- The shared harness ------------------------------------------------------


@pytest.mark.parametrize("q_lora_rank", [None, 4])
def test_harness(q_lora_rank):
    full = q_lora_rank is not None  # SavedModel, fit: once is enough.
    scaling = dict(YARN, mscale=0.7, mscale_all_dim=1.0) if full else None
    run_layer_test(
        MultiHeadLatentAttention,
        dict(
            SIZES,
            q_lora_rank=q_lora_rank,
            dropout=0.1,
            seed=1,
            rotary_scaling=scaling,
        ),
        dict(query=X),
        call_kwargs=dict(use_causal_mask=True),
        expected_output_shape=X.shape,
        expected_num_trainable_weights=7 if full else 5,
        expected_num_seed_generators=1,
        run_saved_model=full,
        run_fit=full,
        run_mixed_precision=full,
    )


def test_masks():
    run_mask_test(
        MultiHeadLatentAttention,
        dict(SIZES, attention_bias=True),
        ("query",),
        ("query_mask",),
        call_kwargs=dict(use_causal_mask=True),
        causal=True,
    )


# --- The NumPy reference (tests/references.py) -------------------------------


def mla_reference(layer, x, valid=None, causal=True, return_weights=False):
    """`references.multi_head_latent_attention` (MLA in float64, the
    naive form) with the padding `valid` `(b, t)` of queries and keys and
    the causal mask; then the attention weights `(b, h, t, t)` if
    `return_weights`."""
    b, t, _ = x.shape
    allowed = np.ones((b, t, t), bool)
    if causal:
        allowed = allowed & np.tril(np.ones((t, t), bool))
    if valid is not None:
        allowed = allowed & valid[:, None, :] & valid[:, :, None]
    output, weights = multi_head_latent_attention(layer, x, allowed)
    return (output, weights) if return_weights else output


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(q_lora_rank=4, rope_interleave=False, attention_bias=True),
    ],
    ids=["default", "lora-halves-bias"],
)
def test_matches_numpy_reference(kwargs):
    layer = _layer(**kwargs)
    valid = np.array([[True] * 6, [True] * 4 + [False] * 2])
    out = np_(layer(X, query_mask=valid, use_causal_mask=True))
    expected = mla_reference(layer, X.astype("float64"), valid)
    np.testing.assert_allclose(out[valid], expected[valid], atol=2e-5)


def test_nope_rotates_nothing():
    """`rope_theta=None` (Kimi Linear's MLA, NoPE): the rope features of
    queries and of the shared key are used as projected (the NumPy
    reference without rotation), so positions change nothing; cached
    decoding equals the uncached call; the config round-trips."""
    layer = _layer(q_lora_rank=4, rope_theta=None)
    valid = np.array([[True] * 6, [True] * 4 + [False] * 2])
    out = np_(layer(X, query_mask=valid, use_causal_mask=True))
    expected = mla_reference(layer, X.astype("float64"), valid)
    np.testing.assert_allclose(out[valid], expected[valid], atol=2e-5)
    moved = layer(
        X, query_mask=valid, use_causal_mask=True, positions=np.arange(6) + 7
    )
    np.testing.assert_allclose(np_(moved), out, atol=1e-6)
    decoded, _ = _decode(layer, X, prefill=3, max_length=8)
    full = np_(layer(X, use_causal_mask=True))
    np.testing.assert_allclose(decoded, full, atol=2e-5)
    config = layer.get_config()
    assert MultiHeadLatentAttention.from_config(config).rope_theta is None
    with pytest.raises(ValueError, match=re.escape("rope_theta=None")):
        MultiHeadLatentAttention(**SIZES, rope_theta=None, rotary_scaling=YARN)


@pytest.mark.parametrize("absorb", [False, True])
def test_attention_weights_match_numpy_reference(absorb):
    layer = _layer(q_lora_rank=4, absorb=absorb)
    valid = np.array([[True] * 6, [True] * 4 + [False] * 2])
    out, weights = layer(
        X, query_mask=valid, use_causal_mask=True, return_attention_scores=True
    )
    expected, expected_weights = mla_reference(
        layer, X.astype("float64"), valid, return_weights=True
    )
    assert tuple(weights.shape) == (2, 2, 6, 6)
    # Padded queries and keys get zero weights, as in the reference.
    np.testing.assert_allclose(np_(weights), expected_weights, atol=1e-5)
    np.testing.assert_allclose(np_(out)[valid], expected[valid], atol=2e-5)


def test_attention_weights_with_a_cache_come_before_it():
    """`(output, weights, cache)`, `MultiHeadAttention`'s order; the
    weights cover the cache's slots, zero on the unfilled ones."""
    layer = _layer()
    _, expected = mla_reference(layer, X.astype("float64"), return_weights=True)
    cache = np.zeros((2, 8, layer.cache_dim), "float32")
    out, weights, cache = layer(
        X,
        cache=cache,
        cache_update_index=0,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    assert tuple(cache.shape) == (2, 8, layer.cache_dim)
    assert tuple(weights.shape) == (2, 2, 6, 8)
    np.testing.assert_allclose(np_(weights)[..., :6], expected, atol=1e-5)
    assert not np.any(np_(weights)[..., 6:])


def test_collect_attention_records_the_layer():
    inputs = keras.Input((6, HIDDEN))
    mla = MultiHeadLatentAttention(**SIZES, name="mla")
    x = mla(inputs, use_causal_mask=True)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    maps = collect_attention(model, X)
    assert list(maps) == ["mla"]
    _, weights = mla(X, use_causal_mask=True, return_attention_scores=True)
    np.testing.assert_allclose(maps["mla"], np_(weights), atol=1e-6)
    meta = maps.metadata["mla"]
    assert meta["kind"] == "self" and meta["causal"]
    assert np.all(np.triu(maps["mla"][0, 0], 1) == 0)


def test_float64_layer_stays_float64():
    # Keras's torch `matmul` (a `Dense` without bias) computes float64 in
    # float32: the projections must not go through it. No rotary
    # positions: `RotaryEmbedding` rotates in float32 (keras-hub's rule).
    valid = np.array([[True] * 6, [False] * 2 + [True] * 4])
    x = X.astype("float64")
    with float64_enabled():
        layer = _layer(q_lora_rank=4, rope_theta=None, dtype="float64")
        out = layer(x, query_mask=valid, use_causal_mask=True)
        dtype = keras.backend.standardize_dtype(out.dtype)
        out = ops.convert_to_numpy(out)
    assert dtype == "float64"
    expected = mla_reference(layer, x, valid)
    np.testing.assert_allclose(out[valid], expected[valid], atol=1e-12)


def test_positions_restarting_per_packed_document():
    """Two documents packed in one row, positions restarting at each and
    a block-diagonal causal mask: each gets its own result (the NumPy
    reference on each document alone)."""
    layer = _layer()
    doc = np.repeat([0, 1], 3)
    allowed = (doc[:, None] == doc[None, :]) & np.tril(np.ones((6, 6), bool))
    out = np_(
        layer(X, attention_mask=allowed, positions=np.array([0, 1, 2] * 2))
    )
    x = X.astype("float64")
    for part in (slice(0, 3), slice(3, 6)):
        expected = mla_reference(layer, x[:, part])
        np.testing.assert_allclose(out[:, part], expected, atol=2e-5)


def test_rope_interleave_default_matches_transformers_config():
    layer = MultiHeadLatentAttention(**SIZES)
    assert layer.rope_interleave is True
    assert layer.get_config()["rope_interleave"] is True


# --- transformers' DeepseekV3Attention ---------------------------------------

# Runs in a subprocess: importing transformers pulls triton, which crashes
# beside TensorFlow in one process. One subprocess per module (fixture).
_REFERENCE_SCRIPT = r"""
import json, sys
import numpy as np
import torch
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

cases = json.loads(sys.argv[1])
x = np.load(sys.argv[2])["x"]
out = {}
for i, case in enumerate(cases):
    config = DeepseekV3Config(
        hidden_size=x.shape[-1],
        num_attention_heads=case["num_heads"],
        num_key_value_heads=case["num_heads"],
        kv_lora_rank=case["kv_lora_rank"],
        q_lora_rank=case["q_lora_rank"],
        qk_nope_head_dim=case["qk_nope_head_dim"],
        qk_rope_head_dim=case["qk_rope_head_dim"],
        v_head_dim=case["v_head_dim"],
        rope_interleave=case["rope_interleave"],
        attention_bias=case["attention_bias"],
        rope_parameters=dict(
            case.get("rope") or {"rope_type": "default"},
            rope_theta=case["theta"],
        ),
        max_position_embeddings=64,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(i)
    attention = m.DeepseekV3Attention(config, layer_idx=0).float().eval()
    with torch.no_grad():
        for p in attention.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    rotary = m.DeepseekV3RotaryEmbedding(config)
    hidden = torch.from_numpy(x)
    t = x.shape[1]
    positions = torch.arange(t)[None].expand(x.shape[0], t)
    if case.get("positions") is not None:
        positions = torch.tensor(case["positions"])
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        y, weights = attention(hidden, rotary(hidden, positions), mask)
    out[f"{i}/output"] = y.numpy()
    out[f"{i}/weights"] = weights.numpy()
    for name, p in attention.named_parameters():
        out[f"{i}/{name}"] = p.detach().numpy()
np.savez(sys.argv[3], **out)
"""

TRANSFORMERS_CASES = [
    dict(SIZES, q_lora_rank=None, rope_interleave=True, attention_bias=False),
    dict(SIZES, q_lora_rank=4, rope_interleave=True, attention_bias=True),
    dict(SIZES, q_lora_rank=4, rope_interleave=False, attention_bias=False),
    # DeepSeek-V3's YaRN (mscale = mscale_all_dim: cos and sin unscaled,
    # the softmax scale multiplied by m(f)^2), and DeepSeek-V2's kind
    # (unequal: both corrections), the latter at explicit positions.
    dict(
        SIZES,
        q_lora_rank=4,
        rope_interleave=True,
        attention_bias=False,
        rope=dict(YARN, mscale=1.0, mscale_all_dim=1.0),
    ),
    dict(
        SIZES,
        q_lora_rank=None,
        rope_interleave=False,
        attention_bias=True,
        rope=dict(YARN, mscale=0.707, mscale_all_dim=1.3),
        positions=[[0, 1, 2, 0, 1, 2], [9, 10, 11, 12, 13, 14]],
    ),
]
for _case in TRANSFORMERS_CASES:
    _case["theta"] = 500.0
    if "rope" in _case:  # transformers' name for `scaling_factor`
        _case["rope"] = dict(_case["rope"])
        _case["rope"]["factor"] = _case["rope"].pop("scaling_factor")


@pytest.fixture(scope="module")
def transformers_outputs():
    return run_reference_script(
        _REFERENCE_SCRIPT,
        TRANSFORMERS_CASES,
        "the DeepseekV3Attention reference",
        x=X,
    )


def _copy_torch_weights(layer, weights, i):
    for name in (
        "q_proj",
        "q_a_proj",
        "q_b_proj",
        "kv_a_proj_with_mqa",
        "kv_b_proj",
        "o_proj",
    ):
        dense = getattr(layer, name)
        if dense is None:
            continue
        dense.kernel.assign(weights[f"{i}/{name}.weight"].T)
        if dense.bias is not None:
            dense.bias.assign(weights[f"{i}/{name}.bias"])
    for name in ("q_a_layernorm", "kv_a_layernorm"):
        if getattr(layer, name) is not None:
            getattr(layer, name).scale.assign(weights[f"{i}/{name}.weight"])


def _from_case(case):
    """The layer of a `TRANSFORMERS_CASES` entry (`rope` renamed back)."""
    scaling = case.get("rope")
    if scaling is not None:
        scaling = dict(scaling)
        scaling["scaling_factor"] = scaling.pop("factor")
    skip = ("theta", "rope", "positions")
    return MultiHeadLatentAttention(
        **{k: v for k, v in case.items() if k not in skip},
        rope_theta=case["theta"],
        rotary_scaling=scaling,
    )


@pytest.mark.parametrize(
    "i",
    range(len(TRANSFORMERS_CASES)),
    ids=[
        "interleave",
        "interleave-lora-bias",
        "halves-lora",
        "yarn-v3",
        "yarn-v2-positions",
    ],
)
def test_matches_transformers_deepseek_v3(transformers_outputs, i):
    case = TRANSFORMERS_CASES[i]
    layer = _from_case(case)
    layer.build(X.shape)
    _copy_torch_weights(layer, transformers_outputs, i)
    expected = transformers_outputs[f"{i}/output"]
    expected_weights = transformers_outputs[f"{i}/weights"]
    positions = case.get("positions")
    positions = None if positions is None else np.array(positions)
    for absorb in (False, True):  # The absorbed form gives the same.
        layer.absorb = absorb
        out, weights = layer(
            X,
            use_causal_mask=True,
            positions=positions,
            return_attention_scores=True,
        )
        np.testing.assert_allclose(np_(out), expected, atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(np_(weights), expected_weights, atol=1e-5)


# --- Cached decoding ---------------------------------------------------------


def _decode(layer, x, prefill, max_length):
    cache = np.zeros((x.shape[0], max_length, layer.cache_dim), "float32")
    out, cache = layer(
        x[:, :prefill], cache=cache, cache_update_index=0, use_causal_mask=True
    )
    outs = [np_(out)]
    for i in range(prefill, x.shape[1]):
        out, cache = layer(
            x[:, i : i + 1],
            cache=cache,
            cache_update_index=i,
            use_causal_mask=True,
        )
        outs.append(np_(out))
    return np.concatenate(outs, axis=1), cache


@pytest.mark.parametrize("absorb", [None, False])
def test_cached_decoding_equals_uncached(absorb):
    layer = _layer(q_lora_rank=4, absorb=absorb)
    full = np_(layer(X, use_causal_mask=True))
    decoded, cache = _decode(layer, X, prefill=3, max_length=8)
    np.testing.assert_allclose(decoded, full, atol=2e-5)
    # The cache holds the latent only: (b, max_length, r + p).
    assert tuple(cache.shape) == (2, 8, 8 + 4)
    assert cache.shape[-1] == layer.kv_lora_rank + layer.qk_rope_head_dim
    # Its entries are this layer's latents; the slots not written stay 0.
    np.testing.assert_allclose(
        np_(cache)[:, :6], np_(layer.latents(X)), atol=1e-5
    )
    assert not np.any(np_(cache)[:, 6:])


def test_absorbed_equals_naive_with_masks():
    naive = _layer(absorb=False)
    absorbed = MultiHeadLatentAttention(**SIZES, absorb=True)
    absorbed.build(X.shape)
    absorbed.set_weights(naive.get_weights())
    valid = np.array([[True] * 6, [False, True, True, True, True, False]])
    allowed = np.random.default_rng(3).random((2, 6, 6)) < 0.7
    for layer_kwargs in (
        dict(query_mask=valid, attention_mask=allowed),
        dict(use_causal_mask=True),
    ):
        a = np_(naive(X, **layer_kwargs))
        b = np_(absorbed(X, **layer_kwargs))
        np.testing.assert_allclose(a, b, atol=2e-5)


def test_cache_bytes_against_multi_head_attention():
    """Per token: `r + p` numbers against `2 h (n + p)` for an MHA cache of
    the same heads and key width (here 12 against 32)."""
    layer = _layer()
    _, cache = _decode(layer, X[:, :2], prefill=1, max_length=4)
    mha = MultiHeadAttention(SIZES["num_heads"], layer.qk_head_dim)
    width = (2, 2, 4, SIZES["num_heads"], layer.qk_head_dim)
    _, _, mha_cache = mha(
        X[:, :1],
        X[:, :1],
        cache=np.zeros(width, "float32"),
        cache_update_index=0,
        return_attention_scores=True,
    )
    per_token = cache.shape[-1]
    mha_per_token = int(np.prod(mha_cache.shape)) // (2 * 4)
    assert per_token == layer.kv_lora_rank + layer.qk_rope_head_dim
    assert mha_per_token == 2 * layer.num_heads * layer.qk_head_dim
    assert mha_per_token / per_token == pytest.approx(32 / 12)


def test_cache_index_past_the_end_is_refused():
    layer = _layer()
    cache = np.zeros((2, 4, layer.cache_dim), "float32")
    with pytest.raises(ValueError, match="cache_update_index"):
        layer(X[:, :2], cache=cache, cache_update_index=3)
    with pytest.raises(ValueError, match="cache_update_index"):
        layer(X[:, :1], cache=cache, cache_update_index=-1)
    with pytest.raises(ValueError, match="cache_update_index"):
        layer(X[:, :1], cache=cache)
    with pytest.raises(ValueError, match=re.escape("cache.shape=(2, 4, 5)")):
        layer(X[:, :1], cache=cache[..., :5], cache_update_index=0)


# --- Arguments and precision -------------------------------------------------


@pytest.mark.parametrize(
    "name,value",
    [
        ("num_heads", 0),
        ("kv_lora_rank", 2.5),
        ("qk_nope_head_dim", "4"),
        ("qk_rope_head_dim", 3),
        ("v_head_dim", True),
        ("q_lora_rank", 0),
        ("rope_theta", 0.5),
        ("rope_interleave", "True"),
        ("attention_bias", 1),
        ("rms_norm_eps", float("nan")),
        ("dropout", 1.0),
        ("absorb", "yes"),
        ("seed", 1.5),
    ],
)
def test_argument_errors_name_the_value(name, value):
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r}")):
        MultiHeadLatentAttention(**dict(SIZES, **{name: value}))


@pytest.mark.parametrize(
    "scaling,error,match",
    [
        (dict(scaling_factor=2.0, mscale=1.0), ValueError, "mscale=1.0"),
        (dict(YARN, mscale_all_dim=-1.0), ValueError, "mscale_all_dim=-1.0"),
        (dict(YARN, factor=4.0), ValueError, "unknown: ['factor']"),
        (dict(YARN, scaling_factor=0.5), ValueError, "scaling_factor=0.5"),
        ([("rope_type", "yarn")], TypeError, "rotary_scaling=["),
    ],
)
def test_rotary_scaling_errors_name_the_value(scaling, error, match):
    with pytest.raises(error, match=re.escape(match)):
        MultiHeadLatentAttention(**SIZES, rotary_scaling=scaling)


def test_query_shape_errors():
    layer = MultiHeadLatentAttention(**SIZES)
    with pytest.raises(ValueError, match="query_shape"):
        layer(X[0])
    layer(X)
    with pytest.raises(ValueError, match="query_shape"):
        layer(X[..., :8])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision(dtype):
    """Close to float32 on ordinary inputs; finite where `q . k` is far
    beyond float16's range (the scores are formed in float32)."""
    layer = _layer()
    low = MultiHeadLatentAttention(**SIZES, dtype=dtype)
    low.build(X.shape)
    low.set_weights(layer.get_weights())
    x = X.astype(dtype)
    expected = np_(layer(x.astype("float32"), use_causal_mask=True))
    out = low(x, use_causal_mask=True)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    scale = np.max(np.abs(expected))
    np.testing.assert_allclose(np_(out), expected, atol=0.03 * scale)
    for name in ("q_proj", "kv_b_proj"):
        kernel = getattr(low, name).kernel
        kernel.assign((np_(kernel) * 300).astype(kernel.dtype))
    q_nope, _ = low._queries(x, 0)
    k_nope = np_(low.kv_b_proj(low.latents(x)[..., :8]))[..., :4]
    assert np.max(np.abs(np_(q_nope)[..., 0, :] @ k_nope[0, 0])) > 65504
    assert np.all(np.isfinite(np_(low(x, use_causal_mask=True))))
