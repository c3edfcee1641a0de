"""A character-level decoder-only transformer language model.

Default data (shipped, no network): the King James Bible (public domain),
split by chapter. The model reads Unicode code points, reports bits per
character (and per-character perplexity) on the held-out chapters,
completes prompts with greedy, beam, top-k and top-p sampling through the
key/value cache, and exports a SavedModel that completes raw strings:

    python -m examples.language_model          # ~1,000 CPU-seconds
    python -m examples.language_model --backend torch   # or jax
    python -m examples.language_model --window 0 --max-length 128
    python -m examples.language_model --text-file pg100.txt  # any UTF-8 text
    python -m examples.language_model --dataset tiny_shakespeare --download
    python -m examples.language_model --generate-only --max-length 20000

    served = tf.saved_model.load("runs/language_model/saved_model")
    served.top_p(tf.constant(["And the LORD said unto Moses,"]))["completion"]

It trains on windows of --sequence-length (128) characters and generates up
to --max-length (256). Positions are rotary and each position attends to
the last --window (64) characters only (--window 0: full causal
attention), so every distance met while generating was met in training
(see examples/language_model/model.py); the run prints bits per character
on windows of both lengths, which agree.

Which positions extrapolate? --positions rope|learned|sinusoidal|alibi|t5
with --extrapolation prints teacher-forced bits per character on test
windows of 1x, 2x and 4x --sequence-length:

    python -m examples.language_model --positions alibi --window 0 \
        --max-length 128 --extrapolation

--generate-only loads the weights of an earlier run with the same model
arguments (<output-dir>/checkpoints/best.weights.h5) and streams one text
of --max-length characters from --prompt, printing it as it is produced
with a progress line (on stderr): with a --window the generator keeps a
rolling key/value cache of window + 1 positions (plus --sink-tokens), so
the time per character and the peak memory do not depend on --max-length.
The SavedModel of a windowed model (positions other than learned)
generates through that rolling cache too: it reads prompts of any length
whole and completes each with up to --max-length characters.

Documents (the lines, here verses): by default the text is one character
stream cut into windows across lines. --pack (--documents packed) puts the
lines one after the other into full windows, each attending only to itself
(segment_ids) with positions restarting per line, and does not predict a
line's first character from the previous one; --documents padded trains
on one line per window, padded. Each run prints its real (non-padding)
tokens per second and padding fraction:

    python -m examples.language_model --pack
    python -m examples.language_model --documents padded

Which mixer when? --mixer attention|linear|gated_delta|hybrid puts a
linear-time token mixer in the blocks' self-attention place:
LinearAttention with a gated decay (linear), GatedDeltaNet
(gated_delta), or Qwen 3.5's hybrid stack: three gated delta nets, then
one attention block, the last block attention too (with 2 layers:
gated_delta, then attention). --window and rope/ALiBi/T5 positions go
to the attention blocks only (refused without one). Several mixers
train one after the other with the same data, steps and seed, and print
one table: bits/char at the training length and at 4x it, training
tokens/s, decoding ms/char and peak memory (above the loaded model) when
generating --decode-length (32768) characters, each in a fresh process:

    python -m examples.language_model \
        --mixer attention linear gated_delta hybrid

--backend tensorflow|jax|torch trains the same model on each Keras backend
(the data stays a tf.data pipeline, fed to Keras as NumPy on JAX and
PyTorch). The SavedModel export is TensorFlow-only (a SavedModel is a
TensorFlow graph): on JAX and PyTorch it is skipped, and says so.

--distribution data|model (with --backend jax) trains over all of JAX's
devices with the Keras distribution API: `DataParallel`, or
`ModelParallel` on a (devices / 2, 2) ("batch", "model") mesh with the
weights sharded by `keras_attention.distribution.get_layout_map`
(--num-heads must be even). Without accelerators, make JAX show 4 CPU
devices:

    XLA_FLAGS=--xla_force_host_platform_device_count=4 \
        python -m examples.language_model --backend jax --distribution model

--context-parallel N trains on sequences sharded over N devices: each
device holds T / N characters of every sequence and the blocks' attention
runs as ring attention (`keras_attention.distribution.ContextParallel`,
a (devices / N, N) ("batch", "sequence") mesh, JAX backend). Without
--sequence-length, T = N x 128: each device holds the example's usual
128 characters, and the run prints, from XLA's compiled memory analysis
of the training step, what each device needs against what one device
would need for T (about N times more). Without accelerators the example
asks JAX for N virtual CPU devices itself:

    python -m examples.language_model --context-parallel 8
"""

import argparse
import contextlib
import logging
import os
import time

from examples.common import HelpFormatter
from examples.common import add_training_args
from examples.common import fit
from examples.common import setup_runtime
from examples.common.distributed import evaluate
from examples.common.training import add_backend_arg
from examples.common.training import select_backend
from examples.language_model import context_parallel

logger = logging.getLogger("examples")

PROMPTS = (
    "In the beginning",
    "And the LORD said unto Moses,",
    "Blessed are the",
)


def parse_args(argv=None):
    from examples.language_model.options import DOCUMENTS
    from examples.language_model.options import MIXERS
    from examples.language_model.options import POSITIONS

    parser = argparse.ArgumentParser(
        prog="python -m examples.language_model",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset",
        default="kjv_bible",
        help="'kjv_bible' (shipped) or a TFDS dataset with a 'text' feature, "
        "e.g. tiny_shakespeare (prepared in --data-dir, or --download)",
    )
    data.add_argument(
        "--text-file",
        default=None,
        help="train on this UTF-8 text file instead (90/5/5 split by lines)",
    )
    data.add_argument("--data-dir", default=None, help="TFDS data directory")
    data.add_argument(
        "--download", action="store_true", help="let TFDS download the dataset"
    )
    data.add_argument(
        "--sequence-length",
        type=int,
        default=None,
        help="characters of context in training (default 128; N x 128 "
        "with --context-parallel N)",
    )
    data.add_argument(
        "--documents",
        choices=DOCUMENTS,
        default="stream",
        help="training windows: one character stream across lines, lines "
        "packed into full windows (no attention across lines), or one line "
        "per window, padded",
    )
    data.add_argument(
        "--pack",
        action="store_const",
        const="packed",
        dest="documents",
        help="--documents packed",
    )
    model = parser.add_argument_group("model")
    model.add_argument("--hidden-dim", type=int, default=128)
    model.add_argument("--num-layers", type=int, default=3)
    model.add_argument("--num-heads", type=int, default=4)
    model.add_argument("--dropout", type=float, default=0.0)
    model.add_argument(
        "--mixer",
        nargs="+",
        choices=MIXERS,
        default=["attention"],
        help="the blocks' token mixer: softmax self-attention, "
        "LinearAttention (gated decay), GatedDeltaNet, or hybrid (Qwen "
        "3.5's layout: three gated delta nets then one attention block, "
        "the last block attention too; with 2 layers gated_delta then "
        "attention). Several: each trained with the same data, steps and "
        "seed, then one table (bits/char at 1x and 4x --sequence-length, "
        "training tokens/s, decoding ms/token and peak memory over "
        "--decode-length characters); no completions or export then",
    )
    model.add_argument(
        "--window",
        type=int,
        default=None,
        help="each position attends to the last N characters "
        "(LocalSelfAttention; default 64); below --sequence-length, so "
        "that generating beyond it meets only trained distances; 0: full "
        "causal attention, then --max-length <= --sequence-length. "
        "Attention blocks only",
    )
    model.add_argument(
        "--positions",
        choices=POSITIONS,
        default=None,
        help="how positions enter: rotary (rope, the default), a learned "
        "table, sinusoids, ALiBi, or one T5 relative bias shared by the "
        "blocks (rope, ALiBi and T5 in attention blocks only)",
    )
    model.add_argument(
        "--extrapolation",
        action="store_true",
        help="also report teacher-forced bits/char on test windows of 1x, "
        "2x and 4x --sequence-length (which positions extrapolate?)",
    )
    model.add_argument("--learning-rate", type=float, default=2e-3)
    gen = parser.add_argument_group("generation and export")
    gen.add_argument(
        "--max-length",
        type=int,
        default=256,
        help="prompt + completion characters when generating (a windowed "
        "model's SavedModel and printed completions: completion characters, "
        "after a prompt of any length)",
    )
    gen.add_argument(
        "--samplers",
        default="greedy,beam,top_k,top_p",
        help="comma-separated samplers shown and exported (--generate-only: "
        "the first, which must not be beam)",
    )
    gen.add_argument(
        "--generate-only",
        action="store_true",
        help="no training: load <output-dir>/checkpoints/best.weights.h5 "
        "(an earlier run with the same model arguments) and stream one "
        "text of --max-length characters",
    )
    gen.add_argument(
        "--prompt",
        default=PROMPTS[0],
        help="the prompt of --generate-only",
    )
    gen.add_argument(
        "--decode-length",
        type=int,
        default=None,
        metavar="N",
        help="several --mixer: characters generated (greedy, streamed) "
        "in a fresh process per mixer, for ms/token and peak memory "
        "above the loaded model (default 32768; 256 with --quick); a "
        "measure of cost, the text beyond the trained lengths is not "
        "judged",
    )
    gen.add_argument(
        "--sink-tokens",
        type=int,
        default=0,
        help="--generate-only: the first positions every later one keeps "
        "seeing beside its window (attention sinks)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny data subset and model, a few steps (smoke test)",
    )
    add_backend_arg(parser)
    parser.add_argument(
        "--distribution",
        choices=("none", "data", "model"),
        default="none",
        help="Keras distribution API over all devices (JAX backend only): "
        "'data' (DataParallel) or 'model' (ModelParallel, weights sharded "
        "by keras_attention.distribution.get_layout_map on a 2-wide model "
        "axis); CPU devices: XLA_FLAGS="
        "--xla_force_host_platform_device_count=4",
    )
    parser.add_argument(
        "--context-parallel",
        type=int,
        default=0,
        metavar="N",
        help="shard each training sequence over N devices, attention as a "
        "ring (keras_attention.distribution.ContextParallel; JAX backend, "
        "N virtual CPU devices without accelerators)",
    )
    add_training_args(
        parser,
        epochs=4,
        batch_size=32,
        steps_per_epoch=250,
        output_dir="runs/language_model",
    )
    args = parser.parse_args(argv)
    check_mixers(parser, args)
    args.samplers = tuple(s for s in args.samplers.split(",") if s)
    # Before Keras (and JAX) are imported: the backend, the devices.
    context_parallel.check_args(parser, args)
    if args.sequence_length is None:
        args.sequence_length = 128
    if args.quick:
        # A hybrid stack needs two blocks; every mixer gets the same.
        layers = 2 if "hybrid" in args.mixer else 1
        args.hidden_dim, args.num_layers, args.num_heads = 32, layers, 2
        shards = args.context_parallel or 1
        args.sequence_length = min(args.sequence_length, 64 * shards)
        if not args.generate_only:
            args.max_length = min(args.max_length, 48)
        args.window = min(args.window, 32)
        args.decode_length = min(args.decode_length, 256)
        args.epochs, args.steps_per_epoch = min(args.epochs, 2), 15
        # Sharded windows are 64 x N long: a few fill the tiny splits.
        args.batch_size = min(args.batch_size, 8 if shards > 1 else 32)
    check_generation_length(parser, args)
    # Before anything imports Keras: it reads KERAS_BACKEND once.
    select_backend(args.backend, parser.error)
    check_distribution(parser, args)
    return args


# Flags of a single run that a comparison of several --mixer has no use
# for (it trains, evaluates and measures decoding; nothing else).
NOT_COMPARED = (
    "generate_only", "prompt", "sink_tokens", "samplers", "max_length",
    "extrapolation", "distribution", "context_parallel",
)  # fmt: skip


def check_mixers(parser, args):
    """Refuses at start-up what cannot apply to the --mixer chosen, and
    fills in the defaults of --window (64; 0 in a stack without
    attention), --positions (rope) and --decode-length (32768).

    Attention options need an attention block: --window, and positions
    that enter attention (rope, ALiBi, T5), given explicitly with only
    linear or gated_delta mixers, are refused, as are --sink-tokens (a
    rolling cache's) and --context-parallel (ring attention). Several
    mixers (a comparison) refuse the flags of `NOT_COMPARED` and a
    learned position table (it cannot decode --decode-length); one mixer
    refuses --decode-length. A hybrid stack needs --num-layers >= 2.
    """
    from examples.language_model.options import MIXERS

    args.mixer = list(dict.fromkeys(args.mixer))  # each once, in order
    shown = " ".join(args.mixer)
    attention = any(m in ("attention", "hybrid") for m in args.mixer)
    if not attention:  # linear / gated_delta only
        if args.window is not None:
            parser.error(
                f"--window applies to attention blocks, and --mixer {shown} "
                "has none (a linear-time mixer keeps a recurrent state, no "
                f"window). Received: --window {args.window!r}"
            )
        if args.positions not in (None, "learned", "sinusoidal"):
            parser.error(
                f"--positions {args.positions} enters attention blocks "
                f"only, and --mixer {shown} has none (the order of the "
                "tokens enters through the recurrent state; learned or "
                "sinusoidal positions, added to the embeddings, apply). "
                f"Received: --positions {args.positions!r}"
            )
        if args.sink_tokens:
            parser.error(
                "--sink-tokens keep the first positions in a rolling "
                f"attention cache, and --mixer {shown} has no attention "
                f"block. Received: --sink-tokens {args.sink_tokens!r}"
            )
    linear = [m for m in args.mixer if m != "attention"]
    if args.context_parallel and linear:
        parser.error(
            f"--context-parallel runs attention as a ring; --mixer "
            f"{linear[0]} has linear-time mixers, which cannot run there. "
            f"Received: --mixer {shown}, --context-parallel "
            f"{args.context_parallel!r}"
        )
    if "hybrid" in args.mixer and args.num_layers < 2 and not args.quick:
        parser.error(
            "--mixer hybrid needs --num-layers >= 2 (gated delta nets, "
            f"then attention). Received: --num-layers {args.num_layers!r}"
        )
    if len(args.mixer) > 1:
        for name in NOT_COMPARED:
            value = getattr(args, name)
            if value != parser.get_default(name):
                flag = "--" + name.replace("_", "-")
                parser.error(
                    f"{flag} does not apply to a comparison of several "
                    f"mixers (--mixer {shown}: each is trained, evaluated "
                    "and decoded, nothing else); run one --mixer for it. "
                    f"Received: {flag} {value!r}"
                )
        if args.positions == "learned":
            parser.error(
                "--positions learned keeps a table of --max-length "
                "positions, and a comparison of several mixers decodes "
                f"--decode-length characters (--mixer {shown}). Received: "
                "--positions 'learned'"
            )
    elif args.decode_length is not None:
        parser.error(
            "--decode-length is the decoding measured by a comparison of "
            f"several mixers (--mixer {' '.join(MIXERS)} ...); --mixer "
            f"{shown} is one. Received: --decode-length {args.decode_length!r}"
        )
    if args.decode_length is None:
        args.decode_length = 32768
    if args.decode_length < 1:
        parser.error(
            f"--decode-length must be >= 1. Received: {args.decode_length!r}"
        )
    if args.window is None:
        args.window = 64 if attention else 0
    if args.positions is None:
        args.positions = "rope"


def check_distribution(parser, args):
    """--distribution needs the JAX backend (the Keras distribution API),
    and an even --num-heads for the 2-wide model axis of 'model'."""
    if args.distribution == "none":
        return
    backend = args.backend or os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend != "jax":
        parser.error(
            f"--distribution {args.distribution} uses the Keras distribution "
            "API, which runs on JAX: pass --backend jax (on TensorFlow, use "
            f"--strategy). Received: backend={backend!r}"
        )
    if args.distribution == "model" and args.num_heads % 2:
        parser.error(
            "--distribution model shards the heads over a model axis of 2: "
            f"--num-heads must be even. Received: {args.num_heads!r}"
        )


def check_generation_length(parser, args):
    """Refuses, at start-up, a generation the positions were not trained for."""
    for name in ("sequence_length", "max_length"):
        if getattr(args, name) < 2:
            parser.error(
                f"--{name.replace('_', '-')} must be at least 2. "
                f"Received: {getattr(args, name)!r}"
            )
    if not any(m in ("attention", "hybrid") for m in args.mixer):
        return  # no attention block: no window, no positions' limits
    if args.window < 0:
        parser.error(
            "--window must be >= 0 (0: full attention). "
            f"Received: {args.window!r}"
        )
    if args.window == 0 and args.max_length > args.sequence_length:
        parser.error(
            f"--max-length {args.max_length} exceeds --sequence-length "
            f"{args.sequence_length} with full attention (--window 0): "
            "positions beyond the training windows would meet distances "
            "never trained. Pass --window N (N < sequence length), or "
            "--max-length <= --sequence-length."
        )
    if args.window >= args.sequence_length:
        parser.error(
            f"--window {args.window} must be smaller than --sequence-length "
            f"{args.sequence_length}: training must see every distance the "
            "window allows (0..window)."
        )


def write_explorer(model, texts, vocabulary_size, output_dir):
    """The attention explorer (`<output_dir>/attention.html`) of every
    attention layer of `model` on `texts` (prompts with their completions),
    encoded as in `complete`: code points after a newline, padded with 0.

    Returns `(path, left_out)`: `left_out` names the layers whose weights
    the explorer cannot show (a gated delta net's implied weights can be
    negative: the delta rule subtracts; the explorer shows attention
    probabilities), `path` None when no layer is left.
    """
    import numpy as np

    from examples.common import attention_outputs
    from keras_attention.visualization import AttentionMaps

    # b - texts, t - character positions
    rows = [[min(ord(c), vocabulary_size - 1) for c in "\n" + t] for t in texts]
    ids = np.zeros((len(rows), max(map(len, rows))), "int32")
    for row, codes in zip(ids, rows):
        row[: len(codes)] = codes
    tokens = [["⏎"] + list(t) for t in texts]
    maps = attention_outputs.collect(model, ids)
    shown = [
        (name, w)
        for name, w in maps.items()
        if np.all(np.isfinite(w)) and np.all(np.asarray(w) >= 0)
    ]
    left_out = [name for name in maps if name not in dict(shown)]
    if not shown:
        return None, left_out
    metadata = getattr(maps, "metadata", {})
    maps = AttentionMaps(
        shown, {name: metadata[name] for name, _ in shown if name in metadata}
    )
    path = attention_outputs.write_explorer(
        output_dir,
        maps,
        tokens,
        title="Character language model: self-attention of each block",
    )
    return path, left_out


def generate_only(args):
    """Streams one text from the weights of an earlier run (see the module
    docstring): prints it as it comes, logs a progress line per piece.

    Returns a dict: the first and last 300 characters, the number of
    characters, characters per second and the peak resident memory (MiB).
    """
    import resource

    import keras

    from examples.common.text import character_tokenizer
    from examples.language_model import data
    from examples.language_model.model import build_language_model
    from examples.language_model.model import make_sampler
    from examples.language_model.model import stream_text

    checkpoint = os.path.join(
        args.output_dir or "runs/language_model",
        "checkpoints",
        "best.weights.h5",
    )
    if not os.path.exists(checkpoint):
        raise SystemExit(
            f"--generate-only needs the weights of an earlier run: "
            f"{checkpoint} does not exist. Train first with the same model "
            "arguments (python -m examples.language_model ...)."
        )
    train_lines, _, _ = data.load_text_splits(
        args.dataset,
        args.text_file,
        args.data_dir,
        args.download,
        tiny=args.quick,
    )
    vocabulary_size = character_tokenizer(train_lines).vocabulary_size()
    model, generator = build_language_model(
        vocabulary_size,
        args.sequence_length,
        hidden_dim=args.hidden_dim,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        dropout=args.dropout,
        window=args.window or None,
        positions=args.positions,
        mixer=args.mixer[0],
    )
    model.load_weights(checkpoint)
    sampler = make_sampler(args.samplers[0], seed=args.seed)
    total = args.max_length - len(args.prompt) - 1
    head, tail, done = "", "", 0
    start = time.time()
    print(args.prompt, end="", flush=True)
    for text in stream_text(
        generator,
        args.prompt,
        sampler,
        args.max_length,
        vocabulary_size,
        sink_tokens=args.sink_tokens,
    ):
        print(text, end="", flush=True)
        done += len(text)
        head = (head + text)[:300] if len(head) < 300 else head
        tail = (tail + text)[-300:]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        logger.info(
            "%d/%d characters, %.0f characters/s, peak memory %.0f MiB",
            done,
            total,
            done / max(time.time() - start, 1e-9),
            peak,
        )
    print()
    seconds = time.time() - start
    return {
        "backend": keras.backend.backend(),
        "head": head,
        "tail": tail,
        "characters": done,
        "characters_per_second": done / max(seconds, 1e-9),
        "peak_memory_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        / 1024,
    }


# Test windows of these multiples of the training length (`--extrapolation`)
EXTRAPOLATION = (1, 2, 4)
EXTRAPOLATION_WINDOWS = 256  # windows evaluated per length


def extrapolation_bits(
    model, test_lines, tokenizer, length, batch_size, factors=EXTRAPOLATION
):
    """`{factor: bits/char}`: teacher-forced bits per character on (the
    first `EXTRAPOLATION_WINDOWS`) test windows of `factor * length`
    characters, for each of `factors` (`EXTRAPOLATION`): the same text,
    read with longer and longer contexts."""
    from examples.language_model import data
    from examples.language_model.model import positional_bits_per_character

    results = {}
    for factor in factors:
        windows = data.char_windows(test_lines, tokenizer, factor * length)
        batches = data.batches(
            windows.take(EXTRAPOLATION_WINDOWS), batch_size, shuffle=False
        )
        bits = positional_bits_per_character(model, batches.as_numpy_iterator())
        results[factor] = float(bits.mean())
    return results


def training_throughput(windows, args, timer):
    """`{"documents", "tokens_per_second", "padding", "step_ms"}` of the
    training run, also written to `<output_dir>/throughput.json`: real
    (non-zero) input tokens per second (the mean real tokens of a batch,
    over all training windows, per median step time) and the padding
    fraction of the training windows (0 for the stream: nothing pads it)."""
    import json

    from examples.common import packing

    real, total = 1, 1
    if args.documents != "stream":
        real, total = packing.real_tokens(windows.batch(1024), -1)
    tokens = real / total * args.batch_size * args.sequence_length
    result = {
        "documents": args.documents,
        "tokens_per_second": tokens / (timer.median_ms() / 1000),
        "padding": 1.0 - real / total,
        "step_ms": timer.median_ms(),
    }
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "throughput.json"), "w") as f:
        json.dump(result, f, indent=2)
    return result


def compile_models(fit_model, model, args):
    """Compiles the model trained (`fit_model`: AdamW, a cosine schedule
    with warm-up, the cross-entropy of the logits) and, when it is
    another (packed windows), `model` for evaluation."""
    import keras

    total_steps = args.epochs * args.steps_per_epoch
    schedule = keras.optimizers.schedules.CosineDecay(
        args.learning_rate * 0.1,
        total_steps,
        alpha=0.05,
        warmup_target=args.learning_rate,
        warmup_steps=max(total_steps // 20, 1),
    )
    fit_model.compile(
        optimizer=keras.optimizers.AdamW(
            schedule, weight_decay=0.01, clipnorm=1.0
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=args.jit_compile,
    )
    if fit_model is not model:  # evaluated on the test stream
        model.compile(
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=args.jit_compile,
        )


def load_windows(args):
    """The text's `(train, validation, test)` lines, the character
    tokenizer of the training lines and the three splits' windows of
    `--sequence-length` characters (per `--documents` for training and
    validation: a stream cut into windows, or documents packed or
    padded)."""
    from examples.common.text import character_tokenizer
    from examples.language_model import data

    lines = data.load_text_splits(
        args.dataset,
        args.text_file,
        args.data_dir,
        args.download,
        tiny=args.quick,
    )
    tokenizer = character_tokenizer(lines[0])
    windows = [
        data.char_windows(d, tokenizer, args.sequence_length) for d in lines
    ]
    if args.documents != "stream":
        windows[:2] = [
            data.document_windows(
                d, tokenizer, args.sequence_length, args.documents
            )
            for d in lines[:2]
        ]
    return lines, tokenizer, windows


def train_mixer(args, strategy, mixer):
    """Trains and evaluates the model of one `mixer` for a comparison of
    several (`examples.language_model.mixers`): the same data, steps and
    seed as the others, in `args.output_dir`.

    Returns a dict: `model_config` (the arguments of
    `build_language_model`), `weights` (a file of the trained weights),
    `blocks` (each block's mixer), `parameters`, `bits` (test bits/char
    on windows of --sequence-length), `bits_4x` (teacher-forced, on test
    windows of 4x it), `tokens_per_second` and `step_ms` (training).
    """
    import keras

    from examples.language_model import data
    from examples.language_model.model import StepTimer
    from examples.language_model.model import bits_per_character
    from examples.language_model.model import block_mixers
    from examples.language_model.model import build_language_model
    from examples.language_model.model import packed_language_model

    keras.utils.set_random_seed(args.seed)
    lines, tokenizer, windows = load_windows(args)
    test_lines = lines[2]
    train_windows, val_windows, test_windows = windows
    train = data.batches(
        train_windows, args.batch_size, shuffle=True, seed=args.seed
    )
    val, test = (
        data.batches(w, args.batch_size, shuffle=False)
        for w in (val_windows, test_windows)
    )
    config = dict(
        vocabulary_size=tokenizer.vocabulary_size(),
        max_length=EXTRAPOLATION[-1] * args.sequence_length,
        hidden_dim=args.hidden_dim,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        dropout=args.dropout,
        window=args.window or None,
        positions=args.positions,
        mixer=mixer,
    )
    with strategy.scope():
        model, _ = build_language_model(**config)
        fit_model = model
        if args.documents == "packed":
            fit_model = packed_language_model(model)
        compile_models(fit_model, model, args)
    timer = StepTimer()
    fit(fit_model, train, val, args, callbacks=[timer])
    test_loss = float(evaluate(model, test)["loss"])
    throughput = training_throughput(train_windows, args, timer)
    bits_4x = extrapolation_bits(
        model,
        test_lines,
        tokenizer,
        args.sequence_length,
        args.batch_size,
        factors=(EXTRAPOLATION[-1],),
    )[EXTRAPOLATION[-1]]
    weights = os.path.join(args.output_dir, "model.weights.h5")
    model.save_weights(weights)
    return {
        "model_config": config,
        "weights": weights,
        "blocks": block_mixers(model),
        "parameters": model.count_params(),
        "bits": bits_per_character(test_loss),
        "bits_4x": bits_4x,
        "tokens_per_second": throughput["tokens_per_second"],
        "step_ms": throughput["step_ms"],
    }


def main(argv=None):
    args = parse_args(argv)
    strategy = setup_runtime(args)
    if args.generate_only:
        return generate_only(args)
    if len(args.mixer) > 1:
        from examples.language_model import mixers

        return mixers.compare(
            args, lambda mixer, a: train_mixer(a, strategy, mixer)
        )
    start = time.time()

    import keras
    import numpy as np

    from examples.language_model import data
    from examples.language_model.export import export_language_model
    from examples.language_model.model import StepTimer
    from examples.language_model.model import bits_per_character
    from examples.language_model.model import block_mixers
    from examples.language_model.model import build_language_model
    from examples.language_model.model import complete
    from examples.language_model.model import make_distribution
    from examples.language_model.model import make_sampler
    from examples.language_model.model import packed_language_model
    from examples.language_model.model import positional_bits_per_character

    (train_lines, val_lines, test_lines), tokenizer, windows = load_windows(
        args
    )
    vocabulary_size = tokenizer.vocabulary_size()
    logger.info("character vocabulary: %d code points", vocabulary_size)
    train_windows, val_windows = windows[:2]
    train = data.batches(
        train_windows, args.batch_size, shuffle=True, seed=args.seed
    )
    distribution = make_distribution(args.distribution)
    context = None  # --context-parallel: its scope trains and tests
    if args.context_parallel:
        context = context_parallel.make_context_parallel(
            args.context_parallel, args.batch_size
        )
        mesh = context.device_mesh
        logger.info(
            "context parallelism: a %s mesh of %s",
            " x ".join(map(str, mesh.shape)),
            mesh.axis_names,
        )
    training_scope = contextlib.nullcontext
    if context is not None:
        training_scope = context.scope
    if distribution is not None:
        # Weights are created sharded (or replicated) from here on.
        keras.distribution.set_distribution(distribution)
        logger.info(
            "distribution: %s over %d devices",
            type(distribution).__name__,
            len(keras.distribution.list_devices()),
        )
    # Under a distribution every batch must split over the batch axis: the
    # last, short evaluation batch is dropped.
    val, test = (
        data.batches(
            w,
            args.batch_size,
            shuffle=False,
            drop_remainder=distribution is not None or context is not None,
        )
        for w in (val_windows, windows[2])
    )

    max_length = max(args.sequence_length, args.max_length)
    if args.extrapolation:  # a learned table as long as the longest test
        max_length = max(max_length, EXTRAPOLATION[-1] * args.sequence_length)
    with strategy.scope(), training_scope():
        model, generator = build_language_model(
            vocabulary_size,
            max_length,
            hidden_dim=args.hidden_dim,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            dropout=args.dropout,
            window=args.window or None,
            positions=args.positions,
            mixer=args.mixer[0],
        )
        # Packed windows: the same layers, reading `segment_ids` too.
        fit_model = (
            packed_language_model(model)
            if args.documents == "packed"
            else model
        )
        compile_models(fit_model, model, args)
    model.summary(print_fn=logger.info)
    memory = None
    if context is not None:
        memory, lines = context_parallel.memory_report(
            fit_model, context, args.batch_size, args.sequence_length
        )
        print("\n".join(lines))
    timer = StepTimer()
    with training_scope():
        history = fit(fit_model, train, val, args, callbacks=[timer])
        # `model.evaluate` fails under several workers (keras#20585).
        test_loss = float(evaluate(model, test)["loss"])
    throughput = training_throughput(train_windows, args, timer)
    train_time = time.time() - start
    bpc = bits_per_character(test_loss)
    # Teacher-forced, on test windows as long as the generated texts.
    long_windows = data.char_windows(test_lines, tokenizer, args.max_length)
    bits = positional_bits_per_character(
        model,
        data.batches(
            long_windows, args.batch_size, shuffle=False
        ).as_numpy_iterator(),
    )
    backend = keras.backend.backend()
    label = args.distribution
    if context is not None:
        label = f"context-parallel {args.context_parallel}"
    losses = history.history.get("loss", [])
    print(
        f"\nbackend: {backend} | train loss per epoch: "
        + " ".join(f"{v:.4f}" for v in losses)
        + f" | {timer.median_ms():.1f} ms/step (median)"
        + f" | distribution: {label}"
        + (
            f" ({len(keras.distribution.list_devices())} devices)"
            if distribution is not None or context is not None
            else ""
        )
    )
    print(
        f"test: {bpc:.3f} bits per character (per-character perplexity "
        f"{np.exp(test_loss):.2f}) on {args.sequence_length}-character windows "
        f"(the training length), {train_time / 60:.1f} min\n"
        f"      {bits.mean():.3f} bits per character on "
        f"{args.max_length}-character windows (the generation length)"
        + (
            f", {bits[args.sequence_length :].mean():.3f} at positions "
            f"{args.sequence_length}-{args.max_length - 1}"
            if args.max_length > args.sequence_length
            else ""
        )
    )

    print(
        f"training windows: {args.documents} | "
        f"{throughput['tokens_per_second']:.0f} tokens/s (real, "
        f"non-padding) | padding {100 * throughput['padding']:.1f} %"
    )

    blocks = block_mixers(model)
    print(f"mixer: {args.mixer[0]} (blocks: {', '.join(blocks)})")

    extrapolation = None
    if args.extrapolation:
        extrapolation = extrapolation_bits(
            model, test_lines, tokenizer, args.sequence_length, args.batch_size
        )
        print(
            f"extrapolation ({args.positions}, window {args.window}): "
            + ", ".join(
                f"{factor}x ({factor * args.sequence_length} characters) "
                f"{bits:.3f} bits/char"
                for factor, bits in extrapolation.items()
            )
        )

    export_path, server = None, None
    if backend == "tensorflow":
        export_path = os.path.join(args.output_dir, "saved_model")
        server = export_language_model(
            export_path,
            model,
            generator,
            tokenizer,
            args.max_length,
            args.samplers,
        )
        print(
            f"SavedModel: {export_path}  "
            "(tf.saved_model.load(path).greedy(prompts))"
        )
    else:
        print(
            f"SavedModel export skipped: it needs the TensorFlow backend "
            f"(this run: {backend}). A SavedModel is a TensorFlow graph; "
            "run with --backend tensorflow to export one."
        )
    completions = {}
    for name in args.samplers:
        completions[name] = complete(
            generator,
            PROMPTS,
            make_sampler(name, seed=args.seed),
            args.max_length,
            vocabulary_size,
        )
        print(f"[{name}]")
        for p, c in zip(PROMPTS, completions[name]):
            print(f"  {p}|{c}")
    explorer, left_out = write_explorer(
        model,
        [p + c for p, c in zip(PROMPTS, completions[args.samplers[0]])],
        vocabulary_size,
        args.output_dir,
    )
    print(
        f"Attention explorer: {explorer}"
        + (
            f" (left out, weights that can be negative: {', '.join(left_out)})"
            if left_out
            else ""
        )
    )
    return {
        "backend": backend,
        "distribution": args.distribution,
        "blocks": blocks,
        "context_parallel_memory": memory,
        "history": history.history,
        "step_ms": timer.median_ms(),
        "throughput": throughput,
        "test_bits_per_character": bpc,
        "generation_length_bits_per_character": float(bits.mean()),
        "positional_bits_per_character": bits,
        "extrapolation_bits_per_character": extrapolation,
        "export_path": export_path,
        "server": server,
        "completions": completions,
        "prompts": PROMPTS,
        "train_time_s": train_time,
        "explorer": explorer,
    }


if __name__ == "__main__":
    main()
