"""What a report holds, computed once from its runs: the groups (rows), the cells of the chosen
columns with their tests, the rounds and concepts of the smaller tables, and whether the
paper's numbers stand beside them. report.md, report.tex, report.csv and the figures are each
written from it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.common.errors import FedrcError
from pipeline.data.records import Manifest
from pipeline.outputs.cells import SPREADS, Cell, table_cells
from pipeline.outputs.columns import COLUMNS, COSTS, Column, choose
from pipeline.outputs.groups import Group, find_group, group_runs
from pipeline.outputs.paper import (
    PAPER_SOURCE,
    PAPER_TABLE1_FMNIST,
    benchmark_differences,
    paper_numbers,
    training_differences,
)
from pipeline.outputs.runs import OVER_TIME, Run
from pipeline.outputs.statistics import TESTS, Summary, summary

DEFAULT_ROUNDS = (50, 100, 150, 200)  # the accuracy-at-rounds table, where the runs have them
PAPER_MODES = ("auto", "show", "hide")


@dataclass(frozen=True)
class Options:
    """`fedrc report`'s choices of what the tables show."""

    columns: list[str] | None = None  # None: columns.DEFAULT
    baseline: str | None = None  # a row's label or algorithm; None: no tests
    test: str = "t"  # statistics.TESTS
    spread: str = "ci"  # cells.SPREADS
    at_rounds: list[int] | None = None  # None: DEFAULT_ROUNDS where the runs have them
    paper: str = "auto"  # PAPER_MODES

    def check(self) -> None:
        for option, value, allowed in (
            ("--test", self.test, TESTS),
            ("--spread", self.spread, SPREADS),
            ("--paper", self.paper, PAPER_MODES),
        ):
            if value not in allowed:
                raise FedrcError(f"{option}: expected one of {', '.join(allowed)}, got {value!r}")
        if self.at_rounds is not None and (
            not self.at_rounds or any(r < 1 for r in self.at_rounds)
        ):
            raise FedrcError(f"--at-rounds: expected rounds >= 1, got {self.at_rounds}")


@dataclass
class Contents:
    runs: list[Run]
    groups: list[Group]
    manifest: Manifest
    options: Options
    columns: list[Column]  # the main table's (and report.tex's)
    costs: list[Column]  # the spread-and-cost table's
    cells: list[dict[str, Cell]]  # per group: stem → cell, of every column in COLUMNS
    baseline: Group | None
    rounds: list[int]  # the accuracy-at-rounds table's
    paper_shown: bool
    paper_note: str | None  # why the paper's numbers are absent, or how the benchmark differs

    def n(self, group: Group) -> int:
        return len(group.runs)

    def paper(self, group: Group) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """Table 1's numbers for the group's row, where they are shown; on the paper's own
        benchmark (`--paper auto`) only where the row's training is the paper's (model, K)."""
        if not self.paper_shown:
            return None
        if self.options.paper == "auto" and training_differences(group.config):
            return None
        return paper_numbers(group.base)


def gather(runs: list[Run], manifest: Manifest, options: Options) -> Contents:
    """The report of `runs` on `manifest`'s benchmark."""
    options.check()
    columns = choose(options.columns, runs)
    costs = [COLUMNS[stem] for stem in COSTS if COLUMNS[stem] not in columns]
    groups = group_runs(runs, list(PAPER_TABLE1_FMNIST))
    baseline = None
    if options.baseline is not None:
        baseline = find_group(groups, options.baseline, "--baseline")
    cells = table_cells(groups, list(COLUMNS.values()), baseline, options.test)
    shown, note = paper_decision(options.paper, manifest)
    return Contents(
        runs,
        groups,
        manifest,
        options,
        columns,
        costs,
        cells,
        baseline,
        milestones(runs, options.at_rounds),
        shown,
        note,
    )


def paper_decision(mode: str, manifest: Manifest) -> tuple[bool, str | None]:
    """Whether the paper's numbers are shown, and the line that says why not or how the
    benchmark differs from the paper's."""
    differences = "; ".join(benchmark_differences(manifest))
    if mode == "hide":
        return False, "The paper's numbers are left out (--paper hide)."
    if not differences:
        return True, None
    if mode == "show":
        return True, (
            f"{PAPER_SOURCE} was measured on another benchmark ({differences}): its numbers "
            "are shown for orientation only (--paper show)."
        )
    return False, (
        f"The paper's numbers are not shown: this benchmark is not that of {PAPER_SOURCE} "
        f"({differences}); --paper show puts them beside it."
    )


def milestones(runs: list[Run], asked: list[int] | None) -> list[int]:
    """The rounds of the accuracy-at-rounds table: those asked; else 50, 100, 150, 200 where
    the longest run has them, or a quarter, half, three quarters and all of a shorter one."""
    if asked:
        return sorted(set(asked))
    longest = max(r.rounds for r in runs)
    marks = [m for m in DEFAULT_ROUNDS if m <= longest]
    return marks or sorted({max(1, math.ceil(longest * q / 4)) for q in range(1, 5)})


def global_at(run: Run, round_: int) -> float | None:
    """Soft global accuracy at the run's last evaluation at or before `round_`; None if the run
    stopped before `round_` or had not been evaluated by then."""
    if run.rounds < round_:
        return None
    curve = run.curve("global_accuracy")
    evaluated = [r for r in curve if r <= round_]
    return curve[max(evaluated)] if evaluated else None


def at_rounds(group: Group, rounds: list[int]) -> list[Summary]:
    """Global accuracy (%) at each of `rounds` over seeds, only where every seed got there;
    none on FedRC-FT's row (the logged curves are the models before fine-tuning)."""
    out = []
    for round_ in rounds:
        values = [global_at(r, round_) for r in group.runs]
        complete = [] if group.finetuned or None in values else values
        out.append(summary(complete, 100))
    return out


def by_concept(group: Group, concepts: tuple[str, ...]) -> list[Summary]:
    """Global accuracy (%) per concept over seeds, at the best-train round (FedRC-FT: the
    last round, fine-tuned)."""
    key = "final_global_accuracy_by_concept" if group.finetuned else "global_accuracy_by_concept"
    out = []
    for concept in concepts:
        values = [r.result.get(key, {}).get(concept) for r in group.runs]
        out.append(summary([v for v in values if v is not None], 100))
    return out


def over_time(group: Group) -> dict[str, Any] | None:
    """A drifting run's numbers over seeds: accuracies in % and rounds to recover, the matched
    share and ARI as they are, the drifts that did not recover (over all seeds), and the
    next-step accuracy at each step; None unless every run has them."""
    if not all("over_time" in r.result for r in group.runs):
        return None
    over = [r.result["over_time"] for r in group.runs]

    def cell(key: str, scale: float) -> Summary:
        return summary([o[key] for o in over if o.get(key) is not None], scale)

    cells: dict[str, Any] = {stem: cell(key, 100) for stem, key in OVER_TIME.items()}
    cells["recovery"] = cell("mean_recovery_rounds", 1)
    cells["steps_purity"] = cell("mean_concept_purity", 1)
    cells["steps_ari"] = cell("mean_concept_ari", 1)
    cells["unrecovered"] = sum(o["unrecovered_drifts"] for o in over)
    steps = []
    for step in range(over[0]["time_steps"] - 1):
        values = [o["steps"][step]["next_accuracy"] for o in over]
        steps.append(summary([v for v in values if v is not None], 100))
    cells["next_steps"] = steps
    return cells
