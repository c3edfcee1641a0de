"""`LightningIndexer` and `MultiHeadLatentAttention(indexer={...})`
(DeepSeek Sparse Attention): a NumPy reference of the indexer, its top-k
choice (ties lowest position first, short rows), its caches, the
distillation loss, and equality with `transformers`' `DeepseekV32Indexer`
and `DeepseekV32Attention` with copied weights (prefill, absorbed,
weights, cached decoding)."""

import re

import keras
import numpy as np
import pytest
from harness import float64_enabled
from harness import run_layer_test
from keras import ops
from transformers_script import run_reference_script

from keras_attention.layers import LightningIndexer
from keras_attention.layers import MultiHeadLatentAttention

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(0)
HIDDEN = 16
X = RNG.normal(size=(2, 9, HIDDEN)).astype("float32")


def np_(x):
    return ops.convert_to_numpy(x)


def _indexer(top_k=3, query_dim=None, **kwargs):
    layer = LightningIndexer(
        num_heads=2, head_dim=8, top_k=top_k, rope_theta=500.0, **kwargs
    )
    layer.build(X.shape, query_dim and (None, None, query_dim))
    rng = np.random.default_rng(1)
    for w in layer.weights:
        if len(w.shape) == 1:  # k_norm: non-trivial gamma and beta
            w.assign((1 + 0.3 * rng.normal(size=w.shape)).astype(w.dtype))
    return layer


# --- The NumPy reference ----------------------------------------------------


def np_rope(x, positions, p, theta):
    """Halves rotation of the first `p` features of `(b, t, heads, d)`."""
    if not p:
        return x
    inv = theta ** (-np.arange(0, p, 2) / p)
    angle = positions[..., None].astype("float64") * inv  # (b, t, p/2)
    cos, sin = np.cos(angle)[:, :, None], np.sin(angle)[:, :, None]
    x1, x2 = x[..., : p // 2], x[..., p // 2 : p]
    rotated = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    return np.concatenate([rotated, x[..., p:]], -1)


def np_scores(layer, x, query_inputs, positions, key_positions=None):
    """`I[t, s]` from the formula, float64."""
    w = {
        "/".join(v.path.split("/")[-2:]): np_(v).astype("float64")
        for v in layer.weights
    }
    h, d, p = layer.num_heads, layer.head_dim, layer.rope_head_dim
    q = (query_inputs @ w["wq_b/kernel"]).reshape(x.shape[:2] + (h, d))
    q = np_rope(q, positions, p, layer.rope_theta)
    k = x @ w["wk/kernel"]
    mean = k.mean(-1, keepdims=True)
    var = ((k - mean) ** 2).mean(-1, keepdims=True)
    k = (k - mean) / np.sqrt(var + layer.layer_norm_epsilon)
    k = k * w["k_norm/gamma"] + w["k_norm/beta"]
    kp = positions if key_positions is None else key_positions
    k = np_rope(k[:, :, None], kp, p, layer.rope_theta)[:, :, 0]
    dots = np.maximum(np.einsum("bthd,bsd->bths", q, k) / np.sqrt(d), 0)
    weights = x @ w["weights_proj/kernel"] / np.sqrt(h)
    return np.einsum("bths,bth->bts", dots, weights)


def np_top_k(scores, allowed, top_k):
    """Each row's `top_k` best allowed keys, equal scores lowest position
    first, as a sorted list."""
    out = np.full(scores.shape[:2] + (top_k,), -1)
    for n in range(scores.shape[0]):
        for i in range(scores.shape[1]):
            keys = np.flatnonzero(allowed[n, i])
            order = sorted(keys, key=lambda s: (-scores[n, i, s], s))
            kept = sorted(order[:top_k])
            out[n, i, : len(kept)] = kept
    return out


def _causal(b, t, s, start=0):
    i = np.arange(t)[:, None] + start
    return np.broadcast_to(np.arange(s)[None] <= i, (b, t, s))


# --- The layer --------------------------------------------------------------


def test_matches_numpy_reference_with_padding():
    layer = _indexer(top_k=3, query_dim=6)
    q_in = RNG.normal(size=(2, 9, 6)).astype("float32")
    padding = np.ones((2, 9), bool)
    padding[1, :2] = False
    positions = np.tile(np.arange(9), (2, 1))
    scores, indices = layer(X, query_inputs=q_in, padding_mask=padding)
    want = np_scores(layer, X.astype("float64"), q_in, positions)
    allowed = _causal(2, 9, 9) & padding[:, None, :] & padding[:, :, None]
    scores = np_(scores)
    np.testing.assert_allclose(
        scores[allowed], want[allowed], rtol=1e-5, atol=1e-6
    )
    assert np.all(np.isneginf(scores[~allowed]))
    np.testing.assert_array_equal(np_(indices), np_top_k(want, allowed, 3))
    # Row 0: one earlier key only; padded queries select nothing.
    np.testing.assert_array_equal(np_(indices)[0, 0], [0, -1, -1])
    np.testing.assert_array_equal(np_(indices)[1, :2], -1)


def test_float64_scores_equal_the_numpy_reference():
    # Keras's torch `matmul` (a `Dense` without bias) computes float64 in
    # float32: the projections must not go through it. No rotary
    # positions: `RotaryEmbedding` rotates in float32 (keras-hub's rule).
    x = X.astype("float64")
    with float64_enabled():
        layer = _indexer(top_k=3, rope_head_dim=0, dtype="float64")
        scores, _ = layer(x)
        dtype = keras.backend.standardize_dtype(scores.dtype)
        scores = np_(scores)
    assert dtype == "float64"
    want = np_scores(layer, x, x, np.tile(np.arange(9), (2, 1)))
    allowed = _causal(2, 9, 9)
    np.testing.assert_allclose(scores[allowed], want[allowed], atol=1e-12)


def test_the_keras_mask_is_the_default_padding_mask():
    ids = np.array([[0, 0, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9]])
    embedding = keras.layers.Embedding(10, HIDDEN, mask_zero=True)
    layer = _indexer(top_k=3)
    want = layer(embedding(ids), padding_mask=ids != 0)
    got = layer(embedding(ids))
    inputs = keras.Input((None,), dtype="int32")
    model = keras.Model(inputs, layer(embedding(inputs)))
    for outputs in (got, model(ids)):
        np.testing.assert_array_equal(np_(outputs[1]), np_(want[1]))
        np.testing.assert_allclose(np_(outputs[0]), np_(want[0]))
    assert np.all(np_(got[1])[0, :2] == -1)


def test_ties_keep_the_lowest_positions():
    # Zero head weights: every score is 0, every allowed key ties.
    layer = _indexer(top_k=4)
    layer.weights_proj.kernel.assign(np.zeros((HIDDEN, 2), "float32"))
    mask = np.ones((9, 9), bool)
    mask[:, 1] = False
    _, indices = layer(X, attention_mask=mask)
    want = np_top_k(np.zeros((2, 9, 9)), _causal(2, 9, 9) & mask, 4)
    np.testing.assert_array_equal(np_(indices), want)
    np.testing.assert_array_equal(np_(indices)[0, 8], [0, 2, 3, 4])


def test_tiles_of_queries_give_the_same_choice():
    from keras_attention.layers.lightning_indexer import selection_mask

    layer = _indexer(top_k=3)
    scores, indices = layer(X)
    queries, keys = layer.queries(X), layer.keys(X)
    allowed = np.isfinite(np_(scores))
    for block in (1, 4, None):
        got = layer.top_k_indices(X, queries, keys, allowed, block)
        np.testing.assert_array_equal(np_(got), np_(indices))
    kept = np.zeros((2, 9, 9), bool)
    for n, i, j in zip(*np.nonzero(np_(indices) >= 0)):
        kept[n, i, np_(indices)[n, i, j]] = True
    np.testing.assert_array_equal(np_(selection_mask(indices, 9)), kept)


def test_more_keys_kept_than_the_sequence_has():
    layer = _indexer(top_k=12, rope_head_dim=0)
    scores, indices = layer(X[:, :5], use_causal_mask=False)
    assert tuple(indices.shape) == (2, 5, 12)
    assert np.all(np_(indices)[:, :, :5] == np.arange(5))
    np.testing.assert_array_equal(np_(indices)[:, :, 5:], -1)
    assert np.all(np.isfinite(np_(scores)))


@pytest.mark.slow_on_jax(
    "19 s of JAX compilations; other cases test the indexer on JAX"
)
def test_cached_calls_equal_the_whole_sequence():
    layer = _indexer(top_k=3)
    scores, indices = layer(X)
    cache = np.zeros((2, 12, 8), "float32")
    got_scores, got_indices = [], []
    for t0, t1 in [(0, 4), (4, 5), (5, 9)]:
        s, i, cache = layer(X[:, t0:t1], cache=cache, cache_update_index=t0)
        got_scores.append(np_(s)[..., :9])
        got_indices.append(np_(i))
    np.testing.assert_allclose(
        np.concatenate(got_scores, 1), np_(scores), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(np.concatenate(got_indices, 1), indices)
    np.testing.assert_allclose(np_(cache)[:, :9], np_(layer.keys(X)), 1e-6)


def _indexed_mla(**kwargs):
    layer = MultiHeadLatentAttention(
        **SIZES,
        rope_theta=500.0,
        indexer=dict(num_heads=2, head_dim=8, top_k=3),
        **kwargs,
    )
    layer.build(X.shape)
    rng = np.random.default_rng(2)
    for w in layer.weights:
        if len(w.shape) == 1:
            w.assign((1 + 0.3 * rng.normal(size=w.shape)).astype(w.dtype))
    # Clear gaps between the index scores (as in the transformers cases).
    ix = layer.indexer
    ix.weights_proj.kernel.assign(np.abs(np_(ix.weights_proj.kernel)) + 0.2)
    ix.k_norm.beta.assign(np_(ix.k_norm.beta) + np.repeat([0.0, 2.0], 4))
    return layer


def _slow_on_jax(test):
    if BACKEND != "jax":
        return test
    return pytest.mark.slow(
        reason="eager JAX compiles every op of each call shape (~30 s); "
        "TensorFlow and PyTorch run this backend-neutral wiring, "
        "tests/ops/test_topk_attention.py its op on JAX"
    )(test)


@_slow_on_jax
def test_indexed_mla_cached_equals_uncached_with_padding():
    layer = _indexed_mla()
    padding = np.ones((2, 9), bool)
    padding[1, :2] = False
    full, weights = layer(
        X,
        padding_mask=padding,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    # Each query attends to its top-3 keys only (dense weights path).
    kept = np_(weights) > 0
    assert kept.sum(-1).max() == 3 and kept[0, :, 8].sum(-1).max() == 3
    rows = np.nonzero(padding)
    sparse = layer(X, padding_mask=padding, use_causal_mask=True)
    np.testing.assert_allclose(np_(sparse)[rows], np_(full)[rows], atol=1e-5)
    cache = layer.init_cache(2, 12)
    outs = []
    for t0, t1 in [(0, 5), (5, 6), (6, 9)]:
        out, cache = layer(
            X[:, t0:t1],
            cache=cache,
            cache_update_index=t0,
            padding_mask=padding[:, t0:t1],
        )
        outs.append(np_(out))
    np.testing.assert_allclose(
        np.concatenate(outs, 1)[rows], np_(full)[rows], atol=1e-5
    )
    # A bare cache is the pair (latent, index_keys).
    latent = np.zeros((2, 12, layer.cache_dim), "float32")
    keys = np.zeros((2, 12, 8), "float32")
    out, (latent, keys) = layer(
        X, cache=(latent, keys), cache_update_index=0, use_causal_mask=True
    )
    assert tuple(keys.shape) == (2, 12, 8)
    with pytest.raises(ValueError, match="pair"):
        layer(X, cache=latent, cache_update_index=0)
    with pytest.raises(ValueError, match=r"index_keys.shape=\(2, 12, 5\)"):
        layer(X, cache=(latent, keys[..., :5]), cache_update_index=0)
    # An own cache without the indexer's keys (a dense layer's): a
    # KeyError before.
    dense_cache = dict(layer.init_cache(2, 12))
    del dense_cache["index_keys"]
    with pytest.raises(ValueError, match="index_keys"):
        layer(X, cache=dense_cache, cache_update_index=0)


@(
    (lambda test: test)
    if BACKEND == "torch"
    else pytest.mark.slow(
        reason="compiling the decoding loop costs ~16 s on TensorFlow and "
        "JAX; the backend-neutral cache wiring runs on PyTorch in the "
        "fast tier"
    )
)
def test_generation_with_indexed_latent_blocks_equals_uncached():
    """Greedy decoding through `CausalLMGenerator` over blocks whose MLA
    has an indexer (the index keys in each block's cache) gives the
    argmax of the uncached model's logits at every position."""
    from keras_attention.blocks import TransformerDecoderBlock
    from keras_attention.generation import CausalLMGenerator

    keras.utils.set_random_seed(56)
    vocab = 24
    latent = dict(
        kv_lora_rank=6,
        qk_nope_head_dim=4,
        qk_rope_head_dim=2,
        v_head_dim=3,
        q_lora_rank=5,
        rope_theta=100.0,
        indexer=dict(num_heads=2, head_dim=4, top_k=3),
    )
    embedding = keras.layers.Embedding(vocab, 16, mask_zero=True)
    blocks = [
        TransformerDecoderBlock(
            num_heads=2,
            intermediate_dim=16,
            cross_attention=False,
            norm_first=True,
            latent_attention=latent,
        )
        for _ in range(2)
    ]
    head = keras.layers.Dense(vocab)
    ids = keras.Input((None,), dtype="int32")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    model = keras.Model(ids, head(x))
    prompt = np.array([[3, 5, 7, 2, 9], [4, 8, 6, 0, 0]], "int32")
    lm = CausalLMGenerator(embedding, blocks, head)
    tokens, _ = lm.generate(prompt, max_length=12, sampler="greedy")
    tokens = np_(tokens)
    logits = np_(model(tokens))
    for row, prefix in enumerate(prompt):
        length = int(np.sum(prefix != 0))
        np.testing.assert_array_equal(tokens[row, :length], prefix[:length])
        np.testing.assert_array_equal(
            tokens[row, length:], logits[row, length - 1 : -1].argmax(-1)
        )


@pytest.mark.parametrize(
    "indexer,error,match",
    [
        ("yes", TypeError, "indexer='yes'"),
        (dict(num_heads=2, head_dim=8), ValueError, "top_k"),
        (
            dict(num_heads=2, head_dim=8, top_k=3, rope_theta=9),
            ValueError,
            "rope_theta",
        ),
    ],
)
def test_indexer_option_errors(indexer, error, match):
    with pytest.raises(error, match=match):
        MultiHeadLatentAttention(**SIZES, indexer=indexer)
    with pytest.raises(ValueError, match="q_lora_rank"):
        MultiHeadLatentAttention(
            **dict(SIZES, q_lora_rank=None),
            indexer=dict(num_heads=2, head_dim=8, top_k=3),
        )


@pytest.mark.slow_on_jax(
    "65 s of JAX compilations (fit, export, mixed precision)"
)
def test_indexed_mla_passes_the_shared_harness():
    """Config, state, `.keras` and SavedModel round trips, `fit` (the
    top-k path's gradients; the indexer gets none, it learns from
    `distillation_loss`) and mixed precision, with the indexer inside.
    The indexer alone returns float32 scores under every policy (they
    decide the top-k), which the harness's mixed-precision check refuses:
    its config and `.keras` file are tested below."""
    run_layer_test(
        MultiHeadLatentAttention,
        dict(SIZES, indexer=dict(num_heads=2, head_dim=4, top_k=3)),
        {"query": X[:, :6]},
        call_kwargs={"use_causal_mask": True},
        expected_output_shape=(2, 6, HIDDEN),
    )


def test_indexed_mla_config_round_trip():
    layer = _indexed_mla(absorb=True)
    clone = MultiHeadLatentAttention.from_config(layer.get_config())
    clone.build(X.shape)
    clone.set_weights(layer.get_weights())
    assert clone.indexer.top_k == 3
    np.testing.assert_allclose(
        np_(clone(X, use_causal_mask=True)),
        np_(layer(X, use_causal_mask=True)),
        atol=1e-6,
    )


def test_indexed_mla_without_rotary_positions_selects_without_them():
    # NoPE (`rope_theta=None`, Kimi's MLA): the indexer's rotary positions
    # are the attention's, so none; it was built with rope_theta=None
    # and refused it.
    layer = MultiHeadLatentAttention(
        **SIZES, rope_theta=None, indexer=dict(num_heads=2, head_dim=8, top_k=3)
    )
    layer.build(X.shape)
    assert layer.indexer.rope_head_dim == 0
    _, weights = layer(X, use_causal_mask=True, return_attention_scores=True)
    q_latent = np_(layer.q_a_layernorm(layer.q_a_proj(X))).astype("float64")
    positions = np.tile(np.arange(9), (2, 1))
    scores = np_scores(layer.indexer, X.astype("float64"), q_latent, positions)
    allowed = _causal(2, 9, 9)
    want = np_top_k(scores, allowed, 3)
    kept = np_(weights).max(axis=1) > 0  # (b, t, s), over the heads
    np.testing.assert_array_equal(kept, _selected(want, 9))
    clone = MultiHeadLatentAttention.from_config(layer.get_config())
    assert clone.rope_theta is None and clone.indexer.rope_head_dim == 0


def _selected(indices, length):
    """Bool `(b, t, length)` of the positions `indices` `(b, t, k)` name."""
    out = np.zeros(indices.shape[:2] + (length,), bool)
    for n, i, j in zip(*np.nonzero(indices >= 0)):
        out[n, i, indices[n, i, j]] = True
    return out


def test_config_round_trip_and_saving(tmp_path):
    layer = _indexer(top_k=3, rotary_scaling=dict(rope_type="linear"))
    clone = LightningIndexer.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    inputs = keras.Input((9, HIDDEN))
    model = keras.Model(inputs, layer(inputs)[0])
    path = str(tmp_path / "indexer.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(np_(loaded(X)), np_(model(X)), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(num_heads=0), ValueError, "num_heads=0"),
        (dict(top_k=2.5), ValueError, "top_k=2.5"),
        (dict(rope_head_dim=3), ValueError, "rope_head_dim=3"),
        (dict(rope_head_dim=10), ValueError, "rope_head_dim=10"),
        (dict(layer_norm_epsilon=0), ValueError, "layer_norm_epsilon=0"),
        (dict(rotary_scaling="yarn"), TypeError, "rotary_scaling='yarn'"),
        # No rotated features: a scaling that cannot apply (was ignored).
        (
            dict(rope_head_dim=0, rotary_scaling={"rope_type": "linear"}),
            ValueError,
            "rope_head_dim=0",
        ),
    ],
)
def test_argument_errors_name_the_value(kwargs, error, match):
    arguments = dict(num_heads=2, head_dim=8, top_k=3)
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        LightningIndexer(**arguments)


@pytest.mark.parametrize("shape", [(2, 5, 6), (1, 9, 6)])
def test_query_inputs_of_other_steps_or_batch_are_refused(shape):
    # They failed inside an einsum (InvalidArgumentError on TensorFlow).
    layer = _indexer(top_k=3, query_dim=6)
    match = re.escape(f"query_inputs.shape={shape}")
    with pytest.raises(ValueError, match=match):
        layer(X, query_inputs=np.ones(shape, "float32"))


# --- The distillation loss --------------------------------------------------


def np_kl(scores, target, valid):
    out = np.zeros(scores.shape[:2])
    for n in range(scores.shape[0]):
        for i in range(scores.shape[1]):
            ok = valid[n, i]
            if not ok.any() or target[n, i][ok].sum() == 0:
                continue
            p = target[n, i][ok] / target[n, i][ok].sum()
            s = scores[n, i][ok]
            log_q = s - s.max() - np.log(np.exp(s - s.max()).sum())
            nz = p > 0
            out[n, i] = np.sum(p[nz] * (np.log(p[nz]) - log_q[nz]))
    return out


def test_distillation_loss_matches_numpy_reference():
    layer = _indexer(top_k=3)
    scores, indices = layer(X)
    mla_weights = RNG.random((2, 3, 9, 9)) * _causal(2, 9, 9)[:, None]
    scores_np = np_(scores).astype("float64")
    valid = np.isfinite(scores_np)
    summed = mla_weights.sum(1)
    want = np_kl(scores_np, summed, valid)
    loss = LightningIndexer.distillation_loss
    got = np_(loss(scores, mla_weights.astype("float32"), reduction="none"))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    mean = np_(loss(scores, mla_weights.astype("float32")))
    np.testing.assert_allclose(mean, want.mean(), rtol=1e-4)
    total = loss(scores, summed.astype("float32"), reduction="sum")
    np.testing.assert_allclose(np_(total), want.sum(1).mean(), rtol=1e-4)
    # The sparse stage: both distributions on the kept keys only.
    idx = np_(indices)
    kept = np.zeros_like(valid)
    for n, i, j in zip(*np.nonzero(idx >= 0)):
        kept[n, i, idx[n, i, j]] = True
    sparse = loss(scores, mla_weights, indices=indices, reduction="none")
    np.testing.assert_allclose(
        np_(sparse), np_kl(scores_np, summed, kept), rtol=1e-4, atol=1e-6
    )
    with pytest.raises(ValueError, match="reduction='max'"):
        loss(scores, mla_weights, reduction="max")


@pytest.mark.parametrize(
    "weights, indices, error, match",
    [
        # Other keys or queries than the scores: failed inside a `where`.
        ((2, 2, 9, 12), None, ValueError, r"attention_weights.shape"),
        ((2, 9, 5), None, ValueError, r"attention_weights.shape"),
        # Another batch: broadcast silently.
        ((1, 9, 9), None, ValueError, r"attention_weights.shape"),
        ((2, 9, 9), ((2, 4, 3), "int32"), ValueError, r"indices.shape"),
        # Positions as floats: cast silently.
        ((2, 9, 9), ((2, 9, 3), "float32"), TypeError, r"indices.dtype"),
    ],
)
def test_distillation_loss_refuses_mismatched_arguments(
    weights, indices, error, match
):
    scores = np.zeros((2, 9, 9), "float32")
    if indices is not None:
        indices = np.zeros(indices[0], indices[1])
    with pytest.raises(error, match=match):
        LightningIndexer.distillation_loss(
            scores, np.ones(weights, "float32"), indices=indices
        )


# --- transformers' DeepseekV32Indexer and DeepseekV32Attention ---------------

# Runs in a subprocess: importing transformers pulls triton, which crashes
# beside TensorFlow in one process. One subprocess for the module.
_REFERENCE_SCRIPT = r"""
import json, sys
import numpy as np
import torch
from transformers import DeepseekV32Config, DynamicCache
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m

cases = json.loads(sys.argv[1])
x_all = np.load(sys.argv[2])["x"]
out = {}
MIN = torch.finfo(torch.float32).min


def mask_of(valid, t0, t1, s):
    # Additive (b, 1, t1 - t0, s): causal on positions, padded keys masked.
    i = torch.arange(t0, t1)[:, None]
    ok = (torch.arange(s)[None] <= i)[None]
    ok = ok & torch.from_numpy(valid[:, :s])[:, None]
    return torch.where(ok, 0.0, MIN)[:, None]


def set_weights(attention, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in attention.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
        ix = attention.indexer
        # Clear gaps, no ReLU zeros: positive head weights, queries and
        # keys with a large positive part on the unrotated features.
        ix.weights_proj.weight.abs_().add_(0.2)
        p = ix.qk_rope_head_dim
        ix.k_norm.bias[p:] += 2.0
        ix.wq_b.weight.view(ix.n_heads, ix.head_dim, -1)[:, p:] += 0.4


recorded, topk = [], torch.Tensor.topk


def record(self, *args, **kwargs):
    recorded.append(self.detach().clone())
    return topk(self, *args, **kwargs)


for c, case in enumerate(cases):
    x = torch.from_numpy(x_all.copy())
    b, t = x.shape[:2]
    config = DeepseekV32Config(
        hidden_size=x.shape[-1],
        num_attention_heads=case["num_heads"],
        num_key_value_heads=case["num_heads"],
        kv_lora_rank=case["kv_lora_rank"],
        q_lora_rank=case["q_lora_rank"],
        qk_nope_head_dim=case["qk_nope_head_dim"],
        qk_rope_head_dim=case["qk_rope_head_dim"],
        v_head_dim=case["v_head_dim"],
        index_topk=case["top_k"],
        index_head_dim=case["index_head_dim"],
        index_n_heads=case["index_heads"],
        num_hidden_layers=1,
        rope_parameters=dict(case["rope"], rope_theta=case["theta"]),
        max_position_embeddings=64,
    )
    config._attn_implementation = "eager"
    attention = m.DeepseekV32Attention(config, layer_idx=0).float().eval()
    rotary = m.DeepseekV32RotaryEmbedding(config)
    valid = np.ones((b, t), bool)
    valid[0, : case["pad"]] = False  # left padding of the first row
    positions = torch.from_numpy(
        np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype("int64")
    )
    for seed in range(100 * c, 100 * c + 100):
        set_weights(attention, seed)
        recorded.clear()
        torch.Tensor.topk = record
        with torch.no_grad():
            y, weights = attention(
                x, rotary(x, positions), mask_of(valid, 0, t, t)
            )
        torch.Tensor.topk = topk
        scores = recorded[0].numpy()
        # Each real query's gap between its k-th and (k+1)-th allowed
        # scores: no near tie may decide the choice.
        gaps = [np.inf]
        for n in range(b):
            for i in range(t):
                row = np.sort(scores[n, i, : i + 1][valid[n, : i + 1]])[::-1]
                if valid[n, i] and len(row) > case["top_k"]:
                    gaps.append(row[case["top_k"] - 1] - row[case["top_k"]])
        if min(gaps) > 1e-3:
            break
    out[f"{c}/gap"] = np.array(min(gaps))
    with torch.no_grad():
        q_resid = attention.q_a_layernorm(attention.q_a_proj(x))
        recorded.clear()
        torch.Tensor.topk = record
        indices = attention.indexer(
            x, q_resid, rotary(x, positions), mask_of(valid, 0, t, t)[:, 0],
            None,
        )
        torch.Tensor.topk = topk
    out[f"{c}/q_resid"] = q_resid.numpy()
    out[f"{c}/index_scores"] = recorded[0].numpy()
    out[f"{c}/indices"] = indices.numpy()
    out[f"{c}/output"] = y.numpy()
    out[f"{c}/weights"] = weights.numpy()
    out[f"{c}/positions"] = positions.numpy()
    out[f"{c}/valid"] = valid
    # Cached: a prefill of `prefill` tokens, then one token per call.
    cache = DynamicCache(config=config)
    steps = [(0, case["prefill"])]
    steps += [(i, i + 1) for i in range(case["prefill"], t)]
    cached = []
    with torch.no_grad():
        for t0, t1 in steps:
            xs, ps = x[:, t0:t1], positions[:, t0:t1]
            y_c, _ = attention(
                xs, rotary(xs, ps), mask_of(valid, t0, t1, t1), cache=cache
            )
            cached.append(y_c.numpy())
    out[f"{c}/cached"] = np.concatenate(cached, axis=1)
    for name, p in attention.named_parameters():
        out[f"{c}/{name}"] = p.detach().numpy()
np.savez(sys.argv[3], **out)
"""

SIZES = dict(
    num_heads=2,
    kv_lora_rank=8,
    q_lora_rank=6,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=4,
)
INDEXER = dict(index_heads=2, index_head_dim=8)
# DeepSeek's YaRN at a small scale (transformers' names).
YARN = dict(
    rope_type="yarn",
    factor=4.0,
    original_max_position_embeddings=16,
    beta_fast=4.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=1.0,
)
CASES = [
    dict(SIZES, **INDEXER, top_k=3, theta=500.0, pad=0, prefill=5),
    dict(SIZES, **INDEXER, top_k=4, theta=500.0, pad=2, prefill=4),
]
CASES[0]["rope"] = {"rope_type": "default"}
CASES[1]["rope"] = YARN
IDS = ["plain", "padded-yarn"]
# The layers are backend-neutral code over `ops.topk_attention`, which
# tests/ops/test_topk_attention.py checks on every backend: the fast tier
# compares them with transformers on TensorFlow (one subprocess, ~20 s).
transformers_tier = (
    (lambda test: test)
    if BACKEND == "tensorflow"
    else pytest.mark.slow(
        reason="equality with transformers: TensorFlow's fast tier covers "
        "it, the op's own tests cover this backend"
    )
)


@pytest.fixture(scope="module")
def transformers_outputs():
    return run_reference_script(
        _REFERENCE_SCRIPT, CASES, "the DeepseekV32Attention reference", x=X
    )


def _rotary_scaling(case):
    rope = dict(case["rope"])
    if rope.pop("rope_type") == "default":
        return None
    rope["scaling_factor"] = rope.pop("factor")
    return dict(rope, rope_type="yarn")


def _copy_indexer(indexer, weights, c):
    for name in ("wq_b", "wk", "weights_proj"):
        getattr(indexer, name).kernel.assign(
            weights[f"{c}/indexer.{name}.weight"].T
        )
    indexer.k_norm.gamma.assign(weights[f"{c}/indexer.k_norm.weight"])
    indexer.k_norm.beta.assign(weights[f"{c}/indexer.k_norm.bias"])


def _mla(case, weights, c, **kwargs):
    layer = MultiHeadLatentAttention(
        **SIZES,
        rope_theta=case["theta"],
        rotary_scaling=_rotary_scaling(case),
        indexer=dict(
            num_heads=case["index_heads"],
            head_dim=case["index_head_dim"],
            top_k=case["top_k"],
        ),
        **kwargs,
    )
    layer.build(X.shape)
    for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"):
        getattr(layer, name).kernel.assign(weights[f"{c}/{name}.weight"].T)
    layer.o_proj.kernel.assign(weights[f"{c}/o_proj.weight"].T)
    for name in ("q_a_layernorm", "kv_a_layernorm"):
        getattr(layer, name).scale.assign(weights[f"{c}/{name}.weight"])
    _copy_indexer(layer.indexer, weights, c)
    return layer


@transformers_tier
@pytest.mark.parametrize("c", range(len(CASES)), ids=IDS)
def test_indexer_matches_transformers(transformers_outputs, c):
    case, ref = CASES[c], transformers_outputs
    assert ref[f"{c}/gap"] > 1e-3  # no near tie decides the choice
    valid = ref[f"{c}/valid"]
    layer = LightningIndexer(
        num_heads=case["index_heads"],
        head_dim=case["index_head_dim"],
        top_k=case["top_k"],
        rope_head_dim=case["qk_rope_head_dim"],
        rope_theta=case["theta"],
        rotary_scaling=_rotary_scaling(case),
    )
    layer.build(X.shape, ref[f"{c}/q_resid"].shape)
    _copy_indexer(layer, ref, c)
    scores, indices = layer(
        X,
        query_inputs=ref[f"{c}/q_resid"],
        padding_mask=valid,
        positions=ref[f"{c}/positions"],
    )
    scores, indices = np_(scores), np_(indices)
    allowed = _causal(2, 9, 9) & valid[:, None, :] & valid[:, :, None]
    want = ref[f"{c}/index_scores"]
    np.testing.assert_allclose(scores[allowed], want[allowed], atol=1e-4)
    theirs = ref[f"{c}/indices"]
    for n, i in zip(*np.nonzero(valid)):
        ours = set(indices[n, i][indices[n, i] >= 0])
        if allowed[n, i].sum() >= case["top_k"]:
            assert ours == set(theirs[n, i]), (n, i)
        else:  # ours: every allowed key; theirs: those and masked ones
            assert ours == set(np.flatnonzero(allowed[n, i]))
            assert ours <= set(theirs[n, i])


@transformers_tier
@pytest.mark.parametrize("c", range(len(CASES)), ids=IDS)
def test_sparse_attention_matches_transformers(transformers_outputs, c):
    case, ref = CASES[c], transformers_outputs
    valid, positions = ref[f"{c}/valid"], ref[f"{c}/positions"]
    rows = np.nonzero(valid)
    layer = _mla(case, ref, c)
    for absorb in (False, True):  # the top-k path, naive and absorbed
        layer.absorb = absorb
        out = layer(
            X, query_mask=valid, use_causal_mask=True, positions=positions
        )
        np.testing.assert_allclose(
            np_(out)[rows], ref[f"{c}/output"][rows], atol=1e-4
        )
    # The weights: the dense path under the kept keys' mask.
    out, weights = layer(
        X,
        query_mask=valid,
        use_causal_mask=True,
        positions=positions,
        return_attention_scores=True,
    )
    np.testing.assert_allclose(np_(out)[rows], ref[f"{c}/output"][rows], 1e-4)
    np.testing.assert_allclose(
        np_(weights).transpose(0, 2, 1, 3)[rows],
        ref[f"{c}/weights"].transpose(0, 2, 1, 3)[rows],
        atol=1e-4,
    )


@transformers_tier
@pytest.mark.parametrize("c", range(len(CASES)), ids=IDS)
def test_cached_decoding_matches_transformers(transformers_outputs, c):
    case, ref = CASES[c], transformers_outputs
    valid, positions = ref[f"{c}/valid"], ref[f"{c}/positions"]
    layer = _mla(case, ref, c)
    cache = layer.init_cache(2, 12)
    assert set(cache) == {"latent", "key_mask", "index_keys"}
    assert tuple(cache["index_keys"].shape) == (2, 12, case["index_head_dim"])
    steps = [(0, case["prefill"])]
    steps += [(i, i + 1) for i in range(case["prefill"], 9)]
    outs = []
    for t0, t1 in steps:
        out, cache = layer(
            X[:, t0:t1],
            cache=cache,
            cache_update_index=t0,
            padding_mask=valid[:, t0:t1],
            positions=positions[:, t0:t1],
        )
        outs.append(np_(out))
    rows = np.nonzero(valid)
    np.testing.assert_allclose(
        np.concatenate(outs, 1)[rows], ref[f"{c}/cached"][rows], atol=1e-4
    )
    keys = layer.indexer.keys(X, positions=positions)
    np.testing.assert_allclose(
        np_(cache["index_keys"])[:, :9][rows], np_(keys)[rows], atol=1e-5
    )
