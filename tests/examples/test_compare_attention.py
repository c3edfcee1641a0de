"""Smoke test of `python -m examples.compare_attention` (tiny size): the
study runs end to end and writes a well-formed report and valid plots."""

import json
import random
import re
import struct

import example_output
import pytest

VARIANTS = ["rnn-none", "rnn-bahdanau-norm", "transformer-local"]
TASKS = ["long_dates"]  # the dates pipeline with longer sources


def _png_size(path):
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def _tables(report):
    """`{task: [[cells], ...]}` of the report's Markdown tables."""
    tables = {}
    for section in report.split("\n## Task `")[1:]:
        task = section.split("`", 1)[0]
        lines = [line for line in section.splitlines() if line.startswith("|")]
        tables[task] = [
            [c.strip() for c in line.strip("|").split("|")] for line in lines
        ]
    return tables


def _number(cell):
    if cell.strip() == "n/a":
        return float("nan")
    return float(cell.split("±")[0].replace(",", "").strip())


def _allocator_keeps_stats():
    """Whether TensorFlow's CPU allocator keeps memory statistics (not
    with TF_ENABLE_ONEDNN_OPTS=0): the study's peak memory is n/a then."""
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
    except (ValueError, RuntimeError):
        return False
    return True


@pytest.mark.tf_only(reason="trains models end to end; once is enough")
def test_study_runs_and_writes_a_well_formed_report(tmp_path):
    from examples.compare_attention import __main__ as study

    flags = [
        "--quick",
        "--out",
        str(tmp_path),
        "--variants",
        ",".join(VARIANTS),
        "--tasks",
        ",".join(TASKS),
    ]
    with example_output.captured() as output:
        paths = study.main(flags)
    # It used to print Keras's "`shuffle=True` was passed, but will be
    # ignored" and, for rnn-none, "Layer 'gru_cell' (of type GRUCell) was
    # passed an input with a mask attached to it".
    assert "long_dates  rnn-none" in output.log  # the run's own messages
    found = output.problems()
    assert not found, "\n".join(found)
    report = open(paths["report"]).read()
    assert "Command: `python -m examples.compare_attention --quick" in report
    assert "Machine: " in report and "Budget: " in report
    tables = _tables(report)
    assert list(tables) == TASKS
    for task, rows in tables.items():
        header, rule, *body = rows
        assert header == [
            "variant",
            "exact match %",
            "params",
            "train ms/step",
            "latency ms/seq",
            "peak MiB",
        ]
        assert all(re.fullmatch(r"-{3,}:?", c) for c in rule)
        assert [r[0].strip("`") for r in body] == VARIANTS, task
        for row in body:
            assert len(row) == len(header)
            match, params, step, latency, memory = map(_number, row[1:])
            assert 0.0 <= match <= 100.0
            assert params == int(params) and params > 1000
            assert 0.0 < step < 60_000 and 0.0 < latency < 60_000
            if _allocator_keeps_stats():
                assert memory >= 0.0  # NaN fails too
            else:
                assert row[-1].strip() == "n/a"
    # The no-attention model is the smallest RNN; params differ by task
    # only through the vocabulary and the position tables.
    body = tables["long_dates"][2:]
    assert _number(body[0][2]) < _number(body[1][2])

    assert len(paths["plots"]) == len(TASKS) + 1
    for plot in paths["plots"]:
        width, height = _png_size(plot)
        assert 200 < width < 2000 and 200 < height < 2000
        assert "](" + plot.split("/")[-1] + ")" in report
    # The runs are saved: the report is written again without training.
    again = study.main(flags + ["--report-only"])
    assert _tables(open(again["report"]).read()) == tables
    results = json.load(open(paths["results"]))
    assert len(results["runs"]) == len(VARIANTS) * len(TASKS)
    for run in results["runs"]:
        assert len(run["hits"]) == len(run["source_lengths"]) > 0


@pytest.mark.tf_only(reason="imports TensorFlow (the data pipeline)")
def test_long_sources_keep_the_date_and_respect_the_length():
    from examples.compare_attention import tasks

    rng = random.Random(0)
    date = "29 novembre 2026"
    lengths = set()
    for _ in range(200):
        source = tasks.hide_in_noise(date, rng)
        assert date in source
        assert tasks.LONG_MIN_LENGTH <= len(source) <= tasks.LONG_MAX_LENGTH
        assert not any(c.isdigit() for c in source.replace(date, ""))
        lengths.add(len(source))
    spread = tasks.LONG_MAX_LENGTH - tasks.LONG_MIN_LENGTH
    assert len(lengths) > spread // 2  # lengths spread over the range


@pytest.mark.parametrize(
    "variant, kind",
    [
        ("transformer-alibi", "ALiBi"),
        ("transformer-t5", "T5RelativeBias"),
        ("transformer-softcap", "SoftCap"),
    ],
)
def test_score_variants_put_one_score_object_in_each_self_attention(
    variant, kind
):
    import numpy as np

    from examples.compare_attention.models import build_variant
    from keras_attention.blocks import TransformerDecoderBlock
    from keras_attention.blocks import TransformerEncoderBlock

    translator = build_variant(variant, 20, 20, 12, 10, 1, 2, size="quick")
    blocks = [
        layer
        for model in (translator.encoder, translator.model)
        for layer in model.layers
        if isinstance(layer, (TransformerEncoderBlock, TransformerDecoderBlock))
    ]
    mods = {id(b.score_mod): b for b in blocks}
    assert len(mods) == len(set(id(b) for b in blocks)) >= 2  # one each
    for block in blocks:
        assert type(block.score_mod).__name__ == kind
        if kind != "SoftCap":  # causal in the decoder, symmetric in the encoder
            causal = isinstance(block, TransformerDecoderBlock)
            assert block.score_mod.bidirectional is not causal
    ids = np.ones((2, 6), "int32")
    logits = translator.model({"encoder_ids": ids, "decoder_ids": ids})
    assert np.isfinite(np.asarray(logits)).all()
