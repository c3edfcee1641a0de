"""Multi-head attention, forward + backward: keras_attention vs Keras.

    python benchmarks/attention_core.py                 # default plan, TF
    python benchmarks/attention_core.py --full          # the whole grid
    KERAS_BACKEND=jax python benchmarks/attention_core.py
    KERAS_BACKEND=torch python benchmarks/attention_core.py
    KERAS_BACKEND=torch python benchmarks/attention_core.py --quick
    ... --markdown out.md                                # also write Markdown

`keras_attention.layers.MultiHeadAttention` against
`keras.layers.MultiHeadAttention` on the same backend with copied weights
(batch 4, 8 heads, key_dim 32), and on the torch backend also against
`torch.nn.MultiheadAttention` holding the same projection weights: one
training step (gradients w.r.t. the input and every weight), compiled with
`tf.function` on TensorFlow (with and without `jit_compile`), `jax.jit` on
JAX, eager on PyTorch (as Keras runs torch layers without `jit_compile`),
timed interleaved after warm-up (medians). Before timing, the layers'
forward outputs are compared (atol 1e-4 in float32, 3e-2 in bfloat16).
The attention core's throughput counts the FLOPs a dense implementation
needs, 3 * 4*B*H*T^2*d for forward + backward (so causal rows count the
skipped half too), against this machine's float32 matmul peak measured in
the same run with one large matmul. Peak memory (RSS) of one training step
is measured per configuration in a fresh process. The load average is
printed before and after: publish numbers only from an idle machine (a
1-minute load below 0.5).

`--quick` (about 1-2 minutes per backend on an idle machine): T = 128 and
512, float32, causal and not, no `jit_compile` variants, no memory table.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402
from _timing import matmul_peak_gflops  # noqa: E402
from _timing import time_interleaved  # noqa: E402
from _timing import try_peak_rss_mb  # noqa: E402

import keras_attention  # noqa: E402

HEADS, KEY_DIM = 8, 32
BACKEND = keras.backend.backend()


def make_layers(dtype, seed=0):
    policy = "mixed_bfloat16" if dtype == "bfloat16" else "float32"
    ours = keras_attention.layers.MultiHeadAttention(
        HEADS, KEY_DIM, dtype=policy
    )
    theirs = keras.layers.MultiHeadAttention(HEADS, KEY_DIM, dtype=policy)
    x = np.random.default_rng(seed).normal(size=(1, 8, HEADS * KEY_DIM))
    ours(x, x)
    theirs(x, x)
    theirs.set_weights(ours.get_weights())
    return ours, theirs


def make_step(layer, causal, jit, scores):
    """A compiled training step returning the input's gradient as NumPy."""

    def forward(x):
        y = layer(x, x, use_causal_mask=causal, return_attention_scores=scores)
        if scores:
            y, w = y
            return keras.ops.sum(
                keras.ops.cast(y, "float32") ** 2
            ) + keras.ops.sum(keras.ops.cast(w, "float32"))
        return keras.ops.sum(keras.ops.cast(y, "float32") ** 2)

    if BACKEND == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        other = [v.value for v in layer.non_trainable_variables]

        def loss(tv, x):
            y = layer.stateless_call(
                tv,
                other,
                x,
                x,
                use_causal_mask=causal,
                return_attention_scores=scores,
            )[0]
            if scores:
                y, w = y
                return jax.numpy.sum(y.astype("float32") ** 2) + jax.numpy.sum(
                    w.astype("float32")
                )
            return jax.numpy.sum(y.astype("float32") ** 2)

        grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
        return lambda x: jax.block_until_ready(grad(trainable, x))[1]

    if BACKEND == "torch":
        return torch_step(layer, forward)

    import tensorflow as tf

    @tf.function(jit_compile=jit, reduce_retracing=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = forward(x)
        grads = tape.gradient(loss, [x] + layer.trainable_weights)
        return grads[0], tf.add_n([tf.reduce_sum(g) for g in grads[1:]])

    return lambda x: step(x)[0].numpy()


def torch_step(layer, forward):
    """An eager PyTorch training step: gradients w.r.t. the input and every
    trainable weight (`torch.autograd.grad`, nothing accumulated)."""
    import torch

    params = [v.value for v in layer.trainable_variables]

    def step(x):
        x = x.detach().requires_grad_(True)
        grads = torch.autograd.grad(forward(x), [x] + params)
        return grads[0].numpy()

    return step


def make_torch_mha(ours):
    """`torch.nn.MultiheadAttention` with the projection weights of our
    layer (`(E, H, D)` kernels are `(E, H*D)` matrices; torch stores the
    transposes, query/key/value stacked in `in_proj_weight`)."""
    import torch

    embed = HEADS * KEY_DIM
    mha = torch.nn.MultiheadAttention(embed, HEADS, bias=True, batch_first=True)
    w = [np.asarray(keras.ops.convert_to_numpy(v)) for v in ours.weights]
    wq, bq, wk, bk, wv, bv, wo, bo = (x.astype("float32") for x in w)
    with torch.no_grad():
        mha.in_proj_weight.copy_(
            torch.from_numpy(
                np.concatenate(
                    [x.reshape(embed, embed).T for x in (wq, wk, wv)]
                )
            )
        )
        mha.in_proj_bias.copy_(
            torch.from_numpy(
                np.concatenate([x.reshape(-1) for x in (bq, bk, bv)])
            )
        )
        mha.out_proj.weight.copy_(torch.from_numpy(wo.reshape(embed, -1).T))
        mha.out_proj.bias.copy_(torch.from_numpy(bo))
    return mha


def torch_mha_call(mha, x, causal, dtype, scores):
    """`mha(x, x, x)` (batch first); causal through `is_causal` with the
    mask it requires; bfloat16 through `torch.autocast` (the analogue of
    Keras's mixed_bfloat16 policy)."""
    import torch

    mask = None
    if causal:
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
    with torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bfloat16"):
        y, w = mha(
            x,
            x,
            x,
            attn_mask=mask,
            is_causal=causal,
            need_weights=scores,
            average_attn_weights=False,
        )
    return (y, w) if scores else y


def make_torch_mha_step(mha, causal, dtype, scores):
    import torch

    def forward(x):
        y = torch_mha_call(mha, x, causal, dtype, scores)
        if scores:
            y, w = y
            return torch.sum(y.float() ** 2) + torch.sum(w.float())
        return torch.sum(y.float() ** 2)

    params = list(mha.parameters())

    def step(x):
        x = x.detach().requires_grad_(True)
        grads = torch.autograd.grad(forward(x), [x] + params)
        return grads[0].numpy()

    return step


def check_same(ours, theirs, x, causal, dtype):
    """Max |difference| of the forward outputs (raises beyond atol);
    `theirs` is a Keras layer or a function of `x`."""
    y1 = keras.ops.convert_to_numpy(
        keras.ops.cast(ours(x, x, use_causal_mask=causal), "float32")
    )
    if isinstance(theirs, keras.layers.Layer):
        y2 = theirs(x, x, use_causal_mask=causal)
    else:
        y2 = theirs(x)
    y2 = keras.ops.convert_to_numpy(keras.ops.cast(y2, "float32"))
    diff = float(np.max(np.abs(y1 - y2)))
    atol = (
        1e-4 if dtype == "float32" else 3e-2 * max(1.0, float(np.abs(y2).max()))
    )
    if not diff <= atol:
        raise AssertionError(f"outputs differ by {diff} > {atol}")
    return diff


def bench(config, repeats, warmup, peak):
    t, batch, causal, dtype, jit, scores = config
    ours, theirs = make_layers(dtype)
    x = np.random.default_rng(1).normal(size=(batch, t, HEADS * KEY_DIM))
    x = keras.ops.convert_to_tensor(x.astype("float32"))
    diff = check_same(ours, theirs, x, causal, dtype)
    fns = {
        "ours": lambda f=make_step(ours, causal, jit, scores): f(x),
        "keras": lambda f=make_step(theirs, causal, jit, scores): f(x),
    }
    if BACKEND == "torch":
        import torch

        mha = make_torch_mha(ours)
        with torch.no_grad():
            diff_torch = check_same(
                ours,
                lambda x: torch_mha_call(mha, x, causal, dtype, False),
                x,
                causal,
                dtype,
            )
        step = make_torch_mha_step(mha, causal, dtype, scores)
        fns["torch.nn"] = lambda: step(x)
    times = time_interleaved(fns, repeats=repeats, warmup=warmup)
    flops = 3 * 4 * batch * HEADS * t * t * KEY_DIM
    gflops = flops / times["ours"] / 1e9
    row = [
        t,
        batch,
        "yes" if causal else "no",
        dtype,
        "yes" if jit else ("-" if BACKEND != "tensorflow" else "no"),
        "yes" if scores else "no",
        times["ours"] * 1e3,
        times["keras"] * 1e3,
        times["ours"] / times["keras"],
    ]
    if BACKEND == "torch":
        row += [
            times["torch.nn"] * 1e3,
            times["ours"] / times["torch.nn"],
        ]
    row += [gflops, gflops / peak, diff]
    if BACKEND == "torch":
        row.append(diff_torch)
    return row


def memory_child(impl, t, batch, causal):
    ours, theirs = make_layers("float32")
    layer = ours if impl == "ours" else theirs
    x = np.random.default_rng(1).normal(size=(batch, t, HEADS * KEY_DIM))
    step = make_step(layer, causal, False, False)
    g = step(keras.ops.convert_to_tensor(x.astype("float32")))
    if not np.all(np.isfinite(g)):
        raise SystemExit("non-finite gradient")


def memory_table(configs, limit_gib, timeout):
    rows = []
    for t, batch, causal in configs:
        mem = {}
        for impl in ("ours", "keras"):
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--memory-child",
                impl,
                str(t),
                str(batch),
                str(int(causal)),
                "--limit-gib",
                str(limit_gib),
            ]
            start = time.perf_counter()
            mem[impl] = try_peak_rss_mb(cmd, timeout=timeout)
            print(
                f"  memory {impl} T={t} b={batch} causal={causal}: "
                f"{mem[impl]} MiB in {time.perf_counter() - start:.0f} s",
                flush=True,
            )
        ratio = (
            mem["ours"] / mem["keras"] if mem["ours"] and mem["keras"] else None
        )
        rows.append(
            [
                t,
                batch,
                "yes" if causal else "no",
                mem["ours"] if mem["ours"] is not None else "failed",
                mem["keras"] if mem["keras"] is not None else "failed",
                ratio,
            ]
        )
    return rows


def plan(args):
    """(T, batch, causal, dtype, jit, scores) configurations to time."""
    configs = []
    jits = [False, True] if BACKEND == "tensorflow" else [False]
    if args.quick:
        jits = [False]
    if args.full:
        for t in (128, 512, 2048, 8192):
            batch = 1 if t == 8192 else 4
            for causal in (False, True):
                for dtype in ("float32", "bfloat16"):
                    for jit in jits:
                        configs.append((t, batch, causal, dtype, jit, False))
        for t in (128, 512, 2048):
            configs.append((t, 4, False, "float32", False, True))
        return configs
    sizes = [int(s) for s in args.sizes.split(",") if s]
    for t in sizes:
        batch = 1 if t >= 8192 else args.batch
        for causal in (False, True):
            for jit in jits if t <= 2048 else [False]:
                configs.append((t, batch, causal, "float32", jit, False))
            if t <= args.bf16_max:
                configs.append((t, batch, causal, "bfloat16", False, False))
        if t <= args.scores_max:
            configs.append((t, batch, False, "float32", False, True))
    return configs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", help="T values (default 128,512,2048,8192; quick: 128,512)"
    )
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument(
        "--bf16-max", type=int, default=2048, help="largest T timed in bfloat16"
    )
    parser.add_argument(
        "--scores-max",
        type=int,
        default=2048,
        help="largest T timed with return_attention_scores",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="every size x causal x dtype x jit_compile",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--memory",
        default="8192:1:1,32768:1:1",
        help="T:batch:causal,... for the peak-RSS table ('' = none)",
    )
    parser.add_argument("--memory-timeout", type=float, default=900)
    parser.add_argument(
        "--limit-gib",
        type=float,
        default=16,
        help="address-space limit of a memory child, so that "
        "an impossible allocation fails instead of swapping",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="T = 128 and 512, float32 only, no jit_compile variants, "
        "no memory table (about 1-2 minutes per backend)",
    )
    parser.add_argument("--markdown", help="write the tables to this file")
    parser.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = "128,512" if args.quick else "128,512,2048,8192"
    if args.quick:
        args.bf16_max, args.scores_max, args.memory = 0, 0, ""

    if args.memory_child:
        import resource

        # Data size only: TF reserves much more virtual address space.
        limit = int(args.limit_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        impl, t, batch, causal = args.memory_child
        memory_child(impl, int(t), int(batch), bool(int(causal)))
        return

    load_before = load_average()
    peak = matmul_peak_gflops()
    print(f"{machine_summary()}, backend {BACKEND}")
    print(f"load average before: {load_before}")
    print(
        f"float32 matmul peak (2048^3, median of 5): {peak:.1f} GFLOP/s",
        flush=True,
    )
    headers = [
        "T",
        "batch",
        "causal",
        "dtype",
        "jit_compile",
        "scores",
        "ours ms",
        "Keras ms",
        "ours/Keras",
    ]
    if BACKEND == "torch":
        headers += ["torch.nn ms", "ours/torch.nn"]
    headers += ["core GFLOP/s", "of peak", "max |diff|"]
    if BACKEND == "torch":
        headers.append("max |diff| torch.nn")
    rows = []
    for config in plan(args):
        start = time.perf_counter()
        rows.append(bench(config, args.repeats, args.warmup, peak))
        print(
            "  "
            + " | ".join(
                f"{x:.3g}" if isinstance(x, float) else str(x) for x in rows[-1]
            )
            + f"   ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    text = [
        f"Machine: {machine_summary()}; backend {BACKEND}; float32 matmul "
        f"peak measured in the run: {peak:.1f} GFLOP/s; load average "
        f"before {load_before}, after the timings {load_average()}.",
    ]
    if rows:
        text += ["", markdown_table(headers, rows)]
    if args.memory:
        configs = [
            tuple(int(v) for v in item.split(":"))
            for item in args.memory.split(",")
        ]
        mem_rows = memory_table(configs, args.limit_gib, args.memory_timeout)
        text += [
            "",
            "Peak RSS of one training step (float32, fresh process each; "
            f"'failed' = could not allocate under a {args.limit_gib:g} GiB "
            "data limit or timed out):",
            "",
            markdown_table(
                ["T", "batch", "causal", "ours MiB", "Keras MiB", "ours/Keras"],
                mem_rows,
            ),
        ]
    text = "\n".join(text)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
