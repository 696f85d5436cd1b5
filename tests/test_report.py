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
from pipeline.outputs.paper import PAPER_TABLE1_FMNIST
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
    """Sample std (ddof 1) over seeds; Table 1's numbers beside a synthetic benchmark only when
    asked (`--paper show`), with how the benchmark differs."""
    out = tmp_path / "out"
    result = invoke(runs_root, "--out", out, "--paper", "show")
    assert result.exit_code == 0, result.output
    assert "FedRC" in result.output and "FedEM" in result.output  # the rich table
    assert "dataset synthetic, not fmnist" in result.output
    assert "orientation only" in result.output

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
            assert float(row[f"{stem}_std"]) == pytest.approx(100 * np.std(values, ddof=1))
        for stem, key in (("purity", "concept_purity"), ("label_purity", "label_purity")):
            shares = [r[key] for r in results]
            assert float(row[f"{stem}_mean"]) == pytest.approx(np.mean(shares))
    paper = PAPER_TABLE1_FMNIST["FedRC"]
    assert (float(rows["fedrc"]["paper_local"]), float(rows["fedrc"]["paper_global"])) == (
        paper[0][0],
        paper[1][0],
    )

    markdown = (out / "report.md").read_text()
    main_table = markdown.split("## Spread over clients")[0]
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
            100 * np.std(values, ddof=1)
        )
    values = [curves["fedem", s][1] for s in SEEDS]
    assert float(rows["fedem"]["global_round1_mean"]) == pytest.approx(100 * np.mean(values))
    assert rows["fedem"]["global_round2_mean"] == ""
    progress = (out / "report.md").read_text().split("## Global accuracy at chosen rounds")[1]
    fedem = next(line for line in progress.splitlines() if line.startswith("| FedEM |"))
    assert fedem.endswith("| – |") and "| round 1 | round 2 |" in progress


def test_the_table_fits_80_columns(runs_root: Path, tmp_path: Path) -> None:
    """Every column whole at 80 columns (no "puri…"), with the paper's column and a CFL(3)-long
    name with a ★ and a hard-prediction label."""
    import io

    from rich.console import Console

    from fedrc_cli.report import summary_table
    from pipeline.outputs.report import build_report

    rows, _, _ = build_report([str(runs_root)], tmp_path / "out")
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
    from pipeline.outputs.figures import concept_maps
    from pipeline.outputs.groups import group_runs
    from pipeline.outputs.runs import find_manifest, load_run

    root = tmp_path / "runs"
    shutil.copytree(runs_root, root)
    ifca = root / "ifca-s0"
    train_stage(make_config(**dict(FAST, data=str(tiny_data), algorithm="ifca"), out=str(ifca)))
    eval_stage(EvalConfig(run=str(ifca), hard=True))
    hard_fedrc = root / "fedrc-s0-hard"
    shutil.copytree(root / "fedrc-s0", hard_fedrc)
    eval_stage(EvalConfig(run=str(hard_fedrc), hard=True))
    out = tmp_path / "out"
    result = invoke(root, "--out", out, "--paper", "show")
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
    assert "| IFCA | 1 |" in (out / "report.md").read_text()  # one seed

    runs = [load_run(p) for p in sorted(root.iterdir())]
    groups = group_runs(runs, list(PAPER_TABLE1_FMNIST))
    titles = [title for title, *_ in concept_maps(groups, find_manifest(runs[0]))]
    assert [t.split(",")[0] for t in titles] == ["IFCA", "FedEM", "FedRC"]
    concepts, _ = concept_maps(groups, find_manifest(runs[0]))[0][1]
    assert all("(n=" in c for c in concepts)  # the clients behind each row


def test_latex_beside_markdown_with_intervals_and_paired_tests(
    runs_root: Path, tmp_path: Path
) -> None:
    """report.tex is a booktabs table of mean ± 95 % CI; every other row is tested against the
    baseline, paired by seed, and the p-value in report.csv is scipy's paired t-test of those
    seeds' values."""
    from scipy import stats

    out = tmp_path / "out"
    result = invoke(runs_root, "--out", out, "--baseline", "fedem")
    assert result.exit_code == 0, result.output
    tex = (out / "report.tex").read_text()
    for part in ("\\toprule", "\\midrule", "\\bottomrule", "\\begin{tabular}", "$\\pm$"):
        assert part in tex, part
    assert "95\\,\\% confidence interval" in tex and "paired t-test against FedEM" in tex
    rows = read_csv(out / "report.csv")
    assert rows["fedem"]["baseline"] == "True" and rows["fedem"]["global_p"] == ""
    fedrc, fedem = (evals(runs_root, a) for a in ("fedrc", "fedem"))
    for stem, key in (("local", "local_accuracy"), ("final_global", "final_global_accuracy")):
        a = [100 * r[key] for r in fedrc]
        b = [100 * r[key] for r in fedem]
        expected = stats.ttest_rel(a, b).pvalue if len(set(np.subtract(a, b))) > 1 else None
        got = rows["fedrc"][f"{stem}_p"]
        assert (float(got) if got else None) == pytest.approx(expected), stem
        half = stats.t.ppf(0.975, 1) * np.std(a, ddof=1) / np.sqrt(2)
        assert float(rows["fedrc"][f"{stem}_ci_high"]) == pytest.approx(np.mean(a) + half)
    markdown = (out / "report.md").read_text()
    assert "| FedEM (baseline) |" in markdown and "paired t-test" in markdown
    assert "**" in markdown  # the best of each column in bold


def test_chosen_columns_and_rounds(runs_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ("--columns", "global,max_global,ari", "--at-rounds", "1,2")
    assert invoke(runs_root, "--out", out, *args).exit_code == 0
    markdown = (out / "report.md").read_text()
    main = next(line for line in markdown.splitlines() if line.startswith("| algorithm"))
    assert main == (
        "| algorithm | n | rounds | lr | global (best-train) | global (max, optimistic) | ARI |"
    )
    assert "| round 1 | round 2 |" in markdown
    tex = (out / "report.tex").read_text()
    assert "global (max, optimistic) & ARI" in tex and "local (last)" not in tex
    rows = read_csv(out / "report.csv")
    for algorithm in ALGORITHMS:
        ari = [r["concept_ari"] for r in evals(runs_root, algorithm)]
        assert float(rows[algorithm]["ari_mean"]) == pytest.approx(np.mean(ari))
        worst = [r["final_local_accuracy_worst10"] for r in evals(runs_root, algorithm)]
        assert float(rows[algorithm]["local_worst10_mean"]) == pytest.approx(100 * np.mean(worst))


def test_bad_report_options_are_one_line_and_write_nothing(runs_root: Path, tmp_path: Path):
    out = tmp_path / "out"
    for args, culprit in (
        (("--columns", "global,speed"), "--columns"),
        (("--baseline", "fedprox"), "--baseline"),
        (("--format", "png,gif"), "--format"),
        (("--test", "anova"), "--test"),
        (("--paper", "maybe"), "--paper"),
        (("--at-rounds", "0"), "--at-rounds"),
        (("--at-rounds", "ten"), "--at-rounds"),
        (("--font-size", "2"), "--font-size"),
        (("--width", "100"), "--width"),
    ):
        assert_one_line_error(invoke(runs_root, "--out", out, *args), culprit)
        assert not out.exists(), args


def test_a_run_given_twice_is_refused(runs_root: Path, tmp_path: Path) -> None:
    """Named by a folder and again by a glob, a run would count as two seeds."""
    out = tmp_path / "out"
    result = invoke(runs_root, f"{runs_root}/fedrc-s0", "--out", out)
    assert_one_line_error(result, "fedrc-s0", "given twice")
    assert not out.exists()


def test_a_copied_run_is_refused(runs_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    shutil.copytree(runs_root, root)
    shutil.copytree(root / "fedrc-s1", root / "fedrc-copy")
    assert_one_line_error(invoke(root, "--out", tmp_path / "out"), "same configuration and seed 1")


def test_one_seed_is_a_single_value(runs_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert invoke(f"{runs_root}/fedrc-s0", "--out", out).exit_code == 0
    row = next(line for line in (out / "report.md").read_text().splitlines() if "| FedRC |" in line)
    assert "±" not in row and "| 1 |" in row
    assert read_csv(out / "report.csv")["fedrc"]["global_std"] == ""  # no ± 0.00


def test_figures_in_every_format_and_size(runs_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ("--format", "png,pdf,svg", "--width", "3", "--height", "2", "--dpi", "100")
    result = invoke(runs_root, "--out", out, *args, "--font-size", "8")
    assert result.exit_code == 0, result.output
    for stem in ("report", "curves"):
        assert (out / f"{stem}.pdf").read_bytes().startswith(b"%PDF")
        assert b"<svg" in (out / f"{stem}.svg").read_bytes()[:2000]
    with Image.open(out / "curves.png") as image:
        assert image.size == (300, 200)  # 3 × 2 inches at 100 dpi
    assert "<text" in (out / "curves.svg").read_text()  # the words stay text


def test_the_curves_have_a_band_per_row_from_its_seeds(
    runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each row is a line of the mean over seeds with a band of ± one sample std, in the row's
    colour; rounds are whole numbers."""
    from pipeline.outputs.style import FigureStyle

    saved = {}

    def keep(self, fig, paths) -> None:  # the report writes under temporary names
        saved[paths[0].name.lstrip(".").split(".tmp")[0]] = fig

    monkeypatch.setattr(FigureStyle, "save", keep)
    assert invoke(runs_root, "--out", tmp_path / "out").exit_code == 0
    ax = saved["curves.png"].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"FedEM (n=2)", "FedRC (n=2)"}
    curves = {
        s: {
            r["round"]: 100 * r["global_accuracy"]
            for r in read_metrics(runs_root / f"fedrc-s{s}" / METRICS)
        }
        for s in SEEDS
    }
    y = lines["FedRC (n=2)"].get_ydata()
    assert list(y) == pytest.approx([np.mean([curves[s][r] for s in SEEDS]) for r in (1, 2)])
    bands = [c for c in ax.collections if len(c.get_paths()) > 0]
    assert len(bands) == 2
    assert all(float(t).is_integer() for t in ax.get_xticks())


def test_fedrc_ft_shows_fine_tuned_numbers_or_none(
    runs_root: Path, tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    """The FedRC-FT row's best-train and maximum cells are empty (those are the models before
    fine-tuning); its last-round cells are the fine-tuned scores, beside the paper's FT row."""
    root = tmp_path / "runs"
    shutil.copytree(runs_root, root)
    for seed in SEEDS:
        ft = root / f"fedrc-ft-s{seed}"
        shutil.copytree(root / f"fedrc-s{seed}", ft)
        eval_stage(EvalConfig(run=str(ft), finetune=True))
    out = tmp_path / "out"
    assert invoke(root, "--out", out, "--paper", "show").exit_code == 0
    with (out / "report.csv").open() as f:
        rows = {row["label"]: row for row in csv.DictReader(f)}
    ft = rows["FedRC-FT"]
    for stem in ("local", "global", "max_global", "train"):
        assert ft[f"{stem}_mean"] == "", stem
    tuned = [
        json.loads((root / f"fedrc-ft-s{s}" / "eval.json").read_text())["final_global_accuracy"]
        for s in SEEDS
    ]
    assert float(ft["final_global_mean"]) == pytest.approx(100 * np.mean(tuned))
    assert float(ft["paper_global"]) == PAPER_TABLE1_FMNIST["FedRC-FT"][1][0]
    assert ft["global_round1_mean"] == ""  # the logged curve is before fine-tuning
    line = next(x for x in (out / "report.md").read_text().splitlines() if "| FedRC-FT |" in x)
    assert line.split(" | ")[4:6] == ["–", "–"]  # local and global at the best-train round


def test_cost_and_spread_come_from_the_runs_own_files(runs_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert invoke(runs_root, "--out", out).exit_code == 0
    rows = read_csv(out / "report.csv")
    for algorithm in ALGORITHMS:
        logs = [read_metrics(runs_root / f"{algorithm}-s{s}" / METRICS) for s in SEEDS]
        per_run = [np.mean([r["bytes_down"] + r["bytes_up"] for r in log]) / 1e6 for log in logs]
        assert float(rows[algorithm]["megabytes_mean"]) == pytest.approx(np.mean(per_run))
        seconds = [np.mean([r["seconds"] for r in log]) for log in logs]
        assert float(rows[algorithm]["seconds_mean"]) == pytest.approx(np.mean(seconds))
        by_concept = [
            r["global_accuracy_by_concept"]["reverse"] for r in evals(runs_root, algorithm)
        ]
        assert float(rows[algorithm]["global_reverse_mean"]) == pytest.approx(
            100 * np.mean(by_concept)
        )
    markdown = (out / "report.md").read_text()
    assert "## Spread over clients, communication and time" in markdown
    assert "MB / round" in markdown and "## Global accuracy per concept" in markdown
