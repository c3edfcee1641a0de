"""The attention explorer: its HTML (pure Python) and its behaviour in a
real browser (headless Chromium through the DevTools protocol)."""

import base64
import html
import io
import json
import re
import time
import warnings

import browser
import numpy as np
import pytest

from keras_attention.visualization import attention_html

SOURCE = ["the", "cat", "sat", "on", "a", "mat"]
TARGET = ["<s>", "le", "chat", "dort"]


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype("float32")


def _peaked(batch, heads, queries, keys, peak, seed):
    """Random softmax weights where query q of head h attends mostly to
    key `peak(h, q)`."""
    logits = np.random.default_rng(seed).normal(
        size=(batch, heads, queries, keys)
    )
    for h in range(heads):
        for q in range(queries):
            logits[:, h, q, peak(h, q) % keys] += 6.0
    return _softmax(logits)


def _seq2seq():
    """Two encoder self-attention layers, one cross, one decoder layer."""
    s, t = len(SOURCE), len(TARGET)
    return {
        "encoder/0": _peaked(2, 4, s, s, lambda h, q: q + h + 1, 0),
        "encoder/1": _peaked(2, 4, s, s, lambda h, q: q - h - 1, 1),
        "decoder/cross": _peaked(2, 2, t, s, lambda h, q: q + 2 * h, 2),
        "decoder/self": _peaked(2, 2, t, t, lambda h, q: 0, 3),
    }


def _embedded(page):
    """The data the page embeds (the JSON of its #ka-data script)."""
    match = re.search(
        r'<script type="application/json" id="ka-data">(.*?)</script>',
        page.html,
        re.S,
    )
    return json.loads(match.group(1))


def _decode(layer, items):
    """The weights of one embedded layer, `(items, heads, Tq, Tk)`,
    decoded from the format documented in explorer.js (NaN where a
    sparse row dropped a weight)."""
    payload = base64.b64decode(layer["data"])
    shape = (items, layer["heads"], layer["queries"], layer["k"])
    n = int(np.prod(shape))
    if layer["dense"]:
        codes = np.frombuffer(payload, "uint8").reshape(shape)
        return codes / 255 * layer["scale"]
    keys = np.frombuffer(payload[: 2 * n], "<u2").reshape(shape)
    codes = np.frombuffer(payload[2 * n :], "uint8").reshape(shape)
    out = np.full(shape[:3] + (layer["keys"],), np.nan)
    np.put_along_axis(out, keys.astype(int), codes / 255 * layer["scale"], -1)
    return out


# -------------------------------------------------------------- pure Python


def test_page_is_self_contained():
    page = attention_html(_seq2seq(), SOURCE, TARGET, title="A <b>title")
    text = page.html
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"https?:|//cdn|@import|url\(", text)
    assert not re.search(r"<(script|img|link|iframe)[^>]*(src|href)=", text)
    assert "<title>A &lt;b&gt;title</title>" in text


def test_dense_round_trip_within_quantization_error():
    weights = _seq2seq()
    page = attention_html(weights, SOURCE, TARGET)
    data = _embedded(page)
    assert data["tokens"] == [SOURCE, SOURCE]
    assert data["target_tokens"] == [TARGET, TARGET]
    for layer in data["layers"]:
        assert layer["dense"]
        decoded = _decode(layer, 2)
        np.testing.assert_allclose(
            decoded, weights[layer["name"]], rtol=0, atol=0.5 / 255 + 1e-6
        )


def test_top_k_keeps_the_largest_weights_of_each_row():
    weights = _softmax(np.random.default_rng(0).normal(size=(1, 3, 80, 80)))
    page = attention_html({"l": weights}, [str(i) for i in range(80)])
    (layer,) = _embedded(page)["layers"]
    assert not layer["dense"] and layer["k"] == 12  # rows over 64 keys
    decoded = _decode(layer, 1)
    kept = ~np.isnan(decoded)
    assert np.all(kept.sum(-1) == 12)
    # kept weights are within the quantization error, the dropped ones
    # are no larger than the smallest kept one of their row
    np.testing.assert_allclose(
        decoded[kept], weights[kept], rtol=0, atol=0.5 / 255 + 1e-6
    )
    top = np.sort(weights, axis=-1)[..., -12:]
    dropped = np.where(kept, 0, weights).max(-1)
    assert np.all(dropped <= top[..., 0] + 1e-7)
    # top_k given: the k largest, also for short rows
    page = attention_html({"l": weights[..., :10, :10]}, list("abcdefghij"))
    assert _embedded(page)["layers"][0]["dense"]
    page = attention_html(
        {"l": weights[..., :10, :10]}, list("abcdefghij"), top_k=3
    )
    assert _embedded(page)["layers"][0]["k"] == 3


def _kinds(page):
    return {
        x["name"]: (x["kind"], x["query"], x["key"], x["group"])
        for x in _embedded(page)["layers"]
    }


def test_kinds_are_guessed_from_shapes_and_can_be_given():
    page = attention_html(_seq2seq(), SOURCE, TARGET)
    assert _kinds(page) == {
        "encoder/0": ("self", "tokens", "tokens", "self"),
        "encoder/1": ("self", "tokens", "tokens", "self"),
        "decoder/cross": ("cross", "target_tokens", "tokens", "cross"),
        "decoder/self": (
            "self",
            "target_tokens",
            "target_tokens",
            "target-self",
        ),
    }
    pooled = {"pool": np.full((1, 1, 1, 6), 1 / 6), "enc": np.eye(6)}
    page = attention_html(pooled, SOURCE, kinds={"enc": "self"})
    assert _kinds(page) == {
        "pool": ("pooling", None, "tokens", "pooling"),
        "enc": ("self", "tokens", "tokens", "self"),
    }
    # records like collect_attention's metadata, and `kinds` over them
    record = {
        "weights": np.eye(4),
        "kind": "self",
        "query_tokens": "target_tokens",
        "key_tokens": "target_tokens",
    }
    page = attention_html({"a": record}, SOURCE[:4], TARGET)
    assert _kinds(page)["a"] == (
        "self",
        "target_tokens",
        "target_tokens",
        "target-self",
    )
    page = attention_html(
        {"a": record}, SOURCE[:4], TARGET, kinds={"a": "decoder"}
    )
    assert _kinds(page)["a"] == (
        "decoder",
        "target_tokens",
        "tokens",
        "decoder",
    )


def test_batch_index_and_per_item_tokens():
    weights = _seq2seq()
    page = attention_html(weights, SOURCE, TARGET, batch_index=1)
    data = _embedded(page)
    assert data["batch"] == [1]
    layer = data["layers"][0]
    np.testing.assert_allclose(
        _decode(layer, 1)[0], weights["encoder/0"][1], atol=0.5 / 255 + 1e-6
    )
    # one token list per item; shorter lists are padding (cut in the page)
    tokens = [SOURCE, SOURCE[:4]]
    enc = {k: v for k, v in weights.items() if k.startswith("encoder")}
    data = _embedded(attention_html(enc, tokens))
    assert data["tokens"] == tokens


def test_save_repr_html_and_path(tmp_path):
    path = tmp_path / "attention.html"
    page = attention_html(_seq2seq(), SOURCE, TARGET, path=path)
    assert path.read_text(encoding="utf-8") == page.html
    frame = page._repr_html_()
    assert frame.startswith("<iframe srcdoc=")
    assert html.unescape(re.search(r'srcdoc="([^"]*)"', frame)[1]) == (
        page.html
    )
    assert page.save(tmp_path / "b.html") == tmp_path / "b.html"


def test_tokens_cannot_break_out_of_the_data_script():
    tokens = ["</script><script>alert(1)</script>", "<!--", "a"]
    page = attention_html({"l": np.eye(3)}, tokens)
    assert "alert(1)</script>" not in page.html
    assert _embedded(page)["tokens"] == [tokens]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"attentions": {}}, "attentions"),
        ({"attentions": [np.eye(6)]}, "attentions"),
        ({"attentions": {"l": np.ones((1, 1, 1, 6, 6))}}, r"attentions\['l'\]"),
        ({"attentions": {"l": -np.eye(6)}}, "non-negative"),
        ({"attentions": {"l": np.full((6, 6), np.nan)}}, "finite"),
        ({"tokens": SOURCE[:5]}, r"`tokens`.*\[5\] tokens"),
        ({"tokens": "the cat"}, "tokens"),
        ({"tokens": []}, "tokens"),
        ({"target_tokens": TARGET[:3]}, "target_tokens"),
        (
            {
                "attentions": {"x": {"weights": np.eye(6), "kind": "cross"}},
                "target_tokens": None,
            },
            "target_tokens",
        ),
        ({"batch_index": 2}, "batch_index"),
        ({"batch_index": "0"}, "batch_index"),
        ({"kinds": {"encoder/0": "encoder"}}, "kind"),
        ({"kinds": {"nope": "self"}}, "kinds"),
        ({"top_k": 0}, "top_k"),
        ({"tokens": [SOURCE]}, "one token list per batch item"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, match):
    args = {"attentions": _seq2seq(), "tokens": SOURCE, "target_tokens": TARGET}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        attention_html(**args)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        # Found by tests/properties/test_visualization_properties.py:
        # an AttributeError from html.escape, NumPy's errors without the
        # argument, and a record's kind named as a bare `kind`.
        ({"title": 5}, TypeError, "title=5"),
        ({"title": b"x"}, TypeError, "title=b'x'"),
        (
            {"attentions": {"l": np.full((6, 6), "a")}},
            TypeError,
            r"attentions\['l'\]",
        ),
        (
            {"attentions": {"l": [[0.1], [0.2, 0.3]]}},
            TypeError,
            r"attentions\['l'\]",
        ),
        (
            {"attentions": {"l": {"weights": np.eye(6), "kind": "x"}}},
            ValueError,
            r"attentions\['l'\]\['kind'\]='x'",
        ),
        ({"kinds": {"encoder/0": 3}}, ValueError, r"kinds\['encoder/0'\]=3"),
        ({"batch_index": [[0]]}, ValueError, "batch_index"),
        ({"batch_index": np.array([0.5])}, ValueError, "batch_index"),
    ],
)
def test_wrong_types_raise_naming_them(kwargs, error, match):
    args = {"attentions": _seq2seq(), "tokens": SOURCE, "target_tokens": TARGET}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        attention_html(**args)


def test_numpy_integers_are_taken():
    # `top_k=np.int64(2)` reached the page's JSON as a NumPy integer
    # (TypeError: Object of type int64 is not JSON serializable); a 0-d
    # integer array was refused as a batch index.
    page = attention_html(
        _seq2seq(),
        SOURCE,
        TARGET,
        top_k=np.int64(2),
        batch_index=np.array(1),
    )
    data = _embedded(page)
    assert data["batch"] == [1]
    assert {layer["k"] for layer in data["layers"]} == {2}
    page = attention_html(_seq2seq(), SOURCE, TARGET, batch_index=np.int64(-1))
    assert _embedded(page)["batch"] == [1]


def test_weights_beyond_float32_are_refused_quietly():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow RuntimeWarning
        with pytest.raises(ValueError, match="beyond float32"):
            attention_html({"l": np.full((6, 6), 1e300)}, SOURCE)


# ------------------------------------------------------------------ browser

CHROMIUM = browser.find_chromium()
needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def tab():
    pytest.importorskip("websocket", reason="needs websocket-client")
    with browser.Browser(CHROMIUM) as b:
        yield b


@pytest.fixture(scope="module")
def seq2seq_url(tmp_path_factory):
    path = tmp_path_factory.mktemp("explorer") / "seq2seq.html"
    attention_html(_seq2seq(), SOURCE, TARGET, path=path)
    return path.as_uri()


def _open(tab, url):
    tab.open(url)
    tab.wait_until("document.body.dataset.ready === '1'")


def _lines(tab):
    """The highlighted lines: (head, query, key, weight) of each."""
    return tab.evaluate(
        "Array.from(document.querySelectorAll('#ka-focus line.ka-line'))"
        ".map((l) => [+l.dataset.head, +l.dataset.query, +l.dataset.key,"
        " +l.dataset.weight])"
    )


def _attended(tab, column):
    """Indices of the highlighted tokens of a column."""
    return tab.evaluate(
        f"Array.from(document.querySelectorAll('#{column} .ka-token'))"
        ".flatMap((t, i) => t.classList.contains('ka-attended') ? [i] : [])"
    )


def _hover(tab, column, index):
    x, y = tab.center_of(f"#{column} .ka-token:nth-child({index + 1})")
    tab.move_mouse(x, y)


def _choose(tab, select, value):
    tab.evaluate(
        f"(() => {{ const s = document.getElementById({select!r});"
        f" s.value = {value!r};"
        " s.dispatchEvent(new Event('change')); })()"
    )


def _png_std(png):
    from PIL import Image

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L"), "float32")
    return pixels.std(), pixels.shape


@needs_browser
def test_browser_renders_without_errors(tab, seq2seq_url):
    _open(tab, seq2seq_url)
    assert tab.problems() == []
    # nothing but the file itself is loaded
    assert all(u.startswith(("file:", "data:")) for u in tab.requests())
    counts = tab.evaluate(
        "[document.querySelectorAll('#ka-queries .ka-token').length,"
        " document.querySelectorAll('#ka-keys .ka-token').length,"
        " document.querySelectorAll('.ka-thumb').length,"
        " Array.from(document.getElementById('ka-kind').options)"
        ".map((o) => o.value)]"
    )
    assert counts == [6, 6, 2 * 4, ["self", "target-self", "cross"]]
    # the thumbnails and the line canvas are drawn (not blank)
    spread = tab.evaluate(
        "Array.from(document.querySelectorAll('canvas')).map((c) => {"
        " const d = c.getContext('2d').getImageData(0, 0, c.width,"
        " c.height).data; let lo = 255, hi = 0;"
        " for (let i = 0; i < d.length; i += 4) {"
        "  const v = d[i] + d[i + 1] + d[i + 2] + d[i + 3];"
        "  lo = Math.min(lo, v); hi = Math.max(hi, v); }"
        " return hi - lo; })"
    )
    assert len(spread) == 9 and min(spread) > 100


@needs_browser
def test_browser_hover_layer_and_head_change_the_highlight(tab, seq2seq_url):
    weights = _seq2seq()
    _open(tab, seq2seq_url)
    assert _lines(tab) == [] and _attended(tab, "ka-keys") == []
    # hover query 1 of layer encoder/0, all heads: one line per head and
    # stored weight, all from query 1; its peak (head h: key 2 + h) lit
    _hover(tab, "ka-queries", 1)
    lines = _lines(tab)
    assert {line[1] for line in lines} == {1}
    assert {line[0] for line in lines} == {0, 1, 2, 3}
    w = weights["encoder/0"][0, :, 1]  # (heads, keys)
    for h, q, k, weight in lines:
        assert abs(weight - w[h, k]) <= 0.5 / 255 + 1e-4
    lit = set(_attended(tab, "ka-keys"))
    assert {2, 3, 4, 5} <= lit
    assert tab.evaluate(
        "document.querySelector('#ka-queries .ka-token:nth-child(2)')"
        ".classList.contains('ka-focus')"
    )
    # head 0 only (click its checkbox off and on through the buttons)
    tab.evaluate("document.getElementById('ka-no-heads').click()")
    x, y = tab.center_of("#ka-heads label:nth-child(1) input")
    tab.click(x, y)
    _hover(tab, "ka-queries", 1)
    lines = _lines(tab)
    assert {line[0] for line in lines} == {0}
    strongest = max(lines, key=lambda line: line[3])
    assert strongest[2] == 2  # head 0 of encoder/0: key q + 1
    # layer encoder/1, head 0: query 1 now looks at key 0 (q - 1)
    _choose(tab, "ka-layer", "1")
    tab.evaluate("window.kaExplorer.setHeads([0])")
    _hover(tab, "ka-queries", 2)
    _hover(tab, "ka-queries", 1)
    lines = _lines(tab)
    assert max(lines, key=lambda line: line[3])[2] == 0
    # hover a key: the lines that reach it, from any query
    _hover(tab, "ka-keys", 3)
    lines = _lines(tab)
    assert lines and {line[2] for line in lines} == {3}
    assert len({line[1] for line in lines}) > 1
    # leaving the columns clears the highlight
    tab.move_mouse(5, 5)
    assert _lines(tab) == []
    assert tab.problems() == []


@needs_browser
def test_browser_kinds_model_view_and_screenshots(tab, seq2seq_url):
    _open(tab, seq2seq_url)
    std, shape = _png_std(tab.screenshot())
    assert shape == (900, 1280) and std > 10
    # cross-attention: target tokens on the left, source on the right
    _choose(tab, "ka-kind", "cross")
    tokens = tab.evaluate(
        "['ka-queries', 'ka-keys'].map((c) => Array.from("
        "document.querySelectorAll('#' + c + ' .ka-token'))"
        ".map((t) => t.textContent))"
    )
    assert tokens == [TARGET, SOURCE]
    assert tab.evaluate("document.querySelectorAll('.ka-thumb').length") == 2
    # clicking a thumbnail opens that layer and head in the head view
    _choose(tab, "ka-kind", "self")
    x, y = tab.center_of(".ka-thumb[data-layer='1'][data-head='2']")
    tab.click(x, y)
    state = tab.evaluate(
        "[kaExplorer.state.layer, Array.from(kaExplorer.state.heads),"
        " document.getElementById('ka-layer').value,"
        " document.querySelector('.ka-thumb.ka-selected').dataset.head]"
    )
    assert state == [1, [2], "1", "2"]
    _hover(tab, "ka-queries", 0)
    assert {line[0] for line in _lines(tab)} == {2}
    std, _ = _png_std(tab.screenshot())
    assert std > 10
    assert tab.problems() == []


@needs_browser
def test_browser_500_tokens_12_layers_12_heads(tab, tmp_path):
    rng = np.random.default_rng(0)
    tokens = [f"tok{i}" for i in range(500)]
    weights = {
        f"layer_{i}": _softmax(
            3 * rng.standard_normal((1, 12, 500, 500), dtype="float32")
        )
        for i in range(12)
    }
    path = tmp_path / "big.html"
    start = time.perf_counter()
    attention_html(weights, tokens, path=path)
    build_s = time.perf_counter() - start
    size_mb = path.stat().st_size / 2**20
    start = time.perf_counter()
    _open(tab, path.as_uri())
    ready_s = time.perf_counter() - start
    timings = tab.evaluate("kaExplorer.timings")
    paint = tab.evaluate(
        "performance.getEntriesByType('paint').map((e) => [e.name,"
        " e.startTime])"
    )
    print(
        f"\n500 tokens x 12 layers x 12 heads: {size_mb:.2f} MB, built in "
        f"{build_s:.2f} s, ready in {ready_s:.2f} s, {timings}, paint {paint}"
    )
    assert size_mb < 4
    assert tab.evaluate("document.querySelectorAll('.ka-thumb').length") == 144
    assert timings["total_ms"] < 5000
    _hover(tab, "ka-queries", 250)
    assert len(_lines(tab)) == 12 * 12
    assert tab.problems() == []


def test_takes_collect_attention_output():
    import keras

    from keras_attention.blocks import TransformerEncoderBlock
    from keras_attention.visualization import AttentionMaps
    from keras_attention.visualization import collect_attention

    block = TransformerEncoderBlock(num_heads=2, intermediate_dim=8)
    x = keras.random.normal((2, 5, 8), seed=0)
    maps = collect_attention(block, x)
    data = _embedded(attention_html(maps, list("abcde")))
    (layer,) = data["layers"]
    assert (layer["kind"], layer["query"], layer["heads"]) == (
        "self",
        "tokens",
        2,
    )
    np.testing.assert_allclose(
        _decode(layer, 2), next(iter(maps.values())), atol=0.5 / 255 + 1e-6
    )
    # records as collect_attention writes them: an RNN decoder's alignment
    # and pooling (no query tokens)
    maps = AttentionMaps(
        {
            "rnn": np.full((1, 1, 4, 6), 1 / 6),
            "pool": np.full((1, 1, 1, 6), 1 / 6),
        },
        {
            "rnn": {
                "kind": "decoder",
                "query_tokens": "target_tokens",
                "key_tokens": "tokens",
            },
            "pool": {
                "kind": "pooling",
                "query_tokens": None,
                "key_tokens": "tokens",
            },
        },
    )
    page = attention_html(maps, SOURCE, TARGET)
    assert _kinds(page) == {
        "rnn": ("decoder", "target_tokens", "tokens", "decoder"),
        "pool": ("pooling", None, "tokens", "pooling"),
    }


# ------------------------------------------------------------ image mode


def _image_page(path=None, keys_grid=(4, 16), images=None):
    """Words attending over a rows x columns grid of cells of an image;
    word q of batch item b peaks on cell 16 + 3 q + b (both heads)."""
    rows, columns = keys_grid
    cells = [f"r{r}c{c}" for r in range(rows) for c in range(columns)]
    n = rows * columns
    weights = np.full((2, 2, 3, n), 0.2 / n, "float32")
    for b in range(2):
        for q in range(3):
            weights[b, :, q, (16 + 3 * q + b) % n] += 0.8
    if images is None:
        images = np.linspace(0, 1, 2 * 16 * 64, dtype="float32").reshape(
            2, 16, 64
        )
    return attention_html(
        {
            "decoder/cross": weights,
            "decoder/self": _softmax(np.ones((2, 2, 3, 3))),
        },
        cells,
        [["one", "two", "[END]"], ["six", "six", "[END]"]],
        kinds={"decoder/cross": "cross"},
        images=images,
        image_grid=keys_grid,
        path=path,
    )


def test_image_mode_embeds_the_images_and_whole_rows():
    data = _embedded(_image_page(keys_grid=(8, 16)))
    assert data["image"]["grid"] == [8, 16]
    items = data["image"]["items"]
    assert [(i["height"], i["width"], i["channels"]) for i in items] == [
        (16, 64, 1)
    ] * 2
    pixels = np.frombuffer(base64.b64decode(items[1]["pixels"]), "uint8")
    expected = np.linspace(0, 1, 2 * 16 * 64).reshape(2, -1)[1]
    np.testing.assert_array_equal(pixels, np.rint(expected * 255))
    cross = next(layer for layer in data["layers"] if layer["kind"] == "cross")
    # 128 keys: stored whole over an image (past 64, rows keep top_k).
    assert cross["dense"] and cross["k"] == 128
    # Pages without images carry neither the data nor the script.
    plain = attention_html({"l": _softmax(np.ones((3, 3)))}, ["a", "b", "c"])
    assert "image" not in _embedded(plain)
    assert "ka-image-view" not in plain.html
    assert "ka-image-view" in _image_page().html


def test_image_mode_takes_one_shared_or_per_item_rgb_images():
    shared = np.zeros((16, 64, 3), "uint8")
    shared[..., 0] = 200
    items = _embedded(_image_page(images=shared))["image"]["items"]
    assert len(items) == 2 and items[0]["channels"] == 3
    assert items[0]["pixels"] == items[1]["pixels"]
    listed = [np.zeros((16, 64)), np.ones((16, 64, 1))]
    items = _embedded(_image_page(images=listed))["image"]["items"]
    assert base64.b64decode(items[1]["pixels"]) == b"\xff" * 16 * 64


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"images": np.zeros((16, 64))}, "`images` and `image_grid`"),
        ({"image_grid": (4, 16)}, "`images` and `image_grid`"),
        ({"images": np.zeros((16, 64)), "image_grid": (4, 0)}, "image_grid"),
        ({"images": np.zeros((16, 64)), "image_grid": (3, 3)}, "9 cells"),
        (
            {"images": [np.zeros((16, 64))] * 3, "image_grid": (2, 3)},
            "one per batch item",
        ),
        (
            {"images": [np.zeros((16, 64, 2))] * 2, "image_grid": (2, 3)},
            "1 or 3 channels",
        ),
    ],
)
def test_image_mode_bad_arguments_raise(kwargs, match):
    weights = _softmax(np.ones((2, 1, 2, 6)))
    with pytest.raises(ValueError, match=match):
        attention_html(
            {"cross": weights},
            [f"c{i}" for i in range(6)],
            [["a", "b"]] * 2,
            **kwargs,
        )


@needs_browser
def test_browser_image_view_draws_each_word_over_the_image(tab, tmp_path):
    path = tmp_path / "image.html"
    _image_page(path=path)
    _open(tab, path.as_uri())
    assert tab.problems() == []
    # The decoder self-attention shows first: no pictures, a note.
    assert "Choose a layer" in tab.evaluate(
        "document.getElementById('ka-image-view').textContent"
    )
    _choose(tab, "ka-kind", "cross")
    tab.wait_until("document.querySelectorAll('.ka-image-panel').length")
    panels = (
        "Array.from(document.querySelectorAll('.ka-image-panel'))"
        ".map((p) => [p.textContent, p.classList.contains('ka-focused'),"
        " p.querySelector('canvas').width])"
    )
    assert tab.evaluate(panels) == [
        ["one (max 0.80)", False, 256],
        ["two (max 0.80)", False, 256],
        ["[END] (max 0.80)", False, 256],
    ]
    # Brightest pixel of each panel: over the peak cell (16 + 3q: row 1,
    # column 3q; 16 px per cell in a 256 x 64 panel).
    brightest = tab.evaluate(
        "Array.from(document.querySelectorAll('.ka-image-panel canvas'))"
        ".map((c) => { const d = c.getContext('2d').getImageData(0, 0,"
        " c.width, c.height).data; let best = -1, at = 0;"
        " for (let i = 0; i < d.length; i += 4) { const v = d[i] - d[i + 2];"
        " if (v > best) { best = v; at = i / 4; } }"
        " return [Math.floor(at / c.width), at % c.width]; })"
    )
    for q, (y, x) in enumerate(brightest):
        assert 16 <= y < 32 and 48 * q <= x < 48 * q + 16
    _hover(tab, "ka-queries", 1)
    tab.wait_until(
        "document.querySelectorAll('.ka-image-panel.ka-focused').length"
    )
    assert [p[1] for p in tab.evaluate(panels)] == [False, True, False]
    assert tab.evaluate(
        "Array.from(document.getElementById('ka-batch').options)"
        ".map((o) => o.textContent)"
    ) == ["#0: one two [END]", "#1: six six [END]"]
    _choose(tab, "ka-batch", "1")
    tab.wait_until(
        "document.querySelector('.ka-image-panel').textContent"
        ".startsWith('six')"
    )
    _choose(tab, "ka-kind", "target-self")
    tab.wait_until("!document.querySelector('.ka-image-panel')")
    assert "Choose a layer" in tab.evaluate(
        "document.getElementById('ka-image-view').textContent"
    )
    assert tab.problems() == []
