"""The implementations of `dot_product_attention`, forward + backward.

    KERAS_BACKEND=torch python benchmarks/attention_paths.py
    KERAS_BACKEND=torch python benchmarks/attention_paths.py --sizes 512
    ... --paths dense,blockwise,fused --markdown out.md

`keras_attention.ops.dot_product_attention` forced to each implementation
("dense", "blockwise", "fused") on projected `(b, T, heads, dim)` tensors
(batch 4, 8 heads, head size 32, float32), causal or not, optionally with a
key padding mask (`--padding`): the loss `sum(out^2)` and its gradients
w.r.t. query, key and value, timed interleaved after warm-up (medians),
with the ratio of each path to the blockwise one. This is the measurement
behind the automatic choice in `keras_attention/ops/attention.py` (which
path runs when no weights or dropout are requested). Before timing, every
path's output is compared with the dense one. TensorFlow steps run under
`tf.function`, JAX steps under `jax.jit`, PyTorch steps eagerly (as Keras
layers run on torch unless `jit_compile=True`).
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

from keras_attention.ops import dot_product_attention  # noqa: E402

BACKEND = keras.backend.backend()
HEADS, HEAD_DIM = 8, 32


def make_step(path, causal, padding):
    """`step(q, k, v) -> dq` (NumPy) for one forced implementation."""

    def loss(q, k, v):
        out = dot_product_attention(
            q, k, v, is_causal=causal, key_padding=padding, implementation=path
        )
        return keras.ops.sum(out * out)

    if BACKEND == "jax":
        import jax

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        return lambda q, k, v: np.asarray(grad(q, k, v)[0])
    if BACKEND == "torch":

        def step(q, k, v):
            args = [x.detach().requires_grad_(True) for x in (q, k, v)]
            loss(*args).backward()
            return args[0].grad.numpy()

        return step
    import tensorflow as tf

    @tf.function
    def tf_step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            value = loss(q, k, v)
        return tape.gradient(value, [q, k, v])

    return lambda q, k, v: tf_step(q, k, v)[0].numpy()


def forward(path, q, k, v, causal, padding):
    out = dot_product_attention(
        q, k, v, is_causal=causal, key_padding=padding, implementation=path
    )
    return keras.ops.convert_to_numpy(out)


def bench(t, batch, causal, with_padding, paths, repeats, warmup):
    rng = np.random.default_rng(0)
    q, k, v = (
        keras.ops.convert_to_tensor(
            rng.normal(size=(batch, t, HEADS, HEAD_DIM)).astype("float32")
        )
        for _ in range(3)
    )
    padding = None
    if with_padding:
        lengths = rng.integers(t // 2, t + 1, size=batch)
        padding = keras.ops.convert_to_tensor(
            np.arange(t)[None, :] < lengths[:, None]
        )
    reference = forward("dense", q, k, v, causal, padding)
    diffs = {}
    for path in paths:
        got = forward(path, q, k, v, causal, padding)
        diffs[path] = float(np.max(np.abs(got - reference)))
        if not diffs[path] <= 1e-4:
            raise AssertionError(f"{path} differs from dense: {diffs[path]}")
    steps = {path: make_step(path, causal, padding) for path in paths}
    fns = {path: (lambda s=steps[path]: s(q, k, v)) for path in paths}
    times = time_interleaved(fns, repeats=repeats, warmup=warmup)
    base = times.get("blockwise", times[paths[0]])
    row = [t, batch, "yes" if causal else "no", "yes" if with_padding else "no"]
    row += [times[p] * 1e3 for p in paths]
    row += [times[p] / base for p in paths]
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="128,512,2048")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--paths", default="dense,blockwise,fused")
    parser.add_argument(
        "--padding", action="store_true", help="also time with key padding"
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--markdown", help="write the table to this file")
    args = parser.parse_args()
    paths = args.paths.split(",")
    before = load_average()
    print(f"{machine_summary()}, backend {BACKEND}")
    print(f"load average before: {before}", flush=True)
    headers = ["T", "batch", "causal", "padding"]
    headers += [f"{p} ms" for p in paths]
    headers += [f"{p}/blockwise" for p in paths]
    rows = []
    for t in (int(s) for s in args.sizes.split(",") if s):
        for causal in (False, True):
            for padding in (False, True) if args.padding else (False,):
                rows.append(
                    bench(
                        t,
                        args.batch,
                        causal,
                        padding,
                        paths,
                        args.repeats,
                        args.warmup,
                    )
                )
                print(
                    "  "
                    + " | ".join(
                        f"{x:.3g}" if isinstance(x, float) else str(x)
                        for x in rows[-1]
                    ),
                    flush=True,
                )
    after = load_average()
    text = "\n".join(
        [
            f"Machine: {machine_summary()}; backend {BACKEND}; "
            f"load average before {before}, after {after}.",
            "",
            markdown_table(headers, rows),
        ]
    )
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
