"""The gated delta rule, chunked: ours against keras-hub's.

    python benchmarks/gated_delta_rule.py                  # TensorFlow
    KERAS_BACKEND=jax python benchmarks/gated_delta_rule.py
    ... --length 4096 --heads 8 --key-dim 128 --value-dim 128 --repeats 7
    python benchmarks/gated_delta_rule.py --quick          # tiny, seconds

`keras_attention.ops.gated_delta_rule` (chunked: one triangular solve
per chunk, the state carried by one matrix product per chunk) against
keras-hub 0.32's `_chunk_gated_delta_rule` (Qwen 3.5's: a 63-step
row-by-row correction loop per chunk size of 64, a Python loop over the
chunks), same chunk size, at `--length` tokens (default 4,096), batch 1,
random queries and keys (both L2-normalised: keras-hub normalises inside
its function, ours gets the same normalisation in the timed function),
log decays in [log 0.5, 0] and write strengths in (0, 1).

Two rows: the forward pass, and forward + backward (the gradients of
`sum(output * cotangent)` with respect to q, k, v, g and beta). The
outputs (and gradients) of the two are compared first. TensorFlow runs
both under `tf.function` (`--jit` for XLA), JAX under `jax.jit`, PyTorch
eagerly. Times are medians of interleaved runs after a warm-up
(`benchmarks/_timing.py`); the ratio is ours / keras-hub's (the goal: <=
1). The load average is printed before and after: publish only from an
idle machine.
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
from keras import ops  # noqa: E402
from keras_hub.src.models.qwen3_5 import qwen3_5_gated_delta_net as hub  # noqa: E402

import keras_attention as ka  # noqa: E402

BACKEND = keras.backend.backend()
DEFAULT = dict(length=4096, heads=8, key_dim=128, value_dim=128, chunk=64)
QUICK = dict(length=96, heads=2, key_dim=8, value_dim=8, chunk=16)


def inputs(sizes, seed=0):
    """`(q, k, v, g, beta, cotangent)`, float32 NumPy arrays."""
    rng = np.random.default_rng(seed)
    t, h = sizes["length"], sizes["heads"]
    d, e = sizes["key_dim"], sizes["value_dim"]
    q, k = rng.normal(size=(2, 1, t, h, d))
    v = rng.normal(size=(1, t, h, e))
    g = np.log(rng.uniform(0.5, 1.0, size=(1, t, h)))
    beta = rng.uniform(0.0, 1.0, size=(1, t, h))
    cotangent = rng.normal(size=(1, t, h, e))
    return [x.astype("float32") for x in (q, k, v, g, beta, cotangent)]


def ours(chunk):
    def fn(q, k, v, g, beta):
        # The normalisation keras-hub's function does inside.
        q, k = hub._l2norm(q), hub._l2norm(k)
        return ka.ops.gated_delta_rule(q, k, v, g, beta, chunk_size=chunk)

    return fn


def keras_hubs(chunk):
    def fn(q, k, v, g, beta):
        return hub._chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk)[
            0
        ]

    return fn


def _with_gradients(fn):
    """`(q, k, v, g, beta, cotangent) -> (out, grads)` of `sum(out *
    cotangent)` w.r.t. the five inputs, per backend."""
    if BACKEND == "jax":
        import jax

        def run(q, k, v, g, beta, cot):
            out, pull = jax.vjp(fn, q, k, v, g, beta)
            return out, pull(cot)

        return run
    if BACKEND == "torch":
        import torch

        def run(*arrays):
            args = [
                ops.convert_to_tensor(a).requires_grad_(True)
                for a in arrays[:5]
            ]
            out = fn(*args)
            cot = ops.convert_to_tensor(arrays[5])
            grads = torch.autograd.grad(ops.sum(out * cot), args)
            return out.detach(), grads

        return run
    import tensorflow as tf

    def run(q, k, v, g, beta, cot):
        args = [q, k, v, g, beta]
        with tf.GradientTape() as tape:
            tape.watch(args)
            out = fn(*args)
            loss = tf.reduce_sum(out * cot)
        return out, tape.gradient(loss, args)

    return run


def _compiled(fn, jit):
    """`fn` compiled per backend, returning NumPy (blocking)."""
    if BACKEND == "jax":
        import jax

        jitted = jax.jit(fn)
        compiled = jitted
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        compiled = tf.function(fn, jit_compile=bool(jit), autograph=False)
    else:
        compiled = fn

    def run(*arrays):
        return keras.tree.map_structure(ops.convert_to_numpy, compiled(*arrays))

    return run


def _check(a, b, what):
    for x, y in zip(keras.tree.flatten(a), keras.tree.flatten(b)):
        scale = max(float(np.max(np.abs(y))), 1e-6)
        if not np.allclose(x, y, atol=1e-3 * scale, rtol=1e-3):
            raise AssertionError(
                f"{what}: ours and keras-hub's differ, max difference "
                f"{float(np.max(np.abs(x - y)))} (scale {scale})"
            )


def rows(sizes, repeats, warmup, jit):
    """`[mode, ours ms, keras-hub ms, ours/keras-hub]` for the forward
    pass and forward + backward."""
    arrays = inputs(sizes)
    tensors = [ops.convert_to_tensor(a) for a in arrays]
    table = []
    for mode in ("forward", "forward + backward"):
        fns = {}
        for name, make in (("ours", ours), ("keras-hub", keras_hubs)):
            fn = make(sizes["chunk"])
            if mode == "forward":
                step = _compiled(fn, jit)
                fns[name] = lambda s=step: s(*tensors[:5])
            else:
                step = _compiled(_with_gradients(fn), jit)
                fns[name] = lambda s=step: s(*tensors)
        _check(fns["ours"](), fns["keras-hub"](), mode)
        times = time_interleaved(fns, repeats=repeats, warmup=warmup)
        table.append(
            [
                mode,
                f"{times['ours'] * 1e3:.1f}",
                f"{times['keras-hub'] * 1e3:.1f}",
                f"{times['ours'] / times['keras-hub']:.2f}",
            ]
        )
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--key-dim", type=int, default=None)
    parser.add_argument("--value-dim", type=int, default=None)
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--jit", action="store_true", help="TF: XLA")
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else DEFAULT)
    for key, value in (
        ("length", args.length),
        ("heads", args.heads),
        ("key_dim", args.key_dim),
        ("value_dim", args.value_dim),
        ("chunk", args.chunk_size),
    ):
        if value is not None:
            sizes[key] = value
    lines = [
        machine_summary(),
        f"Load average before: {load_average()}",
        f"\nSizes (batch 1, float32): {sizes}\n",
    ]
    print("\n".join(lines), flush=True)
    how = {"tensorflow": "tf.function", "jax": "jax.jit"}.get(BACKEND, "eager")
    how += " + XLA" if args.jit and BACKEND == "tensorflow" else ""
    table = markdown_table(
        ["pass", "ours ms", "keras-hub ms", "ours/keras-hub"],
        rows(sizes, args.repeats, args.warmup, args.jit),
    )
    lines += [f"chunked gated delta rule ({BACKEND}, {how}):\n", table]
    print(lines[-2] + lines[-1], flush=True)
    lines.append(f"\nLoad average after: {load_average()}")
    print(lines[-1])
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
