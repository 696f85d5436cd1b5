"""A run trained as a DVC stage: built where DVC does not delete it, moved into --out when done.

`dvc repro` deletes a stage's outputs before it runs the stage, the checkpoint with them, so a
`dvc repro` stopped half-way would start its run over. Under DVC a run therefore trains in a
staging folder of its own, `<DVC root>/.fedrc/runs/<name of --out>-<hash of its path>/`, which
no stage declares and Git ignores. Beside it, `<folder>.key` holds the run's key
(`code.run_key`: configuration, code and benchmark). The stage run again with the same key
resumes the checkpoint there (or, when the run had finished, only moves it); another key starts
the folder over. A finished run's files are linked (or copied) into --out, config.json saying
--out, and the staging folder is removed: --out never holds half a run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.common.io import write_json
from pipeline.common.run_lock import LOCK, writer_lock
from pipeline.config import TrainConfig
from pipeline.data.records import read_manifest
from pipeline.data.shards import data_digest
from pipeline.run import files as rf
from pipeline.run.code import run_code, run_key
from pipeline.run.folder import clear_run, refuse_foreign
from pipeline.run.live import FOLDER as LIVE_FOLDER
from pipeline.run.trackers import FOLDERS as TRACKER_FOLDERS
from pipeline.run.training import run_training

STORE = Path(".fedrc") / "runs"


def staging_folder(root: Path, out: str) -> Path:
    """Where a run bound for `out` trains under the DVC repository at `root`."""
    where = hashlib.sha256(os.path.abspath(out).encode()).hexdigest()[:12]
    return root / STORE / f"{Path(os.path.abspath(out)).name}-{where}"


def train_staged(
    config: TrainConfig,
    root: Path,
    *,
    overwrite: bool = False,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """Train `config` in its staging folder (resuming what a stopped stage left there under
    the same key), then move the finished run into `config.out`."""
    out = Path(config.out)
    refuse_foreign(out)  # before the training: a folder that is not a run stays refused
    key = run_key(config, run_code(config), data_digest(read_manifest(Path(config.data))))
    folder = staging_folder(root, config.out)
    _ignored_by_git(root / STORE.parts[0])
    with writer_lock(folder, "--out", "fedrc train"):
        keyfile = folder.with_name(folder.name + ".key")
        if not keyfile.is_file() or keyfile.read_text().strip() != key:
            for path in folder.iterdir():  # another run's: start over (the lock stays)
                if path.name != LOCK:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            keyfile.write_text(key + "\n")
        finished = (folder / rf.MODEL).is_file() and _rounds(folder) == config.rounds
        resume = (folder / rf.CHECKPOINT).is_file()
    if not finished:
        staged = dataclasses.replace(config, out=str(folder))
        run_training(staged, resume=resume, overwrite=not resume, on_round=on_round)
    with writer_lock(out, "--out", "fedrc train"):
        _publish(folder, out)
    shutil.rmtree(folder)
    keyfile.unlink(missing_ok=True)
    return out


def staged_checkpoint(root: Path, out: str) -> int | None:
    """The round of the checkpoint a stopped stage left for `out`, if any."""
    return rf.checkpoint_round(staging_folder(root, out))


def _rounds(folder: Path) -> int | None:
    try:
        return json.loads((folder / rf.CONFIG).read_text()).get("rounds")
    except (OSError, ValueError, AttributeError):
        return None


def _publish(folder: Path, out: Path) -> None:
    """The finished run in `folder` into `out`: what was there goes first (DVC removed its
    declared outputs already), config.json names `out`, each file is a hard link where the
    file system allows (a copy elsewhere)."""
    clear_run(out)
    snapshots = [p.name for p in folder.glob(rf.MOMENTUM_SNAPSHOTS)]
    names = [*rf.TRAIN_FILES, *snapshots, LIVE_FOLDER, *TRACKER_FOLDERS]
    for name in names:
        source = folder / name
        if source.is_dir():  # a tracker's folder of the run replaced included
            shutil.rmtree(out / name, ignore_errors=True)
            shutil.copytree(source, out / name, copy_function=_link_or_copy)
        elif source.is_file():
            _link_or_copy(source, out / name)
    config = json.loads((out / rf.CONFIG).read_text())
    write_json(out / rf.CONFIG, {**config, "out": str(out)})


def _link_or_copy(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _ignored_by_git(store: Path) -> None:
    """`.fedrc/` holds runs in progress, not results: Git (and so `dvc exp`) leaves it out."""
    ignore = store / ".gitignore"
    if not ignore.is_file():
        store.mkdir(parents=True, exist_ok=True)
        ignore.write_text("# runs in progress under DVC (fedrc); not results\n*\n")
