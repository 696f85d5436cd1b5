"""report.tex: the main table as a LaTeX `table` with booktabs rules, ready for \\input in a
paper (it needs \\usepackage{booktabs}); the caption says what a cell and its marks are."""

from __future__ import annotations

from pipeline.outputs.cells import LATEX, cell_text
from pipeline.outputs.contents import Contents
from pipeline.outputs.markdown import TEST_NAMES, name
from pipeline.outputs.paper import PAPER_SOURCE

SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "★": r"$\star$",
    "–": "--",
    "→": r"$\to$",
}


def escape(text: str) -> str:
    """Plain text as LaTeX prints it: its special characters escaped."""
    return "".join(SPECIAL.get(ch, ch) for ch in text)


def caption(contents: Contents) -> str:
    spread = (
        "the half-width of the 95\\,\\% confidence interval (Student's $t$)"
        if contents.options.spread == "ci"
        else "the sample standard deviation"
    )
    seeds = sorted({len(g.runs) for g in contents.groups})
    n = f"$n = {seeds[0]}$" if len(seeds) == 1 else "$n$ as given per row"
    text = (
        f"Accuracy (\\%) on {escape(contents.manifest.dataset)}, mean $\\pm$ {spread} over "
        f"seeds ({n}); best in each column in bold."
    )
    if contents.baseline is not None:
        text += (
            f" $^{{\\dagger}}p < 0.05$, $^{{\\ddagger}}p < 0.01$: "
            f"{TEST_NAMES[contents.options.test]} against {escape(contents.baseline.label)} "
            "over shared seeds."
        )
    if contents.paper_shown:
        text += f" Paper: {escape(PAPER_SOURCE)}, mean $\\pm$ std as published."
    return text


def latex(contents: Contents) -> str:
    columns = contents.columns
    paper = contents.paper_shown
    titles = ["Algorithm", "$n$", *(escape(c.title) for c in columns)]
    if paper:
        titles += ["Paper local", "Paper global"]
    lines = [
        "% fedrc report: needs \\usepackage{booktabs}",
        "\\begin{table}[t]",
        "\\centering",
        f"\\caption{{{caption(contents)}}}",
        "\\label{tab:fedrc-report}",
        "\\begin{tabular}{l" + "r" * (len(titles) - 1) + "}",
        "\\toprule",
        " & ".join(titles) + " \\\\",
        "\\midrule",
    ]
    for group, cells in zip(contents.groups, contents.cells):
        n = len(group.runs)
        shown = [escape(name(contents, group)), str(n)]
        for column in columns:
            text = cell_text(cells[column.stem], column, contents.options.spread, n, LATEX)
            shown.append("--" if text == "–" else text)
        if paper:
            numbers = contents.paper(group)
            shown += (
                ["--", "--"] if numbers is None else [f"{m:.2f} $\\pm$ {s:.2f}" for m, s in numbers]
            )
        lines.append(" & ".join(shown) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"
