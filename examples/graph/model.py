"""The node classifiers of the `graph` example.

Each model reads the whole graph, `{"features": (1, N, F), "senders":
(1, E), "receivers": (1, E)}` (one graph, its edges `senders[k] ->
receivers[k]`), and returns class logits for every node, `(1, N, C)`.
They share their shape, two layers with an ELU and dropout between:

- `mlp`: two `Dense` layers on each node's features alone (no graph);
- `mean`: two `MeanAggregation` layers, `W_s h_i + W_n mean_{j->i} h_j`
  (GraphSAGE's mean aggregator, Hamilton et al., 2017);
- `gat` / `gatv2`: two `keras_attention.layers.GraphAttention` layers,
  `version="v1"` / `"v2"`: several heads concatenated, then one head
  averaged into the classes (Velickovic et al., 2018).
"""

import keras
from keras import ops

from keras_attention.layers import GraphAttention

MODELS = ("mlp", "mean", "gat", "gatv2")
MODEL_NAMES = {
    "mlp": "MLP (features only)",
    "mean": "mean aggregation",
    "gat": "GAT (v1)",
    "gatv2": "GATv2",
}


@keras.saving.register_keras_serializable(package="examples.graph")
class MeanAggregation(keras.layers.Layer):
    """`h'_i = W_s h_i + W_n mean_{j -> i} h_j + b`: a node's own features
    and the mean of its senders' (zeros for a node without incoming
    edges), with `keras.ops.segment_sum` over the edge list.

    Call arguments: `node_features` `(b, n, f)`, `edges` a pair
    `(senders, receivers)` of int tensors `(e,)` shared by the graphs.
    """

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.self_dense = keras.layers.Dense(units, name="self")
        self.neighbour_dense = keras.layers.Dense(
            units, use_bias=False, name="neighbours"
        )

    def build(self, node_features_shape, edges_shape=None):
        self.self_dense.build(node_features_shape)
        self.neighbour_dense.build(node_features_shape)
        self.built = True

    def call(self, node_features, edges):
        senders, receivers = edges
        nodes = node_features.shape[1] or ops.shape(node_features)[1]
        # Project first (units < features): cheaper to gather.
        messages = ops.moveaxis(self.neighbour_dense(node_features), 1, 0)
        summed = ops.segment_sum(
            ops.take(messages, senders, axis=0), receivers, num_segments=nodes
        )  # n b u
        degree = ops.segment_sum(
            ops.ones_like(receivers, dtype=summed.dtype),
            receivers,
            num_segments=nodes,
        )
        mean = summed / ops.maximum(degree, 1.0)[:, None, None]
        return self.self_dense(node_features) + ops.moveaxis(mean, 0, 1)

    def compute_output_shape(self, node_features_shape, edges_shape=None):
        return tuple(node_features_shape[:-1]) + (self.units,)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


class NodeClassifier(keras.Model):
    """One of `MODELS` (module docstring): node logits `(1, N, C)`.

    Args:
        kind: `"mlp"`, `"mean"`, `"gat"` or `"gatv2"`.
        num_classes: C.
        hidden_units: features of the hidden layer (for the attention
            models `heads * hidden_units // heads`: `heads` heads).
        heads: attention heads of the hidden layer.
        dropout: dropout on the input and hidden features, and on the
            attention coefficients.
        seed: seed of the dropout layers.
    """

    def __init__(
        self, kind, num_classes, hidden_units=64, heads=8, dropout=0.5, seed=0
    ):
        super().__init__(name=kind)
        if kind not in MODELS:
            raise ValueError(
                f"`kind` must be one of {MODELS}. Received: kind={kind!r}"
            )
        self.kind = kind
        self.input_dropout = keras.layers.Dropout(dropout, seed=seed)
        self.hidden_dropout = keras.layers.Dropout(dropout, seed=seed + 1)
        if kind == "mlp":
            self.hidden = keras.layers.Dense(hidden_units, name="hidden")
            self.out = keras.layers.Dense(num_classes, name="out")
        elif kind == "mean":
            self.hidden = MeanAggregation(hidden_units, name="hidden")
            self.out = MeanAggregation(num_classes, name="out")
        else:
            version = "v1" if kind == "gat" else "v2"
            self.hidden = GraphAttention(
                num_heads=heads,
                units_per_head=max(1, hidden_units // heads),
                version=version,
                dropout=dropout,
                seed=seed + 2,
                name="hidden_attention",
            )
            self.out = GraphAttention(
                num_heads=1,
                units_per_head=num_classes,
                version=version,
                concat_heads=False,
                dropout=dropout,
                seed=seed + 3,
                name="output_attention",
            )

    def _layer(self, layer, x, edges, training):
        if self.kind == "mlp":
            return layer(x)
        if self.kind == "mean":
            return layer(x, edges=edges)
        return layer(x, edges=edges, training=training)

    def call(self, inputs, training=None):
        x = inputs["features"]
        edges = (inputs["senders"][0], inputs["receivers"][0])
        x = self.input_dropout(x, training=training)
        x = ops.elu(self._layer(self.hidden, x, edges, training))
        x = self.hidden_dropout(x, training=training)
        return self._layer(self.out, x, edges, training)

    def hidden_attention(self, inputs):
        """The hidden attention layer's coefficients on `inputs`
        (inference), `(E + N, heads)` NumPy: the edges, then the
        self-loops of nodes `0 .. N-1`."""
        _, alpha = self.hidden(
            ops.convert_to_tensor(inputs["features"]),
            edges=(
                ops.convert_to_tensor(inputs["senders"][0]),
                ops.convert_to_tensor(inputs["receivers"][0]),
            ),
            return_attention_scores=True,
            training=False,
        )
        return ops.convert_to_numpy(alpha)[0]
