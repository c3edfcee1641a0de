/* keras_attention attention explorer: head view and model view.
 *
 * Data (the JSON in #ka-data, written by attention_html): per layer,
 * base64 of [uint16 key indices, little-endian; sparse rows only]
 * [uint8 codes], both shaped (batch, heads, queries, k) in C order;
 * weight = code / 255 * scale.
 */
(function () {
  "use strict";
  const start = performance.now();
  const ROW = 18; // px per token row (--ka-row)
  const LINES = 220; // px between the token columns
  const LEVELS = 16; // opacity levels of the canvas lines
  const PALETTE = [
    [31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40],
    [148, 103, 189], [140, 86, 75], [227, 119, 194], [127, 127, 127],
    [188, 189, 34], [23, 190, 207], [57, 73, 171], [0, 137, 123],
  ];
  const $ = (id) => document.getElementById(id);
  const data = JSON.parse($("ka-data").textContent);

  function bytesOf(b64) {
    const text = atob(b64);
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    return bytes;
  }

  function indicesOf(bytes, n) {
    const view = new DataView(bytes.buffer, 0, 2 * n);
    const out = new Uint16Array(n);
    for (let i = 0; i < n; i++) out[i] = view.getUint16(2 * i, true);
    return out;
  }

  const layers = data.layers.map(function (layer, index) {
    const bytes = bytesOf(layer.data);
    const n = data.batch.length * layer.heads * layer.queries * layer.k;
    return Object.assign({}, layer, {
      index: index,
      data: null,
      codes: layer.dense ? bytes : bytes.subarray(2 * n),
      keyIndex: layer.dense ? null : indicesOf(bytes, n),
    });
  });
  const decoded = performance.now();
  // the page's "Attention" choices: groups of layers, in order
  const groups = [];
  layers.forEach(function (l) {
    if (!groups.some((g) => g.id === l.group)) {
      groups.push({id: l.group, label: l.label});
    }
  });
  const ORDER = ["self", "target-self", "cross", "decoder", "pooling"];
  const rank = (g) => (ORDER.indexOf(g.id) + ORDER.length + 1) % (
    ORDER.length + 1);
  groups.sort((a, b) => rank(a) - rank(b));

  // Calls f(key, weight) for the stored weights of one query row.
  function forRow(layer, b, h, q, f) {
    const k = layer.k;
    const base = ((b * layer.heads + h) * layer.queries + q) * k;
    const unit = layer.scale / 255;
    for (let e = 0; e < k; e++) {
      const code = layer.codes[base + e];
      if (code) f(layer.dense ? e : layer.keyIndex[base + e], code * unit);
    }
  }

  // [query tokens, key tokens] of a layer for batch position b; a side
  // is "tokens", "target_tokens" or null (learned queries: pooling).
  function sides(layer, b) {
    return [layer.query, layer.key].map(function (side) {
      if (side) return data[side][b];
      const pool = [];
      for (let i = 0; i < layer.queries; i++) {
        pool.push(layer.queries === 1 ? "[query]" : "[query " + i + "]");
      }
      return pool;
    });
  }

  function color(h, alpha) {
    const c = PALETTE[h % PALETTE.length];
    return "rgba(" + c[0] + "," + c[1] + "," + c[2] + "," + alpha + ")";
  }

  const state = {
    group: groups[0].id,
    layer: layers.find((l) => l.group === groups[0].id).index,
    batch: 0,
    heads: new Set(),
    focus: null, // {side: "query" | "key", index}
  };

  // ---------------------------------------------------------------- controls
  function option(select, value, text) {
    const o = document.createElement("option");
    o.value = value;
    o.textContent = text;
    select.appendChild(o);
  }

  function buildControls() {
    $("ka-title").textContent = data.title;
    const kind = $("ka-kind");
    groups.forEach((g) => option(kind, g.id, g.label));
    kind.disabled = groups.length < 2;
    kind.addEventListener("change", function () {
      state.group = kind.value;
      selectLayer(layers.find((l) => l.group === state.group).index, null);
      renderModelView();
    });
    $("ka-layer").addEventListener("change", function () {
      selectLayer(+$("ka-layer").value, null);
    });
    const batch = $("ka-batch");
    data.batch.forEach(function (index, b) {
      const words = data.tokens[b].slice(0, 6).join(" ");
      option(batch, b, "#" + index + ": " + words);
    });
    $("ka-batch-label").hidden = data.batch.length < 2;
    batch.addEventListener("change", function () {
      state.batch = +batch.value;
      state.focus = null;
      renderHeadView();
      renderModelView();
    });
    $("ka-all-heads").addEventListener("click", function () {
      setHeads(allHeads(layers[state.layer]));
    });
    $("ka-no-heads").addEventListener("click", () => setHeads([]));
  }

  function allHeads(layer) {
    return Array.from({length: layer.heads}, (_, h) => h);
  }

  function selectLayer(index, heads) {
    const layer = layers[index];
    state.group = layer.group;
    state.layer = index;
    state.focus = null;
    $("ka-kind").value = layer.group;
    const select = $("ka-layer");
    select.replaceChildren();
    layers.filter((l) => l.group === layer.group).forEach(
      (l) => option(select, l.index, l.name));
    select.value = index;
    const box = $("ka-heads");
    box.replaceChildren();
    for (let h = 0; h < layer.heads; h++) {
      const label = document.createElement("label");
      label.className = "ka-head";
      label.style.background = color(h, 1);
      const input = document.createElement("input");
      input.type = "checkbox";
      input.value = h;
      input.addEventListener("change", function () {
        const chosen = new Set(state.heads);
        if (input.checked) chosen.add(h); else chosen.delete(h);
        setHeads(Array.from(chosen));
      });
      label.append(input, String(h));
      box.appendChild(label);
    }
    setHeads(heads || allHeads(layer));
  }

  function setHeads(heads) {
    state.heads = new Set(heads);
    $("ka-heads").querySelectorAll("label").forEach(function (label, h) {
      label.firstChild.checked = state.heads.has(h);
      label.classList.toggle("ka-off", !state.heads.has(h));
    });
    renderHeadView();
    markThumbs();
  }

  // --------------------------------------------------------------- head view
  function fillTokens(column, tokens, side) {
    column.replaceChildren();
    tokens.forEach(function (token, i) {
      const div = document.createElement("div");
      div.className = "ka-token";
      div.textContent = token;
      div.title = token + " (" + side + " " + i + ")";
      div.dataset.index = i;
      div.dataset.side = side;
      column.appendChild(div);
    });
  }

  function renderHeadView() {
    const layer = layers[state.layer];
    const [queries, keys] = sides(layer, state.batch);
    fillTokens($("ka-queries"), queries, "query");
    fillTokens($("ka-keys"), keys, "key");
    const height = Math.max(queries.length, keys.length) * ROW;
    const lines = $("ka-lines");
    lines.style.height = height + "px";
    const svg = $("ka-focus");
    svg.setAttribute("width", LINES);
    svg.setAttribute("height", height);
    drawLines();
    const heads = Array.from(state.heads).sort((a, b) => a - b);
    $("ka-caption").textContent = layer.name + " \u00b7 " +
      layer.label + " \u00b7 heads " +
      (heads.length ? heads.join(", ") : "none");
    renderFocus();
  }

  // The lines of the selected heads that touch a visible token, on a
  // canvas the size of the scrolled view (lines over thousands of pixels
  // are slow to rasterize: seconds at 500 tokens); redrawn on scroll.
  function drawLines() {
    const layer = layers[state.layer];
    const [queries, keys] = sides(layer, state.batch);
    const columns = $("ka-columns");
    const lines = $("ka-lines");
    const total = Math.max(queries.length, keys.length) * ROW;
    const height = Math.min(columns.clientHeight || total, total);
    const top = Math.max(0, Math.min(columns.scrollTop, total - height));
    const canvas = $("ka-canvas");
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(LINES * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.width = LINES + "px";
    canvas.style.height = height + "px";
    canvas.style.top = top + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, -top * ratio);
    ctx.clearRect(0, top, LINES, height);
    ctx.lineWidth = 1.5;
    const first = Math.floor(top / ROW) - 1;
    const last = Math.ceil((top + height) / ROW);
    const seen = (i) => i >= first && i <= last;
    lines.dataset.drawn = 0;
    let drawn = 0;
    state.heads.forEach(function (h) {
      const paths = []; // per opacity level: [query, key, ...]
      for (let q = 0; q < queries.length; q++) {
        forRow(layer, state.batch, h, q, function (key, w) {
          const level = Math.round((w / layer.scale) * LEVELS);
          if (!level || key >= keys.length) return;
          if (!seen(q) && !seen(key)) return;
          (paths[level] = paths[level] || []).push(q, key);
        });
      }
      paths.forEach(function (pairs, level) {
        ctx.strokeStyle = color(h, level / LEVELS);
        ctx.beginPath();
        for (let i = 0; i < pairs.length; i += 2) {
          ctx.moveTo(0, (pairs[i] + 0.5) * ROW);
          ctx.lineTo(LINES, (pairs[i + 1] + 0.5) * ROW);
        }
        ctx.stroke();
        drawn += pairs.length / 2;
      });
    });
    lines.dataset.drawn = drawn;
  }

  let scrollPending = false;
  function onScroll() {
    if (scrollPending) return;
    scrollPending = true;
    requestAnimationFrame(function () {
      scrollPending = false;
      drawLines();
    });
  }

  // Lines and token highlights of the hovered token (state.focus).
  function renderFocus() {
    const layer = layers[state.layer];
    const [queries, keys] = sides(layer, state.batch);
    const svg = $("ka-focus");
    svg.replaceChildren();
    document.querySelectorAll(".ka-token").forEach(function (t) {
      t.classList.remove("ka-focus", "ka-attended");
      t.style.background = "";
      delete t.dataset.weight;
    });
    $("ka-lines").classList.toggle("ka-dim", state.focus !== null);
    if (state.focus === null) return;
    const fromQuery = state.focus.side === "query";
    const own = fromQuery ? $("ka-queries") : $("ka-keys");
    const other = fromQuery ? $("ka-keys") : $("ka-queries");
    own.children[state.focus.index].classList.add("ka-focus");
    const best = new Float32Array(other.children.length);
    state.heads.forEach(function (h) {
      for (let q = 0; q < queries.length; q++) {
        if (fromQuery && q !== state.focus.index) continue;
        forRow(layer, state.batch, h, q, function (key, w) {
          if (key >= keys.length) return;
          if (!fromQuery && key !== state.focus.index) return;
          const line = document.createElementNS(svg.namespaceURI, "line");
          line.setAttribute("x1", 0);
          line.setAttribute("y1", (q + 0.5) * ROW);
          line.setAttribute("x2", LINES);
          line.setAttribute("y2", (key + 0.5) * ROW);
          line.setAttribute("stroke", color(h, 1));
          line.setAttribute("stroke-width", 2);
          line.setAttribute("stroke-opacity", (w / layer.scale).toFixed(3));
          line.setAttribute("class", "ka-line");
          line.setAttribute("data-head", h);
          line.setAttribute("data-query", q);
          line.setAttribute("data-key", key);
          line.setAttribute("data-weight", w.toFixed(4));
          svg.appendChild(line);
          const j = fromQuery ? key : q;
          best[j] = Math.max(best[j], w / layer.scale);
        });
      }
    });
    best.forEach(function (w, j) {
      if (!w) return;
      const token = other.children[j];
      token.classList.add("ka-attended");
      token.dataset.weight = w.toFixed(4);
      token.style.background = "rgba(255, 160, 0, " + w.toFixed(3) + ")";
    });
  }

  function setFocus(focus) {
    const same = (focus === null && state.focus === null) || (
      focus && state.focus && focus.side === state.focus.side &&
      focus.index === state.focus.index);
    if (same) return;
    state.focus = focus;
    renderFocus();
  }

  function onHover(event) {
    const token = event.target.closest(".ka-token");
    if (token) {
      setFocus({side: token.dataset.side, index: +token.dataset.index});
    }
  }

  // -------------------------------------------------------------- model view
  function drawThumb(canvas, layer, b, h) {
    const [queries, keys] = sides(layer, b);
    const size = 64;
    const width = Math.min(keys.length, size);
    const height = Math.min(queries.length, size);
    canvas.width = width;
    canvas.height = height;
    const cells = new Float32Array(width * height);
    for (let q = 0; q < queries.length; q++) {
      const row = Math.floor((q * height) / queries.length) * width;
      forRow(layer, b, h, q, function (key, w) {
        if (key >= keys.length) return;
        const i = row + Math.floor((key * width) / keys.length);
        if (w > cells[i]) cells[i] = w;
      });
    }
    const image = canvas.getContext("2d").createImageData(width, height);
    const c = PALETTE[h % PALETTE.length];
    cells.forEach(function (w, i) {
      // the head's color over white, square-root scale: a weight of 0.25
      // is half the color, uniform attention over 500 tokens near white
      const a = Math.sqrt(w / layer.scale);
      image.data[4 * i] = 255 - a * (255 - c[0]);
      image.data[4 * i + 1] = 255 - a * (255 - c[1]);
      image.data[4 * i + 2] = 255 - a * (255 - c[2]);
      image.data[4 * i + 3] = 255;
    });
    canvas.getContext("2d").putImageData(image, 0, 0);
  }

  function label(text, className) {
    const div = document.createElement("div");
    div.className = "ka-grid-label " + (className || "");
    div.textContent = text;
    div.title = text;
    return div;
  }

  function renderModelView() {
    const grid = $("ka-grid");
    grid.replaceChildren();
    const shown = layers.filter((l) => l.group === state.group);
    const heads = Math.max.apply(null, shown.map((l) => l.heads));
    const thumb = heads > 8 ? 44 : 64;
    grid.style.gridTemplateColumns =
      "auto repeat(" + heads + ", " + thumb + "px)";
    grid.appendChild(label(""));
    for (let h = 0; h < heads; h++) grid.appendChild(label("head " + h));
    shown.forEach(function (layer) {
      grid.appendChild(label(layer.name, "ka-row-label"));
      for (let h = 0; h < heads; h++) {
        if (h >= layer.heads) {
          grid.appendChild(label(""));
          continue;
        }
        const canvas = document.createElement("canvas");
        canvas.className = "ka-thumb";
        canvas.style.width = canvas.style.height = thumb + "px";
        canvas.dataset.layer = layer.index;
        canvas.dataset.head = h;
        canvas.title = layer.name + ", head " + h;
        drawThumb(canvas, layer, state.batch, h);
        grid.appendChild(canvas);
      }
    });
    markThumbs();
  }

  function markThumbs() {
    document.querySelectorAll(".ka-thumb").forEach(function (t) {
      t.classList.toggle("ka-selected", +t.dataset.layer === state.layer &&
        state.heads.has(+t.dataset.head));
    });
  }

  // ------------------------------------------------------------------ start
  buildControls();
  $("ka-queries").addEventListener("mouseover", onHover);
  $("ka-keys").addEventListener("mouseover", onHover);
  $("ka-columns").addEventListener("mouseleave", () => setFocus(null));
  $("ka-columns").addEventListener("scroll", onScroll);
  window.addEventListener("resize", onScroll);
  $("ka-grid").addEventListener("click", function (event) {
    const t = event.target.closest(".ka-thumb");
    if (!t) return;
    selectLayer(+t.dataset.layer, [+t.dataset.head]);
    const view = $("ka-head-view").getBoundingClientRect();
    if (view.top < 0 || view.top > window.innerHeight) {
      $("ka-head-view").scrollIntoView({block: "start"});
    }
  });
  selectLayer(state.layer, null);
  const headView = performance.now();
  renderModelView();
  const modelView = performance.now();
  window.kaExplorer = {
    state: state,
    layers: layers,
    selectLayer: selectLayer,
    setHeads: setHeads,
    timings: {
      decode_ms: decoded - start,
      head_view_ms: headView - decoded,
      model_view_ms: modelView - headView,
      total_ms: modelView - start,
    },
  };
  requestAnimationFrame(function () {
    window.kaExplorer.timings.first_frame_ms = performance.now();
    document.body.dataset.ready = "1";
  });
})();
