"""Ring attention (context parallelism, issue 40) on N virtual CPU
devices: per-device memory of a causal training step, and the load
balance of the striped and contiguous layouts.

    python benchmarks/ring_attention.py [--markdown FILE]
    python benchmarks/ring_attention.py --quick      # tiny sizes (smoke)

It starts JAX itself with `XLA_FLAGS=--xla_force_host_platform_device_count
=N` (`--devices`, default 8) and `KERAS_BACKEND=jax`.

Memory. The runtime peak of one virtual CPU device cannot be read (JAX's
`memory_stats()` is None on CPU devices, and the N devices share one
process), so the figures are XLA's compiled memory analysis of each
program (`jax.jit(f).lower(...).compile().memory_analysis()`), which is
per device for a sharded program: arguments + outputs + temporaries (less
what outputs alias), nothing run. Two causal training steps (the
gradients of `sum(output * w)`), batch `--batch`, `--heads` query heads of
`--head-dim`, `--kv-heads` key/value heads:

- attention: `ring_attention` at `T = N x L` (`L = --length`, default
  8,192), each layout, against one-device `dot_product_attention` at `T =
  L` (its automatic path);
- decoder block: a `TransformerDecoderBlock` (width heads x head dim,
  feed-forward 4x) under `ContextParallel` at `T = N x L`, against the
  same block on one device at `T = L` (gradients of the weights and the
  input).

Balance. Causal attention per device, for each layout, at `L =
--balance-length` tokens per device: the blocks it computes (of N; a
contiguous device skips the blocks of later devices), the query-key
pairs it sees, and the time of its forward and backward passes run alone
on one device (its N block computations, merges and block gradients,
as the ring runs them, without the hops; `_ring_blocks`, the ring's own
per-block code), interleaved over `--repeats` rounds (medians). Then the
whole ring step of each layout on the N virtual devices: those share
the machine's cores, so only its ratio between layouts means something.
"""

import argparse
import functools
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402
from _timing import time_interleaved  # noqa: E402

LAYOUTS = ("striped", "contiguous")
QUICK = dict(
    devices=4,
    length=64,
    heads=2,
    kv_heads=2,
    head_dim=8,
    balance_length=32,
    repeats=1,
)
MIB = 2**20


def start_jax(devices):
    """Sets the device count and the backend before JAX starts."""
    if "jax" in sys.modules:
        raise SystemExit("JAX is already imported: run this as a script.")
    backend = os.environ.setdefault("KERAS_BACKEND", "jax")
    if backend != "jax":
        raise SystemExit(
            f"The ring runs on JAX: unset KERAS_BACKEND. Received: {backend!r}"
        )
    flag = f"--xla_force_host_platform_device_count={devices}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}"


def memory(compiled):
    """`(arguments, outputs, temporaries, total)` in MiB per device."""
    m = compiled.memory_analysis()
    parts = [
        m.argument_size_in_bytes,
        m.output_size_in_bytes,
        m.temp_size_in_bytes,
    ]
    total = sum(parts) - m.alias_size_in_bytes
    return [x / MIB for x in parts + [total]]


def _abstract(shape, sharding=None, dtype="float32"):
    import jax

    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def attention_memory(args, mesh, layout):
    """Memory of the attention step: one device at L (layout None) or the
    ring at N x L."""
    import jax
    import keras

    import keras_attention as ka

    n = mesh.shape["sequence"]
    length = args.length if layout is None else n * args.length
    q_shape = (args.batch, length, args.heads, args.head_dim)
    kv_shape = (args.batch, length, args.kv_heads, args.head_dim)

    def attend(q, k, v):
        if layout is None:
            return ka.ops.dot_product_attention(q, k, v, causal=True)
        return ka.distribution.ring_attention(
            q, k, v, mesh, causal=True, layout=layout
        )

    def loss(q, k, v, w):
        return keras.ops.sum(attend(q, k, v) * w)

    sharding = None
    if layout is not None:
        spec = jax.sharding.PartitionSpec(None, "sequence")
        sharding = jax.sharding.NamedSharding(mesh, spec)
    shapes = (q_shape, kv_shape, kv_shape, q_shape)
    inputs = [_abstract(s, sharding) for s in shapes]
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    return memory(grad.lower(*inputs).compile())


def block_memory(args, devices):
    """Memory of the decoder block's step: `(one device at L, the ring
    under ContextParallel at N x L)`."""
    import jax
    import keras

    import keras_attention as ka
    from keras_attention.blocks import TransformerDecoderBlock

    width = args.heads * args.head_dim
    n = len(devices)
    mesh = keras.distribution.DeviceMesh((1, n), ("batch", "sequence"), devices)
    distribution = ka.distribution.ContextParallel(mesh)
    results = []
    for length, scope in (
        (args.length, None),
        (n * args.length, distribution),
    ):
        block = TransformerDecoderBlock(
            args.heads,
            4 * width,
            cross_attention=False,
            norm_first=True,
            num_key_value_heads=args.kv_heads,
        )
        block.build((args.batch, length, width))
        weights = [v.value for v in block.trainable_variables]

        def loss(weights, x, w, block=block):
            out, _ = block.stateless_call(weights, [], x)
            return keras.ops.sum(out * w)

        shape = (args.batch, length, width)
        sharding = None
        if scope is not None:
            spec = jax.sharding.PartitionSpec("batch", "sequence")
            sharding = jax.sharding.NamedSharding(mesh.backend_mesh, spec)
        abstract = [_abstract(w.shape) for w in weights]
        inputs = [_abstract(shape, sharding) for _ in range(2)]
        grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
        if scope is None:
            results.append(memory(grad.lower(abstract, *inputs).compile()))
            continue
        with scope.scope():
            results.append(memory(grad.lower(abstract, *inputs).compile()))
    return results


def memory_rows(args):
    import jax
    import numpy as np

    devices = jax.devices()
    n = len(devices)
    mesh = jax.sharding.Mesh(np.array(devices), ("sequence",))
    rows = []

    def row(step, layout, count, length, values, base):
        ratio = f"{values[-1] / base:.2f}" if base else "1.00"
        cells = [step, layout, count, length, length // count]
        return cells + [f"{v:.1f}" for v in values] + [ratio]

    one = attention_memory(args, mesh, None)
    rows.append(row("attention", "-", 1, args.length, one, None))
    for layout in LAYOUTS:
        ring = attention_memory(args, mesh, layout)
        rows.append(row("attention", layout, n, n * args.length, ring, one[-1]))
    one, ring = block_memory(args, devices)
    rows.append(row("decoder block", "-", 1, args.length, one, None))
    rows.append(
        row("decoder block", "striped", n, n * args.length, ring, one[-1])
    )
    return rows


def device_program(config, r):
    """Device `r`'s forward and backward passes, alone: its queries
    against the N key/value blocks in the ring's order (`s = r, r - 1,
    ...`), merged by log-sum-exp, then each block's gradient from the
    merged result (the ring's own per-block functions, no hops)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from keras_attention.distribution import _ring_blocks as blocks

    n = config.num_blocks
    sources = [(r - step) % n for step in range(n)]
    kinds = [
        config.kinds()[int(config.kind_index(np.int32(r), np.int32(s)))]
        for s in sources
    ]

    def block(step, q, k, v):
        tables = blocks.Tables(
            config.positions(r), config.positions(sources[step])
        )
        return blocks.attend_block(config, kinds[step], q, k, v, (), tables)

    def run(q, ks, vs, d_out):
        out, lse = blocks.empty_block(q, vs[0])
        out = out.astype(lse.dtype)
        for step in range(n):
            o, lse_b = block(step, q, ks[step], vs[step])
            out, lse = blocks.merge(out, lse, o, lse_b)
        d_lse = jnp.zeros_like(lse)
        grads = []
        for step in range(n):
            fn = functools.partial(block, step)
            (o, lse_b), pull = jax.vjp(fn, q, ks[step], vs[step])
            cot = blocks.block_cotangents(out, lse, d_out, d_lse, o, lse_b)
            grads.append(pull(cot))
        return out, grads

    return jax.jit(run), kinds


def visible_pairs(layout, r, n, length):
    """Causal query-key pairs device `r`'s queries see."""
    rows = range(length)
    if layout == "striped":
        return sum(i * n + r + 1 for i in rows)
    return sum(r * length + i + 1 for i in rows)


def balance_rows(args):
    import jax
    import keras
    import numpy as np

    import keras_attention as ka
    from keras_attention.distribution import _ring_blocks as blocks

    devices = jax.devices()
    n, length = len(devices), args.balance_length
    rng = np.random.default_rng(0)

    def normal(*shape):
        return rng.normal(size=shape).astype("float32")

    q = normal(args.batch, length, args.heads, args.head_dim)
    ks = [normal(args.batch, length, args.kv_heads, args.head_dim)]
    ks = ks * n
    d_out = normal(args.batch, length, args.heads, args.head_dim)
    programs, work = {}, {}
    for layout in LAYOUTS:
        config = blocks.RingConfig(
            num_blocks=n,
            block_length=length,
            length=n * length,
            layout=layout,
            causal=True,
            scale=args.head_dim**-0.5,
        )
        for r in range(n):
            program, kinds = device_program(config, r)
            computed = sum(kind != blocks.SKIPPED for kind in kinds)
            pairs = visible_pairs(layout, r, n, length)
            work[layout, r] = (computed, pairs)
            programs[layout, r] = functools.partial(
                lambda p: jax.block_until_ready(p(q, ks, ks, d_out)),
                program,
            )
    seconds = time_interleaved(programs, repeats=args.repeats, warmup=1)

    # The whole ring step on the N virtual devices (time ratio only).
    mesh = jax.sharding.Mesh(np.array(devices), ("sequence",))
    x = normal(args.batch, n * length, args.heads, args.head_dim)
    steps = {}
    for layout in LAYOUTS:

        def loss(x, layout=layout):
            out = ka.distribution.ring_attention(
                x, x, x, mesh, causal=True, layout=layout
            )
            return keras.ops.sum(out * x)

        grad = jax.jit(jax.grad(loss))
        steps[layout] = functools.partial(
            lambda g: jax.block_until_ready(g(x)), grad
        )
    ring = time_interleaved(steps, repeats=args.repeats, warmup=1)

    rows = []
    for layout in LAYOUTS:
        times = [seconds[layout, r] for r in range(n)]
        blocks_done = [work[layout, r][0] for r in range(n)]
        pairs = [work[layout, r][1] for r in range(n)]
        rows.append(
            [
                layout,
                f"{min(blocks_done)}-{max(blocks_done)} of {n}",
                f"{max(pairs) / min(pairs):.2f}",
                " ".join(f"{1000 * t:.1f}" for t in times),
                f"{max(times) / min(times):.2f}",
                f"{1000 * ring[layout]:.0f}",
                f"{ring[layout] / ring['striped']:.2f}",
            ]
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--balance-length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--tables",
        default="memory,balance",
        help="comma-separated: memory, balance",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--markdown", default=None, help="also write here")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    tables = set(args.tables.split(","))
    unknown = tables - {"memory", "balance"}
    if unknown:
        parser.error(f"--tables: unknown {sorted(unknown)}")
    start_jax(args.devices)
    import jax  # noqa: F401 (its version in the summary)
    import keras  # noqa: F401

    print(machine_summary())
    before = load_average()
    print("load before:", before)
    text = (
        f"Causal training step, batch {args.batch}, {args.heads} heads "
        f"({args.kv_heads} key/value) of {args.head_dim}, "
        f"{args.devices} virtual CPU devices.\n\n"
    )
    if "memory" in tables:
        text += memory_text(args)
    if "balance" in tables:
        text += balance_text(args)
    after = load_average()
    print("load after:", after)
    text += f"Load average before: {before}, after: {after}\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(machine_summary() + "\n\n" + text)


def memory_text(args):
    table = markdown_table(
        [
            "step",
            "layout",
            "devices",
            "T",
            "T per device",
            "arguments MiB",
            "outputs MiB",
            "temporaries MiB",
            "total MiB",
            "x one device",
        ],
        memory_rows(args),
    )
    return (
        "memory per device (XLA's compiled memory analysis; x one "
        f"device: total / the one-device step at T = {args.length}):\n\n"
        f"{table}\n\n"
    )


def balance_text(args):
    table = markdown_table(
        [
            "layout",
            "blocks computed per device",
            "visible pairs max/min",
            "ms per device, alone (devices 0..N-1)",
            "slowest/fastest",
            "ring step ms (N virtual devices)",
            "ring step / striped",
        ],
        balance_rows(args),
    )
    return (
        f"balance (causal, {args.balance_length} tokens per device):\n\n"
        f"{table}\n\n"
    )


if __name__ == "__main__":
    main()
