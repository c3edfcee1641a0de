"""Tests of `python -m examples.language_model`: data, windows, cached
generation against full forward passes, a tiny end-to-end run (training,
export, serving in a fresh process), and tiny runs on the JAX and PyTorch
backends (`--backend`, each in its own process).

The whole module is `tf_only`: `tests/run.sh` runs it once, in its
TensorFlow part; the JAX and PyTorch runs below choose their backend in a
subprocess, so each backend's run happens exactly once per suite run.
"""

import io
import json
import math
import os
import subprocess
import sys

import example_output
import numpy as np
import pytest
import serving
import xla_flags

pytestmark = pytest.mark.tf_only

# Serving needs TensorFlow and TensorFlow Text's kernels only: keras,
# keras_hub and keras_attention cannot be imported in the serving process.
SERVE = """
    import json

    import tensorflow as tf

    served = tf.saved_model.load(sys.argv[1])
    prompts = tf.constant(json.loads(sys.argv[2]))
    answer({
        name: [
            s.decode("utf-8")
            for s in getattr(served, name)(prompts)["completion"].numpy()
        ]
        for name in json.loads(sys.argv[3])
    })
"""


def test_parse_bible_listing():
    from examples.data.kjv_bible import parse_bible_listing

    listing = io.StringIO(
        "\nGenesis 1\n\n"
        "  1 In the beginning God created the heaven and the earth.\n"
        "  2 And the earth was without form.\n\n"
        "1 Samuel 3\n\n"
        "  10 And the LORD came.\n"
    )
    assert list(parse_bible_listing(listing)) == [
        (
            "Genesis",
            1,
            1,
            "In the beginning God created the heaven and the earth.",
        ),
        ("Genesis", 1, 2, "And the earth was without form."),
        ("1 Samuel", 3, 10, "And the LORD came."),
    ]
    with pytest.raises(ValueError, match="Unexpected line"):
        list(parse_bible_listing(["  1 a verse before any chapter\n"]))


def test_shipped_bible_is_complete_and_split_by_chapter():
    from examples.data.kjv_bible import read_verses
    from examples.data.kjv_bible import split_of

    verses = list(read_verses())
    assert len(verses) == 31102
    assert verses[0][:3] == ("Genesis", 1, 1) and verses[-1][:3] == (
        "Revelation",
        22,
        21,
    )
    chapters = list(dict.fromkeys((b, c) for b, c, _, _ in verses))
    assert len(chapters) == 1189
    splits = [split_of(i) for i in range(len(chapters))]
    assert splits.count("test") == splits.count("validation") == 60


def test_char_windows_shift_targets_by_one():
    import tensorflow as tf

    from examples.common.text import character_tokenizer
    from examples.language_model.data import char_windows

    lines = tf.data.Dataset.from_tensor_slices(["abc", "de", "fgh"])
    tokenizer = character_tokenizer(lines)
    pairs = list(char_windows(lines, tokenizer, 4).as_numpy_iterator())
    stream = [ord(c) for c in "abc\nde\nfgh\n"]  # 11 characters: 2 windows of 5
    assert len(pairs) == 2
    for k, (x, y) in enumerate(pairs):
        window = stream[5 * k : 5 * k + 5]
        np.testing.assert_array_equal(x, window[:-1])
        np.testing.assert_array_equal(y, window[1:])


def test_bits_per_character():
    from examples.language_model.model import bits_per_character

    assert bits_per_character(math.log(2.0)) == pytest.approx(1.0)
    # A uniform guess over 128 characters costs 7 bits.
    assert bits_per_character(math.log(128)) == pytest.approx(7.0)


def _tiny_lm(window=None, vocabulary_size=40):
    import keras

    from examples.language_model.model import build_language_model

    keras.utils.set_random_seed(1)
    return build_language_model(
        vocabulary_size,
        24,
        hidden_dim=16,
        num_layers=2,
        num_heads=2,
        window=window,
    )


@pytest.mark.parametrize("window", [None, 3])
def test_cached_greedy_generation_matches_full_forward_passes(window):
    model, generator = _tiny_lm(window)
    prompts = np.zeros((2, 12), "int32")
    prompts[0, :3] = [10, 11, 12]
    prompts[1, :5] = [13, 14, 15, 16, 17]
    out, mask = (
        np.asarray(t) for t in generator.generate(prompts, sampler="greedy")
    )
    assert out.shape == (2, 12) and mask.all()
    np.testing.assert_array_equal(out[0, :3], prompts[0, :3])
    np.testing.assert_array_equal(out[1, :5], prompts[1, :5])
    # Each generated token is the argmax of a full (uncached) forward pass.
    logits = np.asarray(model(out))
    for row, start in [(0, 3), (1, 5)]:
        np.testing.assert_array_equal(
            out[row, start:], logits[row, start - 1 : -1].argmax(-1)
        )


def test_sliding_window_limits_what_a_position_sees():
    from keras_attention.layers import LocalSelfAttention

    model, generator = _tiny_lm(window=2)
    assert all(
        isinstance(b.self_attention, LocalSelfAttention)
        for b in generator.blocks
    )
    ids = np.arange(1, 13, dtype="int32")[None]
    changed = ids.copy()
    changed[0, 0] = 30  # far outside the window of the last position...
    last = np.asarray(model(ids))[0, -1]
    # ...through 2 layers of window 2 the last position sees 4 steps back.
    np.testing.assert_allclose(
        np.asarray(model(changed))[0, -1], last, atol=1e-5
    )
    changed[0, -2] = 30  # inside the window: the prediction changes
    assert np.abs(np.asarray(model(changed))[0, -1] - last).max() > 1e-4


def test_positional_bits_per_character_matches_the_keras_loss():
    import keras
    import tensorflow as tf

    from examples.language_model.model import bits_per_character
    from examples.language_model.model import positional_bits_per_character

    model, _ = _tiny_lm()
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 40, size=(5, 13)).astype("int32")
    batches = tf.data.Dataset.from_tensor_slices(
        (ids[:, :-1], ids[:, 1:])
    ).batch(2)
    bits = positional_bits_per_character(model, batches)
    assert bits.shape == (12,)
    # Reference: NumPy log-softmax of the logits, per position.
    logits = np.asarray(model(ids[:, :-1]), "float64")
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nats = -np.take_along_axis(log_p, ids[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(bits, nats.mean(0) / math.log(2.0), rtol=1e-5)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    np.testing.assert_allclose(
        bits.mean(),
        bits_per_character(float(loss(ids[:, 1:], logits))),
        rtol=1e-5,
    )


@pytest.fixture(scope="module")
def bible(tmp_path_factory):
    """Tiny shipped Bible splits and their character tokenizer."""
    from examples.common.text import character_tokenizer
    from examples.language_model import data as lm_data

    splits = lm_data.load_text_splits(
        "kjv_bible", data_dir=str(tmp_path_factory.mktemp("tfds")), tiny=True
    )
    return splits, character_tokenizer(splits[0])


TRAIN_LENGTH, GENERATION_LENGTH = 32, 64


def _bits_inside_and_beyond_training_length(bible, steps, **model_kwargs):
    """Quick-trains `steps` steps on windows of TRAIN_LENGTH characters;
    returns held-out teacher-forced bits/char at positions `< TRAIN_LENGTH`
    and at positions `TRAIN_LENGTH .. GENERATION_LENGTH - 1` of windows as
    long as generation.

    Steps: rotary (windowed) and ALiBi models extrapolate by construction,
    and 150 steps leave both far inside their thresholds (held-out bits
    2.9 and 3.3 inside, ratios 0.99 and 1.02, over 3 seeds); a learned
    table needs 500 to fail clearly (ratios 1.6-1.8 against 1.5; 1.43 after
    250: it fails beyond the training length once it relies on positions)."""
    import keras

    from examples.common.distributed import build_training_state
    from examples.language_model import data as lm_data
    from examples.language_model.model import build_language_model
    from examples.language_model.model import positional_bits_per_character

    (train, val, test), tokenizer = bible
    keras.utils.set_random_seed(0)
    model, _ = build_language_model(
        tokenizer.vocabulary_size(),
        GENERATION_LENGTH,
        hidden_dim=64,
        num_layers=2,
        num_heads=2,
        dropout=0.0,
        **model_kwargs,
    )
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    windows = lm_data.char_windows(train, tokenizer, TRAIN_LENGTH)
    train_batches = lm_data.batches(windows, 32, shuffle=True).repeat()
    # The optimizer's variables now: the first step is traced once.
    build_training_state(model, train_batches)
    model.fit(
        train_batches,
        steps_per_epoch=steps,
        epochs=1,
        verbose=0,
        shuffle=False,  # the pipeline shuffles (Keras would warn)
    )
    held_out = lm_data.char_windows(
        val.concatenate(test), tokenizer, GENERATION_LENGTH
    )
    bits = positional_bits_per_character(
        model, lm_data.batches(held_out, 64, shuffle=False)
    )
    return bits[:TRAIN_LENGTH].mean(), bits[TRAIN_LENGTH:].mean()


def test_positions_beyond_the_training_length_are_predicted_as_well(bible):
    # The example's setup: rotary positions, a window below the training
    # length (default 64 of 128; here 16 of 32).
    inside, beyond = _bits_inside_and_beyond_training_length(
        bible, 150, window=16
    )
    assert inside < 4.0  # it learned something (uniform: ~6 bits)
    assert beyond <= 1.5 * inside, (inside, beyond)


def test_learned_positions_fail_beyond_the_training_length(bible):
    # The old setup (issue 17): a learned table of GENERATION_LENGTH
    # positions, trained on TRAIN_LENGTH windows. The check above catches it.
    inside, beyond = _bits_inside_and_beyond_training_length(
        bible, 500, positions="learned"
    )
    assert inside < 4.0
    assert beyond > 1.5 * inside, (inside, beyond)


def test_alibi_extrapolates_beyond_the_training_length(bible):
    # Press et al. 2022's claim, on this example: full causal attention,
    # no position input, trained on TRAIN_LENGTH windows; held-out
    # positions up to twice as far are predicted about as well.
    inside, beyond = _bits_inside_and_beyond_training_length(
        bible, 150, positions="alibi"
    )
    assert inside < 4.0
    assert beyond <= 1.2 * inside, (inside, beyond)


@pytest.mark.parametrize("positions", ["sinusoidal", "alibi", "t5", "rope"])
@pytest.mark.parametrize("window", [None, 4])
def test_cached_greedy_generation_equals_the_full_pass(positions, window):
    # Every position kind through the generator's key/value cache: greedy
    # continuation = argmax of the uncached model, token by token.
    import keras

    from examples.language_model.model import build_language_model

    keras.utils.set_random_seed(1)
    model, generator = build_language_model(
        20, 16, hidden_dim=16, num_layers=2, num_heads=2, dropout=0.0,
        window=window, positions=positions,
    )  # fmt: skip
    if positions == "t5":  # one table for every block
        mods = {id(block.score_mod) for block in generator.blocks}
        assert len(mods) == 1
    prompt = np.array([[3, 7, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0]], "int32")
    tokens, _ = generator.generate(prompt, max_length=12)
    expected = prompt[:, :3]
    for _ in range(9):
        logits = keras.ops.convert_to_numpy(model(expected))
        expected = np.concatenate(
            [expected, logits[:, -1:].argmax(-1).astype("int32")], 1
        )
    np.testing.assert_array_equal(np.asarray(tokens), expected)


def test_generation_beyond_trained_distances_is_refused_at_start_up(capsys):
    from examples.language_model.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(
            ["--window", "0", "--sequence-length", "128", "--max-length", "256"]
        )
    assert (
        "--max-length 256 exceeds --sequence-length 128"
        in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        parse_args(["--window", "128", "--sequence-length", "128"])
    assert "--window 128 must be smaller" in capsys.readouterr().err
    args = parse_args(["--window", "0", "--max-length", "128"])
    assert (args.window, args.max_length) == (0, 128)
    assert (
        parse_args([]).window
        < parse_args([]).sequence_length
        < parse_args([]).max_length
    )


def test_unknown_positions_are_rejected():
    from examples.language_model.model import build_language_model

    with pytest.raises(ValueError, match="positions='absolute'"):
        build_language_model(10, 8, positions="absolute")


def test_random_samplers_complete_prompts():
    # greedy and beam: see the exported-model test below.
    import tensorflow as tf

    from examples.common.text import character_tokenizer
    from examples.language_model.export import LanguageModelServer

    tokenizer = character_tokenizer(tf.data.Dataset.from_tensor_slices(["abc"]))
    model, generator = _tiny_lm(vocabulary_size=tokenizer.vocabulary_size())
    samplers = ("top_k", "top_p")
    server = LanguageModelServer(model, generator, tokenizer, 16, samplers)
    prompts = np.array(
        ["ab", "", "a much longer prompt than max_length"], dtype=object
    )
    for name in samplers:
        out = getattr(server, name)(prompts)["completion"].numpy()
        assert out.shape == (3,), name
        for completion in out:
            text = completion.decode("utf-8")
            assert "\n" not in text and len(text) < 16, (name, text)


def test_exported_windowed_model_completes_prompts_of_any_length(tmp_path):
    # Issue 26, item 6: a windowed model's SavedModel reads a prompt far
    # longer than `max_length` (and than the model's training length, 24)
    # whole, through the rolling cache; each greedy completion is the
    # uncached model's argmax after the whole text, up to the end of the
    # line or `max_length` characters.
    import tensorflow as tf

    from examples.common.text import character_tokenizer
    from examples.language_model.export import export_language_model
    from examples.language_model.model import complete
    from examples.language_model.model import generates_any_length

    tokenizer = character_tokenizer(tf.data.Dataset.from_tensor_slices(["ab"]))
    vocabulary_size = tokenizer.vocabulary_size()
    model, generator = _tiny_lm(window=3, vocabulary_size=vocabulary_size)
    assert generates_any_length(generator)
    max_length = 6
    export_language_model(
        str(tmp_path / "saved_model"),
        model,
        generator,
        tokenizer,
        max_length,
        ("greedy",),
    )
    served = tf.saved_model.load(str(tmp_path / "saved_model"))
    prompts = ["ab", "", "The beginning " * 20 + "and the end"]
    out = served.greedy(tf.constant(prompts))["completion"].numpy()
    completions = [c.decode("utf-8") for c in out]
    assert completions == complete(
        generator, prompts, "greedy", max_length, vocabulary_size
    )
    for prompt, completion in zip(prompts, completions):
        text = [ord(c) for c in "\n" + prompt + completion]
        predicted = np.asarray(model(np.array([text])))[0].argmax(-1)
        start = len(prompt) + 1
        assert text[start:] == predicted[start - 1 : -1].tolist()
        assert len(completion) == max_length or predicted[-1] == ord("\n")


def test_unknown_sampler_is_rejected():
    from examples.language_model.model import make_sampler

    with pytest.raises(ValueError, match="sampler='nucleus'"):
        make_sampler("nucleus")


def test_help():
    out = subprocess.run(
        [sys.executable, "-m", "examples.language_model", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert out.returncode == 0, out.stderr
    assert "--window" in out.stdout and "--mixed-precision" in out.stdout


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    return example_output.quick_run(
        tmp_path_factory,
        "language_model",
        "--backend",
        "tensorflow",
        "--samplers",
        "greedy,beam",
        data_dir=True,
    )


def test_quick_run_prints_no_warnings(quick_run):
    # It used to print Keras's "`shuffle=True` was passed, but will be ignored",
    # "Your input ran out of data" (evaluate) and, five times, the SavedModel
    # export's INFO "Function `<lambda>` contains input name(s) 13752, ...
    # with unsupported characters".
    output = quick_run["output"]
    assert "backend: tensorflow" in output.log  # the run's own messages
    found = output.problems()
    assert not found, "\n".join(found)


def test_quick_run_learns(quick_run):
    losses = quick_run["history"]["loss"]
    assert len(losses) == 2 and losses[-1] < losses[0]
    # Better than a uniform guess over the characters of the text.
    assert 0 < quick_run["test_bits_per_character"] < math.log2(128)
    # Also reported on windows of the generation length (48 characters).
    bits = quick_run["positional_bits_per_character"]
    assert bits.shape == (48,)
    assert quick_run["generation_length_bits_per_character"] == pytest.approx(
        bits.mean()
    )


def test_exported_model_answers_like_the_python_model(quick_run):
    prompts = list(quick_run["prompts"]) + ["Then"]
    samplers = ["greedy", "beam"]
    expected = {
        name: [
            c.decode("utf-8")
            for c in getattr(quick_run["server"], name)(
                np.array(prompts, dtype=object)
            )["completion"].numpy()
        ]
        for name in samplers
    }
    served = serving.answer_in_fresh_process(
        SERVE,
        args=[
            quick_run["export_path"],
            json.dumps(prompts),
            json.dumps(samplers),
        ],
        blocked_modules=serving.BLOCKED_MODULES + serving.KERAS_MODULES,
        tensorflow_text_ops=True,
    )
    assert served == expected
    assert expected["greedy"][:3] == quick_run["completions"]["greedy"]


def test_generate_only_streams_text_from_the_trained_weights(quick_run, capsys):
    # Issue 26: no training, the weights of the quick run, a text longer
    # than anything the cache holds (window 32 in --quick), streamed.
    from examples.language_model import __main__ as language_model

    run_dir = os.path.dirname(quick_run["export_path"])
    data_dir = os.path.join(os.path.dirname(run_dir), "tfds")
    prompt = "And the LORD said unto Moses,"
    with example_output.captured() as output:
        result = language_model.main(
            [
                "--backend",
                "tensorflow",
                "--quick",
                "--generate-only",
                "--max-length",
                "400",
                "--prompt",
                prompt,
                "--output-dir",
                run_dir,
                "--data-dir",
                data_dir,
            ]
        )
    printed = capsys.readouterr().out
    assert result["characters"] == 400 - len(prompt) - 1
    assert printed.startswith(prompt + result["head"][:50])
    assert printed.endswith(result["tail"] + "\n")
    assert "characters/s, peak memory" in output.log
    assert result["peak_memory_mib"] > 0


def test_generate_only_without_weights_says_what_to_do(tmp_path):
    from examples.language_model import __main__ as language_model

    with pytest.raises(SystemExit, match="Train first"):
        language_model.main(
            [
                "--backend",
                "tensorflow",
                "--quick",
                "--generate-only",
                "--output-dir",
                str(tmp_path / "nothing"),
            ]
        )


def test_quick_run_writes_the_attention_explorer(quick_run):
    path = quick_run["explorer"]
    assert os.path.basename(path) == "attention.html"
    html = open(path, encoding="utf-8").read()
    # Self-contained (no network), with the attention of each block.
    assert "http://" not in html and "https://" not in html
    assert html.count("self_attention") >= 1


def test_quick_run_reports_its_backend_and_step_time(quick_run):
    assert quick_run["backend"] == "tensorflow"
    assert quick_run["step_ms"] > 0


def test_python_completions_match_the_served_ones(quick_run):
    # Greedy and beam are deterministic: `model.complete` (NumPy around the
    # generator, what the JAX and PyTorch runs use) answers like the
    # SavedModel's in-graph pipeline.
    from examples.language_model.model import complete

    server = quick_run["server"]
    prompts = ["ab", "", "a much longer prompt than the generation length"]
    for name in ("greedy", "beam"):
        served = [
            c.decode("utf-8")
            for c in getattr(server, name)(np.array(prompts, dtype=object))[
                "completion"
            ].numpy()
        ]
        ours = complete(
            server.generator,
            prompts,
            server.samplers[name],
            server.max_length,
            server.tokenizer.vocabulary_size(),
        )
        assert ours == served, name


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def _run_example(args, env_backend=None, timeout=240, extra_env=None):
    env = dict(os.environ)
    env.pop("KERAS_BACKEND", None)
    if env_backend:
        env["KERAS_BACKEND"] = env_backend
    env.update(extra_env or {})
    # Two pytest workers share the cores: one OpenMP thread per process
    # keeps PyTorch's threads from waiting on each other (10x slower).
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "examples.language_model", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


# Runs `main(argv)` for each argv of a JSON list, one after the other in
# this one process, each run's output after a "=== run K" line (stdout and
# stderr) and, when it raised, "=== run K failed" (stdout).
RUNS = """
import json
import sys
import traceback

from examples.language_model.__main__ import main

for k, argv in enumerate(json.loads(sys.argv[1])):
    for stream in (sys.stdout, sys.stderr):
        print(f"=== run {k}", file=stream, flush=True)
    try:
        main(argv)
    except BaseException:
        traceback.print_exc()
        print(f"=== run {k} failed", flush=True)
"""


def _run_examples(argvs, timeout, extra_env):
    """`python -m examples.language_model` with each argv of `argvs`, all
    in one process (one start-up of Python, TensorFlow, Keras and the
    backend); one `CompletedProcess` per run, with that run's output and
    returncode 1 where it raised."""
    env = dict(os.environ)
    env.pop("KERAS_BACKEND", None)
    env.update(extra_env)
    env["OMP_NUM_THREADS"] = "1"  # as in `_run_example`
    out = subprocess.run(
        [sys.executable, "-c", RUNS, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )

    def part(text, k):
        return text.split(f"=== run {k}\n", 1)[-1].split(
            f"=== run {k + 1}\n", 1
        )[0]

    runs = []
    for k, argv in enumerate(argvs):
        stdout = part(out.stdout, k)
        failed = out.returncode or f"=== run {k} failed" in stdout
        if f"=== run {k}\n" not in out.stdout:  # never started
            stdout, failed = "", True
        runs.append(
            subprocess.CompletedProcess(
                argv, int(bool(failed)), stdout, part(out.stderr, k)
            )
        )
    return runs


def _quick_args(backend, output_dir, data_dir):
    return [
        "--backend",
        backend,
        "--quick",
        "--samplers",
        "greedy,top_k",
        "--output-dir",
        str(output_dir),
        "--data-dir",
        data_dir,
    ]


@pytest.fixture(scope="module")
def shared_data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds_backends"))


@pytest.fixture(scope="module")
def jax_quick_runs(shared_data_dir, tmp_path_factory):
    """Both JAX quick runs, in one process with 4 virtual CPU devices
    (fixed before JAX starts): the plain run (`--quick`, on the first
    device: no distribution), then the run with `--distribution model`
    (it sets Keras's global distribution, so it comes last). `{"plain":
    (CompletedProcess, output_dir), "model": CompletedProcess}`."""
    pytest.importorskip("jax")
    tmp = tmp_path_factory.mktemp("jax_runs")
    plain = _quick_args("jax", tmp / "plain", shared_data_dir)
    model_parallel = [
        "--backend",
        "jax",
        "--distribution",
        "model",
        "--quick",
        "--epochs",
        "1",
        "--samplers",
        "greedy",
        "--output-dir",
        str(tmp / "model"),
        "--data-dir",
        shared_data_dir,
    ]
    runs = _run_examples(
        [plain, model_parallel],
        timeout=480,
        extra_env={"XLA_FLAGS": xla_flags.xla_flags("jax", devices=4)},
    )
    return {"plain": (runs[0], tmp / "plain"), "model": runs[1]}


@pytest.mark.slow(
    "the example end to end on JAX and PyTorch in subprocesses (66 s): the "
    "library's layers on those backends are the JAX and PyTorch parts'"
)
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_quick_run_on_another_backend(
    backend, shared_data_dir, tmp_path, request
):
    # TensorFlow: `quick_run` above (in this process, with --backend).
    pytest.importorskip(backend)
    if backend == "jax":  # in one process with the run on 4 devices
        out, output_dir = request.getfixturevalue("jax_quick_runs")["plain"]
    else:
        output_dir = tmp_path / "run"
        out = _run_example(
            _quick_args(backend, output_dir, shared_data_dir),
            extra_env={"XLA_FLAGS": xla_flags.xla_flags(backend)},
        )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    # "backend: torch | train loss per epoch: 4.2099 3.4739 | 56.1 ms/step"
    (report,) = [s for s in lines if s.startswith("backend: ")]
    fields = report.split(" | ")
    assert fields[0] == f"backend: {backend}"
    losses = [float(v) for v in fields[1].split(": ")[1].split()]
    assert len(losses) == 2 and losses[1] < losses[0], report
    assert losses[1] < math.log(128)  # below a uniform guess
    # The SavedModel is TensorFlow-only: skipped, and said so.
    assert any(
        s.startswith("SavedModel export skipped: it needs the TensorFlow")
        for s in lines
    ), out.stdout[-2000:]
    assert not (output_dir / "saved_model").exists()
    # The attention explorer is written on every backend.
    assert (output_dir / "attention.html").exists()
    # Cached generation with each sampler: a line per prompt.
    from examples.language_model.__main__ import PROMPTS

    completions = []
    for name in ("greedy", "top_k"):
        start = lines.index(f"[{name}]")
        shown = lines[start + 1 : start + 1 + len(PROMPTS)]
        assert [s.split("|")[0].strip() for s in shown] == list(PROMPTS)
        completions += [s.split("|", 1)[1] for s in shown]
    assert any(c.strip() for c in completions), out.stdout[-2000:]


def test_conflicting_keras_backend_is_refused():
    out = _run_example(["--backend", "torch"], env_backend="jax", timeout=120)
    assert out.returncode == 2
    assert "--backend torch conflicts with KERAS_BACKEND=jax" in out.stderr
    assert "Traceback" not in out.stderr


def test_backend_other_than_the_imported_keras_is_refused(monkeypatch, capsys):
    from examples.language_model.__main__ import parse_args

    monkeypatch.delenv("KERAS_BACKEND")
    with pytest.raises(SystemExit):
        parse_args(["--backend", "jax"])
    err = capsys.readouterr().err
    assert "Keras is already imported with the tensorflow backend" in err
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    assert parse_args(["--backend", "tensorflow"]).backend == "tensorflow"
    assert parse_args([]).backend is None


def test_distribution_needs_the_jax_backend(monkeypatch, capsys):
    from examples.language_model.__main__ import parse_args

    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    with pytest.raises(SystemExit):
        parse_args(["--distribution", "model"])
    err = capsys.readouterr().err
    assert "--distribution model uses the Keras distribution API" in err
    assert "Received: backend='tensorflow'" in err
    assert parse_args([]).distribution == "none"


@pytest.mark.slow(
    "the example's --distribution model on 4 JAX devices (31 s, with the "
    "plain JAX run it shares a process with): the library's layers, "
    "layout map and generation under ModelParallel on 4 devices are "
    "tests/distribution/test_layout_map.py's"
)
def test_quick_run_with_model_parallel_on_four_devices(jax_quick_runs):
    # 4 virtual CPU devices (fixed before JAX starts), a 2x2 mesh, the
    # weights sharded by keras_attention.distribution.get_layout_map
    # (`--quick --epochs 1 --samplers greedy`: see `jax_quick_runs`).
    out = jax_quick_runs["model"]
    assert out.returncode == 0, out.stderr[-3000:]
    (report,) = [s for s in out.stdout.splitlines() if s.startswith("backend")]
    assert report.startswith("backend: jax | ")
    assert report.endswith("| distribution: model (4 devices)"), report
    assert "[greedy]" in out.stdout


# --pack / --documents padded (issue 25, item 4)
def _document_windows(documents, lines=("abc", "de", "fghijklm")):
    import tensorflow as tf

    from examples.common.text import character_tokenizer
    from examples.language_model.data import document_windows

    lines = tf.data.Dataset.from_tensor_slices(list(lines))
    tokenizer = character_tokenizer(lines)
    return list(
        document_windows(lines, tokenizer, 6, documents).as_numpy_iterator()
    )


def test_packed_windows_have_no_padding_and_number_their_documents():
    rows = _document_windows("packed")
    # "\nabc\n\nde\n\nfghijklm\n": 19 characters, 2 full rows of 7 (+ 5 left)
    assert len(rows) == 2
    stream = [ord(c) for c in "\nabc\n\nde\n\nfghijklm\n"]
    for k, (inputs, targets, _) in enumerate(rows):
        row = stream[7 * k : 7 * k + 7]
        np.testing.assert_array_equal(inputs["token_ids"], row[:-1])
        np.testing.assert_array_equal(targets, row[1:])
        assert (inputs["token_ids"] != 0).all()  # no padding
    segments = np.concatenate([r[0]["segment_ids"] for r in rows])
    np.testing.assert_array_equal(
        segments, [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    )


def test_packed_loss_weight_is_zero_at_document_starts():
    for inputs, targets, weights in _document_windows("packed"):
        segments = inputs["segment_ids"]
        # target t is input t + 1: a new document there weighs 0
        starts = np.append(segments[1:] != segments[:-1], False)
        assert weights.dtype == np.float32
        # the row's last target: its input's segment is not in the row
        np.testing.assert_array_equal(weights[:-1] == 0, starts[:-1])
    (_, targets, weights), *_ = _document_windows("packed")
    assert targets[4] == ord("\n") and weights[4] == 0  # "\nde\n" starts


def test_padded_windows_hold_one_document_and_mask_the_padding():
    rows = _document_windows("padded")
    # "\nabc\n", "\nde\n", "\nfghijklm\n" (two rows): nothing dropped
    assert len(rows) == 4
    for inputs, targets, weights in rows:
        np.testing.assert_array_equal(weights, targets != 0)
    np.testing.assert_array_equal(rows[0][0], [10, 97, 98, 99, 10, 0])
    np.testing.assert_array_equal(rows[3][0], [108, 109, 10, 0, 0, 0])


@pytest.mark.parametrize("positions", ["rope", "learned", "alibi"])
def test_packed_documents_do_not_attend_to_each_other(positions):
    from examples.language_model.model import build_language_model
    from examples.language_model.model import packed_language_model

    model, _ = build_language_model(
        60,
        32,
        hidden_dim=16,
        num_layers=2,
        num_heads=2,
        window=4,
        positions=positions,
    )
    packed = packed_language_model(model)
    rng = np.random.default_rng(0)
    a, b = rng.integers(1, 60, (1, 9)), rng.integers(1, 60, (1, 7))
    logits = np.asarray(
        packed(
            {
                "token_ids": np.concatenate([a, b], 1),
                "segment_ids": np.array([[3] * 9 + [4] * 7]),
            }
        )
    )
    # the logits of each document are those it gets alone
    np.testing.assert_allclose(logits[:, :9], np.asarray(model(a)), atol=1e-5)
    np.testing.assert_allclose(logits[:, 9:], np.asarray(model(b)), atol=1e-5)


def test_pack_is_documents_packed():
    from examples.language_model.__main__ import parse_args

    assert parse_args(["--pack"]).documents == "packed"
    assert parse_args([]).documents == "stream"
    assert parse_args(["--documents", "padded"]).documents == "padded"


def test_quick_packed_run_reports_tokens_per_second_and_padding(
    tmp_path, capsys
):
    from examples.language_model import __main__ as language_model

    with example_output.captured() as output:
        results = language_model.main(
            [
                "--backend",
                "tensorflow",
                "--quick",
                "--pack",
                "--samplers",
                "greedy",
                "--output-dir",
                str(tmp_path / "run"),
                "--data-dir",
                str(tmp_path / "tfds"),
            ]
        )
    throughput = results["throughput"]
    assert throughput["documents"] == "packed"
    assert throughput["padding"] == 0.0
    assert throughput["tokens_per_second"] > 0
    out = capsys.readouterr().out
    assert "training windows: packed |" in out and "padding 0.0 %" in out
    assert not output.problems(), "\n".join(output.problems())
    with open(tmp_path / "run" / "throughput.json") as f:
        assert json.load(f) == throughput


# --context-parallel N (issue 40, item 5)
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backend", "tensorflow"], "Received: backend='tensorflow'"),
        ([], "Received: backend='tensorflow'"),  # KERAS_BACKEND's
        (["--distribution", "data"], "--distribution 'data'"),
        (["--dropout", "0.1"], "--dropout 0.1"),
        (["--generate-only"], "--generate-only True"),
        (["--sequence-length", "100"], "multiple of --context-parallel 8"),
        (["--context-parallel", "1"], "N >= 2 devices. Received: 1"),
    ],
)
def test_context_parallel_refuses_at_start_up(argv, message, capsys):
    from examples.language_model.__main__ import parse_args

    backend = [] if "backend" in message else ["--backend", "jax"]
    with pytest.raises(SystemExit):
        parse_args(["--context-parallel", "8", *backend, *argv])
    assert message in capsys.readouterr().err


def test_context_parallel_picks_jax_its_devices_and_length(monkeypatch):
    import argparse

    from examples.language_model import context_parallel

    # No backend chosen, JAX not started yet (as `python -m` starts).
    monkeypatch.delenv("KERAS_BACKEND")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    for quick, length in ((False, 8 * 128), (True, 8 * 64)):
        args = argparse.Namespace(
            context_parallel=8, backend=None, distribution="none",
            generate_only=False, dropout=0.0, sequence_length=None,
            quick=quick,
        )  # fmt: skip
        context_parallel.check_args(argparse.ArgumentParser(), args)
        assert (args.backend, args.sequence_length) == ("jax", length)
    assert os.environ["XLA_FLAGS"] == (
        "--xla_cpu_enable_fast_math=false "
        "--xla_force_host_platform_device_count=8"
    )


@pytest.mark.slow(
    "the example's --context-parallel 8 end to end on 8 virtual JAX devices "
    "(46-94 s on the loaded machine): ContextParallel's fit against one "
    "device and the memory per device are "
    "tests/distribution/test_ring_attention.py's, the start-up checks the "
    "two tests above"
)
def test_quick_run_with_context_parallel_on_eight_devices(
    shared_data_dir, tmp_path
):
    pytest.importorskip("jax")
    out = _run_example(
        [
            "--context-parallel",
            "8",
            "--quick",
            "--samplers",
            "greedy",
            "--output-dir",
            str(tmp_path / "run"),
            "--data-dir",
            shared_data_dir,
        ],
        timeout=600,
        # The suite's flags; the example adds the device count itself.
        extra_env={"XLA_FLAGS": xla_flags.xla_flags("jax")},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    (report,) = [s for s in lines if s.startswith("backend")]
    assert report.startswith("backend: jax | ")
    assert report.endswith("| distribution: context-parallel 8 (8 devices)")
    losses = [float(v) for v in report.split(" | ")[1].split(": ")[1].split()]
    assert len(losses) == 2 and losses[1] < losses[0], report
    # Sequences of 8 x 64 characters; XLA's memory analysis per device.
    memory = {
        s.strip().split("  ")[0]: float(s.split()[-4])
        for s in lines
        if "MiB per device" in s
    }
    sharded = memory["sharded, T=512 over 8 devices"]
    assert 0 < 4 * sharded < memory["one device, T=512"], memory
    assert sharded < 1.5 * memory["one device, T=64"], memory
    assert "[greedy]" in lines
