"""Decoding's cost for the `--mixer` comparison of the `language_model`
example: the milliseconds per generated character and the peak memory
of generating N characters, each measured in a fresh process.

    python -m examples.language_model.decoding CONFIG_JSON WEIGHTS N
    python -m examples.language_model.decoding CONFIG_JSON WEIGHTS N --idle

The child builds the model of `CONFIG_JSON` (the arguments of
`build_language_model`), loads `WEIGHTS` and, through a
`CausalLMGenerator` over its layers (XLA on TensorFlow), streams a
greedy completion of N characters after the example's first prompt in
pieces (`generate(..., stream=piece)`: the cache carried from piece to
piece, so the text is never held whole). It prints one JSON line: the
median milliseconds per character over the pieces after the first
(which compiles and reads the prompt), the characters generated and
its peak resident memory (`ru_maxrss`) and, on Linux, the peak of
the generation alone: the kernel's peak (`VmHWM`) reset just before
it (`/proc/self/clear_refs`), less the resident memory then (the model
loaded, the generator built): its compilation, caches and activations.
A process's start-up (TensorFlow's import and the model's build) peaks
above what generating a small model adds, so the difference of two
processes' peaks (`--idle`: the same process up to the generator,
nothing generated) reads 0; it is the fallback where `/proc` is not.
"""

import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = "\nIn the beginning"


def piece_size(length):
    """Characters per streamed piece: 256, fewer for short runs (at
    least 8 pieces of at least 8)."""
    return max(8, min(256, length // 8))


def _status_mib(field):
    """`VmHWM` / `VmRSS` of /proc/self/status in MiB, or None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _reset_peak():
    """Resets this process's peak resident memory (Linux >= 4.0: `5` to
    /proc/self/clear_refs); the resident MiB then, or None if it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_mib("VmRSS")


def child(config, weights, length, idle=False, jit_compile=True):
    """One decoding in this process (see the module docstring); returns
    the dict it prints. `jit_compile`: the generator's (XLA on
    TensorFlow)."""
    import resource

    import numpy as np

    from examples.language_model.model import build_language_model
    from examples.language_model.model import make_sampler
    from keras_attention.generation import CausalLMGenerator

    model, generator = build_language_model(**config)
    model.load_weights(weights)
    generator = CausalLMGenerator(
        generator.embedding,
        generator.blocks,
        generator.head,
        jit_compile=jit_compile,
    )
    vocabulary_size = config["vocabulary_size"]
    codes = [min(ord(c), vocabulary_size - 1) for c in PROMPT]
    times, done, before = [], 0, None
    if not idle:
        before = _reset_peak()
        piece = piece_size(length)
        start = time.perf_counter()
        for tokens in generator.generate(
            np.array(codes, "int32"),
            max_length=len(codes) + length,
            sampler=make_sampler("greedy"),
            stream=piece,
        ):
            now = time.perf_counter()
            new = np.asarray(tokens).shape[-1] - (len(codes) if not done else 0)
            done += new
            times.append((now - start) / max(new, 1))
            start = now
    steady = times[1:] or times
    peak = _status_mib("VmHWM") if before is not None else None
    return {
        "generation_peak_mib": None if peak is None else peak - before,
        "ms_per_token": 1e3 * statistics.median(steady) if steady else None,
        "characters": done,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        / 1024,
    }


def run_child(config, weights, length, idle=False, timeout=7200):
    """`child` in a fresh process (the current backend and environment);
    its dict. Raises `RuntimeError` with the child's stderr when it
    fails."""
    import keras

    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend())
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.language_model.decoding",
            json.dumps(config),
            weights,
            str(length),
        ]
        + (["--idle"] if idle else []),
        capture_output=True,
        text=True,
        env=env,
        cwd=os.path.abspath(root),
        timeout=timeout,
    )
    if out.returncode:
        raise RuntimeError(
            f"decoding {length} characters failed:\n{out.stderr[-3000:]}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(config, weights, length):
    """`{"ms_per_token", "characters", "peak_mib", "idle_rss_mib",
    "run_rss_mib"}`: a fresh process generating `length` characters and
    the peak memory of its generation (`generation_peak_mib`, see the
    module docstring; where /proc is not: its peak resident memory less
    an idle one's, the same model and generator, nothing generated),
    with both processes' peaks."""
    idle = run_child(config, weights, length, idle=True)
    run = run_child(config, weights, length)
    peak = run.get("generation_peak_mib")
    if peak is None:
        peak = run["peak_rss_mib"] - idle["peak_rss_mib"]
    return {
        "ms_per_token": run["ms_per_token"],
        "characters": run["characters"],
        "peak_mib": peak,
        "idle_rss_mib": idle["peak_rss_mib"],
        "run_rss_mib": run["peak_rss_mib"],
    }


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    config, weights, length = json.loads(argv[0]), argv[1], int(argv[2])
    result = child(config, weights, length, idle="--idle" in argv[3:])
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
