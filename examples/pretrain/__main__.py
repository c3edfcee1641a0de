"""Pretraining that pays off when labels are scarce: the three
pretraining objectives on one transformer encoder, and fine-tuning curves
over the number of labelled examples.

Pretrains the same backbone (`TransformerEncoderBlock`s over a
`TokenAndPositionEmbedding`) on all the unlabelled text the repository
ships (`--corpus all`: the WordNet definitions' training split without
labels and the King James Bible's) with masked language modelling (`mlm`,
BERT: 15 % of the tokens masked by keras_hub's `MaskedLMMaskGenerator`,
bidirectional attention), causal language modelling (`clm`, GPT: causal
attention) or prefix language modelling (`prefix_lm`: the mask object
`mods.PrefixLMMask`, bidirectional over a random prefix, causal after it),
saves each pretrained model once under `--pretrained-dir` (reused by
later runs) with its loss curve, then fine-tunes each backbone, and the
same model from scratch, on the `classify` task (WordNet noun definition
-> one of 25 supersenses) with 100, 300 ... labelled definitions,
three seeds each, with one recipe for all (`finetune.py`: warm-up, the
backbone at a quarter of the head's learning rate, early stopping on the
validation split). It writes the table of test accuracies (mean +- sd
over the seeds), the curve `finetune_curve.png`, the pretraining loss
curves `pretrain_loss.png` and the attention explorer `attention.html`
(the three pretrained models side by side) to `--output-dir`.

    python -m examples.pretrain                  # 100 and 300 labels
    python -m examples.pretrain --full           # 100 labels to all
    python -m examples.pretrain --pretrain-only  # save the backbones only
    python -m examples.pretrain --finetune-only  # reuse the saved ones
    python -m examples.pretrain --objective clm --pack   # packed rows

`--pack` trains `mlm` and `clm` on packed rows (the sequences one after
the other, no padding; each attends only to itself through the blocks'
`segment_ids=`, positions restart per sequence); the pretraining table's
`tokens/s` column (real tokens per second of pretraining, after the first
interval) and `padding` column compare it with the default padded batches.
"""

import argparse
import json
import logging
import os
import time

import numpy as np

from examples.common import HelpFormatter
from examples.common.training import setup_logging

logger = logging.getLogger("examples")

EXPLORER_TEXTS = (
    "a large wild cat with a striped coat",
    "a person who writes poems",
    "a device that measures the temperature of a room",
)
SCRATCH = "scratch"
DEFAULT_COUNTS = "100,300"
FULL_COUNTS = "100,300,1000,3000,all"
# What the saved backbones depend on: a run with other values pretrains
# again (and overwrites them).
PRETRAIN_CONFIG = (
    "corpus",
    "vocabulary_size",
    "max_length",
    "hidden_dim",
    "num_layers",
    "num_heads",
    "dropout",
    "pretrain_steps",
    "pretrain_learning_rate",
    "batch_size",
    "pack",
    "padding",
    "seed",
    "quick",
)


def parse_counts(text):
    """`"100,300,all"` -> `[100, 300, None]` (None: every example)."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        counts.append(None if part == "all" else int(part))
    return counts


def parse_args(argv=None):
    from examples.pretrain.data import CORPORA
    from examples.pretrain.model import OBJECTIVES

    parser = argparse.ArgumentParser(
        prog="python -m examples.pretrain",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument(
        "--objective",
        choices=[*OBJECTIVES, "all"],
        default="all",
        help="pretraining objective; all: the three (and scratch always)",
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--corpus",
        choices=CORPORA,
        default=CORPORA[0],
        help="pretraining text: the training splits' texts (no labels)",
    )
    data.add_argument("--data-dir", default=None, help="TFDS data directory")
    data.add_argument("--vocabulary-size", type=int, default=4000)
    data.add_argument(
        "--max-length", type=int, default=32, help="tokens per sequence"
    )
    model = parser.add_argument_group("model")
    model.add_argument("--hidden-dim", type=int, default=96)
    model.add_argument("--num-layers", type=int, default=2)
    model.add_argument("--num-heads", type=int, default=4)
    model.add_argument("--dropout", type=float, default=0.1)
    train = parser.add_argument_group("pretraining")
    train.add_argument(
        "--pretrain-steps",
        type=int,
        default=2000,
        help="per objective (--full pretrains the same: it reuses the "
        "models a default run saved)",
    )
    train.add_argument("--pretrain-learning-rate", type=float, default=2e-3)
    train.add_argument("--batch-size", type=int, default=64)
    train.add_argument(
        "--pack",
        action="store_true",
        help="pretrain mlm and clm on packed rows (no padding)",
    )
    train.add_argument(
        "--padding",
        choices=("buckets", "batch", "window"),
        default="buckets",
        help="padded batches (without --pack, and prefix_lm): 'buckets' "
        "(sequences of similar lengths together, little padding), 'batch' "
        "(random order, padded to each batch's longest) or 'window' (every "
        "sequence padded to --max-length, as keras-hub's preprocessors do)",
    )
    train.add_argument(
        "--pretrained-dir",
        default=None,
        help="where the pretrained models are saved and reused "
        "(default: <output-dir>/pretrained)",
    )
    tune = parser.add_argument_group("fine-tuning (one recipe for all)")
    tune.add_argument(
        "--label-counts",
        default=None,
        help="labelled training definitions, comma-separated, `all`: the "
        f"whole split (default {DEFAULT_COUNTS}; --full {FULL_COUNTS})",
    )
    tune.add_argument("--seeds", type=int, default=3)
    tune.add_argument("--finetune-learning-rate", type=float, default=2e-3)
    tune.add_argument(
        "--backbone-multiplier",
        type=float,
        default=0.25,
        help="the backbone's learning rate over the head's",
    )
    tune.add_argument("--warmup-steps", type=int, default=30)
    tune.add_argument("--max-epochs", type=int, default=15)
    tune.add_argument(
        "--max-epoch-steps",
        type=int,
        default=200,
        help="steps between validation checks at most (an epoch is one "
        "pass over the labelled examples below 6,400 of them)",
    )
    tune.add_argument("--patience", type=int, default=4)
    tune.add_argument(
        "--validation-examples",
        type=int,
        default=2000,
        help="validation definitions early stopping reads",
    )
    mode = parser.add_argument_group("what to run")
    mode.add_argument(
        "--pretrain-only", action="store_true", help="pretrain and save"
    )
    mode.add_argument(
        "--finetune-only",
        action="store_true",
        help="fine-tune the saved pretrained models (no pretraining)",
    )
    mode.add_argument(
        "--full",
        action="store_true",
        help=f"the whole grid: {FULL_COUNTS} labels (the same pretrained "
        "models as the default run)",
    )
    parser.add_argument("--output-dir", default="runs/pretrain")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny data subset and model, a few steps (smoke test)",
    )
    args = parser.parse_args(argv)
    if args.pretrain_only and args.finetune_only:
        parser.error("--pretrain-only and --finetune-only exclude each other")
    if args.label_counts is None:
        args.label_counts = FULL_COUNTS if args.full else DEFAULT_COUNTS
        if args.quick:
            args.label_counts = "20,40"
    args.label_counts = parse_counts(args.label_counts)
    if args.quick:
        args.vocabulary_size = min(args.vocabulary_size, 600)
        args.hidden_dim, args.num_layers, args.num_heads = 16, 1, 2
        args.pretrain_steps = min(args.pretrain_steps, 8)
        args.batch_size = min(args.batch_size, 16)
        args.seeds = 1
        args.max_epochs = min(args.max_epochs, 2)
        args.warmup_steps = min(args.warmup_steps, 2)
        args.validation_examples = min(args.validation_examples, 100)
    if args.max_epoch_steps < min_epoch_steps(args):
        parser.error(
            f"--max-epoch-steps {args.max_epoch_steps!r}: below an epoch's "
            f"least steps ({min_epoch_steps(args)})"
        )
    if args.pretrained_dir is None:
        args.pretrained_dir = os.path.join(args.output_dir, "pretrained")
    return args


class CpuClock:
    """CPU seconds (user + sys, all threads) of this process since start."""

    def __init__(self):
        self.start = time.process_time()

    def seconds(self):
        return time.process_time() - self.start


class EpochTimer:
    """Wall seconds of the training part of each `fit` epoch (before the
    validation pass, when there is one)."""

    def __init__(self):
        import keras

        class Callback(keras.callbacks.Callback):
            def on_epoch_begin(inner, epoch, logs=None):
                inner.start = time.perf_counter()

            def on_test_begin(inner, logs=None):
                if getattr(inner, "start", None) is not None:
                    self.seconds.append(time.perf_counter() - inner.start)
                    inner.start = None

            def on_epoch_end(inner, epoch, logs=None):
                if inner.start is not None:
                    self.seconds.append(time.perf_counter() - inner.start)
                    inner.start = None

        self.seconds = []
        self.callback = Callback()


def new_backbone(args, vocabulary_size, seed):
    """A freshly initialised backbone (the weights depend on `seed`)."""
    import keras

    from examples.pretrain.model import Backbone

    keras.utils.set_random_seed(seed)
    return Backbone(
        vocabulary_size,
        args.max_length,
        hidden_dim=args.hidden_dim,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        dropout=args.dropout,
    )


def pretrain(backbone, objective, tokenizer, train_ids, val_ids, args):
    """Trains `backbone` with `objective`; returns `(model, curve,
    throughput)`: `curve` the training and validation per-token
    cross-entropy (nats) at `steps` (ten points; four with `--quick`),
    `throughput` `{"tokens_per_second", "padding", "packed"}` of the
    training batches (real input tokens per wall second after the first
    interval, which compiles; the padding fraction of the batches)."""
    import keras

    from examples.common import packing
    from examples.common.distributed import build_training_state
    from examples.common.distributed import with_known_size
    from examples.pretrain import data
    from examples.pretrain.model import PACKABLE
    from examples.pretrain.model import build_pretraining_model

    packed = args.pack and objective in PACKABLE

    def batches(ids, shuffle):
        common = (ids, objective, tokenizer, args.batch_size, args.max_length)
        if packed:
            return data.packed_batches(*common, shuffle, args.seed)
        return data.objective_batches(
            *common, shuffle, args.seed, padding=args.padding
        )

    model = build_pretraining_model(backbone, objective, packed=packed)
    model.compile(
        optimizer=keras.optimizers.AdamW(
            keras.optimizers.schedules.CosineDecay(
                0.0,
                decay_steps=args.pretrain_steps,
                alpha=0.1,
                warmup_target=args.pretrain_learning_rate,
                warmup_steps=max(1, args.pretrain_steps // 20),
            ),
            weight_decay=1e-4,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[
            keras.metrics.SparseCategoricalCrossentropy(
                from_logits=True, name="token_loss"
            ),
            keras.metrics.SparseCategoricalAccuracy(name="token_accuracy"),
        ],
    )
    # Ten validation points (four with --quick: a smoke test's curve).
    chunks = min(4 if args.quick else 10, args.pretrain_steps)
    steps = args.pretrain_steps // chunks
    timer = EpochTimer()
    train = batches(train_ids, True).repeat()
    build_training_state(model, train)  # each step traced once
    history = model.fit(
        train,
        epochs=chunks,
        steps_per_epoch=steps,
        # A known size: Keras warns "Your input ran out of data" otherwise.
        validation_data=with_known_size(batches(val_ids, False)),
        verbose=2,
        shuffle=False,  # the pipeline shuffles (Keras would warn)
        callbacks=[timer.callback],
    )
    curve = {
        "steps": [steps * (i + 1) for i in range(chunks)],
        "train_loss": [float(x) for x in history.history["token_loss"]],
        "val_loss": [float(x) for x in history.history["val_token_loss"]],
    }
    sample = max(1, min(50, args.pretrain_steps))
    real, total = packing.real_tokens(batches(train_ids, True).repeat(), sample)
    timed = timer.seconds[1:] or timer.seconds
    throughput = {
        "tokens_per_second": real / sample * steps * len(timed) / sum(timed),
        "padding": 1.0 - real / total,
        "packed": packed,
        "padding_mode": None if packed else args.padding,
    }
    return model, curve, throughput


class PretrainedStore:
    """The pretrained models under `--pretrained-dir`: `config.json` (the
    arguments they depend on), `vocabulary.txt`, and per objective
    `<objective>.weights.h5` (the whole pretraining model) and
    `<objective>.json` (its loss curve, throughput, CPU seconds)."""

    def __init__(self, directory):
        self.directory = directory

    def path(self, name):
        return os.path.join(self.directory, name)

    def config(self):
        try:
            with open(self.path("config.json")) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def start(self, config, tokenizer):
        """A new store for `config`: old pretrained models are removed."""
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):
            if name.endswith((".weights.h5", ".json", ".txt")):
                os.remove(self.path(name))
        with open(self.path("vocabulary.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(tokenizer.get_vocabulary()) + "\n")
        with open(self.path("config.json"), "w") as f:
            json.dump(config, f, indent=1)

    def tokenizer(self):
        from examples.pretrain import data

        with open(self.path("vocabulary.txt"), encoding="utf-8") as f:
            return data.tokenizer_of(f.read().splitlines())

    def has(self, objective):
        return os.path.exists(self.path(f"{objective}.weights.h5"))

    def save(self, objective, model, record):
        model.save_weights(self.path(f"{objective}.weights.h5"))
        with open(self.path(f"{objective}.json"), "w") as f:
            json.dump(record, f, indent=1)

    def record(self, objective):
        with open(self.path(f"{objective}.json")) as f:
            return json.load(f)

    def load(self, objective, backbone, packed):
        """The pretraining model of `objective` on `backbone`, with the
        saved weights (the backbone's layers hold them)."""
        from examples.pretrain.model import build_pretraining_model

        model = build_pretraining_model(backbone, objective, packed=packed)
        model.load_weights(self.path(f"{objective}.weights.h5"))
        return model


def pretrained_models(args, objectives, clock):
    """Pretrains (or reuses) each objective's model; returns
    `(tokenizer, models, records)`."""
    from examples.pretrain import data
    from examples.pretrain.model import PACKABLE

    store = PretrainedStore(args.pretrained_dir)
    config = {key: getattr(args, key) for key in PRETRAIN_CONFIG}
    saved = store.config()
    if args.finetune_only:
        if saved is None:
            raise SystemExit(
                f"--finetune-only: no pretrained models in "
                f"{args.pretrained_dir}; run with --pretrain-only first"
            )
        for key, value in saved.items():  # the saved models' shape wins
            setattr(args, key, value)
        tokenizer = store.tokenizer()
        missing = [o for o in objectives if not store.has(o)]
        if missing:
            raise SystemExit(
                f"--finetune-only: {args.pretrained_dir} has no {missing}"
            )
    elif saved == config:
        tokenizer = store.tokenizer()
        logger.info("reusing the pretrained models in %s", args.pretrained_dir)
    else:
        train_texts, _ = data.corpus_texts(
            args.corpus, args.data_dir, tiny=args.quick
        )
        tokenizer = data.make_tokenizer(train_texts, args.vocabulary_size)
        store.start(config, tokenizer)
    texts = None
    models, records = {}, {}
    for objective in objectives:
        packed = args.pack and objective in PACKABLE
        backbone = new_backbone(args, tokenizer.vocabulary_size(), args.seed)
        if store.has(objective):
            logger.info("%s: the saved pretrained model", objective)
            models[objective] = store.load(objective, backbone, packed)
            records[objective] = store.record(objective)
            continue
        if texts is None:
            train_texts, val_texts = data.corpus_texts(
                args.corpus, args.data_dir, tiny=args.quick
            )
            texts = (
                data.encode(train_texts, tokenizer, args.max_length),
                data.encode(val_texts, tokenizer, args.max_length).take(
                    64 if args.quick else 2000
                ),
            )
        start = clock.seconds()
        models[objective], curve, throughput = pretrain(
            backbone, objective, tokenizer, *texts, args
        )
        records[objective] = {
            "curve": curve,
            "throughput": throughput,
            "cpu_seconds": clock.seconds() - start,
            "pretrain_steps": args.pretrain_steps,
        }
        store.save(objective, models[objective], records[objective])
    return tokenizer, models, records


def min_epoch_steps(args):
    """An epoch's least steps (fewer with `--quick`)."""
    return 3 if args.quick else 10


def recipe_of(args):
    from examples.pretrain.finetune import Recipe

    return Recipe(
        learning_rate=args.finetune_learning_rate,
        backbone_multiplier=args.backbone_multiplier,
        warmup_steps=args.warmup_steps,
        max_epochs=args.max_epochs,
        patience=args.patience,
        min_epoch_steps=min_epoch_steps(args),
        max_epoch_steps=args.max_epoch_steps,
    )


HEAD_LAYERS = ("pooling/", "logits/")


class InitialWeights:
    """Each fine-tuning run's initial weights (as `model.get_weights()` of
    the classifier): the backbone's, freshly initialised from the run's
    seed (`scratch`) or the saved pretrained ones, and the head's
    (`AttentionPooling` and the output layer), freshly initialised from
    the run's seed. Built once per seed and per objective."""

    def __init__(self, args, tokenizer, num_classes):
        self.args = args
        self.vocabulary_size = tokenizer.vocabulary_size()
        self.num_classes = num_classes
        self._fresh = {}
        self._pretrained = {}

    def classifier(self, seed, objective=SCRATCH):
        """A new classifier: the backbone initialised from `seed` or, for
        an objective, with its saved pretrained weights; the head from
        `seed`."""
        import keras

        from examples.pretrain.model import PACKABLE
        from examples.pretrain.model import build_classifier

        args = self.args
        backbone = new_backbone(args, self.vocabulary_size, seed)
        if objective != SCRATCH:
            PretrainedStore(args.pretrained_dir).load(
                objective, backbone, args.pack and objective in PACKABLE
            )
        keras.utils.set_random_seed(seed)  # the head's initial weights
        return build_classifier(backbone, self.num_classes, args.dropout)

    def of(self, objective, seed):
        if seed not in self._fresh:
            model = self.classifier(seed)
            self._fresh[seed] = [
                (v.path.startswith(HEAD_LAYERS), v.numpy())
                for v in model.weights
            ]
        fresh = self._fresh[seed]
        if objective == SCRATCH:
            return [value for _, value in fresh]
        if objective not in self._pretrained:
            model = self.classifier(0, objective)
            self._pretrained[objective] = model.get_weights()
        return [
            value if head else pretrained
            for (head, value), pretrained in zip(
                fresh, self._pretrained[objective]
            )
        ]


def backbone_variables(model):
    """The classifier's variables outside the head (the smaller step)."""
    return [
        v
        for v in model.trainable_variables
        if not v.path.startswith(HEAD_LAYERS)
    ]


def finetune_grid(args, tokenizer, objectives, clock):
    """Every (seed, label count, model) run; returns the result rows."""
    from examples.pretrain import data
    from examples.pretrain.finetune import FineTuner
    from examples.pretrain.finetune import label_subsets

    arrays, class_names = data.labelled_arrays(
        tokenizer, args.max_length, args.data_dir, tiny=args.quick
    )
    x, y = arrays["train"]
    counts = sorted(
        {len(x) if n is None else min(n, len(x)) for n in args.label_counts}
    )
    logger.info(
        "fine-tuning on %s of %d labelled definitions, %d classes, "
        "%d seeds; %s",
        counts,
        len(x),
        len(class_names),
        args.seeds,
        recipe_of(args).describe(),
    )
    initial = InitialWeights(args, tokenizer, len(class_names))
    model = initial.classifier(0)
    tuner = FineTuner(model, backbone_variables(model), recipe_of(args))
    x_val, y_val = arrays["validation"]
    validation = (
        x_val[: args.validation_examples],
        y_val[: args.validation_examples],
    )
    x_test, y_test = arrays["test"]
    rows = []
    for seed in range(args.seeds):
        subsets = label_subsets(len(x), counts, seed)
        for n in counts:
            train = (x[subsets[n]], y[subsets[n]])
            for objective in (SCRATCH, *objectives):
                start, wall = clock.seconds(), time.perf_counter()
                record = tuner.fit(
                    initial.of(objective, seed), train, validation, seed
                )
                metrics = model.evaluate(
                    x_test, y_test, batch_size=256, verbose=0, return_dict=True
                )
                record.update(
                    test_accuracy=float(metrics["accuracy"]),
                    objective=objective,
                    labels=n,
                    seed=seed,
                    cpu_seconds=clock.seconds() - start,
                    wall_seconds=time.perf_counter() - wall,
                )
                logger.info(
                    "%s, %d labels, seed %d: test accuracy %.3f (best "
                    "validation %.3f at epoch %d of %d)",
                    objective,
                    n,
                    seed,
                    record["test_accuracy"],
                    record["val_accuracy"],
                    record["best_epoch"],
                    record["epochs"],
                )
                rows.append(record)
    return rows


def summarize(rows):
    """`{objective: {labels: (mean, sd, runs)}}` of the test accuracies
    (sd: the sample standard deviation over the seeds; 0 for one)."""
    groups = {}
    for row in rows:
        key = (row["objective"], row["labels"])
        groups.setdefault(key, []).append(row["test_accuracy"])
    out = {}
    for (objective, labels), values in groups.items():
        values = np.asarray(values)
        sd = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        out.setdefault(objective, {})[labels] = (
            float(values.mean()),
            sd,
            len(values),
        )
    return out


def finetune_table(rows):
    """Markdown: one row per model, one column per label count, test
    accuracy in % (mean +- sd over the seeds)."""
    summary = summarize(rows)
    counts = sorted({row["labels"] for row in rows})
    lines = [
        "| model | " + " | ".join(f"{n:,} labels" for n in counts) + " |",
        "|---" * (len(counts) + 1) + "|",
    ]
    for objective, cells in summary.items():
        lines.append(
            f"| {objective} | "
            + " | ".join(
                f"{100 * cells[n][0]:.1f} ± {100 * cells[n][1]:.1f}"
                for n in counts
            )
            + " |"
        )
    return "\n".join(lines)


def _batching(speed):
    if speed["packed"]:
        return "packed"
    return {
        "buckets": "padded (length buckets)",
        "batch": "padded (to each batch's longest)",
        "window": "padded (to the window)",
    }[speed.get("padding_mode") or "buckets"]


def pretrain_table(records, pretrained_dir):
    """Markdown: one row per pretrained model: its last validation loss,
    steps, CPU time and throughput."""
    lines = [
        "| objective | pretrain loss (val, start -> end) | steps "
        "| CPU time | batches | tokens/s | padding |",
        "|---|---|---|---|---|---|---|",
    ]
    for objective, record in records.items():
        curve, speed = record["curve"], record["throughput"]
        lines.append(
            f"| {objective} "
            f"| {curve['val_loss'][0]:.3f} -> {curve['val_loss'][-1]:.3f} "
            f"| {record['pretrain_steps']} "
            f"| {record['cpu_seconds']:.0f} s "
            f"| {_batching(speed)} "
            f"| {speed['tokens_per_second']:.0f} "
            f"| {100 * speed['padding']:.1f} % |"
        )
    return "\n".join(lines)


def plot_pretraining(records, path):
    """The pretraining loss curves (training and validation, per token)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for i, (objective, record) in enumerate(records.items()):
        curve = record["curve"]
        color = f"C{i + 1}"
        ax.plot(curve["steps"], curve["train_loss"], "--", color=color)
        ax.plot(curve["steps"], curve["val_loss"], "o-", color=color)
        ax.plot([], [], "-", color=color, label=objective)
    ax.plot([], [], "k--", label="training")
    ax.plot([], [], "ko-", label="validation")
    ax.set_xlabel("pretraining step")
    ax.set_ylabel("cross-entropy per predicted token (nats)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_finetuning(rows, path):
    """Test accuracy vs labelled examples, one line per model (mean +- sd
    over the seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8), dpi=100)
    for i, (objective, cells) in enumerate(summarize(rows).items()):
        counts = sorted(cells)
        mean = np.array([cells[n][0] for n in counts]) * 100
        sd = np.array([cells[n][1] for n in counts]) * 100
        ax.errorbar(
            counts,
            mean,
            yerr=sd,
            marker="o",
            capsize=3,
            label=objective,
            color=f"C{i}",
        )
    ax.set_xscale("log")
    ax.set_xlabel("labelled training definitions")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("25 supersenses: fine-tuned vs from scratch", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def explorer_inputs(objective, ids, packed=False):
    """Inputs of the `objective` model for the explorer: the unmasked
    text; prefix-LM's prefix is the first half of each sequence; a packed
    model's rows are one sequence each."""
    import numpy as np

    lengths = np.sum(ids != 0, axis=1).astype("int32")
    extra = {"segment_ids": np.zeros_like(ids)} if packed else {}
    if objective == "mlm":
        positions = np.zeros((len(ids), 1), "int32")
        return {"token_ids": ids, "mask_positions": positions, **extra}
    prefix = np.zeros_like(lengths) if objective == "clm" else lengths // 2
    return {"token_ids": ids, "prefix_length": prefix, **extra}


def write_explorer(models, tokenizer, texts, max_length, output_dir):
    """The attention of every pretrained model on `texts`, in one explorer
    (`<output_dir>/attention.html`, layers named `<objective>/<layer>`)."""
    from examples.common import attention_outputs
    from examples.common.text import id_to_tokens
    from examples.pretrain import data

    ids = data.encode_texts(texts, tokenizer, max_length)
    tokens = [id_to_tokens(tokenizer, row[row != 0]) for row in ids]
    attentions = attention_outputs.merge(
        attention_outputs.collect(
            model,
            explorer_inputs(objective, ids, "segment_ids" in model.input),
            prefix=objective,
        )
        for objective, model in models.items()
    )
    return attention_outputs.write_explorer(
        output_dir,
        attentions,
        tokens,
        title="Pretraining objectives: " + ", ".join(models),
    )


def main(argv=None):
    args = parse_args(argv)
    setup_logging()
    clock = CpuClock()
    wall = time.perf_counter()

    import keras

    from examples.pretrain.model import OBJECTIVES

    objectives = OBJECTIVES if args.objective == "all" else [args.objective]
    os.makedirs(args.output_dir, exist_ok=True)
    keras.utils.set_random_seed(args.seed)
    tokenizer, models, records = pretrained_models(args, objectives, clock)
    results = {"models": models, "records": records, "rows": []}
    results["pretrain_table"] = pretrain_table(records, args.pretrained_dir)
    results["pretrain_plot"] = plot_pretraining(
        records, os.path.join(args.output_dir, "pretrain_loss.png")
    )
    print(f"\n{results['pretrain_table']}\n")
    if not args.pretrain_only:
        rows = finetune_grid(args, tokenizer, objectives, clock)
        results["rows"] = rows
        results["table"] = finetune_table(rows)
        results["plot"] = plot_finetuning(
            rows, os.path.join(args.output_dir, "finetune_curve.png")
        )
        print(f"\n{results['table']}\n")
        with open(os.path.join(args.output_dir, "finetune.json"), "w") as f:
            json.dump(rows, f, indent=1)
    total = clock.seconds()
    results["cpu_seconds"] = total
    results["wall_seconds"] = time.perf_counter() - wall
    print(
        f"CPU time: {total:.0f} s in all (user + sys of this process); "
        f"wall time {results['wall_seconds']:.0f} s"
    )
    with open(os.path.join(args.output_dir, "results.md"), "w") as f:
        f.write(results["pretrain_table"] + "\n")
        if "table" in results:
            f.write("\n" + results["table"] + "\n")
    results["explorer"] = write_explorer(
        models, tokenizer, EXPLORER_TEXTS, args.max_length, args.output_dir
    )
    print(f"attention explorer: {results['explorer']}")
    return results


if __name__ == "__main__":
    main()
