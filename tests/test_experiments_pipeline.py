"""experiments/fmnist: the paper's reproduction pipeline, checked without training 94 stages.

Fast: every stage the matrix expands to, and every `fedrc train` command parsed by the CLI and
resolved against experiments/fmnist/params.yaml into a valid configuration with the paper's
settings. Slow (`-m slow`): `dvc repro` of the whole pipeline on tiny synthetic params.
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
from pipeline.config import TrainConfig, read_params
from pipeline.run import resolve
from pipeline.run.resolve import SHARED

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


def train_config(command: str, params: dict) -> TrainConfig:
    """What `fedrc train ...` (the part of a stage's cmd before &&) would run with."""
    args = shlex.split(command.split("&&")[0])
    assert args[:2] == ["fedrc", "train"], command
    group = typer.main.get_command(app)
    with group.make_context("fedrc", ["train"]) as parent:
        context = group.get_command(parent, "train").make_context("train", args[2:], parent=parent)
    given = {k: str(v) if isinstance(v, Path) else v for k, v in context.params.items()}
    options = {k: v for k, v in given.items() if k in SHARED}
    return resolve.train_config(params, options, given.get("set_") or [])


def test_stages_and_commands_give_the_papers_runs(tmp_path: Path) -> None:
    scratch_copy(tmp_path)
    assert dvc(tmp_path, "init", "--no-scm", "-q").returncode == 0
    listed = dvc(tmp_path, "stage", "list", "experiments/fmnist/dvc.yaml", "--name-only")
    assert listed.returncode == 0, listed.stderr
    names = {line.split(":")[-1] for line in listed.stdout.split()}
    params = read_params(EXPERIMENT / "params.yaml")
    algorithms, seeds, grid = params["algorithms"], params["seeds"], params["lr_grid"]
    assert algorithms == ["fedavg", "ifca", "cfl", "fesem", "fedem", "fedrc", "fedsoft"]
    assert seeds == [0, 1, 2] and grid == [0.01, 0.03, 0.06, 0.1]
    runs = {f"{a}-{s}" for a in algorithms for s in seeds}
    expected = {"partition", "lr_choice", "report"}
    expected |= {f"{stage}@{run}" for stage in ("train", "eval", "plot") for run in runs}
    expected |= {f"lr_sweep@{a}-{lr}" for a in algorithms for lr in grid}
    assert names == expected

    partition = params["partition"]
    assert (partition["dataset"], partition["clients"], partition["samples_per_client"]) == (
        "fmnist",
        300,
        None,
    )
    assert partition["client_mix"] == "reference" and partition["seed"] == 0

    stages = yaml.safe_load((EXPERIMENT / "dvc.yaml").read_text())["stages"]
    for algorithm in algorithms:
        for seed in seeds:
            command = stages["train"]["cmd"].replace("${item.algorithm}", algorithm)
            config = train_config(command.replace("${item.seed}", str(seed)), params)
            assert (config.algorithm, config.seed, config.out) == (
                algorithm,
                seed,
                f"runs/{algorithm}-s{seed}",
            )
            assert config.lr == params["per_algorithm"][algorithm]["lr"] and config.lr in grid
            assert (config.rounds, config.local_epochs, config.batch_size) == (200, 1, 128)
            assert (config.momentum, config.participation, config.device) == (0.9, 1.0, "auto")
            assert config.profile == "reference" and config.weight_decay == 5e-4
            assert num_models(config) == (1 if algorithm == "fedavg" else 3)
        for lr in grid:
            command = stages["lr_sweep"]["cmd"].replace("${item.algorithm}", algorithm)
            command = command.replace("${item.lr}", str(lr)).replace("${sweep.seed}", "0")
            config = train_config(command.replace("${sweep.rounds}", "200"), params)
            assert (config.algorithm, config.lr, config.seed) == (algorithm, lr, 0)
    cfl = train_config("fedrc train --algorithm cfl --out x", params)
    assert cfl.algorithm_settings.max_clusters == 3
    assert train_config("fedrc train --algorithm fedsoft --out x", params).algorithm_settings.mu > 0

    dag = dvc(tmp_path, "dag", "experiments/fmnist/dvc.yaml:report")
    assert dag.returncode == 0, dag.stderr
    assert all(f"eval@{run}" in dag.stdout for run in runs) and "lr_sweep" not in dag.stdout


@pytest.mark.slow
def test_tiny_reproduction_end_to_end(tmp_path: Path) -> None:
    """The real dvc.yaml on synthetic data: 2 algorithms × 2 seeds, then the report (minutes)."""
    target = scratch_copy(tmp_path, code=True)
    params = yaml.safe_load((target / "params.yaml").read_text())
    params.update(algorithms=["fedavg", "fedrc"], seeds=[0, 1])
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
    """experiments/drift and experiments/static compare every built-in algorithm: each train
    command of the matrix resolves, with its per_algorithm row, into a valid configuration
    (no training: the runs take hours)."""
    from pipeline.algorithms import BUILT_IN

    folder = ROOT / "experiments" / name
    params = read_params(folder / "params.yaml")
    stages = yaml.safe_load((folder / "dvc.yaml").read_text())["stages"]
    assert sorted(params["algorithms"]) == sorted(BUILT_IN) and params["seeds"] == [0, 1, 2]
    assert sorted(params["per_algorithm"]) == sorted(BUILT_IN)
    drift = params["partition"].get("drift")
    assert drift == ("fedccfa-recurrent" if name == "drift" else None)
    for algorithm in params["algorithms"]:
        command = stages["train"]["cmd"].replace("${item.algorithm}", algorithm)
        config = train_config(command.replace("${item.seed}", "2").split(" && ")[0], params)
        config.validate()
        assert (config.algorithm, config.seed, config.rounds) == (algorithm, 2, 24)
        for key, value in params["per_algorithm"][algorithm].items():
            where = config if hasattr(config, key) else config.algorithm_settings
            assert getattr(where, key) == value, (algorithm, key)
