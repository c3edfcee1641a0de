"""`keras_attention.interop.from_keras_hub` on tiny random keras-hub
backbones (no downloads; the configs of keras-hub's own tests, smaller):
equal outputs at the real positions with padding, weights copied, `.keras`
round trip with `safe_mode=True`, errors. Backend-neutral."""

import os

import harness
import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier

import keras_attention
from keras_attention.interop import from_keras_hub

keras_hub = pytest.importorskip("keras_hub")
pytestmark = family_tier()

VOCAB, LENGTH, BATCH = 20, 8, 2
# Padding masks: a right-padded row, and a full row (BERT pools the first
# token, which must be real) or a left-padded one (the causal models).
PADDING = {
    "bert": [[1] * 5 + [0] * 3, [1] * 8],
    "causal": [[1] * 5 + [0] * 3, [0] * 3 + [1] * 5],
}
HEADS = 4
TOLERANCE = 1e-5


def tiny(name, **kwargs):
    common = dict(
        vocabulary_size=VOCAB, num_layers=2, hidden_dim=16, intermediate_dim=16
    )
    models = keras_hub.models
    if name in ("bert", "gpt2"):
        cls = models.BertBackbone if name == "bert" else models.GPT2Backbone
        return cls(
            num_heads=HEADS, max_sequence_length=LENGTH, **common, **kwargs
        )
    llama_style = dict(num_query_heads=HEADS, num_key_value_heads=2, **common)
    if name == "llama":
        return models.LlamaBackbone(**llama_style, **kwargs)
    if name == "llama3":  # a subclass of LlamaBackbone
        return models.Llama3Backbone(**llama_style, **kwargs)
    if name == "mistral":
        # A window shorter than the inputs; heads of 6 (not 16 // 4).
        return models.MistralBackbone(
            sliding_window=3, head_dim=6, **llama_style, **kwargs
        )
    if name == "gemma":
        gemma = dict(llama_style, intermediate_dim=32)
        return models.GemmaBackbone(head_dim=6, **gemma, **kwargs)
    if name == "gemma2":
        # Soft-capping that bites (scores reach a few units), a window
        # shorter than the inputs on layers 0, 2, ..., post-norms.
        gemma2 = dict(
            llama_style,
            intermediate_dim=32,
            num_layers=3,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            attention_logit_soft_cap=1.0,
            final_logit_soft_cap=30.0,
            use_sliding_window_attention=True,
            sliding_window_size=3,
        )
        return models.GemmaBackbone(head_dim=6, **gemma2, **kwargs)
    if name == "gemma2_27b":
        # Queries scaled by (hidden / heads) ** -0.5 = 1/2, not
        # head_dim ** -0.5 (`attention_scale`). keras-hub 0.32's decoder
        # block builds its attention with `query_head_dim_normalize=True`
        # whatever the backbone's argument: set it on the layers, as a
        # keras-hub that passes it on would.
        gemma = dict(llama_style, intermediate_dim=32)
        backbone = models.GemmaBackbone(
            head_dim=6, query_head_dim_normalize=False, **gemma, **kwargs
        )
        for layer in backbone.transformer_layers:
            layer.attention.query_head_dim_normalize = False
        return backbone
    if name == "phi3":
        # LongRoPE ("su") with a pretraining length (4) below the inputs'
        # (8): the long factors and the attention factor apply.
        return models.Phi3Backbone(
            rope_scaling_type="su",
            rope_scaling_short_factor=[1.0, 1.3],
            rope_scaling_long_factor=[1.5, 4.0],
            max_sequence_length=32,
            pretraining_sequence_length=4,
            **llama_style,
            **kwargs,
        )
    if name == "gemma3":
        # Five windowed layers (window 3 < the inputs) and a global one,
        # their own RoPE wavelengths and scalings, QK-norm, post-norms.
        gemma3 = dict(llama_style, intermediate_dim=32, num_layers=6)
        return models.Gemma3Backbone(
            head_dim=6,
            image_size=None,
            vision_encoder=None,
            use_sliding_window_attention=True,
            sliding_window_size=3,
            global_rope_scaling_factor=2.0,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            **gemma3,
            **kwargs,
        )
    if name == "qwen3":
        # QK-norm; heads of 6; on TensorFlow a window shorter than the
        # inputs. keras-hub 0.32's Qwen3Attention drops its window where
        # Keras has a fused attention op (JAX, PyTorch): no window there.
        window = 3 if keras.backend.backend() == "tensorflow" else None
        return models.Qwen3Backbone(
            head_dim=6, sliding_window_size=window, **llama_style, **kwargs
        )
    moe = dict(num_experts=4, top_k=2)
    if name == "mixtral":  # a window shorter than the inputs
        return models.MixtralBackbone(
            sliding_window=3, **moe, **llama_style, **kwargs
        )
    if name == "qwen3_moe":
        # QK-norm, heads of 6; a dense layer 0 (`mlp_only_layers`) and
        # an MoE layer 1; on TensorFlow only a window (as "qwen3").
        window = 3 if keras.backend.backend() == "tensorflow" else None
        arguments = dict(
            head_dim=6,
            moe_intermediate_dim=8,
            sliding_window_size=window,
            mlp_only_layers=[0],
        )
        arguments.update(kwargs)
        return models.Qwen3MoeBackbone(**arguments, **moe, **llama_style)
    if name == "smollm3":
        # RoPE on layers 0-2, none on layer 3 (SmolLM3's "NoPE" layers).
        arguments = dict(
            vocabulary_size=VOCAB,
            hidden_dim=16,
            intermediate_dim=16,
            num_layers=4,
            num_attention_heads=HEADS,
            num_key_value_heads=2,
            attention_bias=False,
            attention_dropout=0.0,
            rope_layer_enabled_list=[True, True, True, False],
            layer_types=["attention"] * 4,
            mlp_bias=False,
            layer_norm_epsilon=1e-6,
            max_position_embeddings=32,
            rope_theta=10000.0,
            partial_rotary_factor=1.0,
        )
        arguments.update(kwargs)
        return models.SmolLM3Backbone(**arguments)
    if name == "gpt_oss":
        # Learned sinks; full attention on layer 0, a window of 3 (< the
        # inputs) on layer 1; heads of 6; experts with biases.
        arguments = dict(head_dim=6, sliding_window=3, num_experts=4, top_k=2)
        arguments.update(kwargs)
        return models.GptOssBackbone(**arguments, **llama_style)
    if name == "qwen3_5":
        # Gated delta net layers 0 and 2 (value heads 4, of 3; key heads
        # 2, of 4), gated attention layers 1 and 3 (QK-norm, heads of 8,
        # half of each rotated); on TensorFlow a window shorter than the
        # inputs (keras-hub 0.32 drops it where Keras has a fused
        # attention op, JAX and PyTorch).
        window = 3 if keras.backend.backend() == "tensorflow" else None
        arguments = dict(
            head_dim=8,
            partial_rotary_factor=0.5,
            sliding_window_size=window,
            layer_types=["linear_attention", "full_attention"] * 2,
            linear_num_key_heads=2,
            linear_num_value_heads=HEADS,
            linear_key_head_dim=4,
            linear_value_head_dim=3,
            num_layers=4,
        )
        arguments.update(kwargs)
        return models.Qwen3_5Backbone(**dict(llama_style, **arguments))
    if name == "bloom":  # ALiBi slopes of 4 heads
        return models.BloomBackbone(num_heads=HEADS, **common, **kwargs)
    raise ValueError(name)


def perturbed(backbone):
    """`backbone` with noise on every weight: the norms' initial ones and
    zeros (and Gemma's zero scales) would hide a swapped or untransformed
    weight."""
    rng = np.random.default_rng(7)
    for weight in backbone.weights:
        if weight.path.endswith("inv_freq"):
            continue  # SmolLM3's RoPE frequencies (of `rope_theta`)
        noise = rng.normal(scale=0.1, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)
    return backbone


FAMILIES = (
    "bert",
    "gpt2",
    "llama",
    "llama3",
    "mistral",
    "gemma",
    "gemma2",
    "gemma2_27b",
    "bloom",
    "qwen3",
    "gemma3",
    "phi3",
    "gpt_oss",
    "smollm3",
    "mixtral",
    "qwen3_moe",
    "qwen3_5",
)


def family(backbone):
    return "bert" if "segment_ids" in backbone.input else "causal"


def make_inputs(backbone, seed=0):
    rng = np.random.default_rng(seed)
    padding = np.array(PADDING[family(backbone)], "int32")
    inputs = {
        "token_ids": rng.integers(1, VOCAB, (BATCH, LENGTH)).astype("int32")
        * padding,
        "padding_mask": padding,
    }
    if "segment_ids" in backbone.input:
        inputs["segment_ids"] = (
            rng.integers(0, 2, (BATCH, LENGTH)).astype("int32") * padding
        )
    return inputs


def as_dict(outputs):
    if isinstance(outputs, dict):
        return {k: to_numpy(v) for k, v in outputs.items()}
    return {"sequence_output": to_numpy(outputs)}


def real_positions_error(ours, theirs, padding):
    """Largest absolute difference over the real (not padded) positions."""
    errors = []
    real = padding.astype(bool)
    for key, value in theirs.items():
        if key == "sequence_output":
            errors.append(np.abs(ours[key][real] - value[real]).max())
        else:
            errors.append(np.abs(ours[key] - value).max())
    return max(errors)


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request):
    keras.utils.set_random_seed(1)
    backbone = perturbed(tiny(request.param))
    return backbone, from_keras_hub(backbone)


def test_same_inputs_and_outputs(converted):
    backbone, model = converted
    assert sorted(model.input) == sorted(backbone.input)
    theirs = backbone.output
    ours = model.output
    if isinstance(theirs, dict):
        assert sorted(ours) == sorted(theirs)
    else:
        assert not isinstance(ours, dict)


def test_equal_outputs_with_padding(converted):
    backbone, model = converted
    inputs = make_inputs(backbone)
    theirs = as_dict(backbone(inputs))
    ours = as_dict(model(inputs))
    error = real_positions_error(ours, theirs, inputs["padding_mask"])
    assert error <= TOLERANCE
    for value in ours.values():
        assert np.isfinite(value).all()  # padded positions included


def test_weights_are_copied_not_shared(converted):
    backbone, model = converted
    theirs = {id(w) for w in backbone.weights}
    assert not theirs & {id(w) for w in model.weights}
    # SmolLM3's stored RoPE inverse frequencies: computed by our blocks.
    recomputed = [w for w in backbone.weights if w.path.endswith("inv_freq")]
    # Mixtral's up kernels are concatenated into our gate_up kernels.
    up = "expert_feedforward_intermediate_dense"
    merged = [w for w in backbone.weights if w.path.endswith(up)]
    # Qwen 3.5's query kernels hold our query and gate kernels.
    gates = [w for w in model.weights if w.path.endswith("/gate/kernel")]
    assert len(model.weights) == (
        len(backbone.weights) - len(merged) - len(recomputed) + len(gates)
    )
    # Changing ours leaves theirs as it was.
    block = next(layer for layer in model.layers if hasattr(layer, "causal"))
    weight = block.self_attention.weights[0]
    before = to_numpy(backbone.weights[5])
    weight.assign(weight + 1.0)
    try:
        np.testing.assert_array_equal(to_numpy(backbone.weights[5]), before)
    finally:
        weight.assign(weight - 1.0)


def test_attention_weights_of_every_layer(converted):
    backbone, model = converted
    inputs = make_inputs(backbone)
    maps = keras_attention.visualization.collect_attention(model, inputs)
    assert len(maps) == len(
        [layer for layer in model.layers if hasattr(layer, "causal")]
    )  # one per layer
    for weights in maps.values():
        assert weights.shape[:3] == (BATCH, HEADS, LENGTH)


def test_keras_round_trip_safe_mode(converted, tmp_path):
    backbone, model = converted
    inputs = make_inputs(backbone, seed=3)
    path = str(tmp_path / "converted.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    expected, got = as_dict(model(inputs)), as_dict(reloaded(inputs))
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], atol=1e-6)


def test_unsupported_backbone_lists_the_supported_ones():
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    other = keras_hub.models.Backbone(
        inputs=ids, outputs=keras.layers.Embedding(4, 2)(ids)
    )
    names = ", ".join(keras_attention.interop.supported_backbones())
    with pytest.raises(ValueError, match=names):
        from_keras_hub(other)


@pytest.mark.parametrize(
    "name, argument, value",
    [
        ("gemma", "use_post_ffw_norm", True),  # without the attention's
        ("smollm3", "attention_bias", True),
        ("smollm3", "mlp_bias", True),
    ],
)
def test_unconverted_options_are_refused_by_name(name, argument, value):
    with pytest.raises(ValueError, match=argument):
        from_keras_hub(tiny(name, **{argument: value}))


# Llama 3.1's frequency adjustment over a pretraining length of 8: with
# heads of 4 (two frequencies, wavelengths 6.3 and 628), one wavelength is
# interpolated and the other scaled.
LLAMA31_ROPE = dict(
    rope_frequency_adjustment_factor=8.0,
    rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0,
    rope_pretraining_sequence_length=8,
)


@pytest.mark.parametrize(
    "name, arguments, rotary_scaling",
    [
        ("mistral", {"rope_scaling_factor": 4.0}, {"scaling_factor": 4.0}),
        (
            "llama3",
            LLAMA31_ROPE,
            {
                "rope_type": "llama3",
                "scaling_factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            },
        ),
        # keras-hub's Llama rotary embedding ignores it: no scaling.
        ("llama", {"rope_position_scaling_factor": 4.0}, None),
    ],
)
def test_rope_scaling_is_converted(name, arguments, rotary_scaling, tmp_path):
    keras.utils.set_random_seed(1)
    backbone = perturbed(tiny(name, **arguments))
    model = from_keras_hub(backbone)
    block = model.get_layer("transformer_layer_0")
    assert block.self_attention.rotary_scaling == rotary_scaling
    inputs = make_inputs(backbone)
    theirs = as_dict(backbone(inputs))
    ours = as_dict(model(inputs))
    assert real_positions_error(ours, theirs, inputs["padding_mask"]) <= (
        TOLERANCE
    )
    # The scaling matters: the unscaled backbone gives other outputs.
    plain = tiny(name)
    plain.set_weights(backbone.get_weights())
    changed = real_positions_error(
        as_dict(plain(inputs)), theirs, inputs["padding_mask"]
    )
    assert (changed > 1e-3) == (rotary_scaling is not None)
    path = str(tmp_path / "scaled.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(
        as_dict(reloaded(inputs))["sequence_output"],
        ours["sequence_output"],
        atol=1e-6,
    )


def test_partial_llama31_rope_arguments_are_refused():
    backbone = tiny("llama3", **LLAMA31_ROPE)
    backbone.rope_low_freq_factor = None  # keras-hub itself refuses it
    with pytest.raises(ValueError, match="rope_low_freq_factor"):
        keras_attention.interop.llama.llama_rotary_scaling(backbone)


def test_smollm3_nope_layers_have_no_rotary_positions():
    keras.utils.set_random_seed(1)
    backbone = perturbed(tiny("smollm3"))
    model = from_keras_hub(backbone)
    wavelengths = [
        model.get_layer(
            f"transformer_layer_{i}"
        ).self_attention.rotary_max_wavelength
        for i in range(4)
    ]
    assert wavelengths == [10000.0] * 3 + [None]
    # The NoPE layer matters: with RoPE there too, keras-hub computes
    # other outputs.
    inputs = make_inputs(backbone)
    roped = tiny("smollm3", rope_layer_enabled_list=[True] * 4)
    roped.set_weights(backbone.get_weights())
    theirs = as_dict(backbone(inputs))
    error = real_positions_error(
        as_dict(roped(inputs)), theirs, inputs["padding_mask"]
    )
    assert error > 1e-3
    # Stored inverse frequencies not those of `rope_theta` are refused.
    inv_freq = backbone.transformer_layers[0].self_attn.rotary_embedding
    inv_freq.inv_freq.assign(to_numpy(inv_freq.inv_freq) * 2.0)
    with pytest.raises(ValueError, match="inv_freq"):
        from_keras_hub(backbone)


def test_a_task_converts_its_backbone():
    backbone = perturbed(tiny("llama"))
    task = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    inputs = make_inputs(backbone)
    got = as_dict(from_keras_hub(task)(inputs))
    want = as_dict(backbone(inputs))
    assert real_positions_error(got, want, inputs["padding_mask"]) <= 1e-5


def test_not_a_backbone():
    with pytest.raises(TypeError, match="backbone"):
        from_keras_hub(keras.Sequential([keras.layers.Dense(2)]))


# Families whose converted graph holds no option another family's export
# does not (the slow tier, `SLOW=1`, exports them too): rotary
# grouped-query attention, gated feed-forwards, windows and Gemma's
# scalings (Gemma 2), QK-norm (Gemma 3), mixtures of experts beside dense
# layers (Mixtral, gpt-oss).
EXPORT_COVERED = {
    "llama": "gemma2",
    "llama3": "gemma2",
    "mistral": "gemma2",
    "gemma": "gemma2",
    "gemma2_27b": "gemma2",
    "qwen3": "gemma3",
    "qwen3_moe": "mixtral",
}
# Families exported in the slow tier only, and why.
EXPORT_SLOW = {
    "qwen3_5": "~14 s; its gated delta nets export in GatedDeltaNet's own "
    "slow-tier test and the fast tier reloads it from `.keras`",
}


@pytest.mark.tf_only("SavedModel export is the TensorFlow part's check")
def test_saved_model_export_serves_with_tensorflow_alone(converted, request):
    backbone, model = converted
    name = request.node.callspec.params["converted"]
    if name in EXPORT_COVERED and os.environ.get("SLOW") != "1":
        pytest.skip(
            f"slow tier (SLOW=1 runs it): the {EXPORT_COVERED[name]} "
            "export covers its options"
        )
    if name in EXPORT_SLOW and os.environ.get("SLOW") != "1":
        pytest.skip(f"slow tier (SLOW=1 runs it): {EXPORT_SLOW[name]}")
    data = make_inputs(backbone, seed=5)
    names = sorted(data)
    inputs = [keras.Input((None,), dtype="int32", name=n) for n in names]
    outputs = model(dict(zip(names, inputs)))
    if isinstance(outputs, dict):
        outputs = [outputs[k] for k in sorted(outputs)]
    wrapped = keras.Model(inputs, outputs)
    harness.check_saved_model(wrapped, [{n: data[n] for n in names}])


@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_bfloat16"])
def test_dtype_policy_is_kept(dtype):
    keras.utils.set_random_seed(1)
    backbone = tiny("llama", dtype=dtype)
    model = from_keras_hub(backbone)
    blocks = [layer for layer in model.layers if hasattr(layer, "causal")]
    assert {b.dtype_policy.name for b in blocks} == {dtype}
    inputs = make_inputs(backbone)
    ours = to_numpy(keras.ops.cast(model(inputs), "float32"))
    theirs = to_numpy(keras.ops.cast(backbone(inputs), "float32"))
    real = inputs["padding_mask"].astype(bool)
    # Within bfloat16 rounding (8 bits of mantissa) of outputs of about 3.
    assert np.abs(ours[real] - theirs[real]).max() <= 0.05
