"""Every public layer and block takes its mask, position, segment and
index arguments as Python lists (array-likes), as Keras's own layers take
their masks: the call with lists returns what the call with NumPy arrays
returns.

The inputs themselves (the float sequences) stay arrays: Keras refuses
lists as positional inputs before a layer's `call` runs ("Only input
tensors may be passed as positional arguments").
"""

import keras
import numpy as np
import public_layers
import pytest

from keras_attention import blocks
from keras_attention import layers
from keras_attention import scores

L = layers
RNG = np.random.default_rng(0)
B, T = 2, 6
X = RNG.normal(size=(B, T, 8)).astype("float32")
CTX = RNG.normal(size=(B, 5, 6)).astype("float32")
VALID = np.array([[True] * 6, [True, False, True, True, False, True]])
CTX_VALID = np.array([[True] * 5, [True, True, False, True, False]])
CAUSAL = np.tril(np.ones((T, T), bool))
ATTENTION = RNG.random((B, T, T)) > 0.3
ATTENTION |= np.eye(T, dtype=bool)
IDS = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 2]], "int32")
POSITIONS = np.array([[0, 1, 2, 0, 1, 2], [5, 6, 7, 8, 9, 10]], "int32")
POSITIONS_1D = np.arange(3, 3 + T, dtype="int32")
GLOBAL = np.array([[True] + [False] * 5, [False, True] + [False] * 4])


def _mha_masks(layer, q, v, qm, vm, km, am):
    return layer(
        q, v, query_mask=qm, value_mask=vm, key_mask=km, attention_mask=am
    )


MHA_MASKS = {
    "q": X,
    "v": X[:, :5][::-1],
    "qm": VALID,
    "vm": CTX_VALID,
    "km": CTX_VALID[::-1],
    "am": ATTENTION[:, :, :5],
}
MASK_NAMES = ("qm", "vm", "km", "am")

# (id, public class, layer factory, call(layer, **inputs), inputs, the
# names among `inputs` passed as lists in the second call).
CASES = [
    (
        "mha-masks",
        "MultiHeadAttention",
        lambda: L.MultiHeadAttention(2, 4),
        _mha_masks,
        MHA_MASKS,
        MASK_NAMES,
    ),
    (
        "mha-packed-positions",
        "MultiHeadAttention",
        lambda: L.MultiHeadAttention(2, 4, rotary_max_wavelength=100),
        lambda layer, x, ids, pos: layer(
            x, x, segment_ids=ids, positions=pos, use_causal_mask=True
        ),
        {"x": X, "ids": IDS, "pos": POSITIONS},
        ("ids", "pos"),
    ),
    (
        "mha-positions-1d-window",
        "MultiHeadAttention",
        lambda: L.MultiHeadAttention(
            2, 4, sliding_window=2, rotary_max_wavelength=100
        ),
        lambda layer, x, m, pos: layer(
            x, x, query_mask=m, value_mask=m, positions=pos
        ),
        {"x": X, "m": VALID, "pos": POSITIONS_1D},
        ("m", "pos"),
    ),
    (
        "mha-cache-attention-mask",
        "MultiHeadAttention",
        lambda: L.MultiHeadAttention(2, 4, num_key_value_heads=1),
        lambda layer, q, cache, am: layer(
            q, q, cache=cache, cache_update_index=2, attention_mask=am
        )[0],
        {
            "q": X[:, :1],
            "cache": RNG.normal(size=(B, 2, T, 1, 4)).astype("float32"),
            "am": np.arange(T)[None, None] <= 2 + np.zeros((B, 1, 1), int),
        },
        ("am",),
    ),
    (
        "gqa-masks",
        "GroupQueryAttention",
        lambda: L.GroupQueryAttention(4, 4, 2),
        _mha_masks,
        MHA_MASKS,
        MASK_NAMES,
    ),
    (
        "self-attention",
        "SelfAttention",
        lambda: L.SelfAttention(2, 4, rotary_max_wavelength=100),
        lambda layer, x, m, am, ids, pos: layer(
            x, mask=m, attention_mask=am, segment_ids=ids, positions=pos
        ),
        {"x": X, "m": VALID, "am": CAUSAL, "ids": IDS, "pos": POSITIONS},
        ("m", "am", "ids", "pos"),
    ),
    (
        "shared-kv-self-attention",
        "SharedKVSelfAttention",
        lambda: L.SharedKVSelfAttention(
            2,
            4,
            values_from_keys=True,
            value_norm="rms",
            proportional_rotary=True,
            rotary_max_wavelength=100,
            rotary_fraction=0.5,
        ),
        lambda layer, x, m, am, ids, pos: layer(
            x, mask=m, attention_mask=am, segment_ids=ids, positions=pos
        ),
        {"x": X, "m": VALID, "am": CAUSAL, "ids": IDS, "pos": POSITIONS},
        ("m", "am", "ids", "pos"),
    ),
    (
        "causal-self-attention",
        "CausalSelfAttention",
        lambda: L.CausalSelfAttention(2, 4, rotary_max_wavelength=100),
        lambda layer, x, m, am, pos: layer(
            x, mask=m, attention_mask=am, positions=pos
        ),
        {"x": X, "m": VALID, "am": ATTENTION, "pos": POSITIONS},
        ("m", "am", "pos"),
    ),
    (
        "disentangled-self-attention",
        "DisentangledSelfAttention",
        lambda: L.DisentangledSelfAttention(
            2,
            4,
            score_mod=scores.DisentangledRelativeBias(
                8, bucket_size=4, max_distance=5
            ),
        ),
        lambda layer, x, m, am, ids: layer(
            x, mask=m, attention_mask=am, segment_ids=ids
        ),
        {"x": X, "m": VALID, "am": ATTENTION, "ids": IDS},
        ("m", "am", "ids"),
    ),
    (
        "cross-attention",
        "CrossAttention",
        lambda: L.CrossAttention(2, 4),
        lambda layer, q, c, qm, cm, am: layer(
            q, c, query_mask=qm, context_mask=cm, attention_mask=am
        ),
        {
            "q": X,
            "c": CTX,
            "qm": VALID,
            "cm": CTX_VALID,
            "am": ATTENTION[:, :, :5],
        },
        ("qm", "cm", "am"),
    ),
    (
        "local-self-attention",
        "LocalSelfAttention",
        lambda: L.LocalSelfAttention(
            2, 4, window_size=2, rotary_max_wavelength=100
        ),
        lambda layer, x, m, am, pos: layer(
            x, mask=m, attention_mask=am, positions=pos
        ),
        {"x": X, "m": VALID, "am": ATTENTION, "pos": POSITIONS},
        ("m", "am", "pos"),
    ),
    (
        "local-self-attention-global",
        "LocalSelfAttention",
        lambda: L.LocalSelfAttention(2, 4, window_size=1),
        lambda layer, x, m, g: layer(x, mask=m, global_mask=g),
        {"x": X, "m": VALID, "g": GLOBAL},
        ("m", "g"),
    ),
    (
        "local-self-attention-packed",
        "LocalSelfAttention",
        lambda: L.LocalSelfAttention(2, 4, window_size=2, causal=True),
        lambda layer, x, m, ids: layer(x, mask=m, segment_ids=ids),
        {"x": X, "m": VALID, "ids": IDS},
        ("m", "ids"),
    ),
    (
        "multi-head-latent-attention",
        "MultiHeadLatentAttention",
        lambda: L.MultiHeadLatentAttention(2, 4, 2, 2, 3),
        lambda layer, x, m, am, pos: layer(
            x, query_mask=m, attention_mask=am, positions=pos
        ),
        {"x": X, "m": VALID, "am": ATTENTION, "pos": POSITIONS},
        ("m", "am", "pos"),
    ),
    (
        "lightning-indexer",
        "LightningIndexer",
        lambda: L.LightningIndexer(2, 4, 3),
        lambda layer, x, m, am, pos: layer(
            x, padding_mask=m, attention_mask=am, positions=pos
        ),
        {"x": X, "m": VALID, "am": ATTENTION, "pos": POSITIONS},
        ("m", "am", "pos"),
    ),
    (
        "linear-attention",
        "LinearAttention",
        lambda: L.LinearAttention(2, 4, decay="gated", chunk_size=4),
        lambda layer, x, m, ids: layer(
            x, query_mask=m, segment_ids=ids, use_causal_mask=True
        ),
        {"x": X, "m": VALID, "ids": IDS},
        ("m", "ids"),
    ),
    (
        "gated-delta-net",
        "GatedDeltaNet",
        lambda: L.GatedDeltaNet(8, 1, 2, 4, 3, chunk_size=4),
        lambda layer, x, m, ids: layer(x, mask=m, segment_ids=ids),
        {"x": X, "m": VALID, "ids": IDS},
        ("m", "ids"),
    ),
    (
        "kimi-delta-attention",
        "KimiDeltaAttention",
        lambda: L.KimiDeltaAttention(8, 2, 4, chunk_size=4),
        lambda layer, x, m, ids: layer(x, mask=m, segment_ids=ids),
        {"x": X, "m": VALID, "ids": IDS},
        ("m", "ids"),
    ),
    (
        "mixture-of-experts",
        "MixtureOfExperts",
        lambda: L.MixtureOfExperts(4, 2, 8, router_aux_loss_coef=0.01),
        # The mask weighs the load-balancing loss, added in training.
        lambda layer, x, m: (layer(x, mask=m, training=True), layer.losses),
        {"x": X, "m": VALID},
        ("m",),
    ),
    (
        "attention-pooling",
        "AttentionPooling",
        lambda: L.AttentionPooling(units=8),
        lambda layer, x, m: layer(x, mask=m, return_attention_scores=True),
        {"x": X, "m": VALID},
        ("m",),
    ),
    (
        "token-pooling-last",
        "TokenPooling",
        lambda: L.TokenPooling("last"),
        lambda layer, x, m: layer(x, padding_mask=m),
        {"x": X, "m": VALID},
        ("m",),
    ),
    (
        "convolution-padding-mask",
        "ConvolutionPaddingMask",
        lambda: L.ConvolutionPaddingMask([2], [2]),
        lambda layer, x, m: layer(x[:, :3], padding_mask=m),
        {"x": X, "m": VALID},
        ("m",),
    ),
    (
        "token-pooling-eos",
        "TokenPooling",
        lambda: L.TokenPooling("eos", eos_token_id=1),
        lambda layer, x, ids: layer(x, token_ids=ids),
        {"x": X, "ids": IDS},
        ("ids",),
    ),
    (
        "bahdanau",
        "BahdanauAttention",
        lambda: L.BahdanauAttention(6),
        lambda layer, q, c, qm, vm: layer(
            q, c, query_mask=qm, value_mask=vm, return_attention_scores=True
        ),
        {"q": X, "c": CTX, "qm": VALID, "vm": CTX_VALID},
        ("qm", "vm"),
    ),
    (
        "luong-local-p",
        "LuongAttention",
        lambda: L.LuongAttention(alignment="local-p", window=2),
        lambda layer, q, c, qm, vm: layer(
            q, c, query_mask=qm, value_mask=vm, return_attention_scores=True
        ),
        {"q": X[..., :6], "c": CTX, "qm": VALID, "vm": CTX_VALID},
        ("qm", "vm"),
    ),
    (
        "luong-local-m-positions",
        "LuongAttention",
        lambda: L.LuongAttention(alignment="local-m", window=1),
        lambda layer, q, c, vm, pos: layer(
            q, c, value_mask=vm, positions=pos, return_attention_scores=True
        ),
        {
            "q": X[..., :6],
            "c": CTX,
            "vm": CTX_VALID,
            "pos": np.array([[0, 1, 2, 3, 4, 4], [4, 3, 2, 1, 0, 0]]),
        },
        ("vm", "pos"),
    ),
    (
        "rnn-decoder",
        "AttentionRNNDecoder",
        lambda: L.AttentionRNNDecoder(8, L.BahdanauAttention(6)),
        lambda layer, y, c, ym, cm: layer(y, c, mask=ym, memory_mask=cm),
        {"y": X[..., :5], "c": CTX, "ym": VALID, "cm": CTX_VALID},
        ("ym", "cm"),
    ),
    (
        # A list `edges` is the pair (senders, receivers); an adjacency is
        # an array (a list of its rows would read as such a pair).
        "graph-attention-edge-list",
        "GraphAttention",
        lambda: L.GraphAttention(2, 4),
        lambda layer, x, s, r: layer(x, edges=(s, r)),
        {
            "x": X,
            "s": np.array([0, 1, 2, 3, 4, 5, 0], "int32"),
            "r": np.array([1, 2, 3, 4, 5, 0, 3], "int32"),
        },
        ("s", "r"),
    ),
    (
        "position-embedding",
        "PositionEmbedding",
        lambda: L.PositionEmbedding(12),
        lambda layer, x, pos: layer(x, positions=pos),
        {"x": X, "pos": POSITIONS},
        ("pos",),
    ),
    (
        "rotary",
        "RotaryEmbedding",
        lambda: L.RotaryEmbedding(),
        lambda layer, x, pos: layer(x, positions=pos),
        {"x": X.reshape(B, T, 2, 4), "pos": POSITIONS},
        ("pos",),
    ),
    (
        "sinusoidal",
        "SinusoidalPositionEncoding",
        lambda: L.SinusoidalPositionEncoding(),
        lambda layer, x, pos: layer(x, positions=pos),
        {"x": X, "pos": POSITIONS_1D},
        ("pos",),
    ),
    (
        "token-and-position",
        "TokenAndPositionEmbedding",
        lambda: L.TokenAndPositionEmbedding(20, 12, 8),
        lambda layer, ids, pos: layer(ids, positions=pos),
        {"ids": IDS + 3, "pos": POSITIONS},
        ("pos",),
    ),
    (
        "encoder-block",
        "TransformerEncoderBlock",
        lambda: blocks.TransformerEncoderBlock(
            2, 16, rotary_max_wavelength=100
        ),
        lambda layer, x, m, am, ids, pos: layer(
            x, padding_mask=m, attention_mask=am, segment_ids=ids, positions=pos
        ),
        {"x": X, "m": VALID, "am": ATTENTION, "ids": IDS, "pos": POSITIONS},
        ("m", "am", "ids", "pos"),
    ),
    (
        "encoder-block-global",
        "TransformerEncoderBlock",
        lambda: blocks.TransformerEncoderBlock(2, 16, window_size=2),
        lambda layer, x, m, g: layer(x, padding_mask=m, global_mask=g),
        {"x": X, "m": VALID, "g": GLOBAL},
        ("m", "g"),
    ),
    (
        "decoder-block",
        "TransformerDecoderBlock",
        lambda: blocks.TransformerDecoderBlock(2, 16),
        lambda layer, x, c, m, cm, am, cam: layer(
            x,
            c,
            padding_mask=m,
            context_padding_mask=cm,
            attention_mask=am,
            cross_attention_mask=cam,
        ),
        {
            "x": X,
            "c": CTX[..., :4].repeat(2, -1),
            "m": VALID,
            "cm": CTX_VALID,
            "am": ATTENTION,
            "cam": ATTENTION[:, :, :5],
        },
        ("m", "cm", "am", "cam"),
    ),
    (
        "decoder-block-packed",
        "TransformerDecoderBlock",
        lambda: blocks.TransformerDecoderBlock(
            2, 16, cross_attention=False, rotary_max_wavelength=100
        ),
        lambda layer, x, m, ids, pos: layer(
            x, padding_mask=m, segment_ids=ids, positions=pos
        ),
        {"x": X, "m": VALID, "ids": IDS, "pos": POSITIONS},
        ("m", "ids", "pos"),
    ),
]

# Public layers with no argument but their float inputs (which Keras
# itself refuses as lists): nothing here to take an array-like.
NO_ARRAY_LIKE_ARGUMENTS = {"FeedForward", "EncoderBridge", "ContrastiveLogits"}


def _numpy(outputs):
    return [
        keras.ops.convert_to_numpy(o)
        for o in keras.tree.flatten(outputs)
        if o is not None
    ]


def test_every_public_layer_has_a_case():
    covered = {case[1] for case in CASES} | NO_ARRAY_LIKE_ARGUMENTS
    assert public_layers.missing(covered) == []


@pytest.mark.parametrize(
    "name,cls,make,call,inputs,lists", CASES, ids=[c[0] for c in CASES]
)
def test_list_arguments_equal_array_arguments(
    name, cls, make, call, inputs, lists
):
    layer = make()
    expected = _numpy(call(layer, **inputs))
    listed = {k: v.tolist() if k in lists else v for k, v in inputs.items()}
    assert all(type(listed[k]) is list for k in lists)
    got = _numpy(call(layer, **listed))
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "value,error",
    [
        ([[True, False], [True]], ValueError),  # ragged
        ([["yes"] * T] * B, TypeError),  # strings
    ],
    ids=["ragged", "strings"],
)
@pytest.mark.parametrize(
    "name,call",
    [
        ("query_mask", lambda x, m: L.MultiHeadAttention(2, 4)(x, x, **m)),
        (
            "query_mask",
            lambda x, m: L.MultiHeadLatentAttention(2, 4, 2, 2, 3)(x, **m),
        ),
        ("mask", lambda x, m: L.MixtureOfExperts(4, 2, 8)(x, **m)),
        ("mask", lambda x, m: L.GatedDeltaNet(8, 1, 2, 4, 3)(x, **m)),
    ],
    ids=["mha", "mla", "moe", "gated-delta-net"],
)
def test_wrong_array_likes_are_refused_naming_the_argument(
    name, call, value, error
):
    with pytest.raises(error, match=f"`{name}`"):
        call(X, {name: value})
