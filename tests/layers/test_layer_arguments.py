"""Constructor arguments of every public layer and block (issue 23):

- NumPy integers are accepted wherever Python integers are, and stored as
  Python ints, so that `get_config` stays JSON-serializable (item 15);
  bools stay refused;
- NaN and infinities are refused where a finite number is meant (item
  10): `rotary_max_wavelength=nan` made every output NaN;
- a plain function is a valid initializer, as in Keras and keras-hub
  (item 14): cloning it for each sublayer crashed at build.
"""

import json

import keras
import numpy as np
import public_layers
import pytest
from keras import ops

from keras_attention import layers as ka
from keras_attention import masks
from keras_attention import scores
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock

RNG = np.random.default_rng(23)
X = RNG.normal(size=(2, 5, 8)).astype("float32")
C = RNG.normal(size=(2, 4, 6)).astype("float32")
IDS = np.array([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]], "int32")
H = RNG.normal(size=(2, 6)).astype("float32")


def _call(layer):
    """Calls `layer` on inputs of the shapes it takes; returns the first
    output."""
    if isinstance(layer, ka.TokenAndPositionEmbedding):
        out = layer(IDS)
    elif isinstance(layer, ka.EncoderBridge):
        out = layer(H, H)
    elif isinstance(layer, ka.ContrastiveLogits):
        out = layer(H, H[:1])
    elif isinstance(layer, ka.ConvolutionPaddingMask):
        out = layer(X, padding_mask=IDS != 0)
    elif isinstance(layer, ka.TokenPooling) and layer.position == "eos":
        out = layer(X, token_ids=IDS)
    elif isinstance(layer, ka.RotaryEmbedding):
        out = layer(X[:, :, None, :])
    elif isinstance(layer, ka.LightningIndexer):
        out = layer(X, use_causal_mask=False)  # every score finite
    elif isinstance(layer, ka.GroupQueryAttention):
        out = layer(X, X)  # Keras's contract: equal feature sizes
    elif isinstance(layer, ka.GraphAttention):
        out = layer(X, np.ones((2, 5, 5), bool))  # a dense adjacency
    elif isinstance(layer, (ka.SelfAttention, TransformerEncoderBlock)):
        out = layer(X)
    elif isinstance(layer, TransformerDecoderBlock):
        out = layer(X, C) if layer.cross_attention else layer(X)
    elif isinstance(
        layer,
        (
            ka.MultiHeadAttention,
            ka.Seq2SeqAttention,
            ka.AttentionRNNDecoder,
        ),
    ):
        out = layer(X, C)
    else:
        out = layer(X)
    return out[0] if isinstance(out, (tuple, list)) else out


def i64(n):
    return np.int64(n)


# (class, arguments with NumPy scalars, the same with Python ones).
NUMPY_SCALARS = [
    (
        ka.LightningIndexer,
        dict(
            num_heads=i64(2),
            head_dim=np.int32(4),
            top_k=i64(3),
            rope_head_dim=i64(2),
            rope_theta=np.float32(100.0),
            layer_norm_epsilon=np.float32(1e-5),
        ),
        dict(
            num_heads=2,
            head_dim=4,
            top_k=3,
            rope_head_dim=2,
            rope_theta=100.0,
            layer_norm_epsilon=float(np.float32(1e-5)),
        ),
    ),
    (
        ka.GatedDeltaNet,
        dict(
            hidden_size=i64(8),
            linear_num_key_heads=np.int32(1),
            linear_num_value_heads=i64(2),
            linear_key_head_dim=i64(4),
            linear_value_head_dim=np.int32(3),
            linear_conv_kernel_dim=i64(3),
            layer_norm_epsilon=np.float32(1e-5),
            chunk_size=i64(3),
        ),
        dict(
            hidden_size=8,
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            linear_key_head_dim=4,
            linear_value_head_dim=3,
            linear_conv_kernel_dim=3,
            layer_norm_epsilon=float(np.float32(1e-5)),
            chunk_size=3,
        ),
    ),
    (
        ka.KimiDeltaAttention,
        dict(
            hidden_size=i64(8),
            num_heads=np.int32(2),
            head_dim=i64(4),
            conv_kernel_size=i64(3),
            layer_norm_epsilon=np.float32(1e-5),
            chunk_size=i64(3),
        ),
        dict(
            hidden_size=8,
            num_heads=2,
            head_dim=4,
            conv_kernel_size=3,
            layer_norm_epsilon=float(np.float32(1e-5)),
            chunk_size=3,
        ),
    ),
    (
        ka.LinearAttention,
        dict(
            num_heads=i64(2),
            key_dim=np.int32(4),
            value_dim=i64(3),
            gate_logit_normalizer=np.float32(8.0),
            chunk_size=i64(3),
            norm_epsilon=np.float32(1e-5),
        ),
        dict(
            num_heads=2,
            key_dim=4,
            value_dim=3,
            gate_logit_normalizer=8.0,
            chunk_size=3,
            norm_epsilon=float(np.float32(1e-5)),
        ),
    ),
    (
        ka.MultiHeadLatentAttention,
        dict(
            num_heads=i64(2),
            kv_lora_rank=np.int32(4),
            qk_nope_head_dim=i64(2),
            qk_rope_head_dim=i64(2),
            v_head_dim=np.int32(3),
            q_lora_rank=i64(3),
            rope_theta=np.float32(100.0),
            rms_norm_eps=np.float32(1e-5),
            dropout=np.float32(0.25),
            seed=i64(3),
        ),
        dict(
            num_heads=2,
            kv_lora_rank=4,
            qk_nope_head_dim=2,
            qk_rope_head_dim=2,
            v_head_dim=3,
            q_lora_rank=3,
            rope_theta=100.0,
            rms_norm_eps=float(np.float32(1e-5)),
            dropout=0.25,
            seed=3,
        ),
    ),
    (
        ka.GroupQueryAttention,
        dict(
            head_dim=i64(4),
            num_query_heads=np.int32(2),
            num_key_value_heads=i64(1),
            sliding_window=i64(2),
            dropout=np.float32(0.25),
            seed=i64(3),
        ),
        dict(
            head_dim=4,
            num_query_heads=2,
            num_key_value_heads=1,
            sliding_window=2,
            dropout=0.25,
            seed=3,
        ),
    ),
    (
        ka.GraphAttention,
        dict(
            num_heads=i64(2),
            units_per_head=np.int32(3),
            dropout=np.float32(0.25),
            negative_slope=np.float32(0.25),
            seed=i64(1),
        ),
        dict(
            num_heads=2,
            units_per_head=3,
            dropout=0.25,
            negative_slope=0.25,
            seed=1,
        ),
    ),
    (
        ka.MultiHeadAttention,
        dict(
            num_heads=i64(2),
            key_dim=np.int32(4),
            value_dim=i64(3),
            num_key_value_heads=i64(1),
            sliding_window=i64(2),
            output_shape=i64(5),
            attention_axes=i64(1),
            dropout=np.float32(0.25),
            seed=i64(3),
            rotary_max_wavelength=i64(100),
        ),
        dict(
            num_heads=2,
            key_dim=4,
            value_dim=3,
            num_key_value_heads=1,
            sliding_window=2,
            output_shape=5,
            attention_axes=1,
            dropout=0.25,
            seed=3,
            rotary_max_wavelength=100,
        ),
    ),
    (
        ka.MultiHeadAttention,
        dict(num_heads=2, key_dim=4, output_shape=(i64(3), np.uint8(2))),
        dict(num_heads=2, key_dim=4, output_shape=(3, 2)),
    ),
    (
        ka.SelfAttention,
        dict(num_heads=i64(2), key_dim=i64(4), causal=np.bool_(True)),
        dict(num_heads=2, key_dim=4, causal=True),
    ),
    (
        ka.CausalSelfAttention,
        dict(num_heads=i64(2), key_dim=i64(4)),
        dict(num_heads=2, key_dim=4),
    ),
    (
        ka.CrossAttention,
        dict(num_heads=i64(2), key_dim=i64(4)),
        dict(num_heads=2, key_dim=4),
    ),
    (
        ka.DisentangledSelfAttention,
        dict(
            num_heads=i64(2),
            key_dim=i64(4),
            score_mod=scores.DisentangledRelativeBias(
                i64(8),
                bucket_size=np.int32(4),
                max_distance=i64(10),
                layer_norm_epsilon=np.float64(1e-7),
                name="relative",
            ),
        ),
        dict(
            num_heads=2,
            key_dim=4,
            score_mod=scores.DisentangledRelativeBias(
                8,
                bucket_size=4,
                max_distance=10,
                layer_norm_epsilon=1e-7,
                name="relative",
            ),
        ),
    ),
    (
        ka.LocalSelfAttention,
        dict(
            num_heads=i64(2),
            key_dim=i64(4),
            window_size=i64(2),
            block_size=i64(2),
            max_global_tokens=i64(1),
        ),
        dict(
            num_heads=2,
            key_dim=4,
            window_size=2,
            block_size=2,
            max_global_tokens=1,
        ),
    ),
    (
        ka.LocalSelfAttention,
        dict(num_heads=2, key_dim=4, window_size=[i64(2), np.int16(1)]),
        dict(num_heads=2, key_dim=4, window_size=(2, 1)),
    ),
    (
        ka.SharedKVSelfAttention,
        dict(
            num_heads=i64(2),
            key_dim=i64(4),
            causal=np.bool_(True),
            values_from_keys=np.bool_(True),
            value_norm="rms",
            proportional_rotary=np.bool_(True),
            rotary_max_wavelength=i64(100),
            rotary_fraction=np.float32(0.5),
        ),
        dict(
            num_heads=2,
            key_dim=4,
            causal=True,
            values_from_keys=True,
            value_norm="rms",
            proportional_rotary=True,
            rotary_max_wavelength=100,
            rotary_fraction=0.5,
        ),
    ),
    (
        ka.FeedForward,
        dict(intermediate_dim=i64(4), dropout=np.float64(0.5)),
        dict(intermediate_dim=4, dropout=0.5),
    ),
    (
        ka.MixtureOfExperts,
        dict(
            num_experts=i64(4),
            top_k=np.int32(2),
            intermediate_dim=i64(6),
            normalize_top_k=np.bool_(True),
            glu_alpha=np.float32(1.5),
            router_aux_loss_coef=np.float64(0.5),
            router_jitter_noise=np.float64(0.25),
            seed=np.uint32(3),
        ),
        dict(
            num_experts=4,
            top_k=2,
            intermediate_dim=6,
            normalize_top_k=True,
            glu_alpha=1.5,
            router_aux_loss_coef=0.5,
            router_jitter_noise=0.25,
            seed=3,
        ),
    ),
    (ka.AttentionPooling, dict(units=i64(3)), dict(units=3)),
    (
        ka.TokenPooling,
        dict(position="eos", eos_token_id=i64(2)),
        dict(position="eos", eos_token_id=2),
    ),
    (
        ka.ContrastiveLogits,
        dict(
            logit_scale=np.float32(0.5),
            use_bias=np.bool_(True),
            logit_bias=np.float64(-1.0),
        ),
        dict(logit_scale=0.5, use_bias=True, logit_bias=-1.0),
    ),
    (
        ka.BahdanauAttention,
        dict(units=i64(3), seed=np.uint32(4)),
        dict(units=3, seed=4),
    ),
    (
        ka.LuongAttention,
        dict(score_mode="concat", units=i64(3), scale=np.bool_(True)),
        dict(score_mode="concat", units=3, scale=True),
    ),
    (
        ka.LuongAttention,
        dict(alignment="local-m", window=i64(1)),
        dict(alignment="local-m", window=1),
    ),
    (
        ka.AttentionRNNDecoder,
        dict(
            units=i64(4),
            attention=ka.BahdanauAttention(3, name="a"),
            seed=i64(1),
        ),
        dict(units=4, attention=ka.BahdanauAttention(3, name="a"), seed=1),
    ),
    (ka.EncoderBridge, dict(units=i64(3)), dict(units=3)),
    (
        ka.ConvolutionPaddingMask,
        dict(kernel_sizes=[i64(2), np.int32(1)], strides=(i64(1), i64(1))),
        dict(kernel_sizes=[2, 1], strides=[1, 1]),
    ),
    (
        ka.PositionEmbedding,
        dict(sequence_length=i64(6)),
        dict(sequence_length=6),
    ),
    (
        ka.TokenAndPositionEmbedding,
        dict(
            vocabulary_size=i64(10),
            sequence_length=i64(6),
            embedding_dim=i64(4),
        ),
        dict(vocabulary_size=10, sequence_length=6, embedding_dim=4),
    ),
    (
        ka.RotaryEmbedding,
        dict(max_wavelength=np.float32(100.0)),
        dict(max_wavelength=100.0),
    ),
    (
        ka.SinusoidalPositionEncoding,
        dict(max_wavelength=i64(100)),
        dict(max_wavelength=100),
    ),
    (
        TransformerEncoderBlock,
        dict(
            num_heads=i64(2),
            intermediate_dim=i64(8),
            key_dim=i64(2),
            num_key_value_heads=i64(1),
            layer_norm_epsilon=np.float32(0.5),
            window_size=i64(2),
            max_global_tokens=i64(1),
        ),
        dict(
            num_heads=2,
            intermediate_dim=8,
            key_dim=2,
            num_key_value_heads=1,
            layer_norm_epsilon=0.5,
            window_size=2,
            max_global_tokens=1,
        ),
    ),
    (
        TransformerDecoderBlock,
        dict(
            num_heads=i64(2),
            intermediate_dim=i64(8),
            window_size=(i64(1), i64(0)),
            rotary_max_wavelength=np.float64(50.0),
        ),
        dict(
            num_heads=2,
            intermediate_dim=8,
            window_size=(1, 0),
            rotary_max_wavelength=50.0,
        ),
    ),
]


def _config_json(layer):
    config = dict(layer.get_config())
    config.pop("name")
    return json.dumps(config, sort_keys=True)


@pytest.mark.parametrize(
    "cls,numpy_kwargs,python_kwargs",
    NUMPY_SCALARS,
    ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(NUMPY_SCALARS)],
)
def test_numpy_scalars_are_accepted_and_stored_as_python(
    cls, numpy_kwargs, python_kwargs
):
    layer = cls(**numpy_kwargs)
    # JSON-serializable (np.int64 is not), and the config of Python values.
    assert _config_json(layer) == _config_json(cls(**python_kwargs))
    again = cls.from_config(layer.get_config())
    assert _config_json(again) == _config_json(layer)
    assert np.all(np.isfinite(ops.convert_to_numpy(_call(layer))))


def test_numpy_window_size_in_masks():
    expected = ops.convert_to_numpy(masks.sliding_window_mask(4, 2))
    for window in (i64(2), (np.int32(2), i64(2)), [2, np.uint8(2)]):
        got = masks.sliding_window_mask(i64(4), window)
        np.testing.assert_array_equal(ops.convert_to_numpy(got), expected)
    assert masks.window_bounds(i64(3)) == (3, 3)
    assert type(masks.window_bounds((i64(3), 1))[0]) is int


@pytest.mark.parametrize(
    "cls,kwargs,name",
    [
        (ka.MultiHeadAttention, dict(num_heads=True, key_dim=4), "num_heads"),
        (
            ka.MultiHeadAttention,
            dict(num_heads=np.bool_(1), key_dim=4),
            "num_heads",
        ),
        (
            ka.LocalSelfAttention,
            dict(num_heads=2, key_dim=4, window_size=True),
            "window_size",
        ),
        (
            ka.FeedForward,
            dict(intermediate_dim=np.float32(4)),
            "intermediate_dim",
        ),
        (
            ka.MixtureOfExperts,
            dict(num_experts=4, top_k=True, intermediate_dim=6),
            "top_k",
        ),
        (
            ka.MultiHeadAttention,
            dict(num_heads=2, key_dim=4, seed=True),
            "seed",
        ),
        (ka.MultiHeadAttention, dict(num_heads=2, key_dim=4, seed=1.5), "seed"),
    ],
)
def test_bools_and_floats_are_still_refused_as_integers(cls, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`.*Received: {name}="):
        cls(**kwargs)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "cls,kwargs,name",
    [
        (ka.RotaryEmbedding, dict(max_wavelength=NAN), "max_wavelength"),
        (ka.RotaryEmbedding, dict(max_wavelength=INF), "max_wavelength"),
        (
            ka.RotaryEmbedding,
            dict(max_wavelength=np.float32(NAN)),
            "max_wavelength",
        ),
        (ka.RotaryEmbedding, dict(max_wavelength=1e-300), "max_wavelength"),
        (ka.RotaryEmbedding, dict(max_wavelength=0.5), "max_wavelength"),
        (ka.RotaryEmbedding, dict(max_wavelength=10**400), "max_wavelength"),
        (
            ka.SinusoidalPositionEncoding,
            dict(max_wavelength=NAN),
            "max_wavelength",
        ),
        (
            ka.SinusoidalPositionEncoding,
            dict(max_wavelength=-INF),
            "max_wavelength",
        ),
        (
            ka.SinusoidalPositionEncoding,
            dict(max_wavelength=1e-300),
            "max_wavelength",
        ),
        (
            ka.MultiHeadAttention,
            dict(num_heads=2, key_dim=4, rotary_max_wavelength=NAN),
            "rotary_max_wavelength",
        ),
        (
            ka.SelfAttention,
            dict(num_heads=2, key_dim=4, rotary_max_wavelength=INF),
            "rotary_max_wavelength",
        ),
        (
            TransformerEncoderBlock,
            dict(num_heads=2, intermediate_dim=8, layer_norm_epsilon=NAN),
            "layer_norm_epsilon",
        ),
        (
            TransformerDecoderBlock,
            dict(num_heads=2, intermediate_dim=8, layer_norm_epsilon=INF),
            "layer_norm_epsilon",
        ),
        (
            TransformerEncoderBlock,
            dict(num_heads=2, intermediate_dim=8, rotary_max_wavelength=NAN),
            "rotary_max_wavelength",
        ),
        (ka.FeedForward, dict(intermediate_dim=4, dropout=NAN), "dropout"),
        (
            ka.GatedDeltaNet,
            dict(
                hidden_size=8,
                linear_num_key_heads=1,
                linear_num_value_heads=2,
                linear_key_head_dim=4,
                linear_value_head_dim=3,
                layer_norm_epsilon=NAN,
            ),
            "layer_norm_epsilon",
        ),
        (
            ka.MixtureOfExperts,
            dict(num_experts=4, top_k=2, intermediate_dim=6, glu_limit=INF),
            "glu_limit",
        ),
        (
            ka.MixtureOfExperts,
            dict(
                num_experts=4,
                top_k=2,
                intermediate_dim=6,
                router_aux_loss_coef=NAN,
            ),
            "router_aux_loss_coef",
        ),
        (
            ka.MultiHeadLatentAttention,
            dict(
                num_heads=2,
                kv_lora_rank=4,
                qk_nope_head_dim=2,
                qk_rope_head_dim=2,
                v_head_dim=2,
                rope_theta=INF,
            ),
            "rope_theta",
        ),
        (
            ka.BahdanauAttention,
            dict(units=4, dropout=np.float32(NAN)),
            "dropout",
        ),
    ],
)
def test_non_finite_numbers_are_refused(cls, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`.*Received: {name}="):
        cls(**kwargs)


@keras.saving.register_keras_serializable(package="test_arguments")
def halves(shape, dtype=None):
    """A plain function initializer (no `Initializer` class, no config)."""
    return ops.full(shape, 0.5, dtype=dtype)


INITIALIZED = [
    (
        ka.LightningIndexer,
        dict(num_heads=2, head_dim=4, top_k=3),
        "kernel_initializer",
    ),
    (
        ka.GatedDeltaNet,
        dict(
            hidden_size=8,
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            linear_key_head_dim=4,
            linear_value_head_dim=3,
        ),
        "kernel_initializer",
    ),
    (
        ka.KimiDeltaAttention,
        dict(hidden_size=8, num_heads=2, head_dim=4),
        "kernel_initializer",
    ),
    (ka.LinearAttention, dict(num_heads=2, key_dim=4), "kernel_initializer"),
    (
        ka.MultiHeadLatentAttention,
        dict(
            num_heads=2,
            kv_lora_rank=4,
            qk_nope_head_dim=2,
            qk_rope_head_dim=2,
            v_head_dim=2,
        ),
        "kernel_initializer",
    ),
    (
        ka.GroupQueryAttention,
        dict(head_dim=4, num_query_heads=2, num_key_value_heads=1),
        "kernel_initializer",
    ),
    (
        ka.GraphAttention,
        dict(num_heads=2, units_per_head=3),
        "kernel_initializer",
    ),
    (
        ka.CausalSelfAttention,
        dict(num_heads=2, key_dim=4),
        "kernel_initializer",
    ),
    (ka.MultiHeadAttention, dict(num_heads=2, key_dim=4), "kernel_initializer"),
    (ka.MultiHeadAttention, dict(num_heads=2, key_dim=4), "bias_initializer"),
    (ka.SelfAttention, dict(num_heads=2, key_dim=4), "kernel_initializer"),
    (ka.CrossAttention, dict(num_heads=2, key_dim=4), "kernel_initializer"),
    (
        ka.DisentangledSelfAttention,
        dict(
            num_heads=2,
            key_dim=4,
            score_mod=scores.DisentangledRelativeBias(8, bucket_size=4),
        ),
        "kernel_initializer",
    ),
    (
        ka.LocalSelfAttention,
        dict(num_heads=2, key_dim=4, window_size=1),
        "kernel_initializer",
    ),
    (
        ka.SharedKVSelfAttention,
        dict(
            num_heads=2,
            key_dim=4,
            kv_share=ka.KVShare("shared"),
            kv_share_role="source",
            value_norm="rms",
        ),
        "kernel_initializer",
    ),
    (ka.FeedForward, dict(intermediate_dim=4), "kernel_initializer"),
    (ka.FeedForward, dict(intermediate_dim=4), "bias_initializer"),
    (
        ka.MixtureOfExperts,
        dict(num_experts=4, top_k=2, intermediate_dim=6),
        "kernel_initializer",
    ),
    (
        ka.MixtureOfExperts,
        dict(num_experts=4, top_k=2, intermediate_dim=6, expert_bias=True),
        "bias_initializer",
    ),
    (ka.AttentionPooling, dict(units=3), "kernel_initializer"),
    (ka.AttentionPooling, dict(units=3), "bias_initializer"),
    (ka.BahdanauAttention, dict(units=3), "kernel_initializer"),
    (ka.BahdanauAttention, dict(units=3), "bias_initializer"),
    (
        ka.LuongAttention,
        dict(score_mode="concat", units=3),
        "kernel_initializer",
    ),
    (
        ka.AttentionRNNDecoder,
        dict(
            units=4, attention=ka.BahdanauAttention(3), attention_style="luong"
        ),
        "kernel_initializer",
    ),
    (ka.EncoderBridge, dict(units=3), "kernel_initializer"),
    (ka.EncoderBridge, dict(units=3), "bias_initializer"),
    (ka.PositionEmbedding, dict(sequence_length=6), "initializer"),
    (
        ka.TokenAndPositionEmbedding,
        dict(vocabulary_size=10, sequence_length=6, embedding_dim=4),
        "embeddings_initializer",
    ),
    (
        TransformerEncoderBlock,
        dict(num_heads=2, intermediate_dim=8),
        "kernel_initializer",
    ),
    (
        TransformerEncoderBlock,
        dict(num_heads=2, intermediate_dim=8),
        "bias_initializer",
    ),
    (
        TransformerDecoderBlock,
        dict(num_heads=2, intermediate_dim=8),
        "kernel_initializer",
    ),
]


@pytest.mark.parametrize(
    "cls,kwargs,argument",
    INITIALIZED,
    ids=[f"{c.__name__}-{a}" for c, _, a in INITIALIZED],
)
def test_plain_function_initializer(cls, kwargs, argument):
    layer = cls(**kwargs, **{argument: halves})
    _call(layer)
    # Some weight of the layer comes from the function (kernels, biases,
    # embedding tables): every one of its values is 0.5.
    from_fn = [
        w
        for w in layer.weights
        if np.all(ops.convert_to_numpy(w) == 0.5) and np.size(w) > 1
    ]
    assert from_fn, [w.path for w in layer.weights]
    again = cls.from_config(layer.get_config())
    assert _config_json(again) == _config_json(layer)


# Layers with no initializer argument (no weights, or fixed tables).
WITHOUT_INITIALIZERS = {
    "RotaryEmbedding",
    "SinusoidalPositionEncoding",
    "TokenPooling",  # no weights
    "ConvolutionPaddingMask",  # no weights
    "ContrastiveLogits",  # scalars initialised from its arguments
}


def test_every_public_layer_and_block_has_cases():
    scalars = {cls.__name__ for cls, _, _ in NUMPY_SCALARS}
    assert not public_layers.missing(scalars)
    initialized = {cls.__name__ for cls, _, _ in INITIALIZED}
    assert not public_layers.missing(initialized | WITHOUT_INITIALIZERS)
