"""Smoke tests of `python -m examples.translate` (tiny configurations)."""

import json
import os
import struct
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf_only


def _png_size(path):
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def _expected_png_size(source_tokens, target_tokens, dpi=100):
    # plot_attention's default size: 0.4 inch per token plus margins.
    width = max(3.0, 0.4 * source_tokens + 1.5)
    height = max(2.5, 0.4 * target_tokens + 1.2)
    return round(width * dpi), round(height * dpi)


def _serve_in_fresh_process(path, sentences):
    """Answers of the SavedModel in a process where keras, keras_hub and
    keras_attention cannot even be imported (TensorFlow Text's kernels are
    registered from their shared libraries: `import tensorflow_text` itself
    would import keras through `tf.keras`)."""
    code = (
        "import glob, importlib.util, json, os, sys\n"
        "for name in ('keras', 'keras_hub', 'keras_attention', 'tf_keras'):\n"
        "    sys.modules[name] = None\n"
        "import tensorflow as tf\n"
        "ops = os.path.join(os.path.dirname(importlib.util.find_spec(\n"
        "    'tensorflow_text').origin), 'python', 'ops')\n"
        "for lib in sorted(glob.glob(os.path.join(ops, '*.so'))):\n"
        "    tf.load_op_library(lib)\n"
        f"m = tf.saved_model.load({path!r})\n"
        f"out = m.translate(tf.constant({sentences!r})).numpy()\n"
        "print('ANSWERS' + json.dumps([s.decode('utf-8') for s in out]))\n"
    )
    env = {**os.environ, "PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=300, env=env, cwd="/")
    lines = [l for l in out.stdout.splitlines() if l.startswith("ANSWERS")]
    assert lines, out.stderr[-3000:]
    return json.loads(lines[0][len("ANSWERS"):])


def _run(tmp_path, *flags):
    from examples import translate

    out = tmp_path / "run"
    results = translate.main([
        "--quick", "--output-dir", str(out), "--data-dir",
        str(tmp_path / "tfds"), *flags,
    ])
    with open(out / "results.json") as f:
        assert json.load(f)["score"] == results["score"]
    return results


def _check(results):
    # Training did something: the loss fell over the few steps.
    assert results["final_loss"] < results["first_loss"]
    assert 0.0 <= results["score"] <= 100.0
    assert results["metric"] == "exact_match"
    # Heatmaps: valid PNGs sized to their tokens.
    assert len(results["plots"]) == 3
    for plot in results["plots"]:
        assert _png_size(plot["path"]) == _expected_png_size(
            plot["source_tokens"], plot["target_tokens"]
        )
        assert plot["source_tokens"] > 0 and plot["target_tokens"] > 0
    # The exported model answers raw strings, as the in-Python model did.
    sources = [e["source"] for e in results["examples"]]
    answers = _serve_in_fresh_process(results["saved_model"], sources)
    assert answers == [e["translation"] for e in results["examples"]]
    assert all(isinstance(a, str) for a in answers)


def test_transformer_quick(tmp_path):
    _check(_run(tmp_path, "--model", "transformer"))


def test_help():
    out = subprocess.run(
        [sys.executable, "-m", "examples.translate", "--help"],
        capture_output=True, text=True, timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert out.returncode == 0, out.stderr
    for flag in ("--model", "--attention", "--score", "--alignment",
                 "--decode", "--dataset", "--mixed-precision", "--strategy",
                 "--jit-compile", "--steps-per-epoch"):
        assert flag in out.stdout
