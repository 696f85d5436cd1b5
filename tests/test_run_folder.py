"""A run folder is whole or restartable, and fedrc writes only into its own folders.

A failed extension of a finished run leaves it as it was; a run stopped before its first
checkpoint is started over; the temporary files of killed writes are removed by the next run
of the command that left them; `fedrc train` refuses a folder that is not a run. And the
smaller promises: folders get the user's umask, K above the number of clients is a warning,
a read-only file system is named as such, and a failed command leaves no empty folder.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import types
from pathlib import Path

import pytest
from conftest import assert_one_line, snapshot, working_copy
from typer.testing import CliRunner

import fedrc_cli.common as common
from fedrc_cli.app import app
from pipeline.common.errors import FedrcError
from pipeline.common.io import atomic_dir
from pipeline.config import EvalConfig, PartitionConfig, PlotConfig
from pipeline.run import files as rf
from pipeline.run.resolve import make_config
from pipeline.stages import eval_stage, partition_stage, plot_stage, train_stage

runner = CliRunner()
PART = dict(dataset="synthetic", clients=6, samples_per_client=40, holdout_samples=30)
PART_ARGS = [x for k, v in PART.items() for x in (f"--{k.replace('_', '-')}", str(v))]
TRAIN = ["--data", "d", "--algorithm", "fedrc", "--local-epochs", "1", "--batch-size", "16"]
TRAIN += ["--lr", "0.05", "--clusters", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """d: a tiny partition; r: a finished 2-round fedrc run on it, evaluated and plotted."""
    root = tmp_path_factory.mktemp("world")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        partition_stage(PartitionConfig(**PART, out="d"))
        settings = dict(rounds=2, local_epochs=1, batch_size=16, lr=0.05, clusters=2)
        train_stage(make_config(data="d", algorithm="fedrc", out="r", device="cpu", **settings))
        eval_stage(EvalConfig(run="r"))
        plot_stage(PlotConfig(run="r", dpi=30))
    return root


@pytest.fixture
def here(world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return working_copy(world, tmp_path, monkeypatch)


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def refused(result, *culprits: str, code: int = 2) -> str:
    """One error line naming every culprit, exit `code`, no traceback."""
    return assert_one_line(result, *culprits, code=code)


def run_files(root: Path) -> dict[str, str]:
    """The run folder r, less DVCLive's view of it (rewritten from metrics.jsonl)."""
    return {k: v for k, v in snapshot(root / "r").items() if not k.startswith("dvclive")}


# ---- 5: whole or restartable -------------------------------------------------------------------


def test_a_failed_extension_leaves_the_finished_run_whole(here: Path, monkeypatch) -> None:
    """`--resume --rounds 3` on a finished 2-round run, stopped in round 3: config.json, model.pt,
    metrics.jsonl and the rest are byte for byte as they were; the message says how to go on."""
    import pipeline.run.training as training

    real = training.train_round

    def ctrl_c_in_round_3(round_, *args):
        if round_ == 3:
            raise KeyboardInterrupt
        return real(round_, *args)

    before = run_files(here)
    monkeypatch.setattr(training, "train_round", ctrl_c_in_round_3)
    line = refused(invoke("train", *TRAIN, "--rounds", "3", "--out", "r", "--resume"), code=130)
    assert "last checkpoint: round 2" in line and "--resume --rounds 3" in line
    assert run_files(here) == before
    assert json.loads(Path("r/config.json").read_text())["rounds"] == 2

    monkeypatch.setattr(training, "train_round", real)
    result = invoke("train", *TRAIN, "--rounds", "3", "--out", "r", "--resume")
    assert result.exit_code == 0, result.output
    assert json.loads(Path("r/config.json").read_text())["rounds"] == 3
    assert rf.load_state(Path("r/model.pt"))["round"] == 3


@pytest.mark.parametrize(
    ("fault", "file"),
    [
        (errno.ENOSPC, "checkpoint.pt"),
        (errno.EFBIG, "checkpoint.pt"),
        (errno.ENOSPC, "config.json"),
    ],
)
def test_an_extension_that_cannot_write_its_checkpoint_leaves_the_run_whole(
    here: Path, monkeypatch, fault: int, file: str
) -> None:
    """A full disk or a file-size limit at the extension's first checkpoint (whichever of its
    files it hits): nothing the finished run holds was removed or rewritten, model.pt, eval.json
    and plots/ included; the same command later extends it."""
    real = Path.write_bytes if file.endswith(".pt") else Path.write_text

    def failing(self, data, *args, **kwargs):
        if self.name.startswith(f".{file}.tmp"):
            raise OSError(fault, os.strerror(fault))
        return real(self, data, *args, **kwargs)

    before = run_files(here)
    method = "write_bytes" if file.endswith(".pt") else "write_text"
    monkeypatch.setattr(Path, method, failing)
    result = invoke("train", *TRAIN, "--rounds", "3", "--out", "r", "--resume")
    refused(result, f"r/{file}", code=1 if fault == errno.ENOSPC else 2)
    assert run_files(here) == before
    monkeypatch.setattr(Path, method, real)
    result = invoke("train", *TRAIN, "--rounds", "3", "--out", "r", "--resume")
    assert result.exit_code == 0, result.output
    assert rf.load_state(Path("r/model.pt"))["round"] == 3
    assert [r["round"] for r in rf.read_metrics(Path("r/metrics.jsonl"))] == [1, 2, 3]


@pytest.mark.parametrize("renamed", [0, 1, 2, 3, 4])
def test_an_extension_killed_between_its_renames_is_resumable(
    here: Path, monkeypatch, renamed: int
) -> None:
    """A kill after any of the four renames of the extension's first checkpoint (metrics.jsonl,
    assignments.parquet, config.json, checkpoint.pt; 4: before model.pt goes): eval never scores
    a model.pt of fewer rounds than metrics.jsonl, and `--resume --rounds 3` finishes the run
    with the numbers of an extension that was never stopped."""
    import pipeline.run.log as log

    class Killed(BaseException):
        pass

    shutil.copytree("r", "clean")
    extend = [*TRAIN, "--rounds", "3", "--resume"]
    assert invoke("train", *extend, "--out", "clean").exit_code == 0
    real_files, real_replace, real_unlink = log.atomic_files, os.replace, Path.unlink
    state = {"active": False, "renames": 0}

    @contextlib.contextmanager
    def watched(*targets):
        with real_files(*targets) as tmps:
            yield tmps
            state["active"] = True  # the renames come next

    def replace(src, dst):
        if state["active"] and state["renames"] == renamed:
            raise Killed
        state["renames"] += state["active"]
        return real_replace(src, dst)

    def unlink(self, missing_ok=False):
        if state["active"] and self.name == rf.MODEL:
            raise Killed
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(log, "atomic_files", watched)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(Killed):
        runner.invoke(app, ["train", *extend, "--out", "r"], catch_exceptions=False)
    monkeypatch.setattr(log, "atomic_files", real_files)
    monkeypatch.setattr(os, "replace", real_replace)
    monkeypatch.setattr(Path, "unlink", real_unlink)
    scored = invoke("eval", "--run", "r")
    if renamed == 0:
        assert scored.exit_code == 0, scored.output  # still the finished 2-round run
    else:
        refused(scored, "r/model.pt", "has not finished")
    assert invoke("train", *extend, "--out", "r").exit_code == 0
    rows = [rf.read_metrics(Path(run, rf.METRICS)) for run in ("r", "clean")]
    for row in (*rows[0], *rows[1]):
        row.pop("seconds")
    assert rows[0] == rows[1] and rf.load_state(Path("r/model.pt"))["round"] == 3


@pytest.mark.parametrize("how", [[], ["--resume"]])
def test_a_run_stopped_before_its_first_checkpoint_starts_over(here: Path, how) -> None:
    """What a run killed in round 1 leaves (config.json, a torn metrics line, a momentum file
    being written): neither resumable nor worth keeping. The same command starts it over and
    says so in one line; nothing else needs --overwrite."""
    Path("k").mkdir()
    config = json.loads(Path("r/config.json").read_text())
    Path("k/config.json").write_text(json.dumps({**config, "out": "k", "rounds": 1}))
    Path("k/metrics.jsonl").write_text('{"round": 1, "train_lo')
    result = invoke("train", *TRAIN, "--rounds", "1", "--out", "k", *how)
    assert result.exit_code == 0, result.output
    lines = stderr_lines(result)
    assert len(lines) == 1 and lines[0].startswith("Warning: --out: k holds a run stopped"), lines
    assert "before its first checkpoint (config.json, metrics.jsonl); starting it over" in lines[0]
    assert [r["round"] for r in rf.read_metrics(Path("k/metrics.jsonl"))] == [1]
    assert rf.load_state(Path("k/model.pt"))["round"] == 1


def test_a_finished_run_still_needs_resume_or_overwrite(here: Path) -> None:
    before = snapshot(here)
    refused(invoke("train", *TRAIN, "--rounds", "2", "--out", "r"), "already holds a run")
    Path("r/checkpoint.pt").unlink()  # model.pt alone: finished, but not resumable
    refused(invoke("train", *TRAIN, "--out", "r", "--resume"), "--resume: no checkpoint in r")
    del before["r/checkpoint.pt"]
    assert snapshot(here) == before


def test_resuming_with_fewer_rounds_names_the_option(here: Path) -> None:
    """`--resume --rounds 1` on a finished 2-round run: the option is wrong, not the
    checkpoint (which is whole)."""
    before = snapshot(here)
    result = invoke("train", *TRAIN, "--rounds", "1", "--out", "r", "--resume")
    line = refused(result, "--rounds 1: the run in r already has 2 rounds", "--rounds 2 or more")
    assert "checkpoint.pt" not in line
    assert snapshot(here) == before


def test_a_run_terminated_before_its_first_checkpoint_says_how_to_go_on(
    here: Path, monkeypatch
) -> None:
    """The message says what the code does: the same command again starts the run over; and
    what the stopped run had written (config.json, DVCLive's files) is gone with it."""
    import pipeline.run.training as training

    real = training.train_round

    def terminated(*args):
        raise common.Terminated()

    args = ["train", *TRAIN, "--rounds", "2", "--checkpoint-every", "2", "--out", "t"]
    monkeypatch.setattr(training, "train_round", terminated)
    line = refused(invoke(*args), "terminated (SIGTERM) before the first round ended", code=143)
    assert line.endswith("no checkpoint yet: run the same command again to start it over"), line
    assert not Path("t").exists()  # nothing half-written: the folder it made is gone too
    monkeypatch.setattr(training, "train_round", real)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


LEFTOVERS = {  # what killed writes leave, by the command whose next run removes them
    "train": [
        "r/.checkpoint.pt.tmp-k1ll3d00",
        "r/.model.pt.tmp-k1ll3d01",
        "r/.config.json.tmp-k1ll3d02",
        "r/.metrics.jsonl.tmp-k1ll3d03",
        "r/.assignments.parquet.tmp-k1ll3d04",
        "r/.checkpoint-momentum-r2.npy.tmp-4242",
        "r/.momentum-rank0.npy",
    ],
    "eval": ["r/.eval.json.tmp-k1ll3d05", "r/.eval_clients.json.tmp-k1ll3d06"],
    "plot": ["r/.plots.tmp-k1ll3d07/", "r/.plots.old-4242/"],
    "partition": [".d.tmp-k1ll3d08/", ".d.old-4242/"],
}
COMMANDS = {
    "train": ["train", *TRAIN, "--rounds", "2", "--out", "r", "--resume"],
    "eval": ["eval", "--run", "r"],
    "plot": ["plot", "--run", "r", "--dpi", "30"],
    "partition": ["partition", *PART_ARGS, "--out", "d", "--overwrite"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_next_run_removes_the_leftovers_of_killed_writes(here: Path, command: str) -> None:
    for name in (n for names in LEFTOVERS.values() for n in names):
        if name.endswith("/"):
            Path(name).mkdir()
            (Path(name) / "half.parquet").write_bytes(b"PAR1")
        else:
            Path(name).write_bytes(b"half")
    Path(".d.keep").write_text("mine")  # a user's file beside the benchmark stays
    result = invoke(*COMMANDS[command])
    assert result.exit_code == 0, result.output
    for owner, names in LEFTOVERS.items():
        for name in names:
            assert Path(name).exists() != (owner == command), (command, name)
    assert Path(".d.keep").read_text() == "mine"


NOT_RUNS = {
    "benchmark": ("d", ["holds a fedrc benchmark (manifest.json), not a run"]),
    "own files": ("mine", ["holds files that are not a fedrc run (notes.txt)"]),
    "foreign config": ("conf", ["holds files that are not a fedrc run (config.json)"]),
}


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
@pytest.mark.parametrize("case", list(NOT_RUNS))
def test_train_refuses_a_folder_that_is_not_a_run(here: Path, case: str, overwrite) -> None:
    Path("mine").mkdir()
    Path("mine/notes.txt").write_text("my notes")
    Path("conf").mkdir()
    Path("conf/config.json").write_text('{"learning": "rate"}')
    out, culprits = NOT_RUNS[case]
    before = snapshot(here)
    result = invoke("train", *TRAIN, "--rounds", "1", "--out", out, *overwrite)
    refused(result, f"--out: {out} ", *culprits, "choose another --out")
    assert snapshot(here) == before


def test_a_run_folder_with_dvc_and_stage_outputs_is_a_run(here: Path) -> None:
    """What `dvc repro` leaves in a run folder after removing train's outputs (.gitignore,
    DVCLive's folder, eval's and plot's outputs) does not make it foreign; eval's and plot's
    outputs describe the run that is gone, so the new run removes them (their stages make
    them again)."""
    Path("r/.gitignore").write_text("/model.pt\n/checkpoint.pt\n")
    for path in rf.train_outputs(Path("r")):
        path.unlink()
    result = invoke("train", *TRAIN, "--rounds", "1", "--out", "r")
    assert result.exit_code == 0, result.output
    assert not Path("r/eval.json").exists() and not Path("r/plots").exists()
    assert Path("r/.gitignore").read_text() == "/model.pt\n/checkpoint.pt\n"
    assert stderr_lines(result) == []  # not "a run stopped before its first checkpoint"


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
@pytest.mark.parametrize("foreign", ["notes.txt", "shards/notes.txt", "shards/extra"])
def test_partition_keeps_files_it_did_not_write(here: Path, foreign: str, overwrite) -> None:
    """`partition --overwrite` replaces the whole benchmark folder: one holding a user's files
    (beside the manifest or among the shards) is refused, not emptied."""
    path = Path("d", foreign)
    if foreign.endswith("extra"):  # a folder of the user's among the shards
        path.mkdir()
    else:
        path.write_text("mine")
    before = snapshot(here)
    result = invoke("partition", *PART_ARGS, "--out", "d", *overwrite)
    refused(result, "--out: d holds a benchmark and files fedrc did not write", f"({foreign})")
    assert snapshot(here) == before


@pytest.mark.parametrize(
    ("out", "what"),
    [
        ("d", "d is a fedrc benchmark"),
        ("d/shards", "d/shards is inside "),
        ("r", "r is a fedrc run"),
        ("r/reports", "r/reports is inside "),
    ],
)
def test_report_refuses_a_benchmark_or_run_folder(here: Path, out: str, what: str) -> None:
    before = snapshot(here)
    refused(invoke("report", "r", "--out", out), f"--out: {what}", "a folder of its own")
    assert snapshot(here) == before


# ---- 6: the smaller ones -----------------------------------------------------------------------


def test_folders_get_the_users_umask(here: Path) -> None:
    previous = os.umask(0o022)
    try:
        partition_stage(PartitionConfig(**PART, out="u"))
        plot_stage(PlotConfig(run="r", dpi=30))
    finally:
        os.umask(previous)
    assert Path("u").stat().st_mode & 0o777 == 0o755
    assert Path("r/plots").stat().st_mode & 0o777 == 0o755


def test_more_clusters_than_clients_is_a_one_line_warning(here: Path) -> None:
    args = ["train", *TRAIN, "--rounds", "1", "--out", "k8"]
    result = invoke(*args, "--clusters", "8")
    assert result.exit_code == 0, result.output
    lines = stderr_lines(result)
    assert lines == [
        "Warning: --clusters: K = 8 exceeds the 6 participating clients of d; at least 2 "
        "clusters will have no client of their own"
    ], result.output
    result = invoke(*args, "--clusters", "6", "--overwrite")
    assert result.exit_code == 0 and not stderr_lines(result), result.output


def test_a_warm_up_as_long_as_the_run_is_a_one_line_warning(here: Path) -> None:
    """Fed-CAM's default warm-up (30 rounds) over a shorter run: the clusters never form."""
    args = ["train", *TRAIN, "--rounds", "2", "--algorithm", "ifca-cam", "--out", "cam"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert stderr_lines(result) == [
        "Warning: warmup_rounds: 30 of the run's 2 rounds: the clusters never form and ifca-cam "
        "trains the global model alone; set --set warmup_rounds=N below train.rounds (the "
        "paper: 30 of 100)"
    ], result.output
    result = invoke(*args, "--set", "warmup_rounds=1", "--overwrite")
    assert result.exit_code == 0 and not stderr_lines(result), result.output


@pytest.mark.parametrize("clusters", ["100000", "5000"])
def test_more_models_than_memory_holds_are_refused_up_front(here, monkeypatch, clusters) -> None:
    """K models that cannot fit are refused before any is built: 100,000 would fail in torch's
    allocator, 5,000 would grow until the system kills the process (here: 4 GiB free)."""
    import pipeline.run.setup as run_setup

    monkeypatch.setattr(run_setup, "available_memory", lambda device: 4 * 2**30)
    before = snapshot(here)
    line = refused(invoke("train", *TRAIN, "--clusters", clusters, "--out", "k"), "--clusters")
    assert f"K = {clusters}: the models" in line and "4.0 GiB are free on cpu" in line
    assert snapshot(here) == before  # no run folder


def test_running_out_of_memory_is_one_line(here: Path, monkeypatch) -> None:
    import pipeline.run.setup as run_setup

    def refused_allocation(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8")

    monkeypatch.setattr(run_setup, "build_algorithm", refused_allocation)
    line = refused(invoke("train", *TRAIN, "--out", "k"), "out of memory", code=1)
    assert "--clusters" in line


def test_one_spare_cluster_is_singular(here: Path) -> None:
    result = invoke("train", *TRAIN, "--rounds", "1", "--out", "k7", "--clusters", "7")
    assert result.exit_code == 0, result.output
    assert stderr_lines(result)[0].endswith("at least 1 cluster will have no client of their own")


def read_only_statvfs(path):
    return types.SimpleNamespace(f_flag=os.ST_RDONLY)


def erofs(*args, **kwargs):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))


@pytest.mark.parametrize("seen_by", ["statvfs", "probe"])
def test_a_read_only_file_system_is_named_as_such(here: Path, monkeypatch, seen_by: str) -> None:
    """For a user other than root, os.access says no on a read-only mount too: the mount is
    named, not "permission denied"."""
    monkeypatch.setattr(common.os, "access", lambda *args, **kwargs: False)
    if seen_by == "statvfs":
        monkeypatch.setattr(common.os, "statvfs", read_only_statvfs)
    else:
        monkeypatch.setattr(common.tempfile, "mkdtemp", erofs)
    before = snapshot(here)
    refused(invoke("train", *TRAIN, "--out", "ro/x"), "--out: ro/x: read-only file system")
    refused(invoke("report", "r", "--out", "rep"), "--out: rep: read-only file system")
    assert snapshot(here) == before


def test_a_read_only_write_is_named_as_such(tmp_path: Path, monkeypatch) -> None:
    """Refused only when written (a mount that statvfs does not flag): the errno says it."""
    target = tmp_path / "out"
    message = r"^--out: .*/out: read-only file system$"
    with pytest.raises(FedrcError, match=message), common.writing("--out", target):
        monkeypatch.setattr(common.os, "access", lambda *args, **kwargs: False)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(target / "x.json"))
    assert not target.exists()


def test_report_leaves_no_empty_folder_when_the_disk_is_full(here: Path, monkeypatch) -> None:
    def enospc(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    before = snapshot(here)
    monkeypatch.setattr(Path, "write_text", enospc)
    line = refused(invoke("report", "r", "--out", "reports/today"), code=1)
    assert "no space left" in line
    assert snapshot(here) == before  # neither reports/ nor reports/today


def test_atomic_dir_and_tempfile_modes_match_plain_mkdir(tmp_path: Path) -> None:
    """The reference the umask test relies on: a plain mkdir under the same umask."""
    previous = os.umask(0o027)
    try:
        (tmp_path / "plain").mkdir()
        made = Path(tempfile.mkdtemp(dir=tmp_path))
        with atomic_dir(tmp_path / "atomic"):
            pass
    finally:
        os.umask(previous)
    assert made.stat().st_mode & 0o777 == 0o700  # mkdtemp ignores the umask
    plain = (tmp_path / "plain").stat().st_mode & 0o777
    assert (tmp_path / "atomic").stat().st_mode & 0o777 == plain == 0o750


# ---- issue 40: nothing lost, nothing a user's deleted ----------------------------------------


@pytest.mark.parametrize("then", [["partition", *PART_ARGS, "--out", "d"], ["info", "d"]])
def test_a_benchmark_moved_aside_by_a_killed_overwrite_is_put_back_or_named(
    here: Path, then: list[str]
) -> None:
    """`partition --overwrite` killed between its two renames: `d` is gone, its previous
    version waits as `.d.old-PID` (and the new one, finished or not, as `.d.tmp-*`). The next
    partition puts the old one back (a warning says so) and, without --overwrite, keeps it; a
    reader names where the benchmark waits instead of deleting anything."""
    before = snapshot(here / "d")
    Path("d").rename(".d.old-4242")
    shutil.copytree(".d.old-4242", ".d.tmp-k1ll3d08")
    result = invoke(*then)
    if then[0] == "partition":
        warning, error = stderr_lines(result)
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert warning.startswith("Warning: ") and "d: put back from .d.old-4242" in warning
        assert error.startswith("Error: --out: d already holds a benchmark")
        assert snapshot(here / "d") == before
        assert not Path(".d.old-4242").exists() and not Path(".d.tmp-k1ll3d08").exists()
    else:
        refused(result, "d not found", ".d.old-4242", "fedrc partition --out d")
        assert Path(".d.old-4242").is_dir() and not Path("d").exists()


def test_plots_moved_aside_by_a_killed_plot_come_back_before_the_next(here: Path) -> None:
    Path("r/plots").rename("r/.plots.old-4242")
    result = invoke("plot", "--run", "r", "--dpi", "30")
    assert result.exit_code == 0, result.output
    assert "put back" in result.stderr and not Path("r/.plots.old-4242").exists()
    assert (here / "r/plots/omega.png").is_file()


def test_a_failed_replacement_of_a_folder_keeps_the_old_one(tmp_path: Path, monkeypatch) -> None:
    """The second rename of `atomic_dir` fails (a busy target, a full file system table): the
    old folder is put back, the new one removed; nothing is left aside."""
    target = tmp_path / "d"
    target.mkdir()
    (target / "old.txt").write_text("old")
    real = Path.rename

    def fail_second(self, to):
        if self.name.startswith(".d.tmp-"):
            raise OSError(errno.EBUSY, "busy")
        return real(self, to)

    monkeypatch.setattr(Path, "rename", fail_second)
    with pytest.raises(OSError), atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert [p.name for p in target.iterdir()] == ["old.txt"]


@pytest.mark.parametrize("name", [".config.json.tmp-mine", ".metrics.jsonl.tmp-", ".plots.old-x"])
def test_a_users_file_named_like_a_temporary_is_not_removed(here: Path, name: str) -> None:
    """Only fedrc's exact temporary names (`.NAME.tmp-` and 8 drawn characters or a pid,
    `.NAME.old-` and a pid) are leftovers; a user's look-alike stays (and train refuses the
    folder as not only a run's rather than delete it)."""
    Path("r", name).write_text("mine")
    refused(invoke("train", *TRAIN, "--rounds", "2", "--out", "r", "--overwrite"), name)
    assert Path("r", name).read_text() == "mine"
    assert invoke("eval", "--run", "r").exit_code == 0 and Path("r", name).is_file()


def test_a_users_files_in_plots_and_dvclive_are_kept(here: Path) -> None:
    """plots/ holding a file fedrc did not draw: `fedrc plot` (which replaces the folder) is
    refused; `train --overwrite` removes fedrc's figures and DVCLive's files and keeps the
    user's, with their folders."""
    Path("r/plots/notes.txt").write_text("mine")
    Path("r/dvclive").mkdir(exist_ok=True)
    Path("r/dvclive/notes.md").write_text("mine too")
    refused(invoke("plot", "--run", "r"), "r/plots holds files fedrc did not write (notes.txt)")
    result = invoke("train", *TRAIN, "--rounds", "2", "--out", "r", "--overwrite")
    assert result.exit_code == 0, result.output
    assert Path("r/plots/notes.txt").read_text() == "mine"
    assert sorted(p.name for p in Path("r/plots").iterdir()) == ["notes.txt"]
    assert Path("r/dvclive/notes.md").read_text() == "mine too"


@pytest.mark.parametrize("before", ["nothing", "empty", "lock"])
def test_resume_where_nothing_was_written_says_to_start_the_run(here: Path, before: str) -> None:
    """A run killed before it wrote its first file (loading its data) leaves at most its
    folder and a lock file: `--resume` says to start it without --resume (a mistyped --out
    would otherwise start a run), and the command without it does."""
    if before != "nothing":
        Path("k").mkdir()
    if before == "lock":
        Path("k/.fedrc.lock").write_text('{"pid": 999999}')
    result = invoke("train", *TRAIN, "--rounds", "1", "--out", "k", "--resume")
    refused(result, "--resume: no run to resume in k", "run the same command without --resume")
    result = invoke("train", *TRAIN, "--rounds", "1", "--out", "k")
    assert result.exit_code == 0, result.output
    assert rf.load_state(Path("k/model.pt"))["round"] == 1


@pytest.mark.parametrize("where", ["new", "overwritten"])
def test_a_run_that_fails_before_its_first_checkpoint_leaves_nothing(
    here: Path, monkeypatch, where: str
) -> None:
    """Diverged in round 1 (no checkpoint yet): the files it wrote (config.json, metrics,
    DVCLive's) are removed, and so is the folder it made; --overwrite had removed the old run
    already, so the folder is left empty of fedrc's files."""
    import pipeline.run.training as training

    def diverged(round_, run, *args):
        raise FedrcError(f"round {round_}: training diverged; lower --lr")

    monkeypatch.setattr(training, "train_round", diverged)
    out = "new" if where == "new" else "r"
    extra = ["--overwrite"] if where == "overwritten" else []
    refused(invoke("train", *TRAIN, "--rounds", "2", "--out", out, *extra), "diverged")
    if where == "new":
        assert not Path("new").exists()
    else:
        assert not [p for p in Path("r").iterdir() if p.name in rf.TRAIN_FILES]


def test_dvcs_gitignore_in_plots_is_not_a_users_file(here: Path) -> None:
    """A plot stage's outputs are files in plots/, so DVC writes plots/.gitignore (and again
    after the stage): `fedrc plot` under `dvc repro` draws over it."""
    Path("r/plots/.gitignore").write_text("/cluster_map.png\n")
    result = invoke("plot", "--run", "r", "--dpi", "30")
    assert result.exit_code == 0, result.output
    assert Path("r/plots/made_from.json").is_file()
