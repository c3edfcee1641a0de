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
import os
import pathlib
import subprocess
import sys

import hf_cases
import keras
import numpy as np
import pytest
from keras.ops import convert_to_numpy as to_numpy
from tiers import family_tier

from keras_attention.interop import causal_lm_generator
from keras_attention.interop import from_huggingface

pytestmark = family_tier()

HERE = pathlib.Path(__file__).resolve().parent
TOLERANCE = 1e-5

if importlib.util.find_spec("transformers") is None:  # pragma: no cover
    pytest.skip("transformers is not installed", allow_module_level=True)


def write_references(out_dir, cases=()):
    """Runs `hf_reference.py` once for `cases` (all when empty) into
    `out_dir` (offline: nothing downloads)."""
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
    )
    subprocess.run(
        [sys.executable, str(HERE / "hf_reference.py"), str(out_dir), *cases],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_references")
    write_references(out)
    return out


def hidden_states(model):
    ids = np.array(hf_cases.TOKEN_IDS, "int32")
    mask = np.array(hf_cases.PADDING_MASK, "int32")
    out = model({"token_ids": ids, "padding_mask": mask})
    return to_numpy(out).astype("float32"), mask == 1


def greedy_tokens(model):
    """`NEW_TOKENS` greedy tokens after each prompt, the prompts
    right-padded in one batch."""
    prompts = hf_cases.PROMPTS
    length = max(len(p) for p in prompts) + hf_cases.NEW_TOKENS
    ids = np.zeros((len(prompts), length), "int32")
    mask = np.zeros(ids.shape, bool)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
        mask[row, : len(prompt)] = True
    generator = causal_lm_generator(model, jit_compile=False)
    out, _ = generator.generate(ids, max_length=length, padding_mask=mask)
    out = to_numpy(out)
    return np.stack(
        [
            out[row, len(p) : len(p) + hf_cases.NEW_TOKENS]
            for row, p in enumerate(prompts)
        ]
    )


@pytest.mark.parametrize("case", hf_cases.case_names())
def test_equal_to_transformers(case, references):
    keras.utils.set_random_seed(0)
    directory = references / case
    want = np.load(directory / "reference.npz")
    model = from_huggingface(directory)
    ours, real = hidden_states(model)
    difference = np.abs(ours - want["hidden"]).max(axis=-1)[real].max()
    assert difference < TOLERANCE, difference
    if hf_cases.CASES[case].get("greedy", True):
        np.testing.assert_array_equal(greedy_tokens(model), want["tokens"])
        assert len(np.unique(want["tokens"])) > 2  # varied, not one token
