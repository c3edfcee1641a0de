"""Local attention: banded `LocalSelfAttention` vs dense masked attention.

Ours: `LocalSelfAttention(window_size=w)` (blockwise band, O(T * w)).
Theirs, with the same weights and `attention_mask=sliding_window_mask(T, w)`:
"dense", our `SelfAttention` (its blockwise path takes the T x T mask tile
by tile, so its memory is bounded too), and "Keras", Keras's
`MultiHeadAttention` (masks a full T x T score matrix, as Keras and most
other implementations do). Forward + backward (gradients w.r.t. the input
and all weights) in one `tf.function`, batch 1. "of peak": the attention
FLOPs a token needs, `3 * 4 * heads * (L + R + 1) * key_dim` (forward and
backward, the band only, no projections), per measured time, over the
float32 matmul throughput measured in the same run.

For each length: both are checked to give the same output and gradients,
then timed interleaved in this process (medians after warm-up); peak RSS is
measured for each (implementation, length) in its own fresh process, next
to an idle process that builds the same layer and input but never runs it
(the "baseline": TensorFlow, the layer and its input), so that the growth
above the baseline is the memory the attention itself needs.

    python benchmarks/local_attention.py [--markdown FILE]

Dense runs are skipped above `--dense-max-length` (at T = 16,384 its score
matrix alone is 4 heads x 1 GiB in float32, and forward + backward keep
several such tensors: more than this machine's memory).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def _build(impl, args, length):
    import keras

    from keras_attention import masks
    from keras_attention.layers import LocalSelfAttention
    from keras_attention.layers import SelfAttention

    features = args.heads * args.key_dim
    if impl == "local":
        layer = LocalSelfAttention(
            args.heads,
            args.key_dim,
            window_size=args.window,
            block_size=args.block_size,
        )
    elif impl == "keras":
        layer = keras.layers.MultiHeadAttention(args.heads, args.key_dim)
        layer.build((1, None, features), (1, None, features))
    else:
        layer = SelfAttention(args.heads, args.key_dim)
    if impl != "keras":
        layer.build((1, None, features))
    rng = np.random.default_rng(0)
    x = keras.ops.convert_to_tensor(
        rng.normal(size=(1, length, features)).astype("float32")
    )
    cot = keras.ops.convert_to_tensor(
        rng.normal(size=(1, length, features)).astype("float32")
    )
    window_mask = None
    if impl in ("dense", "keras"):
        window_mask = masks.sliding_window_mask(length, args.window)
    if impl == "keras":
        window_mask = keras.ops.convert_to_tensor(window_mask)[None]
    return layer, x, cot, window_mask


def _step_fn(layer, window_mask):
    import tensorflow as tf

    from keras_attention.layers import SelfAttention

    @tf.function
    def step(x, cot):
        with tf.GradientTape() as tape:
            tape.watch(x)
            if window_mask is None:
                y = layer(x)
            elif isinstance(layer, SelfAttention):
                y = layer(x, attention_mask=window_mask)
            else:  # Keras: query, value
                y = layer(x, x, attention_mask=window_mask)
            loss = tf.reduce_sum(y * cot)
        grads = tape.gradient(loss, [x] + layer.trainable_weights)
        return y, grads

    return step


def _child(impl, length, args):
    """Runs one implementation (or nothing, for the baseline) and exits."""
    layer, x, cot, window_mask = _build(
        "local" if impl == "idle" else impl, args, length
    )
    if impl == "idle":
        return
    step = _step_fn(layer, window_mask)
    for _ in range(2):
        y, grads = step(x, cot)
        float(grads[0][0, 0, 0])


def _measure_memory(impl, length, args):
    from _timing import try_peak_rss_mb

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
        "--window",
        str(args.window),
    ]
    if args.block_size:
        cmd += ["--block-size", str(args.block_size)]
    return try_peak_rss_mb(cmd, timeout=3600)


def _ratio(a, b):
    return None if a is None or b is None else a / b


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[1024, 2048, 4096, 8192, 16384],
    )
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--key-dim", type=int, default=64)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dense-max-length", type=int, default=8192)
    parser.add_argument("--keras-max-length", type=int, default=8192)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--markdown", default=None, help="write the table here")
    parser.add_argument(
        "--child", nargs=2, metavar=("IMPL", "T"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]), args)
        return

    import keras
    from _timing import load_average
    from _timing import machine_summary
    from _timing import markdown_table
    from _timing import matmul_peak_gflops
    from _timing import time_interleaved

    load_before = load_average()
    peak = matmul_peak_gflops()
    flops_per_token = 3 * 4 * args.heads * (2 * args.window + 1) * args.key_dim
    rows = []
    for length in args.lengths:
        local, x, cot, _ = _build("local", args, length)
        local_step = _step_fn(local, None)
        fns = {"local": lambda: float(local_step(x, cot)[1][0][0, 0, 0])}
        limits = {
            "dense": args.dense_max_length,
            "keras": args.keras_max_length,
        }
        others = [impl for impl, limit in limits.items() if length <= limit]
        y_l, g_l = local_step(x, cot)
        for impl in others:
            layer, _, _, window_mask = _build(impl, args, length)
            layer.set_weights(local.get_weights())
            step = _step_fn(layer, window_mask)
            # Same computation first: outputs and every gradient.
            y_o, g_o = step(x, cot)
            for a, b in zip([y_l] + list(g_l), [y_o] + list(g_o)):
                np.testing.assert_allclose(
                    keras.ops.convert_to_numpy(a),
                    keras.ops.convert_to_numpy(b),
                    atol=2e-3,
                    rtol=1e-3,
                )
            fns[impl] = (lambda s: lambda: float(s(x, cot)[1][0][0, 0, 0]))(
                step
            )
        times = time_interleaved(fns, repeats=args.repeats, warmup=1)
        t_local, t_dense = times["local"], times.get("dense")
        t_keras = times.get("keras")
        m_idle = m_local = m_dense = m_keras = None
        if not args.no_memory:
            m_idle = _measure_memory("idle", length, args)
            m_local = _measure_memory("local", length, args)
            if "dense" in others:
                m_dense = _measure_memory("dense", length, args)
            if "keras" in others:
                m_keras = _measure_memory("keras", length, args)

        def above(m):
            return None if m is None or m_idle is None else m - m_idle

        def ms(t):
            return None if t is None else t * 1e3

        row = [
            length,
            ms(t_local),
            ms(t_dense),
            ms(t_keras),
            _ratio(t_dense, t_local),
            _ratio(t_keras, t_local),
            t_local * 1e6 / length,
            flops_per_token * length / t_local / 1e9 / peak,
            m_idle,
            m_local,
            m_dense,
            m_keras,
            above(m_local),
            above(m_dense),
            above(m_keras),
            _ratio(above(m_dense), above(m_local)),
            _ratio(above(m_keras), above(m_local)),
        ]
        rows.append(row)
        print(row, flush=True)

    headers = [
        "T",
        "local ms",
        "dense ms",
        "Keras ms",
        "speed-up (dense/local)",
        "speed-up (Keras/local)",
        "local us/token",
        "local attention FLOP/s of peak",
        "baseline MiB",
        "local peak MiB",
        "dense peak MiB",
        "Keras peak MiB",
        "local above baseline MiB",
        "dense above baseline MiB",
        "Keras above baseline MiB",
        "memory ratio above baseline (dense/local)",
        "memory ratio above baseline (Keras/local)",
    ]
    table = markdown_table(headers, rows)
    import tensorflow  # noqa: F401  (for the version in the summary)

    block = args.block_size or "default"
    header = (
        f"Forward + backward, batch 1, {args.heads} heads, key_dim "
        f"{args.key_dim}, window {args.window} on each side, block size "
        f"{block}, tf.function (no XLA), median of {args.repeats}. "
        f"Dense skipped above T = {args.dense_max_length}, Keras above "
        f"T = {args.keras_max_length} (n/a).\n"
        f"Machine: {machine_summary()}; float32 matmul peak measured in "
        f"the run: {peak:.1f} GFLOP/s; load average before "
        f"{load_before}, after {load_average()}.\n"
    )
    print()
    print(header)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + "\n" + table + "\n")


if __name__ == "__main__":
    main()
