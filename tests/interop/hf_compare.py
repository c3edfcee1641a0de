"""What `test_from_huggingface.py` and `tools/interop_equality.py
--huggingface` compare with transformers' references (`hf_reference.py`):
the converted model's hidden states on `hf_cases.TOKEN_IDS` and its greedy
tokens after `hf_cases.PROMPTS`. Imports Keras, never transformers."""

import os
import pathlib
import subprocess
import sys

import hf_cases
import numpy as np
from keras.ops import convert_to_numpy as to_numpy

from keras_attention.interop import causal_lm_generator

HERE = pathlib.Path(__file__).resolve().parent


def write_references(out_dir, cases=()):
    """Runs `hf_reference.py` once for `cases` (all when empty) into
    `out_dir`, in a subprocess (transformers imports torch, which must
    not share a process with TensorFlow), offline: nothing downloads."""
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


def hidden_difference(model, reference):
    """The largest |difference| of the model's hidden states and the
    reference's `last_hidden_state` over the real positions (an encoder
    with a `segment_ids` input given `hf_cases.SEGMENT_IDS`)."""
    ids = np.array(hf_cases.TOKEN_IDS, "int32")
    mask = np.array(hf_cases.PADDING_MASK, "int32")
    inputs = {"token_ids": ids, "padding_mask": mask}
    if isinstance(model.input, dict) and "segment_ids" in model.input:
        inputs["segment_ids"] = np.array(hf_cases.SEGMENT_IDS, "int32")
    ours = to_numpy(model(inputs))
    difference = np.abs(ours.astype("float32") - reference["hidden"])
    if "rows" in reference:  # the case's `hidden_rows` only
        mask = mask * np.isin(np.arange(len(mask)), reference["rows"])[:, None]
    return float(difference.max(axis=-1)[mask == 1].max())


def greedy_tokens(model):
    """`NEW_TOKENS` greedy tokens after each prompt (our generator, the
    prompts right-padded in one batch)."""
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
