"""The report's statistics and cells on hand-checked numbers: sample std, the t-interval,
paired tests, significance marks, best-in-column, one seed, LaTeX escaping, and which runs are
the paper's benchmark."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pipeline.outputs.cells import LATEX, MARKDOWN, Cell, cell_text, mark_best
from pipeline.outputs.columns import COLUMNS
from pipeline.outputs.latex import escape
from pipeline.outputs.statistics import mark, paired_p, summary


def test_the_summary_is_the_mean_sample_std_and_t_interval() -> None:
    """60, 62, 64: mean 62, s = 2 (ddof 1; ddof 0 would be 1.633), t(0.975, 2) = 4.302653, so
    the half-width is 4.302653 · 2 / √3 = 4.968275."""
    s = summary([0.60, 0.62, 0.64], scale=100)
    assert (s.n, s.mean, s.std) == (3, pytest.approx(62.0), pytest.approx(2.0))
    assert s.half_width == pytest.approx(4.302653 * 2 / math.sqrt(3), rel=1e-6)
    assert (s.low, s.high) == (pytest.approx(62 - 4.968275), pytest.approx(62 + 4.968275))


def test_one_seed_has_no_spread_and_none_has_no_value() -> None:
    one = summary([0.5], 100)
    assert (one.n, one.mean, one.std, one.half_width) == (1, 50.0, None, None)
    assert summary([]).mean is None


def test_the_paired_t_test_by_hand() -> None:
    """Differences 1, 2, 3 over seeds 0–2: mean 2, s = 1, t = 2 / (1 / √3) = 3.4641 on 2
    degrees of freedom: two-sided p = 0.07418. Seed 9 of one row has no partner."""
    row = {0: 11.0, 1: 22.0, 2: 33.0, 9: 50.0}
    base = {0: 10.0, 1: 20.0, 2: 30.0}
    assert paired_p(row, base, "t") == pytest.approx(0.074180, abs=1e-5)


def test_the_wilcoxon_test_cannot_go_below_its_floor_with_three_seeds() -> None:
    """Exact two-sided signed-rank p with 3 pairs all one way: 2 / 2^3 = 0.25."""
    row, base = {0: 5.0, 1: 7.0, 2: 9.0}, {0: 1.0, 1: 1.0, 2: 1.0}
    assert paired_p(row, base, "wilcoxon") == pytest.approx(0.25)
    assert paired_p(row, base, "t") < 0.05  # the t-test can (differences 4, 6, 8)


def test_a_test_needs_two_pairs_and_some_spread() -> None:
    assert paired_p({0: 1.0}, {0: 2.0}, "t") is None
    assert paired_p({0: 1.0, 1: 2.0}, {2: 1.0, 3: 2.0}, "t") is None  # no seed in common
    assert paired_p({0: 3.0, 1: 4.0}, {0: 1.0, 1: 2.0}, "t") is None  # every pair +2


def test_marks() -> None:
    assert [mark(p) for p in (None, 0.2, 0.049, 0.0099)] == ["", "", "†", "‡"]


def test_cells_in_markdown_and_latex() -> None:
    column = COLUMNS["global"]
    three = Cell(summary([0.60, 0.62, 0.64], 100), {}, p=0.03, best=True)
    assert cell_text(three, column, "ci", 3, MARKDOWN) == "**62.00 ± 4.97**†"
    assert cell_text(three, column, "std", 3, MARKDOWN) == "**62.00 ± 2.00**†"
    assert cell_text(three, column, "std", 3, LATEX) == r"\textbf{62.00 $\pm$ 2.00}$^{\dagger}$"
    one = Cell(summary([0.5], 100), {})
    assert cell_text(one, column, "ci", 1, MARKDOWN) == "50.00"  # never "± 0.00"
    assert cell_text(one, column, "ci", 3, MARKDOWN) == "50.00 (n=1)"  # fewer than the row
    assert cell_text(Cell(summary([]), {}), column, "ci", 3, MARKDOWN) == "–"


def test_the_best_follows_the_direction_and_ties_share_it() -> None:
    cells = [Cell(summary([v], 100), {}) for v in (0.5, 0.7, 0.7, 0.1)]
    mark_best(cells, COLUMNS["global"])
    assert [c.best for c in cells] == [False, True, True, False]
    costs = [Cell(summary([v], 1), {}) for v in (3.0, 1.0, 2.0)]
    mark_best(costs, COLUMNS["seconds"])  # lower is better
    assert [c.best for c in costs] == [False, True, False]
    labels = [Cell(summary([v], 1), {}) for v in (0.3, 0.9)]
    mark_best(labels, COLUMNS["label_purity"])  # neither way is better
    assert not any(c.best for c in labels)


def test_latex_escapes_labels() -> None:
    assert escape("FedRC lr=0.03 ★ 50% & a_b") == r"FedRC lr=0.03 $\star$ 50\% \& a\_b"


def test_only_the_papers_benchmark_is_the_papers(tiny_data) -> None:
    from pipeline.data.records import read_manifest
    from pipeline.outputs.paper import benchmark_differences, training_differences

    manifest = read_manifest(tiny_data)
    differences = benchmark_differences(manifest)
    assert "dataset synthetic, not fmnist" in differences
    assert "clients 12, not 300" in differences
    paper = dataclasses.replace(
        manifest,
        dataset="fmnist",
        config={**manifest.config, "clients": 300, "shifts": ["concept", "feature", "label"]},
    )
    assert benchmark_differences(paper) == []  # the order of the shifts does not matter
    drifting = dataclasses.replace(paper, time_steps=3)
    assert benchmark_differences(drifting) == ["3 time steps (drift), not 1"]
    assert training_differences({"model": "cnn", "clusters": 3}) == []
    assert training_differences({"model": "mlp", "clusters": 3}) == ["model mlp, not cnn"]
