"""Smoke test of `benchmarks/interop_training.py` at a tiny length."""

import pytest

pytest.importorskip("keras_hub")


@pytest.mark.tf_only(reason="the benchmark's training step is a tf.function")
@pytest.mark.slow("a benchmark script's smoke run")
def test_tiny_run_times_both_models_of_both_families(tmp_path, load_benchmark):
    path = tmp_path / "table.md"
    rows = load_benchmark("interop_training").main(
        [
            "--sizes",
            "16",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--no-memory",
            "--markdown",
            str(path),
        ]
    )
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    assert [(r[0], r[1]) for r in rows] == [("bert", 16), ("llama", 16)]
    for row in rows:
        ours_ms, theirs_ms, ratio, diff = row[3], row[4], row[5], row[-1]
        assert ours_ms > 0 and theirs_ms > 0
        assert ratio == pytest.approx(ours_ms / theirs_ms)
        assert diff <= 1e-4  # the converted model's outputs were checked
