"""fedrc run by DVC as a stage: which stage, and giving back the outputs DVC removed.

`dvc repro` and `dvc exp run` delete a stage's outputs before they run its command (unless an
output is `persist: true`, which also leaves the stage out of DVC's run cache). A command that
then fails would leave the last good run or benchmark gone from the workspace. So when a fedrc
command fails under DVC, the stage's cached outputs that are missing are checked out again from
DVC's cache, as its dvc.lock records them: the workspace is again what DVC last recorded, and
the run cache and `dvc exp` are untouched. DVC says which stage runs a command in the
environment (`DVC_ROOT`, `DVC_STAGE`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PROJECT_FILE = "dvc.yaml"


def stage_root() -> Path | None:
    """The root of the DVC repository whose stage runs this command; None outside DVC."""
    root, stage = os.environ.get("DVC_ROOT"), os.environ.get("DVC_STAGE")
    return Path(root) if root and stage else None


def _stages(repo: Any) -> list[Any]:
    """This command's stage, with its dvc.lock entry. DVC names it relative to where `dvc` was
    started; the command runs in the stage's folder, where its dvc.yaml usually is."""
    name = os.environ["DVC_STAGE"].rpartition(":")[2]
    for target in (f"{Path.cwd() / PROJECT_FILE}:{name}", os.environ["DVC_STAGE"]):
        try:
            return list(repo.stage.collect(target))
        except Exception:  # DVC's own errors for a target it cannot find: try the next
            continue
    return []


def restore_removed_outputs() -> list[str]:
    """Check out again this stage's cached outputs that are missing (DVC removed them before
    the command ran), as dvc.lock records them; returns their paths. Outside DVC, or without
    DVC's Python package, it does nothing."""
    root = stage_root()
    if root is None:
        return []
    try:
        from dvc.repo import Repo
    except ImportError:
        return []
    restored = []
    with Repo(str(root)) as repo:
        for stage in _stages(repo):
            for out in stage.outs:
                if out.use_cache and out.hash_info and not out.exists:
                    out.checkout()
                    restored.append(str(out))
    return restored
