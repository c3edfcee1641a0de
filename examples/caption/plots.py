"""Pictures of the `caption` example (matplotlib, Agg): for one image,
the attention of each generated word over it, upsampled from the grid
onto the canvas."""

import os

import numpy as np


def upsample(attention, size):
    """`(rows, columns)` -> `(height, width)`: bilinear, as an image
    resize (`tf.image.resize`), each cell's weight spread over its
    pixels; the map keeps its maximum at 1 after `normalize`."""
    import tensorflow as tf

    grid = np.asarray(attention, "float32")[None, ..., None]
    resized = tf.image.resize(grid, size, method="bilinear").numpy()[0, ..., 0]
    return resized


def caption_figure(image, words, attention, grid, path, title):
    """One PNG: the image, then one panel per generated word (and
    `[END]`) with that step's attention drawn over the image.

    Args:
        image: `(H, W)` or `(H, W, 1)` in [0, 1].
        words: the generated tokens, `[END]` included when generated.
        attention: `(len(words), rows * columns)` weights.
        grid: `(rows, columns)`.
        path: where the PNG goes (folders created).
        title: the figure's title (reference and generated caption).

    Returns:
        `(path, (width, height))` in pixels.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    image = np.asarray(image, "float32").reshape(np.shape(image)[:2])
    height, width = image.shape
    panels = len(words) + 1
    dpi = 80
    figure, axes = plt.subplots(
        panels, 1, figsize=(3.6, 0.95 * panels + 0.45), dpi=dpi
    )
    axes[0].imshow(image, cmap="gray", vmin=0.0, vmax=1.0)
    axes[0].set_title("image", fontsize=8)
    for axis, word, alpha in zip(axes[1:], words, attention):
        weights = np.asarray(alpha, "float32").reshape(grid)
        overlay = upsample(weights, (height, width))
        axis.imshow(image, cmap="gray", vmin=0.0, vmax=1.0)
        axis.imshow(
            overlay / max(float(overlay.max()), 1e-12),
            cmap="inferno",
            alpha=0.6,
            vmin=0.0,
            vmax=1.0,
        )
        axis.set_title(
            f"{word!r}  (max weight {weights.max():.2f})", fontsize=8
        )
    for axis in axes:
        axis.set_xticks([])
        axis.set_yticks([])
    figure.suptitle(title, fontsize=8)
    figure.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    figure.savefig(path, dpi=dpi)
    size = (figure.get_size_inches() * dpi).round().astype(int)
    plt.close(figure)
    return path, (int(size[0]), int(size[1]))
