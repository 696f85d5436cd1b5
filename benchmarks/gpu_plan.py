"""The matrix of `benchmarks/gpu_check.py` under the fair protocol (docs/reproducing.md): every
algorithm of the FedRC paper's Table 1 at every learning rate of the paper's grid, with seeds
0, 1, 2, and beside each baseline whose release departs from its paper the same runs as released
(`--profile released`); and the order that makes each GPU session add the most.

The order, recomputed whenever a trial finishes:
  1. the first seed, every algorithm and variant at every lr, lr by lr in the order given
     (`--lrs`: the authors' scripts' 0.06 first), correct before released;
  2. the other seeds at the lr that the first seed picked for that algorithm and variant (the
     best train accuracy at the best-train round, the paper's rule) once all its lrs are in;
  3. the other seeds at the other lrs (so that the pick can be made on the mean over seeds).
A run too long for one command (FedSoft at paper scale: a session each) waits until every
other trial is done, then follows the same order.

Plan versions. The first plan had no lr grid: its trials `<algorithm>-s<seed>` ran the lr of
`experiments/fmnist/params.yaml`, 0.1 for every algorithm, and are this plan's correct trials at
lr 0.1; `--continue` on such a state takes them as they are (`upgrade`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.gpu_trials import LEGACY_LR, Trial
from pipeline.algorithms import BUILT_IN
from pipeline.common.errors import FedrcError

LRS = (0.06, 0.1, 0.03, 0.01)  # the paper's grid, in the order the first seed runs it
VERSION = 2
OVERHEAD_S = 100.0  # a trial's start-up, evaluation and copies (sessions.md: IFCA's 237 s
# command trained 200 × 0.62 s, the rest was 113 s)


def has_released(algorithm: str) -> bool:
    """Whether `--profile released` changes the algorithm (its authors' port departs)."""
    settings = BUILT_IN[algorithm].Settings
    return bool(getattr(settings, "released", None)) and "released" in settings.profiles


def grid(
    algorithms: list[str], seeds: list[int], lrs: list[float], released: bool, finetuned: set[str]
) -> list[Trial]:
    """Every trial of the plan, in no particular order; the correct runs of `finetuned` are
    also scored fine-tuned (FedRC-FT)."""
    variants = [False, True] if released else [False]
    return [
        Trial(a, s, a in finetuned and not r, lr=lr, released=r)
        for s in seeds
        for lr in lrs
        for r in variants
        for a in algorithms
        if not r or has_released(a)
    ]


def plan_of(values: dict[str, Any], lrs: list[float], released: bool) -> dict[str, Any]:
    """The plan's identity in state.json: the first plan's keys, the version, lrs, variants."""
    return {**values, "version": VERSION, "lrs": lrs, "released": released}


def upgrade(old: dict[str, Any], new: dict[str, Any], runs: Path) -> bool:
    """Whether a first-plan state (no lr grid) continues as `new`: the same sizes, seeds and
    algorithms, and each of its kept runs trained at `LEGACY_LR`."""
    if "version" in old or {k: new.get(k) for k in old} != old:
        return False
    for config in sorted(runs.glob("*/config.json")):
        lr = json.loads(config.read_text()).get("lr")
        if lr != LEGACY_LR:
            raise FedrcError(f"{config}: lr {lr}, not the first plan's {LEGACY_LR}")
    return True


def train_accuracy(run: Path) -> float | None:
    """The run's train accuracy at its best-train round (eval.json), None without one."""
    path = run / "eval.json"
    return json.loads(path.read_text()).get("train_accuracy") if path.is_file() else None


def picks(
    trials: Iterable[Trial], settled: set[str], runs: Path, first_seed: int
) -> dict[tuple[str, bool], float]:
    """(algorithm, released) → the lr whose first-seed run had the best train accuracy, for
    those whose first-seed runs are all settled (done or given up) and one is kept."""
    by_variant: dict[tuple[str, bool], list[Trial]] = {}
    for t in trials:
        if t.seed == first_seed:
            by_variant.setdefault((t.algorithm, t.released), []).append(t)
    chosen = {}
    for key, group in by_variant.items():
        if not all(t.name in settled or t.legacy in settled for t in group):
            continue
        scored = [(train_accuracy(runs / t.kept_name(settled)), t.lr) for t in group]
        scored = [(acc, lr) for acc, lr in scored if acc is not None]
        if scored:
            chosen[key] = max(scored)[1]
    return chosen


def priority(
    trial: Trial,
    chosen: dict[tuple[str, bool], float],
    first_seed: int,
    lrs: list[float],
    order: list[str],
    slow: set[str],
) -> tuple:
    """The sort key of the module docstring's order."""
    if trial.seed == first_seed:
        part = 0
    elif chosen.get((trial.algorithm, trial.released)) == trial.lr:
        part = 1
    else:
        part = 2
    return (
        trial.algorithm in slow,
        part,
        trial.seed,
        lrs.index(trial.lr),
        trial.released,
        order.index(trial.algorithm),
    )


def seconds_per_round(state: dict[str, float], runs: Path) -> dict[str, float]:
    """Per algorithm: the state's measurement, else the median `seconds` of its kept runs'
    metrics.jsonl (the runs time each round themselves)."""
    measured = dict(state)
    for metrics in sorted(runs.glob("*/metrics.jsonl")):
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        config = json.loads((metrics.parent / "config.json").read_text())
        seconds = [r["seconds"] for r in rows if "seconds" in r]
        if seconds and config["algorithm"] not in measured:
            measured[config["algorithm"]] = statistics.median(seconds)
    return measured


def estimate_s(trial: Trial, rounds: int, spr: dict[str, float]) -> float | None:
    """Seconds a trial takes: its rounds at the measured pace, plus `OVERHEAD_S`."""
    pace = spr.get(trial.algorithm)
    return None if pace is None else rounds * pace + OVERHEAD_S
