"""Smoke test of `benchmarks/decode_step.py --quick` (tiny sizes)."""

import pytest


@pytest.mark.tf_only(reason="one backend is enough for a smoke run")
@pytest.mark.slow("a benchmark script's smoke run")
def test_quick_run_writes_both_tables(tmp_path, load_benchmark):
    path = tmp_path / "table.md"
    module = load_benchmark("decode_step")
    module.main(
        ["--quick", "--repeats", "1", "--warmup", "0", "--markdown", str(path)]
    )
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    rows = [
        line for line in text.splitlines() if line.startswith("| tensorflow")
    ]
    # XLA and graph, each checked equal to the batched matmuls first.
    assert [r.split("|")[1].strip() for r in rows] == [
        "tensorflow XLA",
        "tensorflow graph",
    ]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "matmul" and float(cells[3]) > 0
    assert f"| {module.QUICK['chunk']} |" in text
