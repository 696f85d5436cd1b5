"""fedrc on a real Flower deployment on 127.0.0.1: a SuperLink and three SuperNodes as
separate processes, runs started with `flwr run`. FedAvg and FedRC end with the models and
metrics of `fedrc train` (the torchrun test's tolerance), the run folder serves `fedrc eval` and
`fedrc plot`, a fedrc error fails the run with its one line (in the stream and in `flwr ls`),
and a SuperNode killed while it trains leaves a run that finishes without it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flower_runs import assert_same_run, fedrc, flower_config, node_configs, reference, write_app

from pipeline.flower.local import LocalDeployment
from pipeline.run.files import METRICS, read_metrics


@pytest.fixture(scope="module")
def deployment(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory):
    with LocalDeployment(tmp_path_factory.mktemp("flower"), node_configs(tiny_data)) as running:
        yield running


@pytest.mark.parametrize("algorithm", ["fedavg", "fedrc"])
def test_deployment_equals_fedrc_train(
    algorithm: str, deployment: LocalDeployment, tiny_data: Path, tmp_path: Path
) -> None:
    expected = reference(flower_config(tiny_data, algorithm, tmp_path / "single"))
    out = tmp_path / "flower"
    write_app(tmp_path / "app", tiny_data, out, algorithm, "--wait=60", "--timeout=120")
    done = deployment.run(tmp_path / "app", timeout=300)
    assert done.status == "finished:completed", done.output[-3000:] + deployment.logs()
    assert_same_run(expected, out)
    fedrc("eval", "--run", str(out))
    fedrc("plot", "--run", str(out))
    assert (out / "eval.json").is_file() and list((out / "plots").glob("*.png"))


def test_a_fedrc_error_fails_the_run_with_one_line(
    deployment: LocalDeployment, tiny_data: Path, tmp_path: Path
) -> None:
    write_app(tmp_path / "app", tiny_data, tmp_path / "flower", "fedavg")
    done = deployment.run(tmp_path / "app", config='fedrc-timeout="soon"', timeout=120)
    line = "fedrc: error: fedrc-timeout: expected a number of seconds, got 'soon'"
    assert done.status == "finished:failed" and line in done.details, done
    assert line in done.output  # streamed to `flwr run --stream`
    assert not (tmp_path / "flower").exists()


def test_killed_supernode_the_run_finishes_without_it(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "flower"
    write_app(tmp_path / "app", tiny_data, out, "fedavg", "--rounds=4", "--timeout=45")
    with LocalDeployment(tmp_path / "deployment", node_configs(tiny_data)) as deployment:
        before = set(deployment.runs())
        env = {**deployment.env, "FLWR_HOME": str(deployment.root / "cli")}
        command = [str(Path(sys.executable).parent / "flwr"), "run", str(tmp_path / "app")]
        run = subprocess.Popen(
            [*command, "local", "--stream"], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            log = deployment.root / "supernode2.log"
            deadline = time.monotonic() + 240
            while log.read_text().count("Receiving: train.") < 2:  # in round 2 (steps or fallback)
                assert time.monotonic() < deadline and run.poll() is None, deployment.logs()
                time.sleep(0.2)
            deployment.kill_node(2)
            output, _ = run.communicate(timeout=300)
        finally:
            run.kill()
        (status,) = [r["status"] for key, r in deployment.runs().items() if key not in before]
    assert status == "finished:completed", output[-3000:]
    rows = read_metrics(out / METRICS)
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    lost = set(map(int, node_configs(tiny_data)[2]["fedrc-clients"].split(",")))
    assert rows[-1]["clients_scored"] == 15 - len(lost)  # its clients are no longer scored
    assert "was lost during local training" in output
