"""`fedrc sweep`: the grid's points and names, one-line errors for bad grids, a sweep that keeps
its finished runs and resumes the stopped ones (killed with two workers), a point that is the
run alone, --replace, and the progress bar over the grid."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.common.errors import FedrcError
from pipeline.run.derived import state_digest
from pipeline.run.files import load_state
from pipeline.sweep.grid import grid_points, parse_axis, read_grid

runner = CliRunner()
PARAMS = """
partition: {dataset: synthetic, clients: 8, samples_per_client: 40, holdout_samples: 60}
train: {rounds: 2, local_epochs: 1, batch_size: 16, lr: 0.05, clusters: 2, device: cpu}
plot: {dpi: 40}
"""
GRID = ["--grid", "algorithm=fedavg,fedrc", "--grid", "seed=0,1"]


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(PARAMS)
    return tmp_path


@pytest.fixture
def benchmark(here: Path) -> Path:
    result = invoke("partition")
    assert result.exit_code == 0, result.output
    return here


def test_the_points_are_the_product_of_the_axes_named_by_what_varies() -> None:
    params = {"train": {"lr": 0.05}, "per_algorithm": {"fedrc": {"lr": 0.2}}}
    axes = [parse_axis(x) for x in ("algorithm=fedavg,fedrc", "seed=0,1", "fedrc.estep=em,adam")]
    points = grid_points(params, axes, Path("runs/g"))
    names = [p.name for p in points]
    assert names == [  # FedAvg has no E-step: trained once per seed, not twice
        "fedavg-s0",
        "fedavg-s1",
        "fedrc-estep=em-s0",
        "fedrc-estep=em-s1",
        "fedrc-estep=adam-s0",
        "fedrc-estep=adam-s1",
    ]
    by_name = {p.name: p.config for p in points}
    assert by_name["fedrc-estep=adam-s1"].algorithm_settings.estep == "adam"
    assert by_name["fedrc-estep=adam-s1"].seed == 1
    assert by_name["fedrc-estep=adam-s1"].out == "runs/g/fedrc-estep=adam-s1"
    assert by_name["fedavg-s0"].lr == 0.05 and by_name["fedrc-estep=em-s0"].lr == 0.2
    lrs = grid_points(params, [*axes, parse_axis("lr=0.01,0.1")], Path("g"))  # the grid wins
    assert {p.config.lr for p in lrs} == {0.01, 0.1} and "fedrc-estep=em-lr=0.01-s0" in {
        p.name for p in lrs
    }
    one = grid_points(params, [parse_axis("algorithm=ifca"), parse_axis("clusters=4")], Path("g"))
    assert [(p.name, p.config.clusters) for p in one] == [("ifca", 4)]


def test_the_sweep_section_and_the_command_line_make_one_grid() -> None:
    params = {
        "sweep": {"out": "runs/s", "grid": {"algorithm": ["fedavg", "ifca"], "seed": [0, 1, 2]}}
    }
    folder, points = read_grid(params, [], None)
    assert folder == Path("runs/s") and len(points) == 6
    folder, points = read_grid(params, ["seed=7", "lr=0.01,0.1"], "elsewhere")
    assert folder == Path("elsewhere")
    assert [p.name for p in points][:2] == ["fedavg-lr=0.01", "fedavg-lr=0.1"]
    assert {p.config.seed for p in points} == {7}


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--grid", "lr"], "Error: --grid lr: expected KEY=V1,V2,…"),
        (["--grid", "lr="], "Error: --grid lr=: expected values separated by commas"),
        (["--grid", "seed=0,1,0"], "Error: --grid seed: 0 given twice"),
        (["--grid", "lr=fast"], "Error: --grid lr: expected a number, got 'fast'"),
        (["--grid", "lrr=0.1"], "Error: --grid lrr: neither a train option"),
        (["--grid", "out=x"], "Error: --grid out: a sweep names each point's folder"),
        (["--grid", "algorithm=fedavg,nosuch"], "Error: --grid algorithm: unknown algorithm"),
        (["--grid", "fedrc.estep=em,bogus"], "Error: sweep point fedrc-estep=bogus: "),
        (["--grid", "lr=0.1", "--grid", "lr=0.2"], "Error: --grid lr: given twice"),
        (["--grid", "clusters=0,2"], "Error: sweep point fedrc-clusters=0: train.clusters:"),
        (["--jobs", "0"], "Error: --jobs: expected an integer >= 1, got 0"),
    ],
)
def test_a_bad_grid_is_one_line_and_writes_nothing(here: Path, args: list[str], line: str) -> None:
    result = invoke("sweep", *args, "--out", "runs/g")
    assert result.exit_code == 2, result.output
    assert result.output.strip().startswith(line) and len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in here.iterdir()) == ["params.yaml"]


def test_a_bad_sweep_section_is_one_line(here: Path) -> None:
    (here / "params.yaml").write_text(PARAMS + "sweep: {grid: {seed: []}}\n")
    result = invoke("sweep")
    assert result.exit_code == 2 and "Error: sweep.grid.seed: expected a value" in result.output
    (here / "params.yaml").write_text(PARAMS + "sweep: {gird: {seed: [0]}}\n")
    result = invoke("check")
    assert result.exit_code == 2 and "Error: sweep.gird: unknown key" in result.output


def test_a_sweep_without_a_benchmark_says_so(here: Path) -> None:
    result = invoke("sweep", *GRID, "--out", "runs/g")
    assert result.exit_code == 2 and "run `fedrc partition` first" in result.output
    assert not (here / "runs").exists()


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_sweep_is_ordinary_runs_kept_when_run_again_and_replaced_on_request(
    benchmark: Path,
) -> None:
    result = invoke("sweep", *GRID, "--out", "runs/g")
    assert result.exit_code == 0, result.output
    assert "Done: 4 runs in runs/g (4 ran now, 0 kept as they were)" in result.output
    names = sorted(p.name for p in (benchmark / "runs/g").iterdir() if p.is_dir())
    assert names == ["fedavg-s0", "fedavg-s1", "fedrc-s0", "fedrc-s1"]
    for name in names:
        run = benchmark / "runs/g" / name
        assert {"model.pt", "eval.json", "metrics.jsonl", "config.json"} <= set(files(run))
        assert (run / "plots" / "accuracy.png").is_file()
    report = invoke("report", "runs/g", "--out", "report")
    assert report.exit_code == 0, report.output
    rows = (benchmark / "report" / "report.csv").read_text()
    assert "fedavg" in rows and "fedrc" in rows and "0 1" in rows

    before = files(benchmark / "runs/g")
    again = invoke("sweep", *GRID, "--out", "runs/g")
    assert again.exit_code == 0 and "(0 ran now, 4 kept as they were)" in again.output
    assert files(benchmark / "runs/g") == before  # nothing trained, nothing rewritten

    (benchmark / "params.yaml").write_text(PARAMS.replace("lr: 0.05", "lr: 0.07"))
    changed = invoke("sweep", *GRID, "--out", "runs/g")
    assert changed.exit_code == 2, changed.output
    assert "4 point(s) hold a run of other settings or code" in changed.output
    assert files(benchmark / "runs/g") == before
    replaced = invoke("sweep", *GRID, "--out", "runs/g", "--replace", "--no-plots")
    assert replaced.exit_code == 0 and "(4 ran now" in replaced.output, replaced.output
    config = json.loads((benchmark / "runs/g/fedrc-s1/config.json").read_text())
    assert config["lr"] == 0.07 and not (benchmark / "runs/g/fedrc-s1/plots").exists()

    pruned = invoke("sweep", "--grid", "algorithm=fedrc", "--out", "runs/g", "--replace")
    assert pruned.exit_code == 0, pruned.output
    assert sorted(p.name for p in (benchmark / "runs/g").iterdir()) == ["fedrc", "sweep.json"]


def test_a_point_is_the_run_alone(benchmark: Path) -> None:
    """A point's folder holds the numbers `fedrc train` gives for its settings alone."""
    result = invoke("sweep", "--grid", "algorithm=ifca", "--grid", "seed=0,3", "--no-plots")
    assert result.exit_code == 0, result.output
    alone = invoke("train", "--algorithm", "ifca", "--seed", "3", "--out", "runs/alone")
    assert alone.exit_code == 0, alone.output
    point, run = benchmark / "runs/sweep/ifca-s3", benchmark / "runs/alone"
    assert state_digest(load_state(point / "model.pt")) == state_digest(
        load_state(run / "model.pt")
    )

    def rows(folder: Path) -> list[dict]:
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in lines]

    assert rows(point) == rows(run)


PLUGIN = """
from dataclasses import dataclass
from pipeline.algorithms.fedavg import FedAvg
from pipeline.plugin import Settings, setting

@dataclass(frozen=True)
class Own(Settings):
    beta: float = setting(0.9, "a default to edit")

class MyAlgo(FedAvg):
    Settings = Own
"""


def test_an_edited_plugin_changes_its_points_and_their_resolved_code(benchmark: Path) -> None:
    """Each point is keyed by its code: a plugin's default edited makes its runs changed (the
    sweep retrains them with --replace only) and changes resolved/sweep.json's digest."""
    plugin = benchmark / "myalgo.py"
    plugin.write_text(PLUGIN)
    grid = "sweep: {out: runs/p, grid: {algorithm: ['myalgo:MyAlgo', fedavg]}}\n"
    (benchmark / "params.yaml").write_text(PARAMS + grid)
    assert invoke("sweep", "--no-plots").exit_code == 0
    assert invoke("check", "--out", "resolved").exit_code == 0
    resolved = benchmark / "resolved" / "sweep.json"
    before = json.loads(resolved.read_text())["points"]
    assert (
        set(before) == {"myalgo_MyAlgo", "fedavg"} and "myalgo" in before["myalgo_MyAlgo"]["code"]
    )

    plugin.write_text(PLUGIN.replace("0.9", "0.5"))
    sys.modules.pop("myalgo", None)  # as a new process would, import the edited file
    assert invoke("check", "--out", "resolved").exit_code == 0
    after = json.loads(resolved.read_text())["points"]
    assert after["myalgo_MyAlgo"]["code"] != before["myalgo_MyAlgo"]["code"]
    assert after["fedavg"] == before["fedavg"]
    changed = invoke("sweep", "--no-plots")
    assert changed.exit_code == 2 and "(myalgo_MyAlgo)" in changed.output, changed.output
    replaced = invoke("sweep", "--no-plots", "--replace")
    assert replaced.exit_code == 0 and "(1 ran now, 1 kept as they were)" in replaced.output
    config = json.loads((benchmark / "runs/p/myalgo_MyAlgo/config.json").read_text())
    assert config["settings"]["myalgo:MyAlgo"]["beta"] == 0.5
    sys.modules.pop("myalgo", None)


def test_progress_over_the_grid_counts_rounds_runs_and_the_time_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    from rich.console import Console

    from fedrc_cli import sweep_progress
    from pipeline.run.resolve import make_config
    from pipeline.sweep.grid import Point
    from pipeline.sweep.plan import Step
    from pipeline.sweep.runner import Event

    def step(name: str, train: bool) -> Step:
        point = Point(name, make_config(algorithm="fedavg", rounds=10, out=f"/x/{name}"), {})
        return Step(point, None, None, train=train)  # type: ignore[arg-type]

    now = [0.0]
    steps = [step("a", False), step("b", True), step("c", True)]
    tally = sweep_progress.Tally(steps, clock=lambda: now[0])
    assert (tally.total, tally.rounds, tally.left()) == (30, 10, None)
    tally.add(Event("b", "start"))
    now[0] = 40.0
    for round_ in (1, 2, 3, 4):
        tally.add(Event("b", "round", round_))
    assert tally.left() == pytest.approx(40.0 / 4 * 16)
    column = sweep_progress.LeftColumn(tally)
    assert column.render(None).plain == "0:02:40"  # type: ignore[arg-type]
    screen = Console(width=80, force_terminal=True, file=io.StringIO())
    monkeypatch.setattr(sweep_progress, "console", screen)
    progress, update = sweep_progress.show_on_terminal(tally)
    update(Event("b", "round", 5))
    (line,) = screen.render_lines(progress.get_renderable(), pad=False)
    text = "".join(segment.text for segment in line).rstrip()
    assert text.startswith("sweep") and len(text) <= 80, text
    assert "0/3 runs" in text and "0:02:" in text and "b 5" in text, text
    tally.add(Event("b", "done"))
    tally.add(Event("c", "start"))
    tally.add(Event("c", "failed", text="round 1: non-finite loss"))
    assert tally.finished == 1 and tally.failed == {"c": "round 1: non-finite loss"}


def test_a_sweep_killed_with_two_workers_goes_on_where_it_stopped(benchmark: Path) -> None:
    """3 algorithms × 3 seeds with --jobs 2, Ctrl-C once the first run is done: the same
    command then trains only what is left, resuming the stopped runs from their checkpoints,
    and no finished run is trained again."""
    args = [*("--grid", "algorithm=fedavg,ifca,fedrc", "--grid", "seed=0,1,2"), "--no-plots"]
    args += ["--grid", "rounds=8", "--jobs", "2", "--out", "runs/k"]
    command = [sys.executable, "-m", "fedrc_cli", "sweep", *args]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    process = subprocess.Popen(
        command, cwd=benchmark, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("fedavg-s0: done") or line.startswith("fedavg-s1: done"):
            break
    folder = benchmark / "runs/k"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(  # a run past its first checkpoint
        (p / "checkpoint.pt").is_file() and not (p / "model.pt").is_file()
        for p in folder.iterdir()
        if p.is_dir()
    ):
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    output = "".join(lines) + process.stdout.read()
    assert process.wait(timeout=120) == 130, output
    assert "interrupted;" in output and "the same command goes on" in output, output
    finished = [p for p in folder.iterdir() if (p / "eval.json").is_file()]
    assert finished and len(finished) < 9, output
    kept = {p.name: (p / "model.pt").stat().st_mtime_ns for p in finished}
    stopped = [p for p in folder.iterdir() if p.is_dir() and p not in finished]
    logged = {
        p.name: (p / "metrics.jsonl").read_text()
        for p in stopped
        if (p / "checkpoint.pt").is_file()
    }
    assert logged, output  # a run was stopped after a checkpoint

    again = subprocess.run(command, cwd=benchmark, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"({9 - len(finished)} ran now, {len(finished)} kept as they were)" in again.stdout
    started = {x.split(":")[0] for x in again.stdout.splitlines() if ": running" in x}
    assert not started & set(kept), again.stdout  # no finished run trained again
    for name, mtime in kept.items():
        assert (folder / name / "model.pt").stat().st_mtime_ns == mtime
    for name, rows in logged.items():  # resumed: the rounds before the checkpoint stay
        checkpoint_rows = rows.splitlines()[:1]
        assert (folder / name / "metrics.jsonl").read_text().splitlines()[:1] == checkpoint_rows
    assert all((folder / p / "eval.json").is_file() for p in started | set(kept))
    assert len([p for p in folder.iterdir() if (p / "eval.json").is_file()]) == 9


def test_resolved_sweep_points_carry_their_code(benchmark: Path) -> None:
    (benchmark / "params.yaml").write_text(
        PARAMS + "sweep: {out: runs/s, grid: {algorithm: [fedavg, ifca], seed: [0, 1]}}\n"
    )
    result = invoke("check", "--out", "resolved")
    assert result.exit_code == 0 and "4 runs → runs/s" in result.output, result.output
    resolved = json.loads((benchmark / "resolved/sweep.json").read_text())
    assert resolved["out"] == "runs/s" and next(iter(resolved["points"])) == "fedavg-s0"
    assert set(resolved["points"]["ifca-s1"]["code"]) == {"fedrc"}
    with pytest.raises(FedrcError, match=r"sweep\.grid\.clusters"):
        read_grid({"sweep": {"grid": {"clusters": ["x"]}}}, [], None)
