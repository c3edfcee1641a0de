import keras
import numpy as np
import pytest
from harness import run_layer_test
from harness import run_mask_test
from keras import ops
from references import multi_head_attention as np_mha

from keras_attention import masks
from keras_attention.layers import CausalSelfAttention
from keras_attention.layers import LocalSelfAttention
from keras_attention.layers import MultiHeadAttention
from keras_attention.layers import SelfAttention

X = np.random.default_rng(1).normal(size=(2, 6, 8)).astype("float32")


def np_(x):
    return ops.convert_to_numpy(x)


def test_harness_self_attention():
    run_layer_test(
        SelfAttention,
        dict(num_heads=2, key_dim=4, num_key_value_heads=1),
        dict(inputs=X),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((2, 6, 8), (2, 2, 6, 6)),
        expected_num_trainable_weights=8,
    )


def test_harness_causal_self_attention():
    run_layer_test(
        CausalSelfAttention,
        dict(num_heads=2, key_dim=4),
        dict(inputs=X),
        expected_output_shape=(2, 6, 8),
        run_mixed_precision=False,  # covered by the SelfAttention case
    )


def test_masks():
    run_mask_test(
        SelfAttention, dict(num_heads=2, key_dim=4), ("inputs",), ("mask",)
    )
    run_mask_test(
        CausalSelfAttention,
        dict(num_heads=2, key_dim=4),
        ("inputs",),
        ("mask",),
        causal=True,
    )


def test_weights_are_interchangeable_with_multi_head_attention():
    mha = MultiHeadAttention(2, 4)
    ref = mha(X, X, use_causal_mask=True)
    layer = CausalSelfAttention(2, 4)
    layer(X)
    layer.set_weights(mha.get_weights())
    np.testing.assert_allclose(np_(layer(X)), np_(ref), atol=1e-6)


def test_numpy_reference_with_prefix_lm_mask():
    layer = SelfAttention(2, 4)
    prefix = masks.prefix_lm_mask(6, np.array([2, 4]))
    out, w = layer(X, attention_mask=prefix, return_attention_scores=True)
    ref, ref_w = np_mha(layer, X, X, mask=np_(prefix)[:, None])
    np.testing.assert_allclose(np_(out), ref, atol=1e-5)
    np.testing.assert_allclose(np_(w), ref_w, atol=1e-6)
    assert np_(w)[1, :, 0, 3].min() > 0  # bidirectional in the prefix
    assert np.all(np_(w)[1, :, 4, 5] == 0)  # causal after it


def test_causal_config_round_trip():
    layer = CausalSelfAttention(2, 4)
    assert layer.causal and layer.get_config()["causal"]
    assert not SelfAttention.from_config(
        SelfAttention(2, 4).get_config()
    ).causal


def test_bad_input_rank():
    with pytest.raises(ValueError, match="query_shape"):
        SelfAttention(2, 4)(np.ones((3, 8), "float32"))


# Issue 10, defect 2: with a second tensor argument (`attention_mask=`,
# `cache=`) Keras stops filling `mask`; the layer reads the Keras mask itself.

# Left padding, so that causal queries see padded keys too.
VALID = np.array([[0, 0, 1, 1, 1, 1], [1] * 6], bool)


def _masked(x, valid):
    """`x` with a Keras mask attached (padded steps zeroed, as Masking does)."""
    return keras.layers.Masking()(x * valid[..., None])


@pytest.mark.parametrize("cls", [SelfAttention, CausalSelfAttention])
def test_keras_mask_is_kept_when_attention_mask_is_given(cls):
    layer = cls(2, 4)
    prefix = np_(masks.prefix_lm_mask(6, np.array([2, 3])))  # (2, 6, 6)
    x = X * VALID[..., None]
    out = layer(_masked(X, VALID), attention_mask=prefix)
    mask = VALID[:, None, :, None] & VALID[:, None, None, :] & prefix[:, None]
    if layer.causal:
        mask = mask & np.tril(np.ones((6, 6), bool))
    ref, _ = np_mha(layer, x, x, mask=mask)
    np.testing.assert_allclose(np_(out)[VALID], ref[VALID], atol=1e-5)
    # The output still carries the input's Keras mask.
    np.testing.assert_array_equal(
        np_(keras.src.backend.get_keras_mask(out)), VALID
    )


def test_keras_mask_is_kept_in_a_functional_model_with_attention_mask():
    tokens = keras.Input((6,), dtype="int32")
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    x = embedding(tokens)
    layer = SelfAttention(2, 4)
    y = layer(x, attention_mask=masks.sliding_window_mask(6, 1))
    assert keras.src.backend.get_keras_mask(y) is not None
    model = keras.Model(tokens, y)
    ids = np.array([[3, 1, 4, 1, 0, 0], [5, 9, 2, 6, 5, 3]], "int32")
    valid = ids != 0
    window = np_(masks.sliding_window_mask(6, 1))[:, None]
    e = np_(embedding(ids))
    ref, _ = np_mha(
        layer,
        e,
        e,
        mask=valid[:, None, :, None] & valid[:, None, None] & window,
    )
    np.testing.assert_allclose(np_(model(ids))[valid], ref[valid], atol=1e-5)


def test_padding_mask_shape_is_checked():
    with pytest.raises(
        ValueError, match=r"`mask`.*\(2, 6\).*mask.shape=\(2, 5\)"
    ):
        SelfAttention(2, 4)(X, mask=np.ones((2, 5), bool))
    with pytest.raises(ValueError, match=r"`mask`.*mask.shape=\(2, 6, 1\)"):
        CausalSelfAttention(2, 4)(X, mask=np.ones((2, 6, 1), bool))


@pytest.mark.parametrize("causal", ["False", 1, None])
def test_causal_must_be_a_bool(causal):
    with pytest.raises(ValueError, match=f"causal={causal!r}"):
        SelfAttention(2, 4, causal=causal)


# A cache written past its end (issue 36): refused eagerly, naming the index.

SLOTS = 4  # the cache's positions


def _cached_layer(cls):
    if cls is LocalSelfAttention:
        return cls(2, 4, window_size=2, causal=True)
    return cls(2, 4, causal=True)


CACHED_LAYERS = [SelfAttention, CausalSelfAttention, LocalSelfAttention]


@pytest.mark.parametrize("cls", CACHED_LAYERS)
@pytest.mark.parametrize(
    "index, steps",
    [(6, 1), (4, 1), (3, 2), (1, 4), (-1, 1), (np.int64(5), 1)],
)
def test_cache_written_past_its_end_is_refused(cls, index, steps):
    layer = _cached_layer(cls)
    cache = np.zeros((2, 2, SLOTS, 2, 4), "float32")
    with pytest.raises(ValueError, match="cache_update_index") as error:
        layer(X[:, :steps], cache=cache, cache_update_index=index)
    message = str(error.value)
    # (Keras turns a NumPy scalar argument into a tensor: its value.)
    assert f"cache_update_index={int(index)!r}" in message
    assert f"{SLOTS} positions" in message


@pytest.mark.parametrize("cls", CACHED_LAYERS)
def test_cache_index_is_checked_as_an_eager_tensor(cls):
    layer = _cached_layer(cls)
    cache = np.zeros((2, 2, SLOTS, 2, 4), "float32")
    index = ops.convert_to_tensor(4, "int32")
    with pytest.raises(ValueError, match="cache_update_index"):
        layer(X[:, :1], cache=cache, cache_update_index=index)


@pytest.mark.parametrize("cls", CACHED_LAYERS)
@pytest.mark.parametrize("index, steps", [(3, 1), (0, 4), (2, 2)])
def test_cache_written_up_to_its_last_slot_equals_a_full_pass(
    cls, index, steps
):
    # The last slots are valid: the boundary is `index + steps <= slots`.
    layer = _cached_layer(cls)
    x = X[:, :SLOTS]
    full = np_(layer(x))
    cache = np.zeros((2, 2, SLOTS, 2, 4), "float32")
    if index:
        _, cache = layer(x[:, :index], cache=cache, cache_update_index=0)
    out, cache = layer(
        x[:, index : index + steps], cache=cache, cache_update_index=index
    )
    np.testing.assert_allclose(
        np_(out), full[:, index : index + steps], atol=1e-5
    )


def test_rolling_cache_wraps_around_but_refuses_a_negative_index():
    # A rolling cache holds absolute positions in a ring: positions past
    # its slots are its point; a negative one is not a position.
    layer = LocalSelfAttention(2, 4, window_size=2, causal=True)
    x = X[:, :1]
    cache = np.zeros((2, 2, 3, 2, 4), "float32")
    out, _ = layer(x, cache=cache, cache_update_index=7, cache_sink_tokens=0)
    assert tuple(out.shape) == (2, 1, 8)
    with pytest.raises(ValueError, match=r"cache_update_index=-2"):
        layer(x, cache=cache, cache_update_index=-2, cache_sink_tokens=0)
    # Positions are int32: the last one, 2**31 - 1, and no further.
    out, _ = layer(
        x, cache=cache, cache_update_index=2**31 - 1, cache_sink_tokens=0
    )
    with pytest.raises(ValueError, match=r"2\*\*31.*=2147483647"):
        layer(
            X[:, :2],
            cache=cache,
            cache_update_index=2**31 - 1,
            cache_sink_tokens=0,
        )


# `positions=` (issue 36): rotary positions of every projection.


@pytest.mark.parametrize("global_projections", [False, True])
def test_positions_reach_every_rotary_projection(global_projections):
    # One position for every token cancels rotary positions (scores depend
    # on m - n only), Longformer's global projections included.
    kwargs = dict(window_size=1, global_projections=global_projections)
    rotary = LocalSelfAttention(2, 4, rotary_max_wavelength=100, **kwargs)
    plain = LocalSelfAttention(2, 4, **kwargs)
    global_mask = np.zeros((2, 6), bool)
    global_mask[:, 0] = True
    rotary(X, global_mask=global_mask), plain(X, global_mask=global_mask)
    plain.set_weights(rotary.get_weights())
    same = np.full((2, 6), 5, "int32")
    np.testing.assert_allclose(
        np_(rotary(X, global_mask=global_mask, positions=same)),
        np_(plain(X, global_mask=global_mask)),
        atol=1e-5,
    )
    np.testing.assert_allclose(
        np_(rotary(X, positions=same)), np_(plain(X)), atol=1e-5
    )
