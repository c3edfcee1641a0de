"""Per-head attention statistics (Clark et al., 2019, "What does BERT
look at? An Analysis of BERT's Attention") and heatmaps, in NumPy."""

import numpy as np

# The statistics of one head, in the order of the printed table.
STATISTICS = ("entropy", "distance", "first", "self")


def head_statistics(weights, length=None):
    """The attention statistics of each head of one layer.

    Args:
        weights: `(heads, T, S)` attention weights of one example (rows
            sum to 1 over the keys).
        length: the real (not padded) tokens; the statistics read the
            first `length` queries and keys only (default: all).

    Returns:
        A dict of `(heads,)` float arrays, each averaged over the
        queries: `entropy` (nats, of each query's distribution),
        `distance` (expected `|i - j|` between query `i` and the key `j`
        it attends to), `first` (weight on the first token, e.g.
        `[CLS]` or `<s>`) and `self` (weight on the query's own token).

    Example:

    >>> w = np.full((1, 2, 2), 0.5)
    >>> {k: float(v[0]) for k, v in head_statistics(w).items()}
    {'entropy': 0.6931471805599453, 'distance': 0.5, 'first': 0.5, 'self': 0.5}
    """
    weights = np.asarray(weights, dtype="float64")
    if weights.ndim != 3:
        raise ValueError(
            "`weights` must have shape (heads, T, S). Received: "
            f"weights.shape={weights.shape!r}"
        )
    if length is not None:
        weights = weights[:, :length, :length]
    _, t, s = weights.shape
    queries = np.arange(t)[:, None]
    keys = np.arange(s)[None, :]
    logs = np.log(np.where(weights > 0, weights, 1.0))
    diagonal = weights[:, np.arange(min(t, s)), np.arange(min(t, s))]
    return {
        "entropy": -(weights * logs).sum(-1).mean(-1),
        "distance": (weights * np.abs(queries - keys)).sum(-1).mean(-1),
        "first": weights[:, :, 0].mean(-1),
        "self": diagonal.mean(-1),
    }


def plot_layer(weights, tokens, path, title):
    """Writes one layer's heads as a grid of heatmaps (PNG) at `path`.

    Args:
        weights: `(heads, T, S)` weights of one example, cut to `tokens`.
        tokens: the token strings (queries and keys).
        path: the PNG file written.
        title: the figure's title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = weights.shape[0]
    columns = min(heads, 4)
    rows = -(-heads // columns)
    size = 1.0 + 0.18 * len(tokens)
    figure, axes = plt.subplots(
        rows,
        columns,
        figsize=(columns * size, rows * size + 0.4),
        squeeze=False,
    )
    for head, axis in enumerate(axes.flat):
        if head >= heads:
            axis.axis("off")
            continue
        axis.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0)
        axis.set_title(f"head {head}", fontsize=8)
        if len(tokens) <= 48:
            ticks = np.arange(len(tokens))
            axis.set_xticks(ticks, tokens, rotation=90, fontsize=6)
            axis.set_yticks(ticks, tokens, fontsize=6)
        else:
            axis.set_xticks([])
            axis.set_yticks([])
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
