"""The cost of `return_lse`, learned sinks and QK-norm, forward + backward.

    python benchmarks/modern_attention.py                  # TensorFlow
    KERAS_BACKEND=jax python benchmarks/modern_attention.py
    ... --sizes 2048 --repeats 15 --markdown out.md

Two tables, each timed interleaved after warm-up (medians), with the ratio
to the plain variant:

- ops: `keras_attention.ops.dot_product_attention` on the blockwise path,
  causal, batch 4, 8 heads, head size 32, float32: the loss `sum(out^2)`
  and its gradients w.r.t. query, key and value, plain; with
  `return_lse=True` (the loss reads the lse too: its gradient runs through
  the hand-written backward pass); with `sink_logits` (gradients w.r.t.
  the sinks too);
- layer: `MultiHeadAttention(8, 32)` self-attention (hidden 256, causal,
  `flash_attention=True`: the blockwise path on CPU) and one training step
  (gradients w.r.t. every weight), plain, `qk_norm="rms"` and
  `learned_sinks=True`.

The issue's budgets (idle machine): `return_lse` <= 1.02x, learned sinks
<= 1.05x, QK-norm <= 1.05x the plain step at T = 2,048. TensorFlow steps
run under `tf.function`, JAX steps under `jax.jit`, PyTorch eagerly. The
load average is printed before and after: publish only from an idle
machine.
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

import keras_attention as ka  # noqa: E402

BACKEND = keras.backend.backend()
HEADS, HEAD_DIM, BATCH = 8, 32, 4


def compiled_gradients(loss, num_args):
    """`step(*args)` -> the first gradient as NumPy, compiled per backend."""
    if BACKEND == "jax":
        import jax

        grad = jax.jit(jax.grad(loss, argnums=tuple(range(num_args))))
        return lambda *a: np.asarray(grad(*a)[0])
    if BACKEND == "torch":

        def step(*a):
            args = [x.detach().requires_grad_(True) for x in a]
            loss(*args).backward()
            return args[0].grad.numpy()

        return step
    import tensorflow as tf

    @tf.function
    def tf_step(*a):
        with tf.GradientTape() as tape:
            tape.watch(list(a))
            value = loss(*a)
        return tape.gradient(value, list(a))

    return lambda *a: tf_step(*a)[0].numpy()


def op_variants(t):
    rng = np.random.default_rng(0)
    q, k, v = (
        keras.ops.convert_to_tensor(
            rng.normal(size=(BATCH, t, HEADS, HEAD_DIM)).astype("float32")
        )
        for _ in range(3)
    )
    sinks = keras.ops.convert_to_tensor(
        rng.normal(size=(HEADS,)).astype("float32")
    )

    def attend(q, k, v, **kwargs):
        return ka.ops.dot_product_attention(
            q, k, v, causal=True, implementation="blockwise", **kwargs
        )

    def plain(q, k, v, z):
        out = attend(q, k, v)
        return keras.ops.sum(out * out)

    def lse(q, k, v, z):
        out, lse = attend(q, k, v, return_lse=True)
        return keras.ops.sum(out * out) + keras.ops.sum(lse)

    def sink(q, k, v, z):
        out = attend(q, k, v, sink_logits=z)
        return keras.ops.sum(out * out)

    variants = {"plain": plain, "return_lse": lse, "learned sinks": sink}
    steps = {n: compiled_gradients(f, 4) for n, f in variants.items()}
    return {n: (lambda s=s: s(q, k, v, sinks)) for n, s in steps.items()}


def layer_variants(t):
    rng = np.random.default_rng(1)
    x = keras.ops.convert_to_tensor(
        rng.normal(size=(BATCH, t, HEADS * HEAD_DIM)).astype("float32")
    )
    options = {
        "plain": {},
        "qk_norm": {"qk_norm": "rms"},
        "learned sinks": {"learned_sinks": True},
    }
    fns = {}
    for name, kwargs in options.items():
        keras.utils.set_random_seed(0)
        layer = ka.layers.MultiHeadAttention(
            HEADS, HEAD_DIM, flash_attention=True, **kwargs
        )
        layer(x[:, :8], x[:, :8])
        weights = list(layer.trainable_variables)
        fns[name] = _layer_step(layer, weights, x)
    return fns


def _layer_step(layer, weights, x):
    if BACKEND == "jax":
        import jax

        def loss(values, x):
            out, _ = layer.stateless_call(
                values, [], x, x, use_causal_mask=True
            )
            return keras.ops.sum(out * out)

        grad = jax.jit(jax.grad(loss))
        values = [w.value for w in weights]
        return lambda: np.asarray(grad(values, x)[0])
    if BACKEND == "torch":
        import torch

        def step():
            layer.zero_grad() if hasattr(layer, "zero_grad") else None
            out = layer(x, x, use_causal_mask=True)
            torch.sum(out * out).backward()
            return weights[0].value.grad

        return step
    import tensorflow as tf

    @tf.function
    def tf_step(x):
        with tf.GradientTape() as tape:
            out = layer(x, x, use_causal_mask=True)
            value = tf.reduce_sum(out * out)
        return tape.gradient(value, weights)

    return lambda: tf_step(x)[0].numpy()


def ratios(times):
    base = times["plain"]
    return [f"{times[n] * 1e3:.1f} ms ({times[n] / base:.3f}x)" for n in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="512,2048")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    print(machine_summary())
    print(f"load average before: {load_average()}")
    lines = []
    for title, variants in (("ops", op_variants), ("layer", layer_variants)):
        rows, names = [], None
        for t in [int(s) for s in args.sizes.split(",")]:
            times = time_interleaved(
                variants(t), repeats=args.repeats, warmup=args.warmup
            )
            names = list(times)
            rows.append([t] + ratios(times))
        table = markdown_table(["T"] + names, rows)
        lines.append(f"\n{title} ({BACKEND}, batch {BATCH}, causal):\n")
        lines.append(table)
        print(lines[-2] + lines[-1], flush=True)
    print(f"load average after: {load_average()}")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
