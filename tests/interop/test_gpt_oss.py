"""What the shared `from_keras_hub` and generation tests do not show for
gpt-oss (`GptOssBackbone`): its window and its YaRN each matter to the
outputs they compare (keras-hub without them computes other ones), the
windowed layers are the odd ones and the generator keeps a mixed cache
for them; odd head sizes are refused. Backend-neutral."""

import keras
import pytest
from test_from_keras_hub import TOLERANCE
from test_from_keras_hub import as_dict
from test_from_keras_hub import make_inputs
from test_from_keras_hub import perturbed
from test_from_keras_hub import real_positions_error
from test_from_keras_hub import tiny
from tiers import family_tier

from keras_attention.generation import init_cache
from keras_attention.interop import causal_lm_generator
from keras_attention.interop import from_keras_hub

keras_hub = pytest.importorskip("keras_hub")
pytestmark = family_tier()

YARN = {
    "scaling_factor": 4.0,
    "rope_type": "yarn",
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "original_max_position_embeddings": 4096,
    "truncate": False,
}


@pytest.fixture(scope="module")
def scaled():
    """The tiny gpt-oss with YaRN (factor 4), perturbed, and ours."""
    keras.utils.set_random_seed(1)
    backbone = perturbed(tiny("gpt_oss", rope_scaling_factor=4.0))
    return backbone, from_keras_hub(backbone)


def error_of(backbone, model, inputs):
    return real_positions_error(
        as_dict(model(inputs)),
        as_dict(backbone(inputs)),
        inputs["padding_mask"],
    )


def test_yarn_and_the_window_are_converted_and_matter(scaled):
    backbone, model = scaled
    blocks = [model.get_layer(f"transformer_layer_{i}") for i in range(2)]
    assert [b.self_attention.rotary_scaling for b in blocks] == [YARN] * 2
    windows = [b.self_attention.cache_window() for b in blocks]
    assert windows == [None, 3]  # keras-hub: keys j >= i - 3, odd layers
    inputs = make_inputs(backbone)
    assert error_of(backbone, model, inputs) <= TOLERANCE
    # keras-hub without YaRN (a factor of 1: plain RoPE), or without the
    # window, computes other outputs (attributes read at call time).
    attention = [
        layer.self_attention_layer for layer in backbone.transformer_layers
    ]
    rotary = [layer.rotary_embedding_layer for layer in attention]
    for name, layers, value in (
        ("scaling_factor", rotary, 1.0),
        ("sliding_window", attention[1:], None),
    ):
        before = getattr(layers[0], name)
        for layer in layers:
            setattr(layer, name, value)
        try:
            assert error_of(backbone, model, inputs) > 1e-3, name
        finally:
            for layer in layers:
                setattr(layer, name, before)


def test_generator_keeps_a_mixed_cache(scaled):
    _, model = scaled
    generator = causal_lm_generator(model, jit_compile=False)
    # Block 0's full attention keeps every position, the windowed ones
    # a ring of slots (each block makes its own cache, issue 54).
    options = dict(generator._cache_options(None))
    caches = init_cache(generator.blocks, 1, 40, **options)
    assert "key_mask" in caches[0][0] and "slot_mask" in caches[1][0]
    slots = [cache[0]["keys_values"].shape[2] for cache in caches]
    assert slots[0] == 40 > slots[1]


def test_odd_head_size_is_refused():
    with pytest.raises(ValueError, match="head_dim=5"):
        from_keras_hub(tiny("gpt_oss", head_dim=5))
