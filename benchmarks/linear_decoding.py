"""Decoding with linear-time mixers: milliseconds per generated token
and peak memory at 1k and 32k generated tokens, for stacks of each
mixer through `CausalLMGenerator` (issue 39's decoding goal: at 32k,
at most 1.1x the per-token time at 1k; memory flat).

    python benchmarks/linear_decoding.py                   # TensorFlow
    KERAS_BACKEND=jax python benchmarks/linear_decoding.py
    python benchmarks/linear_decoding.py --lengths 1024 8192 --repeats 1
    python benchmarks/linear_decoding.py --quick           # tiny, seconds

Stacks (the language-model example's `build_language_model`, random
weights): `--layers` (4) pre-norm decoder blocks of `--hidden-dim` (128)
with `--heads` (4) heads, a vocabulary of 128, of one mixer each:

- attention: full causal softmax attention with rotary positions, the
  reference: the generator keeps a full key/value cache of the output's
  length, and each step attends over it;
- linear: `LinearAttention` with a gated decay (recurrent state);
- gated_delta: `GatedDeltaNet` (recurrent state and convolution);
- hybrid: Qwen 3.5's layout, three gated delta nets then one full
  attention block (its cache grows: a quarter of attention's).

Each generation is greedy, batch 1, from a prompt of 16 tokens, streamed
in pieces of 256 (`generate(..., stream=256)`: the cache is carried
from piece to piece, the tokens never held whole; fewer per piece below
1,024 tokens); its time per token is the whole stream's over the tokens
generated. Each stack's pieces are compiled first (two pieces of a
generation of that length, then dropped); the stacks' generations then
run interleaved, `--repeats` rounds in a rotating order, and the medians
are reported. Peak memory: the peak
resident memory of a fresh process generating that many tokens, less
that of a fresh process holding the same model and generator and
generating nothing (`--no-memory` skips it; on a GPU, RSS does not show
the device's memory). The load average is printed before and after:
publish only from an idle machine.
"""

import argparse
import os
import statistics
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
from _timing import try_peak_rss_mb  # noqa: E402

from examples.language_model.model import block_mixers  # noqa: E402
from examples.language_model.model import build_language_model  # noqa: E402
from keras_attention.generation import CausalLMGenerator  # noqa: E402

BACKEND = keras.backend.backend()
STACKS = ("attention", "linear", "gated_delta", "hybrid")
DEFAULT = dict(lengths=[1024, 32768], hidden_dim=128, heads=4, layers=4)
QUICK = dict(lengths=[32, 128], hidden_dim=16, heads=2, layers=2)
VOCAB, PROMPT, PIECE = 128, 16, 256
LETTERS = {"attention": "A", "linear": "L", "gated_delta": "G"}


def piece_size(length):
    """Tokens per streamed piece: `PIECE`, fewer for short runs (at
    least 4 pieces)."""
    return max(4, min(PIECE, length // 4))


def build(stack, args, seed=0):
    """`(generator, blocks)`: the generator (XLA on TensorFlow) of a stack
    of `stack` blocks, random weights, and each block's mixer."""
    keras.utils.set_random_seed(seed)
    model, generator = build_language_model(
        VOCAB,
        PROMPT,
        hidden_dim=args.hidden_dim,
        num_layers=args.layers,
        num_heads=args.heads,
        dropout=0.0,
        mixer=stack,
    )
    generator = CausalLMGenerator(
        generator.embedding, generator.blocks, generator.head
    )
    return generator, block_mixers(model)


def prompt(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, VOCAB, size=(PROMPT,)).astype("int32")


def pieces(generator, length):
    """The streamed generation of `length` tokens after the prompt."""
    return generator.generate(
        prompt(), max_length=PROMPT + length, stream=piece_size(length)
    )


def warm_up(generator, length):
    """Compiles the pieces of a generation of `length` tokens (the first
    piece and the next are two compiled functions; a mixed cache's are
    compiled per length): two pieces, then the generation is dropped."""
    stream = pieces(generator, length)
    for _ in range(2):
        next(stream, None)
    stream.close()


def decode(generator, length):
    """Seconds per token of a generation of `length` tokens (compiled
    before: `warm_up`), the whole stream consumed."""
    start = time.perf_counter()
    tokens = sum(np.asarray(p).shape[-1] for p in pieces(generator, length))
    return (time.perf_counter() - start) / max(tokens - PROMPT, 1)


def interleaved(fns, repeats):
    """`{name: median}` of `fns[name]()` (each returns its own measured
    time), `repeats` rounds in a rotating order."""
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(fns[name]())
    return {name: statistics.median(ts) for name, ts in times.items()}


def _child(stack, length, args):
    """One stack's generation of `length` tokens (`idle`: none) in this
    process, for its peak memory."""
    generator, _ = build(stack, args)
    if length != "idle":
        decode(generator, int(length))


def peak_memory_mb(stack, length, args):
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        stack,
        str(length),
        "--hidden-dim",
        str(args.hidden_dim),
        "--heads",
        str(args.heads),
        "--layers",
        str(args.layers),
    ]
    env = dict(os.environ, KERAS_BACKEND=BACKEND)
    return try_peak_rss_mb(cmd, env=env, timeout=7200)


def rows(args):
    """One row per stack: ms/token at each length, the ratio of the last
    to the first, peak MiB at each length."""
    built = {stack: build(stack, args) for stack in args.stacks}
    per_token = {}
    for length in args.lengths:
        for generator, _ in built.values():
            warm_up(generator, length)
        per_token[length] = interleaved(
            {
                stack: (lambda g=built[stack][0]: decode(g, length))
                for stack in args.stacks
            },
            args.repeats,
        )
        print(f"{length} tokens: " + ", ".join(
            f"{s} {1e3 * t:.3f} ms/token" for s, t in per_token[length].items()
        ), flush=True)  # fmt: skip
    memory = {}
    if not args.no_memory:
        for stack in args.stacks:
            idle = peak_memory_mb(stack, "idle", args)
            for length in args.lengths:
                peak = peak_memory_mb(stack, length, args)
                ok = None not in (peak, idle)
                memory[stack, length] = f"{peak - idle:.0f}" if ok else "failed"
    first, last = args.lengths[0], args.lengths[-1]
    table = []
    for stack in args.stacks:
        times = [per_token[n][stack] for n in args.lengths]
        table.append(
            [stack, "".join(LETTERS[m] for m in built[stack][1])]
            + [f"{1e3 * t:.3f}" for t in times]
            + [f"{per_token[last][stack] / per_token[first][stack]:.2f}"]
            + [memory.get((stack, n), "n/a") for n in args.lengths]
        )
    return table


def headers(lengths):
    return (
        ["stack", "blocks"]
        + [f"ms/token at {n}" for n in lengths]
        + [f"x {lengths[0]}"]
        + [f"MiB at {n}" for n in lengths]
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--hidden-dim", type=int, default=None)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument(
        "--stacks", nargs="+", choices=STACKS, default=list(STACKS)
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--markdown", default=None)
    parser.add_argument(
        "--child", nargs=2, metavar=("STACK", "T"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else DEFAULT)
    for key in ("lengths", "hidden_dim", "heads", "layers"):
        if getattr(args, key) is None:
            setattr(args, key, sizes[key])
    if args.child:
        _child(args.child[0], args.child[1], args)
        return None
    lines = [
        machine_summary(),
        f"Load average before: {load_average()}",
        f"\nGreedy decoding, {BACKEND} (generator "
        f"{'XLA' if BACKEND == 'tensorflow' else 'compiled'}), batch 1, "
        f"prompt {PROMPT} tokens, {args.layers} pre-norm blocks of "
        f"{args.hidden_dim} ({args.heads} heads), vocabulary {VOCAB}; "
        "streamed in pieces of up to "
        f"{PIECE}; ms/token of the whole stream (compiled before), median of "
        f"{args.repeats} interleaved; memory: peak RSS above an idle "
        "process. Goal: linear and gated_delta at most 1.1x, memory "
        "flat.\n",
    ]
    print("\n".join(lines), flush=True)
    lines.append(markdown_table(headers(args.lengths), rows(args)))
    print(lines[-1], flush=True)
    lines.append(f"\nLoad average after: {load_average()}")
    print(lines[-1])
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
