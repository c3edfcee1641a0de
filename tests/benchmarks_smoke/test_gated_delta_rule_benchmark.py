"""Smoke test of `benchmarks/gated_delta_rule.py --quick` (tiny sizes)."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gated_delta_rule.py")


def _load_script():
    spec = importlib.util.spec_from_file_location("gated_delta_rule", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.tf_only(reason="one backend is enough for a smoke run")
@pytest.mark.slow("a benchmark script's smoke run")
def test_quick_run_writes_a_well_formed_table(tmp_path):
    path = tmp_path / "table.md"
    _load_script().main(
        ["--quick", "--repeats", "1", "--warmup", "0", "--markdown", str(path)]
    )
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| forward")
    ]
    assert [r[0] for r in rows] == ["forward", "forward + backward"]
    for _, ours, theirs, ratio in rows:
        assert float(ours) > 0 and float(theirs) > 0
        assert float(ratio) > 0
