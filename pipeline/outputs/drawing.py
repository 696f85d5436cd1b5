"""Pieces the figures share: heat maps of shares and of ω with clusters in matched order and
colour, client ids beside a per-client axis, and the figure of a run with one model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from pipeline.outputs.style import FigureStyle

SHARE = "share of the row's training samples in cluster k"  # the cluster maps' colour bar
ROW_INCHES = 0.12  # a participating client's row in an ω figure, up to PANEL_INCHES in all
PANEL_INCHES = 8.0


def cluster_axis(ax: Any, order: list[int], colours: list[Any] | None) -> None:
    """The cluster ids under the columns (numbers, so K = 8 or more stay apart), each in its
    matched concept's colour."""
    ax.set_xticks(range(len(order)), [str(j) for j in order])
    ax.set_xlabel("cluster k")
    if colours is not None:
        for label, j in zip(ax.get_xticklabels(), order):
            label.set_color(colours[j])
            label.set_fontweight("bold")


def heatmap(
    ax: Any,
    matrix: np.ndarray,
    rows: list[str],
    title: str,
    order: list[int] | None = None,
    colours: list[Any] | None = None,
) -> Any:
    """Shares in [0, 1] on one colour scale (the colour bar is the caller's), columns in
    `order` (default: by index), written in each cell while they stay legible; returns the
    image."""
    order = list(range(matrix.shape[1])) if order is None else order
    shown = matrix[:, order]
    image = ax.imshow(shown, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    ax.set_title(title)
    cluster_axis(ax, order, colours)
    ax.set_yticks(range(len(rows)), rows)
    if shown.size <= 200:
        size = 7 if shown.shape[1] <= 6 else 6
        for (i, j), v in np.ndenumerate(shown):
            colour = "white" if v > 0.6 else "black"
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=size, color=colour)
    return image


def clients_height(clients: int) -> float:
    """Inches for the rows of `clients` participating clients: their ids stay legible."""
    return min(max(ROW_INCHES * clients, 1.2), PANEL_INCHES)


def client_ids(ax: Any, ids: list[int], inches: float) -> None:
    """Client ids on the right of a per-client axis `inches` tall (rows top to bottom), as
    many as fit one above the other at a small font, evenly spread."""
    fit = max(2, int(inches * 72 / 9))
    step = max(1, int(np.ceil(len(ids) / fit)))
    right = ax.secondary_yaxis("right")
    rows = list(range(0, len(ids), step))
    right.set_yticks(rows, [str(ids[r]) for r in rows], fontsize="x-small")
    right.set_ylabel("client id")


def one_model(paths: list[Path], run: str, what: str, style: FigureStyle) -> None:
    """The figure of a run with one model: it has no clusters, so it says so."""
    with style.fonts():
        fig, ax = plt.subplots(figsize=(6.4, 2.4), constrained_layout=True)
        ax.axis("off")
        ax.text(0.5, 0.5, f"one model: every client uses it, no {what} to show", ha="center")
        fig.suptitle(run)
        style.save(fig, paths)
        plt.close(fig)


def omega_rows(
    ax: Any, omega: np.ndarray, labels: list[str], order: list[int], colours: list[Any] | None
) -> Any:
    """ω rows (clusters in `order`) with one y label per run of equal labels, white lines
    between the runs."""
    image = ax.imshow(
        omega[:, order], cmap="viridis", vmin=0, vmax=1, aspect="auto", interpolation="nearest"
    )
    changes = [j for j in range(1, len(labels)) if labels[j] != labels[j - 1]]
    for j in changes:
        ax.axhline(j - 0.5, color="white", lw=1)
    starts, ends = [0, *changes], [*changes, len(labels)]
    ax.set_yticks([(a + b - 1) / 2 for a, b in zip(starts, ends)], [labels[a] for a in starts])
    cluster_axis(ax, order, colours)
    return image
