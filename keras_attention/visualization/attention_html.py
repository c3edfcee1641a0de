"""An interactive attention explorer: one self-contained HTML file.

The weights of every attention layer are quantized to 8 bits (the largest
`top_k` entries of each query row when rows are long) and embedded as
base64 in the page next to the explorer's JavaScript and CSS (shipped in
`keras_attention/visualization/assets/`): the file needs no network, opens
from disk and renders inline in Jupyter.
"""

import base64
import html
import json
import os
import pathlib
import re

import numpy as np

from keras_attention.utils import validation

# The kinds of attention map a layer records (its `describe_attention`
# metadata) and the explorer draws; defined here only.
KINDS = ("self", "cross", "decoder", "pooling")
# Rows with at most this many keys are stored whole (dense), longer ones
# keep their `_DEFAULT_TOP_K` largest weights when `top_k` is None.
_DENSE_KEYS = 64
_DEFAULT_TOP_K = 12
_ASSETS = pathlib.Path(__file__).resolve().parent / "assets"
_FORMAT_VERSION = 1


class AttentionExplorer:
    """The attention explorer's page, as returned by `attention_html`.

    Shows inline in Jupyter (`_repr_html_`: the page in an isolated
    `<iframe srcdoc>`), is written with `save` and is one string in `html`.

    Args:
        html: str, the complete self-contained HTML document.
        height: int, height in pixels of the inline (Jupyter) frame.
    """

    def __init__(self, html, height=720):
        validation.check_positive_int("height", height)
        self.html = html
        self.height = height

    def save(self, path):
        """Writes the page to `path` (UTF-8) and returns `path`."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html)
        return path

    def _repr_html_(self):
        # An iframe keeps the page's ids, styles and script apart from the
        # notebook's (and from other explorers in the same notebook).
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" '
            f'style="width: 100%; height: {self.height}px; border: 0" '
            'sandbox="allow-scripts"></iframe>'
        )

    def __repr__(self):
        return f"<AttentionExplorer: {len(self.html)} characters of HTML>"


def attention_html(
    attentions,
    tokens,
    target_tokens=None,
    path=None,
    batch_index=None,
    kinds=None,
    top_k=None,
    title=None,
    images=None,
    image_grid=None,
):
    """An interactive attention explorer (BertViz-style) in one HTML file.

    The page has three parts:

    - a *head view*: query tokens on the left, key tokens on the right,
      one line per weight (opacity = weight, one color per head); choose
      the layer and the heads, hover a token to see what it attends to
      (left) or what attends to it (right);
    - a *model view*: a grid of heatmap thumbnails, layers × heads
      (color = square root of the weight, so that spread-out attention
      stays visible); click one to open it in the head view;
    - a choice of the attention shown, for encoder–decoder models:
      (encoder) self-attention (`tokens` × `tokens`), decoder
      self-attention (`target_tokens` × `target_tokens`),
      cross-attention (`target_tokens` × `tokens`), the alignment of an
      `AttentionRNNDecoder` and attention pooling (learned query ×
      `tokens`); and of the batch item, when several are embedded.

    The page is self-contained (inline JavaScript and CSS, no network) and
    stays usable at 500 tokens × 12 layers × 12 heads: weights are stored
    as 8-bit integers (error at most `scale / 510`, `scale` = 1 for
    softmax weights) and rows longer than 64 keys keep only their `top_k`
    largest weights (about 2 MB per sentence at that size).

    Args:
        attentions: what `keras_attention.visualization.collect_attention`
            returns (an `AttentionMaps`: its `metadata` says each layer's
            kind and which tokens label its rows and columns), or a plain
            dict from layer name to weights `(batch, heads, T_query,
            T_key)` (`(heads, T_query, T_key)` and `(T_query, T_key)` are
            one batch item / one head), or to records `{"weights": ...,
            "kind": ..., "query_tokens": ..., "key_tokens": ...}` like
            `AttentionMaps.metadata`'s. Weights must be finite and
            non-negative.
        tokens: the source tokens (keys of self- and cross-attention):
            a list of strings shared by all batch items, or one list per
            batch item (then shorter lists than the weights' positions
            are padding, cut off).
        target_tokens: the target (decoder) tokens of an encoder–decoder
            model, same forms as `tokens`; `None` when there is no
            separate target sequence.
        path: optional file name; the page is written there when given.
        batch_index: int or list of ints, the batch items to embed (all
            of them, selectable in the page, when `None`).
        kinds: optional dict from layer name to `"self"`, `"cross"`,
            `"decoder"` (an RNN decoder's alignment) or `"pooling"`,
            overriding the reported kind. Kinds not reported are guessed
            from shapes: square weights are self-attention (over
            `target_tokens` when they have its length and `tokens` do
            not, or when the name contains "decoder"), others are
            cross-attention when `target_tokens` is given and pooling
            otherwise.
        top_k: int, the weights kept per query row (its largest);
            `None` keeps whole rows of at most 64 keys and the 12 largest
            weights of longer ones.
        title: optional title of the page.
        images: optional image mode, for attention over an image's grid
            of cells (an image captioner's words over its feature map, a
            vision transformer's patches): one image `(H, W)` or `(H, W,
            channels)` (1 or 3 channels; floats in [0, 1] or uint8) for
            every batch item, or one per batch item (a list, or an array
            `(batch, H, W[, channels])`; a 3-D array is one image when
            its last axis is 1 or 3, else `(batch, H, W)`). The page then
            has an *image view*: for the chosen layer, one picture per
            query token with its weights (mean of the selected heads)
            upsampled bilinearly over the image. It shows the layers whose
            keys are `tokens` and number `rows * columns` of
            `image_grid`; those layers are stored whole (all keys),
            whatever `top_k` says.
        image_grid: `(rows, columns)` of the cells the keys are, in row-
            major order (the `tokens` name them, e.g. `r0c0`, `r0c1`,
            ...); required with `images`.

    Returns:
        an `AttentionExplorer`: the page in `.html`, `.save(path)`, shown
        inline by Jupyter.

    Raises:
        ValueError: when an argument has the wrong form: weights of the
            wrong rank or with negative values, token counts that do not
            match the weights' positions, an unknown kind, a batch index
            out of range.

    Example:

    >>> import numpy as np
    >>> from keras_attention.visualization import attention_html
    >>> rng = np.random.default_rng(0)
    >>> w = rng.dirichlet(np.ones(3), size=(1, 2, 3))  # (batch, heads, Tq, Tk)
    >>> page = attention_html({"encoder/self": w}, ["the", "cat", "sat"])
    >>> page.html.startswith("<!DOCTYPE html>")
    True
    >>> "http://" in page.html or "https://" in page.html
    False

    References:
        Vig (2019): [A Multiscale Visualization of Attention in the
        Transformer Model](https://arxiv.org/abs/1906.05714) (BertViz,
        whose head and model views this explorer follows).
    """
    top_k = validation.check_positive_int("top_k", top_k, allow_none=True)
    if title is not None and not isinstance(title, str):
        raise TypeError(
            f"`title` must be a string or None. Received: title={title!r}"
        )
    layers = _layers_of(attentions, kinds)
    batch = _batch_size(layers)
    items = _batch_items(batch_index, batch)
    sources = _token_lists("tokens", tokens, batch)
    targets = (
        None
        if target_tokens is None
        else _token_lists("target_tokens", target_tokens, batch)
    )
    cells = _image_cells(images, image_grid)
    encoded = []
    for name, record, weights in layers:
        kind, *sides = _sides_of(name, record, weights, sources, targets)
        _check_tokens(name, kind, weights, sides, sources, targets)
        over_image = sides[1] == "tokens" and weights.shape[-1] == cells
        layer_top_k = weights.shape[-1] if over_image else top_k
        layer = _encode_layer(name, kind, weights[items], layer_top_k)
        group, label = _group(kind, *sides)
        layer.update(query=sides[0], key=sides[1], group=group, label=label)
        encoded.append(layer)
    data = {
        "version": _FORMAT_VERSION,
        "title": title or "Attention explorer",
        "batch": items,
        "tokens": [sources[b] for b in items],
        "target_tokens": (
            None if targets is None else [targets[b] for b in items]
        ),
        "layers": encoded,
    }
    if cells:
        if not any(
            layer["key"] == "tokens" and layer["keys"] == cells
            for layer in encoded
        ):
            raise ValueError(
                "With `images`, some layer of `attentions` must attend "
                f"over the {cells} cells of `image_grid` (its keys: "
                "`tokens`, one per cell). Received: image_grid="
                f"{tuple(image_grid)!r}, keys per layer "
                f"{ {layer['name']: layer['keys'] for layer in encoded}!r}"
            )
        data["image"] = _image_data(images, image_grid, items, batch)
    page = AttentionExplorer(_page(data))
    if path is not None:
        page.save(os.fspath(path))
    return page


def _layers_of(attentions, kinds):
    """`[(name, record, float32 (batch, heads, Tq, Tk))]`; `record`: the
    kind and token sides reported (`{}` when nothing was)."""
    if not hasattr(attentions, "items") or not len(attentions):
        raise ValueError(
            "`attentions` must be a non-empty dict from layer name to "
            f"weights. Received: attentions={_short(attentions)}"
        )
    if kinds is not None and not hasattr(kinds, "items"):
        raise ValueError(
            "`kinds` must be a dict from layer name to kind. "
            f"Received: kinds={kinds!r}"
        )
    kinds = dict(kinds or {})
    for name in kinds:
        if name not in attentions:
            raise ValueError(
                "`kinds` names a layer that `attentions` does not have. "
                f"Received: kinds key {name!r}, layers {list(attentions)!r}"
            )
    metadata = getattr(attentions, "metadata", None) or {}
    layers = []
    for name, value in attentions.items():
        record = dict(metadata.get(name) or {})
        if hasattr(value, "items") and "weights" in value:
            record = dict(value)
            value = record.pop("weights")
        source = f"attentions[{name!r}]['kind']"
        if name in kinds:  # the user's kind; its sides are guessed
            record = {"kind": kinds[name]}
            source = f"kinds[{name!r}]"
        kind = record.get("kind")
        if kind is not None and (
            not isinstance(kind, str) or kind not in KINDS
        ):
            raise ValueError(
                f"`{source}`, the kind of layer {name!r}, must be one of "
                f"{KINDS!r}. Received: {source}={kind!r}"
            )
        layers.append((str(name), record, _as_weights(name, value)))
    return layers


def _as_weights(name, value):
    try:
        with np.errstate(over="ignore"):  # beyond float32: inf, refused
            weights = np.asarray(
                value.numpy() if hasattr(value, "numpy") else value,
                dtype="float32",
            )
    except (TypeError, ValueError) as e:  # strings, ragged lists, ...
        raise TypeError(
            f"`attentions[{name!r}]` must be an array of numbers (batch, "
            f"heads, T_query, T_key). Received: attentions[{name!r}]="
            f"{_short(value)} ({e})"
        ) from None
    if weights.ndim in (2, 3):  # one head / one batch item
        weights = weights.reshape((1,) * (4 - weights.ndim) + weights.shape)
    if weights.ndim != 4 or 0 in weights.shape:
        raise ValueError(
            f"`attentions[{name!r}]` must have shape (batch, heads, T_query, "
            f"T_key) (or (heads, T_query, T_key), (T_query, T_key)). "
            f"Received: attentions[{name!r}].shape={np.shape(value)!r}"
        )
    if weights.shape[-1] > 65535:
        raise ValueError(
            f"`attentions[{name!r}]` has more than 65535 keys. Received: "
            f"attentions[{name!r}].shape={weights.shape!r}"
        )
    bad = (~np.isfinite(weights)).sum(), (weights < 0).sum()
    if any(bad):
        raise ValueError(
            f"`attentions[{name!r}]` must be finite and non-negative "
            f"(attention weights). Received: {bad[0]} non-finite (or beyond "
            f"float32's range) and {bad[1]} negative values in "
            f"attentions[{name!r}]"
        )
    return weights


def _batch_size(layers):
    sizes = {name: w.shape[0] for name, _, w in layers}
    batch = max(sizes.values())
    bad = {n: s for n, s in sizes.items() if s != batch}
    if bad:
        raise ValueError(
            "Every layer of `attentions` must have the same batch size. "
            f"Received: batch sizes {sizes!r}"
        )
    return batch


def _batch_items(batch_index, batch):
    if batch_index is None:
        return list(range(batch))
    array = isinstance(batch_index, np.ndarray)
    if isinstance(batch_index, (list, tuple)) or (
        array and batch_index.ndim == 1
    ):
        indices = list(batch_index)
    elif array and batch_index.ndim == 0:  # a 0-d NumPy integer array
        indices = [batch_index[()]]
    else:
        indices = [batch_index]
    for i in indices:
        if not validation.is_int(i):
            raise ValueError(
                "`batch_index` must be an int or a list of ints. "
                f"Received: batch_index={batch_index!r}"
            )
        if not -batch <= i < batch:
            raise ValueError(
                f"`batch_index` must be in [0, {batch}) (the batch size). "
                f"Received: batch_index={batch_index!r}"
            )
    if not indices:
        raise ValueError(
            f"`batch_index` must not be empty. Received: {batch_index!r}"
        )
    return [int(i) % batch for i in indices]


def _token_lists(name, tokens, batch):
    """`batch` lists of strings, and whether they were given per item."""
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__len__"):
        raise ValueError(
            f"`{name}` must be a list of strings or one list per batch "
            f"item. Received: {name}={tokens!r}"
        )
    tokens = list(tokens)
    per_item = bool(tokens) and all(
        not isinstance(t, (str, bytes)) and hasattr(t, "__len__")
        for t in tokens
    )
    if not per_item:
        return _TokenLists([_strings(name, tokens)] * batch, exact=True)
    if len(tokens) != batch:
        raise ValueError(
            f"`{name}` must have one token list per batch item ({batch}). "
            f"Received: {len(tokens)} lists"
        )
    return _TokenLists([_strings(name, t) for t in tokens], exact=False)


class _TokenLists(list):
    """Token lists per batch item; `exact`: one list given for all."""

    def __init__(self, lists, exact):
        super().__init__(lists)
        self.exact = exact


def _strings(name, tokens):
    if not len(tokens):
        raise ValueError(f"`{name}` must not be empty. Received: {name}=[]")
    return [
        t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t)
        for t in tokens
    ]


def _sides_of(name, record, weights, sources, targets):
    """`(kind, query side, key side)`, sides named as the arguments
    (`"tokens"`, `"target_tokens"`; None: learned queries)."""
    queries, keys = weights.shape[2:]
    kind = record.get("kind")
    if kind is None:
        if queries == keys:
            kind = "self"
        else:
            kind = "pooling" if targets is None else "cross"
    if "query_tokens" in record and "key_tokens" in record:
        return kind, record["query_tokens"], record["key_tokens"]
    if kind == "pooling":
        return kind, None, "tokens"
    if kind in ("cross", "decoder"):
        return kind, "target_tokens", "tokens"
    # self-attention over the target: a square matrix of its length
    # (when the source's differs) or a decoder's layer (by name)
    on_target = targets is not None and (
        keys == len(targets[0]) != len(sources[0])
        or (keys == len(targets[0]) and "decoder" in name.lower())
    )
    side = "target_tokens" if on_target else "tokens"
    return kind, side, side


# The page's "Attention" choice: (kind, query side) -> (id, label).
_GROUPS = {
    ("self", "tokens"): ("self", "Self-attention"),
    ("self", "target_tokens"): ("target-self", "Decoder self-attention"),
    ("cross", "target_tokens"): ("cross", "Cross-attention"),
    ("decoder", "target_tokens"): ("decoder", "Decoder attention (RNN)"),
    ("pooling", None): ("pooling", "Attention pooling"),
}


def _group(kind, query_side, key_side):
    default = (f"{kind}:{query_side}:{key_side}", f"{kind} attention")
    return _GROUPS.get((kind, query_side), default)


def _check_tokens(name, kind, weights, sides, sources, targets):
    if "target_tokens" in sides and targets is None:
        raise ValueError(
            f"Layer {name!r} ({kind} attention) has the target sequence on "
            "one side: `target_tokens` (the decoder's tokens) must be "
            "given. Received: target_tokens=None"
        )
    lists = {"tokens": sources, "target_tokens": targets}
    for side, arg, axis in zip(("query", "key"), sides, (2, 3)):
        if arg is None and side == "query":  # learned queries (pooling)
            continue
        if arg not in lists:
            raise ValueError(
                f"The {side} tokens of layer {name!r} must be 'tokens' or "
                f"'target_tokens'. Received: {arg!r}"
            )
        positions = weights.shape[axis]
        counts = {len(t) for t in lists[arg]}
        exact = lists[arg].exact
        if counts != {positions} if exact else max(counts) > positions:
            raise ValueError(
                f"`{arg}` must have one token per {side} position of the "
                f"{kind} attention {name!r}. Received: {sorted(counts)} "
                f"tokens, attentions[{name!r}].shape={weights.shape!r}"
            )


def _encode_layer(name, kind, weights, top_k):
    """One layer's weights as 8-bit codes (and key indices), base64."""
    batch, heads, queries, keys = weights.shape
    k = keys if top_k is None and keys <= _DENSE_KEYS else top_k
    k = min(k or _DEFAULT_TOP_K, keys)
    scale = max(float(weights.max()), 1.0)
    dense = k == keys
    if dense:
        indices, values = None, weights
    else:
        # the k largest weights of each row, in key order
        indices = np.sort(
            np.argpartition(-weights, k - 1, axis=-1)[..., :k], axis=-1
        )
        values = np.take_along_axis(weights, indices, axis=-1)
    codes = np.rint(values / scale * 255).astype("uint8")
    # layout: [uint16 key indices, little-endian (sparse only)][uint8 codes]
    # both (batch, heads, T_query, k), C order
    payload = codes.tobytes()
    if not dense:
        payload = indices.astype("<u2").tobytes() + payload
    return {
        "name": name,
        "kind": kind,
        "heads": heads,
        "queries": queries,
        "keys": keys,
        "k": k,
        "dense": dense,
        "scale": scale,
        "data": base64.b64encode(payload).decode("ascii"),
    }


def _asset(name):
    return (_ASSETS / name).read_text(encoding="utf-8")


def _image_asset(extension, image_mode):
    """The image view (only in pages with `images`): appended after
    explorer.js / explorer.css, it reads the decoded layers and the state
    that script exposes (`window.kaExplorer`) and redraws after every
    interaction."""
    if not image_mode:
        return ""
    return "\n" + _asset(f"explorer_image.{extension}")


def _page(data):
    # `<` escaped (`\u003c`, still JSON): nothing in the data can end or
    # comment out its <script> element.
    image_mode = "image" in data
    parts = {
        "title": html.escape(data["title"]),
        "css": _asset("explorer.css") + _image_asset("css", image_mode),
        "js": _asset("explorer.js") + _image_asset("js", image_mode),
        "data": json.dumps(data, separators=(",", ":")).replace("<", "\\u003c"),
    }
    # one pass over the template: inserted text is never substituted again
    return re.sub(
        r"\{\{(\w+)\}\}",
        lambda m: parts[m.group(1)],
        _asset("explorer.html"),
    )


def _image_cells(images, image_grid):
    """`rows * columns` of `image_grid` (checked), 0 without images."""
    if images is None and image_grid is None:
        return 0
    if images is None or image_grid is None:
        raise ValueError(
            "`images` and `image_grid` go together: the image view needs "
            "the images and the `(rows, columns)` of the cells the keys "
            f"are. Received: images={_short(images)}, "
            f"image_grid={image_grid!r}"
        )
    grid = tuple(image_grid) if hasattr(image_grid, "__len__") else ()
    if len(grid) != 2 or not all(validation.is_int(n) and n > 0 for n in grid):
        raise ValueError(
            "`image_grid` must be `(rows, columns)`, two positive ints. "
            f"Received: image_grid={image_grid!r}"
        )
    return int(grid[0]) * int(grid[1])


def _image_data(images, image_grid, items, batch):
    """The images of the embedded batch items as 8-bit pixels, base64:
    `{"grid": [rows, columns], "items": [{"width", "height",
    "channels", "pixels"}]}` (pixels `(height, width, channels)`, C
    order)."""
    if hasattr(images, "numpy"):
        images = images.numpy()
    one = isinstance(images, np.ndarray) and (
        images.ndim == 2 or (images.ndim == 3 and images.shape[-1] in (1, 3))
    )
    if one:
        per_item = [images] * batch
    elif isinstance(images, (list, tuple, np.ndarray)):
        per_item = list(images)
        if len(per_item) != batch:
            raise ValueError(
                f"`images` must be one image for all batch items or one "
                f"per batch item ({batch}). Received: {len(per_item)} "
                "images"
            )
    else:
        raise ValueError(
            "`images` must be an array `(H, W)`, `(H, W, channels)` or "
            "`(batch, H, W[, channels])`, or a list of images. Received: "
            f"images={_short(images)}"
        )
    encoded = []
    for b in items:
        image = np.asarray(per_item[b])
        if image.ndim == 2:
            image = image[..., None]
        if (
            image.ndim != 3
            or image.shape[-1] not in (1, 3)
            or not all(image.shape[:2])
        ):
            raise ValueError(
                "Each image must be `(H, W)` or `(H, W, channels)` with 1 "
                f"or 3 channels. Received: shape {image.shape!r} (batch "
                f"item {b})"
            )
        if image.dtype != np.uint8:
            image = np.asarray(image, "float32")
            if not np.all(np.isfinite(image)):
                raise ValueError(
                    f"`images` must be finite. Received: batch item {b}"
                )
            image = np.rint(np.clip(image, 0.0, 1.0) * 255).astype("uint8")
        encoded.append(
            {
                "height": int(image.shape[0]),
                "width": int(image.shape[1]),
                "channels": int(image.shape[2]),
                "pixels": base64.b64encode(image.tobytes()).decode("ascii"),
            }
        )
    return {"grid": [int(n) for n in image_grid], "items": encoded}


def _short(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
