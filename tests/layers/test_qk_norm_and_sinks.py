"""`MultiHeadAttention(qk_norm=..., learned_sinks=...)`: equal to
keras-hub's `Qwen3Attention` and `Gemma3Attention` (QK-norm) and
`GptOssAttention` (learned sinks, YaRN, its window) with the same weights;
the same result on every path (dense, blockwise, banded, cached, rolling
cache), `LocalSelfAttention`'s band included; serialization and
refusals.
"""

import itertools

import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras import ops

import keras_attention as ka

BACKEND = keras.backend.backend()
B, T, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2, 6, 16, 4, 2, 8
RNG = np.random.default_rng(38)
X = RNG.normal(size=(B, T, HIDDEN)).astype("float32")
CAUSAL = np.tril(np.ones((T, T), bool))
PADDING = np.ones((B, T), bool)
PADDING[1, :2] = False  # Left padding.


def to_np(x):
    return ops.convert_to_numpy(x)


def randomize(layer, seed):
    """Random weights everywhere (norm scales and sinks included)."""
    rng = np.random.default_rng(seed)
    layer.set_weights(
        [
            rng.normal(size=w.shape).astype("float32") * 0.5
            for w in layer.weights
        ]
    )


def ours(**kwargs):
    layer = ka.layers.MultiHeadAttention(
        HEADS,
        HEAD_DIM,
        num_key_value_heads=KV_HEADS,
        **kwargs,
    )
    layer.build((B, T, HIDDEN), (B, T, HIDDEN))
    return layer


def copy_by_name(hub, layer, renames, plus_one=()):
    """Copies `hub`'s weights into `layer` by path name (`renames`: hub
    sublayer name -> ours; `plus_one`: hub norms storing `scale - 1`)."""
    mine = {w.path.split("/", 1)[1]: w for w in layer.weights}
    for w in hub.weights:
        sub, leaf = w.path.split("/")[-2:]
        if sub == hub.name:  # The layer's own weight (gpt-oss's sinks).
            sub, leaf = None, leaf
        value = to_np(w)
        if sub in plus_one:
            value = value + 1.0
        name = leaf if sub is None else f"{renames.get(sub, sub)}/{leaf}"
        target = mine.pop(name)
        if value.shape != tuple(target.shape):  # Another axis order.
            order = next(
                p
                for p in itertools.permutations(range(value.ndim))
                if value.transpose(p).shape == tuple(target.shape)
            )
            value = value.transpose(order)
        target.assign(value)
    assert not mine, sorted(mine)


def test_equal_to_keras_hub_qwen3_attention():
    from keras_hub.src.models.qwen3.qwen3_attention import Qwen3Attention

    hub = Qwen3Attention(
        num_query_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        rope_max_wavelength=10000,
        layer_norm_epsilon=1e-6,
    )
    hub(X, attention_mask=CAUSAL[None])
    randomize(hub, 0)
    layer = ours(
        use_bias=False,
        rotary_max_wavelength=10000,
        qk_norm="rms",
        qk_norm_epsilon=1e-6,
    )
    copy_by_name(
        hub,
        layer,
        {
            "query_dense_layernorm": "query_norm",
            "key_dense_layernorm": "key_norm",
        },
    )
    mask = CAUSAL[None] & PADDING[:, None, :]
    want = to_np(hub(X, attention_mask=mask))
    got = to_np(layer(X, X, use_causal_mask=True, key_mask=PADDING))
    rows = PADDING  # keras-hub's rows of left padding see only padding.
    rows = rows | np.arange(T)[None] >= 2
    np.testing.assert_allclose(got[rows], want[rows], atol=2e-5)


def test_equal_to_keras_hub_gemma3_attention():
    from keras_hub.src.models.gemma3.gemma3_attention import (
        CachedGemma3Attention,
    )

    hub = CachedGemma3Attention(
        head_dim=HEAD_DIM,
        num_query_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        use_query_key_norm=True,
        rope_wavelength=10000.0,
    )
    hub(X, attention_mask=CAUSAL[None])
    randomize(hub, 1)
    layer = ours(
        use_bias=False,
        rotary_max_wavelength=10000.0,
        qk_norm="rms",
        qk_norm_epsilon=1e-6,
    )
    copy_by_name(hub, layer, {}, plus_one=("query_norm", "key_norm"))
    want = to_np(hub(X, attention_mask=CAUSAL[None]))
    got = to_np(layer(X, X, use_causal_mask=True))
    np.testing.assert_allclose(got, want, atol=2e-5)


def _gpt_oss_pair(window):
    from keras_hub.src.models.gpt_oss.gpt_oss_attention import GptOssAttention

    hub = GptOssAttention(
        num_query_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        rope_max_wavelength=150000,
        rope_scaling_factor=32.0,
        sliding_window=window,
    )
    hub(X, attention_mask=CAUSAL[None])
    randomize(hub, 2)
    layer = ours(
        rotary_max_wavelength=150000,
        rotary_scaling=dict(
            scaling_factor=32.0,
            rope_type="yarn",
            beta_fast=32.0,
            beta_slow=1.0,
            original_max_position_embeddings=4096,
            truncate=False,
        ),
        # keras-hub's window `w` keeps keys `j >= i - w`: w + 1 of them.
        sliding_window=None if window is None else window + 1,
        learned_sinks=True,
    )
    copy_by_name(hub, layer, {})
    return hub, layer


@pytest.mark.parametrize("window", [None, 2])
def test_equal_to_keras_hub_gpt_oss_attention(window):
    hub, layer = _gpt_oss_pair(window)
    want = to_np(hub(X, attention_mask=CAUSAL[None]))
    for flash in (False, True):  # Dense; blockwise or banded.
        layer._flash_attention = flash
        got = to_np(layer(X, X, use_causal_mask=True))
        np.testing.assert_allclose(got, want, atol=2e-5, err_msg=str(flash))


def test_sinks_and_norms_give_the_same_result_on_every_path():
    layer = ours(qk_norm="layer", learned_sinks=True, sliding_window=3)
    randomize(layer, 3)
    results = {}
    for flash in (False, None, True):
        layer._flash_attention = flash
        results[flash] = to_np(
            layer(X, X, use_causal_mask=True, key_mask=PADDING)
        )
    with ka.ops.implementation_scope("blockwise", query_block=2, key_block=3):
        layer._flash_attention = None
        layer.sliding_window = None  # Not banded: the window as a mask.
        layer.mask_mod = ka.mods.SlidingWindowMask((2, 0))
        results["tiles"] = to_np(
            layer(X, X, use_causal_mask=True, key_mask=PADDING)
        )
    for name, got in results.items():
        np.testing.assert_allclose(
            got, results[False], atol=2e-5, err_msg=str(name)
        )


def test_cached_decoding_equals_the_whole_sequence():
    layer = ours(qk_norm="rms", learned_sinks=True, rotary_max_wavelength=10000)
    randomize(layer, 4)
    whole = to_np(layer(X, X, use_causal_mask=True))
    cache = np.zeros((B, 2, T, KV_HEADS, HEAD_DIM), "float32")
    steps = []
    for t in range(T):
        x = X[:, t : t + 1]
        out, cache = layer(
            x, x, cache=cache, cache_update_index=t, use_causal_mask=True
        )
        steps.append(to_np(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), whole, atol=2e-5)


def test_rolling_cache_with_sinks_equals_the_windowed_sequence():
    layer = ours(learned_sinks=True, qk_norm="rms", sliding_window=3)
    randomize(layer, 5)
    layer._flash_attention = False
    whole = to_np(layer(X, X, use_causal_mask=True))
    cache = np.zeros((B, 2, 4, KV_HEADS, HEAD_DIM), "float32")
    steps = []
    for t in range(T):
        x = X[:, t : t + 1]
        out, cache = layer(
            x,
            x,
            cache=cache,
            cache_update_index=t,
            cache_sink_tokens=1,
            use_causal_mask=True,
        )
        steps.append(to_np(out))
    # A sink token stays visible in the rolling cache: compare the steps
    # whose window still holds position 0.
    np.testing.assert_allclose(
        np.concatenate(steps, 1)[:, :3], whole[:, :3], atol=2e-5
    )


def test_harness():
    run_layer_test(
        ka.layers.MultiHeadAttention,
        dict(
            num_heads=2,
            key_dim=4,
            qk_norm="rms",
            learned_sinks=True,
            num_key_value_heads=1,
        ),
        dict(query=X[:, :, :8], value=X[:, :, :8]),
        expected_output_shape=(B, T, 8),
        expected_num_trainable_weights=11,
    )


def test_config_and_weights():
    layer = ka.layers.MultiHeadAttention(
        2, 4, qk_norm="layer", qk_norm_epsilon=1e-5, learned_sinks=True
    )
    config = layer.get_config()
    assert config["qk_norm"] == "layer"
    assert config["qk_norm_epsilon"] == 1e-5 and config["learned_sinks"]
    plain = ka.layers.MultiHeadAttention(2, 4).get_config()
    assert not {"qk_norm", "learned_sinks"} & set(plain)  # Keras's keys.
    layer.build((1, 3, 8), (1, 3, 8))
    names = sorted(w.path.split("/", 1)[1] for w in layer.weights)
    assert "sinks" in names and "query_norm/gamma" in names
    assert "key_norm/beta" in names


def test_refusals():
    with pytest.raises(ValueError, match="qk_norm='batch'"):
        ka.layers.MultiHeadAttention(2, 4, qk_norm="batch")
    with pytest.raises(ValueError, match="qk_norm_epsilon=0"):
        ka.layers.MultiHeadAttention(2, 4, qk_norm="rms", qk_norm_epsilon=0)
    with pytest.raises(ValueError, match="learned_sinks='yes'"):
        ka.layers.MultiHeadAttention(2, 4, learned_sinks="yes")
    local = ka.layers.LocalSelfAttention(
        num_heads=2, key_dim=4, window_size=2, learned_sinks=True
    )
    with pytest.raises(ValueError, match="learned_sinks=True"):
        local(X[:, :, :8], global_mask=np.eye(B, T, dtype=bool))


def local_pair(causal):
    """`LocalSelfAttention` with learned sinks and QK-norm, and the same
    `SelfAttention` (weights copied) to run under the window's mask."""
    kwargs = dict(
        num_heads=HEADS,
        key_dim=HEAD_DIM,
        num_key_value_heads=KV_HEADS,
        learned_sinks=True,
        qk_norm="rms",
        causal=causal,
    )
    local = ka.layers.LocalSelfAttention(window_size=2, **kwargs)
    dense = ka.layers.SelfAttention(**kwargs)
    local.build(X.shape)
    dense.build(X.shape)
    randomize(local, 6)
    dense.set_weights(local.get_weights())
    return local, dense


@pytest.mark.parametrize("causal", [True, False])
def test_local_self_attention_applies_sinks_on_the_band(causal):
    local, dense = local_pair(causal)
    window = ka.masks.sliding_window_mask(T, 2, causal)
    got, banded = local(X, mask=PADDING, return_attention_scores=True)
    want, weights = dense(
        X, mask=PADDING, attention_mask=window, return_attention_scores=True
    )
    np.testing.assert_allclose(to_np(got), to_np(want), atol=2e-5)
    np.testing.assert_allclose(
        to_np(local.scores_to_dense(banded)), to_np(weights), atol=2e-5
    )
    # The sinks take mass: the real rows sum to less than one.
    sums = to_np(weights).sum(-1)[0]
    assert np.all(sums < 1 - 1e-3) and np.all(sums > 0)


def test_local_self_attention_decodes_with_sinks():
    local, _ = local_pair(True)
    whole = to_np(local(X))
    cache = np.zeros((B, 2, T, KV_HEADS, HEAD_DIM), "float32")
    steps = []
    for t in range(T):
        out, cache = local(X[:, t : t + 1], cache=cache, cache_update_index=t)
        steps.append(to_np(out))
    np.testing.assert_allclose(np.concatenate(steps, 1), whole, atol=2e-5)
