"""experiments/fmnist: the paper's reproduction pipeline, checked without training its 49 runs.

Fast: its stages, and every point of its two sweeps (each stage's `fedrc sweep` command parsed
by the CLI and resolved against experiments/fmnist/params.yaml) a valid configuration with the
paper's settings. Slow (`-m slow`): `dvc repro` of the whole pipeline on tiny synthetic params.
"""

import csv
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from fedrc_cli.app import app
from pipeline.algorithms import num_models
from pipeline.config import read_params
from pipeline.sweep.grid import Point, read_grid

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "fmnist"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    shutil.which("dvc", path=str(BIN)) is None and shutil.which("dvc") is None,
    reason="dvc is not installed",
)


def scratch_copy(tmp_path: Path, code: bool = False) -> Path:
    target = tmp_path / "experiments" / "fmnist"
    target.mkdir(parents=True)
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(EXPERIMENT / name, target / name)
    for item in ("pipeline", "fedrc_cli") if code else ():
        shutil.copytree(ROOT / item, tmp_path / item, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def dvc(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(tmp_path),
        "DVC_NO_ANALYTICS": "1",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(["dvc", *args], cwd=tmp_path, env=env, capture_output=True, text=True)


def sweep_points(command: str, params: dict) -> list[Point]:
    """The points `fedrc sweep ...` (a stage's cmd) would run, resolved against `params`."""
    args = shlex.split(command)
    assert args[:2] == ["fedrc", "sweep"], command
    group = typer.main.get_command(app)
    with group.make_context("fedrc", ["sweep"]) as parent:
        context = group.get_command(parent, "sweep").make_context("sweep", args[2:], parent=parent)
    out = context.params["out"]
    return read_grid(params, context.params["grid"] or [], None if out is None else str(out))[1]


def test_stages_and_commands_give_the_papers_runs(tmp_path: Path) -> None:
    scratch_copy(tmp_path)
    assert dvc(tmp_path, "init", "--no-scm", "-q").returncode == 0
    listed = dvc(tmp_path, "stage", "list", "experiments/fmnist/dvc.yaml", "--name-only")
    assert listed.returncode == 0, listed.stderr
    names = {line.split(":")[-1] for line in listed.stdout.split()}
    assert names == {"check", "partition", "lr_sweep", "lr_choice", "sweep", "report"}
    params = read_params(EXPERIMENT / "params.yaml")
    algorithms = ["fedavg", "ifca", "cfl", "fesem", "fedem", "fedrc", "fedsoft"]
    assert params["sweep"]["grid"] == {"algorithm": algorithms, "seed": [0, 1, 2]}

    partition = params["partition"]
    assert (partition["dataset"], partition["clients"], partition["samples_per_client"]) == (
        "fmnist",
        300,
        None,
    )
    assert partition["client_mix"] == "reference" and partition["seed"] == 0

    stages = yaml.safe_load((EXPERIMENT / "dvc.yaml").read_text())["stages"]
    points = sweep_points(stages["sweep"]["cmd"], params)
    assert [p.name for p in points] == [f"{a}-s{s}" for a in algorithms for s in (0, 1, 2)]
    grid = [0.01, 0.03, 0.06, 0.1]
    for point in points:
        config = point.config
        assert config.out == f"runs/{point.name}"
        assert config.lr == params["per_algorithm"][config.algorithm]["lr"] and config.lr in grid
        assert (config.rounds, config.local_epochs, config.batch_size) == (200, 1, 128)
        assert (config.momentum, config.participation, config.device) == (0.9, 1.0, "auto")
        assert config.profile == "reference" and config.weight_decay == 5e-4
        assert num_models(config) == (1 if config.algorithm == "fedavg" else 3)
    lr_points = sweep_points(stages["lr_sweep"]["cmd"], params)
    assert [(p.config.algorithm, p.config.lr) for p in lr_points] == [
        (a, lr) for a in algorithms for lr in grid
    ]
    assert {(p.config.seed, p.config.rounds) for p in lr_points} == {(0, 200)}
    assert lr_points[0].config.out == "lr_sweep/fedavg-lr=0.01"
    by_algorithm = {p.config.algorithm: p.config for p in points}
    assert by_algorithm["cfl"].algorithm_settings.max_clusters == 3
    assert by_algorithm["fedsoft"].algorithm_settings.mu > 0

    dag = dvc(tmp_path, "dag", "experiments/fmnist/dvc.yaml:report")
    assert dag.returncode == 0, dag.stderr
    assert "sweep" in dag.stdout and "lr_sweep" not in dag.stdout


@pytest.mark.slow
def test_tiny_reproduction_end_to_end(tmp_path: Path) -> None:
    """The real dvc.yaml on synthetic data: 2 algorithms × 2 seeds, then the report (minutes)."""
    target = scratch_copy(tmp_path, code=True)
    params = yaml.safe_load((target / "params.yaml").read_text())
    params["sweep"]["grid"].update(algorithm=["fedavg", "fedrc"], seed=[0, 1])
    params["partition"].update(
        dataset="synthetic", clients=10, samples_per_client=40, holdout_samples=100
    )
    params["train"].update(rounds=2, batch_size=16, clusters=2, device="cpu")
    (target / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert dvc(tmp_path, "init", "--no-scm", "-q").returncode == 0
    result = dvc(tmp_path, "repro", "experiments/fmnist/dvc.yaml:report")
    assert result.returncode == 0, result.stdout + result.stderr
    with (target / "report" / "report.csv").open() as f:
        rows = {row["algorithm"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"fedavg", "fedrc"} and rows["fedrc"]["seeds"] == "0 1"
    assert (target / "report" / "report.png").is_file()
    assert not (target / "runs" / "fedrc-s0" / "checkpoint.pt").exists()


@pytest.mark.parametrize("name", ["drift", "static"])
def test_the_comparison_pipelines_run_every_built_in(name: str) -> None:
    """experiments/drift and experiments/static compare every built-in algorithm: each point of
    the sweep stage resolves, with its per_algorithm row, into a valid configuration (no
    training: the runs take hours)."""
    from pipeline.algorithms import BUILT_IN

    folder = ROOT / "experiments" / name
    params = read_params(folder / "params.yaml")
    stages = yaml.safe_load((folder / "dvc.yaml").read_text())["stages"]
    grid = params["sweep"]["grid"]
    assert sorted(grid["algorithm"]) == sorted(BUILT_IN) and grid["seed"] == [0, 1, 2]
    assert sorted(params["per_algorithm"]) == sorted(BUILT_IN)
    drift = params["partition"].get("drift")
    assert drift == ("fedccfa-recurrent" if name == "drift" else None)
    points = sweep_points(stages["sweep"]["cmd"], params)
    assert len(points) == 3 * len(BUILT_IN)
    for point in points:
        config = point.config
        config.validate()
        assert point.name == f"{config.algorithm}-s{config.seed}" and config.rounds == 24
        for key, value in params["per_algorithm"][config.algorithm].items():
            where = config if hasattr(config, key) else config.algorithm_settings
            assert getattr(where, key) == value, (config.algorithm, key)
