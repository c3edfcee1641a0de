"""Global tokens on local attention (Longformer) vs dense masked attention.

Ours: `LocalSelfAttention(window_size=w, max_global_tokens=G)` called with
`global_mask` (the first G positions global: e.g. `[CLS]` and a question),
`O(T * (w + G))`. Theirs: `SelfAttention` with the same weights and the
combined dense mask (window or global row or global column) as
`attention_mask` (a full T x T score matrix). Forward + backward (gradients
w.r.t. the input and all weights) in one `tf.function`, batch 1.

For each (T, G): both are checked to give the same output and gradients,
then timed interleaved in this process (medians after warm-up); peak RSS
is measured for each (implementation, T, G) in its own fresh process, next
to an idle process that builds the same layer and input but never runs it
(the baseline), so that the growth above the baseline is the memory the
attention itself needs.

    python benchmarks/global_attention.py [--lengths 8192 16384]
        [--globals 1 8 64] [--markdown FILE]

Dense runs are skipped above `--dense-max-length` (at T = 16,384 its score
matrix alone is 4 heads x 1 GiB in float32, and forward + backward keep
several such tensors).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def _global_flags(length, count):
    flags = np.zeros((1, length), bool)
    flags[:, :count] = True
    return flags


def _dense_mask(length, window, count):
    """The combined `(T, T)` mask of the dense reference."""
    i = np.arange(length)[:, None]
    j = np.arange(length)[None, :]
    mask = np.abs(i - j) <= window
    mask[:count, :] = True
    mask[:, :count] = True
    return mask


def _build(impl, args, length, count):
    import keras

    from keras_attention.layers import LocalSelfAttention
    from keras_attention.layers import SelfAttention

    features = args.heads * args.key_dim
    if impl == "local":
        layer = LocalSelfAttention(
            args.heads,
            args.key_dim,
            window_size=args.window,
            block_size=args.block_size,
            max_global_tokens=count,
        )
    else:
        layer = SelfAttention(args.heads, args.key_dim)
    layer.build((1, None, features))
    rng = np.random.default_rng(0)
    x = keras.ops.convert_to_tensor(
        rng.normal(size=(1, length, features)).astype("float32")
    )
    cot = keras.ops.convert_to_tensor(
        rng.normal(size=(1, length, features)).astype("float32")
    )
    if impl == "local":
        extra = dict(
            global_mask=keras.ops.convert_to_tensor(
                _global_flags(length, count)
            )
        )
    else:
        extra = dict(
            attention_mask=keras.ops.convert_to_tensor(
                _dense_mask(length, args.window, count)
            )
        )
    return layer, x, cot, extra


def _step_fn(layer, extra):
    import tensorflow as tf

    @tf.function
    def step(x, cot):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, **extra)
            loss = tf.reduce_sum(y * cot)
        grads = tape.gradient(loss, [x] + layer.trainable_weights)
        return y, grads

    return step


def _child(impl, length, count, args):
    """Runs one implementation (or nothing, for the baseline) and exits."""
    layer, x, cot, extra = _build(
        "local" if impl == "idle" else impl, args, length, count
    )
    if impl == "idle":
        return
    step = _step_fn(layer, extra)
    for _ in range(2):
        _, grads = step(x, cot)
        float(grads[0][0, 0, 0])


def _measure_memory(impl, length, count, args):
    from _timing import try_peak_rss_mb

    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        impl,
        str(length),
        str(count),
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


def _check_same(local_step, dense_step, x, cot):
    import keras

    y_l, g_l = local_step(x, cot)
    y_d, g_d = dense_step(x, cot)
    for a, b in zip([y_l] + list(g_l), [y_d] + list(g_d)):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(a),
            keras.ops.convert_to_numpy(b),
            atol=2e-3,
            rtol=1e-3,
        )


def _row(args, length, count, m_idle):
    from _timing import time_interleaved

    local, x, cot, extra = _build("local", args, length, count)
    local_step = _step_fn(local, extra)
    fns = {"local": lambda: float(local_step(x, cot)[1][0][0, 0, 0])}
    run_dense = length <= args.dense_max_length
    if run_dense:
        dense, _, _, dense_extra = _build("dense", args, length, count)
        dense.set_weights(local.get_weights())
        dense_step = _step_fn(dense, dense_extra)
        _check_same(local_step, dense_step, x, cot)
        fns["dense"] = lambda: float(dense_step(x, cot)[1][0][0, 0, 0])
    times = time_interleaved(fns, repeats=args.repeats, warmup=1)
    t_local, t_dense = times["local"], times.get("dense")
    m_local = m_dense = None
    if not args.no_memory:
        m_local = _measure_memory("local", length, count, args)
        if run_dense:
            m_dense = _measure_memory("dense", length, count, args)

    def above(m):
        return None if m is None or m_idle is None else m - m_idle

    return [
        length,
        count,
        t_local * 1e3,
        None if t_dense is None else t_dense * 1e3,
        _ratio(t_dense, t_local),
        t_local * 1e6 / length,
        m_idle,
        m_local,
        m_dense,
        above(m_local),
        above(m_dense),
        _ratio(above(m_dense), above(m_local)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--globals", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--key-dim", type=int, default=64)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dense-max-length", type=int, default=8192)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--markdown", default=None, help="write the table here")
    parser.add_argument(
        "--child", nargs=3, metavar=("IMPL", "T", "G"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        impl, length, count = args.child
        _child(impl, int(length), int(count), args)
        return

    from _timing import load_average
    from _timing import machine_summary
    from _timing import markdown_table

    load_before = load_average()
    rows = []
    for length in args.lengths:
        m_idle = None
        if not args.no_memory:
            m_idle = _measure_memory("idle", length, 1, args)
        for count in args.globals:
            row = _row(args, length, count, m_idle)
            rows.append(row)
            print(row, flush=True)

    headers = [
        "T",
        "global tokens",
        "local+global ms",
        "dense ms",
        "speed-up (dense/ours)",
        "ours us/token",
        "baseline MiB",
        "ours peak MiB",
        "dense peak MiB",
        "ours above baseline MiB",
        "dense above baseline MiB",
        "memory ratio above baseline (dense/ours)",
    ]
    table = markdown_table(headers, rows)
    import tensorflow  # noqa: F401  (for the version in the summary)

    block = args.block_size or "default"
    header = (
        f"Forward + backward, batch 1, {args.heads} heads, key_dim "
        f"{args.key_dim}, window {args.window} on each side, block size "
        f"{block}, the first G positions global, tf.function (no XLA), "
        f"median of {args.repeats}. Dense skipped above "
        f"T = {args.dense_max_length} (n/a).\n"
        f"Machine: {machine_summary()}.\n"
        f"Load average before: {load_before}; after: {load_average()}.\n"
    )
    print()
    print(header)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + "\n" + table + "\n")


if __name__ == "__main__":
    main()
