"""A report's figures: every row in one axis, a colour per row kept across figures.

- `report`: the concept rows of the paper's Figure 3 for each clustering row (clusters ordered
  to face their matched concept), above global accuracy per row at the best-train and the last
  round with its interval, and the paper's value where it is shown;
- `curves`: global accuracy over rounds, the mean over seeds with a band of ± one sample std
  where two or more seeds logged the round;
- `next_step` (a drifting benchmark): next-step accuracy at the end of each step, the same way.
FedRC-FT rows have no curve: what the runs logged is before fine-tuning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from pipeline.data.records import Manifest
from pipeline.outputs.contents import Contents, over_time
from pipeline.outputs.drawing import SHARE, heatmap
from pipeline.outputs.groups import Group, drawn_groups
from pipeline.outputs.matching import cluster_colours, cluster_order, static_matching
from pipeline.outputs.shares import cluster_shares, final_omega, with_counts
from pipeline.outputs.style import FigureStyle
from pipeline.run import files as rf


def colours(groups: list[Group]) -> dict[int, Any]:
    """A colour per group (by id), in the report's order: tab10, tab20 past ten rows."""
    palette = plt.get_cmap("tab10" if len(groups) <= 10 else "tab20").colors
    return {id(g): palette[i % len(palette)] for i, g in enumerate(groups)}


def concept_maps(groups: list[Group], manifest: Manifest) -> list[tuple[str, Any, Any]]:
    """(title, (concept rows with their client counts, shares), (cluster order, colours)) for
    each of `drawn_groups`, in the report's order: its lowest-seed run, ω at its last evaluated
    round (Figure 3's concept row), clusters in the order of their matched concepts. Clusters
    are not aligned across seeds, so one run is drawn rather than an average."""
    maps = []
    for group in drawn_groups(groups):
        run = group.runs[0]
        round_, omega = final_omega(rf.read_assignments(run.path / rf.ASSIGNMENTS))
        last_step = manifest.at_step(manifest.time_steps - 1)  # the concepts of ω's round
        concepts, shares, clients = cluster_shares(omega, last_step)["concept"]
        matched = static_matching(omega, last_step)
        drawn = (cluster_order(matched), cluster_colours(matched, len(concepts)))
        title = f"{group.label}, seed {run.seed}, round {round_}"
        title += ", last step" if manifest.time_steps > 1 else ""
        held = clients > 0  # a concept no client holds at the last step: no row
        names = [c for c, h in zip(concepts, held) if h]
        maps.append((title, (with_counts(names, clients[held]), shares[held]), drawn))
    return maps


def draw_report(paths: list[Path], contents: Contents, style: FigureStyle) -> None:
    """Top: the concept maps; bottom: global accuracy per row (best-train and last round)
    beside the rows' curves over rounds (a drifting benchmark: next-step accuracy over
    steps)."""
    maps = concept_maps(contents.groups, contents.manifest)
    columns = max(len(maps), 2)
    half = columns // 2
    bottom = ["bars"] * half + ["curves"] * (columns - half)
    layout = [[f"map{i}" for i in range(columns)], bottom] if maps else [bottom]
    with style.fonts():
        fig, axes = plt.subplot_mosaic(
            layout,
            figsize=(max(4.2 * columns, 12), 8.4 if maps else 4.6),
            height_ratios=[1, 1.1] if maps else None,
            constrained_layout=True,
            empty_sentinel=None,
        )
        for i, (title, (concepts, shares), (order, colours)) in enumerate(maps):
            image = heatmap(axes[f"map{i}"], shares, concepts, title, order, colours)
        if maps:
            fig.colorbar(image, ax=[axes[f"map{i}"] for i in range(columns)], label=SHARE)
        for i in range(len(maps), columns if maps else 0):
            axes[f"map{i}"].axis("off")  # one clustering row: a map beside an empty place
        bars(axes["bars"], contents)
        curves_axis(axes["curves"], contents, contents.manifest.time_steps > 1)
        style.save(fig, paths)
        plt.close(fig)


def bars(ax: Any, contents: Contents) -> None:
    """Global accuracy per row: best-train (solid) and last round (hatched) in the row's
    colour, ± the cells' spread; the paper's value as a black diamond where shown."""
    groups, colour = contents.groups, colours(contents.groups)
    x = np.arange(len(groups))
    width = 0.38
    spread = contents.options.spread
    for offset, stem, hatch in ((-width / 2, "global", None), (width / 2, "final_global", "//")):
        summaries = [cells[stem].summary for cells in contents.cells]
        means = [np.nan if s.mean is None else s.mean for s in summaries]
        widths = [s.half_width if spread == "ci" else s.std for s in summaries]
        errors = [0.0 if w is None else w for w in widths]
        ax.bar(
            x + offset,
            means,
            width,
            yerr=errors,
            capsize=3,
            color=[colour[id(g)] for g in groups],
            hatch=hatch,
            edgecolor="white" if hatch else None,
        )
    handles = [
        Patch(facecolor="grey", label="best-train round"),
        Patch(facecolor="grey", hatch="//", edgecolor="white", label="last round"),
    ]
    paper = [(i, numbers[1][0]) for i, g in enumerate(groups) if (numbers := contents.paper(g))]
    if paper:
        handles.append(ax.scatter(*zip(*paper), marker="D", color="black", zorder=3, label="paper"))
    ax.set_xticks(x, [g.label for g in groups], rotation=20, ha="right")
    what = "95 % CI" if spread == "ci" else "sample std"
    ax.set(ylabel="global accuracy (%)", ylim=(0, 100))
    ax.set_title(f"Global accuracy (held-out clients), mean ± {what} over seeds")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(handles=handles)


def band(ax: Any, x: list[int], series: list[dict[int, float]], colour: Any, label: str) -> None:
    """The mean over `series` (each x → value) as a line, and ± one sample std as a band
    where two or more series have the point."""
    points = [(t, [s[t] for s in series if t in s]) for t in x]
    points = [(t, v) for t, v in points if v]
    xs = np.asarray([t for t, _ in points])
    mean = np.asarray([np.mean(v) for _, v in points])
    ax.plot(xs, mean, color=colour, label=label, lw=1.5, marker="." if len(xs) < 30 else None)
    banded = [(t, np.mean(v), np.std(v, ddof=1)) for t, v in points if len(v) > 1]
    if banded:
        t, m, s = map(np.asarray, zip(*banded))
        ax.fill_between(t, m - s, m + s, color=colour, alpha=0.2, lw=0)


def round_curves(contents: Contents) -> list[tuple[Group, list[dict[int, float]]]]:
    """Each row's per-seed global accuracy (%) by round, FedRC-FT's left out."""
    return [
        (g, [{r: 100 * v for r, v in run.curve("global_accuracy").items()} for run in g.runs])
        for g in contents.groups
        if not g.finetuned
    ]


def step_curves(contents: Contents) -> list[tuple[Group, list[dict[int, float]]]]:
    """Each row's per-seed next-step accuracy (%) by step t + 1 (the models of the end of
    step t on step t + 1's data), where every run has an over-time record."""
    steps = contents.manifest.time_steps
    out = []
    for group in contents.groups:
        if group.finetuned or over_time(group) is None:
            continue
        series = []
        for run in group.runs:
            entries = run.result["over_time"]["steps"][: steps - 1]
            series.append(
                {
                    t + 1: 100 * e["next_accuracy"]
                    for t, e in enumerate(entries)
                    if e["next_accuracy"] is not None
                }
            )
        out.append((group, series))
    return out


def curves_axis(ax: Any, contents: Contents, drifting: bool) -> None:
    """Every row's curve with its seed band: global accuracy over rounds, or (`drifting`)
    next-step accuracy over steps."""
    colour = colours(contents.groups)
    rows = step_curves(contents) if drifting else round_curves(contents)
    for group, series in rows:
        x = sorted({t for s in series for t in s})
        band(ax, x, series, colour[id(group)], f"{group.label} (n={len(series)})")
    if drifting:
        finish(ax, "step (scored with the models of the step before)", "next-step accuracy (%)")
    else:
        finish(ax, "round", "global accuracy (%)")
    if not rows:  # FedRC-FT rows alone: what they logged is before fine-tuning
        ax.text(0.5, 0.5, "no curves: fine-tuned rows only", ha="center", transform=ax.transAxes)
        return
    many = len(rows) > 6
    ax.legend(
        loc="upper left" if many else "best",
        bbox_to_anchor=(1.01, 1.0) if many else None,
        title="mean ± sample std over seeds",
    )


def one_panel(paths: list[Path], contents: Contents, style: FigureStyle, drifting: bool) -> None:
    with style.fonts():
        fig, ax = plt.subplots(figsize=style.size(6.4, 4.0), constrained_layout=True)
        curves_axis(ax, contents, drifting)
        style.save(fig, paths)
        plt.close(fig)


def draw_curves(paths: list[Path], contents: Contents, style: FigureStyle) -> None:
    """Global accuracy over rounds, every row in one axis, seed bands."""
    one_panel(paths, contents, style, drifting=False)


def draw_next_step(paths: list[Path], contents: Contents, style: FigureStyle) -> None:
    """A drifting benchmark: next-step accuracy at the end of each step, seed bands."""
    one_panel(paths, contents, style, drifting=True)


def finish(ax: Any, xlabel: str, ylabel: str) -> None:
    """Integer ticks (rounds and steps are whole numbers), labels and a grid."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
