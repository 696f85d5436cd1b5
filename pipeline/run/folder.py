"""How `fedrc train` opens its `--out`: a new run, a run to resume, one to start over, or a
folder it refuses, decided before anything there is touched.

A run folder holds train's files (`run_files.train_outputs`), eval's and plot's outputs,
DVCLive's and the trackers' folders, DVC's `.gitignore`, the writer lock and the temporary files
of writes in progress. A folder holding anything else (a benchmark, a user's own files) is not a
run: train refuses it even with `--overwrite`, which would delete or mix with what is there.
A run stopped before its first checkpoint cannot be resumed and holds nothing worth keeping:
it is started over, with a warning saying what was there.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from pipeline.common.errors import FedrcError, FedrcWarning, first_few
from pipeline.common.io import is_temporary, remove_leftovers
from pipeline.common.reading import parse_json
from pipeline.common.run_lock import LOCK
from pipeline.data.records import MANIFEST
from pipeline.run import files as rf
from pipeline.run.derived import DERIVED, remove_derived
from pipeline.run.live import FOLDER as LIVE_FOLDER
from pipeline.run.live import clear as clear_live
from pipeline.run.momentum import LIVE_FILE
from pipeline.run.trackers import FOLDERS as TRACKER_FOLDERS

# DVCLive's folder, DVC's list of its outputs, the lock, the trackers' folders (`--log`)
TOOLS = (LIVE_FOLDER, ".gitignore", LOCK, *TRACKER_FOLDERS)
MOMENTUM_LIVE = LIVE_FILE.format(rank="*")  # a killed run's live momentum buffers


def is_run_file(name: str) -> bool:
    """Whether a name in a run folder is one fedrc (or DVC for it) writes there."""
    if name in (*rf.TRAIN_FILES, *DERIVED, *TOOLS):
        return True
    if any(Path(name).match(p) for p in (rf.MOMENTUM_SNAPSHOTS, MOMENTUM_LIVE)):
        return True
    return is_temporary(name)  # a write's temporary


def foreign_names(out: Path) -> list[str]:
    """What in `out` is not a run's, sorted; a config.json that fedrc train did not write
    counts (a benchmark's has no data digest)."""
    names = sorted(p.name for p in out.iterdir() if not is_run_file(p.name))
    config = out / rf.CONFIG
    if config.exists() and not _is_run_config(config):
        names.insert(0, rf.CONFIG)
    return names


def _is_run_config(path: Path) -> bool:
    try:
        values = parse_json(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(values, dict) and "data_digest" in values and "algorithm" in values


def refuse_foreign(out: Path) -> None:
    """A FedrcError naming what makes `out` something other than a run folder."""
    if not out.is_dir():
        return
    if (out / MANIFEST).exists():
        raise FedrcError(
            f"--out: {out} holds a fedrc benchmark ({MANIFEST}), not a run; choose another --out"
        )
    names = foreign_names(out)
    if names:
        raise FedrcError(
            f"--out: {out} holds files that are not a fedrc run ({first_few(names)}); choose "
            "another --out (an empty or new folder)"
        )


def clear_run(out: Path) -> None:
    """Remove train's own files and what eval and plot made of them (they describe the run
    being replaced)."""
    for path in rf.train_outputs(out):
        path.unlink(missing_ok=True)
    remove_derived(out)
    clear_live(out)


def open_run_dir(out: Path, resume: bool, overwrite: bool) -> bool:
    """Check and prepare `out` for a run; returns whether the run resumes from its checkpoint.

    Called while holding the folder's writer lock: the temporary files of killed writes of
    train's files are removed first."""
    refuse_foreign(out)
    if out.is_dir():
        remove_leftovers(out, rf.TRAIN_FILES, (rf.MOMENTUM_SNAPSHOTS,))
        for live in out.glob(MOMENTUM_LIVE):
            live.unlink()
    present = [p for p in rf.train_outputs(out) if p.exists()]
    checkpoint, model = (out / rf.CHECKPOINT).is_file(), (out / rf.MODEL).is_file()
    if present and not checkpoint and not model and not overwrite:  # stopped early: say so
        names = ", ".join(p.name for p in present)
        warnings.warn(
            FedrcWarning(
                f"--out: {out} holds a run stopped before its first checkpoint ({names}); "
                "starting it over"
            ),
            stacklevel=2,
        )
        clear_run(out)
        resume = False
    elif resume and not present:  # killed before it wrote anything, or never started
        raise FedrcError(
            f"--resume: no run to resume in {out} (none was started there, or it was stopped "
            "before its first checkpoint); run the same command without --resume to start it"
        )
    elif resume:
        if not checkpoint:
            raise FedrcError(f"--resume: no checkpoint in {out}")
        return True
    elif present:
        if not overwrite:
            raise FedrcError(
                f"--out: {out} already holds a run; pass --resume to continue it or "
                "--overwrite to start again"
            )
        clear_run(out)
    if out.is_dir():  # what eval and plot made of a run that is gone (DVC removed its files)
        remove_derived(out)
    out.mkdir(parents=True, exist_ok=True)
    return resume
