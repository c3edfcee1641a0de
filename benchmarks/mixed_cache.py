"""The mixed cache vs the full cache: long greedy generation with a
Gemma-3-like stack of five windowed layers to one global (issue 38).

The model: 6 pre-norm decoder blocks, d=128, 4 query heads and 1
key/value head of 32 (grouped-query attention, as Gemma 3), rotary
positions, blocks 0-4 attending to the last `--window` positions (512,
Gemma 3 1B's), block 5 to every earlier one, a vocabulary of 256, random
weights. One `CausalLMGenerator` over it, generating greedily from an
8-token prompt up to `--max-length` tokens (32,768) with

- `cache="auto"`: the mixed cache, a ring of `window + 1` slots for each
  windowed block and `max_length` positions for the global one;
- `cache="full"`: `max_length` positions in every block.

Each generation runs in a fresh process (compiled with XLA, TensorFlow),
which reports its peak RSS, the bytes of its cache tensors and its time
per token (the loop's one compilation included: a few seconds against
minutes of generation at 32k tokens); a third process generating 16
tokens gives the RSS baseline (TensorFlow, the model, the compiled
loop). The tokens of both caches
are compared. Both caches hold a fixed number of slots, so each step's
memory is the same from the first to the last token: the peak is the
same at any `max_length`'s first step, only the time grows with the
tokens generated.

    python benchmarks/mixed_cache.py [--max-length 32768] [--markdown F]
    python benchmarks/mixed_cache.py --max-length 256 --window 16

Numbers for publishing need an idle machine (see `_timing.load_average`).
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from _generation import child_generation  # noqa: E402
from _generation import compare_caches  # noqa: E402
from _generation import run_child  # noqa: E402
from _timing import load_average  # noqa: E402
from _timing import machine_summary  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, PROMPT = 256, 128, 6, 4, 1, 8


def build(window):
    """`CausalLMGenerator` of the 5 : 1 stack (random weights, seed 0)."""
    import keras

    from keras_attention.blocks import TransformerDecoderBlock
    from keras_attention.generation import CausalLMGenerator

    keras.utils.set_random_seed(0)
    blocks = [
        TransformerDecoderBlock(
            num_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            intermediate_dim=4 * DIM,
            cross_attention=False,
            norm_first=True,
            rotary_max_wavelength=10_000,
            window_size=None if (i + 1) % 6 == 0 else window,
        )
        for i in range(LAYERS)
    ]
    embedding = keras.layers.Embedding(VOCAB, DIM)
    head = [keras.layers.LayerNormalization(), keras.layers.Dense(VOCAB)]
    x = embedding(np.ones((1, 4), "int32"))
    for block in blocks:
        x = block(x)
    for layer in head:
        x = layer(x)
    return CausalLMGenerator(embedding, blocks, head, jit_compile=True)


def child(cache, max_length, window, out):
    """One generation in this process; writes its figures to `out`."""
    prompt = np.random.default_rng(1).integers(1, VOCAB, (1, PROMPT))
    child_generation(build(window), cache, prompt, max_length, out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-length", type=int, default=32768)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        cache, n, window, out = args.child
        child(cache, int(n), int(window), out)
        return None
    import tempfile

    before = load_average()
    print(f"load average before: {before}", flush=True)
    with tempfile.TemporaryDirectory() as directory:
        base = run_child(__file__, "auto", PROMPT + 16, args.window, directory)
        runs = {
            cache: run_child(
                __file__, cache, args.max_length, args.window, directory
            )
            for cache in ("auto", "full")
        }
    after = load_average()
    print(f"load average after: {after}", flush=True)
    same = bool(np.array_equal(runs["auto"]["tokens"], runs["full"]["tokens"]))
    rows, ratios, table = compare_caches(runs, base["peak_rss_mb"])
    text = (
        f"{machine_summary()}\n\nmax_length {args.max_length}, window "
        f"{args.window}; the same tokens: {same}; mixed / full: "
        + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items())
        + f"\n\nLoad average before: {before}; after: {after}\n\n{table}\n"
    )
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return dict(same=same, ratios=ratios, rows=rows)


if __name__ == "__main__":
    main()
