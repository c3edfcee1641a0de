"""Smoke test of `benchmarks/ring_attention.py --quick` (tiny sizes, 4
virtual devices, in its own JAX process: the device count is fixed
before JAX starts)."""

import os
import subprocess
import sys

import pytest
import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "ring_attention.py")


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


@pytest.mark.tf_only(reason="its own JAX process; one run is enough")
@pytest.mark.slow("a benchmark script's smoke run")
def test_quick_run_writes_well_formed_tables(tmp_path):
    path = tmp_path / "table.md"
    env = xla_flags.jax_environment()  # the script adds the device count
    out = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--markdown", str(path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    memory = _table(text, "memory per device")
    assert [r[:3] for r in memory] == [
        ["attention", "-", "1"],
        ["attention", "striped", "4"],
        ["attention", "contiguous", "4"],
        ["decoder block", "-", "1"],
        ["decoder block", "striped", "4"],
    ]
    for row in memory:
        assert row[4] == "64"  # tokens per device
        assert float(row[8]) > 0 and float(row[9]) > 0
    balance = {r[0]: r for r in _table(text, "balance")}
    assert balance["striped"][1] == "4-4 of 4"
    assert balance["contiguous"][1] == "1-4 of 4"
    # Query-key pairs: striped within (L + 1) / (L - 1)-ish, contiguous
    # 1 + 2 (n - 1) L / (L + 1) for n = 4 devices of L = 32 tokens.
    assert float(balance["striped"][2]) < 1.1
    assert float(balance["contiguous"][2]) > 6
    assert len(balance["striped"][3].split()) == 4
