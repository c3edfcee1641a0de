"""The attention of a few nodes over their neighbours, as one PNG.

Each panel is one node (centre) and the neighbours it attends to, on a
circle: an arrow from each neighbour into the node, as wide as the
attention weight (mean over the heads), labelled with it; neighbours of
the node's own supersense in green, the others in grey.
"""

import numpy as np


def neighbourhood_panels(alpha, senders, receivers, nodes, max_neighbours=12):
    """The attention of each of `nodes` over its incoming edges.

    Args:
        alpha: `(E + N, heads)` or `(E + N,)` coefficients of a
            `GraphAttention` layer with self-loops (the edges, then the
            self-loops of nodes `0 .. N-1`).
        senders, receivers: the `E` edges.
        nodes: the node ids to show.
        max_neighbours: keep the neighbours of largest weight.

    Returns:
        one dict per node: `node`, `self_weight`, `neighbours` (ids,
        largest weight first), `weights`, `more` (neighbours left out)
        and `degree`.
    """
    alpha = np.asarray(alpha, "float64")
    if alpha.ndim == 2:
        alpha = alpha.mean(axis=1)
    senders, receivers = np.asarray(senders), np.asarray(receivers)
    num_edges = len(senders)
    panels = []
    for node in nodes:
        edges = np.flatnonzero(receivers == node)
        order = np.argsort(-alpha[edges], kind="stable")
        shown = edges[order[:max_neighbours]]
        panels.append(
            dict(
                node=int(node),
                self_weight=float(alpha[num_edges + node]),
                neighbours=senders[shown].tolist(),
                weights=alpha[shown].tolist(),
                more=int(len(edges) - len(shown)),
                degree=int(len(edges)),
            )
        )
    return panels


def neighbourhood_figure(panels, name, label, title=None):
    """A matplotlib figure of `neighbourhood_panels`' panels; `name(node)`
    and `label(node)` give a node's name and supersense."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(2, len(panels))
    rows = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(
        rows, columns, figsize=(6.5 * columns, 4.8 * rows), squeeze=False
    )
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, panel in zip(axes.flat, panels):
        node = panel["node"]
        count = len(panel["neighbours"])
        angles = np.linspace(0, 2 * np.pi, count, endpoint=False) + np.pi / 2
        for angle, other, weight in zip(
            angles, panel["neighbours"], panel["weights"]
        ):
            x, y = np.cos(angle), np.sin(angle)
            same = label(other) == label(node)
            color = "tab:green" if same else "tab:gray"
            ax.annotate(
                "",
                xy=(0.16 * x, 0.16 * y),
                xytext=(0.78 * x, 0.78 * y),
                arrowprops=dict(
                    arrowstyle="-|>",
                    color=color,
                    lw=0.5 + 12 * weight,
                    alpha=0.8,
                    shrinkA=0,
                    shrinkB=0,
                ),
            )
            ax.text(
                0.5 * x,
                0.5 * y,
                f"{weight:.2f}",
                ha="center",
                va="center",
                fontsize=8,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none"),
            )
            ax.text(
                0.9 * x,
                0.9 * y,
                f"{_short(name(other))}\n({label(other)})",
                ha="center",
                va="center",
                fontsize=8,
                color="darkgreen" if same else "dimgray",
            )
        ax.text(
            0,
            0,
            f"{_short(name(node))}\n({label(node)})\n"
            f"self {panel['self_weight']:.2f}",
            ha="center",
            va="center",
            fontsize=9,
            fontweight="bold",
            bbox=dict(boxstyle="round", fc="lightyellow", ec="goldenrod"),
        )
        more = f", {panel['more']} more not shown" if panel["more"] else ""
        ax.set_title(
            f"{_short(name(node), 40)}: {panel['degree']} neighbours{more}",
            fontsize=10,
        )
        ax.set_xlim(-1.25, 1.25)
        ax.set_ylim(-1.05, 1.05)
        ax.set_aspect("equal")
        ax.axis("off")
    if title:
        figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    return figure


def _short(text, width=22):
    return text if len(text) <= width else text[: width - 1] + "…"
