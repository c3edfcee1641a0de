"""Semi-supervised node classification with graph attention on WordNet.

The graph (shipped, no network): the 82,115 noun synsets of WordNet 3.0
linked by their relations (hypernym, hyponym, meronym, ...; 115k
undirected edges), each labelled with its supersense (26 classes:
`animal`, `artifact`, `person`, ...). Node features: TF-IDF of each
synset's lemmas and definition reduced to 256 dimensions (LSA). The
Planetoid protocol of Cora and Citeseer: 20 labelled nodes per class
train (520), 500 nodes validate (early stopping), all the others test;
full-batch training on the whole graph (one `model.fit` sample is the
graph, the loss masked to the labelled nodes). Four models on the same
splits and budget: an MLP on the features alone, a mean-aggregation
graph layer, GAT and GATv2 (`keras_attention.layers.GraphAttention`);
test accuracy mean ± sd over the seeds (each seed draws its own split
and initialization) and time per epoch, as a Markdown table; a PNG of
the attention of a few nodes over their neighbours and an attention
explorer of a small neighbourhood:

    python -m examples.graph                 # 7-9 minutes on 2 CPU cores
    python -m examples.graph --seeds 0       # one seed, ~2.5 minutes
    python -m examples.graph --models gat,gatv2 --epochs 200
    python -m examples.graph --quick         # 2,000-node subgraph, ~15 s

Outputs in `--output-dir` (default runs/graph): `results.md` (the
table), `results.json`, `attention_neighbourhoods.png`, `attention.html`.
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

# Nodes whose attention is plotted: the first synset of each word with
# 3-12 neighbours (on the whole graph; on a --quick subgraph, test nodes
# with 3-12 neighbours).
DEMO_WORDS = ("violin", "tiger", "pneumonia", "anger")


def parse_args(argv=None):
    from examples.graph.model import MODELS

    parser = argparse.ArgumentParser(
        prog="python -m examples.graph",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated, among {', '.join(MODELS)}",
    )
    parser.add_argument(
        "--seeds",
        default="0,1,2",
        help="comma-separated seeds: each draws a split and initializes "
        "every model (--quick: 0)",
    )
    data = parser.add_argument_group("data and split")
    data.add_argument("--feature-dim", type=int, default=256)
    data.add_argument("--train-per-class", type=int, default=20)
    data.add_argument("--num-validation", type=int, default=500)
    data.add_argument(
        "--num-test",
        type=int,
        default=None,
        help="test nodes (default: all the nodes neither training nor "
        "validating)",
    )
    data.add_argument(
        "--quick-nodes",
        type=int,
        default=2000,
        help="--quick: nodes of the subgraph (breadth-first from 10 "
        "random nodes)",
    )
    model = parser.add_argument_group("models and training")
    model.add_argument("--hidden-units", type=int, default=64)
    model.add_argument(
        "--heads", type=int, default=8, help="heads of the hidden GAT layer"
    )
    model.add_argument("--dropout", type=float, default=0.5)
    model.add_argument("--learning-rate", type=float, default=0.01)
    model.add_argument("--weight-decay", type=float, default=5e-4)
    model.add_argument(
        "--epochs", type=int, default=100, help="at most (full-batch steps)"
    )
    model.add_argument(
        "--patience",
        type=int,
        default=20,
        help="early stopping: epochs without a lower validation loss",
    )
    model.add_argument(
        "--jit-compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="XLA-compile the train step (default: on with a GPU)",
    )
    parser.add_argument("--output-dir", default="runs/graph")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a 2,000-node subgraph, 5 labelled nodes per class, 30 "
        "epochs, one seed (smoke test)",
    )
    args = parser.parse_args(argv)
    args.models = parse_choices(parser, "--models", args.models, MODELS)
    if args.quick:
        if args.seeds == parser.get_default("seeds"):
            args.seeds = "0"
        args.train_per_class = min(args.train_per_class, 5)
        args.num_validation = min(args.num_validation, 200)
        args.feature_dim = min(args.feature_dim, 64)
        args.epochs = min(args.epochs, 30)
        args.patience = min(args.patience, 10)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    # What `setup_runtime` reads: one device, float32.
    args.strategy, args.logical_cpus, args.mixed_precision = "default", 0, "off"
    args.seed = args.seeds[0]
    return args


class Graph:
    """What the models train on: node ids (into the shipped graph),
    labels, features, undirected edges, and the model inputs."""

    def __init__(self, graph, nodes, senders, receivers, features):
        import numpy as np

        self.graph = graph
        self.nodes = nodes
        self.labels = graph.labels[nodes]
        self.senders, self.receivers = senders, receivers
        self.features = features
        self.degree = np.bincount(receivers, minlength=len(nodes))
        self.inputs = {
            "features": features[None],
            "senders": senders[None],
            "receivers": receivers[None],
        }

    def name(self, node):
        return self.graph.name(int(self.nodes[node]))

    def label(self, node):
        from examples.data.wordnet_graph import SUPERSENSES

        return SUPERSENSES[int(self.labels[node])]


def load(args):
    """The `Graph` of the run: the whole WordNet noun graph, or a
    breadth-first subgraph of it with --quick."""
    import numpy as np

    from examples.data.wordnet_graph import load_graph
    from examples.graph import data

    start = time.time()
    graph = load_graph()
    senders, receivers = data.undirected_edges(graph.senders, graph.receivers)
    nodes = np.arange(graph.num_nodes)
    if args.quick:
        nodes = data.bfs_nodes(
            graph.num_nodes, senders, receivers, args.quick_nodes, seed=0
        )
        senders, receivers = data.induced_subgraph(nodes, senders, receivers)
    texts = [graph.text(int(i)) for i in nodes]
    features = data.text_features(texts, args.feature_dim, seed=0)
    logger.info(
        "graph: %d nodes, %d directed edges (%d pointers), %d features, "
        "%d classes; loaded in %.1f s",
        len(nodes),
        len(senders),
        graph.num_edges,
        features.shape[1],
        len(np.unique(graph.labels[nodes])),
        time.time() - start,
    )
    return Graph(graph, nodes, senders, receivers, features)


def _epoch_timer(keras):
    class EpochTimer(keras.callbacks.Callback):
        """Wall time of each epoch (the training step and the validation
        pass), and the weights of the lowest validation loss."""

        def on_train_begin(self, logs=None):
            self.times, self.best, self.best_epoch = [], float("inf"), 0
            self.best_weights = None

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(time.perf_counter() - self.start)
            if logs["val_loss"] < self.best:
                self.best, self.best_epoch = logs["val_loss"], epoch + 1
                self.best_weights = self.model.get_weights()

    return EpochTimer()


def train_and_test(kind, g, split, args, seed):
    """Trains one model on one split; returns its measures and the
    model (with the weights of the lowest validation loss)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from examples.common.distributed import build_training_state
    from examples.graph.model import NodeClassifier

    keras.utils.set_random_seed(seed)
    num_classes = int(g.graph.labels.max()) + 1
    model = NodeClassifier(
        kind,
        num_classes,
        hidden_units=args.hidden_units,
        heads=args.heads,
        dropout=args.dropout,
        seed=seed,
    )
    model(g.inputs)  # builds the weights
    model.compile(
        optimizer=keras.optimizers.AdamW(
            args.learning_rate, weight_decay=args.weight_decay
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=args.jit_compile,
    )
    n = len(g.labels)

    def masked(nodes):
        # Weights summing to N: the loss is the mean over `nodes`.
        weights = np.zeros(n, "float32")
        weights[nodes] = n / len(nodes)
        return tf.data.Dataset.from_tensors(
            (g.inputs, g.labels[None].astype("int32"), weights[None])
        )

    train, validation, test = split
    train_data = masked(train)
    # The optimizer's variables now: created while `fit` traces its first
    # step, they would make TensorFlow trace it twice.
    build_training_state(model, train_data)
    timer = _epoch_timer(keras)
    model.fit(
        train_data,
        validation_data=masked(validation),
        epochs=args.epochs,
        shuffle=False,  # one sample: the graph
        verbose=0,
        callbacks=[
            timer,
            keras.callbacks.EarlyStopping(
                monitor="val_loss", patience=args.patience
            ),
        ],
    )
    model.set_weights(timer.best_weights)
    logits = keras.ops.convert_to_numpy(model(g.inputs, training=False))[0]
    predicted = logits.argmax(-1)

    def accuracy(nodes):
        return float(np.mean(predicted[nodes] == g.labels[nodes]))

    times = timer.times[1:] or timer.times  # the first epoch traces
    return model, {
        "model": kind,
        "seed": seed,
        "test_accuracy": accuracy(test),
        "validation_accuracy": accuracy(validation),
        "train_accuracy": accuracy(train),
        "epochs": len(timer.times),
        "best_epoch": timer.best_epoch,
        "seconds_per_epoch": float(np.median(times)),
        "train_seconds": float(np.sum(timer.times)),
        "parameters": int(model.count_params()),
    }


def summarize(runs, models):
    """Per model: mean and sd over the seeds of the measures."""
    import numpy as np

    rows = []
    for kind in models:
        mine = [r for r in runs if r["model"] == kind]
        if not mine:
            continue

        def stat(key):
            values = np.array([r[key] for r in mine], "float64")
            return float(values.mean()), float(values.std())

        rows.append(
            {
                "model": kind,
                "seeds": len(mine),
                "test_accuracy": stat("test_accuracy"),
                "validation_accuracy": stat("validation_accuracy"),
                "epochs": stat("epochs")[0],
                "best_epoch": stat("best_epoch")[0],
                "seconds_per_epoch": float(
                    np.median([r["seconds_per_epoch"] for r in mine])
                ),
                "train_seconds": stat("train_seconds")[0],
                "parameters": mine[0]["parameters"],
            }
        )
    return rows


def markdown_table(rows):
    from examples.graph.model import MODEL_NAMES

    lines = [
        "| model | test accuracy | validation accuracy | epochs (best) "
        "| ms / epoch | train s | parameters |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        test, test_sd = row["test_accuracy"]
        val, val_sd = row["validation_accuracy"]
        lines.append(
            f"| {MODEL_NAMES[row['model']]} | {test:.3f} ± {test_sd:.3f} "
            f"| {val:.3f} ± {val_sd:.3f} "
            f"| {row['epochs']:.0f} ({row['best_epoch']:.0f}) "
            f"| {1000 * row['seconds_per_epoch']:.0f} "
            f"| {row['train_seconds']:.1f} | {row['parameters']:,} |"
        )
    return "\n".join(lines)


def demo_nodes(g, count=4):
    """Nodes to plot: the first synset named by each of `DEMO_WORDS` with
    3-12 neighbours; else (a subgraph) the first such nodes."""
    import numpy as np

    fits = (g.degree >= 3) & (g.degree <= 12)
    chosen = []
    for word in DEMO_WORDS:
        for node in np.flatnonzero(fits):
            if g.name(node) == word:
                chosen.append(int(node))
                break
    for node in np.flatnonzero(fits):
        if len(chosen) >= count:
            break
        if int(node) not in chosen:
            chosen.append(int(node))
    return chosen[:count]


def plot_attention(model, g, nodes, path):
    """The PNG of the hidden GAT layer's attention (mean over heads) of
    `nodes` over their neighbours; returns the panels."""
    from examples.graph.model import MODEL_NAMES
    from examples.graph.plots import neighbourhood_figure
    from examples.graph.plots import neighbourhood_panels

    alpha = model.hidden_attention(g.inputs)
    panels = neighbourhood_panels(alpha, g.senders, g.receivers, nodes)
    figure = neighbourhood_figure(
        panels,
        g.name,
        g.label,
        title=f"{MODEL_NAMES[model.kind]}, hidden layer: attention of a "
        "node over its neighbours (mean of the heads)",
    )
    figure.savefig(path, format="png", dpi=100)
    return panels


def explorer_subgraph(g, centre, alpha_panel, size=30):
    """The nodes of a small neighbourhood of `centre`: itself, its
    neighbours (largest attention first) and, up to `size`, their
    neighbours."""
    import numpy as np

    from examples.graph.data import neighbours_of

    nodes = [centre] + [n for n in alpha_panel["neighbours"] if n != centre]
    for node in list(nodes):
        for other in neighbours_of(node, g.senders, g.receivers):
            if len(nodes) >= size:
                break
            if int(other) not in nodes:
                nodes.append(int(other))
    return np.sort(np.array(nodes[:size], "int64"))


def write_explorer(model, g, centre, panel, path):
    """`collect_attention` of the model on the subgraph induced by a
    small neighbourhood of `centre`, as the explorer `path`."""
    from examples.graph.data import induced_subgraph
    from keras_attention.visualization import attention_html
    from keras_attention.visualization import collect_attention

    nodes = explorer_subgraph(g, centre, panel)
    senders, receivers = induced_subgraph(nodes, g.senders, g.receivers)
    inputs = {
        "features": g.features[nodes][None],
        "senders": senders[None],
        "receivers": receivers[None],
    }
    maps = collect_attention(model, inputs)
    tokens = [f"{g.name(n)} ({g.label(n)})" for n in nodes]
    attention_html(
        maps,
        [tokens],
        path=path,
        title=f"{model.kind} on the {len(nodes)}-node neighbourhood of "
        f"{g.name(centre)!r} (rows attend to columns)",
    )
    return maps, tokens


def machine():
    """The CPU's model name, e.g. "Intel(R) Xeon(R) Processor"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def main(argv=None):
    args = parse_args(argv)
    setup_runtime(args)
    wall = time.time()

    import numpy as np

    from examples.graph import data
    from examples.graph.model import MODEL_NAMES

    os.makedirs(args.output_dir, exist_ok=True)
    g = load(args)
    runs, kept = [], {}
    for seed in args.seeds:
        split = data.split_nodes(
            g.labels,
            args.train_per_class,
            args.num_validation,
            args.num_test,
            seed,
        )
        logger.info(
            "seed %d: %d training, %d validation, %d test nodes",
            seed,
            *(len(s) for s in split),
        )
        for kind in args.models:
            model, run = train_and_test(kind, g, split, args, seed)
            runs.append(run)
            if seed == args.seeds[0]:
                kept[kind] = model
            logger.info(
                "  %-20s test %.3f  val %.3f  %d epochs (best %d)  "
                "%.0f ms/epoch",
                MODEL_NAMES[kind],
                run["test_accuracy"],
                run["validation_accuracy"],
                run["epochs"],
                run["best_epoch"],
                1000 * run["seconds_per_epoch"],
            )
    rows = summarize(runs, args.models)
    table = markdown_table(rows)
    test_nodes = split[2]
    majority = float(
        np.bincount(g.labels[test_nodes]).max() / max(1, len(test_nodes))
    )
    wall_train = time.time() - wall

    outputs = {}
    attention_model = kept.get("gatv2", kept.get("gat"))
    if attention_model is not None:
        nodes = demo_nodes(g)
        png = os.path.join(args.output_dir, "attention_neighbourhoods.png")
        panels = plot_attention(attention_model, g, nodes, png)
        html = os.path.join(args.output_dir, "attention.html")
        maps, tokens = write_explorer(
            attention_model, g, nodes[0], panels[0], html
        )
        outputs = {
            "png": png,
            "html": html,
            "panels": panels,
            "explorer_layers": {k: list(v.shape) for k, v in maps.items()},
            "explorer_tokens": tokens,
        }
    wall_time = time.time() - wall

    command = "python -m examples.graph " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    report = (
        f"{table}\n\n"
        f"{len(g.labels):,} nodes, {len(g.senders):,} directed edges, "
        f"{len(np.unique(g.labels))} classes; "
        f"{len(split[0])} training / {len(split[1])} validation / "
        f"{len(split[2]):,} test nodes per seed; seeds {args.seeds}; "
        f"majority class of the test nodes {majority:.3f}.\n"
        f"Test accuracy mean ± sd over the seeds (each seed its own split "
        f"and initialization); ms / epoch: median wall time of a full-batch "
        f"training step and the validation pass (after the first epoch); "
        f"epochs run (best: the lowest validation loss, whose weights are "
        f"tested); train s: training time per run.\n"
        f"Command: `{command.strip()}`; {machine()}, "
        f"{os.cpu_count()} CPUs; wall time {wall_time / 60:.1f} min "
        f"(training {wall_train / 60:.1f} min).\n"
    )
    with open(os.path.join(args.output_dir, "results.md"), "w") as f:
        f.write(report)
    results = {
        "args": {k: v for k, v in vars(args).items()},
        "runs": runs,
        "summary": rows,
        "majority_accuracy": majority,
        "wall_seconds": wall_time,
        "num_nodes": int(len(g.labels)),
        "num_edges": int(len(g.senders)),
        **{k: v for k, v in outputs.items() if k != "panels"},
    }
    with open(os.path.join(args.output_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\n" + report)
    for key in ("png", "html"):
        if key in outputs:
            print(f"{key}: {outputs[key]}")
    return {**results, "table": table, "panels": outputs.get("panels")}


if __name__ == "__main__":
    main()
