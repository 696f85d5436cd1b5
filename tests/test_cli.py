"""The CLI end to end on the synthetic dataset, its help, and its one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torchvision.datasets
from typer.testing import CliRunner

from fedrc_cli.app import app

ROOT = Path(__file__).resolve().parents[1]

runner = CliRunner()
TINY = [
    "--dataset",
    "synthetic",
    "--clients",
    "12",
    "--samples-per-client",
    "60",
    "--holdout-samples",
    "200",
]
FAST = [
    "--rounds",
    "2",
    "--local-epochs",
    "1",
    "--batch-size",
    "16",
    "--clusters",
    "2",
    "--lr",
    "0.05",
    "--device",
    "cpu",
]


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no params.yaml here: defaults + options only


@pytest.mark.parametrize("command", ["partition", "train", "eval", "plot"])
def test_help(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0 and "--params" in result.output


LAYERS = (
    "Later wins: built-in defaults < profile < params.yaml `train:` < "
    "`per_algorithm.<algorithm>` < command-line options < `--set`."
)


def test_train_help_and_the_docs_give_one_rule_and_the_sections() -> None:
    """Where a value comes from, in the same words in `fedrc train --help`, the settings page
    and pipeline.run.resolve; the help shows TrainConfig's sections as panels, the page as a
    table."""
    from pipeline.config import RESUMABLE, TrainConfig
    from pipeline.run import resolve

    result = invoke("train", "--help")
    assert result.exit_code == 0

    def flat(text: str) -> str:
        return " ".join(text.replace("> ", "").split())

    page = flat((ROOT / "docs" / "algorithms.md").read_text())
    for text in (flat(result.output), page, flat(resolve.__doc__)):
        assert LAYERS in text
    for title, names in TrainConfig.GROUPS.items():
        assert f"╭─ {title} ─" in result.output
        assert f"| {title} | " + ", ".join(f"`{n}`" for n in names) + " |" in page
    resume = page[page.index("`fedrc train --resume` does not use") :]
    assert all(f"`--{k.replace('_', '-')}`" in resume for k in RESUMABLE)


def test_top_level_help_lists_commands() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    assert all(c in result.output for c in ("partition", "train", "eval", "plot", "info", "sweep"))


def test_info_describes_a_benchmark_as_tables_and_json() -> None:
    assert invoke("info", "--help").exit_code == 0
    assert invoke("partition", *TINY, "--label-split", "n_class", "--out", "d").exit_code == 0
    tables = invoke("info", "d")
    assert tables.exit_code == 0 and "clients by style and concept" in tables.output
    described = json.loads(invoke("info", "d", "--json").output)
    assert described["participating"] == 12 and described["label_split"] == "n_class"
    assert described["label_heterogeneity"]["classes_per_client"]["max"] == 2
    missing = invoke("info", "nowhere")
    assert_one_line_error(missing, "manifest.json")
    assert "FOLDER: nowhere" in missing.output and "--data" not in missing.output  # its argument


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip().startswith("fedrc 0.")


def assert_one_line_error(result, culprit: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Error" in lines[0] and culprit in lines[0], result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (["partition", "--dataset", "imagenet"], "partition.dataset"),
        (["partition", *TINY, "--alpha", "0"], "partition.alpha"),
        (["partition", *TINY, "--alpha", "-2"], "partition.alpha"),
        (
            [
                "partition",
                "--dataset",
                "synthetic",
                "--clients",
                "500",
                "--samples-per-client",
                "50",
            ],
            "--clients",
        ),
        (["partition", *TINY, "--styles", "fog"], "partition.styles"),
        (["partition", *TINY, "--dataset", "svhn"], "partition.dataset"),
        (["partition", *TINY, "--replicate", "0"], "partition.replicate"),
        (["partition", *TINY, "--label-split", "shards"], "partition.label_split"),
        (["partition", *TINY, "--alpha-within", "0"], "partition.alpha_within"),
        (["partition", *TINY, "--classes-per-client", "11"], "partition.classes_per_client"),
        (["partition", *TINY, "--group-classes", "1"], "partition.group_classes"),
        (
            ["partition", *TINY, "--label-split", "cluster_dirichlet", "--label-groups", "13"],
            "partition.label_groups",
        ),
        (["partition", *TINY, "--shifts", "label,style"], "partition.shifts"),
        (["partition", *TINY, "--concepts", "identity,mirror"], "partition.concepts"),
        (["partition", *TINY, "--concepts", "shift,shift"], "partition.concepts"),
        (["partition", *TINY, "--client-mix", "lopsided"], "partition.client_mix"),
        (
            ["partition", *TINY, "--client-mix", "custom", "--client-shares", "0.5,0.2,0.2,0,0,0"],
            "partition.client_shares",
        ),
        (["partition", *TINY, "--client-shares", "0.5,0.5"], "partition.client_shares"),
        (
            ["partition", *TINY, "--client-mix", "custom", "--client-shares", "a,b"],
            "--client-shares",
        ),
        (
            [
                "partition",
                *TINY,
                "--label-split",
                "dirichlet",
                "--alpha",
                "0.01",
                "--min-samples",
                "59",
            ],
            "partition.min_samples",
        ),
        (["partition", *TINY, "--params", "missing.yaml"], "--params"),
        (["train", "--data", "nowhere"], "manifest.json"),
        (["train", "--algorithm", "fedfoo"], "train.algorithm"),
        (["train", "--participation", "1.5"], "train.participation"),
        (["eval", "--run", "nowhere"], "config.json"),
        (["plot", "--run", "nowhere"], "config.json"),
        (["plot", "--dpi", "1"], "plot.dpi"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(args: list[str], culprit: str) -> None:
    before = set(Path().rglob("*"))
    assert_one_line_error(invoke(*args), culprit)
    assert set(Path().rglob("*")) == before


def test_missing_dataset_is_named_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise OSError("offline")

    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", offline)
    result = invoke("partition", "--dataset", "cifar10", "--data-root", "raw/nothing", "--out", "d")
    assert_one_line_error(result, "--data-root: CIFAR-10 not found")
    assert list(Path().iterdir()) == []


def test_corrupt_and_missing_shards_are_named() -> None:
    assert invoke("partition", *TINY, "--out", "d").exit_code == 0
    shard = Path("d/shards/client-00003.parquet")
    shard.write_bytes(shard.read_bytes()[:100])
    assert_one_line_error(
        invoke("train", "--data", "d", *FAST, "--out", "r"), "client-00003.parquet"
    )
    shard.unlink()
    assert_one_line_error(invoke("train", "--data", "d", *FAST, "--out", "r"), "shard missing")
    assert not Path("r/model.pt").exists()


def test_pipeline_through_the_cli_and_resume() -> None:
    assert invoke("partition", *TINY, "--out", "d").exit_code == 0
    full = invoke(
        "train", "--data", "d", "--algorithm", "fedrc", *FAST, "--rounds", "3", "--out", "full"
    )
    assert full.exit_code == 0, full.output
    assert "round 3/3" in full.output  # plain lines when not on a terminal

    # a run stopped after 2 rounds and resumed to 3 ends exactly where the full run did
    assert (
        invoke("train", "--data", "d", "--algorithm", "fedrc", *FAST, "--out", "part").exit_code
        == 0
    )
    again = invoke("train", "--data", "d", "--algorithm", "fedrc", *FAST, "--out", "part")
    assert_one_line_error(again, "--resume")
    resumed = invoke(
        "train",
        "--data",
        "d",
        "--algorithm",
        "fedrc",
        *FAST,
        "--rounds",
        "3",
        "--out",
        "part",
        "--resume",
    )
    assert resumed.exit_code == 0, resumed.output
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    read = lambda p: [json.loads(x) for x in Path(p).read_text().splitlines()]  # noqa: E731
    assert strip(read("part/metrics.jsonl")) == strip(read("full/metrics.jsonl"))
    other = invoke(
        "train",
        "--data",
        "d",
        "--algorithm",
        "fedrc",
        *FAST,
        "--rounds",
        "3",
        "--lr",
        "0.01",
        "--out",
        "part",
        "--resume",
    )
    assert_one_line_error(other, "--lr: part was trained with 0.05, not 0.01")
    changed = invoke("train", "--out", "part", "--resume", "--set", "estep=adam")
    assert_one_line_error(changed, "--set fedrc.estep: part was trained with 'em', not 'adam'")

    # `--resume` alone continues with the run's saved configuration, as the stop message says
    args = ("--data", "d", "--algorithm", "fedrc", *FAST, "--out", "alone")
    assert invoke("train", *args).exit_code == 0
    alone = invoke("train", "--out", "alone", "--rounds", "3", "--resume")
    assert alone.exit_code == 0, alone.output
    assert strip(read("alone/metrics.jsonl")) == strip(read("full/metrics.jsonl"))

    result = invoke("eval", "--run", "full")
    assert result.exit_code == 0, result.output
    metrics = json.loads(Path("full/eval.json").read_text())
    for key in (
        "best_round",
        "local_accuracy",
        "global_accuracy",
        "final_local_accuracy",
        "final_global_accuracy",
        "max_global_accuracy",
        "concept_purity",
        "label_purity",
        "global_accuracy_by_concept",
    ):
        assert key in metrics
    last = read("full/metrics.jsonl")[-1]
    # eval re-scores model.pt; it must agree with what training logged for the last round
    assert metrics["final_global_accuracy"] == pytest.approx(last["global_accuracy"], abs=1e-6)
    assert metrics["final_local_accuracy"] == pytest.approx(last["local_accuracy"], abs=1e-6)
    assert set(metrics["global_accuracy_by_concept"]) == {"identity", "reverse", "shift"}
    hard = invoke("eval", "--run", "full", "--hard")
    assert hard.exit_code == 0
    assert json.loads(Path("full/eval.json").read_text())["prediction"] == "hard"

    assignments = pq.read_table("full/assignments.parquet")
    assert {"client_id", "round", "concept", "participating", "omega_0", "omega_1"} <= set(
        assignments.column_names
    )
    assert assignments.num_rows == 3 * 15  # 3 evaluated rounds × (12 + 3 held-out) clients

    result = invoke("plot", "--run", "full")
    assert result.exit_code == 0, result.output
    for name in ("cluster_map.png", "accuracy.png", "omega.png"):
        assert Path("full/plots", name).stat().st_size > 0


def test_params_file_drives_the_stage(tmp_path: Path) -> None:
    Path("p.yaml").write_text(
        "partition:\n  dataset: synthetic\n  clients: 9\n  samples_per_client: 40\n"
        "  holdout_samples: 50\n  out: fromfile\n"
    )
    assert invoke("partition", "--params", "p.yaml", "--clients", "10").exit_code == 0
    manifest = json.loads(Path("fromfile/manifest.json").read_text())
    assert manifest["num_participating"] == 10
    assert json.loads(Path("fromfile/config.json").read_text())["samples_per_client"] == 40


def test_partition_does_not_replace_a_benchmark_without_overwrite() -> None:
    assert invoke("partition", *TINY, "--out", "d").exit_code == 0
    before = (Path("d") / "manifest.json").read_bytes()
    refused = invoke("partition", *TINY, "--seed", "1", "--out", "d")
    assert_one_line_error(refused, "--overwrite")
    assert (Path("d") / "manifest.json").read_bytes() == before  # the benchmark is untouched
    assert invoke("partition", *TINY, "--seed", "1", "--out", "d", "--overwrite").exit_code == 0
    assert (Path("d") / "manifest.json").read_bytes() != before
    Path("other").mkdir()
    (Path("other") / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):  # a folder that is not a benchmark is never replaced
        assert_one_line_error(invoke("partition", *TINY, "--out", "other", *extra), "other")
    assert (Path("other") / "notes.txt").read_text() == "mine"


def test_help_shows_each_default_and_where_it_comes_from(tmp_path: Path) -> None:
    """One source of defaults: params.yaml's value where the file in the current folder sets
    it, else the built-in one, each labelled (read when the command starts)."""
    (tmp_path / "params.yaml").write_text("train: {rounds: 7}\npartition: {clients: 40}\n")
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}

    def help_of(command: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "fedrc_cli", command, "--help"],
            cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return " ".join(done.stdout.split())

    train = help_of("train")
    assert "[default: (7 from params.yaml)]" in train
    assert "[default: (0.1 built-in)]" in train  # --lr: not in this params.yaml
    assert "[default: (40 from params.yaml)]" in help_of("partition")


@pytest.mark.parametrize("name", ["fedrc K=3", "fesem-cam K=10"])
def test_progress_keeps_round_count_and_times_at_80_columns(name: str) -> None:
    import io
    import re

    from rich.console import Console

    from fedrc_cli.progress import compact, progress_bar

    screen = Console(width=80, force_terminal=True, file=io.StringIO())
    progress, task = progress_bar(name, 200, screen)
    row = {"train_loss": 2.308, "global_accuracy": 0.23, "local_accuracy": 0.38, "seconds": 12.3}
    progress.update(task, completed=17, latest=compact(row))
    (line,) = screen.render_lines(progress.get_renderable(), pad=False)
    text = "".join(segment.text for segment in line).rstrip()
    assert len(text) <= 80 and text.startswith(name)
    assert " 17/200 " in text and re.search(r" \d:\d\d:\d\d [-\d]:[-\d]{2}:[-\d]{2} ", text)
    assert "loss 2.308 glob 0.2" in text  # the metrics take what is left


def test_progress_estimates_the_time_left_from_the_first_round() -> None:
    """Rounds of 40 s, longer than rich's 30-s speed window: the time left shows after the
    first round (its own time × rounds left), counts down, then follows the mean round."""
    import io

    from rich.console import Console

    from fedrc_cli.progress import RoundClock, progress_bar, round_done

    now = [100.0]
    screen = Console(width=80, force_terminal=True, file=io.StringIO())
    progress, task = progress_bar("fedrc K=3", 20, screen, get_time=lambda: now[0])

    def shown() -> str:
        (line,) = screen.render_lines(progress.get_renderable(), pad=False)
        return "".join(segment.text for segment in line)

    assert "-:--:--" in shown()  # nothing to go by before the first round
    clock = RoundClock()
    row = {"train_loss": 2.3, "seconds": 40.0}
    now[0] += 45.0  # loading the data took 5 s: not a round's time
    round_done(progress, task, clock, {**row, "round": 1})
    assert " 1/20 " in shown() and " 0:12:40 " in shown()  # 19 rounds × 40 s
    now[0] += 10.0
    assert " 0:12:30 " in shown()  # counting down between rounds
    now[0] += 50.0  # round 2 took 60 s, checkpoint included
    round_done(progress, task, clock, {**row, "round": 2})
    assert " 0:18:00 " in shown()  # 18 rounds × 60 s
