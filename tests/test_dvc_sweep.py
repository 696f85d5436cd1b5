"""A sweep as a DVC stage: the real experiments/static/dvc.yaml on tiny synthetic params in a
scratch Git repository. `dvc repro` makes an ordinary run folder per point and the report over
them; a seed added with `dvc exp run -S` trains only its own runs; a typo in the sweep section
stops the check and costs nothing."""

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HERE = "experiments/static"
pytestmark = pytest.mark.skipif(
    shutil.which("dvc", path=str(BIN)) is None and shutil.which("dvc") is None,
    reason="dvc is not installed",
)


def run(where: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(where),
        "DVC_NO_ANALYTICS": "1",
        "OMP_NUM_THREADS": "1",
        "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }  # fmt: skip
    return subprocess.run(args, cwd=where, env=env, capture_output=True, text=True)


def tiny_params(seeds: list[int]) -> str:
    params = yaml.safe_load((ROOT / HERE / "params.yaml").read_text())
    params["sweep"]["grid"] = {"algorithm": ["fedavg", "fedrc"], "seed": seeds}
    params["per_algorithm"] = {"fedavg": {}, "fedrc": {}}
    params["partition"].update(
        dataset="synthetic", clients=8, samples_per_client=40, holdout_samples=60, drift=None
    )
    params["partition"]["concepts"] = ["identity", "reverse"]
    params["train"].update(
        rounds=2, local_epochs=1, batch_size=16, clusters=2, device="cpu", eval_every=1
    )
    params["plot"]["dpi"] = 40
    return yaml.safe_dump(params, sort_keys=False)


@pytest.mark.slow  # 35 s; kept and resumed runs: test_sweep.py; DVC staging: test_dvc_pipeline
def test_a_sweep_stage_keeps_its_runs_and_trains_only_new_points(tmp_path: Path) -> None:
    target = tmp_path / HERE
    target.mkdir(parents=True)
    shutil.copy(ROOT / HERE / "dvc.yaml", target / "dvc.yaml")
    (target / "params.yaml").write_text(tiny_params([0, 1]))
    for item in ("pipeline", "fedrc_cli"):
        shutil.copytree(ROOT / item, tmp_path / item, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / ".gitignore").write_text("__pycache__/\n")
    for command in (("git", "init", "-q"), ("dvc", "init", "-q")):
        assert run(tmp_path, *command).returncode == 0
    assert run(tmp_path, "git", "add", "-A").returncode == 0
    assert run(tmp_path, "git", "commit", "-qm", "scratch").returncode == 0

    result = run(tmp_path, "dvc", "repro", f"{HERE}/dvc.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    runs = target / "runs"
    names = sorted(p.name for p in runs.iterdir() if p.is_dir())
    assert names == ["fedavg-s0", "fedavg-s1", "fedrc-s0", "fedrc-s1"]
    assert not (runs / "fedrc-s0" / "checkpoint.pt").exists()  # --drop-checkpoints
    with (target / "report" / "report.csv").open() as f:
        rows = {row["algorithm"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"fedavg", "fedrc"} and rows["fedrc"]["seeds"] == "0 1"
    kept = {name: (runs / name / "model.pt").read_bytes() for name in names}

    assert run(tmp_path, "git", "add", "-A").returncode == 0
    assert run(tmp_path, "git", "commit", "-qm", "the grid").returncode == 0
    more = run(tmp_path, "dvc", "exp", "run", f"{HERE}/dvc.yaml", "-n", "three-seeds",
               "-S", f"{HERE}/params.yaml:sweep.grid.seed=[0,1,2]")  # fmt: skip
    output = more.stdout + more.stderr
    assert more.returncode == 0, output
    started = {x.split(":")[0] for x in more.stdout.splitlines() if ": running" in x}
    assert started == {"fedavg-s2", "fedrc-s2"}, output
    assert all((runs / name / "model.pt").read_bytes() == kept[name] for name in names)
    with (target / "report" / "report.csv").open() as f:
        assert {row["seeds"] for row in csv.DictReader(f)} == {"0 1 2"}

    typo = (target / "params.yaml").read_text().replace("  grid:", "  gird:")
    (target / "params.yaml").write_text(typo)
    failed = run(tmp_path, "dvc", "repro", f"{HERE}/dvc.yaml")
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "Error: sweep.gird: unknown key" in output, output
    assert f"Running stage '{HERE}/dvc.yaml:sweep'" not in output
    assert len([p for p in runs.iterdir() if p.is_dir()]) == 6
    assert (target / "resolved" / "sweep.json").is_file()
