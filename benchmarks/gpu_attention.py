"""GPU attention: ours against the native kernels, called directly in
the same process, and a short training of the language-model example.
`benchmarks/gpu.sh` runs it once per part (JAX and PyTorch only: the
GPU machine has no TensorFlow):

    KERAS_BACKEND=jax python benchmarks/gpu_attention.py --part jax
    KERAS_BACKEND=torch python benchmarks/gpu_attention.py --part torch
    KERAS_BACKEND=jax python benchmarks/gpu_attention.py --part fit
    ... --dry-run      # tiny sizes, runs on a CPU (CI's smoke test)

Attention (`--part jax|torch`): bfloat16, `--heads` heads of `--dim`,
T = `--lengths` (2,048, 8,192, 32,768) with `--tokens` tokens per batch
(batch = tokens / T), causal and a causal document mask (`--documents`
equal documents per row; ours: `and_masks(CausalMask(), DocumentMask())`
bound to the segment ids). One forward and backward pass (gradients of
q, k, v), timed interleaved (medians of `--repeats` after a warm-up,
the device synchronized after each):

- JAX: `keras_attention.ops.dot_product_attention` (automatic choice)
  against `jax.nn.dot_product_attention(implementation="cudnn")` (the
  causal flag; the document mask as a dense mask, XLA's implementation
  where cuDNN refuses it), both under `jax.jit`;
- PyTorch: ours (automatic: SDPA for causal, FlexAttention for the
  document mask) against `scaled_dot_product_attention` (flash for
  causal, the memory-efficient kernel with a dense boolean mask for
  documents) and `flex_attention` compiled and called directly with its
  own `create_block_mask`.

Columns: ms, TFLOP/s (4 * b * h * d * allowed pairs forward, 3.5 times
that with the backward pass), the ratio to the first native kernel of
the row's group, peak memory (PyTorch: `max_memory_allocated` above the
inputs; JAX: the compiled program's temporaries and outputs, XLA's
memory analysis) and the largest difference of the outputs from that
native kernel's. On a CPU (`--dry-run`) the PyTorch part times the
forward pass only (FlexAttention has no backward pass there).

`--part fit`: `--fit-steps` (50) steps of `model.fit` of the
language-model example's model (`examples/language_model/model.py`,
mixed bfloat16, XLA) on random tokens, after a compiling warm-up:
tokens per second.
"""

import argparse
import contextlib
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from _timing import markdown_table  # noqa: E402
from _timing import time_interleaved  # noqa: E402


def _block_tensorflow():
    """Makes TensorFlow absent (the GPU machine has none: a dry run with
    `--no-tensorflow` shows the script does not need it): its modules
    have no origin, and importing one raises `ImportError`."""

    class Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorflow", "tensorflow_text"):
                return importlib.machinery.ModuleSpec(name, self)
            return None

        def create_module(self, spec):
            raise ImportError(f"{spec.name}: no TensorFlow on a GPU machine")

        def exec_module(self, module):  # pragma: no cover - never created
            pass

    sys.meta_path.insert(0, Absent())


def segment_ids(batch, length, documents):
    size = max(length // documents, 1)
    ids = np.minimum(np.arange(length) // size, documents - 1)
    return np.broadcast_to(ids, (batch, length)).astype("int32")


def allowed_pairs(ids, causal=True):
    """Pairs (query, key) the mask allows, per head, summed over the
    batch: the work of a kernel that skips the others."""
    total = 0
    for row in ids:
        _, sizes = np.unique(row, return_counts=True)
        total += int(sum(n * (n + 1) // 2 for n in sizes))
    return total


def _ours_kwargs(mask, ids):
    from keras_attention import mods

    if mask == "causal":
        return {"causal": True}
    documents = mods.DocumentMask().bind(segment_ids=ids)
    return {"mask_mod": mods.and_masks(mods.CausalMask(), documents)}


def _flops(args, batch, length, mask, ids, backward):
    pairs = (
        batch * length * (length + 1) // 2
        if mask == "causal"
        else allowed_pairs(ids)
    )
    forward = 4.0 * args.heads * args.dim * pairs
    return forward * (3.5 if backward else 1.0)


def _row(name, length, mask, ms, flops, ratio, memory, error):
    return [
        length,
        mask,
        name,
        ms,
        flops / (ms * 1e-3) / 1e12,
        ratio,
        memory,
        error,
    ]


# JAX ------------------------------------------------------------------------


def jax_rows(args):
    import jax
    import jax.numpy as jnp

    import keras_attention

    gpu = jax.default_backend() == "gpu"
    rows = []
    for length in args.lengths:
        batch = max(args.tokens // length, 1)
        key = jax.random.PRNGKey(length)
        shape = (batch, length, args.heads, args.dim)
        q, k, v, g = (
            jax.random.normal(s, shape, jnp.bfloat16)
            for s in jax.random.split(key, 4)
        )
        ids = segment_ids(batch, length, args.documents)
        for mask in ("causal", "document"):
            kwargs = _ours_kwargs(mask, ids)
            dense = None
            if mask == "document":
                i = np.arange(length)
                dense = (ids[:, None, :, None] == ids[:, None, None, :]) & (
                    i[None, None, :, None] >= i[None, None, None, :]
                )
                dense = jnp.asarray(dense)

            def ours(q, k, v, kwargs=kwargs):
                return keras_attention.ops.dot_product_attention(
                    q, k, v, **kwargs
                )

            def native(q, k, v, dense=dense, i="cudnn"):
                return jax.nn.dot_product_attention(
                    q,
                    k,
                    v,
                    mask=dense,
                    is_causal=dense is None,
                    implementation=i,
                )

            steps, memory = {}, {}
            candidates = [("ours", ours)]
            for impl in ("cudnn", "xla") if gpu else ("xla",):
                candidates.append(
                    (f"jax.nn {impl}", functools.partial(native, i=impl))
                )
            for name, fn in candidates:
                if name.startswith("jax.nn") and any(
                    n.startswith("jax.nn") for n in steps
                ):
                    continue  # cuDNN ran: XLA's is not the native one.

                def step(q, k, v, g, fn=fn):
                    out, pull = jax.vjp(fn, q, k, v)
                    return (out,) + pull(g)

                try:
                    compiled = jax.jit(step).lower(q, k, v, g).compile()
                except Exception as error:  # noqa: BLE001 - cuDNN refused.
                    print(f"# {name} at T={length}, {mask}: {error!r:.200}")
                    continue
                steps[name] = compiled
                analysis = compiled.memory_analysis()
                memory[name] = None
                if analysis is not None:
                    memory[name] = (
                        analysis.temp_size_in_bytes
                        + analysis.output_size_in_bytes
                    ) / 2**20
            outs = {n: s(q, k, v, g)[0] for n, s in steps.items()}
            times = time_interleaved(
                {
                    n: (lambda s=s: jax.block_until_ready(s(q, k, v, g)))
                    for n, s in steps.items()
                },
                repeats=args.repeats,
                warmup=1,
            )
            flops = _flops(args, batch, length, mask, ids, backward=True)
            native_name = next(n for n in steps if n != "ours")
            for name, seconds in times.items():
                error = float(
                    jnp.max(
                        jnp.abs(
                            outs[name].astype(jnp.float32)
                            - outs[native_name].astype(jnp.float32)
                        )
                    )
                )
                rows.append(
                    _row(
                        name,
                        length,
                        mask,
                        seconds * 1e3,
                        flops,
                        seconds / times[native_name],
                        memory[name],
                        error,
                    )
                )
    return rows, "forward + backward"


# PyTorch --------------------------------------------------------------------


def torch_rows(args):
    import torch
    import torch._dynamo
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention

    import keras_attention

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    backward = cuda  # FlexAttention has no backward pass on a CPU.
    torch._dynamo.config.recompile_limit = 64  # A kernel per case.
    flex = torch.compile(flex_attention, dynamic=False)
    rows = []
    for length in args.lengths:
        batch = max(args.tokens // length, 1)
        gen = torch.Generator(device=device).manual_seed(length)
        shape = (batch, args.heads, length, args.dim)
        q, k, v, g = (
            torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)
            for _ in range(4)
        )
        for x in (q, k, v):
            x.requires_grad_(backward)
        ids = segment_ids(batch, length, args.documents)
        ids_t = torch.as_tensor(ids, device=device)
        for mask in ("causal", "document"):
            kwargs = _ours_kwargs(mask, ids)
            if mask == "causal":

                def flex_mask(b, h, qi, ki):
                    return qi >= ki

                block_mask = create_block_mask(
                    flex_mask, None, None, length, length, device=device
                )
                dense = None
                sdpa_backend = SDPBackend.FLASH_ATTENTION
            else:

                def flex_mask(b, h, qi, ki):
                    return (ids_t[b, qi] == ids_t[b, ki]) & (qi >= ki)

                block_mask = create_block_mask(
                    flex_mask, batch, None, length, length, device=device
                )
                dense = (ids_t[:, None, :, None] == ids_t[:, None, None, :]) & (
                    torch.ones(
                        length, length, dtype=torch.bool, device=device
                    ).tril()[None, None]
                )
                sdpa_backend = SDPBackend.EFFICIENT_ATTENTION

            def sdpa(q, k, v, dense=dense, backend=sdpa_backend):
                chosen = (
                    sdpa_kernel([backend]) if cuda else contextlib.nullcontext()
                )
                with chosen:
                    return F.scaled_dot_product_attention(
                        q, k, v, attn_mask=dense, is_causal=dense is None
                    )

            def ours(q, k, v, kwargs=kwargs):
                out = keras_attention.ops.dot_product_attention(
                    q.transpose(1, 2),
                    k.transpose(1, 2),
                    v.transpose(1, 2),
                    **kwargs,
                )
                return out.transpose(1, 2)

            fns = {
                _sdpa_name(mask, cuda): sdpa,
                "flex_attention": (
                    lambda q, k, v, bm=block_mask: flex(q, k, v, block_mask=bm)
                ),
                "ours": ours,
            }

            def run(fn):
                if not backward:
                    with torch.no_grad():
                        out = fn(q, k, v)
                    return out, None
                out = fn(q, k, v)
                grads = torch.autograd.grad(out, (q, k, v), g)
                return out.detach(), grads

            def timed(fn):
                def call():
                    run(fn)
                    if cuda:
                        torch.cuda.synchronize()

                return call

            outs, memory = {}, {}
            for name, fn in fns.items():
                outs[name] = run(fn)[0]  # Compiles; then the peak alone.
                memory[name] = None
                if cuda:
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    run(fn)
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated() - base
                    memory[name] = peak / 2**20
            times = time_interleaved(
                {n: timed(f) for n, f in fns.items()},
                repeats=args.repeats,
                warmup=1,
            )
            flops = _flops(args, batch, length, mask, ids, backward)
            native = next(iter(fns))
            for name, seconds in times.items():
                error = float(
                    (outs[name].float() - outs[native].float()).abs().max()
                )
                rows.append(
                    _row(
                        name,
                        length,
                        mask,
                        seconds * 1e3,
                        flops,
                        seconds / times[native],
                        memory[name],
                        error,
                    )
                )
    return rows, "forward + backward" if backward else "forward (CPU)"


def _sdpa_name(mask, cuda):
    if mask == "causal":
        return "SDPA flash" if cuda else "SDPA"
    return "SDPA, dense mask"


# Training -------------------------------------------------------------------


def fit_rows(args):
    import jax
    import keras

    from examples.language_model.model import build_language_model

    if jax.default_backend() == "gpu":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    length, batch = args.fit_length, args.fit_batch
    model, _ = build_language_model(
        256,
        length,
        hidden_dim=args.fit_hidden,
        num_layers=args.fit_layers,
        num_heads=args.fit_heads,
        dropout=0.0,
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 256, size=(args.fit_steps * batch, length + 1))
    x, y = tokens[:, :-1].astype("int32"), tokens[:, 1:].astype("int32")
    warm = min(2, args.fit_steps) * batch
    start = time.perf_counter()
    model.fit(x[:warm], y[:warm], batch_size=batch, epochs=1, verbose=0)
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    history = model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    seconds = time.perf_counter() - start
    loss = history.history["loss"][-1]
    return [
        [
            f"{args.fit_layers} layers x {args.fit_hidden}, "
            f"{args.fit_heads} heads",
            length,
            batch,
            args.fit_steps,
            args.fit_steps * batch * length / seconds,
            seconds / args.fit_steps * 1e3,
            compiled,
            loss,
        ]
    ]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("jax", "torch", "fit"))
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--no-tensorflow", action="store_true")
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[2048, 8192, 32768]
    )
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fit-steps", type=int, default=50)
    parser.add_argument("--fit-length", type=int, default=1024)
    parser.add_argument("--fit-batch", type=int, default=32)
    parser.add_argument("--fit-hidden", type=int, default=512)
    parser.add_argument("--fit-layers", type=int, default=6)
    parser.add_argument("--fit-heads", type=int, default=8)
    parser.add_argument("--markdown", help="append the table to this file")
    args = parser.parse_args(argv)
    if args.dry_run:  # One length from which ours takes FlexAttention.
        args.lengths, args.tokens = [1024], 1024
        args.heads, args.dim, args.repeats = 2, 16, 1
        args.fit_steps, args.fit_length, args.fit_batch = 3, 32, 2
        args.fit_hidden, args.fit_layers, args.fit_heads = 16, 1, 2
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.no_tensorflow:
        _block_tensorflow()
    if args.part == "fit":
        rows = fit_rows(args)
        headers = [
            "model",
            "T",
            "batch",
            "steps",
            "tokens/s",
            "ms/step",
            "compile s",
            "loss",
        ]
        title = "model.fit of the language-model example, JAX, XLA"
    else:
        make = jax_rows if args.part == "jax" else torch_rows
        rows, kind = make(args)
        headers = [
            "T",
            "mask",
            "kernel",
            "ms",
            "TFLOP/s",
            "x native",
            "peak MiB",
            "max |diff|",
        ]
        title = (
            f"{args.part}: {kind}, bfloat16, {args.heads} heads of "
            f"{args.dim}, {args.tokens} tokens per batch"
        )
    text = f"{title}\n\n{markdown_table(headers, rows)}\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text + "\n")
    if args.no_tensorflow and "tensorflow" in sys.modules:
        raise SystemExit("TensorFlow was imported")
    return rows


if __name__ == "__main__":
    main()
