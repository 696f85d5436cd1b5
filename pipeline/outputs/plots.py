"""The run's pictures: the paper's Figure 3 cluster maps, accuracy curves, and ω per client.

Clusters are drawn in the order of the concepts they are matched to (`matching`), their ids in
the matched concept's colour, so the maps, ω and a drifting run's timeline agree. A drifting
run draws its cluster map and ω once per time step (`plots_steps`), and its timeline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa
from matplotlib.ticker import MaxNLocator

from pipeline.common.io import atomic_dir
from pipeline.data.records import Manifest
from pipeline.outputs.drawing import (
    SHARE,
    client_ids,
    clients_height,
    heatmap,
    omega_rows,
    one_model,
)
from pipeline.outputs.matching import cluster_colours, cluster_order, static_matching
from pipeline.outputs.plots_steps import draw_step_maps, draw_step_omega
from pipeline.outputs.plots_time import draw_timeline, mark_drifts
from pipeline.outputs.shares import class_rows, cluster_shares, final_omega, with_counts
from pipeline.outputs.style import FigureStyle


def draw_cluster_map(
    paths: list[Path],
    omega: np.ndarray,
    manifest: Manifest,
    round_: int,
    run: str,
    style: FigureStyle,
) -> None:
    if omega.shape[1] == 1:
        return one_model(paths, run, "clusters", style)
    shares = cluster_shares(omega, manifest)
    matched = static_matching(omega, manifest)
    order, colours = cluster_order(matched), cluster_colours(matched, len(manifest.concepts))
    k = omega.shape[1]
    with style.fonts():
        fig, axes = plt.subplots(
            1, 3, figsize=(max(13, 3 * (1 + 0.45 * k)), 4.8), constrained_layout=True
        )
        for ax, (name, (labels, matrix, clients)) in zip(axes, shares.items()):
            title = f"share of each {name} per cluster"
            image = heatmap(ax, matrix, with_counts(labels, clients), title, order, colours)
        axes[0].set_ylabel(f"class: {class_rows(manifest)}")
        axes[1].set_ylabel("style")
        axes[2].set_ylabel("concept")
        fig.colorbar(image, ax=list(axes), label=SHARE)
        fig.suptitle(
            f"{run}: cluster assignment at round {round_} (n: participating clients in the "
            "row; cluster ids in their matched concept's colour)"
        )
        style.save(fig, paths)
        plt.close(fig)


def draw_accuracy(
    paths: list[Path], metrics: list[dict[str, Any]], run: str, style: FigureStyle
) -> None:
    rows = [r for r in metrics if "train_accuracy" in r]
    with style.fonts():
        fig, ax = plt.subplots(figsize=style.size(6.4, 4.2), constrained_layout=True)
        for key, label in (
            ("train_accuracy", "train"),
            ("local_accuracy", "local (participating)"),
            ("global_accuracy", "global (held-out)"),
        ):
            ax.plot([r["round"] for r in rows], [r[key] for r in rows], marker=".", label=label)
        mark_drifts(ax, metrics)
        ax.set(xlabel="round", ylabel="accuracy", ylim=(0, 1))
        ax.set_title(f"{run}: accuracy over rounds")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
        ax.grid(alpha=0.3)
        ax.legend()
        style.save(fig, paths)
        plt.close(fig)


def draw_omega(
    paths: list[Path],
    omega: np.ndarray,
    manifest: Manifest,
    round_: int,
    run: str,
    style: FigureStyle,
) -> None:
    """Participating clients sorted by concept above (their ids on the right), held-out
    clients below, each on a row tall enough for its own label."""
    if omega.shape[1] == 1:
        return one_model(paths, run, "weights", style)
    clients = manifest.clients
    part = sorted(manifest.participating, key=lambda i: (clients[i].concept, i))
    held = sorted(manifest.held_out, key=lambda i: (clients[i].concept, i))
    matched = static_matching(omega, manifest)
    order, colours = cluster_order(matched), cluster_colours(matched, len(manifest.concepts))
    rows = clients_height(len(part))
    with style.fonts():
        fig, (top, bottom) = plt.subplots(
            2,
            1,
            figsize=(4.5 + 0.8 * omega.shape[1], 1.6 + rows + 0.3 * len(held)),
            height_ratios=[rows, 0.3 * max(len(held), 1)],
            constrained_layout=True,
        )
        labels = [manifest.concept_name(i) for i in part]
        image = omega_rows(top, omega[part], labels, order, colours)
        client_ids(top, part, rows)
        top.set_title(f"{run}: ω per client at round {round_}")
        top.set_ylabel("participating, by concept")
        omega_rows(bottom, omega[held], [manifest.concept_name(i) for i in held], order, colours)
        bottom.set_ylabel("held-out")
        fig.colorbar(image, ax=[top, bottom], label="ω: the client's weight on model k")
        style.save(fig, paths)
        plt.close(fig)


def draw_all(
    folder: Path,
    metrics: list[dict[str, Any]],
    assignments: pa.Table,
    manifest: Manifest,
    run: str,
    style: FigureStyle,
    made_from: dict[str, Any] | None = None,
) -> list[Path]:
    """`run` names the figures: the algorithm as a report prints it, and the run folder where
    it is not just the algorithm's name. A drifting run's cluster map and ω have a panel per
    time step, and `timeline` shows the clusters over rounds. Each figure is written in every
    format of `style`; `made_from` (the run's identity) goes beside them as made_from.json."""
    round_, omega = final_omega(assignments)
    stems = ["cluster_map", "accuracy", "omega", *(["timeline"] if manifest.time_steps > 1 else [])]
    names = {stem: style.names(stem) for stem in stems}
    with atomic_dir(folder) as tmp:
        paths = {stem: [tmp / n for n in files] for stem, files in names.items()}
        drifting = manifest.time_steps > 1
        if drifting:
            draw_step_maps(paths["cluster_map"], assignments, manifest, run, style)
        else:
            draw_cluster_map(paths["cluster_map"], omega, manifest, round_, run, style)
        draw_accuracy(paths["accuracy"], metrics, run, style)
        if drifting:
            draw_step_omega(paths["omega"], assignments, manifest, run, style)
            draw_timeline(paths["timeline"], metrics, assignments, manifest, run, style)
        else:
            draw_omega(paths["omega"], omega, manifest, round_, run, style)
        if made_from is not None:  # with the names of the figures: the rest is a user's
            drawn = sorted(p.name for p in tmp.iterdir())
            made_from = {**made_from, "assignments_round": round_, "files": drawn}
            (tmp / "made_from.json").write_text(json.dumps(made_from, indent=2, sort_keys=True))
    return [folder / n for stem in stems for n in names[stem]]
