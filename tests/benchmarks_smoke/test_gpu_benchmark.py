"""Smoke test of `bash benchmarks/gpu.sh --dry-run`: the GPU benchmark at
tiny sizes on a CPU, with TensorFlow made absent (the GPU machine has
none), so that the script cannot rot between the runs on a GPU.

In the fast tier on purpose (the GPU script is run where no CI runs: this
is its only check); about a minute, most of it compiling FlexAttention's
CPU kernels and the JAX programs."""

import os
import subprocess
import sys

import pytest
import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _table(text, title):
    """The body rows of the Markdown table after the line starting with
    `title`, split into stripped cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


@pytest.mark.tf_only(reason="runs JAX and PyTorch in its own processes")
def test_dry_run_exits_0_with_every_table(tmp_path):
    path = tmp_path / "gpu.md"
    env = xla_flags.jax_environment()
    env["PYTHON"] = sys.executable
    env.pop("KERAS_BACKEND", None)
    out = subprocess.run(
        ["bash", "benchmarks/gpu.sh", "--dry-run", "--markdown", str(path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env=env,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    text = path.read_text()
    jax_rows = _table(text, "jax: forward + backward")
    assert [(r[1], r[2]) for r in jax_rows] == [
        ("causal", "ours"),
        ("causal", "jax.nn xla"),
        ("document", "ours"),
        ("document", "jax.nn xla"),
    ]
    torch_rows = _table(text, "torch: forward (CPU)")
    assert [(r[1], r[2]) for r in torch_rows] == [
        ("causal", "SDPA"),
        ("causal", "flex_attention"),
        ("causal", "ours"),
        ("document", "SDPA, dense mask"),
        ("document", "flex_attention"),
        ("document", "ours"),
    ]
    for row in jax_rows + torch_rows:
        ms, tflops, ratio, diff = (float(row[i]) for i in (3, 4, 5, 7))
        assert ms > 0 and tflops > 0 and ratio > 0
        assert diff < 0.05  # bfloat16 outputs of the same attention
    (fit,) = _table(text, "model.fit of the language-model example")
    assert int(fit[3]) == 3 and float(fit[4]) > 0  # steps, tokens/s
    assert "=== whole benchmark:" in out.stdout
