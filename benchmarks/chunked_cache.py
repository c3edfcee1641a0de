"""Llama 4's chunked caches vs full caches: long greedy generation with a
Llama-4-like stack of three chunked rotary layers to one global NoPE
layer (issue 56).

The model: 4 pre-norm decoder blocks, d=256, 4 query heads and 4
key/value heads of 64 (the caches dominate the memory), blocks 0-2
rotary with the weightless L2 QK-norm and causal attention within
chunks of `--chunk` positions
(`mods.ChunkedCausalMask`, 8,192 in Llama 4), block 3 without rotary
positions (NoPE) with attention temperature tuning over every earlier
position, a vocabulary of 256, random weights. One `CausalLMGenerator`
over it, generating greedily from an 8-token prompt up to
`--max-length` tokens (32,768) with

- `cache="auto"`: a ring of `chunk` slots (one chunk) for each chunked
  block, `max_length` positions for the global one;
- `cache="full"`: `max_length` positions in every block.

Each generation runs in a fresh process (compiled with XLA, TensorFlow),
which reports its peak RSS, the bytes of its cache tensors and its time
per token (the loop's one compilation included); a third process
generating 16 tokens gives the RSS baseline. The tokens of both caches
must be the same (the script fails otherwise). The target of issue 56 is
a peak memory of the chunked run at most 0.35 of the full one's. The
caches alone bound the ratio from below: with 3 chunked layers to 1
global, `(3 * chunk + max_length) / (4 * max_length)`, 0.4375 at 8,192
and 32,768 (the chunked layers' 0.25, the global layer's 1); the RSS
ratio adds the same baseline (TensorFlow, the model) to both, so it is
higher still, and the ratio above the baseline is the one to compare
with the caches'.

    python benchmarks/chunked_cache.py [--max-length 32768] [--chunk 8192]
    python benchmarks/chunked_cache.py --quick

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

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, PROMPT = 256, 256, 4, 4, 4, 8
# `--quick`: tiny sizes (the smoke test's).
QUICK = dict(max_length=PROMPT + 16, chunk=8)
TARGET = 0.35  # issue 56: chunked peak RSS / full peak RSS at most


def build(chunk):
    """`CausalLMGenerator` of the 3 : 1 stack (random weights, seed 0)."""
    import keras

    from keras_attention.blocks import TransformerDecoderBlock
    from keras_attention.generation import CausalLMGenerator
    from keras_attention.layers import SelfAttention
    from keras_attention.mods import ChunkedCausalMask

    keras.utils.set_random_seed(0)
    blocks = []
    for i in range(LAYERS):
        local = (i + 1) % 4 != 0
        options = dict(
            rotary_max_wavelength=500_000.0,
            qk_norm="l2",
            mask_mod=ChunkedCausalMask(chunk),
        )
        if not local:  # Llama 4's NoPE layer: global, tuned temperature
            options = dict(temperature_tuning={"floor_scale": chunk})
        attention = SelfAttention(
            HEADS,
            DIM // HEADS,
            causal=True,
            num_key_value_heads=KV_HEADS,
            use_bias=False,
            name="self_attention",
            **options,
        )
        blocks.append(
            TransformerDecoderBlock(
                intermediate_dim=4 * DIM,
                cross_attention=False,
                norm_first=True,
                normalization="rms_norm",
                self_attention=attention,
            )
        )
    embedding = keras.layers.Embedding(VOCAB, DIM)
    head = [keras.layers.RMSNormalization(), keras.layers.Dense(VOCAB)]
    x = embedding(np.ones((1, 4), "int32"))
    for block in blocks:
        x = block(x)
    for layer in head:
        x = layer(x)
    return CausalLMGenerator(embedding, blocks, head, jit_compile=True)


def child(cache, max_length, chunk, out):
    """One generation in this process; writes its figures to `out`."""
    prompt = np.random.default_rng(1).integers(1, VOCAB, (1, PROMPT))
    child_generation(build(chunk), cache, prompt, max_length, out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-length", type=int, default=32768)
    parser.add_argument("--chunk", type=int, default=8192)
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        cache, n, chunk, out = args.child
        child(cache, int(n), int(chunk), out)
        return None
    if args.quick:
        args.max_length, args.chunk = QUICK["max_length"], QUICK["chunk"]
    import tempfile

    before = load_average()
    print(f"load average before: {before}", flush=True)
    with tempfile.TemporaryDirectory() as directory:
        runs = {
            cache: run_child(
                __file__, cache, args.max_length, args.chunk, directory
            )
            for cache in ("auto", "full")
        }
        base = runs["auto"]  # the baseline's run itself at its length
        if args.max_length != PROMPT + 16:
            base = run_child(
                __file__, "auto", PROMPT + 16, args.chunk, directory
            )
    after = load_average()
    print(f"load average after: {after}", flush=True)
    same = bool(np.array_equal(runs["auto"]["tokens"], runs["full"]["tokens"]))
    rows, ratios, table = compare_caches(runs, base["peak_rss_mb"])
    text = (
        f"{machine_summary()}\n\nmax_length {args.max_length}, chunk "
        f"{args.chunk}; the same tokens: {same}; chunked / full: "
        + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items())
        + f" (target: rss at most {TARGET})"
        + f"\n\nLoad average before: {before}; after: {after}\n\n{table}\n"
    )
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    if not same:
        raise SystemExit("the chunked and full caches gave different tokens")
    return dict(same=same, ratios=ratios, rows=rows)


if __name__ == "__main__":
    main()
