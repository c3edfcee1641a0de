"""Which attention should I use? Trains every attention variant of the
library on the same tasks and data until its validation exact match stops
improving, over several seeds, and writes a report.

    python -m examples.compare_attention            # subset, 10-20 min
    python -m examples.compare_attention --full     # all, about 2 hours
    python -m examples.compare_attention --variants rnn-none,rnn-bahdanau
    python -m examples.compare_attention --quick    # smoke test

Variants (`--variants`): an RNN encoder-decoder (bidirectional GRU,
`EncoderBridge`, `AttentionRNNDecoder`) with no attention (the bridge
state only), Bahdanau (plain / normalized), Luong dot / general / concat,
Luong local-m / local-p; a transformer encoder-decoder with full, local
(`window_size`) and grouped-query attention, ALiBi, a T5 relative bias or
soft-capped scores. Tasks (`--tasks`): the `translate` example's dates,
the same dates hidden in long noisy sentences (`long_dates`), and length
generalisation (`length_generalization`: trained on noisy sources up to
40 characters, tested up to 96). Every variant trains with the same
batches (per seed) and learning rate, no tuning per variant, until its
validation exact match has not improved for `--patience` evaluations
(one every `--eval-every` steps; at most `--max-steps` steps), and is
tested with its best weights. The report (`<out>/report.md`, PNG plots,
`results.json`) gives the held-out exact match (mean ± standard
deviation over the seeds), accuracy by source length, the steps trained,
parameters, training time per step, greedy inference latency per
sequence and peak memory, and a reading generated from the numbers.

The default run is a subset (`DEFAULT_VARIANTS` on `DEFAULT_TASKS`, 3
seeds); `--full` runs every variant on every task. Both train the same
models with the same budget, so a `--full` run after a default one (same
`--out`) reuses its runs.
"""

import argparse
import datetime
import functools
import gc
import json
import logging
import os
import platform
import shlex
import sys
import time

from examples.common import HelpFormatter
from examples.common import parse_choices
from examples.common import setup_runtime

logger = logging.getLogger("examples")

# The default run's subset: the no-attention baseline, the two classic
# attentions and the transformer, on the length-generalisation task (the
# Bahdanau et al. Fig. 2 question), 3 seeds: 10-20 minutes on 2 idle
# cores (estimated from CPU time, see the docs page).
DEFAULT_VARIANTS = (
    "rnn-none",
    "rnn-bahdanau",
    "rnn-luong-general",
    "transformer-full",
)
DEFAULT_TASKS = ("length_generalization",)

# The budget of each mode: model size, seeds, early stopping (an
# evaluation every `eval_every` steps, `patience` evaluations without a
# better validation exact match, at most `max_steps` steps), validation
# and test examples. The default run and `--full` share it.
BUDGETS = {
    "default": dict(
        size="default",
        seeds="0,1,2",
        max_steps=1500,
        min_steps=800,
        eval_every=100,
        patience=3,
        max_validation=300,
        max_test=600,
    ),
    "quick": dict(
        size="quick",
        seeds="0,1",
        max_steps=30,
        min_steps=0,
        eval_every=5,
        patience=2,
        max_validation=16,
        max_test=24,
    ),
}
BUDGETS["full"] = BUDGETS["default"]


def parse_args(argv=None):
    from examples.compare_attention import options

    parser = argparse.ArgumentParser(
        prog="python -m examples.compare_attention",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "--out",
        default="runs/compare_attention",
        help="output directory: report.md, plots, results.json",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--full",
        action="store_true",
        help="every variant on every task (default: a subset, see above)",
    )
    mode.add_argument(
        "--quick",
        action="store_true",
        help="tiny data, models and budget, 2 seeds (the test's run)",
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated subset of: "
        + ", ".join(options.VARIANTS)
        + " (default: "
        + ",".join(DEFAULT_VARIANTS)
        + "; --full: all)",
    )
    parser.add_argument(
        "--tasks",
        default=None,
        help="comma-separated subset of: "
        + ", ".join(options.TASKS)
        + " (default: "
        + ",".join(DEFAULT_TASKS)
        + "; --full: all)",
    )
    budget = parser.add_argument_group("budget (default and --full / --quick)")
    budget.add_argument(
        "--seeds", default=None, help="comma-separated seeds (0,1,2 / 0,1)"
    )
    budget.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="cap on the training steps of one run (1500 / 30)",
    )
    budget.add_argument(
        "--min-steps",
        type=int,
        default=None,
        help="no early stopping before this step (800 / 0)",
    )
    budget.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="steps between validation evaluations (100 / 5)",
    )
    budget.add_argument(
        "--patience",
        type=int,
        default=None,
        help="evaluations without a better validation exact match "
        "before stopping (3 / 2)",
    )
    budget.add_argument(
        "--max-validation",
        type=int,
        default=None,
        help="validation examples per task (300 / 16)",
    )
    budget.add_argument(
        "--max-test",
        type=int,
        default=None,
        help="held-out test examples per task (600 / 24)",
    )
    budget.add_argument("--batch-size", type=int, default=64)
    budget.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument(
        "--window",
        type=int,
        default=8,
        help="Luong local half-width D and the transformer's window_size",
    )
    parser.add_argument(
        "--latency-samples",
        type=int,
        default=8,
        help="single sentences timed for the latency column",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write the report from the runs already saved under "
        "<out>/runs (skipping missing ones), train nothing",
    )
    args = parser.parse_args(argv)
    args.mode = "full" if args.full else "quick" if args.quick else "default"
    for key, value in BUDGETS[args.mode].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.seeds = [int(s) for s in str(args.seeds).split(",")]
    every = args.full
    args.variants = parse_choices(
        parser,
        "--variants",
        args.variants
        or ",".join(options.VARIANTS if every else DEFAULT_VARIANTS),
        options.VARIANTS,
    )
    args.tasks = parse_choices(
        parser,
        "--tasks",
        args.tasks or ",".join(options.TASKS if every else DEFAULT_TASKS),
        options.TASKS,
    )
    if args.quick:
        args.latency_samples = min(args.latency_samples, 2)
    return args


class PeakMemory:
    """Peak memory of TensorFlow's allocator while the block runs, in MiB:
    the largest total size of the live tensors (weights, activations kept
    for the gradients, optimizer slots, generation caches), on `GPU:0`
    when there is a GPU, else on `CPU:0` (`get_memory_info`, its peak
    reset at the start). NaN where the allocator does not keep stats."""

    def __init__(self):
        import tensorflow as tf

        self._tf = tf
        gpu = bool(tf.config.list_logical_devices("GPU"))
        self._device = "GPU:0" if gpu else "CPU:0"
        self.peak_mib = float("nan")

    def __enter__(self):
        try:
            self._tf.config.experimental.reset_memory_stats(self._device)
        except (ValueError, RuntimeError):
            pass
        return self

    def __exit__(self, *exc):
        try:
            info = self._tf.config.experimental.get_memory_info(self._device)
            self.peak_mib = info["peak"] / 2**20
        except (ValueError, RuntimeError):
            pass
        return False


def _step_timer(keras):
    class StepTimer(keras.callbacks.Callback):
        """Wall time of each training step (the first ones trace)."""

        def __init__(self):
            super().__init__()
            self.times = []
            self.cpu_times = []  # process CPU time, all threads

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter(), time.process_time()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self._start[0])
            self.cpu_times.append(time.process_time() - self._start[1])

    return StepTimer()


class Patience:
    """Early stopping on a score to maximize (no Keras): `update(step,
    score)` after each evaluation returns whether to stop, and why in
    `reason`: "patience" after `patience` evaluations in a row without a
    better score than the best so far, once `step` has reached
    `min_steps` (models often sit on a plateau before they start to
    learn), "perfect" when the score reaches
    `perfect` (it cannot improve), "cap" when `step` reaches `max_steps`.

    A score is a number or a tuple compared in order: the study's is
    `(exact match, character accuracy)`, so that a model still learning
    characters while its exact match stays at 0 is not stopped; `perfect`
    applies to the first element. `best_step` and `best` say which
    evaluation to restore; `curve` keeps every `(step, *score)`."""

    def __init__(self, patience, max_steps, perfect=100.0, min_steps=0):
        self.patience = patience
        self.max_steps = max_steps
        self.min_steps = min_steps
        self.perfect = perfect
        self.best = None
        self.best_step = 0
        self.waited = 0
        self.curve = []
        self.reason = None

    def improves(self, score):
        """Whether `score` is better than the best so far."""
        return self.best is None or _as_tuple(score) > _as_tuple(self.best)

    def update(self, step, score):
        self.curve.append((step, *_as_tuple(score)))
        if self.improves(score):
            self.best, self.best_step, self.waited = score, step, 0
        else:
            self.waited += 1
        if _as_tuple(self.best)[0] >= self.perfect:
            self.reason = "perfect"
        elif self.waited >= self.patience and step >= self.min_steps:
            self.reason = "patience"
        elif step >= self.max_steps:
            self.reason = "cap"
        return self.reason is not None


def _as_tuple(score):
    return tuple(score) if isinstance(score, (tuple, list)) else (score,)


def _early_stopping(keras, patience, evaluate, eval_every):
    class EarlyStopping(keras.callbacks.Callback):
        """Every epoch (`eval_every` steps): `evaluate()` (validation
        exact match), keep the best weights, stop per `patience`
        (a `Patience`); the best weights are restored at the end."""

        def __init__(self):
            super().__init__()
            self.patience = patience
            self.eval_seconds = 0.0
            self.eval_cpu_seconds = 0.0  # process CPU time, all threads
            self._best_weights = None

        def on_epoch_end(self, epoch, logs=None):
            started = time.perf_counter(), time.process_time()
            score = evaluate()
            self.eval_seconds += time.perf_counter() - started[0]
            self.eval_cpu_seconds += time.process_time() - started[1]
            step = (epoch + 1) * eval_every
            if self.patience.improves(score):
                self._best_weights = self.model.get_weights()
            if self.patience.update(step, score):
                self.model.stop_training = True
            logger.debug("step %d: validation exact match %.1f", step, score)

        def on_train_end(self, logs=None):
            if self._best_weights is not None:
                self.model.set_weights(self._best_weights)

    return EarlyStopping()


def exact_match(serve, pairs, batch_size=200):
    """Greedy translations of `pairs`' sources and their hits (0/1)."""
    from examples.translate.__main__ import translate_all

    sources = [s for s, _ in pairs]
    hypotheses = translate_all(serve, sources, batch_size=batch_size)
    return hypotheses, [int(h == r) for h, (_, r) in zip(hypotheses, pairs)]


def character_accuracy(hypotheses, references):
    """Share (%) of the references' characters that the hypotheses have
    at the same place (a hypothesis too short misses the rest)."""
    right = sum(
        sum(a == b for a, b in zip(h, r))
        for h, r in zip(hypotheses, references)
    )
    return 100.0 * right / max(sum(len(r) for r in references), 1)


# The last variant's compiled model and serving function, reused by its
# next seed: `(key, translator, serve, optimizer state at its start)`.
_PREPARED = []


def _restart(model, fresh, optimizer_start):
    """Puts `model` (compiled and traced for an earlier seed) where a new
    run starts: `fresh`'s initial weights and random streams (a model of
    the same variant just built from the run's seed), the optimizer's
    state as it was before any step."""
    variables, fresh_variables = model.variables, fresh.variables
    if [v.shape for v in variables] != [v.shape for v in fresh_variables]:
        raise ValueError("the fresh model's variables differ")
    for variable, value in zip(variables, fresh_variables):
        variable.assign(value)
    for variable, value in zip(model.optimizer.variables, optimizer_start):
        variable.assign(value)


def run_one(task, variant, seed, args):
    """Trains `variant` on `task` with `seed` until early stopping,
    evaluates its best weights; returns the measurements (a dict of
    `report.summarize`'s inputs).

    The seeds of one variant share its compiled model: each run starts
    from the weights a model built from its seed has, with a fresh
    optimizer, and the training step and the serving function are traced
    once per variant, not once per seed."""
    import keras
    import numpy as np
    import tensorflow as tf

    from examples.common import text
    from examples.common.distributed import build_training_state
    from examples.compare_attention.models import build_variant
    from examples.translate.export import StringTranslator

    key = (task.name, variant, id(task), repr(_config(args)))
    prepared = _PREPARED[0] if _PREPARED and _PREPARED[0][0] == key else None
    if prepared is None:
        _PREPARED.clear()
        keras.backend.clear_session()
        gc.collect()
    keras.utils.set_random_seed(seed)
    _, start_id, end_id = text.special_ids(task.target_tokenizer)
    train = task.batches(args.batch_size, seed).repeat()
    memory = PeakMemory()
    with memory:
        translator = build_variant(
            variant,
            source_vocabulary_size=task.source_tokenizer.vocabulary_size(),
            target_vocabulary_size=task.target_tokenizer.vocabulary_size(),
            max_source_length=task.max_source_length + 1,
            max_target_length=task.max_target_length,
            start_id=start_id,
            end_id=end_id,
            size=args.size,
            window=args.window,
        )
        if prepared is None:
            model = translator.model
            model.compile(
                optimizer=keras.optimizers.Adam(
                    args.learning_rate, clipnorm=1.0
                ),
                loss=keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True, ignore_class=0
                ),
                jit_compile=False,
            )
            # The optimizer's variables now, not while `fit` traces its
            # first step (which would then be traced twice).
            build_training_state(model, train)
            serve = StringTranslator(
                translator,
                task.source_tokenizer,
                task.target_tokenizer,
                task.max_source_length,
            ).translate
            optimizer_start = [v.numpy() for v in model.optimizer.variables]
            _PREPARED.append((key, translator, serve, optimizer_start))
        else:
            fresh = translator
            _, translator, serve, optimizer_start = prepared
            model = translator.model
            _restart(model, fresh.model, optimizer_start)
            del fresh

        def validation_score():
            hypotheses, hits = exact_match(serve, task.validation_pairs)
            references = [t for _, t in task.validation_pairs]
            return (
                100.0 * sum(hits) / max(len(hits), 1),
                character_accuracy(hypotheses, references),
            )

        timer = _step_timer(keras)
        stopper = _early_stopping(
            keras,
            Patience(args.patience, args.max_steps, min_steps=args.min_steps),
            validation_score,
            args.eval_every,
        )
        started = time.perf_counter(), time.process_time()
        history = model.fit(
            train,
            epochs=max(args.max_steps // args.eval_every, 1),
            steps_per_epoch=args.eval_every,
            callbacks=[timer, stopper],
            verbose=0,
            shuffle=False,  # the pipeline shuffles (Keras would warn)
        )
        train_seconds = time.perf_counter() - started[0]
        train_cpu_seconds = time.process_time() - started[1]
        hypotheses, hits = exact_match(serve, task.test_pairs)
    sources = [s for s, _ in task.test_pairs]
    # Latency: one sentence at a time, after a warm-up call (tracing).
    serve(tf.constant(sources[:1]))
    latencies = []
    for sentence in sources[1 : 1 + args.latency_samples]:
        begin = time.perf_counter()
        serve(tf.constant([sentence])).numpy()
        latencies.append(time.perf_counter() - begin)
    # Steady-state steps: drop the first ones (graph tracing).
    steady = timer.times[min(5, len(timer.times) - 1) :]
    patience = stopper.patience
    result = {
        "task": task.name,
        "variant": variant,
        "seed": seed,
        "exact_match": 100.0 * sum(hits) / max(len(hits), 1),
        "validation_exact_match": patience.best[0],
        "validation_character_accuracy": patience.best[1],
        "steps": len(timer.times),
        "best_step": patience.best_step,
        "stopped": patience.reason or "cap",
        "validation_curve": patience.curve,
        "params": int(model.count_params()),
        "train_ms_per_step": 1000.0 * float(np.median(steady)),
        "train_cpu_ms_per_step": 1000.0
        * float(np.median(timer.cpu_times[len(timer.times) - len(steady) :])),
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(stopper.eval_seconds, 1),
        # Process CPU time (all threads): on a loaded machine wall times
        # stretch, CPU time much less; the study's time estimates use it.
        "train_cpu_seconds": round(train_cpu_seconds, 1),
        "eval_cpu_seconds": round(stopper.eval_cpu_seconds, 1),
        "final_loss": float(history.history["loss"][-1]),
        "latency_ms": 1000.0 * float(np.median(latencies)),
        "peak_mib": round(memory.peak_mib, 1),
        "source_lengths": [len(s) for s in sources],
        "hits": hits,
        "train_max_length": task.train_max_length,
        "examples": [
            {"source": s, "reference": r, "output": h}
            for (s, r), h in list(zip(task.test_pairs, hypotheses))[:3]
        ],
    }
    logger.info(
        "%-11s %-18s seed %d: exact match %5.1f%% (validation %5.1f%%), "
        "%d steps (best %d, stopped: %s), %.0f s",
        task.name,
        variant,
        seed,
        result["exact_match"],
        result["validation_exact_match"],
        result["steps"],
        result["best_step"],
        result["stopped"],
        train_seconds,
    )
    return result


def machine():
    """One line: CPU model and count, GPU if any, library versions."""
    import keras
    import tensorflow as tf

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpus = tf.config.list_logical_devices("GPU")
    device = f"{len(gpus)} GPU(s)" if gpus else "no GPU"
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {device}; Python "
        f"{platform.python_version()}, TensorFlow {tf.__version__}, Keras "
        f"{keras.__version__} ({keras.backend.backend()} backend)"
    )


def header(args, command, seconds):
    from examples.compare_attention.models import SIZES
    from examples.compare_attention.tasks import LENGTH_MIN_LENGTH
    from examples.compare_attention.tasks import LENGTH_TEST_MAX
    from examples.compare_attention.tasks import LENGTH_TRAIN_MAX
    from examples.compare_attention.tasks import LONG_MAX_LENGTH

    sizes = ", ".join(f"{k}={v}" for k, v in SIZES[args.size].items())
    return "\n\n".join(
        [
            "# Attention variants compared",
            f"Command: `{command}`",
            f"Machine: {machine()}.",
            f"Date: {datetime.date.today().isoformat()}; wall time of the "
            f"runs: {seconds / 60:.1f} min in all.",
            f"Budget: Adam (learning rate {args.learning_rate}, clipnorm "
            f"1), batches of {args.batch_size}, until the validation exact "
            f"match ({args.max_validation} examples of the training "
            "distribution, greedy decoding; ties broken by the character "
            "accuracy, so that a model whose exact match is still 0 but "
            "which is learning goes on) has not improved for "
            f"{args.patience} evaluations in a row, one evaluation every "
            f"{args.eval_every} steps, not before step {args.min_steps}, "
            f"at most {args.max_steps} steps (the cap); training also "
            "stops at 100 % validation exact match. "
            "The weights of the best evaluation are restored and tested. "
            f"Seeds {args.seeds}; model size `{args.size}` ({sizes}); "
            f"local window {args.window}; {args.max_test} held-out test "
            "examples per task.",
            "Tasks: `dates` is the `translate` example's default data "
            "(`multilingual_dates`, human-written dates in eight languages "
            "to ISO 8601); `long_dates` hides the same dates in random "
            f"filler words, sources up to {LONG_MAX_LENGTH} characters; "
            "`length_generalization` hides them the same way but trains "
            f"and validates on sources of {LENGTH_MIN_LENGTH}-"
            f"{LENGTH_TRAIN_MAX} characters only and tests on sources of "
            f"up to {LENGTH_TEST_MAX} (lengths uniform).",
            "Columns: held-out exact match (greedy decoding; mean ± "
            "standard deviation over the seeds); steps: training steps "
            "run (mean over seeds) and where the best validation score "
            "was (mean), with the runs that reached the cap; "
            "trainable and non-trainable parameters; training time per "
            "step (median over the steps after the first 5, which trace "
            "the graph; median over seeds); inference latency per "
            "sequence (one sentence per call, greedy, after a warm-up "
            "call; median); peak memory: the peak of TensorFlow's "
            "allocator (`tf.config.experimental.get_memory_info`, reset "
            "before each variant) while the variant builds, trains and "
            "evaluates: the largest total of live tensors (weights, "
            "optimizer slots, activations kept for the gradients, "
            "generation caches), not the process's resident memory; "
            "maximum over seeds.",
        ]
    )


def _config(args):
    """What a saved run must match to be reused."""
    keys = (
        "size",
        "max_steps",
        "min_steps",
        "eval_every",
        "patience",
        "max_validation",
        "max_test",
        "batch_size",
        "learning_rate",
        "window",
    )
    return {k: getattr(args, k) for k in keys}


def _run_path(args, task, variant, seed):
    directory = os.path.join(args.out, "runs")
    os.makedirs(directory, exist_ok=True)
    return os.path.join(directory, f"{task}-{variant}-{seed}.json")


def _load_run(path, args):
    """A run saved by an earlier (or a parallel) invocation with the same
    budget, or None: a killed study resumes where it stopped, and the
    tasks can run in separate processes (`--tasks`)."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        run = json.load(f)
    return run if run.get("config") == _config(args) else None


@functools.lru_cache(maxsize=1)
def _load_task(name, quick, max_test, max_validation):
    """`tasks.load_task`, once per process for the same arguments (its
    data are fixed: a later `main` in the same process reuses them)."""
    from examples.compare_attention.tasks import load_task

    return load_task(
        name, quick=quick, max_test=max_test, max_validation=max_validation
    )


def main(argv=None):
    args = parse_args(argv)
    setup_runtime(
        argparse.Namespace(
            mixed_precision="off",
            strategy="default",
            logical_cpus=0,
            jit_compile=False,
            seed=args.seeds[0],
        )
    )
    import tensorflow as tf

    from examples.compare_attention import report

    tf.get_logger().setLevel(logging.ERROR)
    runs = []
    for name in args.tasks:
        task = None
        for variant in args.variants:
            for seed in args.seeds:
                path = _run_path(args, name, variant, seed)
                saved = _load_run(path, args)
                if saved is None and not args.report_only:
                    if task is None:
                        task = _load_task(
                            name, args.quick, args.max_test, args.max_validation
                        )
                    started = time.time(), time.process_time()
                    saved = run_one(task, variant, seed, args)
                    saved["seconds"] = round(time.time() - started[0], 1)
                    saved["cpu_seconds"] = round(
                        time.process_time() - started[1], 1
                    )
                    saved["config"] = _config(args)
                    with open(path, "w") as f:
                        json.dump(saved, f)
                if saved is not None:
                    runs.append(saved)
    command = "python -m examples.compare_attention " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    paths = report.write(
        args.out,
        runs,
        args.tasks,
        args.variants,
        header(args, command.strip(), sum(r["seconds"] for r in runs)),
        max_steps=args.max_steps,
    )
    print(f"Report: {paths['report']}")
    print("Plots:", *paths["plots"], sep="\n  ")
    return paths


if __name__ == "__main__":
    main()
