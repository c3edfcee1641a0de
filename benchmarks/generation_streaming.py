"""Rolling vs full key/value cache: per-token time and peak memory of long
greedy generation with a windowed language model (issue 26).

The model is the language-model example's default (`build_language_model`:
a character vocabulary of 128, 3 pre-norm decoder blocks, d=128, 4 heads,
rotary positions, each position attending to the last 64), random
weights. Two generators over the same weights:

- rolling: `CausalLMGenerator.generate(..., stream=PIECE)` on the windowed
  model, a ring of `window + 1` positions per block, the output streamed
  to the host piece by piece;
- full: today's cache, `(batch, layers, 2, max_length, heads, key_dim)`,
  every step attending over it with the window as a mask (the same model
  with full self-attention under `SlidingWindowMask(64, causal=True)`,
  for which the generator keeps the full cache).

Both give the same tokens (checked at the shortest length). Reports the
median time per generated token at each length, the ratio to the
shortest length, and the peak RSS of a fresh process per configuration;
then a prompt of `--prefill-prompt` tokens (4,096) followed by
`--prefill-new` generated ones (256), both caches: time and peak RSS
(`--only-prefill`: that table alone).

    python benchmarks/generation_streaming.py [--markdown FILE]
    python benchmarks/generation_streaming.py --lengths 64 128 --repeats 1
    python benchmarks/generation_streaming.py --only-prefill

Numbers for publishing need an idle machine (see `_timing.load_average`).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402
from _timing import time_interleaved  # noqa: E402
from _timing import try_peak_rss_mb  # noqa: E402

from examples.language_model.model import build_language_model  # noqa: E402
from keras_attention.blocks import TransformerDecoderBlock  # noqa: E402
from keras_attention.generation import CausalLMGenerator  # noqa: E402
from keras_attention.mods import SlidingWindowMask  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, WINDOW, PIECE = 128, 128, 3, 4, 64, 256


def build(seed=0):
    """`{"rolling": generator, "full": generator}` over the same weights."""
    keras.utils.set_random_seed(seed)
    model, rolling = build_language_model(
        VOCAB,
        WINDOW + 1,
        hidden_dim=DIM,
        num_layers=LAYERS,
        num_heads=HEADS,
        dropout=0.0,
        window=WINDOW,
    )
    rolling = CausalLMGenerator(
        rolling.embedding, rolling.blocks, rolling.head, jit_compile=True
    )
    blocks = [
        TransformerDecoderBlock(
            num_heads=HEADS,
            intermediate_dim=4 * DIM,
            cross_attention=False,
            norm_first=True,
            rotary_max_wavelength=10_000,
            mask_mod=SlidingWindowMask(WINDOW, causal=True),
        )
        for _ in range(LAYERS)
    ]
    embedding = keras.layers.Embedding(VOCAB, DIM)
    head = [keras.layers.LayerNormalization(), keras.layers.Dense(VOCAB)]
    ids = keras.Input((None,), dtype="int32")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    for layer in head:
        x = layer(x)
    keras.Model(ids, x).set_weights(model.get_weights())
    full = CausalLMGenerator(embedding, blocks, head, jit_compile=True)
    return {"rolling": rolling, "full": full}


def prompt(length, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, VOCAB, size=(1, length)).astype("int32")


def generate(generator, kind, ids, max_length):
    """The generated tokens `(1, max_length)` as NumPy."""
    if kind == "rolling":
        pieces = generator.generate(ids, max_length, stream=PIECE)
        return np.concatenate(list(pieces), axis=1)
    return np.asarray(generator.generate(ids, max_length)[0])


def child(kind, prompt_length, max_length):
    """One generation in this process (for the peak-RSS measurement)."""
    generator = build()[kind]
    generate(generator, kind, prompt(prompt_length), max_length)


def peak_rss(kind, prompt_length, max_length):
    return try_peak_rss_mb(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            kind,
            str(prompt_length),
            str(max_length),
        ]
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[1024, 8192, 32768]
    )
    parser.add_argument(
        "--no-full",
        action="store_true",
        help="rolling cache only (the full cache is slow at long lengths)",
    )
    parser.add_argument("--prefill-prompt", type=int, default=4096)
    parser.add_argument("--prefill-new", type=int, default=256)
    parser.add_argument(
        "--only-prefill",
        action="store_true",
        help="only the table of a long prompt then --prefill-new tokens",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--markdown", help="also write the tables to this file")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, p, n = args.child
        child(kind, int(p), int(n))
        return
    print(f"load average: {load_average()}", flush=True)
    generators = build()
    kinds = ["rolling"] if args.no_full else ["rolling", "full"]
    ids = prompt(args.prompt_length)
    shortest = min(args.lengths)
    if not args.only_prefill:
        outputs = {
            kind: generate(generators[kind], kind, ids, shortest)
            for kind in kinds
        }
        if not args.no_full:
            same = float(np.mean(outputs["rolling"] == outputs["full"]))
            print(f"rolling and full caches agree on {same:.1%} of tokens")
    rows, first = [], {}
    for length in [] if args.only_prefill else args.lengths:
        new = length - args.prompt_length
        times = time_interleaved(
            {
                kind: (
                    lambda kind=kind: generate(
                        generators[kind], kind, ids, length
                    )
                )
                for kind in kinds
            },
            repeats=args.repeats,
            warmup=1,
        )
        row = [length]
        for kind in kinds:
            per_token = 1e3 * times[kind] / new
            first.setdefault(kind, per_token)
            row += [
                per_token,
                per_token / first[kind],
                peak_rss(kind, args.prompt_length, length),
            ]
        rows.append(row)
        print(row, flush=True)
    headers = ["max_length"]
    for kind in kinds:
        headers += [
            f"{kind} ms/token",
            f"{kind} time vs {shortest}",
            f"{kind} peak RSS MiB",
        ]
    prefill_ids = prompt(args.prefill_prompt, seed=1)
    total = args.prefill_prompt + args.prefill_new
    outputs = {
        kind: generate(generators[kind], kind, prefill_ids, total)
        for kind in kinds
    }
    if not args.no_full:
        same = float(np.mean(outputs["rolling"] == outputs["full"]))
        print(
            f"after the long prompt, the caches agree on {same:.1%} of tokens"
        )
    times = time_interleaved(
        {
            kind: (
                lambda kind=kind: generate(
                    generators[kind], kind, prefill_ids, total
                )
            )
            for kind in kinds
        },
        repeats=args.repeats,
        warmup=1,
    )
    prefill_rows = [
        [kind, times[kind], peak_rss(kind, args.prefill_prompt, total)]
        for kind in kinds
    ]
    title = (
        "Greedy generation, batch 1, "
        + ("" if args.only_prefill else f"prompt {args.prompt_length} tokens, ")
        + f"{LAYERS} pre-norm decoder blocks (d={DIM}, {HEADS} heads, window "
        f"{WINDOW}, rotary), vocabulary {VOCAB}; XLA; rolling streamed in "
        f"pieces of {PIECE}; median of {args.repeats}.\n"
        f"{machine_summary()}\n\n"
    )
    tables = (
        title
        + ("" if args.only_prefill else markdown_table(headers, rows) + "\n\n")
        + f"Prompt of {args.prefill_prompt} tokens, then "
        f"{args.prefill_new} generated:\n\n"
        + markdown_table(["cache", "seconds", "peak RSS MiB"], prefill_rows)
    )
    print(tables)
    print(f"load average: {load_average()}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(tables + "\n")


if __name__ == "__main__":
    main()
