"""`keras_attention.interop.from_huggingface` against transformers: each
case of `hf_cases.py` (one per family, its distinctive options on) is
built by transformers from a tiny random config and saved as safetensors
in a subprocess (`hf_reference.py`, all cases in one run: transformers
imports torch, which must not share a process with TensorFlow); the
checkpoint is loaded here and compared: the final hidden states at the
real positions of a right- and a left-padded row, and 8 greedy tokens
after each prompt (`causal_lm_generator`) against `generate(do_sample=
False)`. Nothing downloads. Fast tier: TensorFlow (`tiers.py`)."""

import importlib.util

import hf_cases
import keras
import numpy as np
import pytest
from hf_compare import greedy_tokens
from hf_compare import hidden_difference
from hf_compare import write_references
from tiers import family_tier

from keras_attention.interop import from_huggingface

pytestmark = family_tier()

TOLERANCE = 1e-5

if importlib.util.find_spec("transformers") is None:  # pragma: no cover
    pytest.skip("transformers is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_references")
    write_references(out)
    return out


@pytest.mark.parametrize("case", hf_cases.case_names())
def test_equal_to_transformers(case, references):
    keras.utils.set_random_seed(0)
    directory = references / case
    want = np.load(directory / "reference.npz")
    if "index_gap" in want.files:  # DeepSeek-V3.2: no near tie decides
        assert want["index_gap"] > 1e-3, want["index_gap"]
    model = from_huggingface(directory)
    difference = hidden_difference(model, want)
    assert difference < TOLERANCE, difference
    if hf_cases.CASES[case].get("greedy", True):
        np.testing.assert_array_equal(greedy_tokens(model), want["tokens"])
        assert len(np.unique(want["tokens"])) > 2  # varied, not one token
