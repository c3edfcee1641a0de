"""Draws the mask pictures of the masks guide from the real builders.

Every picture is the output of a `keras_attention.masks` builder (no mask is
drawn by hand): rows are queries, columns are keys, a filled cell means
"may attend" (`True`).

Run from the repository root (writes `docs/images/masks/*.png`):

    python docs/scripts/make_mask_pictures.py
"""

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from keras_attention import masks  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "images", "masks")
T = 8


def pictures():
    """`(file name, title, mask (Tq, Tk))` for every picture."""
    lengths = np.array([5])
    keys_valid = np.array([[1, 1, 1, 1, 1, 0, 0, 0]], bool)
    queries_valid = np.array([[1, 1, 1, 1, 1, 1, 0, 0]], bool)
    return [
        ("causal", "causal_mask(8)", masks.causal_mask(T)),
        (
            "causal_offset",
            "causal_mask(2, 8, offset=5)",
            masks.causal_mask(2, T, offset=5),
        ),
        (
            "padding",
            "padding_mask([5], max_length=8)",
            np.broadcast_to(masks.padding_mask(lengths, T), (1, T, T)),
        ),
        (
            "padding_query",
            "padding_mask(keys, query_mask=queries)",
            masks.padding_mask(keys_valid, query_mask=queries_valid),
        ),
        ("prefix_lm", "prefix_lm_mask(8, 3)", masks.prefix_lm_mask(T, 3)),
        (
            "sliding_window",
            "sliding_window_mask(8, 2)",
            masks.sliding_window_mask(T, 2),
        ),
        (
            "sliding_window_causal",
            "sliding_window_mask(8, 2, causal=True)",
            masks.sliding_window_mask(T, 2, causal=True),
        ),
        (
            "sliding_window_asymmetric",
            "sliding_window_mask(8, (3, 1))",
            masks.sliding_window_mask(T, (3, 1)),
        ),
        (
            "combined",
            "combine_masks(causal_mask(8), padding_mask([5], 8))",
            masks.combine_masks(
                masks.causal_mask(T), masks.padding_mask(lengths, T)
            ),
        ),
    ]


def draw(title, mask, path):
    """One boolean `(Tq, Tk)` mask as a grid of filled/empty cells."""
    mask = np.asarray(mask).astype(bool)
    tq, tk = mask.shape
    figure, axes = plt.subplots(figsize=(0.32 * tk + 1.2, 0.32 * tq + 0.9))
    axes.imshow(mask, cmap="Blues", vmin=-0.15, vmax=1.1)
    axes.set_xticks(range(tk))
    axes.set_yticks(range(tq))
    axes.set_xticks(np.arange(-0.5, tk), minor=True)
    axes.set_yticks(np.arange(-0.5, tq), minor=True)
    axes.grid(which="minor", color="white", linewidth=1.5)
    axes.tick_params(which="both", length=0, labelsize=7)
    axes.set_xlabel("key j", fontsize=8)
    axes.set_ylabel("query i", fontsize=8)
    axes.set_title(title, fontsize=8, family="monospace")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, title, mask in pictures():
        mask = np.asarray(mask)
        draw(title, mask[0], os.path.join(OUT, f"{name}.png"))
        print(name, mask.shape)


if __name__ == "__main__":
    main()
