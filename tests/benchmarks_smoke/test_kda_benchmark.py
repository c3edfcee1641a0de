"""Smoke test of `benchmarks/kda.py --quick` (tiny sizes)."""

import pytest


@pytest.mark.tf_only(reason="one backend is enough for a smoke run")
@pytest.mark.slow("a benchmark script's smoke run")
def test_quick_run_writes_well_formed_tables(tmp_path, load_benchmark):
    path = tmp_path / "table.md"
    load_benchmark("kda").main(
        [
            "--quick",
            "--repeats",
            "1",
            "--mixers",
            "kda",
            "gated_delta",
            "--markdown",
            str(path),
        ]
    )
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| m")
    ]
    # The training rows (a mixer, two lengths, the ratio), then decoding
    # (two lengths, the ratio).
    assert [r[0] for r in rows[:2]] == ["kda", "gated_delta"]
    for row in rows[:2]:
        assert all(float(x) > 0 for x in row[1:])
    assert len(rows[2]) == 3 and all(float(x) > 0 for x in rows[2])
