"""Graph attention on a large sparse graph: time and memory of a training step.

    python benchmarks/graph_attention.py                     # TensorFlow
    KERAS_BACKEND=jax python benchmarks/graph_attention.py
    python benchmarks/graph_attention.py --markdown out.md
    python benchmarks/graph_attention.py --nodes 2000 --edges 20000  # quick

One forward + backward pass (gradients w.r.t. the node features and every
weight; `tf.function` on TensorFlow, `jax.jit` on JAX, eager on PyTorch)
per row, on the current backend, median of `--repeats` after a warm-up,
and the peak memory (RSS) of one step in a fresh process:

1. `GraphAttention` (GATv2 and GAT) on a random graph of `--nodes`
   (100,000) nodes and `--edges` (1,000,000) edges given as an edge list,
   `--heads` (8) heads of `--units` (8) features, `--features` (64) input
   features, self-loops added. Memory is O(edges * heads * units): no
   `(nodes, nodes)` tensor.
2. The dense alternative for small graphs on a graph of `--dense-nodes`
   (5,000) nodes with the same average degree: a
   `keras_attention.layers.MultiHeadAttention` (same heads and head size)
   masked by the dense `(nodes, nodes)` adjacency (plus self-loops), next
   to `GraphAttention` on the same graph as an edge list. (Dot-product
   attention, not GAT's scores: the row is the cost of the dense
   `(heads, nodes, nodes)` route.)

Before timing, the edge-list and dense-adjacency forms of `GraphAttention`
are checked to agree on a 300-node graph (max abs difference printed).

Run on an idle machine (the load average is printed before and after).
"""

import argparse
import json
import os
import subprocess
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
from _timing import try_peak_rss_mb  # noqa: E402
from keras import ops  # noqa: E402

import keras_attention  # noqa: E402

BACKEND = keras.backend.backend()
ROWS = ("GraphAttention v2", "GraphAttention v1", "MultiHeadAttention, dense")


def random_graph(nodes, edges, seed=0):
    rng = np.random.default_rng(seed)
    senders = rng.integers(0, nodes, edges).astype("int32")
    receivers = rng.integers(0, nodes, edges).astype("int32")
    return senders, receivers


def make_step(layer, call, x):
    """A forward + backward step of `call(layer, x)` on TensorFlow
    (`tf.function`) or PyTorch (eager): a blocking function returning the
    loss as a Python float. JAX: `jax_step`."""
    if not layer.built:
        call(layer, x)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function(reduce_retracing=True)
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(tf.cast(call(layer, x), "float32") ** 2)
            grads = tape.gradient(loss, [x] + layer.trainable_weights)
            return loss + tf.add_n([tf.reduce_sum(g) for g in grads]) * 0

        x = tf.constant(x)
        return lambda: float(step(x))
    import torch

    x = torch.tensor(x, requires_grad=True)

    def run():
        for w in layer.trainable_weights:
            w.value.grad = None
        x.grad = None
        loss = torch.sum(call(layer, x).float() ** 2)
        loss.backward()
        return float(loss)

    return run


def row_config(name, nodes, edges, args):
    """(layer, call, x) of one row; `call(layer, x)` runs the layer."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(nodes, args.features)).astype("float32")
    senders, receivers = random_graph(nodes, edges)
    if name.startswith("GraphAttention"):
        version = name.split()[-1]
        layer = keras_attention.layers.GraphAttention(
            args.heads, args.units, version=version
        )
        edge_list = (
            ops.convert_to_tensor(senders),
            ops.convert_to_tensor(receivers),
        )

        def call(layer, x):
            return layer(x, edges=edge_list)

        return layer, call, x
    adjacency = np.zeros((nodes, nodes), bool)
    adjacency[receivers, senders] = True
    adjacency[np.arange(nodes), np.arange(nodes)] = True
    mask = ops.convert_to_tensor(adjacency[None])
    layer = keras_attention.layers.MultiHeadAttention(args.heads, args.units)

    def call(layer, x):
        x = x[None]
        return layer(x, x, attention_mask=mask)[0]

    return layer, call, x


def jax_step(layer, call, x):
    """`make_step` on JAX: `call` through `stateless_call`."""
    import jax

    if not layer.built:
        call(layer, x)
    trainable = [v.value for v in layer.trainable_variables]
    other = [v.value for v in layer.non_trainable_variables]

    def loss(x, trainable):
        with keras.StatelessScope(
            state_mapping=list(zip(layer.trainable_variables, trainable))
            + list(zip(layer.non_trainable_variables, other))
        ):
            out = call(layer, x)
        return ops.sum(ops.cast(out, "float32") ** 2)

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    x = jax.numpy.asarray(x)

    def run():
        value, grads = grad(x, trainable)
        jax.block_until_ready(grads)
        return float(value)

    return run


def step_for(name, nodes, edges, args):
    layer, call, x = row_config(name, nodes, edges, args)
    if BACKEND == "jax":
        return jax_step(layer, call, x)
    return make_step(layer, call, x)


def time_child(name, nodes, edges, args):
    """Times one row in this process; prints JSON."""
    step = step_for(name, nodes, edges, args)
    step()  # warm-up (tracing, compilation)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"ms": float(np.median(times)) * 1e3}))


def check_forms(args, nodes=300):
    """Max abs difference of the edge-list and adjacency forms."""
    senders, receivers = random_graph(nodes, nodes * 4, seed=2)
    adjacency = np.zeros((nodes, nodes), bool)
    adjacency[receivers, senders] = True
    senders, receivers = np.nonzero(adjacency.T)  # no duplicates
    x = np.random.default_rng(3).normal(size=(nodes, args.features))
    x = x.astype("float32")
    layer = keras_attention.layers.GraphAttention(args.heads, args.units)
    edge_out = ops.convert_to_numpy(
        layer(x, edges=(senders.astype("int32"), receivers.astype("int32")))
    )
    dense_out = ops.convert_to_numpy(layer(x, edges=adjacency))
    return float(np.max(np.abs(edge_out - dense_out)))


def child_args(args):
    return [
        "--features",
        args.features,
        "--heads",
        args.heads,
        "--units",
        args.units,
        "--repeats",
        args.repeats,
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--edges", type=int, default=1_000_000)
    parser.add_argument("--dense-nodes", type=int, default=5_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--units", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown")
    parser.add_argument("--time", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--memory", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.time:
        name, nodes, edges = args.time
        time_child(name, int(nodes), int(edges), args)
        return None
    if args.memory:
        name, nodes, edges = args.memory
        step_for(name, int(nodes), int(edges), args)()
        return None

    lines = [
        f"Machine: {machine_summary()}",
        f"Backend: {BACKEND}",
        f"Load before: {load_average()}",
        f"Edge list vs adjacency, 300 nodes: max abs diff "
        f"{check_forms(args):.1e}",
    ]
    degree = args.edges / args.nodes
    dense_edges = int(round(degree * args.dense_nodes))
    plan = [
        ("GraphAttention v2", "edge list", args.nodes, args.edges),
        ("GraphAttention v1", "edge list", args.nodes, args.edges),
        ("GraphAttention v2", "edge list", args.dense_nodes, dense_edges),
        (
            "MultiHeadAttention, dense",
            "(nodes, nodes) mask",
            args.dense_nodes,
            dense_edges,
        ),
    ]
    rows = []
    for name, form, nodes, edges in plan:
        extra = [str(a) for a in child_args(args)]
        spec = [name, str(nodes), str(edges)]
        done = subprocess.run(
            [sys.executable, __file__, "--time", *spec, *extra],
            capture_output=True,
            text=True,
        )
        ms = None
        if done.returncode == 0:
            ms = json.loads(done.stdout.strip().splitlines()[-1])["ms"]
        mem = try_peak_rss_mb(
            [sys.executable, __file__, "--memory", *spec, *extra]
        )
        rows.append([name, form, nodes, edges, ms, mem])
    lines += [
        "",
        f"One training step (forward + backward), {args.heads} heads x "
        f"{args.units} features, {args.features} input features, self-loops; "
        "peak RSS of one step in a fresh process (n/a: failed, e.g. out of "
        "memory)",
        "",
        markdown_table(
            ["layer", "graph", "nodes", "edges", "ms", "peak RSS MiB"], rows
        ),
        "",
        f"Load after: {load_average()}",
    ]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return text


if __name__ == "__main__":
    main()
