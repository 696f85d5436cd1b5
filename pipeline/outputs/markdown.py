"""report.md: the main table with what its cells mean, then spread and cost, global accuracy
per concept, accuracy at chosen rounds and, on a drifting benchmark, the over-time tables."""

from __future__ import annotations

from pipeline.common.errors import counted
from pipeline.outputs.cells import MARKDOWN, cell_text
from pipeline.outputs.columns import Column
from pipeline.outputs.contents import Contents, at_rounds, by_concept, over_time
from pipeline.outputs.groups import Group
from pipeline.outputs.paper import PAPER_SOURCE
from pipeline.outputs.statistics import Summary

TEST_NAMES = {"t": "paired t-test", "wilcoxon": "Wilcoxon signed-rank test"}
OVER_TIME_TITLES = (
    "algorithm", "local (steps)", "next (steps)", "after drift", "recover", "matched share", "ARI",
)  # fmt: skip


def statistics_line(contents: Contents) -> str:
    """What a cell is and what its marks say, in one paragraph."""
    spread = (
        "the half-width of the 95 % confidence interval of the mean (Student's t)"
        if contents.options.spread == "ci"
        else "the sample standard deviation (ddof = 1)"
    )
    text = (
        f"Cells: mean ± {spread} over seeds; n is the row's number of seeds, and a cell "
        "with fewer values says so; one seed is shown as its value alone. report.csv has the "
        "mean, sample std, interval and n of every cell. **Bold**: the best in its column."
    )
    if contents.baseline is not None:
        text += (
            f" † p < 0.05, ‡ p < 0.01: {TEST_NAMES[contents.options.test]} against "
            f"**{contents.baseline.label}** over the seeds both rows have (two-sided, no "
            "correction for the number of tests)."
        )
    return text


def plain(summary: Summary, digits: int = 2) -> str:
    """A small table's cell: mean ± the sample std, or the value alone, or –."""
    if summary.n == 0:
        return "–"
    if summary.std is None:
        return f"{summary.mean:.{digits}f}"
    return f"{summary.mean:.{digits}f} ± {summary.std:.{digits}f}"


def name(contents: Contents, group: Group) -> str:
    """The row's name, ★ on the configuration the paper's lr rule picks, and "(baseline)"."""
    shared = sum(g.config["algorithm"] == group.config["algorithm"] for g in contents.groups) > 1
    star = " ★" if group.selected and shared and group.label != group.base else ""
    return group.label + star + (" (baseline)" if group is contents.baseline else "")


def _header(titles: list[str]) -> list[str]:
    return ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]


def column_table(contents: Contents, columns: list[Column], paper: bool) -> list[str]:
    """One row per group: its seeds, rounds, lr and `columns`; Table 1's numbers after them."""
    titles = ["algorithm", "n", "rounds", "lr", *(c.title for c in columns)]
    if paper:
        titles += ["paper local", "paper global"]
    lines = _header(titles)
    for group, cells in zip(contents.groups, contents.cells):
        n = contents.n(group)
        rounds = sorted({r.rounds for r in group.runs})
        shown = [
            name(contents, group),
            str(n),
            "-".join(map(str, sorted({rounds[0], rounds[-1]}))),
            f"{group.config['lr']:g}",
            *(cell_text(cells[c.stem], c, contents.options.spread, n, MARKDOWN) for c in columns),
        ]
        if paper:
            numbers = contents.paper(group)
            shown += ["–", "–"] if numbers is None else [f"{m:.2f} ± {s:.2f}" for m, s in numbers]
        lines.append("| " + " | ".join(shown) + " |")
    return lines


def legend(columns: list[Column]) -> list[str]:
    return ["", *(f"- *{c.title}*: {c.what}." for c in columns)]


def markdown(contents: Contents) -> str:
    manifest, runs = contents.manifest, contents.runs
    lines = [
        "# Report",
        "",
        f"Benchmark: {manifest.dataset}, {len(manifest.participating)} participating clients"
        + (f", {manifest.time_steps} time steps" if manifest.time_steps > 1 else "")
        + f", content hash `{runs[0].config['data_digest'][:12]}`; "
        f"{counted(len(runs), 'run')} in {counted(len(contents.groups), 'row')}. Accuracies in "
        "%, soft prediction unless a row says (hard) (IFCA, CFL, FeSEM… predict with their "
        "cluster's model: their own rule, unmarked).",
        "",
        statistics_line(contents),
    ]
    if contents.paper_shown:
        lines += ["", f"Paper: {PAPER_SOURCE}, local / global, mean ± std as published."]
    if contents.paper_note:
        lines += ["", f"**{contents.paper_note}**"]
    lines += ["", *column_table(contents, contents.columns, contents.paper_shown)]
    lines += legend(contents.columns)
    if any(g.finetuned for g in contents.groups):
        lines.append(
            "- FedRC-FT rows: fine-tuned at the last round only; the best-train and maximum "
            "columns (the models before fine-tuning) are left empty."
        )
    if any(" ★" in line for line in lines):
        lines.append(
            "- ★: of one algorithm's configurations, the one with the best mean train accuracy "
            "(how the paper picks its learning rate)."
        )
    lines += spread_table(contents)
    lines += concept_table(contents) + rounds_table(contents) + over_time_tables(contents)
    return "\n".join(lines) + "\n"


def spread_table(contents: Contents) -> list[str]:
    if not contents.costs:
        return []
    lines = ["", "## Spread over clients, communication and time", ""]
    lines += column_table(contents, contents.costs, paper=False)
    return lines + legend(contents.costs)


def concept_table(contents: Contents) -> list[str]:
    concepts = contents.manifest.concepts
    lines = [
        "",
        "## Global accuracy per concept",
        "",
        "Each held-out client holds one concept; its accuracy (%) at the best-train round "
        "(FedRC-FT: the last round, fine-tuned), mean ± sample std over seeds.",
        "",
        *_header(["algorithm", *concepts]),
    ]
    for group in contents.groups:
        cells = [plain(s) for s in by_concept(group, concepts)]
        lines.append(f"| {name(contents, group)} | " + " | ".join(cells) + " |")
    return lines


def rounds_table(contents: Contents) -> list[str]:
    """Global accuracy at the chosen rounds: is an algorithm still climbing, and where do the
    paper's numbers fall on its curve."""
    marks, paper = contents.rounds, contents.paper_shown
    lines = [
        "",
        "## Global accuracy at chosen rounds",
        "",
        "Soft global accuracy (%) at the last evaluation at or before each round, mean ± "
        "sample std over seeds (– where a seed stopped earlier; none for FedRC-FT, whose "
        "logged curve is before fine-tuning)"
        + ("; the paper's number is at its best-train round." if paper else "."),
        "",
        *_header(
            ["algorithm", *(f"round {m}" for m in marks), *(["paper global"] if paper else [])]
        ),
    ]
    for group in contents.groups:
        cells = [plain(s) for s in at_rounds(group, marks)]
        if paper:
            numbers = contents.paper(group)
            cells.append("–" if numbers is None else f"{numbers[1][0]:.2f} ± {numbers[1][1]:.2f}")
        lines.append(f"| {name(contents, group)} | " + " | ".join(cells) + " |")
    return lines


def over_time_tables(contents: Contents) -> list[str]:
    """The drift tables: how each algorithm fared over the time steps."""
    steps = contents.manifest.time_steps
    rows = [(g, over_time(g)) for g in contents.groups]
    rows = [(g, cells) for g, cells in rows if cells is not None]
    if steps == 1 or not rows:
        return []
    lines = [
        "",
        f"## Over time ({steps} steps)",
        "",
        "Per step, at its last round: *local* on the step's own test data, *next* on the next "
        "step's data before any round trained on it (FedDrift's protocol), *after drift* the "
        "clients that drifted, scored on their new data before any round; *recover*: rounds "
        "until those clients are back within 1 point of their accuracy before the drift "
        "(mean over drifts that recovered; the count that did not, over all seeds, in "
        "brackets); *matched share* and *ARI* of the clusters against the concepts, mean over "
        "steps (a step where every client holds one concept scores one cluster as perfect).",
        "",
        *_header(OVER_TIME_TITLES),
    ]
    for group, cells in rows:
        recover = cells["recovery"]
        lines.append(
            f"| {name(contents, group)} | {plain(cells['steps_local'])} "
            f"| {plain(cells['steps_next'])} | {plain(cells['after_drift'])} "
            f"| {plain(recover, 1)} ({cells['unrecovered']}) "
            f"| {plain(cells['steps_purity'], 3)} | {plain(cells['steps_ari'], 3)} |"
        )
    transitions = [f"{t} → {t + 1}" for t in range(steps - 1)]
    lines += ["", "Next-step accuracy (%) at the end of each step:", ""]
    lines += _header(["algorithm", *transitions])
    for group, cells in rows:
        shown = [plain(s) for s in cells["next_steps"]]
        lines.append(f"| {name(contents, group)} | " + " | ".join(shown) + " |")
    return lines
