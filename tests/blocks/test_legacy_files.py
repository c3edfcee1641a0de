"""`.keras` files saved before the issue-11 redesign still load.

`tests/data/legacy/make_legacy_files.py` saved them with the code of
commit 73f4a7d (before the transformer blocks moved to
`keras_attention.blocks` and the seq2seq attention base got its own
module), with the inputs and the outputs they produced. Loading them with
the current code must give the same outputs: the registered names, the
config keys and the weight paths did not change.
"""

import os

import keras
import numpy as np
import pytest

import keras_attention  # noqa: F401  (registers the layers)

LEGACY = os.path.join(os.path.dirname(__file__), "..", "data", "legacy")
NAMES = (
    "encoder_plain",
    "encoder_causal",
    "encoder_local",
    "decoder",
    "rnn",
    "multi_head",
)


def _arrays(data, prefix):
    count = sum(1 for key in data.files if key.startswith(prefix))
    return [data[f"{prefix}{i}"] for i in range(count)]


@pytest.mark.parametrize("name", NAMES)
def test_legacy_file_loads_with_same_outputs(name):
    model = keras.saving.load_model(os.path.join(LEGACY, f"{name}.keras"))
    data = np.load(os.path.join(LEGACY, f"{name}.npz"))
    inputs, expected = _arrays(data, "input_"), _arrays(data, "output_")
    outputs = model.predict(
        inputs[0] if len(inputs) == 1 else inputs, verbose=0
    )
    outputs = outputs if isinstance(outputs, list) else [outputs]
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(got), want, atol=1e-5, rtol=1e-5
        )


def test_legacy_files_use_the_registered_names():
    """The blocks are found under their unchanged registered names."""
    model = keras.saving.load_model(os.path.join(LEGACY, "decoder.keras"))
    names = {
        keras.saving.get_registered_name(type(layer)) for layer in model.layers
    }
    assert "keras_attention>TransformerEncoderBlock" in names
    assert "keras_attention>TransformerDecoderBlock" in names
