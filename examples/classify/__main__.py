"""Text classification with attention pooling.

Default task (shipped, no network): read a WordNet noun definition, e.g.
"a person who writes poems", and predict its supersense among 25 classes
(`person`, `animal`, `artifact`, `plant`, ...). The encoder (transformer
encoder blocks by default, or a bidirectional GRU with `--encoder gru`) feeds
`AttentionPooling`. The example plots, per word piece of a few test
definitions, the pooling weights beside the attention rollout of the
encoder into the pooling (what the prediction rests on; `explain.py`),
writes every attention layer's weights on a few definitions to an
interactive explorer (`runs/classify/attention.html`), reports test
accuracy (and the majority-class baseline) and exports a SavedModel that
classifies raw strings:

    python -m examples.classify                # minutes on 2 CPU cores
    python -m examples.classify --encoder gru  # bidirectional GRU
    python -m examples.classify --dataset imdb_reviews --download

Several workers (`TF_CONFIG` on each, `--strategy multiworker`; see
docs/guides/multi-worker.md): the chief alone writes `--output-dir`, and a
restarted pair resumes from the shared `--backup-dir`.

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the WordPiece ops)
    served = tf.saved_model.load("runs/classify/saved_model")
    served.classify(tf.constant(["a large cat with a striped coat"]))["label"]
"""

import argparse
import logging
import os
import time

from examples.common import HelpFormatter
from examples.common import add_training_args
from examples.common import fit
from examples.common import setup_runtime
from examples.common.distributed import evaluate

logger = logging.getLogger("examples")

DEFAULT_DATASET = "wordnet_glosses"

DEMO_TEXTS = (
    "a large wild cat with a striped coat",
    "a device that measures the temperature of a room",
    "a person who writes poems",
    "a sweet dessert made of flour, butter and eggs",
    "the feeling of great happiness",
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m examples.classify",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--dataset",
        default=DEFAULT_DATASET,
        help="TFDS dataset: 'wordnet_glosses' (shipped) or any TFDS text "
        "classification dataset with supervised keys (text, label), e.g. "
        "imdb_reviews, ag_news_subset, yelp_polarity_reviews (prepared in "
        "--data-dir, or fetched with --download)",
    )
    data.add_argument("--data-dir", default=None, help="TFDS data directory")
    data.add_argument(
        "--download", action="store_true", help="let TFDS download the dataset"
    )
    data.add_argument("--vocabulary-size", type=int, default=8000)
    data.add_argument(
        "--max-length", type=int, default=40, help="tokens kept per text"
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--encoder",
        choices=["gru", "transformer"],
        default="transformer",
        help="transformer encoder blocks, or a bidirectional GRU",
    )
    model.add_argument("--embedding-dim", type=int, default=128)
    model.add_argument("--hidden-dim", type=int, default=128)
    model.add_argument(
        "--num-layers", type=int, default=2, help="transformer blocks"
    )
    model.add_argument("--num-heads", type=int, default=4)
    model.add_argument("--dropout", type=float, default=0.1)
    model.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument(
        "--num-plots", type=int, default=4, help="attention PNGs"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny data subset and model, a few steps (smoke test)",
    )
    add_training_args(
        parser, epochs=3, batch_size=128, output_dir="runs/classify"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.vocabulary_size = min(args.vocabulary_size, 1000)
        args.embedding_dim = args.hidden_dim = 32
        args.num_layers = 1
        args.num_plots = min(args.num_plots, 2)
        args.epochs = min(args.epochs, 2)
        args.steps_per_epoch = args.steps_per_epoch or 15
    return args


def plot_pooling(attention_model, tokenizer, texts, labels, class_names, args):
    """One PNG per text: what the prediction rests on, per word piece.

    Two panels (`explain.py`): the `AttentionPooling` weights, and the
    attention rollout of the encoder blocks into the pooling query (the
    share of each input word piece in the pooled vector).

    Returns:
        `(plots, measures)`: `plots` a list of `(path, (width, height))`,
        the image sizes in pixels; `measures` the dict of `explain` on the
        texts' ids (`(len(texts), max_length)`).
    """
    import numpy as np
    import tensorflow as tf

    from examples.classify.explain import explain
    from examples.classify.explain import explanation_figure
    from examples.classify.model import pad_ids
    from examples.common.text import id_to_tokens

    ids = pad_ids(tokenizer(tf.constant(list(texts))), args.max_length)
    ids = ids.numpy()
    measures = explain(attention_model, ids)
    plots = []
    for i in range(len(texts)):
        n = int(np.sum(ids[i] != 0))
        tokens = id_to_tokens(tokenizer, ids[i, :n])
        probabilities = measures["probabilities"][i]
        best = int(np.argmax(probabilities))
        title = f"predicted: {class_names[best]} ({probabilities[best]:.2f})"
        if labels:
            title += f", true: {labels[i]}"
        path = os.path.join(
            args.output_dir, "plots", f"pooling_attention_{i}.png"
        )
        os.makedirs(os.path.dirname(path), exist_ok=True)
        figure = explanation_figure(
            tokens,
            measures["pooling"][i, :n],
            measures["rollout"][i, :n],
            title=title,
        )
        figure.savefig(path, format="png", dpi=100)
        width, height = (figure.get_size_inches() * 100).round().astype(int)
        plots.append((path, (int(width), int(height))))
    return plots, measures


def probe(tokenizer, texts, max_length):
    """`(ids (batch, T) NumPy, tokens per text)` of a few texts."""
    import tensorflow as tf

    from examples.classify.model import pad_ids
    from examples.common.text import id_to_tokens

    ids = pad_ids(tokenizer(tf.constant(list(texts))), max_length).numpy()
    return ids, [id_to_tokens(tokenizer, row[row != 0]) for row in ids]


def write_explorer(model, tokenizer, texts, args):
    """The attention of every attention layer (encoder blocks and pooling)
    on `texts`, as the explorer `<output_dir>/attention.html`."""
    from examples.common import attention_outputs

    ids, tokens = probe(tokenizer, texts, args.max_length)
    return attention_outputs.model_explorer(
        args.output_dir,
        model,
        ids,
        tokens,
        title=f"classify ({args.encoder} encoder + AttentionPooling)",
    )


def main(argv=None):
    args = parse_args(argv)
    strategy = setup_runtime(args)
    start = time.time()

    import keras
    import numpy as np

    from examples.classify import data
    from examples.classify.export import export_classifier
    from examples.classify.model import build_classifier
    from examples.classify.vocabulary import word_piece_tokenizer
    from examples.common import attention_outputs

    train_raw, val_raw, test_raw, class_names = data.load_splits(
        args.dataset, args.data_dir, args.download, tiny=args.quick
    )
    tokenizer = word_piece_tokenizer(
        train_raw.map(lambda t, y: t), args.vocabulary_size
    )
    vocabulary_size = tokenizer.vocabulary_size()
    logger.info(
        "%d classes, WordPiece vocabulary of %d",
        len(class_names),
        vocabulary_size,
    )
    train, val, test = data.tokenize_splits(
        (train_raw, val_raw, test_raw), tokenizer, args.max_length
    )
    train_batches, val_batches, test_batches = (
        data.batches(ds, args.batch_size, args.max_length, shuffle, args.seed)
        for ds, shuffle in ((train, True), (val, False), (test, False))
    )

    with strategy.scope():
        model, attention_model = build_classifier(
            vocabulary_size,
            len(class_names),
            encoder=args.encoder,
            max_length=args.max_length,
            embedding_dim=args.embedding_dim,
            hidden_dim=args.hidden_dim,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            dropout=args.dropout,
        )
        model.compile(
            optimizer=keras.optimizers.AdamW(
                args.learning_rate, weight_decay=1e-4
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=args.jit_compile,
        )
    model.summary(print_fn=logger.info)
    probe_ids, probe_tokens = probe(tokenizer, DEMO_TEXTS[:3], args.max_length)
    history = fit(
        model,
        train_batches,
        val_batches,
        args,
        monitor="val_accuracy",
        mode="max",
        # Attention heatmaps of three definitions after every epoch.
        callbacks=[
            attention_outputs.tensorboard_images(
                args.output_dir, probe_ids, probe_tokens
            )
        ],
    )
    # `model.evaluate` fails under several workers (keras#20585).
    test_metrics = evaluate(model, test_batches)
    test_loss, test_accuracy = test_metrics["loss"], test_metrics["accuracy"]
    baseline = data.majority_baseline(train_raw, test_raw)
    train_time = time.time() - start
    print(
        f"\ntest accuracy: {test_accuracy:.4f} (majority-class baseline "
        f"{baseline:.4f}), test loss {test_loss:.4f}, {train_time / 60:.1f} min"
    )

    export_path = os.path.join(args.output_dir, "saved_model")
    server = export_classifier(
        export_path, attention_model, tokenizer, class_names, args.max_length
    )
    print(
        f"SavedModel: {export_path}  "
        "(tf.saved_model.load(path).classify(texts))"
    )
    served = server.classify(np.array(DEMO_TEXTS, dtype=object))
    for text, label, p in zip(
        DEMO_TEXTS, served["label"].numpy(), served["probability"].numpy()
    ):
        print(f"  {label.decode():<14} {p:.2f}  {text}")

    examples = list(test_raw.take(args.num_plots).as_numpy_iterator())
    texts = np.array([t for t, _ in examples], dtype=object)
    labels = [class_names[int(y)] for _, y in examples]
    plots, measures = plot_pooling(
        attention_model, tokenizer, texts, labels, class_names, args
    )
    print(
        "pooling weights and attention rollout:",
        *(path for path, _ in plots),
        sep="\n  ",
    )
    explorer = write_explorer(model, tokenizer, DEMO_TEXTS, args)
    print(f"attention explorer: {explorer}")
    return {
        "history": history.history,
        "test_accuracy": float(test_accuracy),
        "baseline_accuracy": baseline,
        "export_path": export_path,
        "plots": plots,
        "plotted_texts": [t.decode("utf-8") for t in texts],
        "measures": measures,
        "explorer": explorer,
        "server": server,
        "train_time_s": train_time,
    }


if __name__ == "__main__":
    main()
