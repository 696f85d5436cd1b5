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

import contextlib
import hashlib
from pathlib import Path
from typing import Any

import torch

from pipeline.common.errors import FedrcError
from pipeline.common.io import atomic_file
from pipeline.common.reading import parse_json, read_bytes, read_text
from pipeline.run import files as rf
from pipeline.run.resolve import from_values, recorded_identity

EVAL = "eval.json"
EVAL_CLIENTS = "eval_clients.json"
PLOTS = "plots"
MADE_FROM = "made_from.json"  # in plots/: what the figures were made from, and their names
MODEL_DIGEST = "model.sha256"
DERIVED = (EVAL, EVAL_CLIENTS, PLOTS, MODEL_DIGEST)
CONTAINER_KEYS = ("format", "checksum")  # how model.pt was written, not what it holds


def remove_derived(out: Path) -> None:
    """Remove what eval and plot wrote into the run folder `out`; a file of the user's in
    plots/ stays (`plot_files`), and so does the folder then."""
    for path in (out / name for name in DERIVED):
        if path.is_dir() and not path.is_symlink():
            for name in plot_files(path):
                (path / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                path.rmdir()  # only when nothing of the user's is left there
        else:
            path.unlink(missing_ok=True)


def plot_files(plots: Path) -> list[str]:
    """The files `fedrc plot` wrote in `plots`: those its made_from.json lists (and itself);
    for figures drawn before it listed them, the PNG files."""
    if not plots.is_dir():
        return []
    here = sorted(p.name for p in plots.iterdir())
    try:
        listed = parse_json((plots / MADE_FROM).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    if not isinstance(listed, list):
        listed = [name for name in here if name.endswith(".png")]
    return [name for name in here if name in (*listed, MADE_FROM)]


def foreign_plots(plots: Path) -> list[str]:
    """What in `plots` fedrc did not write (`plot_files`) nor DVC (the `.gitignore` of a plot
    stage's outputs, which DVC writes again after the stage): `fedrc plot` would delete it."""
    if not plots.is_dir():
        return []
    ours = [*plot_files(plots), ".gitignore"]
    return sorted(p.name for p in plots.iterdir() if p.name not in ours)


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
    return kept_digest(run)


def kept_digest(run: Path) -> str | None:
    """The digest in a copy's model.sha256 (`keep_model_digest`), or None without one."""
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


def made_from(
    model: str | None, round_: int, data_digest: str, clients: str | None = None
) -> dict[str, Any]:
    """The run's identity as a derived output records it: the model's digest (None before
    training finished), the last round it was made at, the benchmark's content hash; eval.json
    also the SHA-256 of the eval_clients.json written with it (its text `clients`)."""
    made = {"model_digest": model, "round": round_, "data_digest": data_digest}
    if clients is not None:
        made["clients_digest"] = hashlib.sha256(clients.encode()).hexdigest()
    return made


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
    state = rf.load_state(run / rf.MODEL) if (run / rf.MODEL).is_file() else None
    now = state_digest(state) if state is not None else kept_digest(run)
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
    if state is not None:
        refuse_foreign_config(run, state)
    clients = run / EVAL_CLIENTS
    kept = clients.is_file() and "clients_digest" in recorded  # a copy may leave it out
    if kept and hashlib.sha256(read_bytes(clients)).hexdigest() != recorded["clients_digest"]:
        raise FedrcError(
            f"{clients}: not the one {path} was written with (another run's, or edited); {again}"
        )
    return now


def refuse_foreign_config(run: Path, state: dict[str, Any]) -> None:
    """config.json must be the configuration model.pt was trained with (an edited seed, or a
    copy of another run's, would give its results another run's name)."""
    path = run / rf.CONFIG
    try:
        values = parse_json(read_text(path))
        config = from_values({k: v for k, v in values.items() if k != "data_digest"})
    except (ValueError, AttributeError, FedrcError) as e:
        raise FedrcError(f"{path}: not a fedrc run configuration ({e})") from None
    wanted = {**config.identity(), "data_digest": values.get("data_digest")}
    recorded = recorded_identity(rf.state_identity(run / rf.MODEL, state), str(run / rf.MODEL))
    other = rf.identity_mismatch(recorded, wanted)
    if other is not None:
        raise FedrcError(f"{run / rf.MODEL}: does not belong to {path}: {other}")
