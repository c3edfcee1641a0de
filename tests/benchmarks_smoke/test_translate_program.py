"""Smoke test of `benchmarks/translate_program.py --quick` (tiny data)."""

import pytest


def _table(text):
    """The Markdown table lines of `text`, split into stripped cells."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


@pytest.mark.tf_only(reason="trains two models; the data are tf.data")
@pytest.mark.slow("a benchmark script's smoke run")
def test_quick_run_writes_a_well_formed_table(tmp_path, load_benchmark):
    path = tmp_path / "table.md"
    rows = load_benchmark("translate_program").main(
        ["--quick", "--markdown", str(path)]
    )
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    table = _table(text)
    header, separator, body = table[0], table[1], table[2:]
    assert header[0] == "model" and "steps/s" in header
    assert "exact match %" in header
    assert separator == ["---"] * len(header)
    assert [r[0] for r in body] == ["ours", "keras"]
    assert all(len(r) == len(header) for r in body)
    # Same parameter count and number of steps, positive speeds.
    column = {name: i for i, name in enumerate(header)}
    for name in ("parameters", "steps", "batch"):
        assert body[0][column[name]] == body[1][column[name]]
    for r in body:
        assert float(r[column["steps/s"]]) > 0
        assert 0 <= float(r[column["exact match %"]]) <= 100
    # Same start (copied weights) and same batches: the same first loss.
    assert rows[0][7] == pytest.approx(rows[1][7], rel=1e-5)
