"""Smoke test of `benchmarks/linear_attention.py --quick` (tiny sizes)."""

import pytest


@pytest.mark.tf_only(reason="one backend is enough for a smoke run")
@pytest.mark.slow("a benchmark script's smoke run")
def test_quick_run_writes_a_well_formed_table(tmp_path, load_benchmark):
    path = tmp_path / "table.md"
    module = load_benchmark("linear_attention")
    module.main(
        ["--quick", "--repeats", "1", "--warmup", "0", "--markdown", str(path)]
    )
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and line[2].isdigit()
    ]
    assert [int(r[0]) for r in rows] == module.QUICK["lengths"]
    for row in rows:
        assert len(row) == len(module.HEADERS)
        assert all(float(x) > 0 for x in row[1:6])
        assert all(float(x) > -1e4 for x in row[6:])  # MiB, as measured


@pytest.mark.tf_only(reason="one backend is enough for a smoke run")
@pytest.mark.slow("a benchmark script's smoke run")
def test_memory_only_run_measures_memory_without_timing(
    tmp_path, load_benchmark
):
    path = tmp_path / "table.md"
    module = load_benchmark("linear_attention")
    module.main(
        [
            "--quick",
            "--memory-only",
            "--memory-impls",
            "linear",
            "--markdown",
            str(path),
        ]
    )
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in path.read_text().splitlines()
        if line.startswith("| ") and line[2].isdigit()
    ]
    assert [int(r[0]) for r in rows] == module.QUICK["lengths"]
    for row in rows:
        assert row[1:6] == ["n/a"] * 5 and row[7] == "n/a"
        assert float(row[6]) > -1e4  # MiB, as measured
