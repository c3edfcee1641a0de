"""No tensor of rank > 5 in any layer's forward or backward graph.

Several of TensorFlow's oneDNN CPU kernels (on by default on x86 CPUs with
AVX-512 VNNI/BF16 or AMX) reject inputs of rank above 5 (`Input dims must be
<= 5`). Whether a machine uses them depends on its CPU, so instead of
relying on the CPU this test traces every public layer's forward pass and
its gradient (w.r.t. the trainable weights and the float inputs) into a
`tf.function` graph and looks at the static shape of every op output:
the graph itself, and every function it calls (while-loop bodies and
conditions, their gradients, nested `tf.function`s), recursively.
"""

import inspect

import keras
import numpy as np
import public_layers
import pytest

import keras_attention
from keras_attention import masks

pytestmark = pytest.mark.tf_only

MAX_RANK = 5
L = keras_attention.layers


# The detector -----------------------------------------------------------------


def _called_functions(op):
    """Names of the functions an op calls (While body/cond, PartitionedCall
    f, If branches, ...)."""
    names = []
    for value in op.node_def.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names


def high_rank_tensors(graph, limit=MAX_RANK):
    """`[(function, op name, op type, shape)]` for every op output of rank
    above `limit` in `graph` and in every function reachable from it.

    Raises `LookupError` when an op calls a function whose graph cannot be
    found (the walk would silently miss it).
    """
    library = {}
    found, seen, todo = [], set(), [("<graph>", graph)]
    while todo:
        where, g = todo.pop()
        for name, fn in getattr(g, "_functions", {}).items():
            library.setdefault(name, fn)
        for op in g.get_operations():
            for out in op.outputs:
                rank = out.shape.rank
                if rank is not None and rank > limit:
                    found.append((where, op.name, op.type, tuple(out.shape)))
            for name in _called_functions(op):
                if name in seen:
                    continue
                fn = library.get(name)
                sub = getattr(fn, "graph", None)
                if sub is None:
                    raise LookupError(
                        f"{op.type} {op.name!r} calls {name!r}: no graph"
                    )
                seen.add(name)
                todo.append((name, sub))
    return found


def trace_with_gradients(layer, call, inputs, gradients=True):
    """Concrete graph of `call(layer, **inputs)` and (if `gradients`) its
    gradient.

    `inputs` maps argument names to NumPy arrays (float ones are
    differentiated) or to Python values (passed as they are). The layer is
    called once eagerly first, to build its weights.
    """
    import tensorflow as tf

    call(layer, **inputs)
    arrays = {k: v for k, v in inputs.items() if isinstance(v, np.ndarray)}
    fixed = {k: v for k, v in inputs.items() if k not in arrays}
    floats = sorted(k for k, v in arrays.items() if v.dtype.kind == "f")

    def step(**tensors):
        with tf.GradientTape() as tape:
            tape.watch([tensors[k] for k in floats])
            outputs = call(layer, **tensors, **fixed)
            loss = tf.add_n(
                [
                    tf.reduce_sum(tf.cast(o, "float32"))
                    for o in tf.nest.flatten(outputs)
                    if o.dtype.is_floating
                ]
            )
        if not gradients:
            return loss
        sources = list(layer.trainable_weights) + [tensors[k] for k in floats]
        grads = tape.gradient(loss, sources)
        return loss, [g for g in grads if g is not None]

    specs = {
        k: tf.TensorSpec(v.shape, tf.as_dtype(v.dtype))
        for k, v in arrays.items()
    }
    return tf.function(step).get_concrete_function(**specs).graph


# Self-tests: the walk reaches loop bodies, nested functions and gradients ---


def _tiny_rank6_graph(where):
    import tensorflow as tf

    @tf.function
    def nested(x):
        return tf.reduce_sum(tf.sin(tf.reshape(x, (1, 1, 1, 1, 2, 3))))

    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            if where == "loop":

                def body(i, acc):
                    y = tf.reshape(x, (1, 1, 1, 1, 2, 3))
                    return i + 1, acc + tf.reduce_sum(tf.sin(y))

                _, loss = tf.while_loop(lambda i, a: i < 3, body, (0, 0.0))
            elif where == "nested":
                loss = nested(x)
            else:
                loss = tf.reduce_sum(tf.sin(x))
        return loss, tape.gradient(loss, x)

    return (
        tf.function(fn)
        .get_concrete_function(tf.TensorSpec((6,), "float32"))
        .graph
    )


@pytest.mark.parametrize("where", ["loop", "nested"])
def test_detector_finds_rank6_in_loops_and_nested_functions(where):
    found = high_rank_tensors(_tiny_rank6_graph(where))
    assert any(len(shape) == 6 for _, _, _, shape in found), found
    # Forward body and the body of its gradient both hold one.
    assert len({f for f, _, _, _ in found}) >= 2, found


def test_detector_passes_rank5_graph():
    assert high_rank_tensors(_tiny_rank6_graph("none")) == []


def test_detector_finds_rank6_in_a_recurrent_layer_graph():
    """A layer whose step (a while-loop body under `keras.ops.rnn`) builds a
    rank-6 tensor, forward and backward, is caught."""

    class Rank6Cell(keras.layers.Layer):
        state_size = 4
        output_size = 4

        def build(self, input_shape):
            self.w = self.add_weight(shape=(4, 4))

        def call(self, x, states):
            y = keras.ops.reshape(x @ self.w, (-1, 1, 1, 1, 2, 2))
            h = keras.ops.reshape(keras.ops.tanh(y), (-1, 4)) + states[0]
            return h, [h]

    layer = keras.layers.RNN(Rank6Cell())
    graph = trace_with_gradients(
        layer, lambda layer, x: layer(x), {"x": np.ones((2, 3, 4), "float32")}
    )
    found = high_rank_tensors(graph)
    assert len({f for f, _, _, _ in found}) >= 2, found


# Every public layer ---------------------------------------------------------

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 6, 8)).astype("float32")
X10 = RNG.normal(size=(2, 10, 8)).astype("float32")
CTX = RNG.normal(size=(2, 5, 6)).astype("float32")
MEM8 = RNG.normal(size=(2, 7, 8)).astype("float32")
STATE = RNG.normal(size=(2, 8)).astype("float32")
VALID = np.array([[True] * 6, [True] * 4 + [False] * 2])
VALID10 = np.array([[True] * 10, [True] * 7 + [False] * 3])
CTX_VALID = np.array([[True] * 5, [True] * 3 + [False] * 2])
MEM_VALID = np.array([[True] * 7, [True] * 4 + [False] * 3])


def _has_arg(cls, name):
    return name in inspect.signature(cls.__init__).parameters


def _scoped(implementation, call):
    def run(layer, **kw):
        with keras_attention.ops.implementation_scope(implementation):
            return call(layer, **kw)

    return run


def _mha_call(layer, q, v, qm, vm, training=True, **kw):
    return layer(q, v, query_mask=qm, value_mask=vm, training=training, **kw)


def _built(layer, *args):
    layer(*args)
    return layer


def _decoder_cached(layer, x, cache, valid, memory=None):
    extra = {} if memory is None else {"cross_attention_cache": memory}
    return layer(
        x,
        padding_mask=valid,
        self_attention_cache=cache,
        self_attention_cache_update_index=2,
        training=True,
        **extra,
    )


def _luong_cases():
    cases = []
    for mode in ("dot", "general", "concat"):
        for alignment in ("global", "local-m", "local-p"):
            kwargs = dict(score_mode=mode, alignment=alignment, dropout=0.1)
            if mode == "concat":
                kwargs.update(units=5, scale="learned")
            if alignment != "global":
                kwargs["window"] = 2
            cases.append(
                (
                    f"luong-{mode}-{alignment}",
                    lambda kwargs=kwargs: L.LuongAttention(**kwargs),
                    lambda layer, q, m, vm: layer(
                        q,
                        m,
                        value_mask=vm,
                        return_attention_scores=True,
                        training=True,
                    ),
                    {"q": X[:, :3], "m": MEM8, "vm": MEM_VALID},
                )
            )
    return cases


# (id, layer factory, call(layer, **inputs), inputs). Cases whose id ends in
# "cached" (incremental decoding) are traced forward only: decoding is
# inference, and TensorFlow has no gradient for the cache update
# (`XlaDynamicUpdateSlice`).
CASES = [
    (
        "mha",
        lambda: L.MultiHeadAttention(2, 4, dropout=0.1),
        lambda layer, **kw: _mha_call(
            layer, return_attention_scores=True, **kw
        ),
        {"q": X, "v": CTX, "qm": VALID, "vm": CTX_VALID},
    ),
    (
        "mha-gqa-dense",
        lambda: L.MultiHeadAttention(4, 4, num_key_value_heads=2),
        _scoped(
            "dense",
            lambda layer, **kw: _mha_call(
                layer, use_causal_mask=True, return_attention_scores=True, **kw
            ),
        ),
        {"q": X, "v": X, "qm": VALID, "vm": VALID},
    ),
    (
        "group-query-attention",
        lambda: L.GroupQueryAttention(4, 4, 2, use_gate=True, dropout=0.1),
        lambda layer, **kw: _mha_call(
            layer, use_causal_mask=True, return_attention_scores=True, **kw
        ),
        {"q": X, "v": X, "qm": VALID, "vm": VALID},
    ),
    (
        "multi-head-latent-attention",
        lambda: L.MultiHeadLatentAttention(
            2, 4, 2, 2, 3, q_lora_rank=4, dropout=0.1
        ),
        lambda layer, x, m: layer(
            x, query_mask=m, use_causal_mask=True, training=True
        ),
        {"x": X, "m": VALID},
    ),
    (
        "multi-head-latent-attention-absorbed-cached",
        lambda: L.MultiHeadLatentAttention(2, 4, 2, 2, 3),
        lambda layer, x, cache: layer(
            x, cache=cache, cache_update_index=2, use_causal_mask=True
        )[0],
        {"x": X[:, :1], "cache": np.zeros((2, 6, 6), "float32")},
    ),
    (
        "lightning-indexer",
        lambda: L.LightningIndexer(2, 4, 3),
        lambda layer, x, m: layer(x, padding_mask=m),
        {"x": X, "m": VALID},
    ),
    (
        "multi-head-latent-attention-indexer",  # top-k attention
        lambda: L.MultiHeadLatentAttention(
            2,
            4,
            2,
            2,
            3,
            q_lora_rank=4,
            indexer=dict(num_heads=2, head_dim=4, top_k=3),
        ),
        lambda layer, x, m: layer(x, query_mask=m, use_causal_mask=True),
        {"x": X, "m": VALID},
    ),
    (
        "linear-attention-gated-packed",
        lambda: L.LinearAttention(2, 4, decay="gated", chunk_size=4),
        lambda layer, x, m, ids: layer(
            x, query_mask=m, segment_ids=ids, use_causal_mask=True
        ),
        {"x": X, "m": VALID, "ids": np.repeat([[0, 0, 0, 1, 1, 1]], 2, 0)},
    ),
    (
        "gated-delta-net-packed",
        lambda: L.GatedDeltaNet(8, 1, 2, 4, 3, chunk_size=4),
        lambda layer, x, m, ids: layer(x, mask=m, segment_ids=ids),
        {"x": X10, "m": VALID10, "ids": np.repeat([[0] * 4 + [1] * 6], 2, 0)},
    ),
    (
        "gated-delta-net-cached",
        lambda: L.GatedDeltaNet(8, 1, 2, 4, 3, chunk_size=4),
        lambda layer, x, conv, state: layer(x, cache=(conv, state))[0],
        {
            "x": X[:, :1],
            "conv": np.zeros((2, 3, 14), "float32"),
            "state": np.zeros((2, 2, 4, 3), "float32"),
        },
    ),
    (
        "kimi-delta-attention-packed",
        lambda: L.KimiDeltaAttention(8, 2, 4, chunk_size=4),
        lambda layer, x, m, ids: layer(x, mask=m, segment_ids=ids),
        {"x": X10, "m": VALID10, "ids": np.repeat([[0] * 4 + [1] * 6], 2, 0)},
    ),
    (
        "kimi-delta-attention-cached",
        lambda: L.KimiDeltaAttention(8, 2, 4, chunk_size=4),
        lambda layer, x, conv, state: layer(x, cache=(conv, state))[0],
        {
            "x": X[:, :1],
            "conv": np.zeros((2, 3, 24), "float32"),
            "state": np.zeros((2, 2, 4, 4), "float32"),
        },
    ),
    (
        "self-attention-packed-blockwise",
        lambda: L.SelfAttention(4, 4, causal=True, rotary_max_wavelength=100),
        _scoped(
            "blockwise",
            lambda layer, x, ids: layer(x, segment_ids=ids),
        ),
        {
            "x": X,
            "ids": np.cumsum(np.eye(X.shape[1])[::2].sum(0))[None]
            .repeat(X.shape[0], 0)
            .astype("int32"),
        },
    ),
    (
        "graph-attention-edges",
        lambda: L.GraphAttention(2, 4),
        lambda layer, x, s, r: layer(
            x, edges=(s, r), return_attention_scores=True, training=True
        ),
        {
            "x": RNG.normal(size=(2, 7, 8)).astype("float32"),
            "s": np.array([0, 1, 2, 3, 4, 5, 6, 0], "int32"),
            "r": np.array([1, 2, 3, 4, 5, 6, 0, 3], "int32"),
        },
    ),
    (
        "graph-attention-adjacency",
        lambda: L.GraphAttention(2, 4, version="v1"),
        lambda layer, x, a: layer(x, edges=a, return_attention_scores=True),
        {
            "x": RNG.normal(size=(2, 7, 8)).astype("float32"),
            "a": RNG.random((2, 7, 7)) < 0.4,
        },
    ),
    (
        "mha-gqa-blockwise",
        lambda: L.MultiHeadAttention(4, 4, num_key_value_heads=2),
        _scoped(
            "blockwise",
            lambda layer, **kw: _mha_call(layer, use_causal_mask=True, **kw),
        ),
        {"q": X, "v": X, "qm": VALID, "vm": VALID},
    ),
    (
        "mha-mqa-blockwise-attention-mask",
        lambda: L.MultiHeadAttention(4, 4, num_key_value_heads=1),
        _scoped(
            "blockwise",
            lambda layer, q, v, qm, vm, am: layer(
                q, v, query_mask=qm, value_mask=vm, attention_mask=am
            ),
        ),
        {
            "q": X,
            "v": CTX,
            "qm": VALID,
            "vm": CTX_VALID,
            "am": RNG.random((2, 6, 5)) > 0.3,
        },
    ),
    (
        "mha-cached",
        lambda: L.MultiHeadAttention(4, 4, num_key_value_heads=2),
        lambda layer, q, cache: layer(q, q, cache=cache, cache_update_index=2),
        {"q": X[:, :1], "cache": np.zeros((2, 2, 6, 2, 4), "float32")},
    ),
    (
        "self",
        lambda: L.SelfAttention(2, 4, causal=True, dropout=0.1),
        lambda layer, x, m, am: layer(
            x,
            mask=m,
            attention_mask=am,
            return_attention_scores=True,
            training=True,
        ),
        {"x": X, "m": VALID, "am": np.asarray(masks.prefix_lm_mask(6, 2))},
    ),
    (
        "shared-kv-self",
        lambda: L.SharedKVSelfAttention(
            2,
            4,
            causal=True,
            kv_share=L.KVShare(),
            kv_share_role="source",
            values_from_keys=True,
            value_norm="rms",
            proportional_rotary=True,
            rotary_max_wavelength=100,
            rotary_fraction=0.5,
        ),
        lambda layer, x, m: layer(x, mask=m, return_attention_scores=True),
        {"x": X, "m": VALID},
    ),
    (
        "causal-self",
        lambda: L.CausalSelfAttention(2, 4),
        lambda layer, x, m: layer(x, mask=m, return_attention_scores=True),
        {"x": X, "m": VALID},
    ),
    (
        "cross",
        lambda: L.CrossAttention(2, 4, num_key_value_heads=1),
        lambda layer, q, c, qm, cm: layer(
            q, c, query_mask=qm, context_mask=cm, return_attention_scores=True
        ),
        {"q": X, "c": CTX, "qm": VALID, "cm": CTX_VALID},
    ),
    (
        "local-gqa-everything",
        lambda: L.LocalSelfAttention(
            4,
            4,
            window_size=(2, 1),
            block_size=4,
            num_key_value_heads=2,
            dropout=0.1,
        ),
        lambda layer, x, m, am: layer(
            x,
            mask=m,
            attention_mask=am,
            return_attention_scores=True,
            training=True,
        ),
        {"x": X10, "m": VALID10, "am": RNG.random((2, 4, 10, 10)) > 0.2},
    ),
    (
        "local-causal-default-block",
        lambda: L.LocalSelfAttention(2, 4, window_size=3, causal=True),
        lambda layer, x, m, am: layer(x, mask=m, attention_mask=am),
        {"x": X10, "m": VALID10, "am": RNG.random((10, 10)) > 0.2},
    ),
    (
        "local-mqa-scores",
        lambda: L.LocalSelfAttention(
            4, 2, window_size=2, num_key_value_heads=1
        ),
        lambda layer, x: layer(x, return_attention_scores=True),
        {"x": X10},
    ),
    (
        # DeBERTa's relative terms: 4 buckets saturate at distance 8 < 10.
        "disentangled-gqa",
        lambda: L.DisentangledSelfAttention(
            4,
            2,
            score_mod=keras_attention.scores.DisentangledRelativeBias(
                8, bucket_size=4, max_distance=8
            ),
            num_key_value_heads=2,
            dropout=0.1,
        ),
        lambda layer, x, m: layer(
            x, mask=m, return_attention_scores=True, training=True
        ),
        {"x": X10, "m": VALID10},
    ),
    (
        "pooling",
        lambda: L.AttentionPooling(units=8),
        lambda layer, x, m: layer(x, mask=m, return_attention_scores=True),
        {"x": X, "m": VALID},
    ),
    (
        "token-pooling",
        lambda: L.TokenPooling("last"),
        lambda layer, x, m: layer(x, padding_mask=m),
        {"x": X, "m": VALID},
    ),
    (
        "convolution-padding-mask",
        lambda: L.ConvolutionPaddingMask([3, 2], [2, 1]),
        # Its boolean mask weighs the frames (a float output to trace).
        lambda layer, x, m: keras.ops.where(
            layer(x[:, :2], padding_mask=m)[..., None], x[:, :2], 0.0
        ),
        {"x": X, "m": VALID},
    ),
    (
        "contrastive-logits",
        lambda: L.ContrastiveLogits(use_bias=True),
        lambda layer, v, t: layer(v, t),
        {"v": X[:, 0], "t": X[:, 1]},
    ),
    (
        "bahdanau-step",
        lambda: L.BahdanauAttention(6, normalize=True, dropout=0.1),
        lambda layer, q, m, vm: layer(
            q, m, value_mask=vm, return_attention_scores=True, training=True
        ),
        {"q": STATE, "m": CTX, "vm": CTX_VALID},
    ),
    (
        "bahdanau-sequence",
        lambda: L.BahdanauAttention(6),
        lambda layer, q, m, qm, vm: layer(
            q, m, query_mask=qm, value_mask=vm, return_attention_scores=True
        ),
        {"q": X, "m": CTX, "qm": VALID, "vm": CTX_VALID},
    ),
    *_luong_cases(),
    (
        "rnn-decoder-bahdanau-gru",
        lambda: L.AttentionRNNDecoder(8, L.BahdanauAttention(6), dropout=0.1),
        lambda layer, y, m, ym, mm: layer(
            y, m, mask=ym, memory_mask=mm, training=True
        ),
        {"y": X[:, :4, :5], "m": CTX, "ym": VALID[:, :4], "mm": CTX_VALID},
    ),
    (
        "rnn-decoder-luong-lstm",
        lambda: L.AttentionRNNDecoder(
            8,
            L.LuongAttention("concat", units=5, alignment="local-p", window=2),
            cell="lstm",
            attention_style="luong",
            return_attention_scores=True,
            return_state=True,
        ),
        lambda layer, y, m, mm: layer(y, m, memory_mask=mm),
        {"y": X[:, :4, :5], "m": CTX, "mm": CTX_VALID},
    ),
    (
        "encoder-bridge-gru",
        lambda: L.EncoderBridge(8),
        lambda layer, f, b: layer(f, b),
        {"f": STATE[:, :4], "b": STATE[:, 4:]},
    ),
    (
        "encoder-bridge-lstm",
        lambda: L.EncoderBridge(8, cell="lstm"),
        lambda layer, f, b, fc, bc: layer(f, b, fc, bc),
        {
            "f": STATE[:, :4],
            "b": STATE[:, 4:],
            "fc": STATE[:, 2:6],
            "bc": STATE[:, 1:5],
        },
    ),
    (
        "position-embedding",
        lambda: L.PositionEmbedding(10),
        lambda layer, x: layer(x, start_index=2),
        {"x": X},
    ),
    (
        "rotary",
        lambda: L.RotaryEmbedding(),
        lambda layer, x: layer(x, start_index=3),
        {"x": X.reshape(2, 6, 2, 4)},
    ),
    (
        "sinusoidal",
        lambda: L.SinusoidalPositionEncoding(),
        lambda layer, x: layer(x),
        {"x": X},
    ),
    (
        "token-and-position",
        lambda: L.TokenAndPositionEmbedding(20, 8, 8, mask_zero=True),
        lambda layer, ids: layer(ids),
        {"ids": np.array([[3, 5, 0], [1, 0, 0]], "int32")},
    ),
    (
        "feed-forward",
        lambda: L.FeedForward(16, dropout=0.1),
        lambda layer, x: layer(x, training=True),
        {"x": X},
    ),
    (
        "mixture-of-experts",
        lambda: L.MixtureOfExperts(
            4,
            2,
            8,
            routing="topk_softmax",
            router_bias=True,
            activation="gpt_oss_glu",
            expert_bias=True,
            router_aux_loss_coef=0.01,
            router_jitter_noise=0.1,
        ),
        lambda layer, x, m: layer(x, mask=m, training=True),
        {"x": X, "m": VALID},
    ),
    (
        "encoder-block",
        lambda: L.TransformerEncoderBlock(
            4,
            16,
            num_key_value_heads=2,
            dropout=0.1,
            norm_first=True,
            rotary_max_wavelength=100,
        ),
        lambda layer, x, m, am: layer(
            x,
            padding_mask=m,
            attention_mask=am,
            return_attention_scores=True,
            training=True,
        ),
        {"x": X, "m": VALID, "am": RNG.random((2, 6, 6)) > 0.2},
    ),
    (
        "encoder-block-window",
        lambda: L.TransformerEncoderBlock(
            4, 16, num_key_value_heads=2, window_size=2, dropout=0.1
        ),
        lambda layer, x, m: layer(
            x, padding_mask=m, return_attention_scores=True, training=True
        ),
        {"x": X10, "m": VALID10},
    ),
    (
        "decoder-block",
        lambda: L.TransformerDecoderBlock(
            4, 16, num_key_value_heads=2, dropout=0.1
        ),
        lambda layer, x, c, m, cm: layer(
            x,
            c,
            padding_mask=m,
            context_padding_mask=cm,
            return_attention_scores=True,
            training=True,
        ),
        {"x": X, "c": CTX, "m": VALID, "cm": CTX_VALID},
    ),
    (
        "decoder-block-window",
        lambda: L.TransformerDecoderBlock(
            4,
            16,
            num_key_value_heads=2,
            window_size=2,
            rotary_max_wavelength=100,
        ),
        lambda layer, x, c, m: layer(x, c, padding_mask=m, training=True),
        {"x": X10, "c": CTX, "m": VALID10},
    ),
    (
        "decoder-block-cached",
        lambda: L.TransformerDecoderBlock(
            4, 16, num_key_value_heads=2, cross_attention=False
        ),
        lambda layer, x, cache, valid: _decoder_cached(layer, x, cache, valid),
        {
            "x": X[:, :1],
            "cache": np.zeros((2, 2, 6, 2, 2), "float32"),
            "valid": VALID[:, :1],
        },
    ),
    (
        "decoder-block-window-cached",
        lambda: _built(
            L.TransformerDecoderBlock(
                4, 16, num_key_value_heads=2, window_size=2
            ),
            X[:, :2],
            CTX,
        ),
        lambda layer, x, cache, valid, ctx: _decoder_cached(
            layer, x, cache, valid, layer.compute_cross_attention_cache(ctx)
        ),
        {
            "x": X[:, :1],
            "cache": np.zeros((2, 2, 6, 2, 2), "float32"),
            "valid": VALID[:, :1],
            "ctx": CTX,
        },
    ),
]

# Options of Keras 3.15's MultiHeadAttention, when the layer has them.
OPTIONAL_MHA = [
    # Without the scores: for two attention axes Keras' API returns them as
    # (B, N, T1, T2, S1, S2), rank 6 by definition (a reshape, no kernel).
    (
        "mha-attention-axes",
        "attention_axes",
        lambda: L.MultiHeadAttention(2, 4, attention_axes=(1, 2)),
        lambda layer, x: layer(x, x, training=True),
        {"x": RNG.normal(size=(2, 3, 4, 8)).astype("float32")},
    ),
    (
        "mha-attention-axis-scores",
        "attention_axes",
        lambda: L.MultiHeadAttention(2, 4, attention_axes=2, dropout=0.1),
        lambda layer, x: layer(
            x, x, return_attention_scores=True, training=True
        ),
        {"x": RNG.normal(size=(2, 3, 4, 8)).astype("float32")},
    ),
    (
        "mha-attention-axes-blockwise",
        "attention_axes",
        lambda: L.MultiHeadAttention(2, 4, attention_axes=(1, 2)),
        _scoped("blockwise", lambda layer, x: layer(x, x)),
        {"x": RNG.normal(size=(2, 3, 4, 8)).astype("float32")},
    ),
    (
        "mha-gate",
        "use_gate",
        lambda: L.MultiHeadAttention(2, 4, use_gate=True),
        lambda layer, **kw: _mha_call(layer, **kw),
        {"q": X, "v": CTX, "qm": VALID, "vm": CTX_VALID},
    ),
    (
        "mha-sliding-window",
        "sliding_window",
        lambda: L.MultiHeadAttention(2, 4, sliding_window=2),
        lambda layer, q, m: layer(q, q, query_mask=m, value_mask=m),
        {"q": X10, "m": VALID10},
    ),
]


@pytest.mark.parametrize(
    "name,make,call,inputs", CASES, ids=[c[0] for c in CASES]
)
def test_layer_graph_has_no_tensor_above_rank_5(name, make, call, inputs):
    graph = trace_with_gradients(
        make(), call, inputs, gradients=not name.endswith("cached")
    )
    found = high_rank_tensors(graph)
    assert not found, f"tensors of rank > {MAX_RANK}: {found[:10]}"


@pytest.mark.parametrize(
    "arg,make,call,inputs",
    [c[1:] for c in OPTIONAL_MHA],
    ids=[c[0] for c in OPTIONAL_MHA],
)
def test_multi_head_attention_options_graph_rank(arg, make, call, inputs):
    if not _has_arg(L.MultiHeadAttention, arg):
        pytest.skip(f"MultiHeadAttention has no `{arg}` argument yet")
    found = high_rank_tensors(trace_with_gradients(make(), call, inputs))
    assert not found, f"tensors of rank > {MAX_RANK}: {found[:10]}"


def test_every_public_layer_is_covered():
    """A new public layer or block must get a case here."""
    covered = {type(make()).__name__ for _, make, _, _ in CASES}
    assert not public_layers.missing(covered)
