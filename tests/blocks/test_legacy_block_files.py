"""Block `.keras` files saved before issue 54 (blocks by composition) load.

`tests/data/legacy/make_block_files.py` saved them with the code of
commit 292214a, when a block built every sublayer from its own options
(`moe`, `mixer`, `mixer_options`, `latent_attention`, QK-norm, sinks,
...), with the inputs and outputs they gave. Loaded with the current code
in safe mode they must give the same outputs: the configs of that time
stay valid and the weight paths (`self_attention`, `feed_forward`,
`cross_attention_layer`, the norms) did not change.
"""

import os

import keras
import numpy as np
import pytest

import keras_attention  # noqa: F401  (registers the layers)

LEGACY = os.path.join(os.path.dirname(__file__), "..", "data", "legacy")
NAMES = (
    "seq2seq",
    "encoder",
    "moe",
    "gated_delta",
    "linear",
    "latent",
    "windowed",
)


def _arrays(data, prefix):
    count = sum(1 for key in data.files if key.startswith(prefix))
    return [data[f"{prefix}{i}"] for i in range(count)]


@pytest.mark.parametrize("name", NAMES)
def test_block_file_loads_with_same_outputs(name):
    model = keras.saving.load_model(
        os.path.join(LEGACY, f"block_{name}.keras"), safe_mode=True
    )
    data = np.load(os.path.join(LEGACY, f"block_{name}.npz"))
    inputs, expected = _arrays(data, "input_"), _arrays(data, "output_")
    outputs = model(inputs[0] if len(inputs) == 1 else inputs)
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(got), want, atol=2e-5, rtol=2e-5
        )


def test_block_files_keep_their_sublayers():
    """The sublayers of the saved options come back as the same layers."""
    model = keras.saving.load_model(
        os.path.join(LEGACY, "block_moe.keras"), safe_mode=True
    )
    block = model.get_layer("block")
    assert type(block.feed_forward).__name__ == "MixtureOfExperts"
    model = keras.saving.load_model(
        os.path.join(LEGACY, "block_gated_delta.keras"), safe_mode=True
    )
    assert type(model.get_layer("block").self_attention).__name__ == (
        "GatedDeltaNet"
    )
