"""The results folder of `benchmarks/gpu_check.sh`: what a GPU session keeps, small enough to
commit, and the state that lets a later session (`--continue`) pick up where one stopped.

RESULTS/
  state.json            which steps are done or failed, the time spent, what was measured
  sessions.md           one line per invocation: machine, seconds, what it did
  cuda-tests.txt, speed.md   the output of the tests marked cuda and of the speed rows
  data/federated/manifest.json   the benchmark every run trained on (the report's cluster maps)
  runs/<algorithm>-s<seed>/      config.json, metrics.jsonl, assignments.parquet, eval.json,
                                 eval_clients.json and model.sha256 (model.pt stays behind)
  report/               `fedrc report runs`: report.md, .csv, .tex, report.png, curves.png
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pipeline.common.errors import FedrcError
from pipeline.common.io import atomic_file
from pipeline.run.derived import EVAL, EVAL_CLIENTS, keep_model_digest
from pipeline.run.files import ASSIGNMENTS, CONFIG, METRICS

STATE = "state.json"
FORMAT = 1
KEPT = (CONFIG, METRICS, ASSIGNMENTS, EVAL, EVAL_CLIENTS)  # a run's files that are kept


@dataclass
class State:
    """What `--continue` needs. `plan` is the matrix's identity: a later invocation with other
    sizes, seeds or device is refused rather than mixed into the same table."""

    plan: dict[str, Any]
    budget_s: float
    spent_s: float = 0.0
    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # step → why it was given up
    tries: dict[str, int] = field(default_factory=dict)  # step → attempts that did not finish
    arrangement: dict[str, Any] | None = None  # concurrent trials, decided from measurements
    seconds_per_round: dict[str, float] = field(default_factory=dict)  # per algorithm, measured
    checkpoint_s: float | None = None  # the longest checkpoint write seen

    def left_s(self) -> float:
        return self.budget_s - self.spent_s

    def settled(self, step: str) -> bool:
        return step in self.done or step in self.failed


TYPES = {"plan": dict, "budget_s": (int, float), "spent_s": (int, float), "done": list}
TYPES |= {"failed": dict, "tries": dict, "seconds_per_round": dict}


def read_state(results: Path) -> State:
    """state.json, checked before it is trusted: a one-line FedrcError naming the file."""
    path = results / STATE
    if not path.is_file():
        raise FedrcError(f"--results: {path} not found (start without --continue)")
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FedrcError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        raise FedrcError(f"{path}: not a gpu_check state of format {FORMAT}")
    names = [f.name for f in fields(State)]
    wrong = [k for k in names if k in TYPES and not isinstance(value.get(k), TYPES[k])]
    wrong += sorted(set(value) - {*names, "format"})
    if wrong:
        raise FedrcError(f"{path}: unexpected or missing field {wrong[0]!r}")
    return State(**{k: v for k, v in value.items() if k != "format"})


def write_state(results: Path, state: State) -> None:
    with atomic_file(results / STATE) as tmp:
        tmp.write_text(json.dumps({"format": FORMAT, **asdict(state)}, indent=1) + "\n")


def add_text(results: Path, name: str, text: str) -> None:
    """Append to a text file of the results folder (written whole, atomically)."""
    path = results / name
    old = path.read_text() if path.is_file() else ""
    with atomic_file(path) as tmp:
        tmp.write_text(old + text)


def keep_run(run: Path, results: Path) -> None:
    """Copy a finished, evaluated run's small files to RESULTS/runs/<name>/ (replacing an
    older copy) with model.sha256 in place of model.pt."""
    missing = [n for n in (CONFIG, METRICS, ASSIGNMENTS, EVAL) if not (run / n).is_file()]
    if missing:
        raise FedrcError(f"{run}: no {missing[0]} (not a finished, evaluated run)")
    target = results / "runs" / run.name
    partial = target.with_name(f".{run.name}.tmp-keep")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in KEPT:
        if (run / name).is_file():
            shutil.copyfile(run / name, partial / name)
    keep_model_digest(run, partial)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)


# What makes two partitions the same benchmark. The shards' bytes, and so `files` and
# `content_hash`, change with pyarrow's version, and `config` gains fields as fedrc does.
BENCHMARK_FIELDS = (
    "dataset", "image_shape", "num_classes", "concepts", "num_participating", "time_steps",
    "clients", "client_mix", "seed",
)  # fmt: skip


def same_benchmark(kept: Path, made: Path) -> bool:
    """Whether the manifest `made` now describes the benchmark `kept` records: the same
    clients with the same concepts, styles and label histograms, from the same seed."""
    old, new = (json.loads(p.read_text(encoding="utf-8")) for p in (kept, made))
    return all(old.get(key) == new.get(key) for key in BENCHMARK_FIELDS)


def keep_manifest(data: Path, results: Path) -> None:
    """The benchmark's manifest in the results, unless one is kept there already: the runs
    kept were trained on that one's files."""
    target = results / "data" / "federated" / "manifest.json"
    if target.is_file():
        return
    with atomic_file(target) as tmp:
        shutil.copyfile(data / "manifest.json", tmp)


def pack(results: Path, since: float, archive: Path) -> int:
    """A .tar.gz of the results files changed since `since` (a time stamp), their paths under
    the results folder's own name; unpacked over the results folder in order, the pieces of
    successive invocations rebuild it. Returns the number of files packed."""
    changed = sorted(
        p for p in results.rglob("*")
        if p.is_file() and p.stat().st_mtime >= since and ".tmp-" not in p.name
    )  # fmt: skip
    with atomic_file(archive) as tmp, tarfile.open(tmp, "w:gz") as tar:
        for path in changed:
            tar.add(path, arcname=str(Path(results.name) / path.relative_to(results)))
    return len(changed)
