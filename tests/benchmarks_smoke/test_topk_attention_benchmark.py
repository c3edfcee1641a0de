"""Smoke test of `benchmarks/topk_attention.py --quick` (tiny sizes)."""

import numpy as np
import pytest


@pytest.mark.tf_only(reason="one backend is enough for a smoke run")
@pytest.mark.slow("a benchmark script's smoke run")
def test_quick_run_writes_a_well_formed_table(tmp_path, load_benchmark):
    path = tmp_path / "table.md"
    module = load_benchmark("topk_attention")
    rows = module.main(
        ["--quick", "--repeats", "1", "--warmup", "0", "--no-memory"]
        + ["--markdown", str(path)]
    )
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    # (T, key/value heads): --heads 2 and MQA's 1 by default.
    assert [tuple(r[:2]) for r in rows] == [
        (64, 2),
        (128, 2),
        (64, 1),
        (128, 1),
    ]
    for _, _, topk_ms, dense_ms, ratio, *_ in rows:
        assert topk_ms > 0 and dense_ms > 0 and ratio > 0


def test_indices_are_distinct_earlier_positions(load_benchmark):
    module = load_benchmark("topk_attention")
    indices = module.causal_indices(300, 16)[0]
    for i, row in enumerate(indices):
        kept = row[row >= 0]
        assert len(kept) == min(i + 1, 16) and len(set(kept)) == len(kept)
        assert kept.max() <= i
    assert np.all(indices[200] >= 0) and indices[200].max() > 150
