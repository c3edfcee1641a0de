"""Attention heatmaps: which source tokens each generated token looked at."""

import numpy as np

from keras_attention.utils import validation


def _as_matrix(weights):
    """Brings weights to a `(target, source)` NumPy matrix."""
    weights = np.asarray(
        weights.numpy() if hasattr(weights, "numpy") else weights,
        dtype="float32",
    )
    if weights.ndim == 3:  # (heads, target, source): average over heads.
        weights = weights.mean(axis=0)
    if weights.ndim != 2:
        raise ValueError(
            "`weights` must have shape (target, source) or (heads, target, "
            f"source). Received: weights.shape={weights.shape!r}"
        )
    return weights


def plot_attention(
    weights,
    source_tokens,
    target_tokens,
    path=None,
    title=None,
    cmap="viridis",
    figsize=None,
    dpi=100,
    show_values=False,
):
    """Plots attention weights as a heatmap, tokens on the axes.

    Source tokens label the columns (top axis, read left to right), target
    (generated) tokens the rows; cell `(t, s)` is how much target token `t`
    attended to source token `s`.

    Args:
        weights: array-like `(target, source)` or `(heads, target, source)`
            (heads are averaged). Extra rows/columns beyond the given tokens
            (padding) are cut off.
        source_tokens: list of strings, the source (key) tokens.
        target_tokens: list of strings, the target (query) tokens.
        path: optional file name; the figure is written there as PNG (and
            closed) when given.
        title: optional title.
        cmap: matplotlib colormap name.
        figsize: `(width, height)` in inches; by default sized to the
            tokens.
        dpi: resolution of the written file.
        show_values: write each weight in its cell.

    Returns:
        the `matplotlib.figure.Figure` (also when written to `path`).

    Raises:
        ValueError: when `weights` has fewer rows/columns than tokens.
        ImportError: when matplotlib is not installed
            (`pip install matplotlib`).

    Example:

    >>> import numpy as np
    >>> from keras_attention.visualization import plot_attention
    >>> weights = np.array([[0.9, 0.1], [0.2, 0.8]])
    >>> fig = plot_attention(weights, ["le", "chat"], ["the", "cat"])
    >>> fig.axes[0].get_xticklabels()[1].get_text()
    'chat'
    """
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            "plot_attention needs matplotlib: `pip install matplotlib` (or "
            "the `examples` extra)."
        ) from e
    del matplotlib
    show_values = validation.check_bool("show_values", show_values)
    weights = _as_matrix(weights)
    source_tokens = [str(t) for t in source_tokens]
    target_tokens = [str(t) for t in target_tokens]
    rows, cols = len(target_tokens), len(source_tokens)
    if weights.shape[0] < rows or weights.shape[1] < cols:
        raise ValueError(
            "`weights` must have at least one row per target token and one "
            f"column per source token. Received: weights.shape="
            f"{weights.shape!r}, {rows!r} target and {cols!r} source tokens"
        )
    weights = weights[:rows, :cols]
    if figsize is None:
        figsize = (max(3.0, 0.4 * cols + 1.5), max(2.5, 0.4 * rows + 1.2))
    # A bare Figure (no pyplot): no global state, no GUI backend needed.
    fig = Figure(figsize=figsize, dpi=dpi)
    ax = fig.add_subplot()
    image = ax.imshow(weights, cmap=cmap, vmin=0.0, aspect="auto")
    # Short tokens (characters) read best upright, words rotated.
    rotation = 90 if max(map(len, source_tokens), default=0) > 2 else 0
    ax.set_xticks(range(cols), labels=source_tokens, rotation=rotation)
    ax.set_yticks(range(rows), labels=target_tokens)
    ax.xaxis.tick_top()
    ax.set_xlabel("source")
    ax.set_ylabel("generated")
    if show_values:
        for t in range(rows):
            for s in range(cols):
                ax.text(
                    s,
                    t,
                    f"{weights[t, s]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="w",
                )
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, format="png", dpi=dpi)
    return fig
