"""keras-hub's `Gemma4Backbone` (text) converted (`interop.gemma4`), its
distinctive options on: KV sharing across layers (a sliding and a full
layer read earlier ones), K = V on the global layers (with fewer
key/value heads), two head sizes, sliding and full layers, the v-norm,
proportional partial RoPE on the full layers,
wider feed-forwards on the shared layers, both soft-caps, each block's
`layer_scalar` other than 1. Equal hidden
states with left and right padding, keras-hub's greedy tokens, cached
decoding equal to a full pass with each shared entry cached once, the
`.keras` reload keeping the sharing, one attention map per layer, and
the options that do not convert refused by name."""

import json

import hf_cases
import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from safetensors.numpy import save_file
from tiers import family_tier

import keras_attention
from keras_attention.generation import init_cache
from keras_attention.interop import causal_lm_generator
from keras_attention.interop import from_huggingface
from keras_attention.interop import from_keras_hub
from keras_attention.interop.hf import gemma4 as hf_gemma4
from keras_attention.interop.hf.weights import expected_shapes
from keras_attention.interop.huggingface import read_config

keras_hub = pytest.importorskip("keras_hub")
pytestmark = family_tier()

VOCAB, LENGTH = 20, 8
SLIDING, FULL = "sliding_attention", "full_attention"
# Layers 0 (sliding) and 1 (full) are the sources of layers 2 and 3.
LAYER_TYPES = [SLIDING, FULL, SLIDING, FULL]
# A right-padded row and a left-padded one.
PADDING = np.array([[1] * 5 + [0] * 3, [0] * 3 + [1] * 5], "int32")
PROMPTS = np.array([[5, 7, 9] + [0] * 5, [3, 4, 11, 12, 13] + [0] * 3])


def tiny(**kwargs):
    options = dict(
        vocabulary_size=VOCAB,
        image_size=None,
        num_layers=4,
        num_query_heads=4,
        num_key_value_heads=2,
        num_global_key_value_heads=1,  # and K = V on the full layers
        hidden_dim=16,
        intermediate_dim=16,
        head_dim=4,
        global_head_dim=8,
        global_rope_partial_rotary_factor=0.5,  # proportional RoPE
        layer_types=LAYER_TYPES,
        sliding_window_size=3,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        attention_logit_soft_cap=4.0,
        final_logit_soft_cap=3.0,
    )
    options.update(kwargs)
    return keras_hub.models.Gemma4Backbone(**options)


def perturbed(backbone):
    """Noise on every weight; each block's `layer_scalar` (its whole
    output's scale, 1 when built) drawn from [0.5, 1.5]."""
    rng = np.random.default_rng(7)
    for weight in backbone.weights:
        if weight.path.endswith("layer_scalar"):
            weight.assign(rng.uniform(0.5, 1.5))
            continue
        noise = rng.normal(scale=0.1, size=weight.shape).astype("float32")
        weight.assign(to_numpy(weight) + noise)
    return backbone


@pytest.fixture(scope="module")
def converted():
    keras.utils.set_random_seed(1)
    backbone = perturbed(tiny())
    return backbone, from_keras_hub(backbone)


def inputs(seed=0):
    tokens = np.random.default_rng(seed).integers(1, VOCAB, PADDING.shape)
    positions = np.broadcast_to(np.arange(LENGTH), PADDING.shape)
    return {
        "token_ids": (tokens * PADDING).astype("int32"),
        "padding_mask": PADDING,
        "position_ids": positions.astype("int32"),
    }


def test_hidden_states_equal_with_padding(converted):
    backbone, model = converted
    x = inputs()
    real = PADDING.astype(bool)
    error = np.abs(to_numpy(model(x))[real] - to_numpy(backbone(x))[real])
    assert error.max() <= 1e-5


def test_layers_share_keys_values_and_head_sizes(converted):
    _, model = converted
    attention = [
        model.get_layer(f"decoder_block_{i}").self_attention for i in range(4)
    ]
    assert [a.key_dim for a in attention] == [4, 8, 4, 8]
    assert [a.num_key_value_heads for a in attention] == [2, 1, 2, 1]
    assert [a.kv_share_role for a in attention] == [
        "source",
        "source",
        "reader",
        "reader",
    ]
    assert attention[2].kv_share is attention[0].kv_share
    assert attention[3].kv_share is attention[1].kv_share
    names = [{w.path.split("/")[-2] for w in a.weights} for a in attention]
    assert names[0] == {"query", "key", "value", "query_norm", "key_norm"} | {
        "attention_output"
    }
    assert "value" not in names[1]  # K = V: no value projection
    assert names[2] == names[3] == {"query", "query_norm", "attention_output"}


def test_cached_decoding_equals_a_full_pass(converted):
    """A prefill of 5 positions, then 3 steps of one token, over the
    blocks' caches give the logits of one full pass; the shared layers'
    caches are empty (each shared entry is cached once, in its source's)."""
    _, model = converted
    generator = causal_lm_generator(model, jit_compile=False)
    x = inputs(seed=4)
    mask = PADDING.astype(bool)
    table = model.get_layer("token_embedding")
    want = to_numpy(table(model(x), reverse=True))
    cache = init_cache(generator.blocks, 2, LENGTH)
    assert [len(keras.tree.flatten(c)) for c in cache] == [2, 2, 0, 0]
    tokens = x["token_ids"]
    got = []
    logits, _, cache = generator.call_with_cache(
        tokens[:, :5], cache, 0, padding_mask=mask[:, :5]
    )
    got.append(to_numpy(logits))
    for t in range(5, LENGTH):
        logits, _, cache = generator.call_with_cache(
            tokens[:, t : t + 1], cache, t, padding_mask=mask[:, t : t + 1]
        )
        got.append(to_numpy(logits))
    got = np.concatenate(got, axis=1)
    np.testing.assert_allclose(got[mask], want[mask], atol=2e-5)


@pytest.mark.slow(
    reason="keras-hub's and our generate loops take ~10 s on the 2-core "
    "machine; the fast tier checks cached decoding against a full pass"
)
def test_greedy_tokens_equal_keras_hub(converted):
    backbone, model = converted
    mask = PROMPTS != 0
    lm = keras_hub.models.Gemma4CausalLM(backbone=backbone, preprocessor=None)
    lm.compile(sampler="greedy")
    lm.run_eagerly = True  # no trace of their loop (a tiny model)
    # keras-hub 0.32's Gemma4CausalLM.generate needs a preprocessor: its
    # generate function, called directly.
    want = lm.make_generate_function()(
        {"token_ids": PROMPTS, "padding_mask": mask}
    )["token_ids"]
    ours = causal_lm_generator(model, jit_compile=False)
    got, _ = ours.generate(
        PROMPTS, max_length=LENGTH, sampler="greedy", padding_mask=mask
    )
    np.testing.assert_array_equal(to_numpy(got), to_numpy(want))


def test_attention_map_of_every_layer(converted):
    _, model = converted
    maps = keras_attention.visualization.collect_attention(model, inputs())
    assert len(maps) == 4
    for weights in maps.values():
        assert weights.shape == (2, 4, LENGTH, LENGTH)


def test_keras_reload_keeps_the_sharing(converted, tmp_path):
    _, model = converted
    path = str(tmp_path / "gemma4.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path, safe_mode=True)
    x = inputs(seed=2)
    np.testing.assert_allclose(
        to_numpy(reloaded(x)), to_numpy(model(x)), atol=1e-6
    )
    attention = [
        reloaded.get_layer(f"decoder_block_{i}").self_attention
        for i in range(4)
    ]
    assert attention[2].kv_share is attention[0].kv_share
    assert attention[3].kv_share is attention[1].kv_share
    assert attention[0].kv_share is not attention[1].kv_share


@pytest.mark.parametrize(
    "name, value",
    [
        ("hidden_size_per_layer_input", 4),
        ("enable_moe_block", True),
        ("use_bidirectional_attention", True),
        ("vision_encoder", {"class_name": "Gemma4VisionEncoder"}),
        ("num_kv_shared_layers", 4),
    ],
)
def test_unconverted_options_are_refused_by_name(
    converted, monkeypatch, name, value
):
    """The backbone's config with one option that does not convert (a
    keras-hub backbone built so would cost a second each)."""
    backbone, _ = converted
    config = dict(backbone.get_config(), **{name: value})
    monkeypatch.setattr(backbone, "get_config", lambda: config)
    with pytest.raises(ValueError, match=name):
        from_keras_hub(backbone)


def test_layer_scalars_scale_each_block_output(converted):
    """Each block's `layer_scalar` is copied into the `LayerScalar` after
    it, and it matters: with ours reset to 1 the hidden states move."""
    backbone, model = converted
    x = inputs(seed=3)
    real = PADDING.astype(bool)
    scales = [model.get_layer(f"layer_scalar_{i}") for i in range(4)]
    theirs = [
        float(to_numpy(backbone.get_layer(f"decoder_block_{i}").layer_scalar))
        for i in range(4)
    ]
    ours = [float(to_numpy(s.layer_scalar)[0]) for s in scales]
    assert ours == theirs and all(abs(v - 1) > 0.05 for v in ours)
    want = to_numpy(model(x))[real]
    try:
        for scale in scales:
            scale.layer_scalar.assign(np.ones(1, "float32"))
        unscaled = to_numpy(model(x))[real]
    finally:
        for scale, value in zip(scales, ours):
            scale.layer_scalar.assign(np.full(1, value, "float32"))
    assert np.abs(unscaled - want).max() > 1e-3


def test_a_checkpoint_layer_scalar_is_loaded(tmp_path):
    """`from_huggingface` (`gemma4_text`): each stored `layer_scalar`
    (shape `(1,)`) fills the `LayerScalar` after its block (random
    tensors of the expected shapes); the shared layers read no key/value
    projections, the K = V ones no value projection."""
    config = dict(hf_cases.CASES["gemma4_text"]["config"])
    config["model_type"] = "gemma4_text"
    (tmp_path / "config.json").write_text(json.dumps(config))
    conversion = hf_gemma4.convert_gemma4(read_config(str(tmp_path)), "float32")
    shapes = expected_shapes(
        conversion.model, conversion.table, conversion.num_layers
    )
    rng = np.random.default_rng(0)
    tensors = {
        name: rng.normal(size=shape).astype("float32")
        for name, shape in shapes.items()
    }
    scalars = [0.5, 1.25, 0.75, 2.0]
    for i, value in enumerate(scalars):
        assert shapes[f"model.layers.{i}.layer_scalar"] == (1,)
        tensors[f"model.layers.{i}.layer_scalar"] = np.full(1, value, "float32")
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = from_huggingface(str(tmp_path))
    got = [
        to_numpy(model.get_layer(f"layer_scalar_{i}").layer_scalar).tolist()
        for i in range(4)
    ]
    assert got == [[v] for v in scalars]
    assert "model.layers.2.self_attn.k_proj.weight" not in shapes  # shared
    assert "model.layers.1.self_attn.v_proj.weight" not in shapes  # K = V
