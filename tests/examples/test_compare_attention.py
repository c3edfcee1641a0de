"""`python -m examples.compare_attention` at its tiny size: early
stopping stops and restores the best weights, seeds give mean ± sd, the
length task tests longer sources than it trains on and reports (and
plots) accuracy by length, and the reading follows the numbers."""

import json
import random
import re
import statistics
import struct

import example_output
import pytest

VARIANTS = ["rnn-none", "rnn-bahdanau-norm", "transformer-local"]
TASKS = ["length_generalization"]  # long_dates with longer test sources
COLUMNS = [
    "variant",
    "exact match %",
    "steps (best)",
    "params",
    "train ms/step",
    "latency ms/seq",
    "peak MiB",
]


def _png_size(path):
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def _tables(report):
    """`{task: [main table rows, length table rows]}` of the report's
    Markdown tables, each row a list of cells."""
    tables = {}
    for section in report.split("\n## Task `")[1:]:
        task = section.split("`", 1)[0]
        section = section.split("\n## ", 1)[0]
        blocks, rows = [], []
        for line in section.splitlines() + [""]:
            if line.startswith("|"):
                rows.append([c.strip() for c in line.strip("|").split("|")])
            elif rows:
                blocks.append(rows)
                rows = []
        tables[task] = blocks
    return tables


def _number(cell):
    if cell.strip() == "n/a":
        return float("nan")
    return float(cell.split("±")[0].split("(")[0].replace(",", "").strip())


def _allocator_keeps_stats():
    """Whether TensorFlow's CPU allocator keeps memory statistics (not
    with TF_ENABLE_ONEDNN_OPTS=0): the study's peak memory is n/a then."""
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
    except (ValueError, RuntimeError):
        return False
    return True


@pytest.fixture(scope="module")
def quick_study(tmp_path_factory):
    from examples.compare_attention import __main__ as study

    out = tmp_path_factory.mktemp("compare_attention")
    flags = [
        "--quick",
        "--out",
        str(out),
        "--variants",
        ",".join(VARIANTS),
        "--tasks",
        ",".join(TASKS),
    ]
    with example_output.captured() as output:
        paths = study.main(flags)
    return study, flags, paths, output


@pytest.mark.tf_only(reason="trains models end to end; once is enough")
def test_study_writes_a_well_formed_report(quick_study):
    study, flags, paths, output = quick_study
    # It used to print Keras's "`shuffle=True` was passed, but will be
    # ignored" and, for rnn-none, "Layer 'gru_cell' (of type GRUCell) was
    # passed an input with a mask attached to it".
    assert "length_generalization rnn-none" in output.log  # its messages
    found = output.problems()
    assert not found, "\n".join(found)
    report = open(paths["report"]).read()
    assert "Command: `python -m examples.compare_attention --quick" in report
    assert "Machine: " in report and "Budget: " in report
    # The cap and the early-stopping rule are stated.
    assert "at most 30 steps (the cap)" in report
    assert "2 evaluations in a row, one evaluation every 5 steps" in report
    tables = _tables(report)
    assert list(tables) == TASKS
    (header, rule, *body), _ = tables[TASKS[0]]
    assert header == COLUMNS
    assert all(re.fullmatch(r"-{3,}:?", c) for c in rule)
    assert [r[0].strip("`") for r in body] == VARIANTS
    for row in body:
        assert len(row) == len(header)
        match, steps, params, step, latency, memory = map(_number, row[1:])
        assert re.fullmatch(r"\d+\.\d ± \d+\.\d", row[1])  # 2 seeds
        assert 0.0 <= match <= 100.0 and 0 < steps <= 30
        assert params == int(params) and params > 1000
        assert 0.0 < step < 60_000 and 0.0 < latency < 60_000
        if _allocator_keeps_stats():
            assert memory >= 0.0  # NaN fails too
        else:
            assert row[-1].strip() == "n/a"
    # The no-attention model is the smallest RNN.
    assert _number(body[0][3]) < _number(body[1][3])
    assert "## Reading" in report and "**Rule**: means over 2 seed(s)" in report

    assert len(paths["plots"]) == len(TASKS) + 1
    for plot in paths["plots"]:
        width, height = _png_size(plot)
        assert 200 < width < 2000 and 200 < height < 2000
        assert "](" + plot.split("/")[-1] + ")" in report
    # The runs are saved: the report is written again without training.
    again = study.main(flags + ["--report-only"])
    assert _tables(open(again["report"]).read()) == tables


@pytest.mark.tf_only(reason="trains models end to end; once is enough")
def test_runs_record_how_early_stopping_ended(quick_study):
    _, _, paths, _ = quick_study
    runs = json.load(open(paths["results"]))["runs"]
    assert len(runs) == len(VARIANTS) * len(TASKS) * 2  # seeds 0 and 1
    for run in runs:
        curve = run["validation_curve"]  # [step, exact match, characters]
        assert [step for step, *_ in curve] == list(
            range(5, run["steps"] + 1, 5)
        )
        best = max(tuple(scores) for _, *scores in curve)
        assert run["validation_exact_match"] == best[0]
        first = next(step for step, *scores in curve if tuple(scores) == best)
        assert run["best_step"] == first
        if run["stopped"] == "patience":  # 2 evaluations without better
            assert run["steps"] == run["best_step"] + 2 * 5 <= 30
        elif run["stopped"] == "cap":
            assert run["steps"] == 30
        else:
            assert run["stopped"] == "perfect" and best[0] == 100.0


@pytest.mark.tf_only(reason="trains a model end to end")
def test_early_stopping_stops_a_run_that_does_not_improve(tmp_path):
    from examples.compare_attention import __main__ as study

    # Learning rate 0: the validation scores never change, so the run
    # stops 2 evaluations (10 steps) after the first, far from the cap.
    paths = study.main(
        [
            "--quick",
            "--learning-rate",
            "0",
            "--variants",
            "rnn-none",
            "--tasks",
            "length_generalization",
            "--seeds",
            "0",
            "--out",
            str(tmp_path),
        ]
    )
    (run,) = json.load(open(paths["results"]))["runs"]
    assert (run["stopped"], run["steps"], run["best_step"]) == (
        "patience",
        15,
        5,
    )
    assert len({tuple(scores) for _, *scores in run["validation_curve"]}) == 1
    report = open(paths["report"]).read()
    assert "of 1 runs, 1 stopped by patience" in report


@pytest.mark.tf_only(reason="trains models end to end; once is enough")
def test_seeds_give_mean_and_sd_and_accuracy_by_length(quick_study):
    from examples.compare_attention import report as report_module
    from examples.compare_attention import tasks

    _, _, paths, _ = quick_study
    results = json.load(open(paths["results"]))
    runs = results["runs"]
    report = open(paths["report"]).read()
    (_, _, *body), (length_header, _, *length_body) = _tables(report)[TASKS[0]]
    for row in body:
        mine = [r for r in runs if r["variant"] == row[0].strip("`")]
        assert sorted(r["seed"] for r in mine) == [0, 1]
        values = [r["exact_match"] for r in mine]
        mean, sd = statistics.mean(values), statistics.stdev(values)
        assert row[1] == f"{mean:.1f} ± {sd:.1f}"
    # Accuracy by source length: bins up to the longest training source,
    # then longer ones (marked *), one row per variant.
    lengths = runs[0]["source_lengths"]
    assert max(lengths) > tasks.LENGTH_TRAIN_MAX
    assert all(r["train_max_length"] == tasks.LENGTH_TRAIN_MAX for r in runs)
    names = length_header[1:]
    beyond = [n for n in names if n.endswith("*")]
    assert beyond and len(beyond) < len(names)
    for name in beyond:
        assert int(name.split("-")[0]) > tasks.LENGTH_TRAIN_MAX
    bins = report_module.length_bins(lengths, split=tasks.LENGTH_TRAIN_MAX)
    assert len(bins) == len(names)
    for row in length_body:
        variant = row[0].strip("`")
        mine = [r for r in runs if r["variant"] == variant]
        for cell, (low, high) in zip(row[1:], bins):
            per_seed = []
            for r in mine:
                hits = [
                    h
                    for n, h in zip(r["source_lengths"], r["hits"])
                    if low <= n < high
                ]
                if hits:
                    per_seed.append(100.0 * sum(hits) / len(hits))
            if per_seed:
                assert _number(cell) == pytest.approx(
                    statistics.mean(per_seed), abs=0.051
                )
    assert any("length_length_generalization.png" in p for p in paths["plots"])


@pytest.mark.tf_only(reason="imports TensorFlow (the data pipeline)")
def test_length_task_trains_short_and_tests_long():
    from examples.compare_attention import tasks

    task = tasks.load_task(
        "length_generalization", quick=True, max_test=200, max_validation=50
    )
    train = [len(s) for s, _ in task.train_pairs]
    validation = [len(s) for s, _ in task.validation_pairs]
    test = [len(s) for s, _ in task.test_pairs]
    assert max(train + validation) <= tasks.LENGTH_TRAIN_MAX
    assert min(train + test) >= tasks.LENGTH_MIN_LENGTH
    assert max(test) <= tasks.LENGTH_TEST_MAX
    longer = sum(n > tasks.LENGTH_TRAIN_MAX for n in test)
    assert longer > len(test) // 2  # most test sources are longer
    assert len(validation) == 50 and len(test) == 200
    assert task.max_source_length == tasks.LENGTH_TEST_MAX
    # The dates are the targets, unchanged.
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d", t) for _, t in task.test_pairs)


def test_patience_stops_after_patience_evaluations_without_better():
    from examples.compare_attention.__main__ import Patience

    patience = Patience(patience=2, max_steps=100)
    scores = [10.0, 30.0, 30.0, 20.0]
    stops = [patience.update(10 * (i + 1), s) for i, s in enumerate(scores)]
    assert stops == [False, False, False, True]
    assert (patience.reason, patience.best, patience.best_step) == (
        "patience",
        30.0,
        20,
    )
    capped = Patience(patience=5, max_steps=30)
    assert [capped.update(s, s) for s in (10, 20, 30)] == [False, False, True]
    assert capped.reason == "cap"
    perfect = Patience(patience=5, max_steps=30)
    assert perfect.update(10, 100.0) and perfect.reason == "perfect"
    # No stopping by patience before min_steps (a plateau, then learning).
    late = Patience(patience=2, max_steps=100, min_steps=50)
    flat = [late.update(step, 0.0) for step in (10, 20, 30, 40, 50)]
    assert flat == [False, False, False, False, True]
    assert late.reason == "patience" and late.best_step == 10
    # (exact match, characters): the second breaks ties of the first.
    pairs = Patience(patience=1, max_steps=100)
    assert not pairs.update(10, (0.0, 20.0))
    assert not pairs.update(20, (0.0, 35.0))  # still learning
    assert pairs.update(30, (0.0, 30.0)) and pairs.best_step == 20
    assert pairs.curve == [(10, 0.0, 20.0), (20, 0.0, 35.0), (30, 0.0, 30.0)]


@pytest.mark.tf_only(reason="trains a tiny Keras model")
def test_early_stopping_restores_the_weights_of_the_best_evaluation():
    import keras
    import numpy as np

    from examples.compare_attention.__main__ import Patience
    from examples.compare_attention.__main__ import _early_stopping

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    scores = iter([10.0, 40.0, 20.0, 30.0, 35.0, 90.0])
    seen = []

    def evaluate():
        seen.append([w.copy() for w in model.get_weights()])
        return next(scores)

    stopper = _early_stopping(keras, Patience(3, 100), evaluate, 2)
    x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
    model.fit(
        x, x[:, :1], batch_size=4, epochs=50, callbacks=[stopper], verbose=0
    )
    # Stopped 3 evaluations after the best (the second, at step 4).
    assert len(seen) == 5 and stopper.patience.best_step == 4
    for restored, best in zip(model.get_weights(), seen[1]):
        np.testing.assert_array_equal(restored, best)
    assert not np.array_equal(model.get_weights()[0], seen[-1][0])


def _fake_run(variant, seed, inside, beyond, task="length_generalization"):
    """A saved run whose hits give `inside` % on 100 sources of 20
    characters and `beyond` % on 100 of 80 (training sources up to 40)."""
    lengths = [20] * 100 + [80] * 100
    hits = [int(i < inside) for i in range(100)]
    hits += [int(i < beyond) for i in range(100)]
    return {
        "task": task,
        "variant": variant,
        "seed": seed,
        "exact_match": 100.0 * sum(hits) / len(hits),
        "steps": 300,
        "best_step": 200,
        "stopped": "patience",
        "params": 1000,
        "train_ms_per_step": 1.0,
        "latency_ms": 1.0,
        "peak_mib": 1.0,
        "source_lengths": lengths,
        "hits": hits,
        "train_max_length": 40,
    }


def test_character_accuracy():
    from examples.compare_attention.__main__ import character_accuracy

    references = ["2026-11-29", "1951-04-03"]
    assert character_accuracy(references, references) == 100.0
    assert character_accuracy(["2026-11-28", "1951"], references) == 65.0


def test_differences_within_the_test_sets_sampling_error_are_ties():
    from examples.compare_attention import report

    def one_seed(percent, count):
        return percent, 0.0, report.standard_error(percent, count)

    # 95 vs 90 % on 40 examples each: within twice the standard error.
    assert not report.differs(one_seed(95.0, 40), one_seed(90.0, 40))
    # The same on 2,000 examples each: a real difference.
    assert report.differs(one_seed(95.0, 2000), one_seed(90.0, 2000))
    # Seeds: a difference smaller than a standard deviation is a tie.
    assert not report.differs((95.0, 6.0, 0.5), (90.0, 1.0, 0.5))
    assert report.standard_error(50.0, 100) == 5.0


def test_reading_follows_the_numbers():
    from examples.compare_attention import report

    runs = [
        # Degrades: 100 % on training lengths, 20-30 % beyond.
        _fake_run("rnn-none", 0, 100, 20),
        _fake_run("rnn-none", 1, 100, 30),
        # Holds up: 90-100 % on both.
        _fake_run("rnn-bahdanau", 0, 100, 90),
        _fake_run("rnn-bahdanau", 1, 90, 100),
        # Within a standard deviation of rnn-bahdanau overall.
        _fake_run("rnn-luong-dot", 0, 100, 80),
        _fake_run("rnn-luong-dot", 1, 100, 100),
        # Learned nothing: no verdict on length.
        _fake_run("transformer-full", 0, 10, 0),
        _fake_run("transformer-full", 1, 20, 0),
    ]
    variants = ["rnn-none", "rnn-bahdanau", "rnn-luong-dot", "transformer-full"]
    rows = {
        "length_generalization": report.summarize(
            runs, "length_generalization", variants
        )
    }
    text = report.reading(runs, rows, variants, max_steps=1000)
    ranking, length = [
        line for line in text.splitlines() if "length_generalization" in line
    ]
    assert "best `rnn-bahdanau` (95.0 ± 0.0 %)" in ranking
    assert (
        "tied with it" in ranking and "`rnn-luong-dot` (95.0 ± 7.1)" in ranking
    )
    assert "below it: `rnn-none` (62.5 ± 3.5)" in ranking
    degrades = length.split("degrades: ")[1].split(";")[0]
    holds = length.split("holds up")[1].split(";")[0]
    weak = length.split("too weak for the question: ")[1]
    assert "`rnn-none` (100.0 ± 0.0 -> 25.0 ± 7.1)" in degrades
    assert "rnn-bahdanau" in holds and "rnn-luong-dot" in holds
    assert "rnn-none" not in holds and "transformer-full" in weak
    assert "of 8 runs, 8 stopped by patience" in text
    # One seed: no difference is called established.
    one = [r for r in runs if r["seed"] == 0]
    rows = {
        "length_generalization": report.summarize(
            one, "length_generalization", variants
        )
    }
    assert "**One seed**" in report.reading(one, rows, variants)


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
