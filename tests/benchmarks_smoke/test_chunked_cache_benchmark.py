"""Smoke test of `benchmarks/chunked_cache.py --quick` (tiny sizes): the
chunked and full caches give the same tokens, and the table is well
formed, the chunked caches the smaller."""

import pytest


@pytest.mark.tf_only(reason="one backend is enough for a smoke run")
@pytest.mark.slow("a benchmark script's smoke run (fresh processes)")
def test_quick_run_writes_a_well_formed_table(tmp_path, load_benchmark):
    path = tmp_path / "table.md"
    module = load_benchmark("chunked_cache")
    result = module.main(["--quick", "--markdown", str(path)])
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    assert result["same"]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| cache ")
    ]
    assert [r[0] for r in rows] == ["auto", "full"]
    auto, full = (float(r[1].replace(",", "")) for r in rows)
    assert 0 < auto < full  # one chunk of slots in the chunked blocks
    quick = module.QUICK
    layers = module.LAYERS
    want = (3 * quick["chunk"] + quick["max_length"]) / (
        layers * quick["max_length"]
    )
    assert result["ratios"]["cache"] == pytest.approx(want, rel=0.01)
