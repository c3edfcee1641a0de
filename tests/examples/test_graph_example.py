"""Tests of `python -m examples.graph`: the shipped WordNet noun graph,
the example's graph helpers and layers, and a `--quick` run (a
2,000-node subgraph: four models, the table, the PNG and the explorer)."""

import json
import os
import struct

import example_output
import numpy as np
import pytest

pytestmark = pytest.mark.tf_only


def _png_size(path):
    with open(path, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def test_parse_data_noun_keeps_noun_pointers():
    from examples.data.wordnet_graph import POINTER_SYMBOLS
    from examples.data.wordnet_graph import SUPERSENSES
    from examples.data.wordnet_graph import build_graph

    lines = [
        "  1 This software and database is being provided to you\n",
        "00000010 03 n 01 entity 0 001 ~ 00000020 n 0000 | that which is  \n",
        "00000020 05 n 02 dog 0 domestic_dog 0 004 @ 00000010 n 0000 "
        "+ 01234567 v 0101 %p 00000030 n 0000 ! 00000030 n 0102 "
        '| a canine; "the dog barked"  \n',
        "00000030 08 n 01 paw 0 001 #p 00000020 n 0000 | a foot  \n",
    ]
    graph = build_graph(lines)
    assert graph.offsets.tolist() == [10, 20, 30]
    assert [SUPERSENSES[c] for c in graph.labels] == [
        "Tops",
        "animal",
        "body",
    ]
    edges = [
        (int(s), int(r), POINTER_SYMBOLS[t])
        for s, r, t in zip(graph.senders, graph.receivers, graph.edge_types)
    ]
    # The pointer to a verb is left out; a lexical pointer ("0102") is
    # kept as an edge between the synsets.
    assert edges == [
        (0, 1, "~"),
        (1, 0, "@"),
        (1, 2, "%p"),
        (1, 2, "!"),
        (2, 1, "#p"),
    ]
    assert graph.lemmas[1] == "dog domestic_dog"
    assert graph.definitions[1] == "a canine"
    assert graph.name(1) == "dog"
    assert graph.text(1) == "dog, domestic dog: a canine"


def test_shipped_graph_counts_labels_and_edges():
    from examples.data.wordnet_graph import POINTER_SYMBOLS
    from examples.data.wordnet_graph import SUPERSENSES
    from examples.data.wordnet_graph import load_graph

    graph = load_graph()
    n = graph.num_nodes
    assert n == 82115 and len(SUPERSENSES) == 26
    assert np.all(np.diff(graph.offsets) > 0)
    assert set(np.unique(graph.labels)) == set(range(26))
    assert graph.num_edges == 231_535
    for ids in (graph.senders, graph.receivers):
        assert ids.min() >= 0 and ids.max() < n
    assert graph.edge_types.max() < len(POINTER_SYMBOLS)
    assert len(graph.lemmas) == len(graph.definitions) == n
    assert all(graph.lemmas) and all(graph.definitions)
    # Every synset but the root `entity` has a hypernym.
    hypernym = np.isin(
        graph.edge_types,
        [POINTER_SYMBOLS.index("@"), POINTER_SYMBOLS.index("@i")],
    )
    without = np.setdiff1d(np.arange(n), graph.senders[hypernym])
    assert [graph.name(i) for i in without] == ["entity"]
    dog = int(np.searchsorted(graph.offsets, 2084071))
    assert graph.name(dog) == "dog"
    assert SUPERSENSES[graph.labels[dog]] == "animal"


def test_undirected_edges_split_and_subgraph():
    from examples.graph import data

    senders, receivers = data.undirected_edges([0, 1, 1, 2, 3], [1, 0, 2, 2, 1])
    pairs = sorted(zip(senders.tolist(), receivers.tolist()))
    assert pairs == [(0, 1), (1, 0), (1, 2), (1, 3), (2, 1), (3, 1)]
    assert np.all(np.diff(receivers) >= 0)

    labels = np.repeat(np.arange(3), [30, 30, 6])
    train, val, test = data.split_nodes(labels, 5, 10, None, seed=1)
    assert np.bincount(labels[train]).tolist() == [5, 5, 3]
    assert len(val) == 10 and len(train) + len(val) + len(test) == 66
    assert not set(train) & set(val) and not set(val) & set(test)
    again = data.split_nodes(labels, 5, 10, None, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(again, (train, val, test)))

    # A path 0-1-...-99: a breadth-first sample is a connected run.
    path = np.arange(99)
    s, r = data.undirected_edges(path, path + 1)
    nodes = data.bfs_nodes(100, s, r, size=20, starts=1, seed=0)
    assert len(nodes) == 20 and np.all(np.diff(nodes) == 1)
    sub_s, sub_r = data.induced_subgraph(nodes, s, r)
    assert len(sub_s) == 38 and sub_s.max() == 19 and sub_r.max() == 19


def test_mean_aggregation_matches_numpy():
    import keras

    from examples.graph.model import MeanAggregation

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 4, 3)).astype("float32")
    senders = np.array([1, 2, 0, 3], "int32")
    receivers = np.array([0, 0, 1, 1], "int32")  # node 2, 3: no edges
    layer = MeanAggregation(5)
    out = keras.ops.convert_to_numpy(layer(x, edges=(senders, receivers)))
    w_self, b = (
        keras.ops.convert_to_numpy(v) for v in layer.self_dense.weights
    )
    w_neighbour = keras.ops.convert_to_numpy(layer.neighbour_dense.kernel)
    mean = np.zeros((4, 3), "float32")
    mean[0] = (x[0, 1] + x[0, 2]) / 2
    mean[1] = (x[0, 0] + x[0, 3]) / 2
    expected = x[0] @ w_self + b + mean @ w_neighbour
    np.testing.assert_allclose(out[0], expected, atol=1e-5)


def test_unknown_model_is_rejected(capsys):
    from examples.graph import __main__ as graph

    with pytest.raises(SystemExit):
        graph.parse_args(["--models", "gat,gcn"])
    error = capsys.readouterr().err
    assert "--models" in error and "unknown: gcn" in error


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    return example_output.quick_run(tmp_path_factory, "graph")


def test_quick_run_compares_the_four_models(quick_run):
    rows = {row["model"]: row for row in quick_run["summary"]}
    assert list(rows) == ["mlp", "mean", "gat", "gatv2"]
    assert quick_run["num_nodes"] == 2000
    for run in quick_run["runs"]:
        for key in ("test_accuracy", "validation_accuracy"):
            assert 0.0 <= run[key] <= 1.0
        assert 1 <= run["best_epoch"] <= run["epochs"] <= 30
        assert run["seconds_per_epoch"] > 0
    # The graph helps: GAT and GATv2 beat uniform guessing by far, and
    # the majority class.
    chance = 1 / 26
    for kind in ("gat", "gatv2"):
        accuracy = rows[kind]["test_accuracy"][0]
        assert accuracy > 3 * chance
        assert accuracy > quick_run["majority_accuracy"]
    with open(os.path.join(quick_run["output_dir"], "results.md")) as f:
        report = f.read()
    for name in ("MLP (features only)", "mean aggregation", "GAT (v1)"):
        assert f"| {name} |" in report
    assert "| GATv2 |" in report and "± " in report
    with open(os.path.join(quick_run["output_dir"], "results.json")) as f:
        assert len(json.load(f)["runs"]) == 4


def test_quick_run_prints_no_warnings(quick_run):
    output = quick_run["output"]
    assert "backend: tensorflow" in output.log
    found = output.problems()
    assert not found, "\n".join(found)


def test_quick_run_plots_the_attention_of_neighbourhoods(quick_run):
    width, height = _png_size(quick_run["png"])
    assert width > 400 and height > 400
    for panel in quick_run["panels"]:
        assert 3 <= panel["degree"] <= 12
        # The node's weights over its neighbours and itself sum to 1.
        total = panel["self_weight"] + sum(panel["weights"])
        assert total == pytest.approx(1.0, abs=1e-4)
        assert panel["weights"] == sorted(panel["weights"], reverse=True)


def test_quick_run_writes_the_attention_explorer(quick_run):
    with open(quick_run["html"], encoding="utf-8") as f:
        html = f.read()
    assert html.startswith("<!DOCTYPE html>")
    assert "http://" not in html and "https://" not in html
    layers = quick_run["explorer_layers"]
    assert sorted(layers) == ["hidden_attention", "output_attention"]
    n = len(quick_run["explorer_tokens"])
    assert 4 <= n <= 30
    assert layers["hidden_attention"] == [1, 8, n, n]
    assert layers["output_attention"] == [1, 1, n, n]
