"""What each point of a sweep needs, from what its folder holds and the sweep's record.

`<sweep>/sweep.json` records, for each point the sweep made, the key of the run its folder
holds (`pipeline.run.code.run_key`: configuration, code and benchmark) and the keys of what eval
and plot made of it (their settings and code). A point whose folder holds a finished run of
its key is kept; one stopped at a checkpoint resumes; a run of another key (settings, plugin
or fedrc changed since) is retrained only with `replace`, else the sweep stops before it
starts. The record is written by the planning process alone, before any point runs, and a key
changes only once the folder no longer holds a run: it never vouches for a run it did not see
made.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.common.errors import FedrcError, first_few
from pipeline.common.io import write_json
from pipeline.common.sources import files_digest
from pipeline.config import EvalConfig, PlotConfig, config_dict
from pipeline.data.records import MANIFEST, read_manifest
from pipeline.data.shards import data_digest
from pipeline.run import files as rf
from pipeline.run.code import run_code, run_key
from pipeline.run.derived import EVAL, EVAL_CLIENTS, PLOTS
from pipeline.run.folder import clear_run, foreign_names
from pipeline.sweep.grid import Point

RECORD = "sweep.json"


@dataclass(frozen=True)
class Step:
    """A point and what it needs: `train` (fresh), `resume` (from its checkpoint), then eval
    and plot where they are missing; nothing when it is complete."""

    point: Point
    eval: EvalConfig
    plot: PlotConfig | None  # None: the sweep draws no plots
    train: bool = False
    resume: bool = False

    @property
    def folder(self) -> Path:
        return Path(self.point.config.out)

    @property
    def complete(self) -> bool:
        """Nothing to run: the run finished and its eval (and plots) are there."""
        derived = (self.folder / EVAL).is_file() and (
            self.plot is None or (self.folder / PLOTS).is_dir()
        )
        return not self.train and not self.resume and derived


def refuse_other(folder: Path) -> None:
    """A benchmark or a run folder is not a sweep's folder (its points would go inside)."""
    if (folder / MANIFEST).is_file() or (folder / rf.CONFIG).is_file():
        what = "a fedrc benchmark" if (folder / MANIFEST).is_file() else "a run"
        raise FedrcError(f"--out: {folder} holds {what}, not a sweep; choose another --out")


def read_record(folder: Path) -> dict[str, Any]:
    path = folder / RECORD
    if not path.is_file():
        return {"points": {}}
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not isinstance(record.get("points"), dict):
            raise ValueError("no points")
    except (ValueError, OSError) as e:
        raise FedrcError(f"{path}: not a fedrc sweep record ({e}); move it away") from None
    return record


def plan(
    points: list[Point],
    folder: Path,
    eval_config: EvalConfig,
    plot_config: PlotConfig | None,
    replace: bool,
) -> list[Step]:
    """Each point's step; the record written for the points about to run. With `replace`,
    a point trained under another key is cleared first, and the folders of points the record
    holds but the grid no longer has are removed."""
    refuse_other(folder)
    record = read_record(folder)
    known: dict[str, dict[str, str]] = record["points"]
    key = Keys()
    keys = {p.name: key(p) for p in points}
    derived = derived_keys(eval_config, plot_config)
    changed = [p.name for p in points if _holds_other(p, known.get(p.name), keys[p.name])]
    if changed and not replace:
        raise FedrcError(
            f"--out: {folder}: {len(changed)} point(s) hold a run of other settings or code "
            f"({first_few(changed)}); pass --replace to train them again, or choose another --out"
        )
    for name in changed:
        _clear(folder / name)
    steps = []
    for point in points:
        known[point.name] = _derived_kept(point, known.get(point.name, {}), derived)
        known[point.name]["run"] = keys[point.name]
        plot = None if plot_config is None else _for(plot_config, point)
        steps.append(Step(point, _for(eval_config, point), plot, *_needs(point)))
    if replace:
        _prune(folder, known, {p.name for p in points})
    write_json(folder / RECORD, {"points": known})
    return steps


def _holds_other(point: Point, entry: dict[str, str] | None, key: str) -> bool:
    """Whether the point's folder holds a run that is not of `key` (or of no known key)."""
    folder = Path(point.config.out)
    present = [p for p in rf.train_outputs(folder) if p.exists()]
    if not present:
        return False
    if entry is None or entry.get("run") != key:
        return True
    return _unfinishable(folder, point)


def _unfinishable(folder: Path, point: Point) -> bool:
    """A run of the key that cannot become the point: more rounds than it asks for, or fewer
    with no checkpoint to extend from."""
    rounds = _recorded_rounds(folder)
    if rounds is None or rounds == point.config.rounds:
        return False
    return rounds > point.config.rounds or not (folder / rf.CHECKPOINT).is_file()


def _needs(point: Point) -> tuple[bool, bool]:
    """(train afresh, resume): neither for a finished run of the point's rounds."""
    folder = Path(point.config.out)
    if (folder / rf.MODEL).is_file() and _recorded_rounds(folder) == point.config.rounds:
        return False, False
    resume = (folder / rf.CHECKPOINT).is_file()
    return not resume, resume


def _for(config: Any, point: Point) -> Any:
    return dataclasses.replace(config, run=point.config.out)


def _recorded_rounds(folder: Path) -> int | None:
    try:
        rounds = json.loads((folder / rf.CONFIG).read_text()).get("rounds")
    except (OSError, ValueError, AttributeError):
        return None
    return rounds if isinstance(rounds, int) else None


def _clear(folder: Path) -> None:
    """A point's folder emptied of its run (and what was derived from it), or refused when it
    holds files fedrc did not write."""
    if folder.is_dir():
        foreign = foreign_names(folder)
        if foreign:
            raise FedrcError(
                f"--replace: {folder} holds files that are not a fedrc run "
                f"({first_few(foreign)}); move them out first"
            )
        clear_run(folder)


def _prune(folder: Path, known: dict[str, dict[str, str]], wanted: set[str]) -> None:
    """The folders of points no longer in the grid, removed (the record made them)."""
    for name in sorted(set(known) - wanted):
        _clear(folder / name)
        shutil.rmtree(folder / name, ignore_errors=True)
        del known[name]


class Keys:
    """Each point's run key (`run_key`), the code and benchmark digests computed once per
    algorithm and model, and per benchmark, in one planning."""

    def __init__(self) -> None:
        self.code: dict[tuple[str, str], dict[str, str]] = {}
        self.data: dict[str, str] = {}

    def __call__(self, point: Point) -> str:
        config = point.config
        pair, data = (config.algorithm, config.model), str(Path(config.data).resolve())
        if pair not in self.code:
            self.code[pair] = run_code(config)
        if data not in self.data:
            self.data[data] = data_digest(read_manifest(Path(data), "train.data"))
        return run_key(config, self.code[pair], self.data[data])


def derived_keys(eval_config: EvalConfig, plot_config: PlotConfig | None) -> dict[str, str]:
    """What eval's and plot's outputs depend on besides the run: their settings (the run folder
    aside) and their code."""
    root = Path(__file__).resolve().parents[1]
    stages = files_digest([root / "stages.py"], root)
    keys = {"eval": _digest_of({**config_dict(eval_config), "run": None}, stages)}
    if plot_config is not None:
        outputs = files_digest(sorted((root / "outputs").rglob("*.py")), root)
        keys["plot"] = _digest_of({**config_dict(plot_config), "run": None}, stages + outputs)
    return keys


def _digest_of(settings: dict[str, Any], code: str) -> str:
    return hashlib.sha256((json.dumps(settings, sort_keys=True) + code).encode()).hexdigest()


def _derived_kept(point: Point, entry: dict[str, str], keys: dict[str, str]) -> dict[str, str]:
    """The point's eval and plots removed where they were made with other settings or code;
    the record's entry for them (a plot key stays while this sweep draws no plots)."""
    folder = Path(point.config.out)
    if entry.get("eval") != keys["eval"]:
        for name in (EVAL, EVAL_CLIENTS):
            (folder / name).unlink(missing_ok=True)
    if "plot" in keys and entry.get("plot") != keys["plot"]:
        shutil.rmtree(folder / PLOTS, ignore_errors=True)
    return {**entry, **keys}
