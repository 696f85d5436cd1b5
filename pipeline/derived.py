"""What `fedrc eval` and `fedrc plot` derive from a run, and what each was made from.

runs/<name>/
  eval.json, eval_clients.json  fedrc eval; eval.json's `made_from` names the model.pt it
                                scored (its SHA-256), its round and the benchmark's hash
  plots/                        fedrc plot; plots/made_from.json names the same for the figures

A derived output belongs to the run it was made from: `fedrc train --overwrite` removes them,
a `--resume` that trains more rounds removes them, and `fedrc report` refuses an eval.json whose
`made_from` no longer matches its run's model.pt and metrics.jsonl (`check_made_from`).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from pipeline import run_files as rf
from pipeline.errors import FedrcError

EVAL = "eval.json"
EVAL_CLIENTS = "eval_clients.json"
PLOTS = "plots"
DERIVED = (EVAL, EVAL_CLIENTS, PLOTS)


def derived_outputs(out: Path) -> list[Path]:
    """The files and folders eval and plot wrote into the run folder `out`."""
    return [out / name for name in DERIVED]


def remove_derived(out: Path) -> None:
    for path in derived_outputs(out):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def file_sha256(path: Path) -> str:
    hashed = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(2**24):
            hashed.update(chunk)
    return hashed.hexdigest()


def made_from(run: Path, round_: int, data_digest: str) -> dict[str, Any]:
    """The run's identity as a derived output records it: model.pt's SHA-256 (None before
    training finished), the last round it was made at, the benchmark's content hash."""
    model = run / rf.MODEL
    return {
        "model_sha256": file_sha256(model) if model.is_file() else None,
        "round": round_,
        "data_digest": data_digest,
    }


def check_made_from(run: Path, result: dict[str, Any], data_digest: str, last_round: int) -> str:
    """An eval.json's `made_from` against the run as it is now (model.pt, the last round of
    metrics.jsonl, config.json's benchmark hash); returns model.pt's SHA-256. A FedrcError
    naming eval.json and telling the user to evaluate again when it no longer matches."""
    path, again = run / EVAL, f"run `fedrc eval --run {run}` again"
    recorded = result.get("made_from")
    keys = ("model_sha256", "round", "data_digest")
    if not isinstance(recorded, dict) or any(k not in recorded for k in keys):
        raise FedrcError(
            f"{path}: does not record the model.pt it scored (written by an older fedrc); {again}"
        )
    model = run / rf.MODEL
    if not model.is_file():
        raise FedrcError(f"{path}: scored {model}, which is gone; {again} after training")
    now = file_sha256(model)
    if recorded["model_sha256"] != now:
        raise FedrcError(
            f"{path}: scored another model.pt (SHA-256 {str(recorded['model_sha256'])[:12]}…, "
            f"round {recorded['round']}) than the run's now ({now[:12]}…); {again}"
        )
    if recorded["round"] != last_round:
        raise FedrcError(
            f"{path}: made at round {recorded['round']}, but {run / rf.METRICS} runs to round "
            f"{last_round}; {again} once the run has finished"
        )
    if recorded["data_digest"] != data_digest:
        raise FedrcError(
            f"{path}: made on another benchmark than {run / rf.CONFIG} names (the content "
            f"hashes differ); {again}"
        )
    return now
