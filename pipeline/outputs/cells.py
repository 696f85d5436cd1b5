"""A report's cells: each group's value of each column over its seeds, its test against the
baseline, the best of each column, and the text of a cell in Markdown or LaTeX."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.outputs.columns import Column
from pipeline.outputs.groups import Group
from pipeline.outputs.statistics import Summary, mark, paired_p, summary

SPREADS = ("ci", "std")  # what follows ± in a cell: the 95 % interval's half-width, or the std


@dataclass
class Cell:
    summary: Summary
    by_seed: dict[int, float]  # the values behind it (scaled), for the paired test
    p: float | None = None  # against the baseline's cell of the same column
    best: bool = False


def column_cell(group: Group, column: Column) -> Cell:
    """The group's cell: empty on FedRC-FT's row where the column reads un-fine-tuned models."""
    if group.finetuned and not column.finetuned:
        return Cell(summary([]), {})
    values = {run.seed: column.read(run) for run in group.runs}
    kept = {seed: v * column.scale for seed, v in values.items() if v is not None}
    return Cell(summary(list(kept.values())), kept)


def table_cells(
    groups: list[Group], columns: list[Column], baseline: Group | None, test: str
) -> list[dict[str, Cell]]:
    """Per group, its cell of each column, tested against `baseline` (if any), best marked."""
    cells = [{c.stem: column_cell(g, c) for c in columns} for g in groups]
    if baseline is not None:
        base = cells[groups.index(baseline)]
        for group, row in zip(groups, cells):
            if group is baseline:
                continue
            for stem, cell in row.items():
                cell.p = paired_p(cell.by_seed, base[stem].by_seed, test)
    for column in columns:
        mark_best([row[column.stem] for row in cells], column)
    return cells


def mark_best(cells: list[Cell], column: Column) -> None:
    """The best mean of a column as written (ties all marked), where it has a direction and
    more than one row has a value."""
    shown = [(round(c.summary.mean, column.digits), c) for c in cells if c.summary.n > 0]
    if column.better == 0 or len(shown) < 2:
        return
    best = max(v * column.better for v, _ in shown) * column.better
    for value, cell in shown:
        cell.best = value == best


@dataclass(frozen=True)
class Markup:
    """How a cell's parts are written: Markdown or LaTeX."""

    plus_minus: str
    bold: str  # a format with one {}
    marks: dict[str, str]  # a significance mark → its text


MARKDOWN = Markup(" ± ", "**{}**", {})
LATEX = Markup(r" $\pm$ ", r"\textbf{{{}}}", {"†": r"$^{\dagger}$", "‡": r"$^{\ddagger}$"})


def cell_text(cell: Cell, column: Column, spread: str, row_n: int, markup: Markup) -> str:
    """ "61.23 ± 2.61" (± the 95 % interval's half-width, or the std), one seed "61.23", "–"
    without a value; "(n=2)" when the cell has fewer values than the row has seeds; the best
    in bold; the significance mark after it."""
    s = cell.summary
    if s.n == 0:
        return "–"
    text = f"{s.mean:.{column.digits}f}"
    width = s.half_width if spread == "ci" else s.std
    if width is not None:
        text += f"{markup.plus_minus}{width:.{column.digits}f}"
    if cell.best:
        text = markup.bold.format(text)
    symbol = mark(cell.p)
    text += markup.marks.get(symbol, symbol)
    return text + (f" (n={s.n})" if s.n != row_n else "")
