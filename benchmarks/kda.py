"""Kimi delta attention (`KimiDeltaAttention`): a training step from T =
4,096 to 32,768 tokens, and greedy decoding per token at 1k and 32k
generated tokens (issue 56's goals: the step at 32k at most 8.8x that
at 4k, about linear; decoding at 32k at most 1.1x the per-token time at
1k).

    python benchmarks/kda.py                               # TensorFlow
    KERAS_BACKEND=jax python benchmarks/kda.py
    python benchmarks/kda.py --train-lengths 4096 32768 --repeats 3
    python benchmarks/kda.py --mixers kda gated_delta      # beside GDN
    python benchmarks/kda.py --quick                       # tiny, seconds

Training: one `KimiDeltaAttention` layer of `--heads` (4) heads of
`--head-dim` (64), width `heads x head_dim`, chunks of `--chunk-size`
(the layer's default, 32), in a Keras model trained on random inputs
and targets (mean squared error, SGD), batch 1, float32:
`train_on_batch` (forward, backward through the chunked form and the
scan over chunks, the update), compiled per length (TensorFlow: XLA
with `--jit`, else `tf.function`; JAX: `jax.jit`; PyTorch: eager), the
median of `--repeats` interleaved steps after a warm-up step.
`--mixers gated_delta` adds `GatedDeltaNet` of the same heads (a decay
per head) for comparison.

Decoding: `--layers` (4) pre-norm `TransformerDecoderBlock(mixer="kda")`
of `--hidden-dim` (128, `--decode-heads` 4 heads), an embedding and a
head of 128 tokens, random weights, through `CausalLMGenerator` (XLA on
TensorFlow): greedy, batch 1, a prompt of 16 tokens, streamed in pieces
of up to 256 (`stream=`: the cache carried from piece to piece); ms per
token of the whole stream, compiled before (two pieces of each length
first), the median of `--repeats` interleaved runs. The cache is the
convolution's last inputs and the state, the same size at every length.
On JAX, `CausalLMGenerator` compiles each `generate` call anew (seen
for `GatedDeltaNet` stacks too: ~30 s per run of 128 tokens at the
quick sizes), so take the decoding figure from TensorFlow (or PyTorch),
or pass `--no-decoding` there.

The load average is printed before and after: publish only from an
idle machine.
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
from _timing import time_interleaved  # noqa: E402

import keras_attention as ka  # noqa: E402
from keras_attention.generation import CausalLMGenerator  # noqa: E402

BACKEND = keras.backend.backend()
MIXERS = ("kda", "gated_delta")
DEFAULT = dict(
    train_lengths=[4096, 8192, 16384, 32768],
    heads=4,
    head_dim=64,
    chunk_size=32,
    decode_lengths=[1024, 32768],
    hidden_dim=128,
    decode_heads=4,
    layers=4,
)
QUICK = dict(
    train_lengths=[64, 128],
    heads=2,
    head_dim=8,
    chunk_size=16,
    decode_lengths=[32, 128],
    hidden_dim=16,
    decode_heads=2,
    layers=2,
)
VOCAB, PROMPT, PIECE = 128, 16, 256


# --- Training ---------------------------------------------------------------


def mixer_layer(mixer, args):
    width = args.heads * args.head_dim
    if mixer == "kda":
        return ka.layers.KimiDeltaAttention(
            width, args.heads, args.head_dim, chunk_size=args.chunk_size
        )
    return ka.layers.GatedDeltaNet(
        width,
        args.heads,
        args.heads,
        args.head_dim,
        args.head_dim,
        chunk_size=args.chunk_size,
    )


def training_model(mixer, args):
    keras.utils.set_random_seed(0)
    width = args.heads * args.head_dim
    inputs = keras.Input((None, width))
    model = keras.Model(inputs, mixer_layer(mixer, args)(inputs))
    model.compile(
        optimizer=keras.optimizers.SGD(1e-3),
        loss="mse",
        jit_compile=bool(args.jit) if BACKEND == "tensorflow" else "auto",
    )
    return model


def training_rows(args):
    """One row per mixer: ms per step at each length and the ratio of
    the last to the first."""
    models = {m: training_model(m, args) for m in args.mixers}
    width = args.heads * args.head_dim
    per_step = {}
    for length in args.train_lengths:
        rng = np.random.default_rng(length)
        x = rng.normal(size=(1, length, width)).astype("float32")
        y = rng.normal(size=(1, length, width)).astype("float32")
        fns = {
            m: (lambda model=model: float(model.train_on_batch(x, y)))
            for m, model in models.items()
        }
        per_step[length] = time_interleaved(fns, repeats=args.repeats, warmup=1)
        print(f"training, T = {length}: " + ", ".join(
            f"{m} {1e3 * t:.1f} ms" for m, t in per_step[length].items()
        ), flush=True)  # fmt: skip
    first, last = args.train_lengths[0], args.train_lengths[-1]
    return [
        [m]
        + [f"{1e3 * per_step[n][m]:.1f}" for n in args.train_lengths]
        + [f"{per_step[last][m] / per_step[first][m]:.2f}"]
        for m in args.mixers
    ]


# --- Decoding ---------------------------------------------------------------


def decoding_generator(args):
    keras.utils.set_random_seed(0)
    embedding = keras.layers.Embedding(VOCAB, args.hidden_dim)
    blocks = [
        ka.blocks.TransformerDecoderBlock(
            args.decode_heads,
            4 * args.hidden_dim,
            cross_attention=False,
            norm_first=True,
            normalization="rms_norm",
            mixer="kda",
        )
        for _ in range(args.layers)
    ]
    head = keras.layers.Dense(VOCAB)
    ids = keras.Input((None,), dtype="int32")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    keras.Model(ids, head(x))  # builds every layer
    return CausalLMGenerator(embedding, blocks, head)


def piece_size(length):
    """Tokens per streamed piece: `PIECE`, fewer for short runs (at
    least 4 pieces)."""
    return max(4, min(PIECE, length // 4))


def pieces(generator, length):
    prompt = np.random.default_rng(0).integers(1, VOCAB, size=(PROMPT,))
    return generator.generate(
        prompt.astype("int32"),
        max_length=PROMPT + length,
        stream=piece_size(length),
    )


def warm_up(generator, length):
    """Compiles the pieces of a generation of `length` tokens: two
    pieces, then the generation is dropped."""
    stream = pieces(generator, length)
    for _ in range(2):
        next(stream, None)
    stream.close()


def decode(generator, length):
    """Seconds per token of a generation of `length` tokens, the whole
    stream consumed."""
    start = time.perf_counter()
    tokens = sum(np.asarray(p).shape[-1] for p in pieces(generator, length))
    return (time.perf_counter() - start) / max(tokens - PROMPT, 1)


def decoding_row(args):
    """ms per token at each length and the ratio of the last to the
    first (each length compiled first; `--repeats` interleaved runs)."""
    generator = decoding_generator(args)
    for length in args.decode_lengths:
        warm_up(generator, length)
    times = {n: [] for n in args.decode_lengths}
    lengths = list(args.decode_lengths)
    for r in range(args.repeats):
        shift = r % len(lengths)
        for n in lengths[shift:] + lengths[:shift]:
            times[n].append(decode(generator, n))
    medians = [statistics.median(times[n]) for n in lengths]
    print("decoding: " + ", ".join(
        f"{n} tokens {1e3 * t:.3f} ms/token" for n, t in zip(lengths, medians)
    ), flush=True)  # fmt: skip
    return [f"{1e3 * t:.3f}" for t in medians] + [
        f"{medians[-1] / medians[0]:.2f}"
    ]


# --- Main -------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-lengths", type=int, nargs="+", default=None)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--head-dim", type=int, default=None)
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--decode-lengths", type=int, nargs="+", default=None)
    parser.add_argument("--hidden-dim", type=int, default=None)
    parser.add_argument("--decode-heads", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--mixers", nargs="+", choices=MIXERS, default=["kda"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jit", action="store_true", help="TF: XLA")
    parser.add_argument("--no-training", action="store_true")
    parser.add_argument("--no-decoding", action="store_true")
    parser.add_argument("--quick", action="store_true", help="tiny sizes")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else DEFAULT)
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    lines = [machine_summary(), f"Load average before: {load_average()}"]
    print("\n".join(lines), flush=True)
    if not args.no_training:
        how = {"tensorflow": "tf.function", "jax": "jax.jit"}.get(
            BACKEND, "eager"
        )
        how += " + XLA" if args.jit and BACKEND == "tensorflow" else ""
        lines.append(
            f"\nTraining step ({BACKEND}, {how}): one layer of {args.heads} "
            f"heads of {args.head_dim}, chunks of {args.chunk_size}, batch "
            f"1, float32; ms per `train_on_batch`, median of {args.repeats}."
            f" Goal: at most 8.8x from {args.train_lengths[0]} to "
            f"{args.train_lengths[-1]}.\n"
        )
        lines.append(
            markdown_table(
                ["mixer"]
                + [f"ms at T = {n}" for n in args.train_lengths]
                + [f"x T = {args.train_lengths[0]}"],
                training_rows(args),
            )
        )
        print("\n".join(lines[-2:]), flush=True)
    if not args.no_decoding:
        lines.append(
            f"\nGreedy decoding ({BACKEND}, CausalLMGenerator): "
            f"{args.layers} pre-norm KDA blocks of {args.hidden_dim} "
            f"({args.decode_heads} heads), prompt {PROMPT}, streamed; "
            f"ms/token, median of {args.repeats}. Goal: at most 1.1x from "
            f"{args.decode_lengths[0]} to {args.decode_lengths[-1]}.\n"
        )
        n = args.decode_lengths
        lines.append(
            markdown_table(
                [f"ms/token at {length}" for length in n] + [f"x {n[0]}"],
                [decoding_row(args)],
            )
        )
        print("\n".join(lines[-2:]), flush=True)
    lines.append(f"\nLoad average after: {load_average()}")
    print(lines[-1])
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    main()
