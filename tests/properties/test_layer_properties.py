"""Every public layer and block under Hypothesis: each draw either returns
the NumPy reference's result or raises `ValueError`/`TypeError` naming an
argument it got wrong.

Draws cover the constructors' arguments (valid ones as Python or NumPy
scalars; at most one wrong argument per draw: zero, negative, NaN,
infinite, fractional, huge, a string, a bool, None where None is no
value) and the calls' inputs (batch 1 or 2, sequence lengths 0, 1 and 3,
masks absent, all True, all False or mixed, values of either sign, huge
ones and NaN or infinities; wrong ranks and mask shapes, strings).

Properties:

- a draw wrong for a non-empty set of arguments raises `ValueError` or
  `TypeError` at construction, build or call, naming one of them (never
  another exception);
- a valid draw returns outputs of the documented shapes (those of
  `compute_output_spec`), equal to the NumPy reference computed with the
  layer's own weights (so no argument is silently ignored) and finite
  whenever the inputs are (huge values: finite, not compared, as float32
  rounding of scores of ~1e12 decides the softmax).

Cost (the ci profile: 25 draws per property): layers are tiny, built once
per distinct constructor draw (`_layer` caches them), and the input
shapes come from a few fixed sizes, so that JAX reuses its compiled ops.
"""

import keras
import numpy as np
import public_layers
import pytest
from hypothesis import event
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from keras import ops
from references import masked_softmax
from references import mixture_of_experts as reference_moe
from references import multi_head_latent_attention as reference_mla

from keras_attention import layers as ka
from keras_attention.blocks import TransformerDecoderBlock
from keras_attention.blocks import TransformerEncoderBlock

# Keras warns on a softmax over one key; here that is the right answer.
pytestmark = pytest.mark.filterwarnings(
    "ignore:You are using a softmax over axis"
)

BACKEND = keras.backend.backend()
# Eager JAX compiles every op for every new shape and layer: half the
# profile's draws there keep this file within ~90 s on two cores.
DRAWS = settings(
    max_examples=max(
        1, settings.default.max_examples // (2 if BACKEND == "jax" else 1)
    )
)
LENGTHS = (0, 1, 3)
BATCHES = (1, 2)
FEATURES = 4
NAN, INF = float("nan"), float("inf")


def np_(x):
    return ops.convert_to_numpy(ops.cast(x, "float32")).astype("float64")


# --- Argument strategies ---------------------------------------------------
#
# Each argument: (valid values strategy, wrong values). `_draw_args` draws
# every argument valid, or one of them wrong (then its name is expected in
# the error).


def ints(lo, hi):
    """Python or NumPy integers in [lo, hi]."""
    return st.builds(
        lambda n, t: t(n),
        st.integers(lo, hi),
        st.sampled_from([int, np.int64, np.int32]),
    )


def one_of_values(*values):
    return st.sampled_from(values)


BAD_INTS = (0, -1, 2.5, "2", True, np.float32(2.0), NAN, INF, [2])
BAD_RATES = (1.0, -0.1, NAN, INF, "0.1", True, None)
BAD_BOOLS = ("True", 1, None, 0.0)
BAD_WAVELENGTHS = (0, -1.0, NAN, INF, -INF, 0.5, 1e-300, 10**400, "1e4", True)
RATES = one_of_values(0.0, 0.25, np.float32(0.5), 0)
# The factor of the scores (None: 1 / sqrt(key_dim)).
SCALES = st.one_of(st.none(), one_of_values(1.0, 0.3, np.float32(2.0), 3))
BAD_SCALES = (0, -1.0, NAN, INF, "1.0", True)


def _halves(shape, dtype=None):
    """A plain function as an initializer (issue 23, item 14)."""
    return ops.full(shape, 0.5, dtype=dtype)


INITIALIZERS = one_of_values("glorot_uniform", "he_normal", _halves)
BOOLS = one_of_values(True, False, np.bool_(True), np.bool_(False))
WAVELENGTHS = one_of_values(1, 10, 100.0, np.float32(50.0), 1e300, np.int64(7))


def _draw_args(data, spec):
    """`(kwargs, bad)`: every argument of `spec` drawn valid, or (about a
    fifth of the draws) one of them drawn wrong, `bad` its name."""
    wrong_able = [name for name, (_, wrong) in spec.items() if wrong]
    bad = data.draw(
        st.sampled_from([None] * (4 * len(wrong_able)) + wrong_able)
    )
    kwargs = {}
    for name, (valid, wrong) in spec.items():
        if name == bad:
            kwargs[name] = data.draw(st.sampled_from(wrong), label=name)
        else:
            kwargs[name] = data.draw(valid, label=name)
    return kwargs, ({bad} if bad else set())


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _key(kwargs):
    """A hashable key of constructor arguments (NumPy scalars as their
    type and value: `np.int64(2)` and `2` build different layers)."""
    return tuple(
        (k, type(v).__name__, repr(v)) for k, v in sorted(kwargs.items())
    )


_LAYERS = {}


def _layer(cls, kwargs, build, shapes=()):
    """`cls(**kwargs)`, built by `build(layer)` (on inputs of `shapes`);
    cached per argument and shape draw (the first build sets the weights,
    later draws reuse them)."""
    key = (cls.__name__, _key(kwargs), shapes)
    if key not in _LAYERS:
        layer = cls(**kwargs)
        build(layer)
        _randomize(layer)
        _LAYERS[key] = layer
    return _LAYERS[key]


def _randomize(layer):
    """Non-zero biases and vectors (zeros hide a bias that is not added)."""
    rng = np.random.default_rng(5)
    for w in layer.weights:
        if len(w.shape) <= 1 and w.dtype != "int32":
            w.assign((rng.normal(size=w.shape) * 0.5).astype(w.dtype))


def _names(error, bad):
    """Whether the message of `error` names one of the arguments `bad`."""
    message = str(error)
    return any(name in message for name in bad)


def expect(run, bad):
    """Runs `run()`: with wrong arguments `bad`, a `ValueError` or
    `TypeError` naming one of them; else the result."""
    if not bad:
        event("valid draw")
        return run()
    event("wrong draw")
    with pytest.raises((ValueError, TypeError)) as info:
        run()
    assert _names(info.value, bad), (
        f"the error does not name any of {sorted(bad)}: {info.value}"
    )
    return None


# --- Input strategies -------------------------------------------------------


@st.composite
def sequences(draw, batch, length, features=FEATURES):
    """`(array, finite, huge)`: a `(batch, length, features)` float32 array
    of one of a few seeds, scaled (either sign, or huge), with a NaN or an
    infinity at some position in a few draws."""
    seed = draw(st.integers(0, 3))
    scale = draw(st.sampled_from([1.0, -2.0, 0.5, 1.0, -1.0, 1e6]))
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(batch, length, features)) * scale).astype("float32")
    special = draw(st.sampled_from([None] * 12 + [NAN, INF, -INF]))
    if special is not None and x.size:
        x.reshape(-1)[draw(st.integers(0, x.size - 1))] = special
    return x, bool(np.all(np.isfinite(x))), scale == 1e6


@st.composite
def masks(draw, batch, length):
    """None, or a boolean `(batch, length)` mask: all True, all False or
    mixed."""
    kind = draw(st.sampled_from(["none", "true", "false", "mixed"]))
    if kind == "none":
        return None
    if kind == "true":
        return np.ones((batch, length), bool)
    if kind == "false":
        return np.zeros((batch, length), bool)
    seed = draw(st.integers(0, 3))
    return np.random.default_rng(seed).random((batch, length)) < 0.6


def _valid(mask, batch, length):
    return np.ones((batch, length), bool) if mask is None else mask


def _check_outputs(outputs, specs, references, finite, huge, atol=2e-4):
    """Shapes of `specs`, values of `references` (finite inputs only),
    no NaN or infinity from finite inputs."""
    outputs = [o for o in keras.tree.flatten(outputs)]
    specs = keras.tree.flatten(specs)
    assert len(outputs) == len(specs)
    for i, (o, s) in enumerate(zip(outputs, specs)):
        # None: a size the spec cannot know (the global slots counted
        # from a concrete global_mask).
        assert len(o.shape) == len(s.shape) and all(
            w is None or g == w for g, w in zip(o.shape, s.shape)
        ), f"output {i}: shape {tuple(o.shape)}, documented {tuple(s.shape)}"
    if not finite:
        event("valid: non-finite inputs, shapes checked")
        return
    values = [np_(o) for o in outputs]
    for i, v in enumerate(values):
        assert np.all(np.isfinite(v)), f"output {i} is not finite"
    if huge:
        event("valid: huge inputs, finite")
        return
    event("valid: compared with the reference")
    for i, (v, r) in enumerate(zip(values, references)):
        if r is None:
            continue
        scale = max(1.0, float(np.max(np.abs(r), initial=0.0)))
        np.testing.assert_allclose(
            v, r, atol=atol * scale, rtol=1e-3, err_msg=f"output {i}"
        )


# --- NumPy references (float64, with the layers' own weights) ---------------


def _w(x):
    return None if x is None else np_(x)


def _rotate(x, max_wavelength, start=0):
    """Rotary positions on `(b, t, ..., d)` (`RotaryEmbedding`)."""
    d = x.shape[-1]
    t = x.shape[1]
    theta = float(max_wavelength) ** (-2.0 * np.arange(d // 2) / d)
    angles = (np.arange(t) + start)[:, None] * theta[None, :]
    shape = (1, t) + (1,) * (x.ndim - 3) + (d // 2,)
    cos, sin = np.cos(angles).reshape(shape), np.sin(angles).reshape(shape)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _dense(layer, x):
    """An `EinsumDense` projection `(b, t, d) -> (b, t, heads, dim)` (or
    the output projection `(b, t, h, e) -> (b, t, *out)`)."""
    kernel = _w(layer.kernel)
    if x.ndim == 3:
        y = np.einsum("btd,dhk->bthk", x, kernel)
    else:
        y = np.tensordot(x, kernel, axes=([2, 3], [0, 1]))
    if layer.bias is not None:
        y = y + _w(layer.bias)
    return y


def mha_reference(layer, query, value, key, mask):
    """`MultiHeadAttention` on rank-3 inputs: projections, rotary
    positions, grouped heads, masked softmax (`mask` broadcastable to
    `(b, h, i, j)`), gate, output projection. Returns (output, weights)."""
    q = _dense(layer.query_dense, query)
    k = _dense(layer.key_dense, key)
    if getattr(layer, "values_from_keys", False):  # Gemma 4's K = V
        v = k
    else:
        v = _dense(layer.value_dense, value)
    if getattr(layer, "value_norm", None) == "rms":  # Gemma 4's v-norm
        epsilon = layer.qk_norm_epsilon
        v = v / np.sqrt(np.mean(v**2, -1, keepdims=True) + epsilon)
    if layer.rotary_max_wavelength is not None:
        q = _rotate(q, layer.rotary_max_wavelength)
        k = _rotate(k, layer.rotary_max_wavelength)
    h, g = q.shape[2], k.shape[2]
    k, v = np.repeat(k, h // g, axis=2), np.repeat(v, h // g, axis=2)
    scale = getattr(layer, "attention_scale", None)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = np.einsum("bihk,bjhk->bhij", q, k) * scale
    weights = masked_softmax(scores, np.broadcast_to(mask, scores.shape))
    out = np.einsum("bhij,bjhe->bihe", weights, v)
    if layer.use_gate:
        out = out / (1.0 + np.exp(-_dense(layer._gate_dense, query)))
    return _dense(layer.output_dense, out), weights


def _attention_mask(batch, tq, tk, query_valid, key_valid, causal=False):
    mask = query_valid[:, None, :, None] & key_valid[:, None, None, :]
    if causal:
        mask = mask & np.tril(np.ones((tq, tk), bool))[None, None]
    return mask


def _band(t, left, right):
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    return (j >= i - left) & (j <= i + right)


# --- Multi-head attention layers --------------------------------------------

HEADS = {
    "num_heads": (ints(1, 3), BAD_INTS),
    "key_dim": (ints(1, 3), BAD_INTS),
}


def _mha_spec():
    return dict(
        HEADS,
        value_dim=(st.one_of(st.none(), ints(1, 3)), BAD_INTS),
        num_key_value_heads=(st.one_of(st.none(), ints(1, 3)), BAD_INTS),
        attention_scale=(SCALES, BAD_SCALES),
        output_shape=(
            st.one_of(st.none(), ints(1, 3), st.tuples(ints(1, 2), ints(1, 2))),
            (0, "3", 2.0, (), (2, 0)),
        ),
        use_bias=(BOOLS, BAD_BOOLS),
        kernel_initializer=(INITIALIZERS, ()),
        bias_initializer=(INITIALIZERS, ()),
        use_gate=(BOOLS, BAD_BOOLS),
        dropout=(RATES, BAD_RATES),
        sliding_window=(
            st.one_of(st.none(), ints(1, 3), st.just(10**12)),
            (0, -2, 1.5, "2", True),
        ),
        attention_axes=(
            st.sampled_from([None, 1, -2, (1,), [-2]]),
            (0, 2, (5,), (1, 1), -1, "1", 1.5, ()),
        ),
        rotary_max_wavelength=(
            st.one_of(st.none(), WAVELENGTHS),
            BAD_WAVELENGTHS,
        ),
        flash_attention=(st.sampled_from([None, False]), ("no", 2)),
        seed=(st.one_of(st.none(), ints(0, 5)), ("1", 1.5, True)),
    )


def _int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    )


def _joint_errors(kwargs):
    """Arguments wrong together (each valid alone; either may be named)."""
    bad = set()
    heads, kv = kwargs["num_heads"], kwargs.get("num_key_value_heads")
    if _int(heads) and _int(kv) and heads > 0 and kv > 0 and heads % kv:
        bad |= {"num_key_value_heads", "num_heads"}
    key_dim = kwargs.get("key_dim")
    if (
        kwargs.get("rotary_max_wavelength") is not None
        and _int(key_dim)
        and key_dim > 0
        and key_dim % 2
    ):
        bad |= {"rotary_max_wavelength", "key_dim"}
    return bad


def _mha_window_mask(layer, tq, tk, causal):
    w = layer.sliding_window
    if w is None:
        return np.ones((tq, tk), bool)
    i, j = np.arange(tq)[:, None], np.arange(tk)[None, :]
    if causal:
        return (j <= i) & (j > i - w)
    return np.abs(i - j) < w


def _check_against_mha_reference(
    layer, outputs, query, value, call, attention, finite, huge
):
    """A `MultiHeadAttention`-like layer's outputs of `layer(query, value,
    **call)` against `mha_reference` (padding, causal, window and the
    optional `attention` `(b, Tq, Tk)` masks) and its output spec."""
    batch, tq, tk = query.shape[0], query.shape[1], value.shape[1]
    causal = call["use_causal_mask"]
    scores = call["return_attention_scores"]
    specs = layer.compute_output_spec(
        keras.KerasTensor(query.shape),
        keras.KerasTensor(value.shape),
        return_attention_scores=scores,
    )
    mask = _attention_mask(
        batch,
        tq,
        tk,
        _valid(call["query_mask"], batch, tq),
        _valid(call["value_mask"], batch, tk),
        causal,
    )
    mask = mask & _mha_window_mask(layer, tq, tk, causal)
    if attention is not None:
        mask = mask & attention[:, None]
    out, weights = mha_reference(layer, query, value, value, mask)
    references = [out, weights] if scores else [out]
    _check_outputs(outputs, specs, references, finite, huge)


@DRAWS
@given(st.data())
def test_multi_head_attention(data):
    kwargs, bad = _draw_args(data, _mha_spec())
    bad = bad | _joint_errors(kwargs)
    batch = data.draw(st.sampled_from(BATCHES))
    tq = data.draw(st.sampled_from(LENGTHS), label="Tq")
    self_attention = data.draw(st.booleans(), label="self")
    tk = tq if self_attention else data.draw(st.sampled_from(LENGTHS))
    query, q_finite, q_huge = data.draw(sequences(batch, tq))
    if self_attention:
        value, v_finite, v_huge = query, q_finite, q_huge
    else:
        value, v_finite, v_huge = data.draw(sequences(batch, tk, 3))
    query_mask = data.draw(masks(batch, tq), label="query_mask")
    value_mask = data.draw(masks(batch, tk), label="value_mask")
    causal = data.draw(st.booleans(), label="use_causal_mask")
    scores = data.draw(st.booleans(), label="return_attention_scores")
    call_bad = data.draw(
        st.sampled_from([None] * 12 + ["query", "query_mask", "attention_mask"])
    )
    call = dict(
        query_mask=query_mask,
        value_mask=value_mask,
        use_causal_mask=causal,
        return_attention_scores=scores,
    )
    attention = None
    if data.draw(st.booleans(), label="attention_mask"):
        seed = data.draw(st.integers(0, 3))
        attention = np.random.default_rng(seed).random((batch, tq, tk)) < 0.7
        call["attention_mask"] = attention
    if call_bad == "query":
        query = query[:, 0] if tq else query[:, :, :, None]
    elif call_bad == "query_mask":
        call["query_mask"] = np.ones((batch, tq + 1), bool)
    elif call_bad == "attention_mask":
        call["attention_mask"] = np.ones((batch, tq + 2, tk), bool)
    if call_bad:
        bad = bad | {call_bad}

    def run():
        layer = _layer(
            ka.MultiHeadAttention,
            kwargs,
            lambda layer: layer(
                np.zeros((1, 1, FEATURES), "float32"),
                np.zeros((1, 1, value.shape[-1]), "float32"),
            ),
            shapes=(value.shape[-1],),
        )
        return layer, layer(query, value, **call)

    result = expect(run, bad)
    if result is None:
        return
    layer, outputs = result
    _check_against_mha_reference(
        layer,
        outputs,
        query,
        value,
        call,
        attention,
        q_finite and v_finite,
        q_huge or v_huge,
    )


def _gqa_spec():
    return dict(
        head_dim=(ints(1, 3), BAD_INTS),
        num_query_heads=(st.sampled_from([2, 4]), BAD_INTS),
        num_key_value_heads=(st.sampled_from([1, 2]), BAD_INTS),
        use_bias=(BOOLS, BAD_BOOLS),
        kernel_initializer=(INITIALIZERS, ()),
        use_gate=(BOOLS, BAD_BOOLS),
        dropout=(RATES, BAD_RATES),
        sliding_window=(st.one_of(st.none(), ints(1, 3)), (0, -2, 1.5, "2")),
        seed=(st.one_of(st.none(), ints(0, 5)), ("1", 1.5, True)),
    )


@DRAWS
@given(st.data())
def test_group_query_attention(data):
    kwargs, bad = _draw_args(data, _gqa_spec())
    batch = data.draw(st.sampled_from(BATCHES))
    tq = data.draw(st.sampled_from(LENGTHS), label="Tq")
    tk = data.draw(st.sampled_from(LENGTHS), label="Tk")
    query, q_finite, q_huge = data.draw(sequences(batch, tq))
    value, v_finite, v_huge = data.draw(sequences(batch, tk))
    query_mask = data.draw(masks(batch, tq), label="query_mask")
    value_mask = data.draw(masks(batch, tk), label="value_mask")
    causal = data.draw(st.booleans(), label="use_causal_mask")
    scores = data.draw(st.booleans(), label="return_attention_scores")
    wrong_value = data.draw(st.sampled_from([False] * 8 + [True]))
    if wrong_value:  # Keras's rule: query and value feature sizes agree.
        value = np.concatenate([value, value[..., :1]], axis=-1)
        bad = bad | {"value_shape", "query_shape"}
    call = dict(
        query_mask=query_mask,
        value_mask=value_mask,
        use_causal_mask=causal,
        return_attention_scores=scores,
    )

    def run():
        layer = _layer(
            ka.GroupQueryAttention,
            kwargs,
            lambda layer: layer(
                np.zeros((1, 1, FEATURES), "float32"),
                np.zeros((1, 1, FEATURES), "float32"),
            ),
        )
        return layer, layer(query, value, **call)

    result = expect(run, bad)
    if result is None:
        return
    layer, outputs = result
    _check_against_mha_reference(
        layer,
        outputs,
        query,
        value,
        call,
        None,
        q_finite and v_finite,
        q_huge or v_huge,
    )


def _mla_spec():
    return dict(
        num_heads=(ints(1, 2), BAD_INTS),
        kv_lora_rank=(ints(1, 3), BAD_INTS),
        qk_nope_head_dim=(ints(1, 2), BAD_INTS),
        qk_rope_head_dim=(st.sampled_from([2, 4]), (3, 0, -2, 2.5, "2", True)),
        v_head_dim=(ints(1, 2), BAD_INTS),
        q_lora_rank=(st.one_of(st.none(), ints(1, 3)), (0, -1, 2.5, "2")),
        rope_theta=(WAVELENGTHS, BAD_WAVELENGTHS),
        rope_interleave=(BOOLS, BAD_BOOLS),
        attention_bias=(BOOLS, BAD_BOOLS),
        rms_norm_eps=(
            one_of_values(1e-6, 1e-3, np.float32(1e-5)),
            (0, -1.0, NAN, INF, "1e-6"),
        ),
        dropout=(RATES, BAD_RATES),
        absorb=(st.one_of(st.none(), BOOLS), ("True", 1, 0.0)),
    )


def mla_reference(layer, x, valid, causal):
    """`MultiHeadLatentAttention` (naive form) in float64
    (`references.multi_head_latent_attention`) with the padding `valid`
    of queries and keys, and the causal mask if `causal`."""
    b, t, _ = x.shape
    mask = _attention_mask(b, t, t, valid, valid, causal)[:, 0]
    return reference_mla(layer, x, mask)[0]


@DRAWS
@given(st.data())
def test_multi_head_latent_attention(data):
    kwargs, bad = _draw_args(data, _mla_spec())
    batch = data.draw(st.sampled_from(BATCHES))
    t = data.draw(st.sampled_from(LENGTHS), label="T")
    x, finite, huge = data.draw(sequences(batch, t))
    mask = data.draw(masks(batch, t), label="query_mask")
    causal = data.draw(st.booleans(), label="use_causal_mask")
    if data.draw(st.sampled_from([False] * 8 + [True])):
        mask, bad = np.ones((batch, t + 1), bool), bad | {"query_mask"}

    def run():
        layer = _layer(
            ka.MultiHeadLatentAttention,
            kwargs,
            lambda layer: layer(np.zeros((1, 1, FEATURES), "float32")),
        )
        return layer, layer(x, query_mask=mask, use_causal_mask=causal)

    result = expect(run, bad)
    if result is None:
        return
    layer, out = result
    valid = _valid(mask, batch, t)
    reference = mla_reference(layer, x.astype("float64"), valid, causal)
    spec = layer.compute_output_spec(keras.KerasTensor(x.shape))
    _check_outputs([out], [spec], [reference], finite, huge)


def _graph_spec():
    return dict(
        num_heads=(ints(1, 3), BAD_INTS),
        units_per_head=(ints(1, 3), BAD_INTS),
        version=(st.sampled_from(["v1", "v2"]), ("v3", 2, None)),
        concat_heads=(BOOLS, BAD_BOOLS),
        add_self_loops=(BOOLS, BAD_BOOLS),
        use_bias=(BOOLS, BAD_BOOLS),
    )


@DRAWS
@given(st.data())
def test_graph_attention(data):
    """Properties without a reference (the NumPy reference of both papers
    is in tests/layers/test_graph_attention.py): relabelling the nodes
    permutes the outputs, coefficients of each receiver sum to 1 (or 0
    without incoming edges), outputs are finite for finite inputs, and
    an isolated node changes no other node."""
    kwargs, bad = _draw_args(data, _graph_spec())
    nodes = data.draw(st.integers(1, 6), label="nodes")
    seed = data.draw(st.integers(0, 3))
    rng = np.random.default_rng(seed)
    edges = data.draw(st.integers(0, 12), label="edges")
    senders = rng.integers(0, nodes, edges).astype("int32")
    receivers = rng.integers(0, nodes, edges).astype("int32")
    x = rng.normal(size=(nodes, FEATURES)).astype("float32")
    call_bad = data.draw(st.sampled_from([None] * 8 + ["edges"]))
    if call_bad:
        receivers = receivers[:-1] if edges else np.zeros((2, 2), "float32")
        bad = bad | {"edges", "senders", "receivers"}

    def run():
        layer = _layer(
            ka.GraphAttention,
            kwargs,
            lambda layer: layer(
                np.zeros((2, FEATURES), "float32"),
                edges=(np.array([0], "int32"), np.array([1], "int32")),
            ),
        )
        return layer, layer(
            x, edges=(senders, receivers), return_attention_scores=True
        )

    result = expect(run, bad)
    if result is None:
        return
    layer, (out, alpha) = result
    out, alpha = np_(out), np_(alpha)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(alpha))
    # Coefficients: the given edges, then one self-loop per node.
    all_receivers = receivers
    if layer.add_self_loops:
        all_receivers = np.concatenate([receivers, np.arange(nodes)])
    assert alpha.shape[0] == len(all_receivers)
    sums = np.zeros((nodes, alpha.shape[1]))
    np.add.at(sums, all_receivers, alpha)
    has_input = np.isin(np.arange(nodes), all_receivers)
    np.testing.assert_allclose(sums[has_input], 1.0, atol=1e-5)
    # Relabelling the nodes permutes the outputs.
    perm = rng.permutation(nodes)
    inverse = np.argsort(perm)
    out_p = np_(layer(x[perm], edges=(inverse[senders], inverse[receivers])))
    np.testing.assert_allclose(out_p, out[perm], atol=2e-5)
    # An isolated extra node changes no other node.
    x_plus = np.concatenate([x, rng.normal(size=(1, FEATURES))], 0)
    out_plus = np_(layer(x_plus.astype("float32"), edges=(senders, receivers)))
    np.testing.assert_allclose(out_plus[:nodes], out, atol=2e-5)


SELF_CLASSES = {
    "SelfAttention": ka.SelfAttention,
    "CausalSelfAttention": ka.CausalSelfAttention,
    "LocalSelfAttention": ka.LocalSelfAttention,
    "SharedKVSelfAttention": ka.SharedKVSelfAttention,
}


@DRAWS
@given(st.data())
def test_self_attention_layers(data):
    name = data.draw(st.sampled_from(sorted(SELF_CLASSES)), label="class")
    cls = SELF_CLASSES[name]
    spec = dict(
        HEADS,
        num_key_value_heads=(st.one_of(st.none(), ints(1, 2)), BAD_INTS),
        use_gate=(BOOLS, BAD_BOOLS),
        causal=(BOOLS, BAD_BOOLS),
        rotary_max_wavelength=(
            st.one_of(st.none(), WAVELENGTHS),
            BAD_WAVELENGTHS,
        ),
    )
    if cls is ka.LocalSelfAttention:
        spec.update(
            window_size=(
                st.one_of(
                    ints(0, 3),
                    st.tuples(ints(0, 3), ints(0, 3)),
                    st.just(10**9),
                ),
                (-1, 2.5, "2", True, (1, 2, 3), (1, -1), None),
            ),
            block_size=(
                st.one_of(st.none(), ints(1, 4), st.just(10**6)),
                BAD_INTS,
            ),
            max_global_tokens=(
                st.one_of(st.none(), ints(1, 2)),
                BAD_INTS,
            ),
        )
    if cls is ka.SharedKVSelfAttention:
        # Rotating the whole head, proportional_rotary is the plain RoPE.
        spec.update(
            values_from_keys=(BOOLS, BAD_BOOLS),
            value_norm=(st.sampled_from([None, "rms"]), ("RMS", "l2", 1)),
            proportional_rotary=(BOOLS, BAD_BOOLS),
        )
    kwargs, bad = _draw_args(data, spec)
    bad = bad | _joint_errors(kwargs)
    proportional = kwargs.get("proportional_rotary")
    if isinstance(proportional, (bool, np.bool_)) and proportional:
        if kwargs["rotary_max_wavelength"] is None:
            bad = bad | {"proportional_rotary", "rotary_max_wavelength"}
    batch = data.draw(st.sampled_from(BATCHES))
    t = data.draw(st.sampled_from(LENGTHS), label="T")
    x, finite, huge = data.draw(sequences(batch, t))
    mask = data.draw(masks(batch, t), label="mask")
    scores = data.draw(st.booleans(), label="return_attention_scores")
    call = dict(mask=mask, return_attention_scores=scores)
    global_mask = None
    if cls is ka.LocalSelfAttention and data.draw(st.booleans()):
        seed = data.draw(st.integers(0, 3))
        global_mask = np.random.default_rng(seed).random((batch, t)) < 0.3
        call["global_mask"] = global_mask
    call_bad = data.draw(st.sampled_from([None] * 12 + ["inputs", "mask"]))
    if call_bad == "inputs":
        x = x[:, 0] if t else x[None]
    elif call_bad == "mask":
        call["mask"] = np.ones((batch, t + 1), bool)
    if call_bad:
        bad = bad | {call_bad, "query"}

    def run():
        layer = _layer(
            cls,
            kwargs,
            lambda layer: layer(np.zeros((1, 2, FEATURES), "float32")),
        )
        return layer, layer(x, **call)

    result = expect(run, bad)
    if result is None:
        return
    layer, outputs = result
    specs = layer.compute_output_spec(
        keras.KerasTensor(x.shape),
        return_attention_scores=scores,
        global_mask=None
        if global_mask is None
        else keras.KerasTensor(global_mask.shape, "bool"),
    )
    valid = _valid(mask, batch, t)
    dense_mask = _attention_mask(batch, t, t, valid, valid, layer.causal)
    if cls is ka.LocalSelfAttention:
        left, right = layer.window_bounds
        allowed = np.broadcast_to(_band(t, left, right), (batch, t, t))
        if global_mask is not None:
            slots = layer.max_global_tokens
            if slots is None:
                slots = max(int(global_mask.sum(1).max(initial=0)), 1)
            is_global = global_mask & (np.cumsum(global_mask, 1) <= slots)
            allowed = allowed | is_global[:, :, None] | is_global[:, None, :]
        dense_mask = dense_mask & allowed[:, None]
    out, weights = mha_reference(layer, x, x, x, dense_mask)
    references = [out]
    if scores:
        if cls is ka.LocalSelfAttention:
            dense = layer.scores_to_dense(outputs[1])
            references.append(None)  # banded: compared through dense
            if finite and not huge:
                np.testing.assert_allclose(
                    np_(dense), weights, atol=2e-4, rtol=1e-3
                )
        else:
            references.append(weights)
    _check_outputs(outputs, specs, references, finite, huge)


@DRAWS
@given(st.data())
def test_cross_attention(data):
    kwargs, bad = _draw_args(
        data,
        dict(HEADS, value_dim=(st.one_of(st.none(), ints(1, 3)), BAD_INTS)),
    )
    batch = data.draw(st.sampled_from(BATCHES))
    tq, tc = (
        data.draw(st.sampled_from(LENGTHS)),
        data.draw(st.sampled_from(LENGTHS)),
    )
    query, q_finite, q_huge = data.draw(sequences(batch, tq))
    context, c_finite, c_huge = data.draw(sequences(batch, tc, 3))
    query_mask = data.draw(masks(batch, tq))
    context_mask = data.draw(masks(batch, tc))
    call = dict(
        query_mask=query_mask,
        context_mask=context_mask,
        return_attention_scores=True,
    )
    call_bad = data.draw(st.sampled_from([None] * 8 + ["context_mask"]))
    if call_bad:
        call["context_mask"] = np.ones((batch, tc + 1), bool)
        bad = bad | {call_bad}

    def run():
        layer = _layer(
            ka.CrossAttention,
            kwargs,
            lambda layer: layer(
                np.zeros((1, 1, FEATURES), "float32"),
                np.zeros((1, 1, 3), "float32"),
            ),
        )
        return layer, layer(query, context, **call)

    result = expect(run, bad)
    if result is None:
        return
    layer, outputs = result
    specs = layer.compute_output_spec(
        keras.KerasTensor(query.shape),
        keras.KerasTensor(context.shape),
        return_attention_scores=True,
    )
    mask = _attention_mask(
        batch,
        tq,
        tc,
        _valid(query_mask, batch, tq),
        _valid(context_mask, batch, tc),
    )
    out, weights = mha_reference(layer, query, context, context, mask)
    _check_outputs(
        outputs,
        specs,
        [out, weights],
        q_finite and c_finite,
        q_huge or c_huge,
    )


# --- Encoder-decoder attention -------------------------------------------


def bahdanau_reference(layer, query, value, value_valid, query_valid):
    wq, wk = _w(layer.query_dense.kernel), _w(layer.key_dense.kernel)
    v = _w(layer.attention_v)
    b = _w(layer.attention_bias) if layer.use_bias else 0.0
    if layer.normalize:
        v = _w(layer.attention_g) * v / max(np.linalg.norm(v), 1e-6)
    hidden = np.tanh((query @ wq)[:, :, None] + (value @ wk)[:, None] + b)
    mask = value_valid[:, None, :] & query_valid[:, :, None]
    weights = masked_softmax(hidden @ v, mask)
    return weights @ value, weights


def luong_reference(layer, query, value, value_valid, query_valid):
    d = query.shape[-1]
    if layer.score_mode == "dot":
        scores = np.einsum("bid,bjd->bij", query, value)
    elif layer.score_mode == "general":
        scores = np.einsum(
            "bid,bjd->bij", query, value @ _w(layer.key_dense.kernel)
        )
    else:
        kernel = _w(layer.concat_kernel)
        hidden = np.tanh(
            (query @ kernel[:d])[:, :, None] + (value @ kernel[d:])[:, None]
        )
        scores = hidden @ _w(layer.attention_v)
    if layer.scale is True:
        scores = scores / np.sqrt(
            layer.units if layer.score_mode == "concat" else d
        )
    elif layer.scale == "learned":
        scores = scores * _w(layer.scale_factor)
    mask = value_valid[:, None, :] & query_valid[:, :, None]
    s = np.arange(value.shape[1])[None, None, :]
    if layer.alignment == "local-m":
        p = np.broadcast_to(np.arange(query.shape[1]), query.shape[:2])
        mask = mask & (np.abs(s - p[..., None]) <= layer.window)
    weights = masked_softmax(scores, mask)
    return weights @ value, weights


@DRAWS
@given(st.data())
def test_seq2seq_attention(data):
    kind = data.draw(st.sampled_from(["bahdanau", "luong"]), label="class")
    if kind == "bahdanau":
        cls = ka.BahdanauAttention
        spec = dict(
            units=(ints(1, 3), BAD_INTS + (None,)),
            normalize=(BOOLS, BAD_BOOLS),
            use_bias=(BOOLS, BAD_BOOLS),
            dropout=(RATES, BAD_RATES),
            seed=(st.one_of(st.none(), ints(0, 3)), ("1", True)),
        )
    else:
        cls = ka.LuongAttention
        spec = dict(
            score_mode=(
                st.sampled_from(["dot", "general", "concat"]),
                ("Dot", None, 1),
            ),
            scale=(
                st.sampled_from([False, True, "learned", np.bool_(True)]),
                ("True", 1, None),
            ),
            alignment=(
                st.sampled_from(["global", "local-m"]),
                ("local", None),
            ),
            dropout=(RATES, BAD_RATES),
        )
    kwargs, bad = _draw_args(data, spec)
    if cls is ka.LuongAttention:
        if kwargs["score_mode"] == "concat":
            kwargs["units"] = data.draw(ints(1, 3))
        if kwargs["alignment"] == "local-m":
            kwargs["window"] = data.draw(
                st.one_of(
                    ints(0, 2),
                    st.just(10**9),
                    st.sampled_from([-1, 1.5, None]),
                )
            )
            w = kwargs["window"]
            if w is None or not isinstance(w, (int, np.integer)) or w < 0:
                bad = bad | {"window"}
    batch = data.draw(st.sampled_from(BATCHES))
    tq, tv = (
        data.draw(st.sampled_from(LENGTHS)),
        data.draw(st.sampled_from((1, 3, 0))),
    )
    features = FEATURES if kind == "luong" else 3
    query, q_finite, q_huge = data.draw(sequences(batch, tq))
    value, v_finite, v_huge = data.draw(sequences(batch, tv, features))
    one_step = data.draw(st.booleans(), label="one_step") and tq > 0
    if one_step:
        query = query[:, 0]
    query_mask = data.draw(masks(batch, tq))
    if one_step and query_mask is not None:
        query_mask = query_mask[:, 0]
    value_mask = data.draw(masks(batch, tv))
    call = dict(
        query_mask=query_mask,
        value_mask=value_mask,
        return_attention_scores=True,
    )
    call_bad = data.draw(st.sampled_from([None] * 12 + ["value_mask", "value"]))
    if call_bad == "value_mask":
        call["value_mask"] = np.ones((batch, tv + 1), bool)
    elif call_bad == "value":
        value = value.reshape(batch, -1)  # rank 2
    if call_bad:
        bad = bad | {call_bad}

    def run():
        layer = _layer(
            cls,
            kwargs,
            lambda layer: layer(
                np.zeros((1, 1, FEATURES), "float32"),
                np.zeros((1, 1, features), "float32"),
            ),
        )
        return layer, layer(query, value, **call)

    result = expect(run, bad)
    if result is None:
        return
    layer, outputs = result
    specs = layer.compute_output_spec(
        keras.KerasTensor(query.shape),
        keras.KerasTensor(value.shape),
        return_attention_scores=True,
    )
    q3 = query[:, None] if one_step else query
    qv = _valid(query_mask, batch, tq)
    if one_step:
        qv = qv[:, :1] if query_mask is None else query_mask[:, None]
    vv = _valid(value_mask, batch, tv)
    reference = bahdanau_reference if kind == "bahdanau" else luong_reference
    context, weights = reference(layer, q3, value, vv, qv)
    if one_step:
        context, weights = context[:, 0], weights[:, 0]
    _check_outputs(
        outputs,
        specs,
        [context, weights],
        q_finite and v_finite,
        q_huge or v_huge,
    )


@DRAWS
@given(st.data())
def test_attention_rnn_decoder(data):
    kwargs, bad = _draw_args(
        data,
        dict(
            units=(ints(2, 3), BAD_INTS),
            cell=(st.sampled_from(["gru", "lstm"]), ("rnn", None, 1)),
            attention_style=(
                st.sampled_from(["bahdanau", "luong"]),
                ("Luong", None),
            ),
            input_feeding=(BOOLS, BAD_BOOLS),
            dropout=(RATES, BAD_RATES),
        ),
    )
    kwargs["attention"] = ka.BahdanauAttention(2, name="attention")
    batch = data.draw(st.sampled_from(BATCHES))
    tt, ts = (
        data.draw(st.sampled_from(LENGTHS)),
        data.draw(st.sampled_from((1, 3))),
    )
    targets, t_finite, t_huge = data.draw(sequences(batch, tt))
    memory, m_finite, m_huge = data.draw(sequences(batch, ts, 3))
    mask = data.draw(masks(batch, tt))
    memory_mask = data.draw(masks(batch, ts))
    call = dict(mask=mask, memory_mask=memory_mask)
    call_bad = data.draw(st.sampled_from([None] * 8 + ["memory_mask"]))
    if call_bad:
        call["memory_mask"] = np.ones((batch, ts + 2), bool)
        bad = bad | {call_bad}

    def build(decoder):
        decoder(
            np.zeros((1, 1, FEATURES), "float32"),
            np.zeros((1, 1, 3), "float32"),
        )

    def run():
        key = dict(kwargs, attention=None)
        decoder = _LAYERS.get(("AttentionRNNDecoder", _key(key)))
        if decoder is None:
            decoder = ka.AttentionRNNDecoder(**kwargs)
            build(decoder)
            _randomize(decoder)
            _LAYERS[("AttentionRNNDecoder", _key(key))] = decoder
        return decoder, decoder(targets, memory, **call)

    result = expect(run, bad)
    if result is None:
        return
    decoder, outputs = result
    specs = decoder.compute_output_spec(
        keras.KerasTensor(targets.shape), keras.KerasTensor(memory.shape)
    )
    reference = None
    if t_finite and m_finite and not (t_huge or m_huge):
        reference = _decoder_reference(
            decoder,
            targets,
            memory,
            _valid(mask, batch, tt),
            _valid(memory_mask, batch, ts),
        )
    _check_outputs(
        outputs, specs, [reference], t_finite and m_finite, t_huge or m_huge
    )


def _decoder_reference(decoder, y, memory, valid, memory_valid):
    """The decoder stepped in Python with its own cell and NumPy
    attention; padded target steps keep the state and output zeros."""
    batch = y.shape[0]
    states = [np.zeros((batch, n)) for n in decoder._cell_state_sizes()]
    feed = np.zeros((batch, decoder.units))
    outputs = []
    ones = np.ones((batch, 1), bool)
    for t in range(y.shape[1]):
        if decoder.attention_style == "bahdanau":
            c, _ = bahdanau_reference(
                decoder.attention,
                states[0][:, None],
                memory,
                memory_valid,
                ones,
            )
            x = np.concatenate([y[:, t], c[:, 0]], -1)
            out, new = decoder.rnn_cell(x.astype("float32"), states)
            out, new = np_(out), [np_(s) for s in keras.tree.flatten(new)]
        else:
            x = y[:, t]
            if decoder.input_feeding:
                x = np.concatenate([x, feed], -1)
            h, new = decoder.rnn_cell(x.astype("float32"), states)
            h, new = np_(h), [np_(s) for s in keras.tree.flatten(new)]
            c, _ = bahdanau_reference(
                decoder.attention, h[:, None], memory, memory_valid, ones
            )
            kernel = _w(decoder.attentional_dense.kernel)
            out = np.tanh(np.concatenate([c[:, 0], h], -1) @ kernel)
        keep = valid[:, t, None]
        states = [np.where(keep, n, s) for n, s in zip(new, states)]
        if decoder.attention_style == "luong":
            feed = np.where(keep, out, feed)
        outputs.append(np.where(keep, out, 0.0))
    if not outputs:
        return np.zeros((batch, 0, decoder.units))
    return np.stack(outputs, 1)


# --- Position layers --------------------------------------------------------


@DRAWS
@given(st.data())
def test_position_layers(data):
    kind = data.draw(
        st.sampled_from(["rotary", "sinusoidal", "learned", "tokens"])
    )
    batch = data.draw(st.sampled_from(BATCHES))
    t = data.draw(st.sampled_from(LENGTHS))
    start = data.draw(
        st.sampled_from([0, 1, np.int64(2), 5, -1, 1.5, "1"]), label="start"
    )
    bad = set()
    if isinstance(start, (float, str)):
        bad.add("start_index")
    if kind in ("rotary", "sinusoidal"):
        cls = (
            ka.RotaryEmbedding
            if kind == "rotary"
            else ka.SinusoidalPositionEncoding
        )
        kwargs, bad_args = _draw_args(
            data, dict(max_wavelength=(WAVELENGTHS, BAD_WAVELENGTHS))
        )
    elif kind == "learned":
        cls = ka.PositionEmbedding
        kwargs, bad_args = _draw_args(
            data, dict(sequence_length=(ints(1, 5), BAD_INTS))
        )
    else:
        cls = ka.TokenAndPositionEmbedding
        kwargs, bad_args = _draw_args(
            data,
            dict(
                vocabulary_size=(ints(2, 6), BAD_INTS),
                sequence_length=(ints(1, 5), BAD_INTS),
                embedding_dim=(ints(1, 3), BAD_INTS),
                mask_zero=(BOOLS, BAD_BOOLS),
            ),
        )
    bad_any = bad | bad_args
    if kind in ("learned", "tokens") and not bad_args:
        length = kwargs["sequence_length"]
        if t > length:  # at build
            bad_any = bad_any | {"inputs", "sequence_length"}
        if isinstance(start, (int, np.integer)) and (
            start < 0 or start + t > length
        ):
            bad_any = bad_any | {"start_index", "sequence_length"}
    if kind == "tokens":
        # Ids inside the vocabulary: outside, Keras's `Embedding` decides
        # (TensorFlow raises InvalidArgumentError, JAX clamps); reading the
        # ids to check them would cost a device sync per call.
        vocab = kwargs["vocabulary_size"] if not bad_args else 2
        seed = data.draw(st.integers(0, 3))
        x = np.random.default_rng(seed).integers(0, vocab, size=(batch, t))
        x = x.astype(data.draw(st.sampled_from(["int32", "int64"])))
        finite, huge = True, False
    else:
        x, finite, huge = data.draw(sequences(batch, t))
        if kind == "rotary":
            x = x.reshape(batch, t, 2, FEATURES // 2)

    def run():
        layer = _layer(cls, kwargs, lambda layer: None)
        return layer, layer(x, start_index=start)

    result = expect(run, bad_any)
    if result is None:
        return
    layer, out = result
    spec = keras.KerasTensor(layer.compute_output_shape(x.shape))
    start = int(start)
    if kind == "rotary":
        reference = _rotate(x.astype("float64"), layer.max_wavelength, start)
    elif kind == "sinusoidal":
        d = x.shape[-1]
        i = np.arange(d)
        rate = float(layer.max_wavelength) ** (-(2 * (i // 2)) / d)
        angle = (np.arange(t) + start)[:, None] * rate[None, :]
        pe = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
        reference = np.broadcast_to(pe[None], x.shape)
    elif kind == "learned":
        table = _w(layer.position_embeddings)
        reference = np.broadcast_to(table[start : start + t][None], x.shape)
    else:
        tokens = _w(layer.token_embedding.embeddings)[x]
        table = _w(layer.position_embedding.position_embeddings)
        reference = tokens + table[start : start + t][None]
        if layer.mask_zero:
            np.testing.assert_array_equal(
                ops.convert_to_numpy(layer.compute_mask(x)), x != 0
            )
    # Rotating huge values is linear: compared (not `huge`).
    _check_outputs([out], [spec], [reference], finite, False, atol=1e-4)


# --- Other layers -----------------------------------------------------------


@DRAWS
@given(st.data())
def test_pooling_feed_forward_and_bridge(data):
    kind = data.draw(st.sampled_from(["pooling", "feed_forward", "bridge"]))
    batch = data.draw(st.sampled_from(BATCHES))
    t = data.draw(st.sampled_from(LENGTHS))
    x, finite, huge = data.draw(sequences(batch, t))
    if kind == "pooling":
        cls = ka.AttentionPooling
        kwargs, bad = _draw_args(
            data,
            dict(
                units=(st.one_of(st.none(), ints(1, 3)), BAD_INTS),
                use_bias=(BOOLS, BAD_BOOLS),
            ),
        )
        mask = data.draw(masks(batch, t))
        if data.draw(st.sampled_from([False] * 6 + [True])):
            mask, bad = np.ones((batch, t + 1), bool), bad | {"mask"}
        args, call = (x,), dict(mask=mask, return_attention_scores=True)
    elif kind == "feed_forward":
        cls = ka.FeedForward
        kwargs, bad = _draw_args(
            data,
            dict(
                intermediate_dim=(ints(1, 3), BAD_INTS),
                activation=(st.sampled_from(["relu", "tanh", None]), ()),
                dropout=(RATES, BAD_RATES),
                use_bias=(BOOLS, BAD_BOOLS),
            ),
        )
        args, call = (x,), {}
    else:
        cls = ka.EncoderBridge
        kwargs, bad = _draw_args(
            data,
            dict(
                units=(ints(1, 3), BAD_INTS),
                cell=(st.sampled_from(["gru", "lstm"]), ("GRU", None, 1)),
            ),
        )
        x = x[:, 0] if t else np.full((batch, FEATURES), 0.5, "float32")
        lstm = kwargs["cell"] == "lstm" and not bad
        args = (x, -x, x * 0.5, x) if lstm else (x, -x)
        call = {}
        t = None

    def run():
        def build(layer):
            layer(*[a[:1] if a.ndim == 2 else a[:1, :1] for a in args])

        layer = _layer(cls, kwargs, build)
        return layer, layer(*args, **call)

    result = expect(run, bad)
    if result is None:
        return
    layer, outputs = result
    specs = layer.compute_output_spec(
        *[keras.KerasTensor(a.shape) for a in args],
        **{k: v for k, v in call.items() if k == "return_attention_scores"},
    )
    x64 = x.astype("float64")
    if kind == "pooling":
        h = x64
        if layer.units is not None:
            h = np.tanh(
                x64 @ _w(layer._hidden.kernel)
                + (_w(layer._hidden.bias) if layer.use_bias else 0.0)
            )
        scores = (h @ _w(layer._score.kernel))[..., 0]
        weights = masked_softmax(scores, _valid(call["mask"], batch, t))
        references = [np.einsum("bt,btd->bd", weights, x64), weights]
    elif kind == "feed_forward":
        activation = {
            "relu": lambda z: np.maximum(z, 0),
            "tanh": np.tanh,
            None: lambda z: z,
        }[kwargs["activation"]]

        def dense(d, z):
            z = z @ _w(d.kernel)
            return z + _w(d.bias) if layer.use_bias else z

        hidden = activation(dense(layer.intermediate_dense, x64))
        references = [dense(layer.output_dense, hidden)]
    else:
        a = [v.astype("float64") for v in args]

        def bridge(d, u, v):
            return np.tanh(
                np.concatenate([u, v], -1) @ _w(d.kernel) + _w(d.bias)
            )

        references = [bridge(layer.state_dense, a[0], a[1])]
        if layer.cell == "lstm":
            references.append(bridge(layer.carry_dense, a[2], a[3]))
    _check_outputs(outputs, specs, references, finite, huge)


@DRAWS
@given(st.data())
def test_mixture_of_experts(data):
    batch = data.draw(st.sampled_from(BATCHES))
    t = data.draw(st.sampled_from(LENGTHS))
    x, finite, huge = data.draw(sequences(batch, t))
    kwargs, bad = _draw_args(
        data,
        dict(
            num_experts=(ints(2, 3), BAD_INTS),
            top_k=(ints(1, 2), BAD_INTS),
            intermediate_dim=(ints(1, 3), BAD_INTS),
            routing=(
                st.sampled_from(["softmax_topk", "topk_softmax"]),
                ("topk", None, 1),
            ),
            normalize_top_k=(BOOLS, BAD_BOOLS),
            activation=(
                st.sampled_from(["swiglu", "gpt_oss_glu"]),
                ("silu", None),
            ),
            expert_bias=(BOOLS, BAD_BOOLS),
        ),
    )
    mask = data.draw(masks(batch, t))

    def run():
        def build(layer):
            layer(x[:1, :1])

        layer = _layer(ka.MixtureOfExperts, kwargs, build)
        return layer, layer(x, mask=mask)

    result = expect(run, bad)
    if result is None:
        return
    layer, out = result
    spec = layer.compute_output_spec(keras.KerasTensor(x.shape))
    reference = None
    if finite and not huge:  # (else shapes and finiteness only)
        reference = reference_moe(layer, x.astype("float64"))[0]
    _check_outputs([out], [spec], [reference], finite, huge)


# --- Blocks -----------------------------------------------------------------


def _block_reference(block, x, valid, context=None, context_valid=None):
    """A transformer block in NumPy (ReLU feed-forward, plain or gated, no
    dropout; layer or RMS norms; sublayer outputs normalized too with
    `sandwich_norm`)."""

    def norm(z, layer):
        if block.normalization == "rms_norm":
            rms = np.sqrt(np.mean(z**2, -1, keepdims=True) + layer.epsilon)
            return z / rms * _w(layer.scale)
        gamma, beta = _w(layer.gamma), _w(layer.beta)
        mu = z.mean(-1, keepdims=True)
        var = z.var(-1, keepdims=True)
        return (z - mu) / np.sqrt(var + layer.epsilon) * gamma + beta

    def residual(z, f, layer, post=None):
        y = f(norm(z, layer) if block.norm_first else z)
        if post is not None:
            y = norm(y, post)
        z = z + y
        return z if block.norm_first else norm(z, layer)

    t = x.shape[1]
    attention = block.self_attention
    mask = _attention_mask(x.shape[0], t, t, valid, valid, block.causal)
    if isinstance(attention, ka.LocalSelfAttention):
        mask = mask & _band(t, *attention.window_bounds)
    x = residual(
        x,
        lambda z: mha_reference(attention, z, z, z, mask)[0],
        block.self_attention_norm,
        getattr(block, "self_attention_post_norm", None),
    )
    if context is not None:
        cross = _attention_mask(
            x.shape[0], t, context.shape[1], valid, context_valid
        )
        x = residual(
            x,
            lambda z: mha_reference(
                block.cross_attention_layer, z, context, context, cross
            )[0],
            block.cross_attention_norm,
            getattr(block, "cross_attention_post_norm", None),
        )
    ff = block.feed_forward

    def dense(layer, z):
        bias = _w(layer.bias)
        return z @ _w(layer.kernel) + (0.0 if bias is None else bias)

    def feed_forward(z):
        hidden = dense(ff.intermediate_dense, z)
        if block.gated_feed_forward:  # relu(z W_g) * (z W_1)
            hidden = np.maximum(dense(ff.gate_dense, z), 0) * hidden
        else:
            hidden = np.maximum(hidden, 0)
        return dense(ff.output_dense, hidden)

    return residual(
        x,
        feed_forward,
        block.feed_forward_norm,
        getattr(block, "feed_forward_post_norm", None),
    )


@DRAWS
@given(st.data())
def test_transformer_blocks(data):
    decoder = data.draw(st.booleans(), label="decoder")
    spec = dict(
        num_heads=(ints(1, 2), BAD_INTS),
        intermediate_dim=(ints(1, 3), BAD_INTS),
        key_dim=(st.one_of(st.none(), ints(1, 2)), BAD_INTS),
        num_key_value_heads=(st.one_of(st.none(), st.just(1)), BAD_INTS),
        norm_first=(BOOLS, BAD_BOOLS),
        layer_norm_epsilon=(
            one_of_values(1e-5, 0.5, np.float32(1e-3), 1e30),
            (0, -1e-5, NAN, INF, "1e-5", None, True),
        ),
        rotary_max_wavelength=(
            st.one_of(st.none(), WAVELENGTHS),
            BAD_WAVELENGTHS,
        ),
        window_size=(
            st.one_of(st.none(), ints(0, 2), st.just((np.int64(1), 10**9))),
            (-1, "1", 1.5, (1,), True),
        ),
        dropout=(RATES, BAD_RATES),
        normalization=(
            one_of_values("layer_norm", "rms_norm"),
            ("batch_norm", "RMS", None, 1),
        ),
        use_bias=(BOOLS, BAD_BOOLS),
        gated_feed_forward=(BOOLS, BAD_BOOLS),
        sandwich_norm=(BOOLS, BAD_BOOLS),
        attention_scale=(SCALES, BAD_SCALES),
    )
    if decoder:
        spec["cross_attention"] = (BOOLS, BAD_BOOLS)
    else:
        spec["causal"] = (BOOLS, BAD_BOOLS)
    kwargs, bad = _draw_args(data, spec)
    bad = bad | _joint_errors(kwargs)
    heads, key_dim = kwargs["num_heads"], kwargs["key_dim"]
    if key_dim is None and _int(heads) and heads > 0 and FEATURES % heads:
        bad = bad | {"num_heads"}  # at build: features % num_heads
    elif key_dim is None and _int(heads) and heads > 0:
        if (
            kwargs["rotary_max_wavelength"] is not None
            and (FEATURES // heads) % 2
        ):
            bad = bad | {"rotary_max_wavelength"}
    cls = TransformerDecoderBlock if decoder else TransformerEncoderBlock
    batch = data.draw(st.sampled_from(BATCHES))
    t = data.draw(st.sampled_from(LENGTHS))
    x, finite, huge = data.draw(sequences(batch, t))
    mask = data.draw(masks(batch, t))
    cross = decoder and kwargs.get("cross_attention") and not bad
    context = context_mask = None
    args, call = (x,), dict(padding_mask=mask)
    if cross:
        tc = data.draw(st.sampled_from(LENGTHS))
        context, c_finite, c_huge = data.draw(sequences(batch, tc, 3))
        finite, huge = finite and c_finite, huge or c_huge
        context_mask = data.draw(masks(batch, tc))
        args = (x, context)
        call["context_padding_mask"] = context_mask

    def run():
        def build(block):
            shapes = [(1, 1, FEATURES)] + ([(1, 1, 3)] if cross else [])
            block(*[np.zeros(s, "float32") for s in shapes])

        block = _layer(cls, kwargs, build)
        return block, block(*args, **call)

    result = expect(run, bad)
    if result is None:
        return
    block, out = result
    spec_out = block.compute_output_spec(
        *[keras.KerasTensor(a.shape) for a in args]
    )
    reference = _block_reference(
        block,
        x.astype("float64"),
        _valid(mask, batch, t),
        None if context is None else context.astype("float64"),
        None if context is None else _valid(context_mask, batch, tc),
    )
    valid = _valid(mask, batch, t)
    # Padded rows are not part of the contract (a block's output there is
    # the residual of whatever the row held).
    _check_outputs(
        [np_(out)[valid]],
        [keras.KerasTensor(np_(out)[valid].shape)],
        [reference[valid]],
        finite,
        huge,
    )
    assert tuple(out.shape) == tuple(spec_out.shape)


def test_layers_are_all_covered():
    covered = {
        "AttentionPooling",
        "AttentionRNNDecoder",
        "BahdanauAttention",
        # Its properties: tests/properties/test_pooling_head_properties.py
        "ContrastiveLogits",
        # Its properties: test_convolution_padding_mask_property.py
        "ConvolutionPaddingMask",
        "CrossAttention",
        # Its properties: tests/properties/test_disentangled_property.py
        "DisentangledSelfAttention",
        "EncoderBridge",
        "FeedForward",
        # Its properties: tests/properties/test_gated_delta_rule_property.py
        "GatedDeltaNet",
        "GraphAttention",
        "GroupQueryAttention",
        # Its properties: tests/properties/test_kimi_delta_rule_property.py
        "KimiDeltaAttention",
        # Its properties: tests/properties/test_topk_attention_property.py
        "LightningIndexer",
        # Its properties: tests/properties/test_linear_attention_property.py
        "LinearAttention",
        "LocalSelfAttention",
        "LuongAttention",
        "MixtureOfExperts",
        "MultiHeadAttention",
        "MultiHeadLatentAttention",
        "PositionEmbedding",
        "RotaryEmbedding",
        "CausalSelfAttention",
        "SelfAttention",
        "SharedKVSelfAttention",
        "SinusoidalPositionEncoding",
        "TokenAndPositionEmbedding",
        # Its properties: tests/properties/test_pooling_head_properties.py
        "TokenPooling",
    }
    # Every layer class (the blocks have properties of their own, in
    # tests/blocks); no name here that is not a public layer.
    assert not public_layers.missing(covered, among=public_layers.LAYERS)
    assert covered <= public_layers.LAYERS, covered - public_layers.LAYERS
