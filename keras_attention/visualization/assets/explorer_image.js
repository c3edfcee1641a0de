/* keras_attention attention explorer: image view (attention over the
 * cells of an image, drawn over it). */
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const explorer = window.kaExplorer;
  const data = JSON.parse($("ka-data").textContent);
  const info = data.image;
  if (!explorer || !info) return;
  const rows = info.grid[0], cols = info.grid[1];
  const images = info.items.map(function (item) {
    const text = atob(item.pixels);
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    return Object.assign({}, item, {bytes: bytes});
  });
  const section = document.createElement("section");
  section.id = "ka-image-view";
  section.setAttribute("aria-label", "Image view");
  const title = document.createElement("h2");
  title.innerHTML = "Image view <small>each query token's attention " +
    "over the image (mean of the selected heads), brighter = more</small>";
  const panels = document.createElement("div");
  panels.id = "ka-image-panels";
  section.append(title, panels);
  $("ka-head-view").before(section);
  // the examples named by their target tokens (the words), not by the
  // cells
  if (data.target_tokens) {
    Array.from($("ka-batch").options).forEach(function (o, b) {
      o.textContent = "#" + data.batch[b] + ": " +
        data.target_tokens[b].slice(0, 6).join(" ");
    });
  }

  function overImage(layer) {
    return layer.key === "tokens" && layer.keys === rows * cols;
  }

  // (rows, cols) weights -> value at pixel (y, x) of an (h, w) image,
  // bilinear with half-pixel centers (as tf.image.resize).
  function sample(cells, h, w, y, x) {
    const gy = Math.min(Math.max((y + 0.5) * rows / h - 0.5, 0), rows - 1);
    const gx = Math.min(Math.max((x + 0.5) * cols / w - 0.5, 0), cols - 1);
    const y0 = Math.floor(gy), x0 = Math.floor(gx);
    const y1 = Math.min(y0 + 1, rows - 1), x1 = Math.min(x0 + 1, cols - 1);
    const fy = gy - y0, fx = gx - x0;
    const at = (r, c) => cells[r * cols + c];
    return (at(y0, x0) * (1 - fx) + at(y0, x1) * fx) * (1 - fy) +
      (at(y1, x0) * (1 - fx) + at(y1, x1) * fx) * fy;
  }

  function drawPanel(canvas, image, cells) {
    const scale = Math.max(1, Math.min(
      Math.floor(256 / image.width), Math.floor(128 / image.height)));
    const w = image.width * scale, h = image.height * scale;
    canvas.width = w;
    canvas.height = h;
    const peak = Math.max.apply(null, cells) || 1;
    const out = canvas.getContext("2d").createImageData(w, h);
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < w; x++) {
        const p = (Math.floor(y / scale) * image.width +
          Math.floor(x / scale)) * image.channels;
        const a = sample(cells, h, w, y, x) / peak;
        const o = 4 * (y * w + x);
        const heat = [255, 90 + 165 * a, 40 * a];
        for (let c = 0; c < 3; c++) {
          const v = image.bytes[p + (image.channels === 3 ? c : 0)];
          // the image dimmed, the heat color over it by the weight
          out.data[o + c] = (1 - 0.7 * a) * 0.6 * v + 0.7 * a * heat[c];
        }
        out.data[o + 3] = 255;
      }
    }
    canvas.getContext("2d").putImageData(out, 0, 0);
    canvas.dataset.peak = peak;
  }

  function render() {
    const state = explorer.state;
    const layer = explorer.layers[state.layer];
    panels.replaceChildren();
    if (!overImage(layer)) {
      const note = document.createElement("p");
      note.className = "ka-hint";
      note.textContent = "Choose a layer that attends over the image (" +
        rows + " x " + cols + " cells).";
      panels.appendChild(note);
      return;
    }
    const b = state.batch;
    const queries = layer.query ? data[layer.query][b] : Array.from(
      {length: layer.queries}, (_, q) => "[query " + q + "]");
    const heads = Array.from(state.heads);
    const unit = layer.scale / 255;
    queries.forEach(function (token, q) {
      const cells = new Float32Array(layer.keys);
      heads.forEach(function (h) {
        const base = ((b * layer.heads + h) * layer.queries + q) * layer.k;
        for (let e = 0; e < layer.k; e++) {
          cells[e] += layer.codes[base + e] * unit / heads.length;
        }
      });
      const panel = document.createElement("div");
      panel.className = "ka-image-panel";
      panel.dataset.index = q;
      const focus = state.focus;
      panel.classList.toggle("ka-focused", !!focus &&
        focus.side === "query" && focus.index === q);
      const canvas = document.createElement("canvas");
      drawPanel(canvas, images[b], cells);
      const label = document.createElement("div");
      label.textContent = token + " (max " +
        Math.max.apply(null, cells).toFixed(2) + ")";
      panel.append(canvas, label);
      panels.appendChild(panel);
    });
  }

  let pending = false;
  function later() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () {
      pending = false;
      render();
    });
  }
  // capture phase: also the events that do not bubble; the redraw waits
  // for the next frame, after explorer.js has handled them
  ["change", "click", "mouseover", "mouseout"].forEach(
    (type) => document.addEventListener(type, later, true));
  render();
  explorer.renderImageView = render;
})();
