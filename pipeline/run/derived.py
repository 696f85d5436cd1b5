"""What `fedrc eval` and `fedrc plot` derive from a run, and what each was made from.

runs/<name>/
  eval.json, eval_clients.json  fedrc eval; eval.json's `made_from` names the model it
                                scored (`model_digest`), its round and the benchmark's hash
  plots/                        fedrc plot; plots/made_from.json names the same for the figures
  model.sha256                  the digest of model.pt, in a copy of a finished run kept
                                without its model (`keep_model_digest`: results small enough
                                to commit); `model_digest` reads it where model.pt is absent

A derived output belongs to the run it was made from: `fedrc train --overwrite` removes them,
a `--resume` that trains more rounds removes them, and `fedrc report` refuses an eval.json whose
`made_from` no longer matches its run's model.pt and metrics.jsonl (`check_made_from`).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import torch

from pipeline.common.errors import FedrcError
from pipeline.common.io import atomic_file
from pipeline.run import files as rf

EVAL = "eval.json"
EVAL_CLIENTS = "eval_clients.json"
PLOTS = "plots"
MODEL_DIGEST = "model.sha256"
DERIVED = (EVAL, EVAL_CLIENTS, PLOTS, MODEL_DIGEST)
CONTAINER_KEYS = ("format", "checksum")  # how model.pt was written, not what it holds


def remove_derived(out: Path) -> None:
    """Remove what eval and plot wrote into the run folder `out`."""
    for path in (out / name for name in DERIVED):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def state_digest(state: dict[str, Any]) -> str:
    """SHA-256 of what a model.pt holds (tensors by dtype, shape and bytes; numbers, strings
    and nesting), without the container's own keys: the same model written again, sealed or
    not, has the same digest."""
    hashed = hashlib.sha256()
    _feed(hashed, {k: v for k, v in state.items() if k not in CONTAINER_KEYS})
    return hashed.hexdigest()


def _feed(hashed: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        hashed.update(f"tensor {value.dtype} {tuple(value.shape)}:".encode())
        hashed.update(flat.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        hashed.update(b"{")
        for key in sorted(value, key=str):
            _feed(hashed, str(key))
            _feed(hashed, value[key])
        hashed.update(b"}")
    elif isinstance(value, list | tuple):
        hashed.update(b"[")
        for item in value:
            _feed(hashed, item)
        hashed.update(b"]")
    else:
        hashed.update(f"{type(value).__name__} {value!r};".encode())


def model_digest(run: Path) -> str | None:
    """`state_digest` of the run's model.pt (read and checked as eval reads it); in a copy kept
    without model.pt, the digest recorded in its model.sha256; None when training has not
    finished."""
    path = run / rf.MODEL
    if path.is_file():
        return state_digest(rf.load_state(path))
    kept = run / MODEL_DIGEST
    if not kept.is_file():
        return None
    digest = kept.read_text(encoding="ascii", errors="replace").strip()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise FedrcError(f"{kept}: expected the 64 hex digits of a model digest")
    return digest


def keep_model_digest(run: Path, into: Path) -> None:
    """Write the digest of `run`'s model.pt into `into`/model.sha256, so that a copy of the run
    in `into` without model.pt still shows what its eval.json scored (`fedrc report` reads it)."""
    digest = model_digest(run)
    if digest is None:
        raise FedrcError(f"{run / rf.MODEL}: not found (the run has not finished)")
    with atomic_file(into / MODEL_DIGEST) as tmp:
        tmp.write_text(digest + "\n")


def made_from(model: str | None, round_: int, data_digest: str) -> dict[str, Any]:
    """The run's identity as a derived output records it: the model's digest (None before
    training finished), the last round it was made at, the benchmark's content hash."""
    return {"model_digest": model, "round": round_, "data_digest": data_digest}


def check_made_from(run: Path, result: dict[str, Any], data_digest: str, last_round: int) -> str:
    """An eval.json's `made_from` against the run as it is now (model.pt, the last round of
    metrics.jsonl: the run went on after eval, config.json's benchmark hash); returns model.pt's
    digest. A FedrcError
    naming eval.json and telling the user to evaluate again when it no longer matches."""
    path, again = run / EVAL, f"run `fedrc eval --run {run}` again"
    recorded = result.get("made_from")
    keys = ("model_digest", "round", "data_digest")
    if not isinstance(recorded, dict) or any(k not in recorded for k in keys):
        raise FedrcError(
            f"{path}: does not record the model.pt it scored (written by an older fedrc); {again}"
        )
    now = model_digest(run)
    if now is None:
        raise FedrcError(f"{path}: scored {run / rf.MODEL}, which is gone; {again} after training")
    if recorded["model_digest"] != now:
        raise FedrcError(
            f"{path}: scored another model (digest {str(recorded['model_digest'])[:12]}…, "
            f"round {recorded['round']}) than the run's model.pt now ({now[:12]}…); {again}"
        )
    if not isinstance(recorded["round"], int) or recorded["round"] < last_round:
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
