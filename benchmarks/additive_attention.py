"""Additive (Bahdanau) scores: ours (chunked, recomputing backward) vs the
direct broadcast of `(batch, Tq, Tv, units)` (what `AdditiveAttention` with
`Dense` projections computes). One training step: scores, then the
gradient of their sum of squares w.r.t. projected queries, keys and `v`.

Times: interleaved, after warm-up, medians of `--repeats` (TensorFlow,
`tf.function`). Peak memory: a separate process per configuration and
method (peak RSS of the whole process, runtime included).

    python benchmarks/additive_attention.py [--markdown FILE] [--repeats 5]
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# (batch, Tq, Tv, units); the last is the shape (the broadcast
# would need ~17.5 GB there: ours only).
CONFIGS = [(4, 64, 256, 256), (4, 128, 512, 512), (4, 256, 1024, 1024)]
BROADCAST_LIMIT = 2**28  # elements of (b, Tq, Tv, u) we let the broadcast try


def make_step(method, b, i, j, u):
    import numpy as np
    import tensorflow as tf

    from keras_attention.ops.additive import additive_scores
    from keras_attention.ops.additive import additive_scores_reference

    fn = additive_scores if method == "ours" else additive_scores_reference
    rng = np.random.default_rng(0)
    q = tf.constant(rng.normal(size=(b, i, u)).astype("float32") * 0.1)
    k = tf.constant(rng.normal(size=(b, j, u)).astype("float32") * 0.1)
    v = tf.constant(rng.normal(size=(u,)).astype("float32"))

    @tf.function
    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            scores = fn(q, k, v)
            loss = tf.reduce_sum(scores**2)
        return [scores] + tape.gradient(loss, [q, k, v])

    step.get_concrete_function(q, k, v)
    return lambda: [t.numpy() for t in step(q, k, v)]


def peak_in_subprocess(method, config):
    """Peak RSS (MiB, whole process) of one step in a fresh process."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _timing import try_peak_rss_mb

    cmd = [sys.executable, os.path.abspath(__file__), "--run", method]
    peak = try_peak_rss_mb(cmd + [str(c) for c in config])
    return float("nan") if peak is None else peak


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--markdown",
        metavar="FILE",
        help="also write the table as Markdown to FILE",
    )
    parser.add_argument("--memory-only", action="store_true")
    parser.add_argument("--run", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:  # child process of the memory measurement
        make_step(args.run[0], *map(int, args.run[1:]))()
        return

    import numpy as np

    rows = []
    for config in CONFIGS:
        b, i, j, u = config
        fits = b * i * j * u <= BROADCAST_LIMIT
        methods = ["ours", "broadcast"] if fits else ["ours"]
        runs = {m: make_step(m, *config) for m in methods}
        results = {} if args.memory_only else {m: runs[m]() for m in methods}
        if fits and results:  # same result first
            for a, e in zip(results["ours"], results["broadcast"]):
                np.testing.assert_allclose(a, e, rtol=1e-3, atol=1e-3)
        times = {
            m: [] if not args.memory_only else [float("nan")] for m in methods
        }
        for _ in range(0 if args.memory_only else args.repeats if fits else 1):
            for m in methods:  # interleaved
                start = time.perf_counter()
                runs[m]()
                times[m].append(time.perf_counter() - start)
        del runs, results
        med = {m: statistics.median(t) for m, t in times.items()}
        peak = {m: peak_in_subprocess(m, config) for m in methods}
        rows.append((config, med, peak))

    header = (
        "| batch, Tq, Tv, units | broadcast tensor | ours time (s) | "
        "broadcast time (s) | time ratio | ours peak (MiB) | "
        "broadcast peak (MiB) | memory ratio |"
    )
    lines = [header, "|" + "---|" * 8]
    for (b, i, j, u), med, peak in rows:
        tensor = f"{b * i * j * u * 4 / 2**30:.2f} GiB"
        if "broadcast" in med:
            lines.append(
                f"| {b}, {i}, {j}, {u} | {tensor} | {med['ours']:.3f} | "
                f"{med['broadcast']:.3f} | "
                f"{med['ours'] / med['broadcast']:.2f} | "
                f"{peak['ours']:.0f} | {peak['broadcast']:.0f} | "
                f"{peak['ours'] / max(peak['broadcast'], 1):.2f} |"
            )
        else:
            lines.append(
                f"| {b}, {i}, {j}, {u} | {tensor} | {med['ours']:.3f} | "
                f"not run | - | {peak['ours']:.0f} | not run (> 17 GB) | - |"
            )
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
