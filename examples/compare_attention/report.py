"""The study's report: Markdown tables (`report.md`), plots (PNG) and the
raw numbers (`results.json`).

`runs` is a list of dicts, one per (task, variant, seed), as
`__main__.run_one` returns them.
"""

import json
import math
import os
import statistics

COLUMNS = (
    "variant",
    "exact match %",
    "steps (best)",
    "params",
    "train ms/step",
    "latency ms/seq",
    "peak MiB",
)

# A difference between two means counts only when it exceeds the larger
# of their two standard deviations over the seeds, twice the standard
# error of the difference that the finite test set alone gives
# (binomial), and this many points.
MIN_DIFFERENCE = 1.0
# The length reading asks whether a variant holds up on longer sources
# only of those that learned the task on the training lengths.
LEARNED = 50.0


def mean_spread(values):
    """`(mean, standard deviation)` (0 for one value)."""
    values = list(values)
    if len(values) < 2:
        return values[0], 0.0
    return statistics.mean(values), statistics.stdev(values)


def _runs_of(runs, task, variant):
    return [r for r in runs if r["task"] == task and r["variant"] == variant]


def summarize(runs, task, variants):
    """One dict per variant of `variants` run on `task`, seeds combined:
    exact match mean and spread, steps run and best step (means), runs
    that reached the cap, medians of the cost columns."""
    rows = []
    for variant in variants:
        mine = _runs_of(runs, task, variant)
        if not mine:
            continue
        mean, spread = mean_spread(r["exact_match"] for r in mine)
        rows.append(
            {
                "variant": variant,
                "seeds": len(mine),
                "exact_match": mean,
                "exact_match_std": spread,
                "exact_match_se": standard_error(
                    mean, sum(len(r["hits"]) for r in mine)
                ),
                "steps": statistics.mean(r["steps"] for r in mine),
                "best_step": statistics.mean(r["best_step"] for r in mine),
                "capped": sum(r["stopped"] == "cap" for r in mine),
                "params": mine[0]["params"],
                "train_ms_per_step": statistics.median(
                    r["train_ms_per_step"] for r in mine
                ),
                "latency_ms": statistics.median(r["latency_ms"] for r in mine),
                "peak_mib": max(r["peak_mib"] for r in mine),
            }
        )
    return rows


def _pm(mean, spread, seeds):
    """ "mean ± sd" ("mean" for one seed)."""
    return f"{mean:.1f}" + (f" ± {spread:.1f}" if seeds > 1 else "")


def markdown_table(rows):
    """A Markdown table of `summarize` rows (columns `COLUMNS`)."""
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + "|",
    ]
    for row in rows:
        steps = f"{row['steps']:.0f} ({row['best_step']:.0f})"
        if row["capped"]:
            steps += f", {row['capped']} capped"
        cells = [
            f"`{row['variant']}`",
            _pm(row["exact_match"], row["exact_match_std"], row["seeds"]),
            steps,
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


def length_bins(lengths, count=6, split=None):
    """Bins `[(low, high)]` (`high` excluded) covering `lengths`: `count`
    of equal width, or, with `split` (the longest training source), a
    third of them up to `split` and the others beyond it."""
    low, high = min(lengths), max(lengths)
    if split is None or not low <= split < high:
        return _equal_bins(low, high + 1, count)
    inside = max(count // 3, 1)
    return _equal_bins(low, split + 1, inside) + _equal_bins(
        split + 1, high + 1, count - inside
    )


def _equal_bins(low, high, count):
    width = max((high - low) / count, 1)
    edges = [round(low + i * width) for i in range(count)] + [high]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _accuracy(run, low, high):
    hits = [
        hit
        for length, hit in zip(run["source_lengths"], run["hits"])
        if low <= length < high
    ]
    return 100.0 * sum(hits) / len(hits) if hits else float("nan")


def accuracy_by_length(runs, task, variant, bins):
    """`[(mean, sd)]` over the seeds of the exact match (%) of each
    length bin."""
    mine = _runs_of(runs, task, variant)
    out = []
    for low, high in bins:
        values = [_accuracy(r, low, high) for r in mine]
        values = [v for v in values if v == v]
        out.append(mean_spread(values) if values else (float("nan"), 0.0))
    return out


def _train_max(runs, task):
    return next(
        (r.get("train_max_length") for r in runs if r["task"] == task), None
    )


def _bins(runs, task):
    lengths = next(r["source_lengths"] for r in runs if r["task"] == task)
    return length_bins(lengths, split=_train_max(runs, task))


def length_table(runs, task, variants):
    """Markdown: exact match (mean ± sd over seeds) per source-length
    bin, one row per variant; bins beyond the training lengths marked."""
    bins = _bins(runs, task)
    train_max = _train_max(runs, task)
    names = [
        f"{a}-{b - 1}" + (" *" if train_max and a > train_max else "")
        for a, b in bins
    ]
    lines = [
        "| variant | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(bins),
    ]
    for variant in variants:
        mine = _runs_of(runs, task, variant)
        if not mine:
            continue
        cells = [
            "n/a" if m != m else _pm(m, sd, len(mine))
            for m, sd in accuracy_by_length(runs, task, variant, bins)
        ]
        lines.append(f"| `{variant}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_length(runs, task, variants, path):
    """Exact match against source length, one line per variant (mean
    over the seeds, a band of ± one standard deviation), a dashed line
    at the longest training source when the task has one."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    bins = _bins(runs, task)
    centers = [(a + b - 1) / 2 for a, b in bins]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for variant in variants:
        if not _runs_of(runs, task, variant):
            continue
        style = "--" if variant.startswith("transformer") else "-"
        if variant == "rnn-none":
            style = ":"
        points = accuracy_by_length(runs, task, variant, bins)
        means = [m for m, _ in points]
        (line,) = ax.plot(
            centers, means, style, marker="o", markersize=3, label=variant
        )
        ax.fill_between(
            centers,
            [m - sd for m, sd in points],
            [m + sd for m, sd in points],
            color=line.get_color(),
            alpha=0.12,
            linewidth=0,
        )
    train_max = _train_max(runs, task)
    if train_max:
        ax.axvline(train_max + 0.5, color="gray", linestyle="--", linewidth=1)
        ax.annotate(
            "longest training source",
            (train_max + 0.5, 2),
            fontsize=7,
            color="gray",
            xytext=(3, 0),
            textcoords="offset points",
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


def standard_error(percent, count):
    """Binomial standard error (points) of an exact match of `percent` %
    measured on `count` examples."""
    p = percent / 100.0
    return 100.0 * math.sqrt(p * (1.0 - p) / count) if count else math.inf


def differs(a, b):
    """Whether means `a` and `b` (`(mean, sd, standard error)`) differ by
    more than the larger standard deviation over the seeds, twice the
    test set's standard error of their difference, and `MIN_DIFFERENCE`
    points."""
    sampling = 2.0 * math.hypot(a[2], b[2])
    return abs(a[0] - b[0]) > max(a[1], b[1], sampling, MIN_DIFFERENCE)


def _stats(row):
    return row["exact_match"], row["exact_match_std"], row["exact_match_se"]


def _cell(row):
    return _pm(row["exact_match"], row["exact_match_std"], row["seeds"])


def reading_ranking(rows, task):
    """One bullet on `task`: the best variant, those tied with it, and
    the others, by the rule of `differs`."""
    if not rows:
        return None
    ordered = sorted(rows, key=lambda r: -r["exact_match"])
    best = ordered[0]
    top = _stats(best)
    tied = [r for r in ordered[1:] if not differs(top, _stats(r))]
    below = [r for r in ordered[1:] if r not in tied]
    if len(ordered) > 1 and not below:
        return (
            f"**`{task}`**: all tie: "
            + ", ".join(f"`{r['variant']}` ({_cell(r)} %)" for r in ordered)
            + "."
        )
    text = f"**`{task}`**: best `{best['variant']}` ({_cell(best)} %)"
    if tied:
        text += "; tied with it (within the noise): " + ", ".join(
            f"`{r['variant']}` ({_cell(r)})" for r in tied
        )
    if below:
        text += "; below it: " + ", ".join(
            f"`{r['variant']}` ({_cell(r)})" for r in below
        )
    return text + "."


def generalization(runs, task, variant):
    """`((mean, sd, se) within the training lengths, (mean, sd, se)
    beyond)` of the exact match over the seeds (`se`: the binomial
    standard error of all the seeds' examples), or None without a
    training cap."""
    train_max = _train_max(runs, task)
    mine = _runs_of(runs, task, variant)
    if not train_max or not mine:
        return None
    out = []
    for low, high in ((0, train_max + 1), (train_max + 1, 10**9)):
        values = [_accuracy(r, low, high) for r in mine]
        if any(v != v for v in values):
            return None
        count = sum(low <= n < high for r in mine for n in r["source_lengths"])
        mean, spread = mean_spread(values)
        out.append((mean, spread, standard_error(mean, count)))
    return tuple(out)


def reading_length(runs, task, variants):
    """Bullets on the length task: per variant, whether its accuracy on
    sources longer than any training one drops (by more than the rule of
    `differs`) from its accuracy within the training lengths."""
    train_max = _train_max(runs, task)
    degrade, hold, weak = [], [], []
    for variant in variants:
        found = generalization(runs, task, variant)
        if found is None:
            continue
        inside, beyond = found
        seeds = len(_runs_of(runs, task, variant))
        cell = (
            f"`{variant}` ({_pm(*inside[:2], seeds)} -> "
            f"{_pm(*beyond[:2], seeds)})"
        )
        drops = differs(inside, beyond) and beyond[0] < inside[0]
        if inside[0] < LEARNED:
            weak.append(cell)
        else:
            (degrade if drops else hold).append(cell)
    if not degrade and not hold and not weak:
        return []
    parts = []
    if degrade:
        parts.append("degrades: " + ", ".join(degrade))
    if hold:
        parts.append("holds up (no drop beyond the noise): " + ", ".join(hold))
    if weak:
        parts.append(
            f"under {LEARNED:g} % within the training lengths, too weak "
            "for the question: " + ", ".join(weak)
        )
    return [
        f"**Length generalisation (`{task}`)**, exact match within the "
        f"training lengths (up to {train_max} characters) -> on longer "
        "sources; " + "; ".join(parts) + "."
    ]


def reading_budget(runs, max_steps):
    """A bullet on how the runs ended: by patience, at 100 %, or at the
    cap (numbers of capped runs are lower bounds)."""
    if not runs:
        return None
    reasons = {}
    for r in runs:
        reasons.setdefault(r["stopped"], []).append(r)
    parts = []
    for reason, words in (
        ("patience", "stopped by patience"),
        ("perfect", "stopped at 100 % validation exact match"),
        ("cap", f"reached the cap of {max_steps} steps"),
    ):
        if reasons.get(reason):
            parts.append(f"{len(reasons[reason])} {words}")
    text = f"**Training**: of {len(runs)} runs, " + ", ".join(parts) + "."
    capped = sorted(
        {f"`{r['variant']}` on `{r['task']}`" for r in reasons.get("cap", [])}
    )
    if capped:
        text += (
            " Still improving at the cap, so their numbers are lower "
            "bounds of what these would reach: " + ", ".join(capped) + "."
        )
    return text


def reading(runs, rows_by_task, variants, max_steps=None):
    """The report's reading, generated from the numbers only."""
    seeds = max((len({r["seed"] for r in runs}),), default=0)
    bullets = []
    if seeds < 2:
        bullets.append(
            "**One seed**: the spread over seeds is not measured, so the "
            "differences below are weighed against the test set's sampling "
            "error only; run more seeds (`--seeds 0,1,2`)."
        )
    bullets.append(
        f"**Rule**: means over {seeds} seed(s); a difference counts only "
        "when it exceeds the larger of the two standard deviations over "
        "the seeds, twice the standard error of the difference due to the "
        f"finite test set, and {MIN_DIFFERENCE:g} point; smaller ones are "
        "ties."
    )
    for task, rows in rows_by_task.items():
        bullet = reading_ranking(rows, task)
        if bullet:
            bullets.append(bullet)
        bullets += reading_length(runs, task, variants)
    bullet = reading_budget(runs, max_steps)
    if bullet:
        bullets.append(bullet)
    return "\n".join(f"- {b}" for b in bullets)


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


def write(out_dir, runs, tasks, variants, header, max_steps=None):
    """Writes `report.md`, the plots and `results.json` into `out_dir`;
    returns the paths `{"report", "plots", "results"}`."""
    os.makedirs(out_dir, exist_ok=True)
    tasks = [t for t in tasks if any(r["task"] == t for r in runs)]
    rows_by_task = {t: summarize(runs, t, variants) for t in tasks}
    plots = [
        plot_length(runs, t, variants, os.path.join(out_dir, f"length_{t}.png"))
        for t in tasks
    ]
    plots.append(plot_cost(rows_by_task, os.path.join(out_dir, "cost.png")))
    sections = [header]
    for task in tasks:
        sections += [f"## Task `{task}`", markdown_table(rows_by_task[task])]
        sections += [
            "Exact match by source length (%; * beyond the longest "
            "training source):"
            if _train_max(runs, task)
            else "Exact match by source length (%):",
            length_table(runs, task, variants),
        ]
    sections += ["## Reading", reading(runs, rows_by_task, variants, max_steps)]
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
