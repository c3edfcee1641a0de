"""Smoke test of `benchmarks/linear_decoding.py --quick` (tiny sizes)."""

import pytest


@pytest.mark.tf_only(reason="one backend is enough for a smoke run")
@pytest.mark.slow("a benchmark script's smoke run (fresh processes)")
def test_quick_run_writes_a_well_formed_table(tmp_path, load_benchmark):
    path = tmp_path / "table.md"
    module = load_benchmark("linear_decoding")
    stacks = ["linear", "hybrid"]
    module.main(
        ["--quick", "--repeats", "1", "--stacks", *stacks,
         "--markdown", str(path)]
    )  # fmt: skip
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| stack")
    ]
    lengths = module.QUICK["lengths"]
    assert [r[:2] for r in rows] == [["linear", "LL"], ["hybrid", "GA"]]
    for row in rows:
        assert len(row) == len(module.headers(lengths))
        assert all(float(x) > 0 for x in row[2 : 3 + len(lengths)])
        assert all(float(x) > -1e4 for x in row[3 + len(lengths) :])  # MiB
