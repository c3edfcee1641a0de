"""Image captioning with visual attention on strings of handwritten digits.

The data (offline): scikit-learn's bundled handwritten digits (8x8
pixels) composed into strings of 2-5 digits on a 16x64 canvas at random
heights, offsets and spacing; the caption is the digits' words ("four
one seven"). The test split is held out by composition (no test digit
string is a training caption) and by image (its digits come from images
no model trained on). A small CNN encodes the canvas to a 4x16 grid of
features, and two decoders attend over the 64 cells:

- Show, Attend and Tell (Xu et al., 2015), soft attention: an LSTM
  `AttentionRNNDecoder` with `BahdanauAttention`, and the paper's doubly
  stochastic regularisation `lambda * sum_i (1 - sum_t a_ti)^2`;
- a transformer decoder (`TransformerDecoderBlock`) cross-attending to
  the grid.

Both train with `model.fit` on `tf.data` (teacher forcing) and caption
the test set greedily: exact caption match, BLEU (sacrebleu) and word
accuracy, time per training step, as a Markdown table; a PNG per
caption of a few test images (each generated word's attention over the
image), the attention explorer of one of them, and a SavedModel per
decoder that takes images and returns their captions:

    python -m examples.caption                 # both, ~6 min on 2 CPU cores
    python -m examples.caption --decoders transformer --epochs 8
    python -m examples.caption --penalty 0     # no doubly stochastic term
    python -m examples.caption --quick         # 1,000 images, 2 epochs, ~40 s

Outputs in `--output-dir` (default runs/caption): `results.md` (the
table), `results.json`, and per decoder `<decoder>/attention_<i>.png`,
`<decoder>/saved_model`; `attention.html` (the explorer).
"""

import argparse
import json
import logging
import os
import platform
import shlex
import sys
import time

from examples.common import HelpFormatter
from examples.common import parse_choices
from examples.common import setup_runtime

logger = logging.getLogger("examples")


def parse_args(argv=None):
    from examples.caption.model import DECODERS

    parser = argparse.ArgumentParser(
        prog="python -m examples.caption",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "--decoders",
        default=",".join(DECODERS),
        help=f"comma-separated, among {', '.join(DECODERS)}",
    )
    data = parser.add_argument_group("data")
    data.add_argument("--train-size", type=int, default=20000)
    data.add_argument("--validation-size", type=int, default=500)
    data.add_argument("--test-size", type=int, default=2000)
    model = parser.add_argument_group("models and training")
    model.add_argument(
        "--features", type=int, default=128, help="grid features (both)"
    )
    model.add_argument(
        "--units",
        type=int,
        default=256,
        help="LSTM state (Show, Attend and Tell)",
    )
    model.add_argument(
        "--penalty",
        type=float,
        default=0.01,
        help="lambda of the doubly stochastic regularisation (Show, Attend "
        "and Tell)",
    )
    model.add_argument(
        "--layers", type=int, default=2, help="transformer decoder blocks"
    )
    model.add_argument("--heads", type=int, default=4)
    model.add_argument("--epochs", type=int, default=5)
    model.add_argument("--batch-size", type=int, default=64)
    model.add_argument("--learning-rate", type=float, default=2e-3)
    model.add_argument(
        "--jit-compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="XLA-compile the train step (default: on with a GPU)",
    )
    model.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--num-plots", type=int, default=4, help="test images drawn per decoder"
    )
    parser.add_argument(
        "--export",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write each decoder's SavedModel",
    )
    parser.add_argument("--output-dir", default="runs/caption")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1,000 training images, 100 validation and test, 2 epochs, "
        "smaller models, 2 plots (smoke test)",
    )
    args = parser.parse_args(argv)
    args.decoders = parse_choices(parser, "--decoders", args.decoders, DECODERS)
    if args.quick:
        args.train_size = min(args.train_size, 1000)
        args.validation_size = min(args.validation_size, 100)
        args.test_size = min(args.test_size, 100)
        args.epochs = min(args.epochs, 2)
        args.features = min(args.features, 32)
        args.units = min(args.units, 64)
        args.num_plots = min(args.num_plots, 2)
    # What `setup_runtime` reads: one device, float32.
    args.strategy, args.logical_cpus, args.mixed_precision = "default", 0, "off"
    return args


def _step_timer(keras):
    class StepTimer(keras.callbacks.Callback):
        """Wall time of each training step (`steps_per_execution` 1)."""

        def on_train_begin(self, logs=None):
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.start)

    return StepTimer()


def build(kind, args):
    from examples.caption.model import build_captioner

    if kind == "show_attend_tell":
        return build_captioner(
            kind, features=args.features, units=args.units, penalty=args.penalty
        )
    return build_captioner(
        kind,
        features=args.features,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_dim=2 * args.features,
    )


def train(kind, splits, args):
    """Builds and trains one captioner; returns it and its training
    measures."""
    import keras
    import numpy as np

    from examples.caption import data
    from examples.common.distributed import build_training_state

    keras.utils.set_random_seed(args.seed)
    captioner = build(kind, args)
    train_x, train_strings, _ = splits["train"]
    val_x, val_strings, _ = splits["validation"]
    train_batches = data.batches(
        train_x, train_strings, args.batch_size, True, args.seed
    )
    val_batches = data.batches(val_x, val_strings, 256, False, args.seed)
    steps = args.epochs * -(-len(train_x) // args.batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=max(1, steps - steps // 20),
        warmup_target=args.learning_rate,
        warmup_steps=max(1, steps // 20),
    )
    captioner.model.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=args.jit_compile,
    )
    # The optimizer's variables now: created while `fit` traces its first
    # step, they would make TensorFlow trace it twice.
    build_training_state(captioner.model, train_batches)
    timer = _step_timer(keras)
    start = time.time()
    history = captioner.model.fit(
        train_batches,
        validation_data=val_batches,
        epochs=args.epochs,
        shuffle=False,  # the dataset shuffles
        verbose=2 if not args.quick else 0,
        callbacks=[timer],
    )
    train_seconds = time.time() - start
    times = timer.times[5:] or timer.times  # the first steps trace
    return captioner, {
        "decoder": kind,
        "steps": len(timer.times),
        "ms_per_step": 1000 * float(np.median(times)),
        "train_seconds": train_seconds,
        "parameters": int(captioner.model.count_params()),
        "final_loss": float(history.history["loss"][-1]),
        "final_val_loss": float(history.history["val_loss"][-1]),
    }


def generate(captioner, images, batch_size=250):
    """Greedy ids and attention of all `images`, batch by batch."""
    import keras
    import numpy as np
    import tensorflow as tf

    # No AutoGraph: the decoding loop is a Python loop of fixed length.
    fn = tf.function(captioner.generate, reduce_retracing=True, autograph=False)
    ids, attention = [], []
    for i in range(0, len(images), batch_size):
        out = fn(tf.constant(images[i : i + batch_size]))
        ids.append(keras.ops.convert_to_numpy(out[0]))
        attention.append(keras.ops.convert_to_numpy(out[1]))
    return np.concatenate(ids), np.concatenate(attention)


def scores(hypotheses, references):
    """Exact match, corpus BLEU (sacrebleu, its default 13a tokenizer) and
    word accuracy (position-wise correct words / reference words)."""
    import numpy as np
    import sacrebleu

    exact = float(np.mean([h == r for h, r in zip(hypotheses, references)]))
    bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score / 100
    correct = total = 0
    for h, r in zip(hypotheses, references):
        h, r = h.split(), r.split()
        correct += sum(a == b for a, b in zip(h, r))
        total += len(r)
    by_length = {}
    for n in sorted({len(r.split()) for r in references}):
        same = [
            h == r
            for h, r in zip(hypotheses, references)
            if len(r.split()) == n
        ]
        by_length[str(n)] = float(np.mean(same))
    return {
        "exact_match": exact,
        "bleu": bleu,
        "word_accuracy": correct / total,
        "exact_match_by_length": by_length,
    }


def tokens_of(ids):
    """The generated tokens of one row, `[END]` included."""
    from examples.caption.data import END
    from examples.caption.data import VOCABULARY

    words = []
    for token in ids:
        words.append(VOCABULARY[int(token)])
        if token == END:
            break
    return words


def draw(kind, images, strings, ids, attention, args):
    """A PNG per caption of the first `--num-plots` test images."""
    from examples.caption.data import caption
    from examples.caption.model import DECODER_NAMES
    from examples.caption.model import GRID
    from examples.caption.plots import caption_figure

    plots = []
    for i in range(min(args.num_plots, len(images))):
        words = tokens_of(ids[i])
        path = os.path.join(args.output_dir, kind, f"attention_{i}.png")
        generated = " ".join(w for w in words if w != "[END]")
        title = (
            f"{DECODER_NAMES[kind]}\nreference: {caption(strings[i])}\n"
            f"generated: {generated}"
        )
        plots.append(
            caption_figure(
                images[i], words, attention[i, : len(words)], GRID, path, title
            )
        )
    return plots


def write_explorer(kind, images, ids, attention, path, count=4):
    """The attention explorer of the first `count` test captions in its
    image mode: each generated word's attention over the image, and the
    words (rows) over the 4x16 grid cells (columns, `r{row}c{column}`)."""
    import numpy as np

    from examples.caption.model import GRID
    from keras_attention.visualization import attention_html

    count = min(count, len(images))
    words = [tokens_of(ids[i]) for i in range(count)]
    cells = [f"r{r}c{c}" for r in range(GRID[0]) for c in range(GRID[1])]
    weights = np.asarray(attention[:count, None], "float32")  # b 1 t g
    name = f"{kind}/attention_over_image"
    attention_html(
        {name: weights},
        cells,
        target_tokens=words,
        kinds={name: "cross"},
        images=images[:count],
        image_grid=GRID,
        path=path,
        title=f"{kind}: each generated word's attention over the 4x16 "
        "grid of the image (rows: words; columns: cells)",
    )
    return path


def machine():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def markdown_table(rows):
    from examples.caption.model import DECODER_NAMES

    lines = [
        "| decoder | exact match | BLEU | word accuracy | ms / step "
        "| train s | parameters |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {DECODER_NAMES[row['decoder']]} "
            f"| {100 * row['exact_match']:.1f} % | {100 * row['bleu']:.1f} "
            f"| {100 * row['word_accuracy']:.1f} % "
            f"| {row['ms_per_step']:.0f} | {row['train_seconds']:.0f} "
            f"| {row['parameters']:,} |"
        )
    return "\n".join(lines)


def length_table(rows):
    """Exact match by the number of digits of the reference."""
    from examples.caption.model import DECODER_NAMES

    lengths = list(rows[0]["exact_match_by_length"])
    lines = [
        "| decoder | " + " | ".join(f"{n} digits" for n in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    for row in rows:
        cells = (
            f"{100 * row['exact_match_by_length'][n]:.1f} %" for n in lengths
        )
        lines.append(
            f"| {DECODER_NAMES[row['decoder']]} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    setup_runtime(args)
    wall = time.time()

    from examples.caption import data
    from examples.caption.model import DECODER_NAMES

    os.makedirs(args.output_dir, exist_ok=True)
    splits = data.make_splits(
        {
            "train": args.train_size,
            "validation": args.validation_size,
            "test": args.test_size,
        },
        seed=args.seed,
    )
    test_x, test_strings, _ = splits["test"]
    references = [data.caption(s) for s in test_strings]
    train_captions = {data.caption(s) for s in splits["train"][1]}
    logger.info(
        "%d training / %d validation / %d test canvases of %dx%d; %d "
        "distinct training captions, %d distinct test captions, %d shared",
        *(len(splits[s][0]) for s in data.SPLITS),
        data.HEIGHT,
        data.WIDTH,
        len(train_captions),
        len(set(references)),
        len(train_captions & set(references)),
    )
    rows, outputs = [], {}
    for kind in args.decoders:
        captioner, row = train(kind, splits, args)
        start = time.time()
        ids, attention = generate(captioner, test_x)
        row["decode_seconds"] = time.time() - start
        hypotheses = data.decode(ids)
        row.update(scores(hypotheses, references))
        plots = draw(kind, test_x, test_strings, ids, attention, args)
        mine = {
            "plots": [path for path, _ in plots],
            "examples": [
                {"reference": r, "generated": h}
                for r, h in list(zip(references, hypotheses))[:10]
            ],
        }
        if args.export:
            from examples.caption.export import export

            path = os.path.join(args.output_dir, kind, "saved_model")
            export(captioner, path)
            mine["saved_model"] = path
        if kind == args.decoders[0]:
            mine["html"] = write_explorer(
                kind,
                test_x,
                ids,
                attention,
                os.path.join(args.output_dir, "attention.html"),
            )
        outputs[kind] = mine
        rows.append(row)
        logger.info(
            "  %-42s exact %.3f  BLEU %.3f  words %.3f  %.0f ms/step  %.0f s",
            DECODER_NAMES[kind],
            row["exact_match"],
            row["bleu"],
            row["word_accuracy"],
            row["ms_per_step"],
            row["train_seconds"],
        )
    wall_time = time.time() - wall
    table = markdown_table(rows)
    command = "python -m examples.caption " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    report = (
        f"{table}\n\n{length_table(rows)}\n\n"
        f"{len(test_x):,} held-out test canvases ({len(set(references))} "
        f"distinct captions, none a training caption; digits from held-out "
        f"images), greedy decoding. Exact match: the whole caption right; "
        f"BLEU: corpus BLEU-4 (sacrebleu); word accuracy: words right at "
        f"their position over reference words; second table: exact match "
        f"by the number of digits. ms / step: median wall time "
        f"of a training step (batch {args.batch_size}, after the first 5); "
        f"train s: {args.epochs} epochs of {len(splits['train'][0]):,} "
        f"canvases.\n"
        f"Command: `{command.strip()}`; {machine()}, {os.cpu_count()} CPUs; "
        f"wall time {wall_time / 60:.1f} min.\n"
    )
    with open(os.path.join(args.output_dir, "results.md"), "w") as f:
        f.write(report)
    results = {
        "args": dict(vars(args)),
        "summary": rows,
        "outputs": outputs,
        "wall_seconds": wall_time,
        "test_captions": len(set(references)),
        "shared_captions": len(train_captions & set(references)),
    }
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\n" + report)
    for kind, mine in outputs.items():
        for example in mine["examples"][:3]:
            print(
                f"{kind}: {example['reference']!r} -> {example['generated']!r}"
            )
        print(f"{kind}: plots {', '.join(mine['plots'])}")
    return {**results, "table": table}


if __name__ == "__main__":
    main()
