"""Linear attention (chunked) against our blockwise causal softmax
attention: a training step's time and peak memory from T = 4,096 to
T = 32,768.

    python benchmarks/linear_attention.py                  # TensorFlow
    KERAS_BACKEND=jax python benchmarks/linear_attention.py
    KERAS_BACKEND=torch python benchmarks/linear_attention.py
    ... --lengths 4096 8192 --decay per_head --chunk-size 64 --jit
    python benchmarks/linear_attention.py --quick          # tiny, seconds

Ours: `keras_attention.ops.linear_attention(q, k, v, decay=...,
chunk_size=64)` (its chunked form; the decay per step, as gated linear
attention's gate, by default). Theirs: `dot_product_attention(q, k, v,
causal=True, implementation="blockwise")`, the package's
memory-efficient causal softmax attention. Batch 1, 8 heads of 64
(`--heads`, `--key-dim`), float32, random inputs.

A training step: the forward pass and the gradients of `sum(output *
cotangent)` with respect to q, k, v (and the decay), under
`tf.function` (`--jit`: XLA), `jax.jit`, or eagerly on PyTorch. Times
are medians of interleaved runs after a warm-up
(`benchmarks/_timing.py`); "x 4k" is a time over its own time at the
first length (linear growth: 8 from 4,096 to 32,768). Peak memory: the
peak resident memory of a fresh process running two steps of one
(implementation, length), less that of an idle process that builds the
same inputs (`--no-memory` skips it; on a GPU, RSS does not show the
device's memory). The load average is printed before and after: publish
only from an idle machine.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402
from _timing import time_interleaved  # noqa: E402
from _timing import try_peak_rss_mb  # noqa: E402
from keras import ops  # noqa: E402

import keras_attention as ka  # noqa: E402

BACKEND = keras.backend.backend()
DEFAULT = dict(lengths=[4096, 8192, 16384, 32768], heads=8, key_dim=64)
QUICK = dict(lengths=[128, 256], heads=2, key_dim=16)
IMPLEMENTATIONS = ("linear", "softmax")


def inputs(length, heads, key_dim, decay, seed=0):
    """`[q, k, v, cotangent]` plus the decay (None, `(heads,)` or `(1, T,
    heads)`), float32 NumPy arrays."""
    rng = np.random.default_rng(seed)
    q, k, v, cot = rng.normal(size=(4, 1, length, heads, key_dim))
    arrays = [x.astype("float32") for x in (q, k, v, cot)]
    if decay == "per_head":
        arrays.append(np.log(rng.uniform(0.9, 1.0, (heads,)), dtype="float32"))
    elif decay == "per_step":
        a = np.log(rng.uniform(0.9, 1.0, (1, length, heads)))
        arrays.append(a.astype("float32"))
    return arrays


def attention(impl, chunk_size):
    """`fn(q, k, v, *decay)` of one implementation."""
    if impl == "linear":

        def fn(q, k, v, *decay):
            return ka.ops.linear_attention(
                q,
                k,
                v,
                decay=decay[0] if decay else None,
                chunk_size=chunk_size,
            )

        return fn

    def softmax(q, k, v, *decay):
        return ka.ops.dot_product_attention(
            q, k, v, causal=True, implementation="blockwise"
        )

    return softmax


def training_step(fn, jit):
    """`step(q, k, v, cot, *decay) -> a float` (blocking): the output and
    the gradients of `sum(output * cot)` w.r.t. q, k, v and the decay."""
    if BACKEND == "jax":
        import jax

        def loss(q, k, v, cot, *decay):
            return ops.sum(fn(q, k, v, *decay) * cot)

        def grads(q, k, v, cot, *decay):
            args = (0, 1, 2) + tuple(range(4, 4 + len(decay)))
            return jax.grad(loss, args)(q, k, v, cot, *decay)

        compiled = jax.jit(grads)
        return lambda *a: float(compiled(*a)[0][0, 0, 0, 0])
    if BACKEND == "torch":
        import torch

        def step(q, k, v, cot, *decay):
            args = [x.detach().requires_grad_(True) for x in (q, k, v) + decay]
            out = fn(*args[:3], *args[3:])
            # The softmax ignores the decay: no gradient for it there.
            grads = torch.autograd.grad(
                ops.sum(out * cot), args, allow_unused=True
            )
            return float(grads[0][0, 0, 0, 0])

        return step
    import tensorflow as tf

    @tf.function(jit_compile=bool(jit), autograph=False)
    def compiled(q, k, v, cot, *decay):
        args = [q, k, v, *decay]
        with tf.GradientTape() as tape:
            tape.watch(args)
            loss = tf.reduce_sum(fn(*args[:3], *args[3:]) * cot)
        return tape.gradient(loss, args)

    return lambda *a: float(compiled(*a)[0][0, 0, 0, 0])


def _child(impl, length, args):
    """One implementation (or `idle`: the inputs only), two steps."""
    tensors = [
        ops.convert_to_tensor(a)
        for a in inputs(length, args.heads, args.key_dim, args.decay)
    ]
    if impl == "idle":
        return
    step = training_step(attention(impl, args.chunk_size), args.jit)
    for _ in range(2):
        step(*tensors)


def peak_memory_mb(impl, length, args):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        impl,
        str(length),
        "--heads",
        str(args.heads),
        "--key-dim",
        str(args.key_dim),
        "--decay",
        args.decay,
        "--chunk-size",
        str(args.chunk_size),
    ] + (["--jit"] if args.jit else [])
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    return try_peak_rss_mb(cmd, env=env, timeout=3600)


def memory_row(length, args):
    """A row of peak memory only (`--memory-only`): no timing, each
    implementation of `args.memory_impls` in its own fresh process."""
    idle = peak_memory_mb("idle", length, args)
    memory = {}
    for impl in args.memory_impls:
        peak = peak_memory_mb(impl, length, args)
        ok = None not in (peak, idle)
        memory[impl] = f"{peak - idle:.0f}" if ok else "failed"
    return (
        [length]
        + ["n/a"] * 5
        + [
            memory.get("linear", "n/a"),
            memory.get("softmax", "n/a"),
        ]
    )


def rows(args):
    """One row per length: times (ms), growth, ratio, memory (MiB)."""
    table, first = [], {}
    for length in args.lengths:
        if args.memory_only:
            table.append(memory_row(length, args))
            print(markdown_table(HEADERS, table[-1:]).splitlines()[-1])
            continue
        arrays = inputs(length, args.heads, args.key_dim, args.decay)
        tensors = [ops.convert_to_tensor(a) for a in arrays]
        fns = {}
        for impl in IMPLEMENTATIONS:
            step = training_step(attention(impl, args.chunk_size), args.jit)
            fns[impl] = lambda s=step: s(*tensors)
            if not np.isfinite(fns[impl]()):
                raise AssertionError(f"{impl}: non-finite gradients")
        times = time_interleaved(fns, repeats=args.repeats, warmup=args.warmup)
        for impl in IMPLEMENTATIONS:
            first.setdefault(impl, times[impl])
        memory = {}
        if not args.no_memory:
            idle = peak_memory_mb("idle", length, args)
            for impl in IMPLEMENTATIONS:
                peak = peak_memory_mb(impl, length, args)
                ok = None not in (peak, idle)
                memory[impl] = f"{peak - idle:.0f}" if ok else "failed"
        table.append(
            [
                length,
                f"{times['linear'] * 1e3:.1f}",
                f"{times['linear'] / first['linear']:.2f}",
                f"{times['softmax'] * 1e3:.1f}",
                f"{times['softmax'] / first['softmax']:.2f}",
                f"{times['softmax'] / times['linear']:.2f}",
                memory.get("linear", "n/a"),
                memory.get("softmax", "n/a"),
            ]
        )
        print(markdown_table(HEADERS, table[-1:]).splitlines()[-1], flush=True)
    return table


HEADERS = [
    "T",
    "linear ms",
    "x first",
    "softmax ms",
    "x first",
    "softmax/linear",
    "linear MiB",
    "softmax MiB",
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--key-dim", type=int, default=None)
    parser.add_argument(
        "--decay", choices=["none", "per_head", "per_step"], default="per_step"
    )
    parser.add_argument("--chunk-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--jit", action="store_true", help="TF: XLA")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="peak memory only, no timing (see --memory-impls)",
    )
    parser.add_argument(
        "--memory-impls",
        nargs="+",
        choices=IMPLEMENTATIONS,
        default=list(IMPLEMENTATIONS),
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--markdown", default=None)
    parser.add_argument(
        "--child", nargs=2, metavar=("IMPL", "T"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else DEFAULT)
    for key in ("lengths", "heads", "key_dim"):
        if getattr(args, key) is None:
            setattr(args, key, sizes[key])
    if args.child:
        _child(args.child[0], int(args.child[1]), args)
        return None
    how = {"tensorflow": "tf.function", "jax": "jax.jit"}.get(BACKEND, "eager")
    how += " + XLA" if args.jit and BACKEND == "tensorflow" else ""
    lines = [
        machine_summary(),
        f"Load average before: {load_average()}",
        f"\nTraining step (forward + backward), {BACKEND} ({how}), batch 1, "
        f"{args.heads} heads of {args.key_dim}, float32; linear: decay "
        f"{args.decay}, chunk_size {args.chunk_size}; softmax: blockwise, "
        "causal. Memory: peak RSS above an idle process.\n",
    ]
    print("\n".join(lines), flush=True)
    lines.append(markdown_table(HEADERS, rows(args)))
    print(lines[-1], flush=True)
    lines.append(f"\nLoad average after: {load_average()}")
    print(lines[-1])
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
