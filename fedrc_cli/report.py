"""`fedrc report`: many runs → a paper's tables (Markdown, LaTeX, CSV) and figures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from fedrc_cli.common import console, fail, user_errors, writing


def _split(value: str | None, option: str, kind: type = str) -> list[Any] | None:
    """A comma-separated option's items (None when not given)."""
    if value is None:
        return None
    items = [part.strip() for part in value.split(",") if part.strip()]
    try:
        return [kind(item) for item in items]
    except ValueError:
        raise fail(f"{option}: expected comma-separated integers, got {value!r}") from None


def report(
    runs: Annotated[
        list[str],
        typer.Argument(
            help="Run folders, globs ('runs/*') or folders searched for runs (a sweep's folder).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(help="Folder for report.md, report.csv, report.tex and the figures."),
    ] = Path("report"),
    baseline: Annotated[
        str | None,
        typer.Option(
            help="A row (its label, or its algorithm when one row has it) that every other row "
            "is tested against, paired by seed: † p < 0.05, ‡ p < 0.01.",
            show_default=False,
        ),
    ] = None,
    test: Annotated[
        str,
        typer.Option(
            help="The paired test: t (paired t-test; can reach p < 0.05 from 3 seeds) or "
            "wilcoxon (signed-rank; no normality assumed, needs 6 seeds for p < 0.05).",
        ),
    ] = "t",
    spread: Annotated[
        str,
        typer.Option(help="What follows ±: ci (95 % confidence interval) or std (sample std)."),
    ] = "ci",
    columns: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated columns of the main table and report.tex: train, local, "
            "global, final_local, final_global, max_global, unlabeled_global, purity, ari, nmi, "
            "label_purity, local_std, local_worst10, megabytes, seconds, minutes.",
            show_default="local,global,final_local,final_global,max_global,purity,ari",
        ),
    ] = None,
    at_rounds: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated rounds of the accuracy-at-rounds table.",
            show_default="50,100,150,200 where the runs have them, else quarters of the longest",
        ),
    ] = None,
    paper: Annotated[
        str,
        typer.Option(
            help="The FedRC paper's Table 1 numbers: auto (only on its benchmark), show "
            "(beside any benchmark, with how it differs) or hide.",
        ),
    ] = "auto",
    format: Annotated[
        str,
        typer.Option("--format", help="Comma-separated figure formats: png, pdf, svg."),
    ] = "png",
    width: Annotated[
        float | None,
        typer.Option(help="Width of the one-panel figures, inches.", show_default=False),
    ] = None,
    height: Annotated[
        float | None,
        typer.Option(help="Height of the one-panel figures, inches.", show_default=False),
    ] = None,
    font_size: Annotated[float, typer.Option(help="Font size of the figures, points.")] = 10.0,
    dpi: Annotated[int, typer.Option(help="Resolution of the PNG figures.")] = 120,
) -> None:
    """Group runs into rows (runs that differ only in their seed), tabulate mean ± 95 % CI
    over seeds with paired tests against a baseline, in Markdown, LaTeX and CSV, and draw the
    rows' curves with seed bands, global accuracy and the cluster maps."""
    with user_errors():
        from pipeline.outputs.contents import Options  # torch: imported once options parse
        from pipeline.outputs.style import FigureStyle

        options = Options(
            columns=_split(columns, "--columns"),
            baseline=baseline,
            test=test,
            spread=spread,
            at_rounds=_split(at_rounds, "--at-rounds", int),
            paper=paper,
        )
        formats = tuple(_split(format, "--format") or [])
        style = FigureStyle(formats, width, height, font_size, dpi)
        options.check()
        style.check()
        from pipeline.outputs.report import build_report

        with writing("--out", out):
            rows, note, names = build_report(runs, out, options, style)
    console.print(summary_table(rows, spread))
    if any(r["unlabeled_global_mean"] is not None for r in rows):
        blind = [f"{r['label']} {_cell(r, 'unlabeled_global', spread)}" for r in rows]
        console.print("last-round global accuracy, new clients unlabeled: " + ", ".join(blind))
    if note:
        console.print(f"[bold]{note}[/]")
    console.print(f"Wrote {out}/: {', '.join(names)}")


def _cell(row: dict[str, Any], stem: str, spread: str) -> str:
    mean = row.get(f"{stem}_mean")
    if mean is None:
        return "–"
    width = row[f"{stem}_std"] if spread == "std" else row.get(f"{stem}_ci_high")
    if width is None:
        return f"{mean:.1f}"
    width = width if spread == "std" else width - mean
    return f"{mean:.1f}±{width:.1f}"


def summary_table(rows: list[dict[str, Any]], spread: str = "ci") -> Table:
    """One line per row, narrow enough for 80 columns: n seeds (report.md has the rest),
    rounds and lr as columns only when the rows differ in them."""
    rounds = len({r["rounds"] for r in rows}) > 1
    lrs = len({r["lr"] for r in rows}) > 1
    what = "95% CI" if spread == "ci" else "sample std"
    table = Table(
        title=f"accuracy (%), mean ± {what} over seeds; best-train round unless 'last'",
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
            str(r["runs"]),
            *([r["rounds"]] * rounds),
            *([f"{r['lr']:g}"] * lrs),
            _cell(r, "local", spread),
            _cell(r, "global", spread),
            _cell(r, "final_global", spread),
            purity,
            labels,
            paper,
        )
    return table


def _shared(rows: list[dict[str, Any]], row: dict[str, Any]) -> bool:
    return any(x["algorithm"] == row["algorithm"] and x["label"] != row["label"] for x in rows)
