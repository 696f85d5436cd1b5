"""Pictures of a drifting run over rounds: who sits in which cluster beside their true concept,
with the drift events marked (and the marks the accuracy curve adds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from pipeline.data.records import Manifest
from pipeline.outputs.matching import (
    cluster_colours,
    cluster_order,
    concept_colours,
    match_clusters,
)
from pipeline.outputs.style import FigureStyle


def timeline(assignments: pa.Table) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Evaluated rounds, and per (client, round) the arg-max-ω cluster and the true concept."""
    rounds = sorted(set(assignments.column("round").to_pylist()))
    clients = assignments.column("client_id").to_numpy()
    position = np.searchsorted(rounds, assignments.column("round").to_numpy())
    k = sum(name.startswith("omega_") for name in assignments.column_names)
    omega = np.stack([assignments.column(f"omega_{j}").to_numpy() for j in range(k)], 1)
    cluster = np.zeros((clients.max() + 1, len(rounds)), dtype=int)
    concept = np.zeros_like(cluster)
    cluster[clients, position] = omega.argmax(1)
    concept[clients, position] = assignments.column("concept").to_numpy()
    return rounds, cluster, concept


def step_starts(metrics: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(round, step) of the first round of every step after the first."""
    starts, last = [], 0
    for row in metrics:
        step = row.get("step", 0)
        if step != last:
            starts.append((row["round"], step))
            last = step
    return starts


def _categorical(ax: Any, matrix: np.ndarray, colours: Any, rounds: list[int]) -> None:
    n = colours.N
    ax.imshow(
        matrix,
        cmap=colours,
        norm=BoundaryNorm(np.arange(-0.5, n), n),
        aspect="auto",
        interpolation="nearest",
        extent=(rounds[0] - 0.5, rounds[-1] + 0.5, matrix.shape[0] - 0.5, -0.5),
    )


def draw_timeline(
    paths: list[Path],
    metrics: list[dict[str, Any]],
    assignments: pa.Table,
    manifest: Manifest,
    run: str,
    style: FigureStyle,
) -> None:
    """Left: each participating client's cluster (arg-max ω) at every evaluated round, in the
    colour of the concept it is matched to (`matching`; grey: none); right: its true concept.
    Dashed lines: the drift events (a step begins); dots: a client that drifted there. Clients
    are sorted by their concept history, so groups that drift together sit together; their ids
    label the rows."""
    rounds, cluster, concept = timeline(assignments)
    part = manifest.participating
    schedule = np.asarray(manifest.schedule)  # (T, participating)
    order = np.lexsort(schedule[::-1])
    cluster, concept = cluster[part][order], concept[part][order]
    k = sum(name.startswith("omega_") for name in assignments.column_names)
    names = manifest.concepts
    matched = match_clusters(cluster, concept, k, len(names))
    clusters = ListedColormap(cluster_colours(matched, len(names)))
    concepts = ListedColormap(concept_colours(len(names)))
    height = 2.4 + 0.06 * len(part)
    with style.fonts():
        fig, (left, right) = plt.subplots(
            1, 2, figsize=(11, height), sharey=True, constrained_layout=True
        )
        _categorical(left, cluster, clusters, rounds)
        _categorical(right, concept, concepts, rounds)
        for start, step in step_starts(metrics):
            moved = np.flatnonzero(schedule[step][order] != schedule[step - 1][order])
            for ax in (left, right):
                ax.axvline(start - 0.5, color="black", ls="--", lw=1)
                ax.plot(np.full(moved.size, start - 0.5), moved, "k.", ms=4)
        left.set(title="cluster (arg-max ω)", xlabel="round", ylabel="participating client (id)")
        right.set(title="true concept", xlabel="round")
        for ax in (left, right):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ids = [part[i] for i in order]
        step = max(1, int(np.ceil(len(ids) / 40)))
        left.set_yticks(range(0, len(ids), step), [str(ids[i]) for i in range(0, len(ids), step)])
        legend = [
            Patch(color=clusters(j), label=f"k={j} ≈ {names[matched[j]]}" if matched[j] >= 0
                  else f"k={j} (no concept)")
            for j in cluster_order(matched)
        ]  # fmt: skip
        left.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
        right.legend(
            handles=[Patch(color=concepts(j), label=n) for j, n in enumerate(names)],
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
            fontsize="small",
        )
        fig.suptitle(f"{run}: clusters over time (dashed: a drift; dots: the clients that drifted)")
        style.save(fig, paths)
        plt.close(fig)


def mark_drifts(ax: Any, metrics: list[dict[str, Any]]) -> None:
    """Dashed lines where a step begins, and each step's next-step accuracy as a cross."""
    for start, step in step_starts(metrics):
        ax.axvline(start - 0.5, color="grey", ls="--", lw=1)
        ax.text(start - 0.4, 0.02, f"step {step}", fontsize=7, color="grey")
    nexts = [r for r in metrics if "next_local_accuracy" in r]
    if nexts:
        ax.plot(
            [r["round"] + 0.5 for r in nexts],
            [r["next_local_accuracy"] for r in nexts],
            "kx",
            label="local, on the next step's data",
        )
    drifted = [r for r in metrics if "drifted_accuracy" in r]
    if drifted:
        ax.plot(
            [r["round"] for r in drifted],
            [r["drifted_accuracy"] for r in drifted],
            ".",
            color="tab:red",
            label="clients that drifted at this step",
        )
