"""`fedrc report`: many runs → one table and one figure, next to the paper's Table 1."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from fedrc_cli.common import console, fail, user_errors, writing
from pipeline.common.errors import counted


def _cell(row: dict[str, Any], stem: str) -> str:
    mean, std = row[f"{stem}_mean"], row[f"{stem}_std"]
    return "–" if mean is None else f"{mean:.1f}±{std:.1f}"


def report(
    runs: Annotated[
        list[str],
        typer.Argument(
            help="Run folders, globs ('runs/*') or folders searched for runs.",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path, typer.Option(help="Folder for report.md, report.csv and report.png.")
    ] = Path("report"),
    dpi: Annotated[int, typer.Option(help="Resolution of report.png.")] = 120,
) -> None:
    """Group runs by algorithm (seeds = runs that differ only in the seed), tabulate local and
    global accuracy (mean ± std, best-train and last round) next to the paper's Table 1, and draw
    the Figure 3 cluster maps of every clustering algorithm with a global-accuracy chart."""
    with user_errors():
        if not 20 <= dpi <= 600:
            raise fail(f"--dpi: expected an integer in [20, 600], got {dpi}")
        from pipeline.outputs.report import (
            build_report,  # torch: imported by the command that needs it
        )

        with writing("--out", out):
            rows, caveat = build_report(runs, out, dpi)
    console.print(summary_table(rows))
    rounds = sorted({r["rounds"] for r in rows})
    lrs = sorted({r["lr"] for r in rows})
    console.print(
        "n: seeds; local, global: at the round with the best train accuracy (the paper's "
        "selection); last: global accuracy at the last round; paper: Table 1, local/global"
        + (f"; {counted(rounds[0], 'round')}" if len(rounds) == 1 else "")
        + (f"; lr {lrs[0]:g} for all" if len(lrs) == 1 else "")
    )
    blind = [f"{r['label']} {_cell(r, 'unlabeled_global')}" for r in rows]
    if any(r["unlabeled_global_mean"] is not None for r in rows):
        console.print("last-round global accuracy, new clients unlabeled: " + ", ".join(blind))
    if caveat:
        console.print(f"[bold]{caveat}[/]")
    console.print(f"Wrote {out}/report.md, report.csv and report.png")


def summary_table(rows: list[dict[str, Any]]) -> Table:
    """One line per group, narrow enough for 80 columns: the seeds as a count (report.md lists
    them), rounds and lr as columns only when the groups differ in them."""
    rounds = len({r["rounds"] for r in rows}) > 1
    lrs = len({r["lr"] for r in rows}) > 1
    table = Table(
        title="accuracy (%), mean ± std over seeds",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    columns = ["algorithm", "n", *(["rounds"] * rounds), *(["lr"] * lrs)]
    for name in (*columns, "local", "global", "last", "purity", "labels", "paper"):
        table.add_column(name, justify="left" if name == "algorithm" else "right", no_wrap=True)
    for r in rows:
        paper = (
            "–" if r["paper_local"] is None else f"{r['paper_local']:.1f}/{r['paper_global']:.1f}"
        )
        purity, labels = (
            "–" if r[f"{k}_mean"] is None else f"{r[f'{k}_mean']:.2f}"
            for k in ("purity", "label_purity")
        )
        table.add_row(
            r["label"] + (" ★" if r["selected"] and _shared(rows, r) else ""),
            str(len(r["seeds"].split())),
            *([r["rounds"]] * rounds),
            *([f"{r['lr']:g}"] * lrs),
            _cell(r, "local"),
            _cell(r, "global"),
            _cell(r, "final_global"),
            purity,
            labels,
            paper,
        )
    return table


def _shared(rows: list[dict[str, Any]], row: dict[str, Any]) -> bool:
    return any(x["algorithm"] == row["algorithm"] and x["label"] != row["label"] for x in rows)
