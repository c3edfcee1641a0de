"""The decoder families of `from_keras_hub` converted in issue 55 (item 3):
Qwen (Qwen 2; `Qwen2Backbone` is the same class), Qwen-MoE, Qwen 3.5-MoE,
Falcon, GPT-NeoX and OPT. Each on a tiny random backbone with its
distinctive options on: outputs equal at the real positions with left
and right padding, one attention map per attention layer, the `.keras`
reload with `safe_mode=True`, and greedy tokens equal to keras-hub's
(its `CausalLM.generate`; GPT-NeoX and Qwen 3.5-MoE: greedy decoding
driven by its forward pass, as their `generate` differs from it); then
what each family has of its own. Backend-neutral; CI tiers in
tests/interop/tiers.py."""

import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from test_from_keras_hub import perturbed
from tiers import family_tier
from tiers import reload_tier

import keras_attention
from keras_attention.interop import causal_lm_generator
from keras_attention.interop import from_keras_hub

keras_hub = pytest.importorskip("keras_hub")

pytestmark = family_tier()

VOCAB, LENGTH, HEADS = 20, 8, 4
# A right-padded row and a left-padded one.
PADDING = np.array([[1] * 5 + [0] * 3, [0] * 3 + [1] * 5], "int32")
# Right-padded prompts of 3 and 5 tokens, completed to 10 (keras-hub's
# layout).
PROMPTS = np.array([[5, 7, 9] + [0] * 7, [3, 4, 11, 12, 13] + [0] * 5], "int32")
TOLERANCE = 1e-5


def tiny(name, **kwargs):
    models = keras_hub.models
    common = dict(
        vocabulary_size=VOCAB, num_layers=2, hidden_dim=16, intermediate_dim=16
    )
    if name == "opt":
        arguments = dict(num_heads=HEADS, max_sequence_length=16, **common)
        return models.OPTBackbone(**dict(arguments, **kwargs))
    if name == "qwen3_5_moe":
        # Gated delta net layer 0 (value heads 4, of 3; key heads 2, of
        # 4), gated attention layer 1 (QK-norm, half of each head of 8
        # rotated), experts and the gated shared expert on both; on
        # TensorFlow a window (3) shorter than the inputs (keras-hub 0.32
        # drops it where Keras has a fused attention op).
        window = 3 if keras.backend.backend() == "tensorflow" else None
        arguments = dict(
            head_dim=8,
            partial_rotary_factor=0.5,
            sliding_window_size=window,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=HEADS,
            linear_key_head_dim=4,
            linear_value_head_dim=3,
            moe_intermediate_dim=8,
            shared_expert_intermediate_size=12,
            num_experts=4,
            top_k=2,
            num_query_heads=HEADS,
            num_key_value_heads=2,
            vocabulary_size=VOCAB,
            num_layers=2,
            hidden_dim=16,
        )
        return models.Qwen3_5MoeBackbone(**dict(arguments, **kwargs))
    if name == "gpt_neox":  # parallel residual; 2 of 8 features rotated
        arguments = dict(
            num_heads=2,
            rotary_percentage=0.25,
            rotary_max_wavelength=100,
            **dict(common, intermediate_dim=32),
        )
        return models.GPTNeoXBackbone(**dict(arguments, **kwargs))
    if name == "falcon":  # ALiBi; a final norm epsilon of its own
        arguments = dict(
            num_attention_heads=HEADS, layer_norm_epsilon=1e-3, **common
        )
        return models.FalconBackbone(**dict(arguments, **kwargs))
    llama_style = dict(num_query_heads=HEADS, num_key_value_heads=2, **common)
    if name == "qwen":  # Qwen 2: q, k, v biases; RoPE scaling
        arguments = dict(rope_scaling_factor=2.0, **llama_style)
        return models.Qwen2Backbone(**dict(arguments, **kwargs))
    if name == "qwen_moe":  # experts and the gated shared expert
        arguments = dict(
            moe_intermediate_dim=8,
            shared_expert_intermediate_dim=12,
            num_experts=4,
            top_k=2,
            norm_top_k_prob=True,
            **llama_style,
        )
        return models.QwenMoeBackbone(**dict(arguments, **kwargs))
    raise ValueError(name)


# Families whose keras-hub `generate` is not greedy decoding of its own
# forward pass (the traps): compared with the latter.
FORWARD_GREEDY = ("qwen3_5_moe", "gpt_neox")
FAMILIES = ("qwen", "qwen_moe", "qwen3_5_moe", "falcon", "gpt_neox", "opt")


_CONVERTED = {}
# More noise where the tiny model's greedy tokens would repeat one token.
EXTRA_NOISE = {"gpt_neox": 0.3}


def convert(name):
    """`(name, backbone, converted model)` of family `name`, built and
    converted once per module."""
    if name not in _CONVERTED:
        keras.utils.set_random_seed(1)
        backbone = perturbed(tiny(name))
        rng = np.random.default_rng(8)
        for weight in backbone.weights if name in EXTRA_NOISE else ():
            noise = rng.normal(scale=EXTRA_NOISE[name], size=weight.shape)
            weight.assign(to_numpy(weight) + noise.astype("float32"))
        _CONVERTED[name] = (name, backbone, from_keras_hub(backbone))
    return _CONVERTED[name]


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request):
    return convert(request.param)


def make_inputs(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, PADDING.shape).astype("int32")
    return {"token_ids": ids * PADDING, "padding_mask": PADDING}


def real_error(ours, theirs):
    real = PADDING.astype(bool)
    return float(np.abs(to_numpy(ours) - to_numpy(theirs))[real].max())


def mixing_layers(model):
    """Each decoder block's self-attention (attention, or Qwen 3.5's
    gated delta nets, whose weights `collect_attention` also records)."""
    return [
        layer.self_attention
        for layer in model.layers
        if isinstance(layer, keras_attention.blocks.TransformerDecoderBlock)
    ]


def test_equal_outputs_with_left_and_right_padding(converted):
    _, backbone, model = converted
    inputs = make_inputs()
    ours = model(inputs)
    assert real_error(ours, backbone(inputs)) <= TOLERANCE
    assert np.isfinite(to_numpy(ours)).all()  # padded positions included


def test_one_attention_map_per_attention_layer(converted):
    _, _, model = converted
    maps = keras_attention.visualization.collect_attention(model, make_inputs())
    layers = mixing_layers(model)
    assert len(maps) == len(layers) >= 1
    for weights, layer in zip(maps.values(), layers):
        heads = getattr(layer, "num_heads", HEADS)  # gated delta: 4 too
        assert weights.shape == (2, heads, LENGTH, LENGTH)
        # Causal, and no weight on the left-padded row's padding.
        assert np.allclose(np.triu(weights, 1), 0.0)
        assert np.allclose(weights[1, :, 3:, :3], 0.0)


# Reloads whose layers another family's reload covers (slow tier).
RELOAD_COVERED = {
    "opt": "gpt2",
    "falcon": "bloom",
    "qwen": "qwen_moe",
    "qwen3_5_moe": "qwen3_5 and qwen_moe",
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            name,
            marks=[reload_tier(RELOAD_COVERED[name])]
            if name in RELOAD_COVERED
            else [],
        )
        for name in FAMILIES
    ],
)
def test_keras_reload_safe_mode(name, tmp_path):
    _, _, model = convert(name)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    inputs = make_inputs(seed=3)
    np.testing.assert_allclose(
        to_numpy(reloaded(inputs)), to_numpy(model(inputs)), atol=1e-6
    )


def forward_greedy(backbone, prompts, max_length):
    """Greedy decoding driven by keras-hub's forward pass: the backbone
    run on the growing right-padded buffer, the next token the argmax of
    the logits (the reverse embedding) at each row's last real one."""
    tokens = np.array(prompts)
    lengths = (tokens != 0).sum(-1)
    rows = np.arange(len(tokens))
    while lengths.min() < max_length:
        mask = np.arange(max_length)[None] < lengths[:, None]
        hidden = to_numpy(
            backbone({"token_ids": tokens * mask, "padding_mask": mask})
        )
        last = hidden[rows, lengths - 1]
        logits = to_numpy(backbone.token_embedding(last, reverse=True))
        grow = lengths < max_length
        tokens[rows[grow], lengths[grow]] = logits.argmax(-1)[grow]
        lengths = lengths + grow
    return tokens


def keras_hub_greedy(name, backbone):
    if name in FORWARD_GREEDY:
        return forward_greedy(backbone, PROMPTS, PROMPTS.shape[1])
    task = type(backbone).__name__.replace("Backbone", "CausalLM")
    causal_lm = getattr(keras_hub.models, task)(
        backbone=backbone, preprocessor=None
    )
    causal_lm.compile(sampler="greedy", jit_compile=False)
    inputs = {"token_ids": PROMPTS, "padding_mask": PROMPTS != 0}
    return to_numpy(
        causal_lm.generate(inputs, stop_token_ids=None)["token_ids"]
    )


def test_greedy_tokens_equal_keras_hub(converted):
    name, backbone, model = converted
    want = keras_hub_greedy(name, backbone)
    ours = causal_lm_generator(model, jit_compile=False)
    got, _ = ours.generate(
        PROMPTS,
        max_length=PROMPTS.shape[1],
        sampler="greedy",
        padding_mask=PROMPTS != 0,
    )
    np.testing.assert_array_equal(to_numpy(got), want)
    assert len(np.unique(want[:, 5:])) > 1  # not one token repeated


# --- GPT-NeoX ---------------------------------------------------------


def test_gpt_neox_parallel_residual_and_partial_rotary():
    """Parallel residual blocks rotating 2 of each head's 8 features; the
    sequential wiring or the whole head rotated give other outputs."""
    _, backbone, model = convert("gpt_neox")
    block = model.get_layer("transformer_layer_0")
    assert block.parallel_residual and block.norm_first
    assert block.self_attention.rotary_fraction == 0.25
    inputs = make_inputs()
    theirs = backbone(inputs)
    for changed in (
        dict(parallel_residual=False),
        dict(rotary_fraction=1.0),
    ):
        config = model.get_config()
        for layer in config["layers"]:
            if layer["class_name"] != "TransformerDecoderBlock":
                continue
            attention = layer["config"]["self_attention"]["config"]
            if "rotary_fraction" in changed:
                attention.pop("rotary_fraction", None)
            else:
                layer["config"].update(changed)
        other = keras.Model.from_config(config)
        other.set_weights(model.get_weights())
        assert real_error(other(inputs), theirs) > 1e-3, changed


def test_gpt_neox_keras_hub_cached_step_is_not_its_forward():
    """The trap: keras-hub's cached step (`GPTNeoXCausalLM.
    call_with_cache`, what its `generate` runs) rotates the step's query
    at position 0, so its logits differ from its forward pass's at that
    position; ours equal the forward pass's (the greedy test)."""
    _, backbone, model = convert("gpt_neox")
    causal_lm = keras_hub.models.GPTNeoXCausalLM(
        backbone=backbone, preprocessor=None
    )
    ids = PROMPTS[1:, :6]  # 5 real tokens, then the step's at 5
    _, cache = causal_lm._build_cache(ids[:, :5])
    cache = keras.ops.pad(cache, [(0, 0)] * 3 + [(0, 1)] + [(0, 0)] * 2)
    step, _, _ = causal_lm.call_with_cache(ids[:, 5:6], cache, 5)
    forward = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    want = to_numpy(backbone.token_embedding(forward[:, 5], reverse=True))
    assert np.abs(to_numpy(step)[:, 0] - want).max() > 1e-3
    ours = model.get_layer("token_embedding")(
        model({"token_ids": ids, "padding_mask": np.ones_like(ids)})[:, 5],
        reverse=True,
    )
    np.testing.assert_allclose(to_numpy(ours), want, atol=1e-4)


def test_gpt_neox_odd_rotated_features_are_refused():
    with pytest.raises(ValueError, match="rotary_percentage"):
        from_keras_hub(tiny("gpt_neox", rotary_percentage=0.375))


# --- OPT --------------------------------------------------------------


def test_opt_post_norm_layers_convert():
    """OPT-350m's post-norm layers: keras-hub's with
    `normalize_first=False` (its backbone builds them pre-norm)."""
    keras.utils.set_random_seed(1)
    backbone = perturbed(tiny("opt"))
    inputs = make_inputs()
    pre_norm = to_numpy(backbone(inputs))
    for layer in backbone.transformer_layers:
        layer.normalize_first = False
    theirs = backbone(inputs)
    assert real_error(theirs, pre_norm) > 1e-2  # it matters
    model = from_keras_hub(backbone)
    blocks = [model.get_layer(f"transformer_layer_{i}") for i in range(2)]
    assert [block.norm_first for block in blocks] == [False, False]
    assert real_error(model(inputs), theirs) <= TOLERANCE


# --- Qwen 2 -----------------------------------------------------------


def test_qwen_attention_biases_are_on_query_key_value_only():
    backbone = tiny("qwen")
    model = from_keras_hub(backbone)
    attention = model.get_layer("transformer_layer_0").self_attention
    assert attention.use_bias == "qkv"
    assert attention.rotary_scaling == {"scaling_factor": 2.0}
    names = sorted(w.path.split("/", 2)[2] for w in attention.weights)
    assert names == sorted(
        [
            f"{p}/{n}"
            for p in ("query", "key", "value")
            for n in ("kernel", "bias")
        ]
        + ["attention_output/kernel"]
    )
    assert keras_hub.models.Qwen2Backbone is keras_hub.models.QwenBackbone


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="keras-hub 0.32's Qwen applies its window only on TensorFlow "
    "(where Keras has no fused attention op)",
)
def test_qwen_sliding_window():
    """A window (3) shorter than the inputs: equal outputs (the window
    bites: without it keras-hub's differ). keras-hub's `generate` fails
    with the window on TensorFlow (its attention tests a traced
    `cache_update_index` as a Python bool); our rolling cache decodes
    windows as Mistral's (tests/interop/test_generation.py)."""
    keras.utils.set_random_seed(1)
    backbone = perturbed(
        tiny("qwen", use_sliding_window_attention=True, sliding_window_size=3)
    )
    model = from_keras_hub(backbone)
    attention = model.get_layer("transformer_layer_0").self_attention
    assert attention.cache_window() == 2
    inputs = make_inputs()
    theirs = backbone(inputs)
    assert real_error(model(inputs), theirs) <= TOLERANCE
    for layer in backbone.transformer_layers:
        layer._self_attention_layer.use_sliding_window_attention = False
    assert real_error(backbone(inputs), theirs) > 1e-3


# --- Qwen-MoE ---------------------------------------------------------


def test_qwen_moe_experts_shared_expert_and_training_loss():
    """Every layer sparse, with the gated shared expert; the
    load-balancing loss of a training call equal to keras-hub's, layer
    by layer (no padding: keras-hub counts right-padded tokens)."""
    _, backbone, model = convert("qwen_moe")
    for i in range(2):
        experts = model.get_layer(f"transformer_layer_{i}").feed_forward
        assert isinstance(experts, keras_attention.layers.MixtureOfExperts)
        assert (experts.num_experts, experts.top_k) == (4, 2)
        assert experts.intermediate_dim == 8 and experts.normalize_top_k
        assert (experts.shared_expert_dim, experts.shared_expert_gate) == (
            12,
            True,
        )
    inputs = make_inputs()
    inputs["padding_mask"] = np.ones_like(PADDING)
    backbone(inputs, training=True)
    model(inputs, training=True)
    theirs = [float(to_numpy(loss)) for loss in backbone.losses]
    ours = [float(to_numpy(loss)) for loss in model.losses]
    assert len(ours) == len(theirs) == 2
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_qwen_moe_dense_layers_and_window():
    """`mlp_only_layers=[0]`: keras-hub 0.32 builds every layer with
    `layer_index=0`, so all are dense; a window (3) shorter than the
    inputs, which keras-hub applies on every backend (on a CPU)."""
    keras.utils.set_random_seed(1)
    backbone = perturbed(
        tiny(
            "qwen_moe",
            mlp_only_layers=[0],
            use_sliding_window_attention=True,
            sliding_window_size=3,
        )
    )
    model = from_keras_hub(backbone)
    kinds = [
        type(model.get_layer(f"transformer_layer_{i}").feed_forward).__name__
        for i in range(2)
    ]
    assert kinds == ["FeedForward", "FeedForward"]
    assert (
        model.get_layer("transformer_layer_0").self_attention.cache_window()
        == 2
    )
    inputs = make_inputs()
    assert real_error(model(inputs), backbone(inputs)) <= TOLERANCE


# --- Qwen 3.5-MoE -----------------------------------------------------


def test_qwen3_5_moe_layer_kinds_experts_and_training_loss():
    """The layer kinds follow `layer_types`, each with its experts; the
    load-balancing loss of a training call equals keras-hub's, padding
    included (both leave padded tokens out)."""
    _, backbone, model = convert("qwen3_5_moe")
    blocks = [model.get_layer(f"transformer_layer_{i}") for i in range(2)]
    assert isinstance(
        blocks[0].self_attention, keras_attention.layers.GatedDeltaNet
    )
    attention = blocks[1].self_attention
    assert attention.use_gate and attention.rotary_fraction == 0.5
    for block in blocks:
        experts = block.feed_forward
        assert experts.normalize_top_k and experts.shared_expert_gate
        assert experts.shared_expert_dim == 12
    inputs = make_inputs()
    backbone(inputs, training=True)
    model(inputs, training=True)
    theirs = [float(to_numpy(loss)) for loss in backbone.losses]
    ours = [float(to_numpy(loss)) for loss in model.losses]
    assert len(ours) == len(theirs) == 2
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_qwen3_5_moe_vision_encoder_is_refused():
    backbone = tiny("qwen3_5_moe")
    backbone.vision_encoder = keras.layers.Dense(2)  # any layer
    with pytest.raises(ValueError, match="vision_encoder"):
        from_keras_hub(backbone)


# --- Falcon -----------------------------------------------------------


def test_falcon_alibi_slopes_are_scaled_by_the_head_size():
    """keras-hub adds its ALiBi biases before scaling the scores by
    `1 / sqrt(head_dim)`: the slopes are the paper's times that factor
    (here 1/2), and without it the outputs differ."""
    _, backbone, model = convert("falcon")
    block = model.get_layer("transformer_layer_0")
    alibi = block.self_attention.score_mod
    assert isinstance(alibi, keras_attention.scores.ALiBi)
    assert alibi.slope_scale == 0.5
    np.testing.assert_allclose(
        alibi.slopes,
        0.5 * np.array(keras_attention.scores.alibi_slopes(HEADS)),
        rtol=1e-6,
    )
    # keras-hub's decoder layers keep their own epsilon (1e-5), the
    # final norm has the backbone's (1e-3).
    assert block.layer_norm_epsilon == 1e-5
    assert model.get_layer("final_layernorm").epsilon == 1e-3
    alibi.slopes = alibi.slopes / 0.5
    try:
        inputs = make_inputs()
        assert real_error(model(inputs), backbone(inputs)) > 1e-4
    finally:
        alibi.slopes = alibi.slopes * 0.5


def test_falcon_unequal_dropout_rates_are_refused_by_name():
    backbone = tiny(
        "falcon", attention_dropout_rate=0.1, feedforward_dropout_rate=0.0
    )
    with pytest.raises(ValueError, match="feedforward_dropout_rate"):
        from_keras_hub(backbone)
