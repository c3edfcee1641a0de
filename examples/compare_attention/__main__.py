"""Which attention should I use? Trains every attention variant of the
library on the same tasks, data, budget and seeds, and writes a report.

    python -m examples.compare_attention                  # ~30 CPU-minutes
    python -m examples.compare_attention --full           # longer, 3 seeds
    python -m examples.compare_attention --variants rnn-none,rnn-bahdanau
    python -m examples.compare_attention --seeds 0,1,2 --steps 800
    python -m examples.compare_attention --quick          # smoke test

Variants (`--variants`): an RNN encoder-decoder (bidirectional GRU,
`EncoderBridge`, `AttentionRNNDecoder`) with no attention (the bridge
state only), Bahdanau (plain / normalized), Luong dot / general / concat,
Luong local-m / local-p; a transformer encoder-decoder with full, local
(`window_size`) and grouped-query attention. Tasks (`--tasks`): the
`translate` example's dates, and the same dates hidden in long noisy
sentences (`long_dates`). Every variant trains `--steps` Adam steps of the
same batches (per seed) with the same learning rate, no tuning per
variant; the report (`<out>/report.md`, PNG plots, `results.json`) gives
the held-out exact match (mean ± standard deviation over the seeds),
accuracy by source length, parameters, training time per step, greedy
inference latency per sequence and peak memory.
"""

import argparse
import datetime
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

DEFAULTS = {  # steps, seeds, test examples, model size
    "default": (300, "0", 400, "default"),
    "full": (3000, "0,1,2", 2000, "full"),
    "quick": (4, "0", 16, "quick"),
}


def parse_args(argv=None):
    from examples.compare_attention import models
    from examples.compare_attention import tasks

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
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--full",
        action="store_true",
        help="bigger models, 3000 steps, seeds 0,1,2, the whole test split",
    )
    size.add_argument(
        "--quick",
        action="store_true",
        help="tiny data, models and steps (the test's smoke run)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(models.VARIANTS),
        help="comma-separated subset of: " + ", ".join(models.VARIANTS),
    )
    parser.add_argument(
        "--tasks",
        default=",".join(tasks.TASKS),
        help="comma-separated subset of: " + ", ".join(tasks.TASKS),
    )
    parser.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds (default: 0; --full: 0,1,2)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps per variant, task and seed (default: 300; "
        "--full: 3000)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument(
        "--window",
        type=int,
        default=8,
        help="Luong local half-width D and the transformer's window_size",
    )
    parser.add_argument(
        "--max-test",
        type=int,
        default=None,
        help="held-out examples per task (default: 400; --full: 2000)",
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
    mode = "full" if args.full else "quick" if args.quick else "default"
    steps, seeds, max_test, args.size = DEFAULTS[mode]
    args.steps = args.steps or steps
    args.max_test = args.max_test or max_test
    args.seeds = [int(s) for s in (args.seeds or seeds).split(",")]
    args.variants = parse_choices(
        parser, "--variants", args.variants, models.VARIANTS
    )
    args.tasks = parse_choices(parser, "--tasks", args.tasks, tasks.TASKS)
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

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self._start)

    return StepTimer()


def run_one(task, variant, seed, args):
    """Trains and evaluates `variant` on `task` with `seed`; returns the
    measurements (a dict of `report.summarize`'s inputs)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from examples.common import text
    from examples.compare_attention.models import build_variant
    from examples.translate.__main__ import translate_all
    from examples.translate.export import StringTranslator

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
        model = translator.model
        model.compile(
            optimizer=keras.optimizers.Adam(args.learning_rate, clipnorm=1.0),
            loss=keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, ignore_class=0
            ),
            jit_compile=False,
        )
        timer = _step_timer(keras)
        started = time.perf_counter()
        history = model.fit(
            train,
            epochs=1,
            steps_per_epoch=args.steps,
            callbacks=[timer],
            verbose=0,
            shuffle=False,  # the pipeline shuffles (Keras would warn)
        )
        train_seconds = time.perf_counter() - started
        serve = StringTranslator(
            translator,
            task.source_tokenizer,
            task.target_tokenizer,
            task.max_source_length,
        ).translate
        sources = [s for s, _ in task.test_pairs]
        references = [t for _, t in task.test_pairs]
        hypotheses = translate_all(serve, sources, batch_size=200)
    # Latency: one sentence at a time, after a warm-up call (tracing).
    serve(tf.constant(sources[:1]))
    latencies = []
    for sentence in sources[1 : 1 + args.latency_samples]:
        begin = time.perf_counter()
        serve(tf.constant([sentence])).numpy()
        latencies.append(time.perf_counter() - begin)
    # Steady-state steps: drop the first ones (graph tracing).
    steady = timer.times[min(5, len(timer.times) - 1) :]
    hits = [int(h == r) for h, r in zip(hypotheses, references)]
    result = {
        "task": task.name,
        "variant": variant,
        "seed": seed,
        "exact_match": 100.0 * sum(hits) / max(len(hits), 1),
        "params": int(model.count_params()),
        "train_ms_per_step": 1000.0 * float(np.median(steady)),
        "train_seconds": round(train_seconds, 1),
        "final_loss": float(history.history["loss"][-1]),
        "latency_ms": 1000.0 * float(np.median(latencies)),
        "peak_mib": round(memory.peak_mib, 1),
        "source_lengths": [len(s) for s in sources],
        "hits": hits,
        "examples": [
            {"source": s, "reference": r, "output": h}
            for s, r, h in list(zip(sources, references, hypotheses))[:3]
        ],
    }
    logger.info(
        "%-11s %-18s seed %d: exact match %5.1f%%, loss %.3f, %.0f s",
        task.name,
        variant,
        seed,
        result["exact_match"],
        result["final_loss"],
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
    from examples.compare_attention.tasks import LONG_MAX_LENGTH

    sizes = ", ".join(f"{k}={v}" for k, v in SIZES[args.size].items())
    budget = (
        "This is the default budget, sized to finish in about 30 "
        "CPU-minutes on 2 cores: each variant trains far fewer steps than it "
        "would need to converge, so the numbers rank how fast each "
        "variant learns under the same small budget, not how well it "
        "ends up; `--full` trains longer."
        if args.size == "default"
        else "Budget: see the command."
    )
    return "\n\n".join(
        [
            "# Attention variants compared",
            f"Command: `{command}`",
            f"Machine: {machine()}.",
            f"Date: {datetime.date.today().isoformat()}; wall time of the "
            f"runs: {seconds / 60:.1f} min in all.",
            f"Budget: {args.steps} Adam steps of batch {args.batch_size} "
            f"(learning rate {args.learning_rate}, clipnorm 1) per "
            f"variant, task and seed; seeds {args.seeds}; model size "
            f"`{args.size}` ({sizes}); local window {args.window}; "
            f"{args.max_test} held-out examples per task. {budget}",
            "Tasks: `dates` is the `translate` example's default data "
            "(`multilingual_dates`, human-written dates in eight languages "
            "to ISO 8601); `long_dates` hides the same dates in random "
            f"filler words, sources up to {LONG_MAX_LENGTH} characters.",
            "Columns: held-out exact match (greedy decoding; mean ± "
            "standard deviation over the seeds when there are several); "
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
    keys = ("steps", "size", "batch_size", "learning_rate", "window")
    return {k: getattr(args, k) for k in keys} | {"max_test": args.max_test}


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
    from examples.compare_attention.tasks import load_task

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
                        task = load_task(
                            name, quick=args.quick, max_test=args.max_test
                        )
                    started = time.time()
                    saved = run_one(task, variant, seed, args)
                    saved["seconds"] = round(time.time() - started, 1)
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
    )
    print(f"Report: {paths['report']}")
    print("Plots:", *paths["plots"], sep="\n  ")
    return paths


if __name__ == "__main__":
    main()
