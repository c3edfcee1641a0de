"""Programmable attention: score and mask functions on every path.

Every built-in mask object and a score function (plain, and a
`ScoreLayer` with a learned per-head bias) on the dense and blockwise
paths (and the fused path on PyTorch) against NumPy, forward and
gradients; blockwise results checked for independence from the tile
sizes (several tilings, none pinned); tiles a static mask masks entirely
skipped; call-time inputs; the deprecated argument names.
"""

import functools

import keras
import numpy as np
import pytest
from keras import ops

from keras_attention import mods
from keras_attention.ops import attention as attention_lib
from keras_attention.ops import captured
from keras_attention.ops.blockwise import _Plan
from keras_attention.ops.blockwise import blockwise_attention

BACKEND = keras.backend.backend()
B, T, H, G, D = 2, 40, 4, 2, 8
RNG = np.random.default_rng(3)
Q = RNG.normal(size=(B, T, H, D)).astype("float32")
K = RNG.normal(size=(B, T, G, D)).astype("float32")
V = RNG.normal(size=(B, T, G, D)).astype("float32")
SEGMENTS = np.array([[0] * 13 + [1] * 20 + [2] * 7, [0] * 30 + [1] * 10])
PREFIX = np.array([5, 17])
QI = np.arange(T)[:, None]
KJ = np.arange(T)[None, :]
SLOPES = np.array([0.05, 0.1, 0.2, 0.4], "float32")

# name -> (mask object, call-time inputs, NumPy mask (B|1, H|1, T, T))
MASKS = {
    "causal": (mods.CausalMask(), {}, (KJ <= QI)[None, None]),
    "window": (
        mods.SlidingWindowMask((5, 2)),
        {},
        ((KJ >= QI - 5) & (KJ <= QI + 2))[None, None],
    ),
    "keras_window": (
        mods.KerasSlidingWindowMask(4),
        {},
        (np.abs(QI - KJ) < 4)[None, None],
    ),
    "chunked": (
        mods.ChunkedCausalMask(8),
        {},
        ((KJ <= QI) & (QI // 8 == KJ // 8))[None, None],
    ),
    "prefix_lm": (
        mods.PrefixLMMask(6),
        {},
        ((KJ <= QI) | (KJ < 6))[None, None],
    ),
    "prefix_lm_per_example": (
        mods.PrefixLMMask(),
        {"prefix_length": PREFIX},
        ((KJ <= QI)[None] | (KJ[None] < PREFIX[:, None, None]))[:, None],
    ),
    "document": (
        mods.DocumentMask(),
        {"segment_ids": SEGMENTS},
        (SEGMENTS[:, :, None] == SEGMENTS[:, None, :])[:, None],
    ),
    "causal_documents": (
        mods.and_masks(mods.CausalMask(), mods.DocumentMask()),
        {"segment_ids": SEGMENTS},
        ((KJ <= QI)[None] & (SEGMENTS[:, :, None] == SEGMENTS[:, None, :]))[
            :, None
        ],
    ),
    "window_or_first": (
        mods.or_masks(mods.SlidingWindowMask(2), lambda b, h, q, kv: kv < 1),
        {},
        ((np.abs(QI - KJ) <= 2) | (KJ < 1))[None, None],
    ),
}


def np_attention(q, k, v, mask, bias=None):
    """softmax(q k^T / sqrt(d) + bias, masked) v; empty rows give zeros."""
    r = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    mask = np.broadcast_to(mask, s.shape)
    s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    p = np.where(mask, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
    p = p / np.maximum(p.sum(-1, keepdims=True), 1e-30)
    return np.einsum("bhij,bjhe->bihe", p, v)


def distance_bias(score, batch, head, q_idx, kv_idx):
    return score - ops.take(SLOPES, head) * ops.cast(
        ops.abs(q_idx - kv_idx), "float32"
    )


NP_BIAS = -SLOPES[None, :, None, None] * np.abs(QI - KJ)[None, None]


class LearnedDistanceBias(mods.ScoreLayer):
    """A learned per-head slope of the distance (test score layer)."""

    def build(self, num_heads=None):
        self.slopes = self.add_weight(
            shape=(H,),
            initializer=keras.initializers.Constant(SLOPES),
            name="slopes",
        )
        self.built = True

    def score_fn(self, score, batch, head, q_idx, kv_idx):
        return score - ops.take(self.slopes, head) * ops.cast(
            ops.abs(q_idx - kv_idx), "float32"
        )


PATHS = ["dense", "blockwise"] + (["fused"] if BACKEND == "torch" else [])


def _compiled(fn, *args):
    """`fn(*args)`, under `jax.jit` on JAX (one compiled program instead
    of every op compiled for every tile shape)."""
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)(*args)
    return fn(*args)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", sorted(MASKS))
def test_mask_objects_match_numpy(name, path):
    mask_mod, inputs, np_mask = MASKS[name]
    mask_mod = (
        mask_mod.bind(**inputs) if hasattr(mask_mod, "bind") else mask_mod
    )
    out = attention_lib.dot_product_attention(
        Q, K, V, mask_mod=mask_mod, implementation=path
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(out), np_attention(Q, K, V, np_mask), atol=2e-5
    )


@pytest.mark.parametrize("path", ["dense", "blockwise"])
@pytest.mark.parametrize("name", ["causal", "document", "window"])
def test_score_function_with_masks_matches_numpy(name, path):
    mask_mod, inputs, np_mask = MASKS[name]
    out = attention_lib.dot_product_attention(
        Q,
        K,
        V,
        score_mod=distance_bias,
        mask_mod=mask_mod.bind(**inputs),
        implementation=path,
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(out),
        np_attention(Q, K, V, np_mask, NP_BIAS),
        atol=2e-5,
    )


@pytest.mark.parametrize("tiles", [(8, 8), (16, 40), (40, 16), (7, 13)])
@pytest.mark.parametrize("name", ["causal_documents", "window", "prefix_lm"])
def test_blockwise_results_do_not_depend_on_tiles(name, tiles):
    mask_mod, inputs, np_mask = MASKS[name]
    scale = 1 / np.sqrt(D)
    out = _compiled(
        lambda q, k, v: blockwise_attention(
            q * scale,
            k,
            v,
            query_block=tiles[0],
            key_block=tiles[1],
            score_mod=distance_bias,
            mask_mod=mask_mod.bind(**inputs),
        ),
        Q,
        K,
        V,
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(out),
        np_attention(Q, K, V, np_mask, NP_BIAS),
        atol=2e-5,
    )


def _gradients(fn, *args):
    """Gradients of sum(out * sin(out)) w.r.t. args and the score layer."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        args = [tf.constant(a) for a in args]
        with tf.GradientTape() as tape:
            tape.watch(args)
            out, layer = fn(*args)
            loss = tf.reduce_sum(out * tf.sin(out))
        return tape.gradient(loss, args + [layer.slopes.value])
    if BACKEND == "jax":
        import jax

        layer = LearnedDistanceBias()
        layer.build(H)

        def loss(slopes, *a):
            with keras.StatelessScope(state_mapping=[(layer.slopes, slopes)]):
                out, _ = fn(*a, layer=layer)
            return ops.sum(out * ops.sin(out))

        # One compiled program (eager JAX compiles every op of the forward
        # and backward passes).
        grad = jax.jit(jax.grad(loss, argnums=tuple(range(len(args) + 1))))
        grads = grad(ops.convert_to_tensor(SLOPES), *args)
        return list(grads[1:]) + [grads[0]]
    import torch

    args = [torch.tensor(a, requires_grad=True) for a in args]
    out, layer = fn(*args)
    loss = torch.sum(out * torch.sin(out))
    loss.backward()
    return [a.grad for a in args] + [layer.slopes.value.grad]


def _bias_gradients(attend):
    """`_gradients` (NumPy) of `attend(q, k, v, score_mod)` with a fresh
    `LearnedDistanceBias` as the score function."""

    def fn(q, k, v, layer=None):
        if layer is None:
            layer = LearnedDistanceBias()
            layer.build(H)
        return attend(q, k, v, layer), layer

    return [ops.convert_to_numpy(g) for g in _gradients(fn, Q, K, V)]


@functools.lru_cache(maxsize=None)
def _dense_gradients(name):
    """`_bias_gradients` of the dense path with mask `name`, once per
    mask (the reference of every tiling)."""
    mask_mod, inputs, _ = MASKS[name]
    mask_mod = mask_mod.bind(**inputs)
    return _bias_gradients(
        lambda q, k, v, layer: attention_lib.dot_product_attention(
            q,
            k,
            v,
            score_mod=layer,
            mask_mod=mask_mod,
            implementation="dense",
        )
    )


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("tiles", [(8, 16), (16, 8), (8, 40)])
@pytest.mark.parametrize("name", ["causal_documents", "chunked"])
def test_gradients_reach_a_learned_bias_on_the_blockwise_path(
    name, tiles, keep
):
    # keep: the backward pass reuses the forward's probabilities of
    # one-tile rows (tiles (8, 40)) and recomputes only the raw scores
    # for the score function's pullback, or recomputes everything.
    mask_mod, inputs, _ = MASKS[name]
    mask_mod = mask_mod.bind(**inputs)

    dense = _dense_gradients(name)
    blockwise = _bias_gradients(
        lambda q, k, v, layer: blockwise_attention(
            q * (1 / np.sqrt(D)),
            k,
            v,
            query_block=tiles[0],
            key_block=tiles[1],
            score_mod=layer,
            mask_mod=mask_mod,
            keep_probabilities=keep,
        )
    )
    for name_, a, b in zip(["q", "k", "v", "slopes"], dense, blockwise):
        scale = max(1.0, float(np.abs(a).max()))
        np.testing.assert_allclose(
            b / scale, a / scale, atol=1e-5, err_msg=name_
        )
    assert np.abs(dense[3]).max() > 0  # the bias really gets a gradient


def test_static_masks_skip_tiles_and_tensor_masks_do_not():
    window = _Plan(
        256, 256, False, 0, 32, 32, heads=H, mask_mod=mods.SlidingWindowMask(8)
    )
    # 8 x 8 tiles; the band of width 17 touches 3 per row (2 at the ends).
    assert window.skipped_tiles == 64 - 22
    documents = mods.DocumentMask().bind(
        segment_ids=np.zeros((1, 256), "int32")
    )
    dynamic = _Plan(256, 256, False, 0, 32, 32, heads=H, mask_mod=documents)
    assert dynamic.skipped_tiles == 0
    # Every kept tile with a partial mask evaluates it; full tiles do not.
    causal = _Plan(
        256, 256, False, 0, 32, 32, heads=H, mask_mod=mods.CausalMask()
    )
    kinds = [chunk[4] for _, _, chunks in causal.rows for chunk in chunks]
    assert causal.skipped_tiles == 28 and kinds.count(True) == 8


def test_a_row_with_nothing_to_attend_gives_zeros_not_nan():
    def nothing_for_query_three(batch, head, q_idx, kv_idx):
        return (q_idx != 3) | (kv_idx < 0)

    for path in PATHS:
        out = ops.convert_to_numpy(
            attention_lib.dot_product_attention(
                Q, K, V, mask_mod=nothing_for_query_three, implementation=path
            )
        )
        assert np.isfinite(out).all(), path
        np.testing.assert_array_equal(out[:, 3], 0.0)


def test_query_offset_moves_the_positions_of_mask_and_score_functions():
    offset = 10
    seen = {}

    def record(batch, head, q_idx, kv_idx):
        seen["q"] = ops.convert_to_numpy(q_idx).ravel()
        return kv_idx <= q_idx

    attention_lib.dot_product_attention(
        Q[:, :4],
        K,
        V,
        mask_mod=record,
        query_offset=offset,
        implementation="dense",
    )
    np.testing.assert_array_equal(seen["q"], np.arange(offset, offset + 4))


def test_deprecated_names_warn_and_still_work():
    new = attention_lib.dot_product_attention(
        Q, K, V, causal=True, key_mask=SEGMENTS > 0
    )
    with pytest.warns(DeprecationWarning, match="use `causal`"):
        old = attention_lib.dot_product_attention(
            Q, K, V, is_causal=True, key_padding=SEGMENTS > 0
        )
    np.testing.assert_allclose(
        ops.convert_to_numpy(old), ops.convert_to_numpy(new)
    )
    with pytest.raises(TypeError, match="both `causal`"):
        attention_lib.dot_product_attention(
            Q, K, V, causal=True, is_causal=True
        )
    with pytest.raises(TypeError, match="unexpected keyword argument 'casual'"):
        attention_lib.dot_product_attention(Q, K, V, casual=True)


def test_bad_functions_and_paths_are_refused():
    with pytest.raises(TypeError, match="score_mod"):
        attention_lib.dot_product_attention(Q, K, V, score_mod="alibi")
    with pytest.raises(ValueError, match="fused"):
        attention_lib.dot_product_attention(
            Q, K, V, score_mod=distance_bias, implementation="fused"
        )
    weights = keras.Variable(SLOPES)

    def closes_over_a_variable(score, batch, head, q_idx, kv_idx):
        return score + ops.take(weights, head)

    assert captured.closes_over_tensors(closes_over_a_variable)
    # Not refused on "blockwise": the variable reaches its backward pass
    # (tests/ops/test_captured_score_gradients.py).
    outs = [
        attention_lib.dot_product_attention(
            Q, K, V, score_mod=closes_over_a_variable, implementation=name
        )
        for name in ("blockwise", "dense")
    ]
    np.testing.assert_allclose(*map(ops.convert_to_numpy, outs), atol=1e-5)
    with pytest.raises(ValueError, match="segment_ids"):
        mods.DocumentMask().bind()
    with pytest.raises(ValueError, match="not used by it"):
        mods.CausalMask().bind(segment_ids=SEGMENTS)


def test_mask_objects_round_trip_through_keras_serialization():
    for mask_mod, _, _ in MASKS.values():
        if not isinstance(mask_mod, mods.MaskMod):
            continue
        try:
            config = keras.saving.serialize_keras_object(mask_mod)
        except ValueError:  # holds a plain function
            assert isinstance(mask_mod, mods.OrMask)
            continue
        again = keras.saving.deserialize_keras_object(config)
        assert again == mask_mod and again is not mask_mod


@pytest.mark.skipif(
    BACKEND == "jax", reason="lax.cond traces both branches: nothing to count"
)
def test_tensor_masks_skip_empty_tiles_at_run_time():
    # Four documents of 10 tokens, aligned with 10 x 10 tiles: of the 16
    # tiles only the 4 on the diagonal hold allowed pairs.
    ids = np.repeat(np.arange(4), 10)[None].repeat(B, 0)
    calls = []

    def counting_bias(score, batch, head, q_idx, kv_idx):
        calls.append(1)
        return score

    out = blockwise_attention(
        Q * (1 / np.sqrt(D)),
        K,
        V,
        query_block=10,
        key_block=10,
        score_mod=counting_bias,
        mask_mod=mods.DocumentMask().bind(segment_ids=ids),
    )
    assert len(calls) == 4
    np_mask = (ids[:, :, None] == ids[:, None, :])[:, None]
    np.testing.assert_allclose(
        ops.convert_to_numpy(out), np_attention(Q, K, V, np_mask), atol=2e-5
    )


@pytest.mark.parametrize("name", ["causal", "document", "chunked", "prefix_lm"])
@pytest.mark.parametrize("with_score", [False, True])
def test_banded_path_takes_mask_and_score_functions(name, with_score):
    from keras_attention.ops.sliding_window import local_attention

    mask_mod, inputs, np_mask = MASKS[name]
    window = (6, 3)
    band = (KJ >= QI - window[0]) & (KJ <= QI + window[1])
    out = local_attention(
        Q,
        K,
        V,
        window,
        block_size=8,
        mask_mod=mask_mod.bind(**inputs),
        score_mod=distance_bias if with_score else None,
    )
    want = np_attention(
        Q, K, V, np_mask & band[None, None], NP_BIAS if with_score else None
    )
    np.testing.assert_allclose(ops.convert_to_numpy(out), want, atol=2e-5)


def test_gradients_reach_a_learned_bias_on_the_banded_path():
    from keras_attention.ops.sliding_window import local_attention

    band = mods.SlidingWindowMask((5, 2))

    def run(path):
        def fn(q, k, v, layer=None):
            if layer is None:
                layer = LearnedDistanceBias()
                layer.build(H)
            if path == "dense":
                out = attention_lib.dot_product_attention(
                    q,
                    k,
                    v,
                    score_mod=layer,
                    mask_mod=band,
                    implementation="dense",
                )
            else:
                out = local_attention(
                    q, k, v, (5, 2), block_size=8, score_mod=layer
                )
            return out, layer

        return [ops.convert_to_numpy(g) for g in _gradients(fn, Q, K, V)]

    for a, b in zip(run("dense"), run("banded")):
        scale = max(1.0, float(np.abs(a).max()))
        np.testing.assert_allclose(b / scale, a / scale, atol=1e-5)
