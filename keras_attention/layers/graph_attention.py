import math

import keras
import numpy as np
from keras import ops

from keras_attention.layers import recording
from keras_attention.ops import is_symbolic
from keras_attention.ops.masking import masked_softmax
from keras_attention.ops.masking import softmax_dtype
from keras_attention.ops.segment import segment_softmax
from keras_attention.ops.segment import segment_sum
from keras_attention.utils import keras_utils
from keras_attention.utils import validation

VERSIONS = ("v1", "v2")

_NODES_LAYOUT = "(nodes, features) or (batch, nodes, features)"


def _check_negative_slope(value):
    """`negative_slope` of the LeakyReLU: a finite number >= 0."""
    ok = (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(value)
        and value >= 0
    )
    if not ok:
        raise ValueError(
            "`negative_slope` must be a finite number >= 0. "
            f"Received: negative_slope={value!r}"
        )
    return value.item() if isinstance(value, np.generic) else value


def _dtype_name(x):
    return keras.backend.standardize_dtype(x.dtype)


def _is_integer_dtype(x):
    return "int" in _dtype_name(x)


def _has_values(x):
    """Whether `x` is a tensor with values (eager): not a KerasTensor, a
    graph tensor, a JAX tracer or a PyTorch meta tensor."""
    device = getattr(x, "device", None)
    return not is_symbolic(x) and getattr(device, "type", None) != "meta"


def _same(a, b):
    return a is None or b is None or a == b


@keras.saving.register_keras_serializable(package="keras_attention")
class GraphAttention(recording.AttentionRecording, keras.layers.Layer):
    """Graph attention: each node attends over its incoming edges.

    Axes: b - graphs of a batch, n - nodes (`i` receivers, `j` senders),
    e - edges, h - heads, u - units per head, f - node features.

    Each head scores every edge `j -> i` (message flows from the sender
    `j` to the receiver `i`), normalizes the scores over the receiver's
    incoming edges and sums the senders' projected features with those
    weights:

    - `version="v1"` (GAT, Velickovic et al., 2018):
      `e_ij = LeakyReLU(a_t . W h_i + a_s . W h_j [+ a_e . W_e x_ij])`,
      messages `W h_j`;
    - `version="v2"` (GATv2, Brody et al., 2022):
      `e_ij = a . LeakyReLU(W_t h_i + W_s h_j [+ W_e x_ij])`,
      messages `W_s h_j` (the "dynamic" attention: the ranking of the
      senders can depend on the receiver);
    - `alpha_ij = exp(e_ij) / sum_{k -> i} exp(e_ik)` (numerically stable:
      each receiver's maximum score is subtracted, in at least float32
      whatever the compute dtype: float64 stays float64), then
      `h'_i = sum_{j -> i} alpha_ij m_j` per head,
      the heads concatenated (`concat_heads=True`: `heads * units`
      features) or averaged (`units` features), plus a bias.

    `x_ij` are optional edge features, projected by a learned `W_e` into
    the scores only. With `add_self_loops=True` each node gets one edge to
    itself (its edge features are zeros), appended after the given edges;
    self-loops already among the given edges are then left out (weight 0),
    so every node attends to itself exactly once. A node without incoming
    edges gets all-zero weights and a zero output before the bias (never
    NaN). Duplicate edges each count (each gets its own weight).

    Edge lists: memory and time `O(edges * heads * units)`, no
    `(nodes, nodes)` tensor is built (`keras_attention.ops.segment_softmax`
    normalizes over each receiver's edges). A dense adjacency matrix is
    also accepted, for small graphs: `(nodes, nodes)` scores per head.

    Args:
        num_heads: int, number of attention heads `h`.
        units_per_head: int, output size `u` of each head.
        version: `"v2"` (GATv2, default) or `"v1"` (GAT).
        concat_heads: bool, concatenate the heads (`h * u` features) rather
            than average them (`u` features; the usual last layer).
        dropout: float in [0, 1), dropout on the attention coefficients
            (in training only).
        add_self_loops: bool, let every node attend to itself.
        use_bias: bool, add a bias to the output.
        negative_slope: float >= 0, the slope of the LeakyReLU.
        kernel_initializer: initializer of the projections and attention
            vectors.
        bias_initializer: initializer of the bias.
        seed: optional int, seed of the dropout.
        **kwargs: base layer arguments.

    Call arguments:
        node_features: `(n, f)`, or `(b, n, f)` for a batch of graphs of
            `n` nodes sharing one edge list (or adjacency).
        edges: either a pair `(senders, receivers)` of int tensors `(e,)`,
            the edges `senders[k] -> receivers[k]` (node ids in `[0, n)`;
            for batched node features the same edges in every graph), or
            a dense boolean / 0-1 adjacency `(n, n)` or `(b, n, n)` where
            `adjacency[..., i, j]` True is an edge `j -> i`.
        edge_features: optional `(e, f_e)`, features of the edges of an
            edge list (not with an adjacency).
        return_attention_scores: bool, also return the coefficients.
        training: bool, whether dropout is applied.

    Returns:
        `(n, h * u)` (or `(n, u)` with `concat_heads=False`), with a leading
        batch axis for batched node features; and with
        `return_attention_scores=True` the coefficients: for an edge list
        `(e + n, h)` (`(b, e + n, h)` batched): the given edges first, then
        the self-loops of nodes `0 .. n-1` (`(e, h)` without self-loops);
        for an adjacency `(h, n, n)` (`(b, h, n, n)` batched),
        `[h, i, j]` the weight of sender `j` for receiver `i`. Each
        receiver's coefficients sum to 1 (0 for nodes without edges).

    Example:

    >>> import keras
    >>> import numpy as np
    >>> import keras_attention
    >>> layer = keras_attention.layers.GraphAttention(
    ...     num_heads=2, units_per_head=4)
    >>> nodes = np.ones((3, 5), "float32")  # 3 nodes, 5 features
    >>> senders, receivers = np.array([0, 1]), np.array([1, 2])
    >>> out, alpha = layer(nodes, edges=(senders, receivers),
    ...                    return_attention_scores=True)
    >>> tuple(out.shape), tuple(alpha.shape)  # 2 edges + 3 self-loops
    ((3, 8), (5, 2))
    >>> # equal nodes: node 1 splits its attention between 0 and itself
    >>> np.round(keras.ops.convert_to_numpy(alpha)[:, 0], 2).tolist()
    [0.5, 0.5, 1.0, 0.5, 0.5]

    References:
        - Velickovic et al., 2018, "Graph Attention Networks".
        - Brody, Alon and Yahav, 2022, "How Attentive are Graph Attention
          Networks?".
    """

    attention_kind = "self"

    def __init__(
        self,
        num_heads,
        units_per_head,
        version="v2",
        concat_heads=True,
        dropout=0.0,
        add_self_loops=True,
        use_bias=True,
        negative_slope=0.2,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = validation.check_positive_int("num_heads", num_heads)
        self.units_per_head = validation.check_positive_int(
            "units_per_head", units_per_head
        )
        if not isinstance(version, str) or version not in VERSIONS:
            raise ValueError(
                f"`version` must be one of {VERSIONS!r}. "
                f"Received: version={version!r}"
            )
        self.version = version
        self.concat_heads = validation.check_bool("concat_heads", concat_heads)
        self.dropout = validation.check_rate("dropout", dropout)
        self.add_self_loops = validation.check_bool(
            "add_self_loops", add_self_loops
        )
        self.use_bias = validation.check_bool("use_bias", use_bias)
        self.negative_slope = _check_negative_slope(negative_slope)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = validation.check_seed("seed", seed)
        self._dropout_layer = keras.layers.Dropout(
            rate=self.dropout, seed=self.seed, dtype=self.dtype_policy
        )

    @property
    def output_dim(self):
        """The output feature size: `h * u` or `u`."""
        if self.concat_heads:
            return self.num_heads * self.units_per_head
        return self.units_per_head

    # Weights ----------------------------------------------------------------

    def _weight(self, name, shape, initializer=None):
        initializer = initializer or self.kernel_initializer
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=keras_utils.clone_initializer(initializer),
        )

    def build(
        self, node_features_shape, edges_shape=None, edge_features_shape=None
    ):
        shape = tuple(node_features_shape)
        self._features = validation.check_sequence_shape(
            "node_features", shape, ranks=(2, 3), layout=_NODES_LAYOUT
        )
        width = self.num_heads * self.units_per_head
        heads = (self.num_heads, self.units_per_head)
        if self.version == "v1":
            self.kernel = self._weight("kernel", (self._features, width))
            self.attention_target = self._weight("attention_target", heads)
            self.attention_source = self._weight("attention_source", heads)
        else:
            self.source_kernel = self._weight(
                "source_kernel", (self._features, width)
            )
            self.target_kernel = self._weight(
                "target_kernel", (self._features, width)
            )
            self.attention = self._weight("attention", heads)
        self._edge_features = None
        if edge_features_shape is not None:
            edge_shape = tuple(edge_features_shape)
            self._edge_features = validation.check_sequence_shape(
                "edge_features", edge_shape, ranks=(2,), layout="(edges, f_e)"
            )
            self.edge_kernel = self._weight(
                "edge_kernel", (self._edge_features, width)
            )
            if self.version == "v1":
                self.attention_edge = self._weight("attention_edge", heads)
        self.bias = None
        if self.use_bias:
            self.bias = self._weight(
                "bias", (self.output_dim,), self.bias_initializer
            )
        self.built = True

    # Checks -----------------------------------------------------------------

    def _check_edge_list(self, edges, nodes):
        """`(senders, receivers)` as int32 tensors, checked."""
        if len(edges) != 2:
            raise ValueError(
                "`edges` must be a pair (senders, receivers) of int tensors "
                "of shape (edges,), or a dense adjacency (nodes, nodes). "
                f"Received: edges of length {len(edges)!r}"
            )
        pair = []
        for index, ids in enumerate(edges):
            name = f"edges[{index}]"
            if not hasattr(ids, "dtype") or not hasattr(ids, "shape"):
                ids = ops.convert_to_tensor(ids)
            validation.check_numeric_input(name, ids)
            if not _is_integer_dtype(ids):
                raise TypeError(
                    f"`{name}` ({('senders', 'receivers')[index]}) must be "
                    "an integer tensor of node ids. Received: "
                    f"{name} of dtype {_dtype_name(ids)!r}"
                )
            if len(ids.shape) != 1:
                raise ValueError(
                    f"`{name}` must have shape (edges,). Received: "
                    f"{name}.shape={tuple(ids.shape)!r}"
                )
            pair.append(ids)
        senders, receivers = pair
        if not _same(senders.shape[0], receivers.shape[0]):
            raise ValueError(
                "`edges` must hold as many senders as receivers. Received: "
                f"senders.shape={tuple(senders.shape)!r}, "
                f"receivers.shape={tuple(receivers.shape)!r}"
            )
        for index, ids in enumerate(pair):
            if _has_values(ids) and isinstance(nodes, int):
                values = np.asarray(ops.convert_to_numpy(ids))
                bad = values[(values < 0) | (values >= nodes)]
                if bad.size:
                    raise ValueError(
                        f"`edges[{index}]` must hold node ids in [0, "
                        f"{nodes}) ({nodes} nodes). Received: out-of-range "
                        f"ids {bad[:8].tolist()!r} in edges[{index}]"
                    )
        return ops.cast(senders, "int32"), ops.cast(receivers, "int32")

    def _check_adjacency(self, adjacency, batched, nodes):
        validation.check_numeric_input("edges", adjacency)
        shape = tuple(adjacency.shape)
        ranks = (2, 3) if batched else (2,)
        if (
            len(shape) not in ranks
            or not _same(shape[-1], nodes)
            or not _same(shape[-2], nodes)
        ):
            layout = "(nodes, nodes) or (batch, nodes, nodes)"
            raise ValueError(
                "A dense adjacency `edges` must have shape "
                f"{layout if batched else '(nodes, nodes)'} with nodes="
                f"{nodes!r} (the node features' axis -2), or be a pair "
                "(senders, receivers). Received: edges.shape="
                f"{shape!r}"
            )
        adjacency = ops.cast(adjacency, "bool")
        return adjacency if len(shape) == 3 else adjacency[None]

    # Scores -----------------------------------------------------------------

    def _project(self, x, kernel):
        """`x @ kernel` as `(..., n, h, u)`, for `x` of rank 2 or 3 (an
        einsum: Keras's torch `matmul` computes float64 in float32).

        The subscripts are spelled out: TensorFlow's oneDNN einsum with an
        ellipsis (`"...f,fk->...k"`) reads the rows of a bfloat16 or
        float16 `x` at the wrong stride (issue 53)."""
        subscripts = "bnf,fk->bnk" if len(x.shape) == 3 else "ef,fk->ek"
        y = ops.einsum(subscripts, x, ops.cast(kernel, x.dtype))
        return ops.reshape(
            y, tuple(ops.shape(y)[:-1]) + (self.num_heads, self.units_per_head)
        )

    def _leaky(self, x):
        return ops.leaky_relu(x, negative_slope=self.negative_slope)

    def _edge_term(self, edge_features):
        """`W_e x_ij` as `(e, h, u)` in the scores' dtype."""
        return self._f32(
            self._project(
                ops.cast(edge_features, self.compute_dtype), self.edge_kernel
            )
        )

    def _f32(self, w):
        """`w` in the dtype of the scores and their softmax: at least
        float32 (float64 for a float64 layer)."""
        return ops.cast(w, softmax_dtype(self.compute_dtype))

    # Call -------------------------------------------------------------------

    def call(
        self,
        node_features,
        edges=None,
        edge_features=None,
        return_attention_scores=False,
        training=None,
    ):
        validation.check_call_input(
            "node_features",
            node_features,
            self._features,
            ranks=(2, 3),
            layout=_NODES_LAYOUT,
        )
        batched = len(node_features.shape) == 3
        x = ops.cast(node_features, self.compute_dtype)
        if not batched:
            x = x[None]
        nodes = x.shape[1]
        if edges is None:
            raise ValueError(
                "`edges` is required: a pair (senders, receivers) of int "
                "tensors or a dense adjacency. Received: edges=None"
            )
        if isinstance(edges, (tuple, list)):
            senders, receivers = self._check_edge_list(edges, nodes)
            out, coefficients = self._edge_list_attention(
                x, senders, receivers, edge_features, training
            )
            if not batched:
                coefficients = coefficients[0]
        else:
            if edge_features is not None:
                raise ValueError(
                    "`edge_features` need an edge list `edges=(senders, "
                    "receivers)`; a dense adjacency has no edge order. "
                    "Received: edge_features with edges.shape="
                    f"{tuple(edges.shape)!r}"
                )
            adjacency = self._check_adjacency(edges, batched, nodes)
            out, coefficients = self._dense_attention(x, adjacency, training)
            if not batched:
                coefficients = coefficients[0]
        # out: b n h u
        if self.concat_heads:
            out = ops.reshape(
                out, tuple(ops.shape(out)[:2]) + (self.output_dim,)
            )
        else:
            out = ops.mean(out, axis=2)
        if self.bias is not None:
            out = out + ops.cast(self.bias, out.dtype)
        if not batched:
            out = out[0]
        if return_attention_scores:
            return out, coefficients
        return out

    def _messages_and_parts(self, x):
        """The messages `(b, n, h, u)` (compute dtype) and the parts of the
        score of each node as a receiver / sender (at least float32)."""
        if self.version == "v1":
            h = self._project(x, self.kernel)
            hf = self._f32(h)
            target = ops.einsum(
                "bnhu,hu->bnh", hf, self._f32(self.attention_target)
            )
            source = ops.einsum(
                "bnhu,hu->bnh", hf, self._f32(self.attention_source)
            )
            return h, target, source
        messages = self._project(x, self.source_kernel)
        target = self._f32(self._project(x, self.target_kernel))
        return messages, target, self._f32(messages)

    def _edge_list_attention(
        self, x, senders, receivers, edge_features, training
    ):
        nodes = x.shape[1]
        num_segments = nodes if nodes is not None else ops.shape(x)[1]
        if edge_features is not None:
            if self._edge_features is None:
                raise ValueError(
                    "`edge_features` were given, but the layer was built "
                    "without them (it has no edge weights): pass them from "
                    "the first call on. Received: edge_features.shape="
                    f"{tuple(edge_features.shape)!r}"
                )
            validation.check_call_input(
                "edge_features",
                edge_features,
                self._edge_features,
                ranks=(2,),
                layout="(edges, f_e)",
            )
            if not _same(edge_features.shape[0], senders.shape[0]):
                raise ValueError(
                    "`edge_features` must have one row per edge. Received: "
                    f"edge_features.shape={tuple(edge_features.shape)!r} "
                    f"for {senders.shape[0]!r} edges"
                )
        keep = None
        if self.add_self_loops:
            loops = ops.arange(num_segments, dtype="int32")
            # A given self-loop is left out: each node attends to itself
            # once, through the appended loop.
            keep = ops.concatenate(
                [ops.not_equal(senders, receivers), ops.ones_like(loops) > 0]
            )
            senders = ops.concatenate([senders, loops])
            receivers = ops.concatenate([receivers, loops])
            if edge_features is not None:
                edge_features = ops.concatenate(
                    [
                        ops.cast(edge_features, self.compute_dtype),
                        ops.zeros(
                            (num_segments, self._edge_features),
                            self.compute_dtype,
                        ),
                    ]
                )
        messages, target, source = self._messages_and_parts(x)
        # Edges first: n b ... -> gathered e b ...
        target = ops.take(ops.moveaxis(target, 1, 0), receivers, axis=0)
        source = ops.take(ops.moveaxis(source, 1, 0), senders, axis=0)
        if self.version == "v1":
            scores = target + source  # e b h
            if edge_features is not None:
                edge = ops.einsum(
                    "ehu,hu->eh",
                    self._edge_term(edge_features),
                    self._f32(self.attention_edge),
                )
                scores = scores + edge[:, None]
            scores = self._leaky(scores)
        else:
            hidden = target + source  # e b h u
            if edge_features is not None:
                hidden = hidden + self._edge_term(edge_features)[:, None]
            scores = ops.einsum(
                "ebhu,hu->ebh", self._leaky(hidden), self._f32(self.attention)
            )
        alpha = segment_softmax(scores, receivers, num_segments, mask=keep)
        alpha = self._dropout_layer(alpha, training=training)
        alpha = ops.cast(alpha, self.compute_dtype)  # e b h
        gathered = ops.take(ops.moveaxis(messages, 1, 0), senders, axis=0)
        out = segment_sum(
            gathered * alpha[..., None], receivers, num_segments
        )  # n b h u (float64 stays float64, on torch too)
        out = ops.cast(ops.moveaxis(out, 0, 1), self.compute_dtype)
        return out, ops.moveaxis(alpha, 0, 1)  # b n h u, b e h

    def _dense_attention(self, x, adjacency, training):
        nodes = x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]
        if self.add_self_loops:
            ids = ops.arange(nodes, dtype="int32")
            adjacency = ops.logical_or(
                adjacency, (ids[:, None] == ids[None, :])[None]
            )
        messages, target, source = self._messages_and_parts(x)
        if self.version == "v1":
            scores = (
                ops.transpose(target, (0, 2, 1))[..., :, None]
                + ops.transpose(source, (0, 2, 1))[..., None, :]
            )  # b h i j
            scores = self._leaky(scores)
        else:
            hidden = target[:, :, None] + source[:, None, :]  # b i j h u
            scores = ops.einsum(
                "bijhu,hu->bhij", self._leaky(hidden), self._f32(self.attention)
            )
        weights = masked_softmax(scores, adjacency[:, None])  # b h i j
        weights = self._dropout_layer(weights, training=training)
        weights = ops.cast(weights, self.compute_dtype)
        out = ops.einsum("bhij,bjhu->bihu", weights, messages)
        return out, weights

    # Shapes, recording, config --------------------------------------------

    def compute_output_spec(
        self,
        node_features,
        edges=None,
        edge_features=None,
        return_attention_scores=False,
        training=None,
    ):
        shape = tuple(node_features.shape)
        out = keras.KerasTensor(
            shape[:-1] + (self.output_dim,), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return out
        batch = shape[:-2]
        nodes = shape[-2]
        if isinstance(edges, (tuple, list)):
            count = edges[0].shape[0]
            if self.add_self_loops:
                count = None if None in (count, nodes) else count + nodes
            scores_shape = batch + (count, self.num_heads)
        else:
            scores_shape = batch + (self.num_heads, nodes, nodes)
        return out, keras.KerasTensor(scores_shape, dtype=self.compute_dtype)

    def describe_attention(self, arguments, scores, options):
        """`collect_attention`'s hook (`layers/recording.py`): the
        coefficients as dense weights `(batch or 1, heads, n, n)`,
        receivers as rows and senders as columns (duplicate edges add
        up). Raises `ValueError` for graphs of more than
        `options["max_dense_length"]` nodes."""
        features = arguments["node_features"]
        nodes = int(features.shape[-2])
        limit = options.get("max_dense_length")
        if limit is not None and nodes > limit:
            raise ValueError(
                f"GraphAttention {self.name!r} has {nodes} nodes, more than "
                "`max_dense_length`: its dense (nodes, nodes) weights would "
                "not fit. Pass a larger `max_dense_length` (or None) to "
                "`collect_attention`. Received: "
                f"max_dense_length={limit!r}"
            )
        coefficients = recording.numpy_weights(scores)
        batched = len(features.shape) == 3
        if not batched:
            coefficients = coefficients[None]
        edges = arguments["edges"]
        if isinstance(edges, (tuple, list)):
            senders, receivers = (
                np.asarray(ops.convert_to_numpy(e)).astype("int64")
                for e in edges
            )
            if self.add_self_loops:
                loops = np.arange(nodes)
                senders = np.concatenate([senders, loops])
                receivers = np.concatenate([receivers, loops])
            weights = np.zeros(
                (coefficients.shape[0], self.num_heads, nodes, nodes),
                "float32",
            )
            np.add.at(
                weights,
                (slice(None), slice(None), receivers, senders),
                coefficients.transpose(0, 2, 1),
            )
        else:
            weights = coefficients
        meta = dict(
            kind="self",
            query_mask=None,
            key_mask=None,
            causal=False,
            window=None,
        )
        return weights, meta

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "units_per_head": self.units_per_head,
                "version": self.version,
                "concat_heads": self.concat_heads,
                "dropout": self.dropout,
                "add_self_loops": self.add_self_loops,
                "use_bias": self.use_bias,
                "negative_slope": self.negative_slope,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
                "seed": self.seed,
            }
        )
        return config
