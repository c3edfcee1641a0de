"""Cached incremental decoding vs recomputing the whole sequence per token.

A decoder-only LM built from `TransformerDecoderBlock`s generates greedily
with the `keras_hub` GreedySampler, both ways compiled with XLA in one
`tf.function` around the whole sampling loop:

- cached: `CausalLMGenerator.generate` (one position per step through the
  blocks, fixed-size key/value cache);
- recompute: the same sampler loop whose `next` runs the full model over the
  whole token buffer at every step (what one writes without a cache).

Both produce the same tokens (checked first). Reports the median time per
new token for several output lengths (per-token cost of the cached loop
stays flat) and the speed-up, plus peak RSS per configuration measured in a
separate process.

    python benchmarks/cached_generation.py [--markdown FILE]
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
import tensorflow as tf  # noqa: E402
from _timing import machine_summary  # noqa: E402
from _timing import markdown_table  # noqa: E402
from _timing import time_interleaved  # noqa: E402
from _timing import try_peak_rss_mb  # noqa: E402

from keras_attention.generation import CausalLMGenerator  # noqa: E402
from keras_attention.layers import TokenAndPositionEmbedding  # noqa: E402
from keras_attention.layers import TransformerDecoderBlock  # noqa: E402

VOCAB, DIM, HEADS, FFN, LAYERS, MAX_POSITIONS = 1000, 256, 4, 1024, 4, 1024


def build(seed=0):
    keras.utils.set_random_seed(seed)
    embedding = TokenAndPositionEmbedding(VOCAB, MAX_POSITIONS, DIM)
    blocks = [
        TransformerDecoderBlock(
            HEADS, FFN, cross_attention=False, norm_first=True
        )
        for _ in range(LAYERS)
    ]
    head = keras.layers.Dense(VOCAB)
    ids = keras.Input((None,), dtype="int32")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    model = keras.Model(ids, head(x))
    return model, CausalLMGenerator(embedding, blocks, head)


def recompute_generate_fn(model):
    """The same keras_hub sampler loop, without a cache."""
    import keras_hub

    sampler = keras_hub.samplers.GreedySampler()

    def next_fn(prompt, cache, index):
        logits = model(prompt)  # the whole buffer, every step
        return ops_take(logits, index - 1), None, cache

    def ops_take(logits, i):
        return keras.ops.take(logits, i, axis=1)

    @tf.function(jit_compile=True)
    def generate(token_ids, padding_mask):
        index = keras.ops.min(
            keras.ops.sum(keras.ops.cast(padding_mask, "int32"), -1)
        )
        return sampler(next_fn, token_ids, index=index, mask=padding_mask)

    return generate


def inputs(prompt_length, new_tokens, batch=1, seed=0):
    rng = np.random.default_rng(seed)
    total = prompt_length + new_tokens
    ids = np.zeros((batch, total), "int32")
    ids[:, :prompt_length] = rng.integers(1, VOCAB, size=(batch, prompt_length))
    return ids, ids != 0


def child(kind, prompt_length, new_tokens):
    """One generation in this process (for the peak-RSS measurement)."""
    model, lm = build()
    ids, mask = inputs(prompt_length, new_tokens)
    if kind == "cached":
        out = lm.generate(ids, padding_mask=mask)[0]
    else:
        out = recompute_generate_fn(model)(ids, mask)
    np.asarray(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument(
        "--new-tokens", type=int, nargs="+", default=[32, 64, 128, 256]
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, p, n = args.child
        child(kind, int(p), int(n))
        return

    model, lm = build()
    recompute = recompute_generate_fn(model)
    rows = []
    for n in args.new_tokens:
        ids, mask = inputs(args.prompt_length, n)
        cached_out = np.asarray(lm.generate(ids, padding_mask=mask)[0])
        recompute_out = np.asarray(recompute(ids, mask))
        same = float(np.mean(cached_out == recompute_out))
        if same < 1.0:
            print(f"warning: {n} new tokens: only {same:.1%} of tokens agree")
        times = time_interleaved(
            {
                "cached": lambda: np.asarray(
                    lm.generate(ids, padding_mask=mask)[0]
                ),
                "recompute": lambda: np.asarray(recompute(ids, mask)),
            },
            repeats=args.repeats,
            warmup=1,
        )
        rss = {
            kind: try_peak_rss_mb(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--child",
                    kind,
                    args.prompt_length,
                    n,
                ]
            )
            for kind in ("cached", "recompute")
        }
        row = [
            n,
            1e3 * times["cached"] / n,
            1e3 * times["recompute"] / n,
            times["recompute"] / times["cached"],
            rss["cached"],
            rss["recompute"],
            f"{same:.0%}",
        ]
        rows.append(row)
        print(row, flush=True)
    headers = [
        "new tokens",
        "cached ms/token",
        "recompute ms/token",
        "speed-up",
        "cached peak RSS MiB",
        "recompute peak RSS MiB",
        "same tokens",
    ]
    title = (
        f"Greedy generation, batch 1, prompt {args.prompt_length} tokens, "
        f"{LAYERS} pre-norm decoder blocks "
        f"(d={DIM}, {HEADS} heads, ffn {FFN}), "
        f"vocabulary {VOCAB}; XLA; median of {args.repeats}.\n"
        f"{machine_summary()}\n\n"
    )
    table = markdown_table(headers, rows)
    print(title + table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(title + table + "\n")


if __name__ == "__main__":
    main()
