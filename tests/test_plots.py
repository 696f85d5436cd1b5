"""What the figures say: the run they belong to, whole-number rounds, labelled ω, held-out
clients readable, and "one model" where there are no clusters."""

from __future__ import annotations

import dataclasses
import itertools
import shutil
from pathlib import Path

import matplotlib.figure
import numpy as np
import pytest

from pipeline.config import PlotConfig
from pipeline.data.records import read_manifest
from pipeline.outputs.shares import class_rows, cluster_shares, final_omega
from pipeline.run import files as rf
from pipeline.stages import plot_stage


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, matplotlib.figure.Figure]:
    """Every figure the code saves, by file name, kept open for inspection."""
    saved: dict[str, matplotlib.figure.Figure] = {}
    original = matplotlib.figure.Figure.savefig

    def keep(self, path, *args, **kwargs):
        saved[Path(path).name] = self
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return saved


def titles(figure: matplotlib.figure.Figure) -> str:
    parts = [figure._suptitle.get_text() if figure._suptitle else ""]
    parts += [ax.get_title() for ax in figure.axes]
    return " | ".join(parts)


def test_figures_name_the_run_and_read_clearly(tiny_runs: dict[str, Path], figures) -> None:
    plot_stage(PlotConfig(run=str(tiny_runs["fedrc"])))
    for name in ("cluster_map.png", "accuracy.png", "omega.png"):
        assert "FedRC: " in titles(figures[name]), name  # the paper's name
        assert "(fedrc)" not in titles(figures[name]), name  # runs/fedrc: not said twice
    ticks = figures["accuracy.png"].axes[0].get_xticks()
    assert len(ticks) > 1 and all(float(t).is_integer() for t in ticks)  # no round 2.5
    top, bottom, colourbar = figures["omega.png"].axes
    assert "weight" in colourbar.get_ylabel()  # not a lone ω, which reads like "3" turned
    assert top.get_ylabel().startswith("participating") and bottom.get_ylabel() == "held-out"
    held_out = [t.get_text() for t in bottom.get_yticklabels()]
    assert held_out == ["identity", "reverse", "shift"]  # one row and one label each
    assert len(rf.read_metrics(tiny_runs["fedrc"] / rf.METRICS)) == 3


def test_a_single_model_run_says_one_model(tiny_runs: dict[str, Path], figures) -> None:
    plot_stage(PlotConfig(run=str(tiny_runs["fedavg"])))
    for name in ("cluster_map.png", "omega.png"):
        texts = [t.get_text() for ax in figures[name].axes for t in ax.texts]
        assert any(text.startswith("one model") for text in texts), name
        assert titles(figures[name]).split(" | ")[0] == "FedAvg", name


def test_a_run_folder_named_otherwise_is_named(
    tiny_runs: dict[str, Path], figures, tmp_path: Path
) -> None:
    run = tmp_path / "fedrc-lr0.3"
    shutil.copytree(tiny_runs["fedrc"], run)
    plot_stage(PlotConfig(run=str(run)))
    assert titles(figures["cluster_map.png"]).startswith("FedRC (fedrc-lr0.3): ")


def test_the_cluster_map_has_a_scale_client_counts_and_says_which_labels(
    tiny_runs: dict[str, Path], tiny_data: Path, figures
) -> None:
    """A colour bar for the shares, each row's number of participating clients, and whether
    the class rows are the labels before or after the concept's mapping."""
    plot_stage(PlotConfig(run=str(tiny_runs["fedrc"])))
    classes, styles, concepts, colourbar = figures["cluster_map.png"].axes
    assert "share" in colourbar.get_ylabel() and "cluster" in colourbar.get_ylabel()
    assert colourbar.get_ylim() == (0.0, 1.0)
    manifest = read_manifest(tiny_data)
    part = [c for c in manifest.clients if c.participating]
    expected = [f"{name} (n={sum(c.concept == k for c in part)})" for k, name in
                enumerate(manifest.concepts)]  # fmt: skip
    assert [t.get_text() for t in concepts.get_yticklabels()] == expected
    holding = [sum(c.label_histogram[y] > 0 for c in part) for y in range(10)]
    assert [t.get_text() for t in classes.get_yticklabels()] == [
        f"{y} (n={n})" for y, n in enumerate(holding)
    ]
    assert all("(n=" in t.get_text() for t in styles.get_yticklabels())
    # synthetic data's concepts reverse and shift the labels; the class rows count them so
    assert "label after the concept's mapping" in classes.get_ylabel()


def test_class_rows_say_original_labels_where_no_concept_maps_them(tiny_data: Path) -> None:
    manifest = read_manifest(tiny_data)
    assert class_rows(manifest) == "label after the concept's mapping"
    unmapped = dataclasses.replace(
        manifest,
        clients=tuple(
            dataclasses.replace(c, label_histogram=c.true_label_histogram) for c in manifest.clients
        ),
    )
    assert class_rows(unmapped).startswith("original label")


def test_cluster_shares_count_the_clients_of_each_row(
    tiny_runs: dict[str, Path], tiny_data: Path
) -> None:
    """Shares sum to 1 per row, and a row's count is its participating clients."""
    manifest = read_manifest(tiny_data)
    _, omega = final_omega(rf.read_assignments(tiny_runs["fedrc"] / rf.ASSIGNMENTS))
    part = [c for c in manifest.clients if c.participating]
    shares = cluster_shares(omega, manifest)
    for name, (labels, matrix, clients) in shares.items():
        assert np.allclose(matrix.sum(1)[clients > 0], 1.0), name
        assert len(labels) == len(clients) == matrix.shape[0], name
    styles, _, style_clients = shares["style"]
    assert list(style_clients) == [sum(c.style == s for c in part) for s in styles]
    assert shares["concept"][2].sum() == len(part)


def test_figures_in_print_formats_with_a_font_size(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    """`fedrc plot --format png,pdf,svg --font-size 7`: every figure three times, the PDF a
    PDF, the SVG's words text; an unknown format is one line naming the option, exit 2."""
    from typer.testing import CliRunner

    from fedrc_cli.app import app

    run = tmp_path / "fedrc"
    shutil.copytree(tiny_runs["fedrc"], run)
    args = ["plot", "--run", str(run), "--format", "png,pdf,svg", "--font-size", "7"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for stem in ("cluster_map", "accuracy", "omega"):
        assert (run / "plots" / f"{stem}.pdf").read_bytes().startswith(b"%PDF")
        assert "<text" in (run / "plots" / f"{stem}.svg").read_text()
        assert (run / "plots" / f"{stem}.png").is_file()
    bad = CliRunner().invoke(app, ["plot", "--run", str(run), "--format", "png,tiff"])
    assert bad.exit_code == 2 and "plot.format" in bad.output, bad.output


def test_cluster_ids_stay_apart_at_k8_and_face_their_concepts(tiny_data: Path, figures) -> None:
    """K = 8: the column labels are the cluster ids alone, under an axis named once; the
    cluster holding most of a concept sits in that concept's column."""
    from pipeline.outputs.plots import draw_cluster_map
    from pipeline.outputs.style import FigureStyle

    manifest = read_manifest(tiny_data)
    concept = np.asarray([c.concept for c in manifest.clients])
    omega = np.full((len(manifest.clients), 8), 0.01)
    omega[np.arange(len(concept)), 7 - concept] = 0.93  # concept c in cluster 7 − c
    draw_cluster_map([Path("k8.png")], omega, manifest, 3, "FedRC", FigureStyle(dpi=40))
    concepts_axis = figures["k8.png"].axes[2]
    labels = [t.get_text() for t in concepts_axis.get_xticklabels()]
    assert labels[:3] == ["7", "6", "5"] and sorted(labels) == [str(j) for j in range(8)]
    assert concepts_axis.get_xlabel() == "cluster k"
    figures["k8.png"].canvas.draw()
    boxes = [t.get_window_extent() for t in concepts_axis.get_xticklabels()]
    assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes))  # no two labels overlap
