"""A drifting run's cluster map and ω, a panel per time step, each at the step's last evaluated
round with the concepts the clients held at that step (a concept no client held is left out,
rather than drawn as an empty row). Clusters keep one order and colour in every panel, matched
to concepts over the whole run (`matching`), as in the run's timeline."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa

from pipeline.data.records import Manifest
from pipeline.evaluation.drift_scores import omega_at
from pipeline.outputs.drawing import (
    SHARE,
    client_ids,
    clients_height,
    heatmap,
    omega_rows,
    one_model,
)
from pipeline.outputs.matching import cluster_colours, cluster_order, match_clusters
from pipeline.outputs.plots_time import timeline
from pipeline.outputs.shares import cluster_shares, with_counts
from pipeline.outputs.style import FigureStyle


def step_ends(assignments: pa.Table) -> list[tuple[int, int]]:
    """(step, its last evaluated round) for every step that has one."""
    steps = assignments.column("step").to_numpy()
    rounds = assignments.column("round").to_numpy()
    return [(int(t), int(rounds[steps == t].max())) for t in np.unique(steps)]


def run_matching(assignments: pa.Table, manifest: Manifest) -> tuple[list[int], list, int]:
    """The run's cluster order and colours, matched over every evaluated round, and K."""
    _, cluster, concept = timeline(assignments)
    part = manifest.participating
    k = sum(name.startswith("omega_") for name in assignments.column_names)
    matched = match_clusters(cluster[part], concept[part], k, len(manifest.concepts))
    return cluster_order(matched), cluster_colours(matched, len(manifest.concepts)), k


def draw_step_maps(
    paths: list[Path], assignments: pa.Table, manifest: Manifest, run: str, style: FigureStyle
) -> None:
    """Per step: the share of each concept's training samples in each cluster."""
    order, colours, k = run_matching(assignments, manifest)
    if k == 1:
        return one_model(paths, run, "clusters", style)
    ends = step_ends(assignments)
    with style.fonts():
        fig, axes = plt.subplots(
            1,
            len(ends),
            figsize=(max(3.0, 1.2 + 0.45 * k) * len(ends) + 1.5, 3.6),
            constrained_layout=True,
            squeeze=False,
        )
        for ax, (step, round_) in zip(axes[0], ends):
            omega, _ = omega_at(assignments, round_)
            names, shares, clients = cluster_shares(omega, manifest.at_step(step))["concept"]
            held = clients > 0
            rows = with_counts([n for n, h in zip(names, held) if h], clients[held])
            image = heatmap(ax, shares[held], rows, f"step {step} (round {round_})", order, colours)
        axes[0][0].set_ylabel("concept at the step (n: clients)")
        fig.colorbar(image, ax=list(axes[0]), label=SHARE)
        fig.suptitle(
            f"{run}: each concept's share per cluster, step by step (cluster ids in their "
            "matched concept's colour)"
        )
        style.save(fig, paths)
        plt.close(fig)


def draw_step_omega(
    paths: list[Path], assignments: pa.Table, manifest: Manifest, run: str, style: FigureStyle
) -> None:
    """Per step: ω of the participating clients sorted by their concept at the step (ids on
    the right), and of the held-out clients below."""
    order, colours, k = run_matching(assignments, manifest)
    if k == 1:
        return one_model(paths, run, "weights", style)
    ends = step_ends(assignments)
    part, held = manifest.participating, manifest.held_out
    rows = clients_height(len(part))
    with style.fonts():
        fig, axes = plt.subplots(
            2,
            len(ends),
            figsize=((2.2 + 0.35 * k) * len(ends) + 1.5, 1.8 + rows + 0.3 * len(held)),
            height_ratios=[rows, 0.3 * max(len(held), 1)],
            constrained_layout=True,
            squeeze=False,
        )
        for column, (step, round_) in enumerate(ends):
            omega, _ = omega_at(assignments, round_)
            at = manifest.at_step(step)
            top, bottom = axes[0][column], axes[1][column]
            sorted_part = sorted(part, key=lambda i: (at.clients[i].concept, i))
            labels = [at.concept_name(i) for i in sorted_part]
            image = omega_rows(top, omega[sorted_part], labels, order, colours)
            client_ids(top, sorted_part, rows)
            top.set_title(f"step {step} (round {round_})")
            omega_rows(bottom, omega[held], [at.concept_name(i) for i in held], order, colours)
        axes[0][0].set_ylabel("participating, by concept")
        axes[1][0].set_ylabel("held-out")
        fig.colorbar(image, ax=list(axes.ravel()), label="ω: the client's weight on model k")
        fig.suptitle(f"{run}: ω per client, step by step")
        style.save(fig, paths)
        plt.close(fig)
