"""GraphAttention (GAT / GATv2): NumPy references of both papers' formulas,
gradients, call forms (edge list, adjacency, batched), the harness,
saving, mixed precision, argument errors and `collect_attention`."""

import os
import tempfile

import keras
import numpy as np
import pytest
from harness import BACKEND
from harness import check_config
from harness import run_layer_test
from keras import ops

from keras_attention.layers import GraphAttention
from keras_attention.visualization import collect_attention

N, F, FE, H, U = 6, 5, 3, 2, 4
RNG = np.random.default_rng(7)
X = RNG.normal(size=(N, F)).astype("float32")
# 2 -> 0 twice (a duplicate), 3 -> 3 (a self-loop), node 5 receives nothing.
SENDERS = np.array([1, 2, 2, 0, 3, 4, 0, 1, 3], "int32")
RECEIVERS = np.array([0, 0, 0, 1, 3, 3, 4, 2, 2], "int32")
EDGE_FEATURES = RNG.normal(size=(len(SENDERS), FE)).astype("float32")


def np_(x):
    return np.asarray(ops.convert_to_numpy(x))


def leaky(x, slope=0.2):
    return np.where(x > 0, x, slope * x)


def weights_of(layer):
    return {
        w.path.split("/")[-1]: np_(w).astype("float64") for w in layer.weights
    }


def reference(layer, x, senders, receivers, edge_features=None):
    """Both papers' formulas, edge by edge, in float64 (one graph)."""
    w = weights_of(layer)
    n = x.shape[0]
    x = x.astype("float64")
    s, r = list(senders), list(receivers)
    kept = [True] * len(s)
    ef = None if edge_features is None else list(edge_features)
    if layer.add_self_loops:
        # Documented: given self-loops are replaced by the appended ones.
        kept = [a != b for a, b in zip(s, r)] + [True] * n
        s, r = s + list(range(n)), r + list(range(n))
        if ef is not None:
            ef = ef + [np.zeros(FE)] * n

    def heads(v):
        return v.reshape(H, U)

    coef = np.zeros((len(s), H))
    out = np.zeros((n, H, U))
    for i in range(n):
        incoming = [k for k in range(len(s)) if r[k] == i and kept[k]]
        if not incoming:
            continue
        for h in range(H):
            scores, messages = [], []
            for k in incoming:
                j = s[k]
                if layer.version == "v1":
                    wh_i = heads(x[i] @ w["kernel"])[h]
                    wh_j = heads(x[j] @ w["kernel"])[h]
                    z = w["attention_target"][h] @ wh_i
                    z += w["attention_source"][h] @ wh_j
                    if ef is not None:
                        we = heads(ef[k] @ w["edge_kernel"])[h]
                        z += w["attention_edge"][h] @ we
                    scores.append(leaky(z, layer.negative_slope))
                    messages.append(wh_j)
                else:
                    ws_j = heads(x[j] @ w["source_kernel"])[h]
                    wt_i = heads(x[i] @ w["target_kernel"])[h]
                    z = ws_j + wt_i
                    if ef is not None:
                        z = z + heads(ef[k] @ w["edge_kernel"])[h]
                    scores.append(
                        w["attention"][h] @ leaky(z, layer.negative_slope)
                    )
                    messages.append(ws_j)
            scores = np.array(scores)
            alpha = np.exp(scores - scores.max())
            alpha /= alpha.sum()
            coef[incoming, h] = alpha
            out[i, h] = alpha @ np.array(messages)
    out = out.reshape(n, H * U) if layer.concat_heads else out.mean(axis=1)
    if layer.use_bias:
        out = out + w["bias"]
    return out, coef


def make_layer(version, build=True, **kwargs):
    kwargs.setdefault("bias_initializer", "glorot_uniform")
    layer = GraphAttention(H, U, version=version, **kwargs)
    return layer


def to_adjacency(senders, receivers, n=N):
    adjacency = np.zeros((n, n), bool)
    adjacency[receivers, senders] = True
    return adjacency


@pytest.mark.parametrize("with_edge_features", [False, True])
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("concat", [True, False])
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_matches_numpy_reference(version, concat, loops, with_edge_features):
    layer = make_layer(version, concat_heads=concat, add_self_loops=loops)
    ef = EDGE_FEATURES if with_edge_features else None
    out, coef = layer(
        X,
        edges=(SENDERS, RECEIVERS),
        edge_features=ef,
        return_attention_scores=True,
    )
    ref_out, ref_coef = reference(layer, X, SENDERS, RECEIVERS, ef)
    assert np_(out).shape == (N, H * U if concat else U)
    assert np_(coef).shape == (len(SENDERS) + (N if loops else 0), H)
    np.testing.assert_allclose(np_(out), ref_out, atol=1e-5)
    np.testing.assert_allclose(np_(coef), ref_coef, atol=1e-5)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_isolated_node_gets_zero_and_duplicates_count(version):
    layer = make_layer(version, add_self_loops=False, use_bias=False)
    out, coef = layer(
        X, edges=(SENDERS, RECEIVERS), return_attention_scores=True
    )
    out, coef = np_(out), np_(coef)
    assert np.all(np.isfinite(out)) and np.all(out[5] == 0)
    # Node 0 receives 1 -> 0 and 2 -> 0 twice: the duplicates share the
    # same score, so each gets the same weight.
    np.testing.assert_allclose(coef[1], coef[2], atol=1e-7)
    # Dense form: a row without edges is all-zero too.
    out_d, w_d = layer(
        X, edges=to_adjacency(SENDERS, RECEIVERS), return_attention_scores=True
    )
    assert np.all(np_(out_d)[5] == 0) and np.all(np_(w_d)[:, 5] == 0)
    # Per receiver the coefficients sum to 1 (0 without incoming edges).
    sums = np.zeros((N, H))
    np.add.at(sums, RECEIVERS, coef)
    np.testing.assert_allclose(sums, [[1.0] * H] * 5 + [[0.0] * H], atol=1e-6)


@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_adjacency_equals_edge_list(version, loops):
    layer = make_layer(version, add_self_loops=loops)
    # Without duplicates (an adjacency holds each edge once).
    senders, receivers = np.nonzero(to_adjacency(SENDERS, RECEIVERS).T)
    out_e, coef = layer(
        X, edges=(senders, receivers), return_attention_scores=True
    )
    adjacency = to_adjacency(senders, receivers).astype("float32")  # 0-1
    out_d, dense = layer(X, edges=adjacency, return_attention_scores=True)
    np.testing.assert_allclose(np_(out_e), np_(out_d), atol=1e-5)
    expected = np.zeros((H, N, N))
    s, r = senders, receivers
    if loops:
        s, r = np.r_[s, np.arange(N)], np.r_[r, np.arange(N)]
    np.add.at(expected, (slice(None), r, s), np_(coef).T)
    np.testing.assert_allclose(np_(dense), expected, atol=1e-6)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_batched_equals_per_graph(version):
    layer = make_layer(version, concat_heads=False)
    xs = RNG.normal(size=(3, N, F)).astype("float32")
    out, coef = layer(
        xs,
        edges=(SENDERS, RECEIVERS),
        edge_features=EDGE_FEATURES,
        return_attention_scores=True,
    )
    assert np_(out).shape == (3, N, U)
    adjacency = RNG.random((3, N, N)) < 0.4
    out_d, w_d = layer(xs, edges=adjacency, return_attention_scores=True)
    assert np_(w_d).shape == (3, H, N, N)
    for b in range(3):
        one, one_coef = layer(
            xs[b],
            edges=(SENDERS, RECEIVERS),
            edge_features=EDGE_FEATURES,
            return_attention_scores=True,
        )
        np.testing.assert_allclose(np_(out)[b], np_(one), atol=1e-5)
        np.testing.assert_allclose(np_(coef)[b], np_(one_coef), atol=1e-6)
        one_d = layer(xs[b], edges=adjacency[b])
        np.testing.assert_allclose(np_(out_d)[b], np_(one_d), atol=1e-5)


def _gradients(layer, x, **kwargs):
    """d sum(out * sin(out)) / d (x, *trainable weights), as NumPy."""
    if not layer.built:
        layer(x, **kwargs)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = layer(x, **kwargs)
            loss = tf.reduce_sum(out * tf.sin(out))
        variables = [w.value for w in layer.trainable_weights]
        grads = tape.gradient(loss, [x] + variables)
    elif BACKEND == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        other = [v.value for v in layer.non_trainable_variables]

        def loss(x, trainable):
            out, _ = layer.stateless_call(trainable, other, x, **kwargs)
            return ops.sum(out * ops.sin(out))

        gx, gw = jax.grad(loss, argnums=(0, 1))(
            ops.convert_to_tensor(x), trainable
        )
        grads = [gx] + list(gw)
    else:
        import torch

        for w in layer.trainable_weights:
            w.value.grad = None
        x = torch.tensor(x, requires_grad=True)
        out = layer(x, **kwargs)
        torch.sum(out * torch.sin(out)).backward()
        grads = [x.grad] + [w.value.grad for w in layer.trainable_weights]
    return [np_(g) for g in grads]


def _loss(layer, x, **kwargs):
    out = np_(layer(x, **kwargs)).astype("float64")
    return float(np.sum(out * np.sin(out)))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_gradients_match_dense_form_and_finite_differences(version):
    layer = make_layer(version, add_self_loops=True)
    edges = (SENDERS, RECEIVERS)
    layer(X, edges=edges)
    senders, receivers = np.nonzero(to_adjacency(SENDERS, RECEIVERS).T)
    g_edges = _gradients(layer, X, edges=(senders, receivers))
    g_dense = _gradients(layer, X, edges=to_adjacency(SENDERS, RECEIVERS))
    assert len(g_edges) == 1 + len(layer.trainable_weights)
    for a, b in zip(g_edges, g_dense):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    # Central differences along one random direction (inputs and weights
    # together), with the duplicate edge and the self-loop of EDGES.
    grads = _gradients(layer, X, edges=edges)
    rng = np.random.default_rng(0)
    direction = [rng.normal(size=g.shape) for g in grads]
    predicted = sum(float(np.sum(g * d)) for g, d in zip(grads, direction))
    base = [np_(w) for w in layer.get_weights()]
    eps = 1e-2
    values = []
    for sign in (1, -1):
        layer.set_weights(
            [w + sign * eps * d for w, d in zip(base, direction[1:])]
        )
        values.append(
            _loss(
                layer,
                (X + sign * eps * direction[0]).astype("float32"),
                edges=edges,
            )
        )
    layer.set_weights(base)
    numeric = (values[0] - values[1]) / (2 * eps)
    np.testing.assert_allclose(predicted, numeric, rtol=2e-2, atol=1e-2)


def test_isolated_node_gradients_are_finite():
    layer = make_layer("v2", add_self_loops=False)
    grads = _gradients(layer, X, edges=(SENDERS, RECEIVERS))
    assert all(np.all(np.isfinite(g)) for g in grads)
    assert np.all(grads[0][5] == 0)  # node 5 sends nothing


B = 2
XB = RNG.normal(size=(B, N, F)).astype("float32")
ADJ = np.stack([to_adjacency(SENDERS, RECEIVERS)] * B)
ADJ[1, 5, 0] = True


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_harness_with_adjacency(version):
    run_layer_test(
        GraphAttention,
        dict(
            num_heads=H, units_per_head=U, version=version, dropout=0.1, seed=1
        ),
        dict(node_features=XB, edges=ADJ),
        call_kwargs=dict(return_attention_scores=True),
        expected_output_shape=((B, N, H * U), (B, H, N, N)),
        expected_num_trainable_weights=4,
        expected_num_seed_generators=1,
        run_saved_model=version == "v2",
    )


def _edge_list_model(version, edge_features=True):
    nodes = keras.Input(batch_shape=(N, F), name="nodes")
    senders = keras.Input(batch_shape=(None,), dtype="int32", name="senders")
    receivers = keras.Input(
        batch_shape=(None,), dtype="int32", name="receivers"
    )
    inputs = [nodes, senders, receivers]
    ef = None
    if edge_features:
        ef = keras.Input(batch_shape=(None, FE), name="edge_features")
        inputs.append(ef)
    layer = GraphAttention(H, U, version=version, name="gat")
    y = layer(nodes, edges=(senders, receivers), edge_features=ef)
    y = keras.layers.Dense(1)(y)
    return keras.Model(inputs, y)


class _Graphs(keras.utils.PyDataset):
    """One whole graph per step (the edge list has no batch axis)."""

    def __init__(self, data, target):
        super().__init__()
        self.data, self.target = data, target

    def __len__(self):
        return 3

    def __getitem__(self, index):
        return tuple(self.data), self.target


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_edge_list_config_keras_file_and_fit(version):
    check_config(GraphAttention(H, U, version=version, dropout=0.2, seed=3))
    model = _edge_list_model(version)
    data = [X, SENDERS, RECEIVERS, EDGE_FEATURES]
    before = np_(model(data))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gat.keras")
        model.save(path)
        loaded = keras.models.load_model(path, safe_mode=True)
    np.testing.assert_allclose(np_(loaded(data)), before, atol=1e-6)
    assert loaded.get_layer("gat").get_config() == (
        model.get_layer("gat").get_config()
    )
    model.compile(optimizer="adam", loss="mse")
    target = RNG.normal(size=(N, 1)).astype("float32")
    history = model.fit(_Graphs(data, target), epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


def _rounded(values, dtype):
    """`values` rounded to `dtype` (bfloat16 / float16), back in float32."""
    return np_(ops.cast(ops.cast(values, dtype), "float32")).astype("f4")


# A float32 layer's outputs on inputs and weights rounded to the compute
# dtype differ from the exact ones by ~0.3 % of their scale (bfloat16); the
# TensorFlow oneDNN ellipsis einsum of issue 53 made them 150 % off.
MIXED_TOLERANCE = {"mixed_bfloat16": 2e-2, "mixed_float16": 5e-3}


@pytest.mark.parametrize("form", ["edges", "adjacency"])
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_mixed_precision_matches_float32(version, policy, form):
    """Large node features (x30), the weights of a float32 layer copied:
    the mixed layer computes what the float32 layer (and the float64
    NumPy reference) computes on the same values rounded to its compute
    dtype, up to that dtype's rounding of the projections."""
    rng = np.random.default_rng(53)
    x = (rng.normal(size=(N, F)) * 30).astype("float32")
    if form == "edges":
        edges = (SENDERS, RECEIVERS)
        ef = (rng.normal(size=(len(SENDERS), FE)) * 30).astype("float32")
    else:  # an adjacency holds each edge once
        senders, receivers = np.nonzero(to_adjacency(SENDERS, RECEIVERS).T)
        edges, ef = to_adjacency(senders, receivers), None
    init = keras.initializers.GlorotUniform(seed=3)
    exact = make_layer(version, kernel_initializer=init)
    layer = make_layer(version, kernel_initializer=init, dtype=policy)
    exact(x, edges=edges, edge_features=ef)
    layer(x, edges=edges, edge_features=ef)
    layer.set_weights(exact.get_weights())
    out, coef = layer(
        x, edges=edges, edge_features=ef, return_attention_scores=True
    )
    compute = layer.compute_dtype
    assert keras.backend.standardize_dtype(out.dtype) == compute
    assert all(
        keras.backend.standardize_dtype(w.dtype) == "float32"
        for w in layer.weights
    )
    out = np_(ops.cast(out, "float32")).astype("f8")
    expected = np_(exact(x, edges=edges, edge_features=ef)).astype("f8")
    scale = np.abs(expected).max()
    # The float32 layer with copied weights.
    np.testing.assert_allclose(out, expected, atol=0.05 * scale)
    # Independent: NumPy in float64 on the rounded inputs and weights.
    rounded = make_layer(version)
    rounded(x, edges=edges, edge_features=ef)
    rounded.set_weights([_rounded(w, compute) for w in exact.get_weights()])
    if form == "edges":
        ef = _rounded(ef, compute)
        ref, _ = reference(rounded, _rounded(x, compute), *edges, ef)
    else:
        ref, _ = reference(rounded, _rounded(x, compute), senders, receivers)
    tolerance = MIXED_TOLERANCE[policy] * scale
    np.testing.assert_allclose(out, ref, atol=tolerance)
    coef = np_(ops.cast(coef, "float32")).astype("f8")
    assert np.all(np.isfinite(coef))
    if form == "edges":
        sums = np.zeros((N, H))
        np.add.at(sums, np.r_[RECEIVERS, np.arange(N)], coef)
        np.testing.assert_allclose(sums, 1.0, atol=2e-2)


def test_dropout_only_in_training():
    layer = GraphAttention(H, U, dropout=0.5, seed=4)
    edges = (SENDERS, RECEIVERS)
    _, inference = layer(X, edges=edges, return_attention_scores=True)
    _, again = layer(
        X, edges=edges, return_attention_scores=True, training=False
    )
    np.testing.assert_array_equal(np_(inference), np_(again))
    _, dropped = layer(
        X, edges=edges, return_attention_scores=True, training=True
    )
    dropped = np_(dropped)
    assert np.any(dropped == 0) and not np.allclose(dropped, np_(inference))


def test_argument_errors():
    with pytest.raises(ValueError, match="num_heads=0"):
        GraphAttention(0, U)
    with pytest.raises(ValueError, match="units_per_head='4'"):
        GraphAttention(H, "4")
    with pytest.raises(ValueError, match="version='v3'"):
        GraphAttention(H, U, version="v3")
    with pytest.raises(ValueError, match="dropout=1.0"):
        GraphAttention(H, U, dropout=1.0)
    with pytest.raises(ValueError, match="negative_slope=-0.1"):
        GraphAttention(H, U, negative_slope=-0.1)
    with pytest.raises(ValueError, match="concat_heads='yes'"):
        GraphAttention(H, U, concat_heads="yes")
    layer = GraphAttention(H, U)
    with pytest.raises(ValueError, match="node_features_shape"):
        layer(np.ones((2, 3, 4, 5), "float32"), edges=(SENDERS, RECEIVERS))
    layer(X, edges=(SENDERS, RECEIVERS))
    with pytest.raises(ValueError, match="edges=None"):
        layer(X)
    with pytest.raises(TypeError, match=r"edges\[0\].*'float32'"):
        layer(X, edges=(SENDERS.astype("float32"), RECEIVERS))
    with pytest.raises(ValueError, match=r"edges\[1\]\.shape=\(1, 9\)"):
        layer(X, edges=(SENDERS, RECEIVERS[None]))
    with pytest.raises(ValueError, match="as many senders"):
        layer(X, edges=(SENDERS, RECEIVERS[:-1]))
    with pytest.raises(ValueError, match=r"edges\[0\].*\[6, -1\]"):
        layer(X, edges=(np.r_[SENDERS, 6, -1], np.r_[RECEIVERS, 0, 0]))
    with pytest.raises(ValueError, match="length 3"):
        layer(X, edges=(SENDERS, RECEIVERS, RECEIVERS))
    with pytest.raises(ValueError, match=r"edges\.shape=\(6, 5\)"):
        layer(X, edges=np.ones((N, N - 1), bool))
    with pytest.raises(ValueError, match=r"edges\.shape=\(2, 6, 6\)"):
        layer(X, edges=np.ones((2, N, N), bool))  # batched adjacency, one graph
    with pytest.raises(ValueError, match="edge_features"):
        layer(X, edges=np.ones((N, N), bool), edge_features=EDGE_FEATURES)
    with pytest.raises(ValueError, match="built without"):
        layer(X, edges=(SENDERS, RECEIVERS), edge_features=EDGE_FEATURES)
    with pytest.raises(ValueError, match="node_features_shape"):
        layer(np.ones((N, F + 1), "float32"), edges=(SENDERS, RECEIVERS))
    with_ef = GraphAttention(H, U)
    with_ef(X, edges=(SENDERS, RECEIVERS), edge_features=EDGE_FEATURES)
    with pytest.raises(ValueError, match="one row per edge"):
        with_ef(X, edges=(SENDERS, RECEIVERS), edge_features=EDGE_FEATURES[:-1])


@pytest.mark.parametrize("form", ["edges", "adjacency"])
def test_collect_attention_records_dense_weights(form):
    nodes = keras.Input(batch_shape=(N, F), name="nodes")
    if form == "edges":
        senders = keras.Input(batch_shape=(None,), dtype="int32")
        receivers = keras.Input(batch_shape=(None,), dtype="int32")
        inputs, edges = [nodes, senders, receivers], (senders, receivers)
        data = [X, SENDERS, RECEIVERS]
    else:
        adjacency = keras.Input(batch_shape=(N, N), dtype="bool")
        inputs, edges = [nodes, adjacency], adjacency
        data = [X, to_adjacency(SENDERS, RECEIVERS)]
    layer = GraphAttention(H, U, name="gat")
    model = keras.Model(inputs, layer(nodes, edges=edges))
    maps = collect_attention(model, data)
    assert list(maps) == ["gat"]
    weights = maps["gat"]
    assert weights.shape == (1, H, N, N)
    assert maps.metadata["gat"]["kind"] == "self"
    _, coef = layer(X, edges=(SENDERS, RECEIVERS), return_attention_scores=True)
    expected = np.zeros((H, N, N))
    s, r = np.r_[SENDERS, np.arange(N)], np.r_[RECEIVERS, np.arange(N)]
    np.add.at(expected, (slice(None), r, s), np_(coef).T)
    if form == "adjacency":
        # The adjacency holds the duplicate 2 -> 0 once.
        _, expected = layer(X, edges=data[1], return_attention_scores=True)
        expected = np_(expected)
    np.testing.assert_allclose(weights[0], expected, atol=1e-6)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="max_dense_length=4"):
        collect_attention(model, data, max_dense_length=4)
