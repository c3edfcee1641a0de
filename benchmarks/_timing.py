"""Tiny shared helpers for the benchmark scripts in `benchmarks/`.

    from _timing import time_interleaved, peak_rss_mb, markdown_table

- `time_interleaved({"ours": f, "theirs": g}, repeats=10, warmup=2)` calls
  every function `warmup` times, then runs `repeats` rounds calling each
  function once per round (interleaved, in a rotating order so neither
  always runs first) and returns the median seconds per function.
  A function should block until its result is ready (e.g. convert the
  output to NumPy or call `.numpy()` on a scalar).
- `peak_rss_mb([sys.executable, "script.py", "--child", ...])` runs a
  command in a fresh process and returns its peak resident memory in MiB
  (from `resource.getrusage(RUSAGE_CHILDREN)` measured around that one
  child, so each configuration gets its own process). Raises
  `subprocess.CalledProcessError` (with the child's stderr) when the
  child fails, e.g. runs out of memory; see `try_peak_rss_mb`.
- `markdown_table(headers, rows)` formats a GitHub Markdown table.
- `machine_summary()` is one line naming the CPU, cores, memory and
  library versions, for the header of a table.
- `load_average()` is the 1, 5 and 15 minute load averages as a string
  (print it before and after a run: numbers for publishing need an idle
  machine, a 1-minute load below 0.5).

Run a benchmark script from the repository root or from `benchmarks/`;
scripts put this folder on `sys.path` themselves.
"""

import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time


def time_interleaved(fns, repeats=10, warmup=2):
    """Median wall time (seconds) of each function, run interleaved.

    Args:
        fns: dict name -> zero-argument callable (blocking).
        repeats: number of timed rounds (each calls every function once).
        warmup: untimed calls of every function before timing.

    Returns:
        dict name -> median seconds.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def peak_rss_mb(cmd_args, env=None, timeout=None):
    """Peak RSS in MiB of the command `cmd_args`, run as a fresh process.

    `RUSAGE_CHILDREN.ru_maxrss` is the max over all waited-for children, so
    the command runs from a fresh helper process whose only child it is.
    """
    helper = (
        "import resource, subprocess, sys\n"
        "subprocess.run(sys.argv[1:], check=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    # Own process group, so that a timeout also ends the measured command.
    proc = subprocess.Popen(
        [sys.executable, "-c", helper, *map(str, cmd_args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(
        proc.args, proc.returncode, stdout, stderr
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(
            done.returncode, cmd_args, done.stdout, done.stderr
        )
    kib = int(done.stdout.strip().splitlines()[-1])  # Linux: KiB.
    return kib / 1024.0


def try_peak_rss_mb(cmd_args, env=None, timeout=None):
    """`peak_rss_mb`, or None when the child fails (out of memory, ...)."""
    try:
        return peak_rss_mb(cmd_args, env=env, timeout=timeout)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None


def markdown_table(headers, rows):
    """A GitHub Markdown table; floats get 3 significant digits."""

    def fmt(x):
        if isinstance(x, float):
            return f"{x:.3g}"
        return "n/a" if x is None else str(x)

    def cell(x):  # A "|" inside a cell would split it.
        return fmt(x).replace("|", "\\|")

    lines = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(cell(x) for x in row) + " |")
    return "\n".join(lines)


def machine_summary():
    """One line: CPU model, cores, memory, Python and library versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = []
    for module in ("tensorflow", "jax", "torch", "keras", "keras_hub"):
        if module in sys.modules:
            versions.append(f"{module} {sys.modules[module].__version__}")
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, "
        f"Python {platform.python_version()}, " + ", ".join(versions)
    )


def load_average():
    """The 1, 5 and 15 minute load averages, e.g. "0.12, 0.30, 0.41"."""
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def max_rss_mb():
    """Peak RSS of the current process so far, MiB (for child scripts)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def matmul_peak_gflops(n=2048, repeats=5):
    """Measured float32 matmul throughput of this machine (GFLOP/s)."""
    import keras
    import numpy as np

    backend = keras.backend.backend()
    a = np.random.default_rng(0).normal(size=(n, n)).astype("float32")
    if backend == "jax":
        import jax

        a = jax.numpy.asarray(a)
        f = jax.jit(lambda a: a @ a)

        def run():
            return jax.block_until_ready(f(a))
    elif backend == "torch":
        import torch

        a = torch.from_numpy(a)

        def run():
            return float(torch.sum(a @ a))
    else:
        import tensorflow as tf

        a = tf.constant(a)
        f = tf.function(lambda: tf.reduce_sum(tf.matmul(a, a)))

        def run():
            return f().numpy()

    t = time_interleaved({"matmul": run}, repeats=repeats, warmup=2)["matmul"]
    return 2 * n**3 / t / 1e9
