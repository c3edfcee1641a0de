"""Top-k sparse attention (`ops.topk_attention`, DeepSeek Sparse
Attention's attention step) against our dense causal attention: one
causal forward + backward, its time and peak memory, at T = 16,384 with
top-k 256 and 4 heads of 64 (issue 56's figure: under 1.5 GiB and at
least 8x faster than dense), and the growth from T = 4,096 to 32,768 at
a fixed k (about linear).

    python benchmarks/topk_attention.py                       # TensorFlow
    KERAS_BACKEND=jax python benchmarks/topk_attention.py
    KERAS_BACKEND=torch python benchmarks/topk_attention.py --lengths 8192 16384
    python benchmarks/topk_attention.py --lengths 16384 --repeats 3
    python benchmarks/topk_attention.py --dense-implementation dense
    python benchmarks/topk_attention.py --kv-heads 1          # MQA only
    python benchmarks/topk_attention.py --quick               # tiny, seconds

Inputs: batch 1, `--heads` query heads and, for each of `--kv-heads`
(default: `--heads` and 1), that many key/value heads, of `--head-dim`,
float32, random. Why both: issue 56's figure names 4 heads, read here
as 4 key/value heads (multi-head), which moves the most memory: each
query gathers `k` keys and values of every key/value head, about 8.6 GB
per pass at T = 16,384 and k = 256, and a CPU's gather is bound by
memory, not arithmetic. DeepSeek-V3.2 runs DSA in MLA's MQA mode: one
key/value head (the latent) shared by every query head, so the gather
is `--heads` times smaller and each gathered row serves every head (1
key/value head). The dense comparator has the same key/value heads.

A floor (a roofline by bytes): the forward gathers `T * k * g` rows of
keys and values (8.6 GB at T = 16,384, k = 256, 4 heads of 64; 2.1 GB
with one key/value head), and the backward gathers them again and adds
as many rows into dK and dV: about three times that in rows read or
written at random. 8x faster than dense (about 0.5 s) then needs some
50 GB/s of random rows with 4 key/value heads, 15 GB/s with one; a
2-core VM served about 14 GB/s of streaming copy and 2.5-5 GB/s of
random 256-512 byte rows (2026-12-06, shared): the goal is out of reach
there for 4 key/value heads, and with one the floor is near 1.3 s.

Indices: for query `i`, `--top-k` distinct earlier positions spread
over `[0, i]` with random jitter (every earlier key when `i < k`; -1
pads), made in NumPy before timing. "topk":
`topk_attention(q, k, v, indices, causal=True)`; "dense":
`dot_product_attention(q, k, v, causal=True)` with
`--dense-implementation` (default None: the automatic choice, the
blockwise path on a CPU with TensorFlow or JAX, the fused kernels on
PyTorch and on GPUs; "dense" keeps the `(T, T)` scores). The step is the
output and the gradients of `sum(out * cotangent)` w.r.t. q, k and v,
compiled (TensorFlow: `tf.function`, XLA with `--jit`; JAX: `jax.jit`;
PyTorch: eager, its hand-written backward a `torch.autograd.Function`),
timed interleaved after a warm-up (medians of
`--repeats`). Dense runs are skipped above `--dense-max-length`.

Memory: each (path, length) runs in a fresh process; its peak RSS above
an idle process that imports the backend and builds the same inputs
(the "baseline") is the attention's (CPU). On a GPU the device's peak
(`--device`) is printed too: TensorFlow's `get_memory_info`, JAX's
`memory_stats`, torch's `max_memory_allocated`.

The load average is printed before and after: publish only from an
idle machine.
"""

import argparse
import os
import sys
import tempfile

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

import keras_attention as ka  # noqa: E402

BACKEND = keras.backend.backend()
DEFAULT = dict(lengths=[4096, 8192, 16384, 32768], top_k=256, heads=4)
QUICK = dict(lengths=[64, 128], top_k=8, heads=2)


def causal_indices(length, top_k, seed=0):
    """`(1, T, k)` int32: query `i` reads `k` distinct positions spread
    over `[0, i]` (stride `(i + 1) // k`, a random offset within each
    stride), or every position `<= i` then -1 when `i < k`."""
    rng = np.random.default_rng(seed)
    i = np.arange(length)[:, None]
    j = np.arange(top_k)[None]
    stride = np.maximum((i + 1) // top_k, 1)
    jitter = rng.integers(0, 2**31, size=(length, top_k)) % stride
    spread = j * stride + jitter
    short = np.where(j <= i, j, -1)
    out = np.where(i + 1 >= top_k, spread, short)
    return out[None].astype("int32")


def inputs(length, args):
    """`(q, cot, k, v, indices)` with `args.kv_heads` (one count here)
    key/value heads."""
    rng = np.random.default_rng(length)
    shape = (1, length, args.heads, args.head_dim)
    q, cot = (rng.normal(size=shape).astype("float32") for _ in "qc")
    shape = (1, length, args.kv_heads, args.head_dim)
    k, v = (rng.normal(size=shape).astype("float32") for _ in "kv")
    return q, k, v, cot, causal_indices(length, args.top_k)


def attention_fn(path, args):
    if path == "topk":
        return lambda q, k, v, idx: ka.ops.topk_attention(
            q, k, v, idx, causal=True
        )
    return lambda q, k, v, idx: ka.ops.dot_product_attention(
        q, k, v, causal=True, implementation=args.dense_implementation
    )


def step(path, length, args):
    """A blocking zero-argument function: one forward + backward."""
    q, k, v, cot, idx = inputs(length, args)
    attend = attention_fn(path, args)
    if BACKEND == "jax":
        import jax

        def loss(q, k, v):
            return (attend(q, k, v, idx) * cot).sum()

        grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        return lambda: jax.block_until_ready(grad(q, k, v))
    if BACKEND == "torch":
        import torch

        tensors = [torch.from_numpy(x) for x in (q, k, v)]
        cot_t, idx_t = torch.from_numpy(cot), torch.from_numpy(idx)

        def run():
            leaves = [t.clone().requires_grad_(True) for t in tensors]
            (attend(*leaves, idx_t) * cot_t).sum().backward()
            return [float(t.grad.sum()) for t in leaves]

        return run
    import tensorflow as tf

    q, k, v, cot = (tf.constant(x) for x in (q, k, v, cot))
    idx = tf.constant(idx)

    @tf.function(jit_compile=bool(args.jit))
    def grads(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(attend(q, k, v, idx) * cot)
        return loss, tape.gradient(loss, [q, k, v])

    return lambda: [t.numpy() for t in tf.nest.flatten(grads(q, k, v))]


def device_peak_mb():
    """The accelerator's peak memory so far (MiB), or None on a CPU."""
    if BACKEND == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform == "cpu":
            return None
        return device.memory_stats()["peak_bytes_in_use"] / 2**20
    if BACKEND == "torch":
        import torch

        if not torch.cuda.is_available():
            return None
        return torch.cuda.max_memory_allocated() / 2**20
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return None
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20


def child(args):
    """Runs one configuration (or builds the inputs only: `idle`) and
    writes the device's peak to `--child-report`."""
    path, length = args.child, args.child_length
    if path == "idle":
        inputs(length, args)
    else:
        run = step(path, length, args)
        run()
        run()
    with open(args.child_report, "w") as f:
        f.write(str(device_peak_mb()))


def child_memory(path, length, args):
    """`(peak RSS MiB, device peak MiB)` of a fresh process running one
    configuration (None where it failed or there is no device)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "device")
        command = [sys.executable, os.path.abspath(__file__)]
        command += ["--child", path, "--child-length", str(length)]
        command += ["--child-report", report]
        command += ["--top-k", str(args.top_k), "--heads", str(args.heads)]
        command += ["--head-dim", str(args.head_dim)]
        command += ["--kv-heads", str(args.kv_heads)]
        if args.jit:
            command.append("--jit")
        if args.dense_implementation:
            command += ["--dense-implementation", args.dense_implementation]
        rss = try_peak_rss_mb(command, timeout=args.timeout)
        device = None
        if os.path.exists(report):
            with open(report) as f:
                text = f.read().strip()
            device = None if text == "None" else float(text)
    return rss, device


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument(
        "--kv-heads",
        type=int,
        nargs="+",
        help="key/value head counts, one table row per count and length "
        "(default: --heads, then 1: MQA, as DeepSeek-V3.2 runs DSA)",
    )
    parser.add_argument("--dense-max-length", type=int, default=16384)
    parser.add_argument("--dense-implementation", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--jit", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-report", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULT).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick:
        args.head_dim = min(args.head_dim, 8)
    if args.kv_heads is None:
        args.kv_heads = [args.heads, 1] if args.heads > 1 else [1]
    for count in args.kv_heads:
        if count < 1 or args.heads % count:
            parser.error(
                f"--kv-heads must divide --heads={args.heads}. "
                f"Received: {count}"
            )
    if args.child:
        (args.kv_heads,) = args.kv_heads
    return args


def main(argv=None):
    args = parse(argv)
    if args.child:
        return child(args)
    load_before = load_average()
    rows = []
    runs = [(c, t) for c in args.kv_heads for t in args.lengths]
    for kv_heads, length in runs:
        args = argparse.Namespace(**{**vars(args), "kv_heads": kv_heads})
        paths = ["topk"]
        if length <= args.dense_max_length:
            paths.append("dense")
        fns = {p: step(p, length, args) for p in paths}
        times = time_interleaved(fns, repeats=args.repeats, warmup=args.warmup)
        memory = {p: (None, None) for p in ("idle", "topk", "dense")}
        if not args.no_memory:
            for p in ["idle"] + paths:
                memory[p] = child_memory(p, length, args)

        def above(p):
            if memory[p][0] is None or memory["idle"][0] is None:
                return None
            return memory[p][0] - memory["idle"][0]

        dense = times.get("dense")
        row = [
            length,
            args.kv_heads,
            1e3 * times["topk"],
            None if dense is None else 1e3 * dense,
            None if dense is None else dense / times["topk"],
            above("topk"),
            above("dense"),
            memory["topk"][1],
            memory["dense"][1],
        ]
        rows.append(row)
        print(row, flush=True)
    headers = [
        "T",
        "kv heads",
        "top-k ms",
        "dense ms",
        "speed-up (dense / top-k)",
        "top-k peak MiB above baseline",
        "dense peak MiB above baseline",
        "top-k device peak MiB",
        "dense device peak MiB",
    ]
    table = markdown_table(headers, rows)
    header = (
        f"One causal forward + backward, batch 1, {args.heads} query heads "
        f"of {args.head_dim} (key/value heads: per row), top-k {args.top_k}, "
        f"float32, {BACKEND}"
        f"{' (XLA)' if args.jit else ''}; dense: dot_product_attention("
        f"causal=True, implementation={args.dense_implementation!r}), "
        f"skipped above T = {args.dense_max_length}; median of "
        f"{args.repeats}.\nMachine: {machine_summary()}.\n"
        f"Load average before: {load_before}, after: {load_average()}.\n"
    )
    print()
    print(header)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + "\n" + table + "\n")
    return rows


if __name__ == "__main__":
    main()
