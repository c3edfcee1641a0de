"""Attention maps of the image models, from `collect_attention`'s weights
(NumPy only): the `[CLS]` row per head, the pooling weights, and attention
rollout across layers (Abnar & Zuidema, 2020), each as a map over the
patch grid; and their pictures drawn on the image.

Attention rollout: with `A_l` the attention of layer `l` averaged over its
heads `(T, T)`, the residual connection is accounted for by
`Â_l = normalize_rows(A_l / 2 + I / 2)`, and the attention that flows from
the inputs to the last layer's tokens is the product
`R = Â_L · ... · Â_2 · Â_1` (rows still sum to 1): `R[i, j]` is how much
output token `i` draws on input token `j`. For a `[CLS]` model the map is
the `[CLS]` row `R[0, 1:]`; with attention pooling (weights `w` over the
last layer's tokens), it is `w · R`.
"""

import os

import numpy as np

from examples.common.rollout import attention_rollout


def to_grid(values, grid):
    """`(..., rows * columns)` -> `(..., rows, columns)`."""
    values = np.asarray(values)
    return values.reshape(values.shape[:-1] + tuple(grid))


def image_maps(maps, layer_names, grid, pooling_name=None):
    """The maps to draw for one model.

    Args:
        maps: `collect_attention(model, images)`: `(batch, heads, T, T)`
            per attention layer, and `(batch, 1, 1, T)` for the pooling.
        layer_names: the self-attention layers in order (their keys in
            `maps`).
        grid: `(rows, columns)` of the patches.
        pooling_name: the key of the `AttentionPooling` weights; None for a
            `[CLS]` model (token 0 is `[CLS]`, the patches follow).

    Returns:
        dict with `"heads"`: `(batch, heads, rows, columns)` (the last
        layer's `[CLS]` row per head, or the pooling weights as one
        "head"), `"heads_title"`, and `"rollout"`: `(batch, rows, columns)`;
        every map sums to 1 over the grid, except the `[CLS]` heads (their
        weight on `[CLS]` itself is left out).
    """
    rollout = attention_rollout([maps[name] for name in layer_names])
    if pooling_name is None:
        last = maps[layer_names[-1]]  # (b, h, 1 + p, 1 + p)
        heads = last[:, :, 0, 1:]
        flow = rollout[:, 0, 1:]
        flow = flow / flow.sum(axis=-1, keepdims=True)
        title = f"[CLS] attention, {_short(layer_names[-1])}"
    else:
        weights = maps[pooling_name][:, 0, 0, :]  # (b, p)
        heads = weights[:, None, :]
        flow = np.einsum("bi,bij->bj", weights, rollout)
        title = "AttentionPooling weights"
    return {
        "heads": to_grid(heads, grid),
        "heads_title": title,
        "rollout": to_grid(flow, grid),
    }


def _short(name):
    return name.split("/")[0]


def plot_image_attention(image, heads, rollout, path, heads_title, caption):
    """One PNG: the image, each head's map drawn over it, and the rollout.

    Args:
        image: `(S, S)` or `(S, S, 1)` in [0, 1].
        heads: `(heads, rows, columns)` maps.
        rollout: `(rows, columns)` map.
        path: where the PNG goes (folders created).
        heads_title: label of the head panels.
        caption: the figure's title (label and prediction).

    Returns:
        `(path, (width, height))`, the image size in pixels.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    image = np.asarray(image, "float32").reshape(image.shape[:2])
    size = image.shape[0]
    panels = [("input", None)]
    panels += [(f"head {h}", m) for h, m in enumerate(heads)]
    if len(heads) == 1:
        panels[1] = ("weights", heads[0])
    panels.append(("rollout", rollout))
    dpi = 100
    figure, axes = plt.subplots(
        1, len(panels), figsize=(1.6 * len(panels), 2.1), dpi=dpi
    )
    for axis, (label, attention) in zip(axes, panels):
        axis.imshow(image, cmap="gray", vmin=0.0, vmax=1.0)
        if attention is not None:
            axis.imshow(
                attention / max(float(attention.max()), 1e-12),
                cmap="inferno",
                alpha=0.6,
                vmin=0.0,
                vmax=1.0,
                extent=(-0.5, size - 0.5, size - 0.5, -0.5),
                interpolation="nearest",
            )
        axis.set_title(label, fontsize=8)
        axis.set_xticks([])
        axis.set_yticks([])
    figure.suptitle(f"{caption}\n{heads_title}", fontsize=8)
    figure.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    figure.savefig(path, dpi=dpi)
    width, height = (figure.get_size_inches() * dpi).round().astype(int)
    plt.close(figure)
    return path, (int(width), int(height))


def patch_tokens(grid, cls_token):
    """Labels of the tokens for the attention explorer: `[CLS]` (when
    `cls_token`), then `r{row}c{column}` per patch."""
    labels = [f"r{r}c{c}" for r in range(grid[0]) for c in range(grid[1])]
    return (["[CLS]"] if cls_token else []) + labels
