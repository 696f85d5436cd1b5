"""One writer per folder: a second `fedrc train`, `eval`, `plot` or `partition` that would write
where another fedrc is writing is one line naming the holder, exit 2, and touches nothing; a
lock left by a killed process is taken over silently; a normal exit leaves no lock file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import assert_one_line, snapshot, working_copy
from typer.testing import CliRunner

import pipeline.common.run_lock as run_lock
from fedrc_cli.app import app
from pipeline.common.errors import FedrcError
from pipeline.common.run_lock import LOCK, writer_lock
from pipeline.config import PartitionConfig
from pipeline.run import files as rf
from pipeline.run.resolve import make_config
from pipeline.stages import partition_stage, train_stage

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
PART = dict(dataset="synthetic", clients=6, samples_per_client=40, holdout_samples=30)
PART_ARGS = [x for k, v in PART.items() for x in (f"--{k.replace('_', '-')}", str(v))]
TRAIN = ["--data", "d", "--algorithm", "fedavg", "--local-epochs", "1", "--batch-size", "16"]
TRAIN += ["--lr", "0.05", "--device", "cpu"]
SECOND = {  # a second writer of `r` (or of the benchmark `d`), each of them refused
    "train --overwrite": ["train", *TRAIN, "--rounds", "2", "--out", "r", "--overwrite"],
    "train --resume": ["train", *TRAIN, "--rounds", "3", "--out", "r", "--resume"],
    "eval": ["eval", "--run", "r"],
    "plot": ["plot", "--run", "r", "--dpi", "30"],
    "partition": ["partition", *PART_ARGS, "--out", "d", "--overwrite"],
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """d: a tiny partition; r: a finished 2-round fedavg run on it."""
    root = tmp_path_factory.mktemp("world")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        partition_stage(PartitionConfig(**PART, out="d"))
        config = dict(rounds=2, local_epochs=1, batch_size=16, lr=0.05, device="cpu")
        train_stage(make_config(data="d", algorithm="fedavg", out="r", **config))
    return root


@pytest.fixture
def here(world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return working_copy(world, tmp_path, monkeypatch)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "400"}


HOLD = """
import sys
from pipeline.common.run_lock import writer_lock
with writer_lock(sys.argv[1], "--out", sys.argv[2], beside=sys.argv[3] == "beside"):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes stdin (or kills this process)
"""


def holder(root: Path, folder: str, command: str, beside: bool = False) -> subprocess.Popen:
    """Another process that takes `folder`'s lock, the way a running fedrc does."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, folder, command, "beside" if beside else "inside"],
        cwd=root,
        env=env(),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def refused(args: list[str], *culprits: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("Error:"), lines[0]
    for culprit in culprits:
        assert culprit in lines[0], (culprit, lines[0])
    return lines[0]


def locks(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(f"*{LOCK}"))


@pytest.mark.parametrize("second", SECOND)
def test_a_second_writer_is_one_line_naming_the_holder_and_touches_nothing(here, second):
    args = SECOND[second]
    target = "d" if args[0] == "partition" else "r"
    option = "--run" if args[0] in ("eval", "plot") else "--out"
    first = holder(here, target, "fedrc train", beside=args[0] == "partition")
    try:
        before = snapshot(here)
        line = refused(args, option)
        assert line.startswith(
            f"Error: {option}: {target} is being written by another fedrc (pid {first.pid}, "
            "fedrc train, since "
        ), line
        assert line.endswith("); wait for it or stop it"), line
        assert snapshot(here) == before  # the lock file (and its text) included
    finally:
        first.stdin.close()
        first.wait(timeout=30)
    assert first.returncode == 0 and locks(here) == []  # a normal exit removes the lock file


def test_a_second_report_into_one_folder_is_refused_and_a_killed_ones_files_removed(here):
    """`fedrc report` holds its --out like the others; the temporary files a killed report
    left there (and only those) are removed by the next one."""
    assert runner.invoke(app, ["eval", "--run", "r"]).exit_code == 0
    (here / "rep").mkdir()
    torn = [here / "rep" / f".{name}.tmp-k1ll3d00" for name in ("report.md", "report.png")]
    for path in torn:
        path.write_text("half")
    (here / "rep" / ".notes.md.tmp-mine").write_text("a user's own file")
    first = holder(here, "rep", "fedrc report")
    try:
        before = snapshot(here)
        line = refused(["report", "r", "--out", "rep"], "--out: rep", f"pid {first.pid}")
        assert "fedrc report" in line, line
        assert snapshot(here) == before
    finally:
        first.stdin.close()
        first.wait(timeout=30)
    result = runner.invoke(app, ["report", "r", "--out", "rep"])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (here / "rep").iterdir())
    assert names == [
        ".notes.md.tmp-mine", "curves.png", "report.csv", "report.md", "report.png", "report.tex"
    ], names  # fmt: skip
    assert locks(here) == []


def test_two_trainings_into_one_folder_the_second_is_refused(here: Path) -> None:
    """The first `fedrc train` keeps writing and ends as if it had been alone."""
    metrics = here / "two" / rf.METRICS
    args = ["train", *TRAIN, "--rounds", "60", "--out", "two"]
    first = subprocess.Popen(
        [sys.executable, "-m", "fedrc_cli", *args],
        cwd=here,
        env=env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.02)
    assert json.loads((here / "two" / LOCK).read_text())["pid"] == first.pid
    line = refused([*args, "--overwrite"], "--out: two", f"pid {first.pid}", "fedrc train")
    assert first.poll() is None, "the first run ended before the second was refused"
    refused(["eval", "--run", "two"], "--run: two", f"pid {first.pid}", "fedrc train")
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert [r["round"] for r in rf.read_metrics(metrics)] == list(range(1, 61)), line
    assert rf.load_state(here / "two" / rf.MODEL)["round"] == 60
    assert locks(here) == []


@pytest.mark.parametrize("how", ["kill -9", "no flock"])
def test_a_lock_left_by_a_killed_process_is_taken_over(here: Path, monkeypatch, how) -> None:
    if how == "no flock":  # the exclusive-file fallback: a lock file whose pid is gone
        monkeypatch.setattr(run_lock, "fcntl", None)
    first = holder(here, "r", "fedrc train")
    pid = first.pid
    first.kill()
    first.wait(timeout=30)
    if how == "no flock":  # the holder used flock; what a fallback holder would have left
        (here / "r" / LOCK).write_text(json.dumps({"pid": pid, "command": "fedrc train"}))
    assert (here / "r" / LOCK).exists()  # SIGKILL: no clean-up ran
    result = runner.invoke(app, ["eval", "--run", "r"])
    assert result.exit_code == 0, result.output
    assert (here / "r" / "eval.json").exists() and locks(here) == []
    result = runner.invoke(app, SECOND["train --overwrite"])
    assert result.exit_code == 0, result.output
    assert locks(here) == []


def test_a_stale_lock_beside_a_benchmark_is_taken_over(here: Path) -> None:
    first = holder(here, "d", "fedrc partition", beside=True)
    first.kill()
    first.wait(timeout=30)
    assert (here / f".d{LOCK}").exists()
    result = runner.invoke(app, SECOND["partition"])
    assert result.exit_code == 0, result.output
    assert locks(here) == []


def test_without_flock_a_live_holder_still_refuses(here: Path, monkeypatch) -> None:
    monkeypatch.setattr(run_lock, "fcntl", None)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        text = json.dumps(
            {"pid": alive.pid, "command": "fedrc plot", "since": "2020-01-02T03:04:05"}
        )
        (here / "r" / LOCK).write_text(text)
        before = snapshot(here)
        line = refused(SECOND["eval"], "--run: r", f"pid {alive.pid}", "fedrc plot")
        assert "since 2020-01-02 03:04:05" in line
        assert snapshot(here) == before
    finally:
        alive.kill()
        alive.wait()
    with writer_lock(here / "x", "--out", "fedrc train"):  # no fcntl: the file is the lock
        assert json.loads((here / "x" / LOCK).read_text())["pid"] == os.getpid()
        busy = rf"--out: .*x is being written .*pid {os.getpid()}"
        with pytest.raises(FedrcError, match=busy), writer_lock(here / "x", "--out", "train"):
            pass
    assert not (here / "x").exists()  # made for the lock, empty again: removed


def test_a_file_system_without_flock_falls_back(here: Path, monkeypatch) -> None:
    import errno

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    result = runner.invoke(app, ["eval", "--run", "r"])
    assert result.exit_code == 0, result.output
    assert locks(here) == []


def test_the_lock_is_not_a_run_and_one_writer_nests_nothing(here: Path) -> None:
    (here / "new").mkdir()
    (here / "new" / LOCK).write_text("")  # left by a killed fedrc before it wrote its text
    result = runner.invoke(app, ["train", *TRAIN, "--rounds", "1", "--out", "new"])
    assert result.exit_code == 0, result.output  # not "already holds a run"
    assert locks(here) == []
    # one process, two writers of one folder: the second is refused too
    config = make_config(data="d", algorithm="fedavg", out="r", rounds=1, device="cpu")
    busy = f"pid {os.getpid()}, fedrc train"
    with writer_lock("r", "--out", "fedrc train"), pytest.raises(FedrcError, match=busy):
        train_stage(config)
    assert locks(here) == []


def test_a_refused_command_leaves_no_folder_behind(here: Path) -> None:
    before = snapshot(here)
    refused(["train", *TRAIN, "--out", "deep/new", "--resume"], "--resume")
    refused(["train", "--data", "nowhere", "--out", "deep/er"], "manifest.json")
    assert snapshot(here) == before  # the folders made for the lock are gone again


def test_under_torchrun_every_rank_gets_the_one_line(here: Path) -> None:
    """Rank 0 alone takes the lock; rank 1 gets the same error, no rank waits forever."""
    first = holder(here, "r", "fedrc train")
    try:
        before = snapshot(here)
        run_env = env()
        for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            run_env.pop(name, None)
        command = [
            *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
            *("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"),
            *("-m", "fedrc_cli", *SECOND["train --overwrite"]),
        ]
        done = subprocess.run(
            command, cwd=here, env=run_env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode != 0, done.stderr[-3000:]
        # both ranks exit 2 (torchrun's own report of that is a traceback of the launcher's)
        assert done.stderr.count("exitcode  : 2") == 2, done.stderr[-3000:]
        for package in (
            "pipeline",
            "fedrc_cli",
        ):  # no traceback from fedrc (the venv may be in ROOT)
            assert f'File "{ROOT / package}' not in done.stderr, done.stderr[-3000:]
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
        assert errors == [
            f"Error: --out: r is being written by another fedrc (pid {first.pid}, fedrc train, "
            + errors[0].split("fedrc train, ")[1]
        ], done.stderr[-3000:]
        assert snapshot(here) == before
    finally:
        first.stdin.close()
        first.wait(timeout=30)


def test_a_rank_leaving_with_the_agreed_error_keeps_its_exit_code_under_sigterm() -> None:
    """torchrun's agent SIGTERMs the ranks still running once one has exited; a rank already
    leaving with the error every rank agreed on must still exit 2 (the race behind the test
    above: rank 0 slower to exit than rank 1 reported 143 or 1 in place of 2)."""
    script = (
        "import os, signal, sys\n"
        "from pipeline.places.distributed import leaving_with_error\n"
        "leaving_with_error()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "sys.exit(2)\n"
    )
    launched = {**env(), "WORLD_SIZE": "2", "RANK": "0"}
    done = subprocess.run([sys.executable, "-c", script], env=launched, cwd=ROOT, timeout=60)
    assert done.returncode == 2
    alone = {k: v for k, v in launched.items() if k not in ("WORLD_SIZE", "RANK")}
    done = subprocess.run([sys.executable, "-c", script], env=alone, cwd=ROOT, timeout=60)
    assert done.returncode == -signal.SIGTERM  # without torchrun nothing is ignored


def test_eval_and_plot_during_a_training_are_refused_and_never_mix_its_rounds(here: Path):
    """A `--resume` that extends the run holds it: eval and plot are refused while it trains.
    Stopped midway, the run is unfinished (the extension removed model.pt at its first
    checkpoint): eval says so. A model.pt of round 2 beside a metrics.jsonl that runs past it
    (put back by hand) is refused too, rather than writing an eval.json whose best round comes
    from rounds the model it scored has not seen."""
    metrics = here / "r" / rf.METRICS
    finished = (here / "r" / rf.MODEL).read_bytes()
    args = ["train", *TRAIN, "--rounds", "500", "--out", "r", "--resume"]
    first = subprocess.Popen(
        [sys.executable, "-m", "fedrc_cli", *args],
        cwd=here,
        env=env(),
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 3):  # round 3 logged
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.02)
    try:
        refused(["eval", "--run", "r"], "--run: r", f"pid {first.pid}", "fedrc train")
        refused(["plot", "--run", "r", "--dpi", "30"], "--run: r", f"pid {first.pid}")
    finally:
        first.terminate()  # fedrc stops cleanly on SIGTERM: no torn metrics line
        first.communicate(timeout=60)
    assert first.returncode == 143 and locks(here) == []
    last = max(r["round"] for r in rf.read_metrics(metrics))
    assert not (here / "r" / rf.MODEL).exists()
    refused(
        ["eval", "--run", "r"],
        "r/model.pt: not found: the run stopped at a checkpoint",
        "fedrc train --resume",
    )
    (here / "r" / rf.MODEL).write_bytes(finished)
    assert rf.load_state(here / "r" / rf.MODEL)["round"] == 2
    before = snapshot(here)
    refused(
        ["eval", "--run", "r"],
        "r/model.pt: holds round 2, but r/metrics.jsonl runs to round ",
        "the run was extended and has not finished",
    )
    assert last > 2 and snapshot(here) == before


# ---- issue 40: the lock file is fedrc's own ------------------------------------------------


@pytest.mark.parametrize("command", ["eval", "plot", "train --resume"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(
    here: Path, command: str
) -> None:
    """`.fedrc.lock` a symbolic link to a user's file (or to nowhere): opened with O_NOFOLLOW,
    it is refused in one line; the user's file keeps its bytes."""
    Path("mine.txt").write_text("a user's file\n")
    (here / "r" / LOCK).symlink_to(here / "mine.txt")
    args = {"eval": ["eval", "--run", "r"], "plot": ["plot", "--run", "r", "--dpi", "30"]}
    args["train --resume"] = SECOND["train --resume"]
    result = runner.invoke(app, args[command])
    assert_one_line(result, f"r/{LOCK}", "symbolic link", code=2)
    assert Path("mine.txt").read_text() == "a user's file\n"
    assert (here / "r" / LOCK).is_symlink()


@pytest.mark.parametrize("what", ["folder", "dangling link"])
def test_a_lock_path_that_is_a_folder_or_a_dangling_link_is_one_line(here: Path, what: str) -> None:
    lock = here / "r" / LOCK
    if what == "folder":
        lock.mkdir()
    else:
        lock.symlink_to(here / "nowhere")
    line = assert_one_line(runner.invoke(app, ["eval", "--run", "r"]), f"r/{LOCK}", code=2)
    assert ("folder" in line) == (what == "folder") and not (here / "nowhere").exists()


def test_a_lock_that_cannot_be_opened_is_one_line(here: Path, monkeypatch) -> None:
    """Another user's lock file (mode 0600), or a folder the lock cannot be created in:
    EACCES from the open, named with the lock's path."""
    import errno

    real = os.open

    def denied(path, flags, *args):
        if str(path).endswith(LOCK):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *args)

    monkeypatch.setattr(run_lock.os, "open", denied)
    for args in (["eval", "--run", "r"], SECOND["partition"]):
        line = assert_one_line(runner.invoke(app, args), LOCK, "permission denied", code=2)
        assert "Traceback" not in line
