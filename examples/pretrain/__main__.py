"""The three pretraining objectives on one transformer encoder.

Pretrains the same backbone (`TransformerEncoderBlock`s over a
`TokenAndPositionEmbedding`) on unlabelled text with masked language
modelling (`mlm`, BERT: 15 % of the tokens masked by keras_hub's
`MaskedLMMaskGenerator`, bidirectional attention), causal language modelling
(`clm`, GPT: causal attention) or prefix language modelling (`prefix_lm`:
the mask object `mods.PrefixLMMask`, bidirectional over a random prefix,
causal after it), then fine-tunes it on the `classify` task (WordNet noun
definition -> one of 25 supersenses) with a small labelled budget, and
compares its test accuracy with the same model trained from scratch with the
same budget. `--objective all` (the default) runs the three and the scratch
baseline and prints one Markdown table. Each pretrained model's attention on
a few sentences goes to an interactive explorer,
`runs/pretrain/attention.html` (one file, the objectives side by side).

    python -m examples.pretrain                   # minutes on 2 CPU cores
    python -m examples.pretrain --objective mlm   # one objective + scratch
    python -m examples.pretrain --corpus kjv_bible --pretrain-steps 3000
    python -m examples.pretrain --objective clm --pack   # packed rows

`--pack` trains `mlm` and `clm` on packed rows (the sequences one after
the other, no padding; each attends only to itself through the blocks'
`segment_ids=`, positions restart per sequence); the table's `tokens/s`
column (real tokens per second of pretraining, after the first quarter)
and `padding` column compare it with the default padded batches.
"""

import argparse
import logging
import os
import time

from examples.common import HelpFormatter
from examples.common.distributed import evaluate
from examples.common.training import setup_logging

logger = logging.getLogger("examples")

EXPLORER_TEXTS = (
    "a large wild cat with a striped coat",
    "a person who writes poems",
    "a device that measures the temperature of a room",
)


def parse_args(argv=None):
    from examples.pretrain.data import CORPORA
    from examples.pretrain.model import OBJECTIVES

    parser = argparse.ArgumentParser(
        prog="python -m examples.pretrain",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "--objective",
        choices=[*OBJECTIVES, "all"],
        default="all",
        help="pretraining objective; all: the three, then one table",
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--corpus",
        choices=CORPORA,
        default=CORPORA[0],
        help="pretraining text: the training split's texts (no labels)",
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
    train = parser.add_argument_group("training")
    train.add_argument("--pretrain-steps", type=int, default=700)
    train.add_argument("--pretrain-learning-rate", type=float, default=2e-3)
    train.add_argument(
        "--finetune-examples",
        type=int,
        default=2000,
        help="labelled definitions fine-tuning sees",
    )
    train.add_argument("--finetune-steps", type=int, default=200)
    train.add_argument("--finetune-learning-rate", type=float, default=1e-3)
    train.add_argument("--batch-size", type=int, default=64)
    train.add_argument(
        "--pack",
        action="store_true",
        help="pretrain mlm and clm on packed rows (no padding)",
    )
    train.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/pretrain")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny data subset and model, a few steps (smoke test)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.vocabulary_size = min(args.vocabulary_size, 600)
        args.hidden_dim, args.num_layers, args.num_heads = 16, 1, 2
        args.pretrain_steps = min(args.pretrain_steps, 6)
        args.finetune_steps = min(args.finetune_steps, 4)
        args.finetune_examples = min(args.finetune_examples, 200)
        args.batch_size = min(args.batch_size, 16)
    return args


class CpuClock:
    """CPU seconds (user + sys, all threads) of this process since start."""

    def __init__(self):
        self.start = time.process_time()

    def seconds(self):
        return time.process_time() - self.start


class EpochTimer:
    """Wall seconds of each `fit` epoch (a Keras callback's hooks)."""

    def __init__(self):
        import keras

        class Callback(keras.callbacks.Callback):
            def on_epoch_begin(inner, epoch, logs=None):
                inner.start = time.perf_counter()

            def on_epoch_end(inner, epoch, logs=None):
                self.seconds.append(time.perf_counter() - inner.start)

        self.seconds = []
        self.callback = Callback()


def pretrain(backbone, objective, tokenizer, train_ids, val_ids, args):
    """Trains `backbone` with `objective`; returns `(model, val_loss,
    throughput)`: the per-token cross-entropy (nats) on validation text,
    and `{"tokens_per_second", "padding"}` of the training batches (real
    input tokens per wall second after the first of four epochs, which
    compiles; the padding fraction of the batches)."""
    import keras

    from examples.pretrain import data
    from examples.pretrain.model import PACKABLE
    from examples.pretrain.model import build_pretraining_model

    packed = args.pack and objective in PACKABLE

    def batches(ids, shuffle):
        make = data.packed_batches if packed else data.objective_batches
        return make(
            ids,
            objective,
            tokenizer,
            args.batch_size,
            args.max_length,
            shuffle,
            args.seed,
        )

    model = build_pretraining_model(backbone, objective, packed=packed)
    model.compile(
        optimizer=keras.optimizers.AdamW(
            args.pretrain_learning_rate, weight_decay=1e-4
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[
            keras.metrics.SparseCategoricalCrossentropy(
                from_logits=True, name="token_loss"
            ),
            keras.metrics.SparseCategoricalAccuracy(name="token_accuracy"),
        ],
    )
    chunks = min(4, args.pretrain_steps)
    steps = args.pretrain_steps // chunks
    timer = EpochTimer()
    model.fit(
        batches(train_ids, True).repeat(),
        epochs=chunks,
        steps_per_epoch=steps,
        verbose=2,
        shuffle=False,  # the pipeline shuffles (Keras would warn)
        callbacks=[timer.callback],
    )
    metrics = evaluate(model, batches(val_ids, False))
    sample = max(1, min(50, args.pretrain_steps))
    real, total = data.real_tokens(batches(train_ids, True).repeat(), sample)
    timed = timer.seconds[1:] or timer.seconds
    throughput = {
        "tokens_per_second": real / sample * steps * len(timed) / sum(timed),
        "padding": 1.0 - real / total,
        "packed": packed,
    }
    return model, float(metrics["token_loss"]), throughput


def finetune(backbone, num_classes, train, test, args):
    """Fine-tunes a classifier on `backbone`; returns its test accuracy."""
    import keras

    from examples.pretrain import data
    from examples.pretrain.model import build_classifier

    model = build_classifier(backbone, num_classes, args.dropout)
    model.compile(
        optimizer=keras.optimizers.AdamW(
            args.finetune_learning_rate, weight_decay=1e-4
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    train_batches = data.classify_batches(
        train, args.batch_size, args.max_length, True, args.seed
    )
    model.fit(
        train_batches.repeat(),
        epochs=1,
        steps_per_epoch=args.finetune_steps,
        verbose=2,
        shuffle=False,  # the pipeline shuffles (Keras would warn)
    )
    test_batches = data.classify_batches(
        test, 256, args.max_length, False, args.seed
    )
    metrics = evaluate(model, test_batches)
    return float(metrics["accuracy"])


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


def markdown_table(rows):
    """One Markdown table of the result rows (dicts, see `main`)."""
    header = (
        "| objective | pretrain loss | fine-tuned accuracy | "
        "scratch accuracy | steps (pretrain + fine-tune) | CPU time "
        "| batches | tokens/s | padding |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        loss = row["pretrain_loss"]
        tuned = row["finetuned_accuracy"]
        speed = row.get("throughput")
        if speed is None:
            batches = rate = padding = "—"
        else:
            batches = "packed" if speed["packed"] else "padded"
            rate = f"{speed['tokens_per_second']:.0f}"
            padding = f"{100 * speed['padding']:.1f} %"
        lines.append(
            f"| {row['objective']} "
            f"| {'—' if loss is None else f'{loss:.3f}'} "
            f"| {'—' if tuned is None else f'{tuned:.3f}'} "
            f"| {row['scratch_accuracy']:.3f} "
            f"| {row['pretrain_steps']} + {row['finetune_steps']} "
            f"| {row['cpu_seconds']:.0f} s "
            f"| {batches} | {rate} | {padding} |"
        )
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    setup_logging()
    clock = CpuClock()

    import keras

    from examples.pretrain import data
    from examples.pretrain.model import OBJECTIVES
    from examples.pretrain.model import Backbone

    objectives = OBJECTIVES if args.objective == "all" else [args.objective]
    os.makedirs(args.output_dir, exist_ok=True)
    keras.utils.set_random_seed(args.seed)
    train_texts, val_texts = data.corpus_texts(
        args.corpus, args.data_dir, tiny=args.quick
    )
    tokenizer = data.make_tokenizer(train_texts, args.vocabulary_size)
    train_ids = data.encode(train_texts, tokenizer, args.max_length)
    val_ids = data.encode(val_texts, tokenizer, args.max_length)
    val_ids = val_ids.take(200 if args.quick else 2000)
    ft_train, ft_test, class_names = data.finetune_splits(
        tokenizer,
        args.max_length,
        args.finetune_examples,
        args.data_dir,
        tiny=args.quick,
        seed=args.seed,
    )
    logger.info(
        "corpus %s, vocabulary %d, %d classes",
        args.corpus,
        tokenizer.vocabulary_size(),
        len(class_names),
    )
    setup_seconds = clock.seconds()

    def new_backbone():
        keras.utils.set_random_seed(args.seed)  # same initial weights
        return Backbone(
            tokenizer.vocabulary_size(),
            args.max_length,
            hidden_dim=args.hidden_dim,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            dropout=args.dropout,
        )

    start = clock.seconds()
    scratch = finetune(
        new_backbone(), len(class_names), ft_train, ft_test, args
    )
    rows = [
        {
            "objective": "none (from scratch)",
            "pretrain_loss": None,
            "finetuned_accuracy": None,
            "scratch_accuracy": scratch,
            "pretrain_steps": 0,
            "finetune_steps": args.finetune_steps,
            "cpu_seconds": clock.seconds() - start,
        }
    ]
    models = {}
    for objective in objectives:
        start = clock.seconds()
        backbone = new_backbone()
        models[objective], loss, throughput = pretrain(
            backbone, objective, tokenizer, train_ids, val_ids, args
        )
        accuracy = finetune(backbone, len(class_names), ft_train, ft_test, args)
        rows.append(
            {
                "objective": objective,
                "pretrain_loss": loss,
                "finetuned_accuracy": accuracy,
                "scratch_accuracy": scratch,
                "pretrain_steps": args.pretrain_steps,
                "finetune_steps": args.finetune_steps,
                "cpu_seconds": clock.seconds() - start,
                "throughput": throughput,
            }
        )
    table = markdown_table(rows)
    total = clock.seconds()
    print(f"\n{table}\n")
    print(
        f"CPU time: {total:.0f} s in all (user + sys of this process; data "
        f"and vocabulary {setup_seconds:.0f} s)"
    )
    with open(os.path.join(args.output_dir, "results.md"), "w") as f:
        f.write(table + "\n")
    explorer_path = write_explorer(
        models, tokenizer, EXPLORER_TEXTS, args.max_length, args.output_dir
    )
    print(f"attention explorer: {explorer_path}")
    return {
        "rows": rows,
        "table": table,
        "cpu_seconds": total,
        "explorer": explorer_path,
        "models": models,
    }


if __name__ == "__main__":
    main()
