"""Smoke test of `benchmarks/gated_delta_rule.py --quick` (tiny sizes)."""

import pytest


@pytest.mark.tf_only(reason="one backend is enough for a smoke run")
@pytest.mark.slow("a benchmark script's smoke run")
def test_quick_run_writes_a_well_formed_table(tmp_path, load_benchmark):
    path = tmp_path / "table.md"
    load_benchmark("gated_delta_rule").main(
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
