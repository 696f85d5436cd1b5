"""The real dvc.yaml on tiny synthetic params, in a scratch Git repository: `dvc repro`, clean
`dvc metrics show` / `dvc plots show`, a params.yaml typo that must cost nothing, and two
algorithms as DVC experiments in the same columns of `dvc exp show`."""

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_PARAMS = """
partition:
  dataset: synthetic
  clients: 10
  samples_per_client: 40
  holdout_samples: 100
  out: data/federated
train:
  algorithm: fedrc
  data: data/federated
  rounds: 2
  local_epochs: 1
  batch_size: 16
  clusters: 2
  lr: 0.05
  device: cpu
  out: runs/pipeline
eval:
  run: runs/pipeline
plot:
  run: runs/pipeline
  dpi: 50
"""
WARNINGS = ("failed", "warning", "error")
RUN = "runs/pipeline"
pytestmark = pytest.mark.skipif(
    shutil.which("dvc", path=str(Path(sys.executable).parent)) is None
    and shutil.which("dvc") is None,
    reason="dvc is not installed",
)


def test_params_survive_dvc_rewriting_them(tmp_path: Path) -> None:
    """`dvc exp run -S` loads params.yaml and writes it back: the file is written the way DVC
    writes it, so that only the line it sets changes."""
    from dvc.utils.hydra import apply_overrides

    original = (ROOT / "params.yaml").read_text().splitlines()
    for override, line in (("train.algorithm=fedavg", "  algorithm: fedavg"),
                           ("train.rounds=3", "  rounds: 3")):  # fmt: skip
        copy = tmp_path / "params.yaml"
        copy.write_text("\n".join(original) + "\n")
        apply_overrides(str(copy), [override])
        changed = copy.read_text().splitlines()
        assert len(changed) == len(original)
        assert [b for a, b in zip(original, changed) if a != b] == [line]


def run_files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("dvc")
    for item in ("dvc.yaml", "pipeline", "fedrc_cli", "experiments"):
        source = ROOT / item
        outputs = ("runs", "data", "report") if item == "experiments" else ()
        ignore = shutil.ignore_patterns("__pycache__", *outputs)
        if source.is_dir():
            shutil.copytree(source, tmp_path / item, ignore=ignore)
        else:
            shutil.copy(source, tmp_path / item)
    (tmp_path / "params.yaml").write_text(TINY_PARAMS.lstrip())
    (tmp_path / ".gitignore").write_text("__pycache__/\n")
    for command in (("git", "init", "-q"), ("dvc", "init", "-q")):
        assert run(tmp_path, *command).returncode == 0
    assert run(tmp_path, "git", "add", "-A").returncode == 0
    assert run(tmp_path, "git", "commit", "-qm", "scratch").returncode == 0
    result = run(tmp_path, "dvc", "repro")
    assert result.returncode == 0, result.stdout + result.stderr
    return tmp_path


def run(where: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(where),  # the copied code, not wherever fedrc is installed from
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }  # fmt: skip
    return subprocess.run(args, cwd=where, env=env, capture_output=True, text=True)


def test_a_params_typo_leaves_the_last_run_intact(scratch: Path) -> None:
    """`dvc repro` after a misspelt key: the check stage refuses it before DVC removes any
    output, and the trained run stays as it was, file for file."""
    before = run_files(scratch / RUN)
    assert {"model.pt", "checkpoint.pt", "metrics.jsonl", "config.json", "eval.json"} <= set(before)
    resolved = run_files(scratch / "resolved")
    params = (scratch / "params.yaml").read_text()
    (scratch / "params.yaml").write_text(params.replace("rounds: 2", "rouns: 3"))
    try:
        result = run(scratch, "dvc", "repro")
        output = result.stdout + result.stderr
        assert result.returncode != 0 and "Error: train.rouns: unknown key" in output, output
        assert "Running stage 'train'" not in output
        assert run_files(scratch / RUN) == before
        assert run_files(scratch / "resolved") == resolved  # the check's files, as they were
    finally:
        (scratch / "params.yaml").write_text(params)
    again = run(scratch, "dvc", "repro")
    assert again.returncode == 0 and "Running stage 'train'" not in again.stdout, again.stdout


@pytest.mark.parametrize(
    ("out", "line"),
    [  # caught by the check stage (DVC would fail on the path first), then by train itself
        ("notes.txt/run", "Error: train.out: notes.txt/run: notes.txt is a file, not a folder"),
        ("notes", "Error: --out: notes holds files that are not a fedrc run (todo.txt); "),
    ],
)
def test_a_bad_run_folder_under_dvc_repro_is_fedrcs_one_line(scratch: Path, out, line) -> None:
    """The run-folder promises hold under `dvc repro`: fedrc's line, the user's files and the
    last run untouched."""
    before = run_files(scratch / RUN)
    (scratch / "notes").mkdir(exist_ok=True)
    (scratch / "notes" / "todo.txt").write_text("mine\n")
    (scratch / "notes.txt").write_text("mine\n")
    params = (scratch / "params.yaml").read_text()
    (scratch / "params.yaml").write_text(params.replace(f"  out: {RUN}", f"  out: {out}"))
    try:
        result = run(scratch, "dvc", "repro")
        output = result.stdout + result.stderr
        assert result.returncode != 0, output
        errors = [x for x in output.splitlines() if x.startswith("Error:")]
        assert len(errors) == 1 and errors[0].startswith(line), output
        assert "Traceback" not in output and "Errno" not in output, output
        assert (scratch / "notes.txt").read_text() == "mine\n"
        assert [p.name for p in (scratch / "notes").iterdir()] == ["todo.txt"]
        assert run_files(scratch / RUN) == before
    finally:
        (scratch / "params.yaml").write_text(params)
        shutil.rmtree(scratch / "notes")
        (scratch / "notes.txt").unlink()
    again = run(scratch, "dvc", "repro")
    assert again.returncode == 0 and "Running stage 'train'" not in again.stdout, again.stdout


def test_dvc_repro_metrics_plots_and_an_experiment(scratch: Path) -> None:
    tmp_path = scratch
    metrics = json.loads((tmp_path / RUN / "eval.json").read_text())
    assert 0 <= metrics["global_accuracy"] <= 1
    assert (tmp_path / RUN / "plots/cluster_map.png").exists()
    live = json.loads((tmp_path / RUN / "dvclive/metrics.json").read_text())
    assert live["step"] == 2 and {"global", "best_global", "selected_global"} <= set(live)

    # the experiments' pipeline has never run here: neither command may mention it or warn
    for command in (("dvc", "metrics", "show"), ("dvc", "plots", "show")):
        shown = run(tmp_path, *command)
        output = shown.stdout + shown.stderr
        assert shown.returncode == 0 and not any(w in output.lower() for w in WARNINGS), output
        assert "experiments" not in output
    table = run(tmp_path, "dvc", "metrics", "show").stdout
    assert "selected_global" in table and max(map(len, table.splitlines())) <= 120

    again = run(tmp_path, "dvc", "repro")  # nothing changed: every stage is cached
    assert again.returncode == 0 and "didn't change" in again.stdout + again.stderr

    assert run(tmp_path, "git", "add", "-A").returncode == 0
    assert run(tmp_path, "git", "commit", "-qm", "baseline").returncode == 0
    params = (tmp_path / "params.yaml").read_text()
    # docs/experiments.md: FedRC's run as an experiment (from the run cache), then FedAvg
    for algorithm in ("fedrc", "fedavg"):
        experiment = run(tmp_path, "dvc", "exp", "run", "dvc.yaml", "-n", algorithm,
                         "-S", f"train.algorithm={algorithm}")  # fmt: skip
        output = experiment.stdout + experiment.stderr
        assert experiment.returncode == 0, output
        assert not any(w in output.lower() for w in WARNINGS), output
        assert ("Running stage 'train'" in output) == (algorithm == "fedavg"), output
        config = json.loads((tmp_path / RUN / "config.json").read_text())
        assert config["algorithm"] == algorithm and (tmp_path / RUN / "eval.json").exists()
        assert (tmp_path / RUN / "model.pt").exists() and (tmp_path / RUN / "plots").is_dir()
        changed = (tmp_path / "params.yaml").read_text()
        assert changed == params.replace("algorithm: fedrc", f"algorithm: {algorithm}")
    shown = run(tmp_path, "dvc", "exp", "show", "--no-pager", "--csv")
    assert shown.returncode == 0 and not any(w in shown.stderr.lower() for w in WARNINGS)
    assert "fedavg" in shown.stdout and "selected_global" in shown.stdout
    rows = list(csv.DictReader(io.StringIO(shown.stdout)))
    named = {row["Experiment"]: row for row in rows if row["Experiment"]}
    assert set(named) == {"fedrc", "fedavg"}
    for algorithm, row in named.items():  # one set of columns: every accuracy in each row
        assert row["train.algorithm"] == algorithm
        for column in ("train", "local", "global", "best_global", "selected_global"):
            assert 0 <= float(row[column]) <= 1, (algorithm, column, row[column])
    assert float(named["fedrc"]["selected_global"]) == live["selected_global"]


def set_params(where: Path, **train: object) -> None:
    """params.yaml: the tiny params with `train` values changed (and committed, so that `dvc
    exp run` starts from it)."""
    text = TINY_PARAMS.lstrip()
    for key, value in train.items():
        line = next(x for x in text.splitlines() if x.startswith(f"  {key}:"))
        text = text.replace(line, f"  {key}: {value}")
    (where / "params.yaml").write_text(text)


@pytest.mark.parametrize(
    ("change", "line"),
    [  # only running can show the first; the check stage stops the others before any stage
        ({"lr": 80}, "Error: round 1: evaluation: non-finite logits"),
        pytest.param(  # the memory refusal is also pinned outside DVC (test_run_folder.py)
            {"clusters": 200000000},
            "Error: --clusters: K = 200000000: the models",
            marks=pytest.mark.slow,
        ),
        ({"data": "data/elsewhere"}, "Error: train.data: data/elsewhere holds no benchmark"),
    ],
)
def test_a_stage_that_fails_keeps_the_last_good_run(scratch: Path, change, line) -> None:
    """A value that passes `fedrc check` and fails while training (lr 80 diverges) costs
    nothing: the outputs DVC removed before the stage ran are checked out again from its cache
    (run cache and `dvc exp` untouched); what can be known before running stops the check."""
    set_params(scratch)
    assert run(scratch, "dvc", "repro").returncode == 0
    before, data = run_files(scratch / RUN), run_files(scratch / "data/federated")
    set_params(scratch, **change)
    try:
        result = run(scratch, "dvc", "repro")
        output = result.stdout + result.stderr
        assert result.returncode != 0 and line in output, output
        assert "Traceback" not in output
        assert run_files(scratch / RUN) == before
        assert run_files(scratch / "data/federated") == data
        if "lr" not in change:
            assert "Running stage 'train'" not in output
    finally:
        set_params(scratch)
    assert "Running stage 'train'" not in run(scratch, "dvc", "repro").stdout


def test_a_partition_no_split_satisfies_stops_the_check(scratch: Path) -> None:
    set_params(scratch)
    assert run(scratch, "dvc", "repro").returncode == 0
    data = run_files(scratch / "data/federated")
    params = (scratch / "params.yaml").read_text()
    too_many = params.replace("samples_per_client: 40", "samples_per_client: 4000")
    (scratch / "params.yaml").write_text(too_many)
    try:
        result = run(scratch, "dvc", "repro")
        output = result.stdout + result.stderr
        assert result.returncode != 0 and "Error: --clients: 10 clients × 4000 samples" in output
        assert "Running stage 'partition'" not in output
        assert run_files(scratch / "data/federated") == data
        assert (scratch / "resolved" / "partition.json").is_file()  # the check's, as it was
    finally:
        set_params(scratch)


def test_an_interrupted_dvc_repro_resumes_from_its_checkpoint(scratch: Path) -> None:
    """SIGTERM during training: the last good run is back in runs/pipeline; the next `dvc
    repro` goes on from the checkpoint the stopped run left in .fedrc/runs/, not from round 1,
    and its numbers are those of a run never stopped."""
    set_params(scratch)
    assert run(scratch, "dvc", "repro").returncode == 0
    before = run_files(scratch / RUN)
    set_params(scratch, rounds=10)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(scratch), "DVC_NO_ANALYTICS": "1"}  # fmt: skip
    process = subprocess.Popen(
        ["dvc", "repro"], cwd=scratch, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith("round 3/10"):
            break
    os.killpg(process.pid, signal.SIGTERM)
    output = "".join(seen) + process.stdout.read()
    process.wait(timeout=120)
    assert "the next `dvc repro` resumes it" in output, output
    assert run_files(scratch / RUN) == before  # the last good run, as dvc.lock records it
    again = run(scratch, "dvc", "repro")
    assert again.returncode == 0, again.stdout + again.stderr
    rounds = [x for x in again.stdout.splitlines() if x.startswith("round ")]
    assert rounds and not rounds[0].startswith("round 1/") and rounds[-1].startswith("round 10/")
    resumed = [json.loads(x) for x in (scratch / RUN / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in resumed] == list(range(1, 11))
    assert not list((scratch / ".fedrc" / "runs").glob("*"))  # moved into --out when done
    alone = run(scratch, "fedrc", "train", "--out", "runs/alone")
    assert alone.returncode == 0, alone.stderr
    whole = (scratch / "runs/alone/metrics.jsonl").read_text().splitlines()
    no_time = [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in whole]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in resumed] == no_time
    shutil.rmtree(scratch / "runs/alone")
    set_params(scratch)


PLUGIN = """
from dataclasses import dataclass

from pipeline.algorithms.fedavg import FedAvg
from pipeline.plugin import Settings, setting


@dataclass(frozen=True)
class BetaSettings(Settings):
    beta: float = setting(0.9, "server momentum")


class FedAvgM(FedAvg):
    Settings = BetaSettings
"""


def test_an_edited_plugin_reruns_its_stage_under_dvc_exp_run(scratch: Path) -> None:
    """The tester's case: a plugin in the repository's root as train.algorithm; its default
    edited, the same `dvc exp run` trains again (it used to say "didn't change, skipping")."""
    set_params(scratch)
    (scratch / "fedavgm.py").write_text(PLUGIN)
    assert run(scratch, "git", "add", "-A").returncode == 0
    assert run(scratch, "git", "commit", "-qm", "a plugin").returncode == 0
    try:
        for name, beta in (("a", 0.9), ("b", 0.5)):
            (scratch / "fedavgm.py").write_text(PLUGIN.replace("0.9", str(beta)))
            result = run(scratch, "dvc", "exp", "run", "dvc.yaml", "-n", f"plugin-{name}",
                         "-S", "train.algorithm=fedavgm:FedAvgM")  # fmt: skip
            output = result.stdout + result.stderr
            assert result.returncode == 0, output
            assert "Running stage 'train'" in output
            assert "Stage 'train' didn't change, skipping" not in output
            config = json.loads((scratch / RUN / "config.json").read_text())
            assert config["settings"]["fedavgm:FedAvgM"]["beta"] == beta
    finally:
        (scratch / "fedavgm.py").unlink()
        set_params(scratch)
