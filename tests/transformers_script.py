"""Runs a test's `transformers` reference script in a subprocess: importing
transformers pulls triton, which crashes beside TensorFlow in one
process."""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest


def run_reference_script(script, cases, reference, **arrays):
    """`python -c script CASES INPUTS OUT` with `cases` as JSON, `arrays`
    saved in the `.npz` file INPUTS, and the arrays the script saved in
    OUT as a dict; skips the test where transformers is not installed
    (`reference`: what is unavailable then)."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip(
            "transformers is not installed (the `test` extra): "
            f"{reference} is unavailable"
        )
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        inputs = os.path.join(tmp, "x.npz")
        out = os.path.join(tmp, "out.npz")
        np.savez(inputs, **arrays)
        command = [sys.executable, "-c", script, json.dumps(cases), inputs, out]
        subprocess.run(command, check=True, env=env, timeout=300)
        with np.load(out) as data:
            return {k: data[k] for k in data.files}
