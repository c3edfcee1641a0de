"""Properties of `collect_attention` and `attention_html` (Hypothesis).

Each draw either returns the right result or raises a `ValueError` or
`TypeError` whose message names the argument at fault: never another
exception, a NaN the inputs did not contain, a silently ignored argument
or a wrong shape.

- `collect_attention`: one attention layer of each kind (self, causal,
  local, local with global tokens, multi-head and cross-attention,
  pooling, Bahdanau, Luong) in a model, on drawn batch sizes, lengths
  (0 to 6), padding masks (none, random, all-False and all-True rows,
  huge values at padded positions) and `layers` / `max_dense_length`
  arguments (valid or not). The weights must equal the layer's own
  `return_attention_scores=True` output (made dense), and, independently
  of the layer, be zero wherever the masks forbid attention, sum to 1 on
  every query with something to attend to and to 0 on the others.
- `attention_html`: drawn weights (per layer: kind, batch, heads,
  lengths; dense and top-k rows), token lists (shared or per batch
  item), batch indices, kinds, `top_k` and titles, valid or with one
  argument broken. A page's embedded data must decode to the weights
  (within the 8-bit quantization error) and carry the tokens, kinds and
  batch items asked for.

Sizes are bounded (the "ci" profile of tests/conftest.py: 25 examples a
property) so that this module stays within ~40 s per backend.
"""

import base64
import html
import json
import re

import keras
import numpy as np
import pytest
from hypothesis import event
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from keras import ops

from keras_attention import layers as ka
from keras_attention.visualization import AttentionExplorer
from keras_attention.visualization import AttentionMaps
from keras_attention.visualization import attention_html
from keras_attention.visualization import collect_attention

FEATURES = 4
# JAX compiles each operation anew for every new shape, also when called
# eagerly (~125 compilations, seconds, for a first call of the global
# tokens path): under JAX, lengths are drawn from three values and other
# sizes fixed, so that compiled shapes come up again.
FEW_SHAPES = keras.backend.backend() == "jax"
ATOL = 2e-5
NAME = "attention"

# -------------------------------------------------------- collect_attention

SELF_KINDS = ("self", "local", "global", "pooling")
CROSS_KINDS = ("mha_cross", "cross", "bahdanau", "luong")


def _error_names(error, *names):
    """Whether the message of `error` names one of the arguments."""
    message = str(error)
    return any(re.search(rf"\b{re.escape(n)}\b", message) for n in names)


class Probe(keras.Model):
    """A model around one attention layer, called as `kind` says."""

    def __init__(self, layer, kind, **kwargs):
        super().__init__(**kwargs)
        self.attention = layer
        self.kind = kind

    def build(self, input_shape):
        # The layer builds on its first (eager) call: no symbolic trace
        # (global tokens without `max_global_tokens` cannot be traced).
        self.built = True

    def call(self, inputs):
        return run_layer(self.attention, self.kind, inputs, False)


def run_layer(layer, kind, inputs, scores):
    """Calls `layer` on the drawn inputs (a dict; absent masks omitted)."""
    get = inputs.get
    if kind in ("self", "local", "pooling"):
        return layer(
            inputs["x"], mask=get("mask"), return_attention_scores=scores
        )
    if kind == "global":
        return layer(
            inputs["x"],
            mask=get("mask"),
            global_mask=inputs["global_mask"],
            return_attention_scores=scores,
        )
    if kind == "cross":
        return layer(
            inputs["x"],
            inputs["context"],
            query_mask=get("mask"),
            context_mask=get("context_mask"),
            return_attention_scores=scores,
        )
    return layer(  # mha_cross, bahdanau, luong
        inputs["x"],
        inputs["context"],
        query_mask=get("mask"),
        value_mask=get("context_mask"),
        return_attention_scores=scores,
    )


def _masks(length, batch):
    """None, or a bool `(batch, length)` mask (random rows; all-False and
    all-True rows come up often at these lengths)."""
    return st.none() | hnp.arrays(bool, (batch, length))


def _size(low, high, length=False):
    """An int in `[low, high]`; under JAX (see `FEW_SHAPES`) the lowest,
    the highest or one between for lengths, a middle one for others."""
    if not FEW_SHAPES:
        return st.integers(low, high)
    middle = (low + high + 1) // 2
    return st.sampled_from([low, middle, high] if length else [middle])


@st.composite
def attention_cases(draw, kind):
    """`(layer class, its arguments, inputs)` of one drawn case."""
    batch = draw(_size(1, 3))
    tq = draw(_size(0, 6, length=True))
    tk = tq if kind in SELF_KINDS else draw(_size(0, 6, length=True))
    heads = draw(_size(1, 3))
    key_dim = draw(_size(1, 4))
    causal = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    inputs = {"x": rng.normal(size=(batch, tq, FEATURES)).astype("float32")}
    mask = draw(_masks(tq, batch))
    if mask is not None:
        inputs["mask"] = mask
    if kind in CROSS_KINDS:
        context = rng.normal(size=(batch, tk, FEATURES)).astype("float32")
        inputs["context"] = context
        context_mask = draw(_masks(tk, batch))
        if context_mask is not None:
            inputs["context_mask"] = context_mask
    if draw(st.booleans()):  # huge values at padded positions
        for key, mask_key in (("x", "mask"), ("context", "context_mask")):
            if mask_key in inputs:
                padded = ~inputs[mask_key]
                inputs[key][padded] *= 1e4
    if kind == "self":
        layer = (ka.SelfAttention, dict(num_heads=heads, causal=causal))
    elif kind in ("local", "global"):
        window = draw(_size(1, 4) | st.tuples(_size(0, 2), _size(0, 3)))
        layer = (
            ka.LocalSelfAttention,
            dict(
                num_heads=heads,
                window_size=window,
                causal=causal,
                global_projections=draw(st.booleans()),
                max_global_tokens=draw(st.none() | _size(1, 3)),
            ),
        )
        if kind == "global":
            inputs["global_mask"] = draw(hnp.arrays(bool, (batch, tq)))
    elif kind == "pooling":
        units = draw(st.none() | _size(1, 4))
        layer = (ka.AttentionPooling, dict(units=units))
    elif kind == "mha_cross":
        layer = (ka.MultiHeadAttention, dict(num_heads=heads))
    elif kind == "cross":
        layer = (ka.CrossAttention, dict(num_heads=heads))
    elif kind == "bahdanau":
        units = draw(_size(1, 4))
        layer = (
            ka.BahdanauAttention,
            dict(units=units, normalize=draw(st.booleans())),
        )
    else:
        mode = draw(st.sampled_from(["dot", "general", "concat"]))
        units = draw(_size(1, 4)) if mode == "concat" else None
        layer = (ka.LuongAttention, dict(score_mode=mode, units=units))
    cls, kwargs = layer
    if "num_heads" in kwargs:
        kwargs["key_dim"] = key_dim
    # The layer is made in the test (Keras draws its initial weights).
    return cls, kwargs, inputs


# `layers=` values, valid and not.
VALID_LAYERS = [None, NAME, [NAME], (NAME,)]
INVALID_LAYERS = ["nope", [NAME, "nope"], 5, [], [NAME, None]]
# `max_dense_length=` values, some relative to the length T.
VALID_LENGTHS = ["none", "default", "numpy", "T"]
OTHER_LENGTHS = ["T-1", 0, -3, 2.5, True, "8"]


def _sometimes(data, valid, invalid):
    """A valid value three times in four, else an invalid one."""
    if data.draw(st.sampled_from([True, True, True, False]), label="valid"):
        return True, data.draw(st.sampled_from(valid))
    return False, data.draw(st.sampled_from(invalid))


def _max_dense_length(choice, steps):
    """`(value, valid for any layer)`; None/"default": the default."""
    if choice == "none":
        return None, True
    if choice == "default":
        return 2048, True
    if choice == "numpy":
        return np.int64(max(steps, 1)), True
    if choice == "T":
        return max(steps, 1), True
    if choice == "T-1":
        return steps - 1, steps > 1
    return choice, False


def _expected_allowed(kind, kwargs, inputs, is_global=None):
    """`(b, Tq, Tk)`: where query `i` may attend to key `j`, from the
    masks and the documented rules (window `i - left <= j <= i + right`,
    `window_size=w` meaning `(w, w)`, causal: `right = 0` and `j <= i`;
    a global token attends to and is attended by every position), not
    from the layer. `is_global`: the positions given a global slot."""
    x = inputs["x"]
    batch, tq = x.shape[:2]
    ones = np.ones((batch, tq), bool)
    query_valid = inputs.get("mask", ones)
    if kind in CROSS_KINDS:
        tk = inputs["context"].shape[1]
        key_valid = inputs.get("context_mask", np.ones((batch, tk), bool))
        return query_valid[:, :, None] & key_valid[:, None, :]
    if kind == "pooling":
        return query_valid[:, None, :]  # one learned query
    allowed = query_valid[:, :, None] & query_valid[:, None, :]
    offsets = np.arange(tq)[None, :] - np.arange(tq)[:, None]  # j - i
    causal = kwargs.get("causal", False)
    if kind in ("local", "global"):
        window = kwargs["window_size"]
        left, right = (window, window) if np.ndim(window) == 0 else window
        band = (offsets >= -left) & (offsets <= (0 if causal else right))
        if kind == "global":
            band = band | is_global[:, :, None] | is_global[:, None, :]
        allowed &= band
    if causal:
        allowed &= offsets <= 0
    return allowed


def _reference(kind, layer, inputs):
    """The layer's own weights, `(b, h, Tq, Tk)` NumPy."""
    _, scores = run_layer(layer, kind, inputs, True)
    if kind in ("local", "global"):
        scores = layer.scores_to_dense(scores)
    scores = np.asarray(ops.convert_to_numpy(scores), "float32")
    if kind == "pooling":
        return scores[:, None, None, :]
    if kind in ("bahdanau", "luong"):
        return scores[:, None]
    return scores


def _check_weights(kind, layer, kwargs, inputs, weights, meta):
    batch, tq = inputs["x"].shape[:2]
    tk = inputs["context"].shape[1] if kind in CROSS_KINDS else tq
    heads = 1 if kind in ("pooling", "bahdanau", "luong") else layer.num_heads
    rows = 1 if kind == "pooling" else tq
    assert weights.shape == (batch, heads, rows, tk)
    assert weights.dtype == np.float32
    assert np.all(np.isfinite(weights)), "NaN or inf in the weights"
    want = _reference(kind, layer, inputs)
    np.testing.assert_allclose(weights, want, atol=ATOL)
    sums = weights.sum(-1)
    is_global = None
    if kind == "global":
        # The positions given a slot: all global ones, or the first
        # `max_global_tokens` of each example.
        is_global = meta["global_mask"]
        given = inputs["global_mask"]
        slots = kwargs["max_global_tokens"]
        assert is_global.shape == given.shape
        assert not np.any(is_global & ~given)
        if slots is None:
            np.testing.assert_array_equal(is_global, given)
        else:
            counts = np.minimum(given.sum(-1), slots)
            np.testing.assert_array_equal(is_global.sum(-1), counts)
    allowed = _expected_allowed(kind, kwargs, inputs, is_global)
    forbidden = np.broadcast_to(~allowed[:, None], weights.shape)
    assert np.all(weights[forbidden] == 0), "weight where masks forbid it"
    expected_sums = np.broadcast_to(allowed.any(-1)[:, None], sums.shape)
    np.testing.assert_allclose(sums, expected_sums.astype("float32"), atol=1e-5)


@pytest.mark.parametrize("kind", SELF_KINDS + CROSS_KINDS)
@given(data=st.data())
def test_collect_attention_is_right_or_names_the_argument(kind, data):
    cls, kwargs, inputs = data.draw(attention_cases(kind))
    layer = cls(name=NAME, **kwargs)
    valid_layers, layers_ = _sometimes(data, VALID_LAYERS, INVALID_LAYERS)
    steps = inputs["x"].shape[1]
    limit, valid_limit = _max_dense_length(
        _sometimes(data, VALID_LENGTHS, OTHER_LENGTHS)[1], steps
    )
    if kind in ("local", "global") and limit is not None and valid_limit:
        valid_limit = steps <= limit
    model = Probe(layer, kind)
    bad = [
        name
        for name, ok in (
            ("layers", valid_layers),
            ("max_dense_length", valid_limit),
        )
        if not ok
    ]
    event(f"refused: {bad}" if bad else "weights")
    if bad:
        with pytest.raises((ValueError, TypeError)) as info:
            collect_attention(model, inputs, layers_, max_dense_length=limit)
        assert _error_names(info.value, *bad), str(info.value)
        return
    maps = collect_attention(model, inputs, layers_, max_dense_length=limit)
    assert isinstance(maps, AttentionMaps)
    assert list(maps) == [NAME]
    meta = maps.metadata[NAME]
    _check_weights(kind, layer, kwargs, inputs, maps[NAME], meta)
    assert (meta["num_heads"], meta["query_length"], meta["key_length"]) == (
        maps[NAME].shape[1:]
    )
    assert meta["path"] == NAME and meta["call_index"] == 0
    mask = inputs.get("mask")
    key_mask = inputs.get("context_mask") if kind in CROSS_KINDS else mask
    if kind != "pooling":
        _same_mask(meta["query_mask"], mask)
    _same_mask(meta["key_mask"], key_mask)


def _same_mask(got, want):
    if want is None:
        assert got is None
    else:
        np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------- attention_html

HTML_KINDS = ("self", "target_self", "cross", "decoder", "pooling")
# (kind reported, query side, key side) of each drawn layer kind.
SIDES = {
    "self": ("self", "tokens", "tokens"),
    "target_self": ("self", "target_tokens", "target_tokens"),
    "cross": ("cross", "target_tokens", "tokens"),
    "decoder": ("decoder", "target_tokens", "tokens"),
    "pooling": ("pooling", None, "tokens"),
}
WORDS = st.text(alphabet=st.sampled_from("ab<>&\"'é/ "), min_size=1, max_size=4)


@st.composite
def explorer_cases(draw):
    """A valid call of `attention_html`: `(args, expected)`."""
    batch = draw(st.integers(1, 3))
    sizes = {
        "tokens": draw(st.integers(1, 7)),
        "target_tokens": draw(st.integers(1, 5)),
    }
    kinds = draw(st.lists(st.sampled_from(HTML_KINDS), min_size=1, max_size=3))
    form = draw(st.sampled_from(["maps", "records", "plain"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    weights, metadata, layers = {}, {}, []
    for i, drawn in enumerate(kinds):
        kind, query_side, key_side = SIDES[drawn]
        rows = 1 if query_side is None else sizes[query_side]
        shape = (batch, draw(st.integers(1, 3)), rows, sizes[key_side])
        w = rng.dirichlet(np.ones(shape[-1]), size=shape[:-1])
        if draw(st.booleans()):  # unnormalized, with zero rows
            w = w * rng.integers(0, 3, size=shape[:-1] + (1,))
        name = f"layer_{i}/{drawn}"
        w = w.astype(draw(st.sampled_from(["float16", "float32", "float64"])))
        form_of_w = draw(st.sampled_from(["array", "tensor", "squeezed"]))
        if form_of_w == "tensor":  # a backend tensor
            w = ops.convert_to_tensor(w)
        elif form_of_w == "squeezed" and batch == 1:  # one batch item
            w = w[0, 0] if shape[1] == 1 and draw(st.booleans()) else w[0]
        weights[name] = w
        metadata[name] = dict(
            kind=kind, query_tokens=query_side, key_tokens=key_side
        )
        layers.append((name, kind, query_side, key_side))
    if form == "maps":
        attentions = AttentionMaps(weights, metadata)
    elif form == "records":
        attentions = {
            n: dict(metadata[n], weights=w) for n, w in weights.items()
        }
    else:  # plain weights: the kinds are given (sides follow the kinds)
        attentions = dict(weights)
    given_kinds = {n: k for n, k, _, _ in layers} if form == "plain" else None
    token_lists = {}
    for side, size in sizes.items():
        if draw(st.booleans()):  # one list for every batch item
            token_lists[side] = draw(
                st.lists(WORDS, min_size=size, max_size=size)
            )
        else:  # per item, shorter lists are padding
            token_lists[side] = [
                draw(st.lists(WORDS, min_size=1, max_size=size))
                for _ in range(batch)
            ]
    needs_target = any("target_tokens" in (q, k) for _, _, q, k in layers)
    target = token_lists["target_tokens"] if needs_target else None
    batch_index = draw(
        st.none()
        | st.integers(-batch, batch - 1)
        | st.integers(0, batch - 1).map(np.int64)
        | st.lists(st.integers(-batch, batch - 1), min_size=1, max_size=3)
    )
    top_k = draw(
        st.none() | st.integers(1, 9) | st.integers(1, 9).map(np.int64)
    )
    title = draw(st.none() | st.text(max_size=12))
    args = dict(
        attentions=attentions,
        tokens=token_lists["tokens"],
        target_tokens=target,
        batch_index=batch_index,
        kinds=given_kinds,
        top_k=top_k,
        title=title,
    )
    return args, layers


def _lists(tokens, batch):
    """Token lists per batch item, as the page should carry them."""
    if tokens is None:
        return None
    shared = all(isinstance(t, str) for t in tokens)
    return [list(tokens)] * batch if shared else [list(t) for t in tokens]


def _guessed_sides(name, kind, shape, sources, targets):
    """The sides of a layer given by its kind alone, by the rule that
    `attention_html` documents."""
    if kind == "pooling":
        return None, "tokens"
    if kind in ("cross", "decoder"):
        return "target_tokens", "tokens"
    keys = shape[-1]
    on_target = targets is not None and (
        keys == len(targets[0]) != len(sources[0])
        or (keys == len(targets[0]) and "decoder" in name.lower())
    )
    side = "target_tokens" if on_target else "tokens"
    return side, side


def _token_error(args, layers, batch):
    """The token argument a valid-looking call must refuse, or None."""
    sources = _lists(args["tokens"], batch)
    targets = _lists(args["target_tokens"], batch)
    lists = {"tokens": sources, "target_tokens": targets}
    for name, kind, query_side, key_side in layers:
        shape = _weights_of(args["attentions"], name).shape
        if args["kinds"] is not None:
            query_side, key_side = _guessed_sides(
                name, kind, shape, sources, targets
            )
        for side, positions in ((query_side, shape[2]), (key_side, shape[3])):
            if side is None:
                continue
            if lists[side] is None:
                return side
            shared = all(isinstance(t, str) for t in args[side])
            counts = {len(t) for t in lists[side]}
            if (counts != {positions}) if shared else max(counts) > positions:
                return side
    return None


def _weights_of(attentions, name):
    """The weights of layer `name`, NumPy `(batch, heads, Tq, Tk)`."""
    value = attentions[name]
    if isinstance(value, dict):
        value = value["weights"]
    w = np.asarray(ops.convert_to_numpy(value))
    return w.reshape((1,) * (4 - w.ndim) + w.shape) if w.ndim < 4 else w


def _replace_weights(attentions, name, new):
    """`attentions` with the weights of `name` replaced (any form)."""
    metadata = getattr(attentions, "metadata", None)
    out = {}
    for key, value in attentions.items():
        if key == name:
            value = dict(value, weights=new) if isinstance(value, dict) else new
        out[key] = value
    return AttentionMaps(out, metadata) if metadata is not None else out


def _corrupt(draw, args, layers, batch):
    """One argument broken in a drawn way: `(name, args, refused)`;
    `refused` is False where the call may still be valid (token lists
    of another length: `_token_error` decides)."""
    name = draw(
        st.sampled_from(
            ["attentions", "tokens", "target_tokens", "batch_index"]
            + ["kinds", "top_k", "title"]
        )
    )
    args = dict(args)
    first = layers[0][0]
    w = _weights_of(args["attentions"], first)
    refused = True
    if name == "attentions":
        nan, neg, inf = w.copy(), w.copy(), w.copy()
        nan.flat[0], neg.flat[-1], inf.flat[0] = np.nan, -0.5, np.inf
        other_batch = np.concatenate([w, w]) if len(layers) > 1 else w[None]
        where, bad = draw(
            st.sampled_from(
                [
                    ("all", [w]),
                    ("all", {}),
                    ("all", "weights"),
                    ("one", nan),
                    ("one", neg),
                    ("one", inf),
                    ("one", w[None]),
                    ("one", w.ravel()),
                    ("one", w[..., :0]),
                    ("one", np.full(w.shape, "a")),
                    ("one", [[0.1], [0.2, 0.3]]),
                    ("one", other_batch),
                ]
            )
        )
        if where == "all":
            args["attentions"] = bad
        else:
            args["attentions"] = _replace_weights(
                args["attentions"], first, bad
            )
    elif name in ("tokens", "target_tokens"):
        size = max(
            _weights_of(args["attentions"], n).shape[3] for n, *_ in layers
        )
        bad = draw(
            st.sampled_from(
                [
                    ("a string", True),
                    ([], True),
                    (5, True),
                    (None, name == "tokens"),
                    ([["w"]] * (batch + 1), True),
                    (["w"] * (size + 1), False),
                    ([["w"] * (size + 1)] * batch, False),
                ]
            )
        )
        args[name], refused = bad
    elif name == "batch_index":
        args[name] = draw(
            st.sampled_from(
                [batch, -batch - 1, True, 1.5, [], "0", [0, batch], [[0]]]
            )
        )
    elif name == "kinds":
        args[name] = draw(
            st.sampled_from([{"nope": "self"}, {first: "unknown"}, "self"])
        )
    elif name == "top_k":
        args[name] = draw(st.sampled_from([0, -1, 1.5, True, "3"]))
    else:
        args[name] = draw(st.sampled_from([5, ["x"], b"x"]))
    return name, args, refused


def _embedded(page):
    """The JSON data embedded in the page."""
    match = re.search(
        r'<script type="application/json" id="ka-data">(.*?)</script>',
        page.html,
        re.S,
    )
    return json.loads(match.group(1))


def _decoded(layer, items):
    """`(values, kept)`: the embedded weights of one layer, and where
    they are (the kept top-k entries of sparse rows)."""
    payload = base64.b64decode(layer["data"])
    shape = (items, layer["heads"], layer["queries"], layer["k"])
    size = int(np.prod(shape))
    full = shape[:3] + (layer["keys"],)
    if layer["dense"]:
        codes = np.frombuffer(payload, "uint8").reshape(shape)
        return codes / 255 * layer["scale"], np.ones(full, bool)
    keys = np.frombuffer(payload[: 2 * size], "<u2").reshape(shape)
    codes = np.frombuffer(payload[2 * size :], "uint8").reshape(shape)
    assert np.all(np.diff(keys.astype(int), axis=-1) > 0), "keys unsorted"
    values, kept = np.zeros(full), np.zeros(full, bool)
    np.put_along_axis(
        values, keys.astype(int), codes / 255 * layer["scale"], -1
    )
    np.put_along_axis(kept, keys.astype(int), True, -1)
    return values, kept


def _check_page(page, args, layers, batch):
    assert isinstance(page, AttentionExplorer)
    data = _embedded(page)
    index = args["batch_index"]
    if index is None:
        items = list(range(batch))
    else:
        items = [int(i) % batch for i in np.atleast_1d(index)]
    assert data["batch"] == items
    sources = _lists(args["tokens"], batch)
    targets = _lists(args["target_tokens"], batch)
    assert data["tokens"] == [sources[b] for b in items]
    if targets is None:
        assert data["target_tokens"] is None
    else:
        assert data["target_tokens"] == [targets[b] for b in items]
    title = args["title"] or "Attention explorer"
    assert data["title"] == title
    assert f"<title>{html.escape(title)}</title>" in page.html
    assert [layer["name"] for layer in data["layers"]] == [
        n for n, *_ in layers
    ]
    top_k = args["top_k"]
    for layer, (name, kind, query_side, key_side) in zip(
        data["layers"], layers
    ):
        w = _weights_of(args["attentions"], name).astype("float32")[items]
        if args["kinds"] is not None:
            query_side, key_side = _guessed_sides(
                name, kind, w.shape, sources, targets
            )
        assert (layer["kind"], layer["query"], layer["key"]) == (
            kind,
            query_side,
            key_side,
        )
        assert (layer["heads"], layer["queries"], layer["keys"]) == w.shape[1:]
        keys = w.shape[-1]
        k = keys if top_k is None and keys <= 64 else min(top_k or 12, keys)
        assert layer["k"] == k and layer["dense"] == (k == keys)
        scale = max(float(w.max()), 1.0)
        assert layer["scale"] == pytest.approx(scale)
        values, kept = _decoded(layer, len(items))
        assert np.all(np.abs(values - w)[kept] <= scale / 510 + 1e-6)
        # The kept weights of a row are its largest ones.
        lowest_kept = np.where(kept, w, np.inf).min(-1)
        highest_dropped = np.where(kept, -np.inf, w).max(-1)
        assert np.all(lowest_kept >= highest_dropped)


@given(case=explorer_cases(), data=st.data())
def test_attention_html_is_right_or_names_the_argument(case, data):
    args, layers = case
    batch = _weights_of(args["attentions"], layers[0][0]).shape[0]
    broken, refused = None, False
    if data.draw(st.booleans()):
        broken, args, refused = _corrupt(data.draw, args, layers, batch)
    if not refused:  # the token lists may still not fit the weights
        broken = _token_error(args, layers, batch)
    event(f"refused: {broken}" if broken else "page")
    if broken is None:
        _check_page(attention_html(**args), args, layers, batch)
        return
    with pytest.raises((ValueError, TypeError)) as info:
        attention_html(**args)
    assert _error_names(info.value, broken), (broken, str(info.value))
