"""The files of a training run and how they are written and read back.

runs/<name>/
  config.json          resolved TrainConfig + the data digest
  metrics.jsonl        one JSON line per round
  assignments.parquet  ω of every client (held-out ones marked) at every evaluated round
                       (`pipeline.run.assignments`)
  checkpoint.pt        the latest resumable state (`RunState`), for --resume
  checkpoint-momentum-r<N>.npy  the persistent SGD momentum of that state, where it is kept
  model.pt             the final models and ω, for eval and plot
Checkpoints hold only tensors, numbers and strings and are read with weights_only=True.
checkpoint.pt and model.pt carry the SHA-256 of their bytes, checked before torch reads them
(`save_state`, `load_state`), and what they hold is checked against the run before it is used
(`RunState.load`, `check_model`).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.common.errors import FedrcError, brief
from pipeline.common.io import atomic_file, naming
from pipeline.common.reading import opened, parse_json
from pipeline.config import TrainConfig
from pipeline.run.assignments import omega_problem
from pipeline.run.assignments import read_assignments as read_assignments  # where it was

CONFIG = "config.json"
METRICS = "metrics.jsonl"
ASSIGNMENTS = "assignments.parquet"
CHECKPOINT = "checkpoint.pt"
MODEL = "model.pt"
MOMENTUM_SNAPSHOTS = "checkpoint-momentum-r*.npy"
CHECKPOINT_FORMAT = 2  # 2: momentum in its own file, torch's RNG state
TRAIN_FILES = (CONFIG, METRICS, ASSIGNMENTS, CHECKPOINT, MODEL)


def train_outputs(out: Path) -> list[Path]:
    """The files `fedrc train` owns in a run folder (eval's and plot's are not among them)."""
    return [out / name for name in TRAIN_FILES] + sorted(out.glob(MOMENTUM_SNAPSHOTS))


def momentum_snapshot(out: Path, round_: int) -> Path:
    return out / f"checkpoint-momentum-r{round_}.npy"


def prune_momentum(out: Path, round_: int) -> None:
    """Remove the momentum snapshots of rounds other than `round_` (the checkpoint's)."""
    keep = momentum_snapshot(out, round_)
    for old in out.glob(MOMENTUM_SNAPSHOTS):
        if old != keep:
            old.unlink(missing_ok=True)


# The seal: torch.save writes a zip archive; fedrc puts the SHA-256 of that archive in the
# archive's comment, which every zip reader (torch.load included) skips. A file without it was
# written before fedrc sealed its files and is read as before; one whose state says it was
# sealed ("checksum") but whose seal is gone is refused.
SEAL = b"fedrc-sha256:"
SEAL_SIZE = len(SEAL) + 64
END_OF_ZIP = b"PK\x05\x06"  # the zip's end-of-central-directory record: 22 bytes + comment


def save_state(path: Path, state: dict[str, Any], format: int = CHECKPOINT_FORMAT) -> None:
    """`state` sealed (`sealed`) and written to `path` atomically."""
    data = sealed(state, format)
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)


def sealed(state: dict[str, Any], format: int = CHECKPOINT_FORMAT) -> memoryview:
    """The bytes of `state` as torch.save writes them, with the seal in the zip's comment."""
    # Serialise in memory first: torch.save reports a full disk as an opaque RuntimeError,
    # a plain write as OSError(ENOSPC) that names the file.
    buffer = io.BytesIO()
    torch.save({**state, "format": format, "checksum": "sha256"}, buffer)
    size = buffer.tell()
    view = buffer.getbuffer()
    if bytes(view[size - 22 : size - 18]) != END_OF_ZIP or bytes(view[size - 2 :]) != b"\0\0":
        raise RuntimeError("torch.save wrote an archive fedrc cannot seal")  # a torch change
    digest = hashlib.sha256(view).hexdigest().encode()
    del view
    buffer.seek(size - 2)  # the comment's length, then the comment
    buffer.write(SEAL_SIZE.to_bytes(2, "little") + SEAL + digest)
    return buffer.getbuffer()


def _damaged(path: Path, what: str) -> FedrcError:
    return FedrcError(
        f"{path}: damaged: {what} (the file was changed or corrupted after fedrc wrote it)"
    )


def check_seal(path: Path) -> bool:
    """Whether `path` carries a seal; raises when its bytes do not match it. The bytes are
    read and hashed before anything in them is unpickled."""
    with opened(path) as f:
        size = f.seek(0, io.SEEK_END)
        f.seek(max(0, size - 4 * SEAL_SIZE))
        tail = f.read()
        at = tail.rfind(SEAL)
        if at < 0:
            return False
        digest = tail[at + len(SEAL) :]
        length = int.from_bytes(tail[max(0, at - 2) : at], "little")
        if length != SEAL_SIZE or re.fullmatch(rb"[0-9a-f]{64}", digest) is None:
            raise _damaged(path, "its SHA-256 seal is broken")
        hashed, left = hashlib.sha256(), size - SEAL_SIZE - 2
        f.seek(0)
        while left > 0:
            chunk = f.read(min(left, 2**24))
            if not chunk:
                break
            hashed.update(chunk)
            left -= len(chunk)
        hashed.update(b"\0\0")
    if hashed.hexdigest().encode() != digest:
        raise _damaged(path, "its SHA-256 does not match its contents")
    return True


def load_state(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FedrcError(f"{path}: not found")
    sealed = check_seal(path)
    try:
        with warnings.catch_warnings():  # e.g. about a foreign pickle protocol: we refuse anyway
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise FedrcError(
            f"{path}: refused: it holds objects other than tensors, numbers and strings "
            "(fedrc never runs code from a checkpoint; was it crafted or written by another tool?)"
        ) from None
    except Exception as e:  # unpickling errors come in many types
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise FedrcError(
            f"{path}: damaged or not a fedrc checkpoint ({type(e).__name__}: {first[:120]})"
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("format"), int):
        raise FedrcError(f"{path}: not a fedrc checkpoint")
    if state["format"] > CHECKPOINT_FORMAT:
        raise FedrcError(
            f"{path}: written by a newer fedrc (checkpoint format {state['format']}, this fedrc "
            f"reads up to {CHECKPOINT_FORMAT}); upgrade fedrc"
        )
    if "checksum" in state and not sealed:
        raise _damaged(path, "its SHA-256 seal is missing")
    return state


def run_identity(config: TrainConfig, data_digest: str) -> str:
    """The run's identity as JSON: its configuration (what changes the numbers) and its
    benchmark's hash; checkpoint.pt and model.pt record it, and the files a run derives its
    `run_id`."""
    return json.dumps({**config.identity(), "data_digest": data_digest}, sort_keys=True)


def state_identity(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    """The configuration a checkpoint or model.pt was written with (TrainConfig.identity())."""
    try:
        identity = parse_json(state["identity"])
    except (KeyError, TypeError, json.JSONDecodeError):
        raise FedrcError(f"{path}: not a fedrc checkpoint (no configuration recorded)") from None
    if not isinstance(identity, dict):
        raise FedrcError(f"{path}: not a fedrc checkpoint (no configuration recorded)")
    return identity


def identity_mismatch(recorded: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """None when equal, else what differs, e.g. "algorithm fedem there, fedrc here"."""
    if recorded == wanted:
        return None
    if recorded.get("data_digest") != wanted.get("data_digest"):
        return "another dataset (the shards' hashes differ)"
    keys = sorted(k for k in recorded.keys() | wanted.keys() if recorded.get(k) != wanted.get(k))
    what = "; ".join(f"{k} {recorded.get(k)!r} there, {wanted.get(k)!r} here" for k in keys[:4])
    return "another configuration (" + what + (", …" if len(keys) > 4 else "") + ")"


def checkpoint_round(out: Path) -> int | None:
    """The round `checkpoint.pt` in `out` holds, or None when there is no usable checkpoint."""
    try:
        return int(load_state(out / CHECKPOINT)["round"])
    except (FedrcError, KeyError, TypeError, ValueError):
        return None


def metrics_line(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True) + "\n"


def append_metrics(path: Path, row: dict[str, Any]) -> None:
    line = metrics_line(row)
    with naming(path), path.open("a") as f:
        f.write(line)  # one write: a crash can tear only this last line (see read_metrics)


def read_metrics(path: Path, torn_tail_ok: bool = False) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl, each checked (`metrics_row_problem`); with `torn_tail_ok`
    (resuming) an unfinished last line, left by a run killed while writing it, is dropped
    instead of refused."""
    if not path.is_file():
        raise FedrcError(f"{path}: not found (did `fedrc train` finish?)")
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = parse_json(line)
            if not isinstance(row, dict) or not isinstance(row.get("round"), int):
                raise ValueError
        except ValueError:  # JSONDecodeError included
            if torn_tail_ok and number == len(lines) and not text.endswith("\n"):
                break
            raise FedrcError(
                f"{path}: line {number} is not a metrics row (a crashed run? continue it with "
                "`fedrc train --resume`)"
            ) from None
        problem = metrics_row_problem(row, number)
        if problem is not None:
            raise FedrcError(f"{path}: line {number}: {problem} (edited since fedrc wrote it?)")
        rows.append(row)
    return rows


SCORES = ("train_accuracy", "local_accuracy", "global_accuracy", "global_accuracy_by_concept")
COUNTS = ("step", "clients", "clients_scored", "bytes_down", "bytes_up")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_share(value: Any) -> bool:
    """An accuracy: a number in [0, 1] (NaN is not)."""
    return _is_number(value) and 0 <= value <= 1


def _field_problem(key: str, value: Any) -> str | None:
    """What is wrong with one field of a metrics row that fedrc reads back, or None: of its
    type and in the range its meaning implies (an accuracy in [0, 1], a loss or a time finite
    and not negative); the fields an algorithm adds (`round_info`) are its own."""
    if key.endswith("_by_concept"):
        ok = isinstance(value, dict) and all(map(_is_number, value.values()))
        expected = "numbers by concept"
        if ok and not all(map(_is_share, value.values())):
            ok, expected = False, "accuracies in [0, 1] by concept"
    elif key.endswith(("accuracy", "loss")) or key == "seconds":
        ok, expected = _is_number(value), "a number"
        if ok and key.endswith("accuracy") and not _is_share(value):
            ok, expected = False, "a number in [0, 1]"
        elif ok and not key.endswith("accuracy") and not (math.isfinite(value) and value >= 0):
            ok, expected = False, "a finite number >= 0"
    elif key in COUNTS:
        ok, expected = isinstance(value, int) and not isinstance(value, bool), "an integer"
    else:
        return None
    return None if ok else f"{key}: expected {expected}, got {_described(value)}"


def metrics_row_problem(row: dict[str, Any], number: int) -> str | None:
    """What is wrong with the row on line `number` of metrics.jsonl, or None: its round must
    be `number` (rounds run from 1 without a gap), the fields fedrc reads must have their types,
    and an evaluated round must hold every score eval reads."""
    if row["round"] != number:
        return f"round {row['round']!r}, expected {number} (one line per round, from 1)"
    for key, value in row.items():
        problem = _field_problem(key, value)
        if problem is not None:
            return problem
    for prefix in ("", "hard_"):
        held = [prefix + k in row for k in SCORES]
        if any(held) and not all(held):
            lacking = next(prefix + k for k, h in zip(SCORES, held) if not h)
            return f"an evaluated round without {lacking}"
    return None


def truncate_metrics(path: Path, last_round: int) -> None:
    """Keep the lines of rounds ≤ last_round (a resumed run rewrites the rest)."""
    if not path.exists():
        return
    keep = [r for r in read_metrics(path, torn_tail_ok=True) if r["round"] <= last_round]
    with atomic_file(path) as tmp:
        tmp.write_text("".join(map(metrics_line, keep)))


@dataclass(frozen=True)
class Expected:
    """What a run's checkpoint.pt or model.pt must hold to be used: from the run's
    configuration, its data and its metrics.jsonl, checked before anything is touched."""

    rounds: int  # the run's rounds: a state's round is in [0, rounds]
    models: tuple[int, ...]  # rows × parameters of the configured model
    omega: tuple[int, ...]  # clients × K
    algorithm: dict[str, Any]  # a fresh algorithm's state: its keys and tensor shapes
    metrics: Path
    logged: int  # metrics.jsonl holds rounds 1..logged
    logits: tuple[int, ...] | None = None  # rows × samples × classes (checkpoint's cache)
    dtype: torch.dtype = torch.float32  # of the models (and their cached logits)


def evaluated_rounds(metrics: list[dict[str, Any]]) -> list[int]:
    """The rounds of metrics.jsonl's rows that were evaluated (assignments.parquet has ω for
    each of them)."""
    return [row["round"] for row in metrics if "train_accuracy" in row]


def logged_rounds(path: Path) -> int:
    """n when metrics.jsonl holds every round 1..n (0 when it is missing or starts later);
    a line torn by a kill is not counted."""
    if not path.is_file():
        return 0
    rounds = {row["round"] for row in read_metrics(path, torn_tail_ok=True)}
    n = 0
    while n + 1 in rounds:
        n += 1
    return n


def _described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {_dtype(value.dtype)} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {brief(value, 70)}"


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_tensor(
    path: Path,
    key: str,
    value: Any,
    shape: tuple[int, ...],
    what: str = "",
    floating: bool = True,
    finite: bool = True,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`value` is a tensor of `shape` (float, and finite when `finite`, if `floating`; else
    of an integer or bool type; of exactly `dtype` when given: a float64 model would train
    to other numbers, or fail to load), else one line naming the file and the field."""
    kind = "float" if floating else "integer"
    if (
        not isinstance(value, torch.Tensor)
        or value.is_floating_point() != floating
        or tuple(value.shape) != tuple(shape)
    ):
        raise FedrcError(
            f"{path}: {key}: expected a {kind} tensor of shape {tuple(shape)}{what}, got "
            f"{_described(value)}"
        )
    if dtype is not None and value.dtype != dtype:
        raise FedrcError(
            f"{path}: {key}: expected a {_dtype(dtype)} tensor, got {_described(value)}"
        )
    if floating and finite and not bool(torch.isfinite(value).all()):
        raise FedrcError(f"{path}: {key}: holds NaN or infinite values")
    return value


def check_omega(path: Path, key: str, value: torch.Tensor) -> None:
    """`value` (a checked tensor) holds one mixture per client (`omega_problem`)."""
    problem = omega_problem(value.detach().cpu().double().numpy())
    if problem is not None:
        raise FedrcError(f"{path}: {key}: {problem}")


def check_round(path: Path, value: Any, expect: Expected) -> int:
    """An integer in [0, rounds] that metrics.jsonl has reached."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or not 0 <= value <= expect.rounds:
        raise FedrcError(
            f"{path}: round: expected an integer in [0, {expect.rounds}] (the run's rounds), "
            f"got {value!r}"
        )
    if value > expect.logged:
        raise FedrcError(
            f"{path}: round {value}, but {expect.metrics} holds rounds 1..{expect.logged} "
            "only: the files do not belong together"
        )
    return value


PLAIN = (int, float, str, bool, dict, list)


def check_algorithm(path: Path, value: Any, reference: dict[str, Any]) -> dict[str, Any]:
    """The algorithm's state: the keys a fresh algorithm has, all of them (one left at its
    initial value would change the numbers silently), its tensors' shapes and kinds, and the
    exact type of the others (a generator's state, a mask, indices)."""
    if not isinstance(value, dict):
        raise FedrcError(f"{path}: algorithm: expected a mapping, got {_described(value)}")
    unknown = sorted(set(value) - set(reference), key=str)
    if unknown:
        raise FedrcError(
            f"{path}: algorithm: unknown keys {unknown} (this algorithm has {sorted(reference)})"
        )
    missing = sorted(set(reference) - set(value), key=str)
    if missing:
        raise FedrcError(
            f"{path}: algorithm.{missing[0]}: missing (the file was written by an older fedrc "
            "or edited; train the run again)"
        )
    for key, held in value.items():
        fresh = reference[key]
        if isinstance(fresh, torch.Tensor):
            floating = fresh.is_floating_point()
            check_tensor(
                path, f"algorithm.{key}", held, fresh.shape, "", floating, True, fresh.dtype
            )
            if key == "omega":
                check_omega(path, "algorithm.omega", held)
            continue
        kinds = (type(fresh), type(held))
        if type(fresh) in PLAIN and kinds[1] is not kinds[0] and kinds != (float, int):
            raise FedrcError(
                f"{path}: algorithm.{key}: expected {type(fresh).__name__}, got {_described(held)}"
            )
    return value


def check_omega_history(
    path: Path, rounds: Any, history: Any, last: int, omega: tuple[int, ...]
) -> tuple[list[int], list[torch.Tensor]]:
    """The evaluated rounds (increasing, in [1, last]) and an ω table for each."""
    if not isinstance(rounds, list | tuple) or not all(
        isinstance(r, int) and not isinstance(r, bool) for r in rounds
    ):
        raise FedrcError(
            f"{path}: eval_rounds: expected a list of rounds, got {_described(rounds)}"
        )
    if list(rounds) != sorted(set(rounds)) or (rounds and not 1 <= rounds[0] <= rounds[-1] <= last):
        raise FedrcError(
            f"{path}: eval_rounds: expected increasing rounds in [1, {last}], got "
            f"{list(rounds)[:8]}"
        )
    if not isinstance(history, list | tuple) or len(history) != len(rounds):
        count = len(history) if isinstance(history, list | tuple) else _described(history)
        raise FedrcError(
            f"{path}: omega_history: expected an ω table for each of the {len(rounds)} "
            f"evaluated rounds, got {count}"
        )
    for i, table in enumerate(history):
        check_tensor(path, f"omega_history[{i}]", table, omega, " (clients × K)")
        check_omega(path, f"omega_history[{i}]", table)
    return list(rounds), list(history)


@dataclass
class RunState:
    """Everything `--resume` needs to continue after `round` with the same numbers.

    The persistent SGD momentum, when the run keeps it, is too large for this file: it is the
    snapshot `momentum_snapshot(out, round)` beside it, and `momentum_present` says which
    (client, row) buffers that snapshot holds. Checkpoints of format 1 held the buffers
    themselves, as {client: {row: buffer}}: `legacy_momentum`.
    """

    round: int
    models: torch.Tensor
    algorithm: dict[str, Any]
    eval_rounds: list[int]
    omega_history: list[torch.Tensor]
    cached_logits: torch.Tensor | None
    rng: torch.Tensor | None = None  # torch's CPU generator (dropout); None before format 2
    momentum_present: torch.Tensor | None = None
    legacy_momentum: dict[int, dict[int, torch.Tensor]] | None = None

    def save(self, out: Path, identity: str, into: Path | None = None) -> None:
        """checkpoint.pt; then the momentum snapshots of earlier rounds are removed. With
        `into`, the bytes go there instead, for the caller to rename into place (and then
        `prune_momentum`) together with other files."""
        state = {
            "identity": identity,
            "round": self.round,
            "models": self.models.cpu(),
            "algorithm": self.algorithm,
            "eval_rounds": self.eval_rounds,
            "omega_history": self.omega_history,
            "cached_logits": None if self.cached_logits is None else self.cached_logits.cpu(),
            "rng": self.rng,
            "momentum_present": self.momentum_present,
        }
        if into is not None:
            into.write_bytes(sealed(state))
            return
        save_state(out / CHECKPOINT, state)
        prune_momentum(out, self.round)

    @classmethod
    def load(cls, path: Path, expect: Expected | None = None) -> RunState:
        """The checkpoint at `path`; with `expect`, every field is checked against the run
        first (a FedrcError naming the file and the field), so nothing is touched for a bad one."""
        state = load_state(path)
        try:
            legacy = state["momentum"] if state["format"] == 1 else None
            loaded = cls(
                round=state["round"] if expect is not None else int(state["round"]),
                models=state["models"],
                algorithm=state["algorithm"],
                eval_rounds=state["eval_rounds"],
                omega_history=state["omega_history"],
                cached_logits=state["cached_logits"],
                rng=state.get("rng"),
                momentum_present=state.get("momentum_present"),
                legacy_momentum=legacy or None,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise FedrcError(f"{path}: not a fedrc checkpoint (lacks {e})") from None
        if expect is None:
            loaded.eval_rounds, loaded.omega_history = (
                list(loaded.eval_rounds),
                list(loaded.omega_history),
            )
            return loaded
        loaded.check(path, expect)
        return loaded

    def check(self, path: Path, expect: Expected) -> None:
        self.round = check_round(path, self.round, expect)
        what = " (rows × parameters of the configured model)"
        check_tensor(path, "models", self.models, expect.models, what, dtype=expect.dtype)
        check_algorithm(path, self.algorithm, expect.algorithm)
        self.eval_rounds, self.omega_history = check_omega_history(
            path, self.eval_rounds, self.omega_history, self.round, expect.omega
        )
        if self.cached_logits is not None and expect.logits is not None:
            what = " (rows × samples × classes)"
            logits = self.cached_logits
            check_tensor(path, "cached_logits", logits, expect.logits, what, dtype=expect.dtype)
        if self.rng is not None:
            rng = torch.get_rng_state()
            check_tensor(path, "rng", self.rng, rng.shape, " (torch's RNG state)", False)
            if self.rng.dtype != rng.dtype:
                raise FedrcError(
                    f"{path}: rng: expected a uint8 tensor, got {_described(self.rng)}"
                )
            try:
                torch.Generator().set_state(self.rng)  # what --resume will do with it
            except RuntimeError:
                raise FedrcError(
                    f"{path}: rng: not a state of torch's generator (edited or damaged)"
                ) from None


def check_model(path: Path, state: dict[str, Any], expect: Expected) -> None:
    """model.pt's fields against the run it is scored for (`fedrc eval`)."""
    for key in ("round", "models", "omega", "algorithm"):
        if key not in state:
            raise FedrcError(f"{path}: not a fedrc model file (lacks {key!r})")
    check_round(path, state["round"], expect)
    what = " (rows × parameters of the configured model)"
    # NaN weights: scoring them says "non-finite logits — the models diverged"
    models = state["models"]
    check_tensor(path, "models", models, expect.models, what, finite=False, dtype=expect.dtype)
    check_tensor(path, "omega", state["omega"], expect.omega, " (clients × K)")
    check_omega(path, "omega", state["omega"])
    check_algorithm(path, state["algorithm"], expect.algorithm)


def save_model(
    out: Path,
    identity: str,
    rounds: int,
    algorithm_name: str,
    models: torch.Tensor,
    omega: torch.Tensor,
    algorithm_state: dict[str, Any],
) -> None:
    """The final models, ω and algorithm state: what eval and plot read."""
    save_state(
        out / MODEL,
        {
            "identity": identity,
            "round": rounds,
            "algorithm_name": algorithm_name,
            "models": models.cpu(),
            "omega": omega,
            "algorithm": algorithm_state,
        },
    )
