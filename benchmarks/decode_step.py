"""One decoding step's attention: one query over a cache of keys and
values laid out `(batch, slots, kv_heads, head_dim)`, as
`ops.dot_product_attention` takes it now (`single_query_by_matmul`: one
matmul of the cache as it lies with every head's query, each head's own
block kept) against the batched matmuls it took before (the cache copied
into their layout at every step).

    python benchmarks/decode_step.py                     # TensorFlow
    KERAS_BACKEND=jax python benchmarks/decode_step.py
    KERAS_BACKEND=torch python benchmarks/decode_step.py
    python benchmarks/decode_step.py --slots 8192 32768 --heads 32 --kv-heads 8
    python benchmarks/decode_step.py --quick             # tiny, seconds

Two tables:

- op: `dot_product_attention(q, k, v, attention_mask=...)` with one query,
  the query rotated first (rotary positions: sines and cosines, as a
  decoder does), a padding mask over the slots, float32, batch 1, `--heads`
  query heads and `--kv-heads` key/value heads of 64, for each of
  `--slots`; TensorFlow under `tf.function` with and without XLA, JAX
  under `jax.jit`, PyTorch eagerly. "now" is the automatic choice of
  this backend (the matmul form where `_backend.single_query_by_matmul`
  says so), "batched" forces the batched matmuls. Both are checked equal
  first.
- layer (TensorFlow, XLA): a `SelfAttention` configured as Llama 4's
  chunked layers (rotary, the weightless L2 qk-norm, `ChunkedCausalMask`)
  decoding 20 steps in one compiled loop over a rolling cache of
  `chunk` slots, per step.

Medians of `--repeats` interleaved runs (`benchmarks/_timing.py`); the
load average is printed before and after: publish only from an idle
machine.
"""

import argparse
import contextlib
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

from keras_attention.ops import _backend  # noqa: E402
from keras_attention.ops import dot_product_attention  # noqa: E402

HEAD_DIM = 64
QUICK = dict(slots=[64], chunk=32, heads=4, kv_heads=2)


def rotated(q, position):
    """`q` `(b, 1, h, 64)` rotated at `position` (rotate-half form)."""
    half = HEAD_DIM // 2
    angle = position * 10000.0 ** (-ops.arange(half, dtype="float32") / half)
    cos, sin = ops.cos(angle), ops.sin(angle)
    a, b = q[..., :half], q[..., half:]
    return ops.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


@contextlib.contextmanager
def batched_matmuls(batched):
    """With `batched`, the dense path's batched matmuls forced for one
    query (as before fc07f67); else the automatic choice."""
    original = _backend.single_query_by_matmul
    if batched:
        _backend.single_query_by_matmul = lambda groups: False
    try:
        yield
    finally:
        _backend.single_query_by_matmul = original


def attention(batched):
    """The step: the automatic choice, or the batched matmuls forced."""

    def step(q, k, v, mask, position):
        with batched_matmuls(batched):
            return dot_product_attention(
                rotated(q, position),
                k,
                v,
                attention_mask=mask,
                implementation="dense",
            )

    return step


def compiled(fn, jit):
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=jit)
    if backend == "jax":
        import jax

        return jax.jit(fn)
    return fn


def op_rows(args):
    backend = keras.backend.backend()
    modes = [True, False] if backend == "tensorflow" else [None]
    rng = np.random.default_rng(0)
    rows = []
    for slots in args.slots:
        q = rng.normal(size=(1, 1, args.heads, HEAD_DIM)).astype("float32")
        kv = rng.normal(size=(2, 1, slots, args.kv_heads, HEAD_DIM))
        k, v = (ops.convert_to_tensor(x.astype("float32")) for x in kv)
        mask = np.ones((1, 1, 1, slots), bool)
        mask[..., slots // 2 :] = False  # half the cache written so far
        inputs = (ops.convert_to_tensor(q), k, v, mask, np.float32(slots / 2))
        for jit in modes:
            fns = {
                name: compiled(attention(name == "batched"), jit)
                for name in ("now", "batched")
            }
            outs = [ops.convert_to_numpy(f(*inputs)) for f in fns.values()]
            np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)
            timed = {
                name: (lambda f=f: ops.convert_to_numpy(f(*inputs)))
                for name, f in fns.items()
            }
            t = time_interleaved(timed, args.repeats, args.warmup)
            path = (
                "matmul"
                if _backend.single_query_by_matmul(args.kv_heads)
                else "batched"
            )
            where = {True: "XLA", False: "graph", None: ""}[jit]
            rows.append(
                [
                    f"{backend} {where}".strip(),
                    f"{slots:,}",
                    path,
                    f"{t['now'] * 1e3:.3g}",
                    f"{t['batched'] * 1e3:.3g}",
                    f"{t['batched'] / t['now']:.2f}",
                ]
            )
    return rows


def layer_rows(args):
    import tensorflow as tf

    from keras_attention.layers import SelfAttention
    from keras_attention.mods import ChunkedCausalMask

    chunk, steps = args.chunk, 20
    layer = SelfAttention(
        args.heads,
        HEAD_DIM,
        causal=True,
        num_key_value_heads=args.kv_heads,
        use_bias=False,
        rotary_max_wavelength=500_000.0,
        qk_norm="l2",
        mask_mod=ChunkedCausalMask(chunk),
    )
    features = args.heads * HEAD_DIM
    x0 = np.random.default_rng(1).normal(size=(1, 1, features))
    x0 = tf.constant(x0.astype("float32"))
    layer(x0)
    cache = layer.init_cache(1, 4 * chunk, sink_tokens=0)
    start = tf.constant(chunk + 5)

    def loop(batched):
        @tf.function(jit_compile=True)
        def run(cache, start):
            def body(j, c, acc):
                y, c = layer(x0 + acc, cache=c, cache_update_index=start + j)
                return j + 1, c, y * 1e-3

            init = (0, cache, tf.zeros_like(x0))
            return tf.while_loop(lambda j, c, a: j < steps, body, init)[2]

        def call():
            with batched_matmuls(batched):
                return run(cache, start).numpy()

        return call

    fns = {"now": loop(False), "batched": loop(True)}
    t = time_interleaved(fns, args.repeats, args.warmup)
    return [
        [
            f"{chunk:,}",
            f"{t['now'] / steps * 1e3:.3g}",
            f"{t['batched'] / steps * 1e3:.3g}",
            f"{t['batched'] / t['now']:.2f}",
        ]
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--slots", type=int, nargs="+", default=[1024, 8192, 32768]
    )
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--markdown", help="also write the tables to this file")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    before = load_average()
    lines = [machine_summary(), ""]
    lines.append(
        f"op: one query, {args.heads} query heads, {args.kv_heads} key/value "
        f"heads of {HEAD_DIM}, ms per step"
    )
    lines.append(
        markdown_table(
            [
                "backend",
                "slots",
                "path now",
                "now ms",
                "batched ms",
                "batched / now",
            ],
            op_rows(args),
        )
    )
    if keras.backend.backend() == "tensorflow":
        lines += [
            "",
            "layer: Llama 4's chunked layer, a ring of chunk slots, XLA",
        ]
        lines.append(
            markdown_table(
                ["chunk", "now ms/step", "batched ms/step", "batched / now"],
                layer_rows(args),
            )
        )
    lines += ["", f"Load average before: {before}; after: {load_average()}"]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return text


if __name__ == "__main__":
    main()
