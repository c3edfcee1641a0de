"""Every attention layer's weights from one forward pass of a whole model.

`collect_attention(model, inputs)` runs `model(inputs, training=False)`
once, eagerly, and returns the attention weights of every attention layer
the pass called, as an `AttentionMaps`: a `dict` from a unique, path-like
layer name to NumPy float32 weights of shape `(batch, heads, Tq, Tk)`,
with one metadata record per entry in `AttentionMaps.metadata`.

The returned structure (what `attention_html` and `AttentionTensorBoard`
read):

- keys: the layer's path in the model's layer tree, the names of its
  enclosing layers joined by `/`, without the model's own name:
  `"self_attention"` (a top-level layer), `"encoder_block_1/self_attention"`,
  `"decoder_block/cross_attention"`. A layer called more than once in the
  pass (a shared layer) gets one entry per call: `"path"`, `"path#2"`,
  `"path#3"`, ... (call `k` is `"path#k"`). Keys are unique whatever the
  layers are named: when `"path#k"` is already taken, by another attention
  layer of the model that is really named so (Keras allows `#` in names)
  or by an earlier entry, one more `#` is inserted until it is free
  (`"path##k"`, `"path###k"`, ...). Two attention sublayers of one layer
  with the same name (possible in subclassed layers) are told apart the
  same way by their paths (`"name"`, `"name_2"`, ...). `metadata[key]
  ["path"]` is the layer's path whatever the key. Entries are in call
  order.
- values: `numpy.ndarray` float32 `(batch, heads, Tq, Tk)`: `[b, h, i, j]` is
  how much query position `i` attended to key position `j` in head `h` of
  example `b`. Rows sum to 1 over the attended keys (less under
  `LuongAttention(alignment="local-p")`, whose Gaussian scales them, as
  in the paper); padded keys, keys outside a causal or local window, and
  padded queries (whole rows) are 0.
- `metadata[key]`: a plain `dict` with
    - `"kind"`: `"self"` (queries and keys are one sequence: encoder or
      decoder self-attention), `"cross"` (queries from the target
      sequence, keys from the source: `CrossAttention`, a
      `MultiHeadAttention` called on two sequences, `BahdanauAttention` or
      `LuongAttention` called directly), `"decoder"` (the alignment of an
      `AttentionRNNDecoder`: target steps over the source memory) or
      `"pooling"` (`AttentionPooling`: one learned query over the
      sequence).
    - `"query_tokens"`, `"key_tokens"`: which token list labels the rows
      and the columns, named as `attention_html`'s arguments: `"tokens"`
      (the source, or the only sequence), `"target_tokens"` (the target of
      an encoder-decoder model), or None (`"query_tokens"` of pooling: the
      single row is the learned query). Cross and decoder entries are
      `("target_tokens", "tokens")`; a self-attention entry is on the
      target side when its parent layer (not a model) also holds a
      cross-attention layer (a `TransformerDecoderBlock`), or when it is
      causal and the pass has cross or decoder entries; else on the source
      side.
    - `"layer"`: the class name (`"SelfAttention"`, ...).
    - `"num_heads"`, `"query_length"`, `"key_length"`: ints, the
      weights' shape (heads is 1 for `"decoder"`, `"pooling"` and direct
      Bahdanau/Luong entries; an `AttentionRNNDecoder` over a multi-head
      attention averages its heads: `"heads_averaged"` is then True).
    - `"query_mask"`, `"key_mask"`: NumPy bool `(batch, Tq)` /
      `(batch, Tk)`, True on real tokens, or None when the call had no
      padding mask (`"query_mask"` of pooling is None).
    - `"causal"`: bool; `"window"`: `(left, right)` for
      `LocalSelfAttention`, else None; `"global_mask"`: NumPy bool
      `(batch, T)`, True at the global tokens of a `LocalSelfAttention`
      called with a `global_mask` (those it gave a global slot: beyond
      `max_global_tokens` a position stays local), else None.
    - `"path"`: the layer's path in the model (the key without a call
      suffix); `"call_index"`: 0 for a layer's first call in the pass, 1,
      2, ... for the following ones.

Weights are the ones the forward pass used. Each attention layer is
recorded through its hook `call_with_attention` (documented in
`keras_attention/layers/recording.py`; `is_attention_layer` tells which
layers have it), reached through a recording scope that the layers'
`call` consults while `collect_attention` runs (no method is replaced;
the model is not rewired or rebuilt): the package's layers implement it
(those with a `return_attention_scores` argument by describing their
scores in `describe_attention`, an `AttentionRNNDecoder` by switching its
alignment history on), and a new attention layer is recorded by deriving
from `AttentionRecording` and implementing the hook, or by subclassing
one of the package's layers, with no edit here. This works for
functional, Sequential and subclassed models, models loaded from `.keras`
files, a single block or layer, and on every Keras backend.
"""

import keras

from keras_attention.layers import recording
from keras_attention.utils import validation


def is_attention_layer(layer):
    """Whether `layer` records its attention weights: it implements the
    hook `call_with_attention` (see `keras_attention/layers/recording.py`;
    every attention layer of the package does, and a new layer joins by
    implementing it). Its own sublayers are not searched: an
    `AttentionRNNDecoder`'s attention runs inside its loop."""
    return callable(getattr(layer, "call_with_attention", None))


class AttentionMaps(dict):
    """What `collect_attention` returns: `{name: weights}` plus metadata.

    A `dict` from a path-like layer name to NumPy float32 weights
    `(batch, heads, Tq, Tk)`, in call order, with `metadata`, a `dict` from
    the same names to one record each (kind, token sides, masks, ...; see
    the module docstring of `keras_attention.visualization.collect`). A
    plain copy (`dict(maps)`) keeps the weights and loses the metadata.

    Args:
        weights: optional mapping or iterable of `(name, weights)`.
        metadata: optional `dict` from the same names to records.
    """

    def __init__(self, weights=(), metadata=None):
        super().__init__(weights)
        self.metadata = dict(metadata or {})

    def __repr__(self):
        items = ", ".join(
            f"{name!r}: {self.metadata.get(name, {}).get('kind', '?')} "
            f"{tuple(w.shape)}"
            for name, w in self.items()
        )
        return f"AttentionMaps({{{items}}})"


def _sublayers(layer):
    """The layers directly tracked by `layer`, in tracking order."""
    if hasattr(layer, "_flatten_layers"):
        return list(layer._flatten_layers(include_self=False, recursive=False))
    return []


def _all_built(layer):
    return layer.built and all(map(_all_built, _sublayers(layer)))


def attention_layers(model):
    """Every attention layer of `model`, with its path-like name.

    Walks the layer tree depth first, in tracking order. A shared layer is
    listed once (under its first path); the sublayers of an attention layer
    are not searched.

    Args:
        model: a Keras model or layer.

    Returns:
        A list of `(path, layer, parent)`: path components are layer names
        joined by `/` (the model's own name left out unless `model` is
        itself an attention layer); `parent` is the enclosing layer.

    Example:

    >>> import keras_attention
    >>> from keras_attention.visualization import collect
    >>> block = keras_attention.blocks.TransformerEncoderBlock(
    ...     num_heads=2, intermediate_dim=8, name="block")
    >>> block.build((None, 5, 4))
    >>> [path for path, _, _ in collect.attention_layers(block)]
    ['self_attention']
    """
    found, seen, used = [], set(), set()

    def visit(layer, path, parent):
        if id(layer) in seen:
            return
        seen.add(id(layer))
        if is_attention_layer(layer):
            name, n = path or layer.name, 1
            while name in used:  # two sublayers with one name
                n += 1
                name = f"{path or layer.name}_{n}"
            used.add(name)
            found.append((name, layer, parent))
            return
        for child in _sublayers(layer):
            visit(child, f"{path}/{child.name}" if path else child.name, layer)

    visit(model, "", None)
    return found


def _on_target_side(parent):
    """Whether `parent`, a layer but not a model, holds a cross-attention
    layer (a decoder block)."""
    if parent is None or isinstance(parent, keras.Model):
        return False
    return any(
        getattr(child, "attention_kind", None) == "cross"
        for child in _sublayers(parent)
    )


class _Recorder:
    """Records the selected attention layers' weights, through the
    recording scope their `call` consults (`layers/recording.py`)."""

    def __init__(self, layers, max_dense_length, reserved=()):
        self.layers = layers
        self.max_dense_length = max_dense_length
        # Keys only a layer's first call may take: every attention
        # layer's path (also of layers not selected).
        self.reserved = set(reserved) | {path for path, _, _ in layers}
        self.records = []  # (key, weights, metadata)
        self.calls = {}
        self._keys = set()
        self._selected = {
            id(layer): (path, parent) for path, layer, parent in layers
        }
        self._active = set()  # layers whose call is being recorded
        self._scope = None

    def __enter__(self):
        for path, layer, _ in self.layers:
            if getattr(layer, "flash_attention", None) is True:
                raise ValueError(
                    f"Attention layer {path!r} was built with "
                    "`flash_attention=True`, which computes no attention "
                    "weights. Rebuild it with `flash_attention=None` (the "
                    "default) to collect them. Received: "
                    f"flash_attention={layer.flash_attention!r}"
                )
            if not recording.consults_recording(layer):
                raise TypeError(
                    f"Attention layer {path!r} implements "
                    "`call_with_attention` but its class does not derive "
                    "from `keras_attention.visualization.AttentionRecording`"
                    ", so its `call` never consults the recording scope. "
                    "Derive the class from it to record its weights. "
                    f"Received: {type(layer).__name__!r}"
                )
        self._scope = recording.recording(self)
        self._scope.__enter__()
        return self

    def __exit__(self, *exc):
        scope, self._scope = self._scope, None
        return scope.__exit__(*exc)

    def wants(self, layer):
        return id(layer) in self._selected and id(layer) not in self._active

    def record(self, layer, call, args, kwargs):
        path, parent = self._selected[id(layer)]
        options = {"max_dense_length": self.max_dense_length}
        self._active.add(id(layer))
        try:
            outputs, weights, meta = layer.call_with_attention(
                call, args, kwargs, options
            )
        finally:
            self._active.discard(id(layer))
        meta.setdefault("layer", type(layer).__name__)
        if meta["kind"] == "self":
            meta.setdefault("on_target_side", _on_target_side(parent))
        self._record(path, weights, meta)
        return outputs

    def _key(self, path, index):
        """The unique key of call `index` (0-based) of the layer at `path`
        (the rule is in the module docstring)."""
        if index == 0:
            return path
        marks = "#"
        while (key := f"{path}{marks}{index + 1}") in (
            self.reserved | self._keys
        ):
            marks += "#"
        return key

    def _record(self, path, weights, meta):
        index = self.calls.get(path, 0)
        self.calls[path] = index + 1
        key = self._key(path, index)
        self._keys.add(key)
        meta.update(
            num_heads=int(weights.shape[1]),
            query_length=int(weights.shape[2]),
            key_length=int(weights.shape[3]),
            path=path,
            call_index=index,
        )
        meta.setdefault("heads_averaged", False)
        meta.setdefault("global_mask", None)
        self.records.append((key, weights.astype("float32"), meta))


def _token_sides(records):
    """Fills `query_tokens`/`key_tokens` (see the module docstring)."""
    has_target = any(m["kind"] in ("cross", "decoder") for _, _, m in records)
    for _, _, meta in records:
        kind = meta["kind"]
        target_self = meta.pop("on_target_side", False) or (
            has_target and meta["causal"]
        )
        if kind in ("cross", "decoder"):
            sides = ("target_tokens", "tokens")
        elif kind == "pooling":
            sides = (None, "tokens")
        elif target_self:
            sides = ("target_tokens", "target_tokens")
        else:
            sides = ("tokens", "tokens")
        meta["query_tokens"], meta["key_tokens"] = sides


def layer_names(layers):
    """`layers` (a name, a list of names or None) as a list of names, or
    None for all layers.

    Raises:
        TypeError: when `layers` or one of its items is not a string.
        ValueError: when `layers` is an empty list.
    """
    if layers is None:
        return None
    if isinstance(layers, str):
        return [layers]
    if not isinstance(layers, (list, tuple)) or not all(
        isinstance(name, str) for name in layers
    ):
        raise TypeError(
            "`layers` must be a layer name, a list of layer names or None. "
            f"Received: layers={layers!r}"
        )
    if not layers:
        raise ValueError(
            "`layers` must name at least one layer (None selects all "
            f"attention layers). Received: layers={layers!r}"
        )
    return list(layers)


def select_attention_layers(model, layers=None, inputs=None):
    """The attention layers of `model` that `layers` selects.

    Args:
        model: a Keras model or layer.
        layers: a name or list of names of attention layers or of layers
            holding them (paths as `attention_layers` gives them), or None
            for all.
        inputs: optional inputs of `model`: when some of its layers are
            not built yet (blocks create their sublayers in `build`), the
            model is called on them once so that every attention layer
            exists.

    Returns:
        A list of `(path, layer, parent)`, as `attention_layers`.

    Raises:
        TypeError, ValueError: when `layers` is not a name or a list of
            names, or when a name matches no attention layer (the message
            lists the model's attention layers).
    """
    wanted = layer_names(layers)
    if inputs is not None and not _all_built(model):
        model(inputs, training=False)
    found = attention_layers(model)
    if wanted is None:
        return found
    paths = [path for path, _, _ in found]

    def selected(path, name):
        return path == name or path.startswith(f"{name}/")

    for name in wanted:
        if not any(selected(path, name) for path in paths):
            raise ValueError(
                "`layers` must name attention layers of the model, or "
                f"layers holding them: none is at or under {name!r}. The "
                f"model's attention layers: {paths!r}. Received: "
                f"layers={layers!r}"
            )
    return [item for item in found if any(selected(item[0], n) for n in wanted)]


def collect_attention(model, inputs, layers=None, max_dense_length=2048):
    """Every attention layer's weights from one forward pass of `model`.

    Runs `model(inputs, training=False)` once, eagerly, with each attention
    layer temporarily asked for its weights (see the module docstring of
    `keras_attention.visualization.collect`), and returns them by layer:
    `MultiHeadAttention`, `SelfAttention`, `CausalSelfAttention`,
    `CrossAttention`, `LocalSelfAttention` (banded weights expanded to
    dense `(T, T)`), `MultiHeadLatentAttention`, those inside
    `TransformerEncoderBlock` and `TransformerDecoderBlock` (self- and
    cross-attention), the alignment of
    an `AttentionRNNDecoder` (teacher forcing: `(batch, 1, Tt, Ts)`),
    `AttentionPooling` (`(batch, 1, 1, T)`) and `BahdanauAttention` /
    `LuongAttention` (any `Seq2SeqAttention`) called directly
    (`(batch, 1, Tq, Tv)`).

    Args:
        model: a built Keras model (functional, Sequential, subclassed,
            or loaded from a `.keras` file) or layer using the package's
            attention layers.
        inputs: what `model` is called with (an array, a list or a dict of
            arrays), e.g. a small batch of probe sentences.
        layers: optional name or list of names: only the attention layers
            at those paths or under them (`"encoder_block_1"` selects the
            block's attention). A `ValueError` lists the model's attention
            layers when a name matches none.
        max_dense_length: int or None, the longest sequence whose
            `LocalSelfAttention` weights are expanded to dense `(T, T)`
            (a `ValueError` beyond it); None for no limit.

    Returns:
        An `AttentionMaps`: a `dict` `{path-like layer name: NumPy float32
        weights (batch, heads, Tq, Tk)}` in call order, with
        `.metadata[name]` (kind `"self"`/`"cross"`/`"decoder"`/
        `"pooling"`, which token list labels rows and columns, lengths,
        padding masks, ...), as described in the module docstring.

    Raises:
        ValueError: for a name in `layers` that matches no attention layer
            (or an empty list), a `LocalSelfAttention` longer than
            `max_dense_length`, or a layer built with
            `flash_attention=True` (it computes no weights).
        TypeError: when `layers` is not a name, a list of names or None.

    Example:

    >>> import numpy as np
    >>> import keras
    >>> import keras_attention
    >>> from keras_attention.visualization import collect_attention
    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(50, 8, mask_zero=True)(tokens)
    >>> x = keras_attention.blocks.TransformerEncoderBlock(
    ...     num_heads=2, intermediate_dim=16, name="encoder_block_1")(x)
    >>> x = keras_attention.layers.AttentionPooling(name="pool")(x)
    >>> model = keras.Model(tokens, keras.layers.Dense(2)(x))
    >>> ids = np.array([[5, 6, 7, 0], [8, 9, 10, 11]])
    >>> maps = collect_attention(model, ids)
    >>> {name: w.shape for name, w in maps.items()}
    {'encoder_block_1/self_attention': (2, 2, 4, 4), 'pool': (2, 1, 1, 4)}
    >>> pool = maps.metadata["pool"]
    >>> pool["kind"], pool["query_tokens"], pool["key_tokens"]
    ('pooling', None, 'tokens')
    >>> weights = maps["encoder_block_1/self_attention"]
    >>> float(weights[0, :, :, 3].max())  # example 0's padded token
    0.0

    References:
        - Vig, 2019, "A Multiscale Visualization of Attention in the
          Transformer Model" (BertViz).
        - Hugging Face Transformers' `output_attentions=True` (every
          layer's weights, `(batch, heads, Tq, Tk)` per layer).
    """
    validation.check_positive_int(
        "max_dense_length", max_dense_length, allow_none=True
    )
    # Layers that create their sublayers in `build` (the blocks) show
    # their attention layers after a first call.
    found = select_attention_layers(model, layers, inputs)
    reserved = [path for path, _, _ in attention_layers(model)]
    with _Recorder(found, max_dense_length, reserved) as recorder:
        model(inputs, training=False)
    _token_sides(recorder.records)
    return AttentionMaps(
        [(name, w) for name, w, _ in recorder.records],
        {name: meta for name, _, meta in recorder.records},
    )
