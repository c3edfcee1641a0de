"""What the shared `from_keras_hub` tests do not show for Qwen 3.5
(`Qwen3_5Backbone`): its gated attention layer (`Qwen3_5Attention`)
equals our `MultiHeadAttention(use_gate=True, qk_norm="rms",
rotary_fraction=...)` with its query kernel split, also with its cache;
the layer kinds follow `layer_types`; M-RoPE on text is plain RoPE;
greedy generation equals greedy decoding driven by keras-hub's own
forward pass (not its `Qwen3_5CausalLM.generate`, which runs the gated
delta rule over the padded prompt buffer); refusals. Backend-neutral."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from test_from_keras_hub import perturbed
from test_from_keras_hub import tiny
from tiers import family_tier

from keras_attention.interop import causal_lm_generator
from keras_attention.interop import from_keras_hub
from keras_attention.layers import GatedDeltaNet
from keras_attention.layers import MultiHeadAttention

keras_hub = pytest.importorskip("keras_hub")
pytestmark = family_tier()
qwen3_5_attention = pytest.importorskip(
    "keras_hub.src.models.qwen3_5.qwen3_5_attention"
)

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, T = 4, 2, 8, 16, 4


def _attention_pair():
    """keras-hub's `Qwen3_5Attention` (noisy weights; half of each head
    rotated) and ours with its weights: the query kernel `(hidden,
    heads, 2 * head_dim)` split into `query` and `gate`, the zero-centred
    QK-norm scales plus 1."""
    theirs = qwen3_5_attention.Qwen3_5Attention(
        num_query_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        partial_rotary_factor=0.5,
        rope_max_wavelength=100,
        layer_norm_epsilon=1e-6,
    )
    theirs.build((None, None, HIDDEN))
    rng = np.random.default_rng(3)
    for weight in theirs.weights:
        weight.assign(rng.normal(scale=0.5, size=weight.shape))
    ours = MultiHeadAttention(
        HEADS,
        HEAD_DIM,
        use_bias=False,
        use_gate=True,
        num_key_value_heads=KV_HEADS,
        rotary_max_wavelength=100,
        rotary_fraction=0.5,
        qk_norm="rms",
        qk_norm_epsilon=1e-6,
    )
    x = np.zeros((1, T, HIDDEN), "float32")
    ours(x, x)
    w = {v.path.split("/", 1)[1]: to_numpy(v) for v in theirs.weights}
    query = w["query/kernel"]
    values = {
        "query/kernel": query[..., :HEAD_DIM],
        "gate/kernel": query[..., HEAD_DIM:],
        "query_norm/scale": w["query_norm/scale"] + 1.0,
        "key_norm/scale": w["key_norm/scale"] + 1.0,
    }
    for weight in ours.weights:
        name = weight.path.split("/", 1)[1]
        weight.assign(values.get(name, w.get(name)))
    return theirs, ours


def test_gated_attention_equals_keras_hub_attention():
    theirs, ours = _attention_pair()
    x = np.random.default_rng(0).normal(size=(2, T, HIDDEN)).astype("float32")
    causal = np.tril(np.ones((T, T), bool))[None].repeat(2, 0)
    want = to_numpy(theirs(x, attention_mask=causal))
    got = to_numpy(ours(x, x, use_causal_mask=True))
    np.testing.assert_allclose(got, want, atol=1e-5)
    # Without the gate, another output: the gate is applied.
    ours.use_gate = False
    assert np.abs(to_numpy(ours(x, x, use_causal_mask=True)) - want).max() > 0.1
    ours.use_gate = True
    # Token by token with the caches (theirs: keys and values at their
    # positions in a (batch, 2, T, kv_heads, head_dim) buffer, as ours).
    their_cache = np.zeros((2, 2, T, KV_HEADS, HEAD_DIM), "float32")
    our_cache = their_cache
    for i in range(T):
        mask = np.arange(T)[None, None] <= i
        step, their_cache = theirs(
            x[:, i : i + 1],
            attention_mask=np.repeat(mask, 2, 0),
            cache=their_cache,
            cache_update_index=i,
        )
        mine, our_cache = ours(
            x[:, i : i + 1],
            x[:, i : i + 1],
            cache=our_cache,
            cache_update_index=i,
            use_causal_mask=True,
        )
        np.testing.assert_allclose(to_numpy(mine), to_numpy(step), atol=1e-5)
        np.testing.assert_allclose(to_numpy(mine)[:, 0], got[:, i], atol=1e-5)


@pytest.fixture(scope="module")
def converted():
    keras.utils.set_random_seed(1)
    backbone = perturbed(tiny("qwen3_5"))
    return backbone, from_keras_hub(backbone)


def test_layer_kinds_follow_layer_types(converted):
    backbone, model = converted
    blocks = [model.get_layer(f"transformer_layer_{i}") for i in range(4)]
    mixers = [b.self_attention for b in blocks]
    assert [isinstance(m, GatedDeltaNet) for m in mixers] == [True, False] * 2
    assert [getattr(m, "use_gate", False) for m in mixers] == [False, True] * 2
    attention = blocks[1].self_attention
    assert attention.use_gate and attention.rotary_fraction == 0.5
    assert blocks[0].self_attention.linear_num_value_heads == 4
    # keras-hub's zero-centred norms (1 + scale): ours hold scale + 1;
    # the gated delta net's output norm (scale) is copied as it is.
    theirs = {w.path: to_numpy(w) for w in backbone.weights}
    ours = {w.path: to_numpy(w) for w in model.weights}
    np.testing.assert_array_equal(
        ours["transformer_layer_1/self_attention/query_norm/scale"],
        theirs["transformer_layer_1/self_attention/query_norm/scale"] + 1.0,
    )
    np.testing.assert_array_equal(
        ours["transformer_layer_0/self_attention/norm/scale"],
        theirs["transformer_layer_0/linear_attn/norm/scale"],
    )


def test_mrope_on_text_is_plain_rope(converted):
    backbone, _ = converted
    # keras-hub's interleaved M-RoPE with every channel at the token's
    # position (text) equals its plain rotary positions.
    attention = backbone.transformer_layers[1]._self_attention_layer
    x = np.random.default_rng(1).normal(size=(2, 5, HEADS, 4))
    positions = np.broadcast_to(np.arange(5, dtype="int32"), (2, 4, 5))
    mrope = qwen3_5_attention._apply_mrope(
        x, attention.rotary_embedding_layer, positions, [1, 1, 0], 4
    )
    plain = attention.rotary_embedding_layer(x, start_index=0)
    np.testing.assert_allclose(to_numpy(mrope), to_numpy(plain), atol=1e-6)
    # keras-hub's backbone passes no position ids (plain RoPE whatever
    # `mrope_section`): a backbone with one converts as the others.
    sectioned = tiny("qwen3_5", mrope_section=[1, 1, 0])
    blocks = from_keras_hub(sectioned).get_layer("transformer_layer_1")
    assert blocks.self_attention.rotary_fraction == 0.5


def _greedy_by_forward(backbone, prompts, lengths, max_length):
    """Greedy decoding driven by keras-hub's forward pass: the backbone
    run on the growing right-padded buffer, the next token the argmax of
    the logits (the reverse embedding) at each row's last real one."""
    tokens = np.array(prompts)
    lengths = np.array(lengths)

    def forward(token_ids, padding_mask):
        return backbone({"token_ids": token_ids, "padding_mask": padding_mask})

    if keras.backend.backend() == "jax":  # one compiled program, one shape
        import jax

        forward = jax.jit(forward)
    while lengths.min() < max_length:
        mask = np.arange(max_length)[None] < lengths[:, None]
        hidden = forward(tokens * mask, mask)
        rows = np.arange(len(tokens))
        last = keras.ops.take_along_axis(
            hidden, (lengths - 1)[:, None, None], axis=1
        )[:, 0]
        logits = to_numpy(backbone.token_embedding(last, reverse=True))
        grow = lengths < max_length
        tokens[rows[grow], lengths[grow]] = logits.argmax(-1)[grow]
        lengths = lengths + grow
    return tokens


# On JAX the eager prefill and steps of two gated delta nets cost ~12-25 s
# on the 2-core machine: the slow tier there (TensorFlow and PyTorch run
# it in the fast tier).
_JAX_SLOW = (
    pytest.mark.slow("eager gated delta nets on JAX, ~12-25 s")
    if keras.backend.backend() == "jax"
    else (lambda test: test)
)


@_JAX_SLOW
def test_greedy_generation_equals_keras_hub_forward_greedy(converted):
    backbone, model = converted
    max_length = 10
    prompts = np.zeros((2, max_length), "int32")
    prompts[0, :3] = [5, 7, 9]
    prompts[1, :5] = [3, 4, 11, 12, 13]
    want = _greedy_by_forward(backbone, prompts, [3, 5], max_length)
    ours = causal_lm_generator(model, jit_compile=False)
    got, _ = ours.generate(
        prompts,
        max_length=max_length,
        sampler="greedy",
        padding_mask=prompts != 0,
    )
    np.testing.assert_array_equal(to_numpy(got), want)
    assert len(np.unique(want[:, 5:])) > 1  # not one token repeated


def test_vision_encoder_and_odd_rotary_share_are_refused():
    backbone = tiny("qwen3_5")
    backbone.partial_rotary_factor = 0.375  # 3 of 8 features
    with pytest.raises(ValueError, match="partial_rotary_factor=0.375"):
        from_keras_hub(backbone)
    backbone.partial_rotary_factor = 0.5
    backbone.vision_encoder = keras.layers.Dense(2)  # any layer
    with pytest.raises(ValueError, match="vision_encoder"):
        from_keras_hub(backbone)
