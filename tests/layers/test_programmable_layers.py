"""Score and mask objects in the layers, and the `_compute_attention` hook.

- every built-in mask object, and a learned score layer, held by
  `MultiHeadAttention` / `SelfAttention` / `CausalSelfAttention` /
  `CrossAttention` through the harness (config, `.keras` with safe_mode,
  SavedModel in a fresh process, fit, mixed precision);
- numbers: a mask object equals Keras's `MultiHeadAttention` with the same
  weights and the equivalent dense `attention_mask`; a score layer equals
  a NumPy reference built from the layer's weights;
- call-time inputs (`mod_inputs`) in a functional model, trained;
- a plain function: works, and saving refuses it naming the layer and
  the argument;
- Keras 3.15's `_compute_attention` hook scenarios
  (`multi_head_attention_test.py`: `test_causal_only_skipped_for_subclass`,
  `test_compute_attention_combines_causal_and_explicit_mask`), restated
  against our class, also with grouped-query heads (Keras's
  `grouped_query_attention_test.py` scenarios of the same names).
"""

import os
import tempfile

import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras import ops
from score_layers import HeadDistanceBias

from keras_attention import layers as ka
from keras_attention import mods

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(11)
B, T, F = 2, 6, 8
X = RNG.normal(size=(B, T, F)).astype("float32")
C = RNG.normal(size=(B, 5, F)).astype("float32")
QI = np.arange(T)[:, None]
KJ = np.arange(T)[None, :]


STATIC_MASKS = {
    "causal": (mods.CausalMask(), KJ <= QI),
    "window": (mods.SlidingWindowMask((2, 1)), (KJ >= QI - 2) & (KJ <= QI + 1)),
    "keras_window": (mods.KerasSlidingWindowMask(2), np.abs(QI - KJ) < 2),
    "chunked": (mods.ChunkedCausalMask(4), (KJ <= QI) & (QI // 4 == KJ // 4)),
    "prefix_lm": (mods.PrefixLMMask(3), (KJ <= QI) | (KJ < 3)),
    "and_or": (
        mods.or_masks(
            mods.and_masks(mods.CausalMask(), mods.SlidingWindowMask(1)),
            mods.ChunkedCausalMask(3),
        ),
        ((KJ <= QI) & (np.abs(QI - KJ) <= 1))
        | ((KJ <= QI) & (QI // 3 == KJ // 3)),
    ),
}


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


@pytest.mark.parametrize("name", sorted(STATIC_MASKS))
def test_mask_objects_equal_keras_with_the_dense_mask(name):
    mask_mod, np_mask = STATIC_MASKS[name]
    ours = ka.MultiHeadAttention(2, 4, mask_mod=mask_mod)
    theirs = keras.layers.MultiHeadAttention(2, 4)
    ours(X, X)
    theirs(X, X)
    theirs.set_weights(ours.get_weights())
    dense = np.broadcast_to(np_mask, (B, T, T))
    got = ours(X, X, return_attention_scores=True)
    want = theirs(X, X, attention_mask=dense, return_attention_scores=True)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np_(a), np_(b), atol=1e-5)
    # The automatic (weights-free) path too.
    np.testing.assert_allclose(np_(ours(X, X)), np_(want[0]), atol=1e-5)


def _np_mha(layer, x, bias=None, mask=None):
    """NumPy multi-head attention from the layer's own weights."""
    w = {v.path.split("/", 1)[1]: np_(v) for v in layer.weights}
    q = np.einsum("btf,fhd->bthd", x, w["query/kernel"]) + w["query/bias"]
    k = np.einsum("btf,fhd->bthd", x, w["key/kernel"]) + w["key/bias"]
    v = np.einsum("btf,fhd->bthd", x, w["value/kernel"]) + w["value/bias"]
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    if mask is not None:
        s = np.where(mask, s, -1e30)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", p, v)
    out = np.einsum("bihd,hdf->bif", o, w["attention_output/kernel"])
    return out + w["attention_output/bias"]


def test_a_score_layer_equals_numpy_and_trains():
    layer = ka.SelfAttention(2, 4, score_mod=HeadDistanceBias(), causal=True)
    out = layer(X)
    slopes = np_(layer.score_mod.slopes)
    bias = -slopes[None, :, None, None] * np.abs(QI - KJ)[None, None]
    want = _np_mha(layer, X, bias, (KJ <= QI)[None, None])
    np.testing.assert_allclose(np_(out), want, atol=1e-5)
    assert any("slopes" in v.path for v in layer.trainable_weights)


LAYERS = {
    "MultiHeadAttention": (
        ka.MultiHeadAttention,
        dict(query=X, value=X),
        ((B, T, F), (B, 2, T, T)),
    ),
    "SelfAttention": (
        ka.SelfAttention,
        dict(inputs=X),
        ((B, T, F), (B, 2, T, T)),
    ),
    "CausalSelfAttention": (
        ka.CausalSelfAttention,
        dict(inputs=X),
        ((B, T, F), (B, 2, T, T)),
    ),
}


@pytest.mark.parametrize(
    "mod",
    [
        "causal",
        "window",
        "keras_window",
        "chunked",
        "prefix_lm",
        "and_or",
        "score",
    ],
)
@pytest.mark.parametrize("layer_name", sorted(LAYERS))
def test_harness_on_layers_holding_objects(layer_name, mod):
    cls, input_data, shapes = LAYERS[layer_name]
    if mod == "score":
        init = dict(score_mod=HeadDistanceBias())
    else:
        init = dict(mask_mod=STATIC_MASKS[mod][0])
    # Every object through the cheap checks; the expensive ones (fit,
    # mixed precision, SavedModel in a fresh process) on SelfAttention.
    full = layer_name == "SelfAttention" and mod in ("score", "and_or")
    run_layer_test(
        cls,
        dict(num_heads=2, key_dim=4, **init),
        input_data,
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=shapes,
        expected_num_trainable_weights=9 if mod == "score" else 8,
        run_mixed_precision=full,
        run_fit=full,
        run_saved_model=full,
    )


def test_document_mask_with_segment_ids_as_a_model_input_trains():
    ids = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]], "int32")
    x_in = keras.Input((T, F))
    ids_in = keras.Input((T,), dtype="int32")
    layer = ka.SelfAttention(
        2, 4, mask_mod=mods.DocumentMask(), causal=True, name="attn"
    )
    y = layer(x_in, mod_inputs={"segment_ids": ids_in})
    model = keras.Model([x_in, ids_in], y)
    np_mask = (ids[:, :, None] == ids[:, None, :]) & (KJ <= QI)[None]
    want = _np_mha(layer, X, mask=np_mask[:, None])
    np.testing.assert_allclose(np_(model([X, ids])), want, atol=1e-5)
    model.compile("sgd", "mse")
    history = model.fit([X, ids], np.zeros_like(X), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    path = os.path.join(tempfile.mkdtemp(), "documents.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        np_(loaded([X, ids])), np_(model([X, ids])), atol=1e-5
    )


def test_call_time_inputs_are_checked():
    layer = ka.SelfAttention(2, 4, mask_mod=mods.DocumentMask())
    with pytest.raises(ValueError, match="segment_ids"):
        layer(X)
    plain = ka.SelfAttention(2, 4, mask_mod=mods.CausalMask())
    with pytest.raises(ValueError, match="mod_inputs"):
        plain(X, mod_inputs={"segment_ids": np.zeros((B, T), "int32")})


def test_a_plain_function_works_but_cannot_be_saved():
    def causal(batch, head, q_idx, kv_idx):
        return kv_idx <= q_idx

    x_in = keras.Input((T, F))
    layer = ka.SelfAttention(2, 4, mask_mod=causal, name="plain_fn")
    model = keras.Model(x_in, layer(x_in))
    want = _np_mha(layer, X, mask=(KJ <= QI)[None, None])
    np.testing.assert_allclose(np_(model(X)), want, atol=1e-5)
    path = os.path.join(tempfile.mkdtemp(), "plain.keras")
    with pytest.raises(ValueError, match="`mask_mod` of layer 'plain_fn'"):
        model.save(path)


def test_bad_objects_are_refused_at_construction():
    with pytest.raises(TypeError, match="score_mod"):
        ka.MultiHeadAttention(2, 4, score_mod="alibi")
    with pytest.raises(TypeError, match="mask_mod"):
        ka.SelfAttention(2, 4, mask_mod=3)
    layer = ka.MultiHeadAttention(2, 4, mask_mod=mods.CausalMask())
    with pytest.raises(ValueError, match="mask_mod"):
        layer(np.zeros((1, 2, 3, 8), "float32"), np.zeros((1, 2, 3, 8)))


# Keras 3.15's `_compute_attention` hook scenarios ----------------------


@pytest.mark.parametrize("kv_heads", [None, 1])
def test_causal_only_skipped_for_subclass(kv_heads):
    # A subclass with Keras's earlier `_compute_attention` signature must
    # not get `attention_mask=None` under `use_causal_mask=True` (it would
    # silently attend to the future).
    seen = {}

    class Sub(ka.MultiHeadAttention):
        def _compute_attention(
            self,
            query,
            key,
            value,
            attention_mask=None,
            training=None,
            return_attention_scores=False,
        ):
            seen["mask_is_none"] = attention_mask is None
            return super()._compute_attention(
                query,
                key,
                value,
                attention_mask,
                training,
                return_attention_scores,
            )

    layer = Sub(num_heads=2, key_dim=4, num_key_value_heads=kv_heads)
    x = np.random.RandomState(0).randn(2, 5, 8).astype("float32")
    out = layer(x, x, use_causal_mask=True)
    assert seen["mask_is_none"] is False
    plain = ka.MultiHeadAttention(2, 4, num_key_value_heads=kv_heads)
    plain(x, x)
    plain.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        np_(out), np_(plain(x, x, use_causal_mask=True)), atol=1e-5
    )


@pytest.mark.parametrize("return_attention_scores", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_compute_attention_combines_causal_and_explicit_mask(
    return_attention_scores, kv_heads
):
    t = 5
    layer = ka.MultiHeadAttention(2, 4, num_key_value_heads=kv_heads)
    layer.build(query_shape=(1, t, 8), value_shape=(1, t, 8))
    rng = np.random.RandomState(0)
    query = rng.randn(1, t, 2, 4).astype("float32")
    key = rng.randn(1, t, kv_heads, 4).astype("float32")
    value = rng.randn(1, t, kv_heads, 4).astype("float32")
    extra = np.ones((1, t, t), dtype="bool")
    extra[:, 3, 1] = False
    merged = extra & np.tril(np.ones((t, t), dtype="bool"))[None]
    out_both, _ = layer._compute_attention(
        query,
        key,
        value,
        attention_mask=extra,
        use_causal_mask=True,
        return_attention_scores=return_attention_scores,
    )
    out_merged, _ = layer._compute_attention(
        query,
        key,
        value,
        attention_mask=merged,
        use_causal_mask=False,
        return_attention_scores=return_attention_scores,
    )
    np.testing.assert_allclose(np_(out_both), np_(out_merged), atol=1e-5)


def test_an_override_sees_every_mask_and_changes_the_result():
    # A Keras-style subclass (temperature on the scores) gets padding,
    # causal and mask objects folded into its `attention_mask`.
    class Sharper(ka.MultiHeadAttention):
        def _compute_attention(
            self,
            query,
            key,
            value,
            attention_mask=None,
            training=None,
            return_attention_scores=False,
        ):
            return super()._compute_attention(
                query * 2.0,
                key,
                value,
                attention_mask,
                training,
                return_attention_scores,
            )

    layer = Sharper(2, 4, mask_mod=mods.SlidingWindowMask(1))
    padding = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], bool)
    out, weights = layer(
        X,
        X,
        value_mask=padding,
        use_causal_mask=True,
        return_attention_scores=True,
    )
    allowed = (KJ <= QI) & (np.abs(QI - KJ) <= 1)
    allowed = allowed[None, None] & padding[:, None, None, :]
    assert np.all(np_(weights)[~np.broadcast_to(allowed, weights.shape)] == 0)
    with pytest.raises(ValueError, match="score_mod"):
        Sharper(2, 4, score_mod=HeadDistanceBias())(X, X)


def test_blocks_pass_objects_and_call_time_inputs_to_their_self_attention():
    from keras_attention import blocks

    ids = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]], "int32")
    dense = ids[:, :, None] == ids[:, None, :]
    for cls, extra in (
        (blocks.TransformerEncoderBlock, {}),
        (blocks.TransformerDecoderBlock, {"cross_attention": False}),
    ):
        block = cls(2, 16, mask_mod=mods.DocumentMask(), **extra)
        plain = cls(2, 16, **extra)
        kwargs = {}
        got = block(X, mod_inputs={"segment_ids": ids}, **kwargs)
        plain(X)
        plain.set_weights(block.get_weights())
        want = plain(X, attention_mask=dense)
        np.testing.assert_allclose(np_(got), np_(want), atol=1e-5)
        again = cls.from_config(block.get_config())
        assert again.mask_mod == block.mask_mod


def test_harness_on_a_block_with_a_score_layer():
    from keras_attention import blocks

    run_layer_test(
        blocks.TransformerEncoderBlock,
        dict(
            num_heads=2,
            intermediate_dim=16,
            score_mod=HeadDistanceBias(),
            mask_mod=mods.ChunkedCausalMask(3),
        ),
        dict(inputs=X),
        expected_output_shape=(B, T, F),
        expected_num_trainable_weights=17,
    )


def test_local_self_attention_takes_objects_on_its_banded_path():
    layer = ka.LocalSelfAttention(
        2,
        4,
        window_size=2,
        mask_mod=mods.DocumentMask(),
        score_mod=HeadDistanceBias(),
    )
    ids = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]], "int32")
    out = layer(X, mod_inputs={"segment_ids": ids})
    slopes = np_(layer.score_mod.slopes)
    bias = -slopes[None, :, None, None] * np.abs(QI - KJ)[None, None]
    allowed = (np.abs(QI - KJ) <= 2)[None] & (ids[:, :, None] == ids[:, None])
    want = _np_mha(layer, X, bias, allowed[:, None])
    np.testing.assert_allclose(np_(out), want, atol=1e-5)
    with pytest.raises(ValueError, match="global_mask"):
        layer(
            X,
            mod_inputs={"segment_ids": ids},
            global_mask=np.zeros((B, T), bool),
        )
