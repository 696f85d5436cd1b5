"""Many runs → the tables and figures of a paper, written together into one folder.

Runs that differ only in their seed form a row (`groups`); each cell is a mean over seeds with
its sample std, 95 % interval and n (`statistics`), tested against a baseline row where one is
named; Markdown, LaTeX and CSV tables (`markdown`, `latex`, `rows`) and the figures (`figures`)
are written from one computed `Contents`. Every number comes from the runs' own files:
eval.json (accuracies, clustering scores, per-client spread), metrics.jsonl (rounds, curves,
bytes and seconds a round), config.json (configuration, seed, benchmark) and
assignments.parquet (ω, for the cluster maps).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline.common.errors import FedrcError
from pipeline.common.io import atomic_files, remove_leftovers
from pipeline.common.run_lock import writer_lock
from pipeline.data.records import MANIFEST
from pipeline.outputs.contents import Contents, Options, gather
from pipeline.outputs.latex import latex
from pipeline.outputs.markdown import markdown
from pipeline.outputs.rows import summary_rows, write_csv
from pipeline.outputs.runs import find_manifest, find_runs, is_run, load_run
from pipeline.outputs.style import FigureStyle

TABLES = ("report.md", "report.csv", "report.tex")


def check_out(out: Path) -> None:
    """Refuse an --out that is, or is inside, a benchmark or a run folder: the report would mix
    with their files, and `partition --overwrite`, `train` and `plot` replace what is there."""
    target = Path(os.path.abspath(out))
    for folder in (target, *target.parents):
        if (folder / MANIFEST).is_file():
            what = "a fedrc benchmark"
        elif is_run(folder):
            what = "a fedrc run"
        else:
            continue
        where = "is" if folder == target else f"is inside {folder},"
        raise FedrcError(f"--out: {out} {where} {what}; choose a folder of its own for the report")


def figure_stems(contents: Contents) -> list[str]:
    """The report's figures: the overview, the curves, and next-step accuracy when drifting."""
    return ["report", "curves", *(["next_step"] if contents.manifest.time_steps > 1 else [])]


def build_report(
    patterns: list[str],
    out: Path,
    options: Options | None = None,
    style: FigureStyle | None = None,
) -> tuple[list[dict[str, Any]], str | None, list[str]]:
    """Read the runs, check them, then write the tables and figures together; returns the
    CSV's rows, the line on the paper's numbers (None when they are shown on their own
    benchmark) and the names written."""
    from pipeline.outputs.figures import draw_curves, draw_next_step, draw_report

    options, style = options or Options(), style or FigureStyle()
    style.check()
    check_out(out)
    runs = [load_run(p) for p in find_runs(patterns)]
    contents = gather(runs, find_manifest(runs[0]), options)
    rows = summary_rows(contents)
    stems = figure_stems(contents)
    figures = [style.names(stem) for stem in stems]
    names = [*TABLES, *(n for names in figures for n in names)]
    draw = {"report": draw_report, "curves": draw_curves, "next_step": draw_next_step}
    with writer_lock(out, "--out", "fedrc report"):
        remove_leftovers(out, names)  # a killed report's temporary files
        with atomic_files(*(out / n for n in names)) as paths:
            paths[0].write_text(markdown(contents))
            write_csv(paths[1], rows)
            paths[2].write_text(latex(contents))
            start = len(TABLES)
            for stem, files in zip(stems, figures):
                draw[stem](paths[start : start + len(files)], contents, style)
                start += len(files)
    return rows, contents.paper_note, names
