"""Smoke test of `benchmarks/mla_decoding.py --quick` (tiny sizes)."""

import pytest


def _table(text, title):
    """The Markdown table after the line starting with `title`, split
    into stripped cells (header, separator, body)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows:
            break
    return rows


@pytest.mark.tf_only(reason="one backend is enough for a smoke run")
@pytest.mark.slow("a benchmark script's smoke run")
def test_quick_run_writes_well_formed_tables(tmp_path, load_benchmark):
    path = tmp_path / "table.md"
    module = load_benchmark("mla_decoding")
    module.main(
        ["--quick", "--repeats", "1", "--warmup", "0", "--markdown", str(path)]
    )
    text = path.read_text()
    assert "Load average before:" in text and "after:" in text
    sizes = module.QUICK
    cache = _table(text, "cache")
    assert [r[0] for r in cache[2:]] == ["float32", "bfloat16"]
    for dtype, ours, theirs, ratio in cache[2:]:
        itemsize = {"float32": 4, "bfloat16": 2}[dtype]
        assert int(ours) == (sizes["rank"] + sizes["rope"]) * itemsize
        key_dim = sizes["nope"] + sizes["rope"]
        assert int(theirs) == 2 * sizes["heads"] * key_dim * itemsize
        assert ratio == f"{int(theirs) / int(ours):.1f}x"
    decode = _table(text, "decode")
    header, body = decode[0], decode[2:]
    assert header[0] == "cache length" and len(body) == 1
    assert int(body[0][0]) == sizes["length"]
    assert float(body[0][1]) > 0 and float(body[0][2]) > 0
