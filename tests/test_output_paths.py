"""An output path that cannot be written is one line naming the option and the path, exit 2.

Each command checks where it will write before any work (a file where a folder is needed,
/proc, /sys, a read-only mount, no permission), and an error that only shows when writing is
reported the same way; nothing is left half-written and an existing output stays as it was.
Tests run as root, for whom os.access allows everything, so read-only mounts and permission
denials are simulated by making the write raise.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
from conftest import assert_one_line, snapshot, working_copy
from typer.testing import CliRunner

from fedrc_cli.app import app
from pipeline.config import EvalConfig, PartitionConfig
from pipeline.run.resolve import make_config
from pipeline.stages import eval_stage, partition_stage, train_stage

pytestmark = pytest.mark.usefixtures("flower_installed")  # `flower app` writes as the others

runner = CliRunner()
PART = dict(dataset="synthetic", clients=6, samples_per_client=40, holdout_samples=30)
PART_ARGS = [x for k, v in PART.items() for x in (f"--{k.replace('_', '-')}", str(v))]
TRAIN = ["--data", "d", "--algorithm", "fedavg", "--rounds", "1", "--local-epochs", "1"]
TRAIN += ["--batch-size", "16", "--device", "cpu"]
PROC, SYS = "/proc/fedrc_run", "/sys/fedrc_run"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """d: a tiny partition; r: a finished, evaluated fedavg run on it."""
    root = tmp_path_factory.mktemp("world")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        partition_stage(PartitionConfig(**PART, out="d"))
        train_stage(
            make_config(
                data="d", algorithm="fedavg", out="r", rounds=1, local_epochs=1, device="cpu"
            )
        )
        eval_stage(EvalConfig(run="r"))
    return root


@pytest.fixture
def here(world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return working_copy(world, tmp_path, monkeypatch)


def refused(*args: str, culprits: tuple[str, ...]) -> str:
    """Run the command; it must fail with exit 2 and one error line naming every culprit."""
    result = runner.invoke(app, list(args))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error:") and "Traceback" not in result.output, result.output
    for culprit in culprits:
        assert culprit in lines[0], (culprit, lines[0])
    return lines[0]


def raising(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


# ---- checked before any work -----------------------------------------------------------------

UNWRITABLE = [
    (PROC, "cannot be created there (no such file or directory)"),
    (SYS, "permission denied"),
    ("d/manifest.json/sub", "d/manifest.json is a file, not a folder"),
]
FOLDER_COMMANDS = {  # each ends with the option that names the folder it writes
    "partition": ["partition", *PART_ARGS, "--out"],
    "train": ["train", *TRAIN, "--out"],
    "report": ["report", "r", "--out"],
    "flower app": ["flower", "app", "--data", "d", "--app"],
}


@pytest.mark.parametrize("command", FOLDER_COMMANDS)
@pytest.mark.parametrize(("path", "reason"), UNWRITABLE)
def test_unwritable_out_is_refused_before_any_work(here: Path, command, path, reason) -> None:
    before = snapshot(here)
    option = FOLDER_COMMANDS[command][-1]
    line = refused(*FOLDER_COMMANDS[command], path, culprits=(option, path, reason))
    assert line == f"Error: {option}: {path}: {reason}"
    assert snapshot(here) == before
    assert not os.path.lexists(path)


@pytest.mark.parametrize("command", FOLDER_COMMANDS)
def test_a_file_where_the_out_folder_should_be(here: Path, command) -> None:
    before = snapshot(here)
    option = FOLDER_COMMANDS[command][-1]
    refused(*FOLDER_COMMANDS[command], "d/manifest.json", culprits=(option, "d/manifest.json"))
    assert snapshot(here) == before  # the file is not replaced by a folder


def test_eval_and_plot_refuse_what_is_in_the_way_inside_the_run(here: Path) -> None:
    (here / "r/plots").write_text("not a folder")
    (here / "r/eval_clients.json").unlink()
    (here / "r/eval_clients.json").mkdir()
    before = snapshot(here)
    refused("plot", "--run", "r", culprits=("--run", "r/plots", "a file is in the way"))
    refused("eval", "--run", "r", culprits=("--run", "r/eval_clients.json", "a folder is in"))
    assert snapshot(here) == before


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_read_only_or_forbidden_folder_is_found_by_the_probe(here: Path, monkeypatch, code):
    # root passes os.access everywhere: the probe (an empty folder made and removed) finds it
    import fedrc_cli.common as common

    monkeypatch.setattr(common.tempfile, "mkdtemp", raising(code))
    reason = "read-only file system" if code == errno.EROFS else "permission denied"
    before = snapshot(here)
    refused("partition", *PART_ARGS, "--out", "d", culprits=("--out", "d", reason))
    refused("train", *TRAIN, "--out", "x", culprits=("--out", "x", reason))
    refused("eval", "--run", "r", culprits=("--run", "r/eval.json", reason))
    refused("plot", "--run", "r", culprits=("--run", "r/plots", reason))
    refused("report", "r", "--out", "rep", culprits=("--out", "rep", reason))
    refused("flower", "app", "--data", "d", "--app", "a", culprits=("--app", "a", reason))
    assert snapshot(here) == before


def test_the_probe_leaves_nothing_behind(here: Path) -> None:
    assert runner.invoke(app, ["eval", "--run", "r"]).exit_code == 0
    assert not [p for p in here.rglob(".fedrc-probe-*")]
    assert not [p for p in Path(tempfile.gettempdir()).glob(".fedrc-probe-*")]


# ---- found only when writing (a read-only mount, a permission) ------------------------------


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_an_error_when_writing_is_one_line_and_leaves_outputs_alone(here, monkeypatch, code):
    import pipeline.data.shards as shards

    reason = "read-only file system" if code == errno.EROFS else "permission denied"
    before = snapshot(here)
    with monkeypatch.context() as m:
        m.setattr(shards.pq, "write_table", raising(code))
        args = ("partition", *PART_ARGS, "--out", "d", "--overwrite")
        line = refused(*args, culprits=("--out", "d", reason))
        assert line == f"Error: --out: d: {reason}"
    with monkeypatch.context() as m:
        m.setattr(Path, "mkdir", raising(code))
        refused("train", *TRAIN, "--out", "x", culprits=("--out", "x", reason))
    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", raising(code))
        # the two files are written together; the error names the one it was raised for
        refused("eval", "--run", "r", culprits=("--run", "r/eval", reason))
        refused("report", "r", "--out", "rep", culprits=("--out", "rep", reason))
        refused("flower", "app", "--data", "d", "--app", "a", culprits=("--app", "a", reason))
    with monkeypatch.context() as m:
        import pipeline.outputs.plots as plots

        m.setattr(plots, "atomic_dir", raising(code))
        refused("plot", "--run", "r", culprits=("--run", "r/plots", reason))
    assert snapshot(here) == before  # no new folder, no temporary file, old outputs intact


def test_a_full_disk_is_still_exit_1(here: Path, monkeypatch) -> None:
    import pipeline.data.shards as shards

    monkeypatch.setattr(shards.pq, "write_table", raising(errno.ENOSPC))
    result = runner.invoke(app, ["partition", *PART_ARGS, "--out", "fresh"])
    assert result.exit_code == 1 and "no space left" in result.stderr, result.output


def test_an_unreadable_input_is_not_blamed_on_the_output(here: Path, monkeypatch) -> None:
    import pipeline.stages as stages

    def denied(run):
        raise PermissionError(errno.EACCES, "Permission denied", str(Path("elsewhere/x.json")))

    monkeypatch.setattr(stages, "run_config", denied)
    result = runner.invoke(app, ["eval", "--run", "r"])
    line = assert_one_line(result, "elsewhere/x.json: permission denied", code=2)
    assert "--run" not in line  # the file it could not read, not the output
