"""`dvc repro` of the real dvc.yaml on tiny synthetic params, in a scratch copy of the repo."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_PARAMS = """
algorithms: [fedavg, fedrc]
partition: {dataset: synthetic, clients: 10, samples_per_client: 40, holdout_samples: 100,
            out: data/federated}
train: {data: data/federated, rounds: 2, local_epochs: 1, batch_size: 16, clusters: 2,
        lr: 0.05, device: cpu}
eval: {}
plot: {dpi: 50}
"""


@pytest.mark.skipif(
    shutil.which("dvc", path=str(Path(sys.executable).parent)) is None
    and shutil.which("dvc") is None,
    reason="dvc is not installed",
)
def test_dvc_repro_runs_every_stage(tmp_path: Path) -> None:
    for item in ("dvc.yaml", "pipeline", "fedrc_cli"):
        source = ROOT / item
        if source.is_dir():
            shutil.copytree(source, tmp_path / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tmp_path / item)
    (tmp_path / "params.yaml").write_text(TINY_PARAMS)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
    }
    run = lambda *a: subprocess.run(a, cwd=tmp_path, env=env, capture_output=True, text=True)  # noqa: E731
    assert run("dvc", "init", "--no-scm", "-q").returncode == 0
    result = run("dvc", "repro")
    assert result.returncode == 0, result.stdout + result.stderr
    for algorithm in ("fedavg", "fedrc"):
        metrics = json.loads((tmp_path / "runs" / algorithm / "eval.json").read_text())
        assert 0 <= metrics["global_accuracy"] <= 1
        assert (tmp_path / "runs" / algorithm / "plots" / "cluster_map.png").exists()
    shown = run("dvc", "metrics", "show")
    assert shown.returncode == 0 and "global_accuracy" in shown.stdout
    again = run("dvc", "repro")  # nothing changed: every stage is cached
    assert again.returncode == 0 and "didn't change" in again.stdout + again.stderr
