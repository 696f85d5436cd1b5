"""The run's pictures: the paper's Figure 3 cluster maps, accuracy curves, and ω per client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.ticker import MaxNLocator

from pipeline.common.io import atomic_dir, naming
from pipeline.data.records import Manifest
from pipeline.outputs.plots_time import draw_timeline, mark_drifts

SHARE = "share of the row's training samples in cluster k"  # the cluster maps' colour bar


def final_omega(assignments: pa.Table) -> tuple[int, np.ndarray]:
    """The last evaluated round and its ω table (clients in id order)."""
    rounds = assignments.column("round").to_numpy()
    last = int(rounds.max())
    rows = assignments.filter(pc.equal(assignments.column("round"), last))
    k = sum(name.startswith("omega_") for name in assignments.column_names)
    omega = np.stack([rows.column(f"omega_{j}").to_numpy() for j in range(k)], 1)
    order = np.argsort(rows.column("client_id").to_numpy())
    return last, omega[order]


def cluster_shares(
    omega: np.ndarray, manifest: Manifest
) -> dict[str, tuple[list[str], np.ndarray, np.ndarray]]:
    """For every class, style and concept: the share of its training samples in each cluster,
    and how many participating clients hold it (a style of one client reads 1.00 as plainly as
    one of a hundred). Classes are the labels after the concept's mapping, as trained on."""
    part = [c for c in manifest.clients if c.participating]
    w = omega[manifest.participating]
    hist = np.asarray([c.label_histogram for c in part], dtype=float)  # (M, C)
    sizes = hist.sum(1)
    styles = sorted({c.style for c in part})
    concepts = list(manifest.concepts)

    def by_group(keys: list[Any], values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        mass, clients = np.zeros((len(keys), w.shape[1])), np.zeros(len(keys), dtype=int)
        for value, row, n in zip(values, w, sizes):
            mass[keys.index(value)] += n * row
            clients[keys.index(value)] += 1
        return mass, clients

    shares = {
        "class": ([str(y) for y in range(hist.shape[1])], hist.T @ w, (hist > 0).sum(0)),
        "style": (styles, *by_group(styles, [c.style for c in part])),
        "concept": (
            concepts,
            *by_group(list(range(len(concepts))), [c.concept for c in part]),
        ),
    }
    return {
        name: (labels, mass / np.maximum(mass.sum(1, keepdims=True), 1e-12), clients)
        for name, (labels, mass, clients) in shares.items()
    }


def class_rows(manifest: Manifest) -> str:
    """What the class rows count: the labels after the concept's mapping, which are the
    original labels where no concept remaps them."""
    mapped = any(c.label_histogram != c.true_label_histogram for c in manifest.clients)
    return (
        "label after the concept's mapping"
        if mapped
        else "original label (no concept remaps labels)"
    )


def with_counts(labels: list[str], clients: np.ndarray) -> list[str]:
    """Row labels with the number of participating clients behind each row."""
    return [f"{label} (n={n})" for label, n in zip(labels, clients)]


def _heatmap(ax: Any, matrix: np.ndarray, rows: list[str], title: str) -> Any:
    """Shares in [0, 1] on one colour scale (the colour bar is the caller's), written in each
    cell while they stay legible; returns the image."""
    image = ax.imshow(matrix, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_title(title)
    ax.set_xticks(range(matrix.shape[1]), [f"k={j}" for j in range(matrix.shape[1])])
    ax.set_yticks(range(len(rows)), rows)
    if matrix.size <= 200:
        for (i, j), v in np.ndenumerate(matrix):
            ax.text(
                j,
                i,
                f"{v:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if v > 0.6 else "black",
            )
    return image


def one_model(path: Path, run: str, what: str, dpi: int) -> None:
    """The figure of a run with one model: it has no clusters, so it says so."""
    fig, ax = plt.subplots(figsize=(6.4, 2.4), constrained_layout=True)
    ax.axis("off")
    ax.text(0.5, 0.5, f"one model: every client uses it, no {what} to show", ha="center")
    fig.suptitle(run)
    with naming(path):  # matplotlib's errors name no file
        fig.savefig(path, dpi=dpi)
    plt.close(fig)


def draw_cluster_map(
    path: Path, omega: np.ndarray, manifest: Manifest, round_: int, run: str, dpi: int
) -> None:
    if omega.shape[1] == 1:
        return one_model(path, run, "clusters", dpi)
    shares = cluster_shares(omega, manifest)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.8), constrained_layout=True)
    for ax, (name, (labels, matrix, clients)) in zip(axes, shares.items()):
        image = _heatmap(
            ax, matrix, with_counts(labels, clients), f"share of each {name} per cluster"
        )
    axes[0].set_ylabel(f"class: {class_rows(manifest)}")
    axes[1].set_ylabel("style")
    axes[2].set_ylabel("concept")
    fig.colorbar(image, ax=list(axes), label=SHARE)
    fig.suptitle(
        f"{run}: cluster assignment at round {round_} (n: participating clients in the row)"
    )
    with naming(path):  # matplotlib's errors name no file
        fig.savefig(path, dpi=dpi)
    plt.close(fig)


def draw_accuracy(path: Path, metrics: list[dict[str, Any]], run: str, dpi: int) -> None:
    rows = [r for r in metrics if "train_accuracy" in r]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), constrained_layout=True)
    for key, label in (
        ("train_accuracy", "train"),
        ("local_accuracy", "local (participating)"),
        ("global_accuracy", "global (held-out)"),
    ):
        ax.plot([r["round"] for r in rows], [r[key] for r in rows], marker=".", label=label)
    mark_drifts(ax, metrics)
    ax.set(xlabel="round", ylabel="accuracy", ylim=(0, 1), title=f"{run}: accuracy over rounds")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    ax.grid(alpha=0.3)
    ax.legend()
    with naming(path):  # matplotlib's errors name no file
        fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _omega_rows(ax: Any, omega: np.ndarray, labels: list[str]) -> Any:
    """ω rows with one y label per run of equal labels, white lines between the runs."""
    image = ax.imshow(omega, cmap="viridis", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    changes = [j for j in range(1, len(labels)) if labels[j] != labels[j - 1]]
    for j in changes:
        ax.axhline(j - 0.5, color="white", lw=1)
    starts, ends = [0, *changes], [*changes, len(labels)]
    ax.set_yticks([(a + b - 1) / 2 for a, b in zip(starts, ends)], [labels[a] for a in starts])
    ax.set_xticks(range(omega.shape[1]), [f"k={j}" for j in range(omega.shape[1])])
    return image


def draw_omega(
    path: Path, omega: np.ndarray, manifest: Manifest, round_: int, run: str, dpi: int
) -> None:
    """Participating clients sorted by concept above, held-out clients below, each held-out
    client on a row tall enough for its own label."""
    if omega.shape[1] == 1:
        return one_model(path, run, "weights", dpi)
    clients = manifest.clients
    part = sorted(manifest.participating, key=lambda i: (clients[i].concept, i))
    held = sorted(manifest.held_out, key=lambda i: (clients[i].concept, i))
    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(3.5 + omega.shape[1], 2.2 + 0.05 * len(part) + 0.3 * len(held)),
        height_ratios=[max(0.05 * len(part), 1.0), 0.3 * max(len(held), 1)],
        constrained_layout=True,
    )
    image = _omega_rows(top, omega[part], [manifest.concept_name(i) for i in part])
    top.set_title(f"{run}: ω per client at round {round_}")
    top.set_ylabel("participating, by concept")
    _omega_rows(bottom, omega[held], [manifest.concept_name(i) for i in held])
    bottom.set_ylabel("held-out")
    fig.colorbar(image, ax=[top, bottom], label="ω: the client's weight on model k")
    with naming(path):  # matplotlib's errors name no file
        fig.savefig(path, dpi=dpi)
    plt.close(fig)


def draw_all(
    folder: Path,
    metrics: list[dict[str, Any]],
    assignments: pa.Table,
    manifest: Manifest,
    run: str,
    dpi: int,
    made_from: dict[str, Any] | None = None,
) -> list[Path]:
    """`run` names the figures: the algorithm as a report prints it, and the run folder where
    it is not just the algorithm's name. The
    cluster map and ω of a drifting run are those of its last step; `timeline.png` shows them
    over time. `made_from` (the run's identity) is written beside them as made_from.json."""
    round_, omega = final_omega(assignments)
    names = ["cluster_map.png", "accuracy.png", "omega.png"]
    last = manifest.at_step(manifest.time_steps - 1)
    with atomic_dir(folder) as tmp:
        draw_cluster_map(tmp / names[0], omega, last, round_, run, dpi)
        draw_accuracy(tmp / names[1], metrics, run, dpi)
        draw_omega(tmp / names[2], omega, last, round_, run, dpi)
        if manifest.time_steps > 1:
            names.append("timeline.png")
            draw_timeline(tmp / names[3], metrics, assignments, manifest, run, dpi)
        if made_from is not None:  # with the names of the figures: the rest is a user's
            drawn = sorted(p.name for p in tmp.iterdir())
            made_from = {**made_from, "assignments_round": round_, "files": drawn}
            (tmp / "made_from.json").write_text(json.dumps(made_from, indent=2, sort_keys=True))
    return [folder / n for n in names]
