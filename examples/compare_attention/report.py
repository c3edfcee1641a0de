"""The study's report: Markdown tables (`report.md`), plots (PNG) and the
raw numbers (`results.json`).

`runs` is a list of dicts, one per (task, variant, seed), as
`__main__.run_one` returns them.
"""

import json
import os
import statistics

COLUMNS = (
    "variant",
    "exact match %",
    "params",
    "train ms/step",
    "latency ms/seq",
    "peak MiB",
)


def mean_spread(values):
    """`(mean, standard deviation)` (0 for one value)."""
    values = list(values)
    if len(values) < 2:
        return values[0], 0.0
    return statistics.mean(values), statistics.stdev(values)


def summarize(runs, task, variants):
    """One dict per variant of `variants` run on `task`, seeds combined:
    exact match mean and spread, medians of the cost columns."""
    rows = []
    for variant in variants:
        mine = [
            r for r in runs if r["task"] == task and r["variant"] == variant
        ]
        if not mine:
            continue
        mean, spread = mean_spread(r["exact_match"] for r in mine)
        rows.append(
            {
                "variant": variant,
                "seeds": len(mine),
                "exact_match": mean,
                "exact_match_std": spread,
                "params": mine[0]["params"],
                "train_ms_per_step": statistics.median(
                    r["train_ms_per_step"] for r in mine
                ),
                "latency_ms": statistics.median(r["latency_ms"] for r in mine),
                "peak_mib": max(r["peak_mib"] for r in mine),
            }
        )
    return rows


def markdown_table(rows):
    """A Markdown table of `summarize` rows (columns `COLUMNS`)."""
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + "|",
    ]
    for row in rows:
        match = f"{row['exact_match']:.1f}"
        if row["seeds"] > 1:
            match += f" ± {row['exact_match_std']:.1f}"
        cells = [
            f"`{row['variant']}`",
            match,
            f"{row['params']:,}",
            f"{row['train_ms_per_step']:.1f}",
            f"{row['latency_ms']:.1f}",
            _peak(row["peak_mib"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _peak(mib):
    """The peak-memory cell: "n/a" where TensorFlow's allocator keeps no
    statistics (its CPU allocator with oneDNN off)."""
    return "n/a" if mib != mib else f"{mib:.0f}"


def length_bins(lengths, count=6):
    """`count` equal-width bins `[(low, high)]` covering `lengths`."""
    low, high = min(lengths), max(lengths)
    width = max((high - low + 1) / count, 1)
    edges = [round(low + i * width) for i in range(count)] + [high + 1]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def accuracy_by_length(runs, task, variant, bins):
    """Exact match (%) of each length bin, averaged over the seeds."""
    mine = [r for r in runs if r["task"] == task and r["variant"] == variant]
    out = []
    for low, high in bins:
        hits = [
            hit
            for r in mine
            for length, hit in zip(r["source_lengths"], r["hits"])
            if low <= length < high
        ]
        out.append(100.0 * sum(hits) / len(hits) if hits else float("nan"))
    return out


def plot_length(runs, task, variants, path):
    """Exact match against source length, one line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    lengths = next(r["source_lengths"] for r in runs if r["task"] == task)
    bins = length_bins(lengths)
    centers = [(a + b - 1) / 2 for a, b in bins]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for variant in variants:
        if not any(r["task"] == task and r["variant"] == variant for r in runs):
            continue
        style = "--" if variant.startswith("transformer") else "-"
        if variant == "rnn-none":
            style = ":"
        ax.plot(
            centers,
            accuracy_by_length(runs, task, variant, bins),
            style,
            marker="o",
            markersize=3,
            label=variant,
        )
    ax.set_xlabel("source length (characters)")
    ax.set_ylabel("held-out exact match (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(f"{task}: accuracy by source length")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_cost(rows_by_task, path):
    """Exact match against training time per step, one panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    tasks = list(rows_by_task)
    fig, axes = plt.subplots(
        1, len(tasks), figsize=(5.0 * len(tasks), 4.0), squeeze=False
    )
    for ax, task in zip(axes[0], tasks):
        for row in rows_by_task[task]:
            ax.errorbar(
                row["train_ms_per_step"],
                row["exact_match"],
                yerr=row["exact_match_std"] or None,
                marker="s" if row["variant"].startswith("transformer") else "o",
                linestyle="none",
                capsize=2,
            )
            ax.annotate(
                row["variant"],
                (row["train_ms_per_step"], row["exact_match"]),
                fontsize=6,
                xytext=(3, 2),
                textcoords="offset points",
            )
        ax.set_xlabel("training time per step (ms)")
        ax.set_ylabel("held-out exact match (%)")
        ax.set_ylim(-2, 102)
        ax.set_title(task)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write(out_dir, runs, tasks, variants, header):
    """Writes `report.md`, the plots and `results.json` into `out_dir`;
    returns the paths `{"report", "plots", "results"}`."""
    os.makedirs(out_dir, exist_ok=True)
    rows_by_task = {t: summarize(runs, t, variants) for t in tasks}
    plots = [
        plot_length(runs, t, variants, os.path.join(out_dir, f"length_{t}.png"))
        for t in tasks
    ]
    plots.append(plot_cost(rows_by_task, os.path.join(out_dir, "cost.png")))
    sections = [header]
    for task in tasks:
        sections += [f"## Task `{task}`", markdown_table(rows_by_task[task])]
    sections.append("## Plots")
    sections += [
        f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots
    ]
    report = os.path.join(out_dir, "report.md")
    with open(report, "w") as f:
        f.write("\n\n".join(sections) + "\n")
    results = os.path.join(out_dir, "results.json")
    with open(results, "w") as f:
        json.dump(
            {"summary": rows_by_task, "runs": runs}, f, indent=1, default=float
        )
    return {"report": report, "plots": plots, "results": results}
