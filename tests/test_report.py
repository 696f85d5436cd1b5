"""`fedrc report` over tiny runs: 2 algorithms × 2 seeds, numbers, files and one-line errors."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_TRAIN
from PIL import Image
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.config import EvalConfig
from pipeline.outputs.report import PAPER_TABLE1_FMNIST
from pipeline.run.files import METRICS, read_metrics
from pipeline.run.resolve import make_config
from pipeline.stages import eval_stage, train_stage

runner = CliRunner()
ALGORITHMS = ("fedem", "fedrc")
SEEDS = (0, 1)
FAST = dict(TINY_TRAIN, rounds=2, local_epochs=1)


@pytest.fixture(scope="module")
def runs_root(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report") / "runs"
    for algorithm in ALGORITHMS:
        for seed in SEEDS:
            out = root / f"{algorithm}-s{seed}"
            config = dict(FAST, data=str(tiny_data), algorithm=algorithm, seed=seed)
            train_stage(make_config(**config, out=str(out)))
            eval_stage(EvalConfig(run=str(out)))
    return root


def invoke(*args: object):
    return runner.invoke(app, ["report", *map(str, args)])


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with path.open() as f:
        return {row["algorithm"]: row for row in csv.DictReader(f)}


def evals(root: Path, algorithm: str) -> list[dict]:
    return [json.loads((root / f"{algorithm}-s{s}" / "eval.json").read_text()) for s in SEEDS]


def assert_one_line_error(result, *culprits: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output
    assert all(c in lines[0] for c in culprits), result.output


def test_help() -> None:
    result = runner.invoke(app, ["report", "--help"])
    assert result.exit_code == 0 and "--out" in result.output


def test_report_is_the_mean_and_std_over_seeds(runs_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = invoke(runs_root, "--out", out)
    assert result.exit_code == 0, result.output
    assert "FedRC" in result.output and "FedEM" in result.output  # the rich table
    assert "synthetic with" in result.output and "orientation only" in result.output

    rows = read_csv(out / "report.csv")
    assert set(rows) == set(ALGORITHMS)
    for algorithm in ALGORITHMS:
        row, results = rows[algorithm], evals(runs_root, algorithm)
        assert row["runs"] == "2" and row["seeds"] == "0 1"
        assert row["rounds"] == str(FAST["rounds"])
        for stem, key in (
            ("local", "local_accuracy"),
            ("global", "global_accuracy"),
            ("final_local", "final_local_accuracy"),
            ("final_global", "final_global_accuracy"),
        ):
            values = [r[key] for r in results]
            assert float(row[f"{stem}_mean"]) == pytest.approx(100 * np.mean(values))
            assert float(row[f"{stem}_std"]) == pytest.approx(100 * np.std(values))
        for stem, key in (("purity", "concept_purity"), ("label_purity", "label_purity")):
            shares = [r[key] for r in results]
            assert float(row[f"{stem}_mean"]) == pytest.approx(np.mean(shares))
    paper = PAPER_TABLE1_FMNIST["FedRC"]
    assert (float(rows["fedrc"]["paper_local"]), float(rows["fedrc"]["paper_global"])) == (
        paper[0][0],
        paper[1][0],
    )

    markdown = (out / "report.md").read_text()
    main_table = markdown.split("## Global accuracy over rounds")[0]
    table = [line for line in main_table.splitlines() if line.startswith("| Fed")]
    assert [line.split(" | ")[0] for line in table] == ["| FedEM", "| FedRC"]
    assert "paper global" in markdown and "56.64 ± 2.14" in markdown  # FedEM's Table 1 value
    with Image.open(out / "report.png") as image:
        assert image.format == "PNG" and image.size[0] > 500


def test_globs_select_runs(runs_root: Path, tmp_path: Path) -> None:
    result = invoke(f"{runs_root}/fedrc-*", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert set(read_csv(tmp_path / "out" / "report.csv")) == {"fedrc"}


def test_the_best_train_accuracy_is_marked(
    runs_root: Path, tiny_data: Path, tmp_path: Path
) -> None:
    """Runs that differ in lr are separate rows; the best train accuracy is the paper's pick."""
    root = tmp_path / "runs"
    shutil.copytree(runs_root, root)
    other = root / "fedrc-s0-lr"
    config = dict(FAST, data=str(tiny_data), algorithm="fedrc", seed=0, lr=0.2)
    train_stage(make_config(**config, out=str(other)))  # its config.json is model.pt's
    eval_stage(EvalConfig(run=str(other)))
    data = json.loads((other / "eval.json").read_text())
    (other / "eval.json").write_text(json.dumps({**data, "train_accuracy": 1.0}))
    result = invoke(root, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    with (tmp_path / "out" / "report.csv").open() as f:
        rows = {row["label"]: row for row in csv.DictReader(f)}
    assert rows["FedRC lr=0.2"]["selected"] == "True"
    assert rows["FedRC lr=0.05"]["selected"] == "False"
    assert "FedRC lr=0.2 ★" in (tmp_path / "out" / "report.md").read_text()


def test_no_runs_found(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    assert_one_line_error(invoke(tmp_path / "empty", "--out", out), "empty", "no run folders")
    assert_one_line_error(invoke(tmp_path / "nowhere", "--out", out), "nowhere")
    assert not out.exists()


def test_a_run_without_eval_json(runs_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    shutil.copytree(runs_root, root)
    (root / "fedem-s1" / "eval.json").unlink()
    out = tmp_path / "out"
    assert_one_line_error(invoke(root, "--out", out), "fedem-s1", "eval.json")
    assert not out.exists()


def test_runs_of_other_benchmarks(runs_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    shutil.copytree(runs_root, root)
    config = root / "fedrc-s1" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "data_digest": "0" * 64}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("earlier report\n")
    assert_one_line_error(invoke(root, "--out", out), "fedrc-s1", "another benchmark")
    assert [p.name for p in out.iterdir()] == ["report.md"]  # nothing new, nothing lost
    assert (out / "report.md").read_text() == "earlier report\n"


def test_global_accuracy_over_rounds(runs_root: Path, tmp_path: Path) -> None:
    """The milestone columns are the logged global accuracies, mean ± std over seeds; a group
    with a seed that stopped before a milestone gets no number there."""
    root = tmp_path / "runs"
    shutil.copytree(runs_root, root)
    stopped = root / "fedem-s1" / "metrics.jsonl"
    stopped.write_text(stopped.read_text().splitlines(keepends=True)[0])  # round 1 only
    out = tmp_path / "out"
    assert invoke(root, "--out", out).exit_code == 0
    rows = read_csv(out / "report.csv")
    curves = {
        (a, s): {
            r["round"]: r["global_accuracy"] for r in read_metrics(root / f"{a}-s{s}" / METRICS)
        }
        for a in ALGORITHMS
        for s in SEEDS
    }
    for round_ in (1, 2):
        values = [curves["fedrc", s][round_] for s in SEEDS]
        assert float(rows["fedrc"][f"global_round{round_}_mean"]) == pytest.approx(
            100 * np.mean(values)
        )
        assert float(rows["fedrc"][f"global_round{round_}_std"]) == pytest.approx(
            100 * np.std(values)
        )
    values = [curves["fedem", s][1] for s in SEEDS]
    assert float(rows["fedem"]["global_round1_mean"]) == pytest.approx(100 * np.mean(values))
    assert rows["fedem"]["global_round2_mean"] == ""
    progress = (out / "report.md").read_text().split("## Global accuracy over rounds")[1]
    fedem = next(line for line in progress.splitlines() if line.startswith("| FedEM |"))
    assert fedem.endswith("| – |") and "| round 1 | round 2 |" in progress


def test_the_table_fits_80_columns(runs_root: Path, tmp_path: Path) -> None:
    """Every column whole at 80 columns (no "puri…"), with the paper's column and a CFL(3)-long
    name with a ★ and a hard-prediction label."""
    import io

    from rich.console import Console

    from fedrc_cli.report import summary_table
    from pipeline.outputs.report import build_report

    rows, _ = build_report([str(runs_root)], tmp_path / "out")
    rows[0] = {**rows[0], "label": "FedRC-FT (hard)", "paper_local": 91.02, "paper_global": 62.37}
    screen = Console(width=80, file=io.StringIO(), record=True)
    screen.print(summary_table(rows))
    text = screen.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    for header in ("algorithm", "local", "global", "last", "purity", "labels", "paper"):
        assert header in text
    assert "91.0/62.4" in text


def test_a_hard_evaluated_ifca_keeps_its_paper_column_and_concept_map(
    runs_root: Path, tiny_data: Path, tmp_path: Path
) -> None:
    """`fedrc eval --hard` is IFCA's own rule (one cluster's model a client), the one its paper
    reports: the row stays "IFCA" with Table 1's numbers and its concept map. FedRC scored hard
    is a variant: marked, no paper numbers, and its ω (the soft run's) is not drawn twice."""
    from pipeline.outputs.report import concept_maps, find_manifest, group_runs, load_run

    root = tmp_path / "runs"
    shutil.copytree(runs_root, root)
    ifca = root / "ifca-s0"
    train_stage(make_config(**dict(FAST, data=str(tiny_data), algorithm="ifca"), out=str(ifca)))
    eval_stage(EvalConfig(run=str(ifca), hard=True))
    hard_fedrc = root / "fedrc-s0-hard"
    shutil.copytree(root / "fedrc-s0", hard_fedrc)
    eval_stage(EvalConfig(run=str(hard_fedrc), hard=True))
    out = tmp_path / "out"
    result = invoke(root, "--out", out)
    assert result.exit_code == 0, result.output
    with (out / "report.csv").open() as f:
        rows = {row["label"]: row for row in csv.DictReader(f)}
    assert "IFCA (hard)" not in rows
    paper = PAPER_TABLE1_FMNIST["IFCA"]
    assert (float(rows["IFCA"]["paper_local"]), float(rows["IFCA"]["paper_global"])) == (
        paper[0][0],
        paper[1][0],
    )
    assert rows["FedRC (hard)"]["paper_local"] == ""
    assert "| IFCA | 0 |" in (out / "report.md").read_text()

    runs = [load_run(p) for p in sorted(root.iterdir())]
    titles = [title for title, _ in concept_maps(group_runs(runs), find_manifest(runs[0]))]
    assert [t.split(",")[0] for t in titles] == ["IFCA", "FedEM", "FedRC"]
    concepts, _ = concept_maps(group_runs(runs), find_manifest(runs[0]))[0][1]
    assert all("(n=" in c for c in concepts)  # the clients behind each row
