"""Concept drift over time: which concept each participating client holds at each time step.

A drift schedule is a (T, clients) matrix of concept indices (into the benchmark's concepts);
row 0 is the static benchmark's assignment, and a client whose entry changes between two rows
drifts there, to a concept it held before (recurring) or to a new one. Three ways to write it:

- `drift_share: F`: at every step after the first, a share F of the participating clients,
  drawn afresh, each moves to a uniformly drawn *other* concept;
- `drift: PRESET`: a schedule from the literature (`PRESETS`), defined for 10 client groups:
  client i follows column i mod 10, as FedCCFA groups its clients;
- `drift: [events]`: explicit events, each `{step: t, clients: [ids] | share: F, concept: NAME}`
  (without `concept`: each client moves to a uniformly drawn other concept); a client keeps its
  concept until an event moves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.common.errors import FedrcError

KEY = "partition.drift"


@dataclass(frozen=True)
class Preset:
    """A published schedule: `rows[t][g]` is the concept of client group g (client id mod 10)
    at step t."""

    summary: str
    rows: tuple[tuple[int, ...], ...]
    concepts_hint: str  # the concepts the paper pairs it with, for messages and docs

    @property
    def time_steps(self) -> int:
        return len(self.rows)

    @property
    def num_concepts(self) -> int:
        return 1 + max(max(row) for row in self.rows)


def _matrix(text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(v) for v in line.split()) for line in text.strip().splitlines())


def _fedccfa(steps: int, drifted: dict[int, tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """FedCCFA's groups (id mod 10): 0–2 take concept 1, 3–5 concept 2, 6–9 concept 3; `drifted`
    says which of the three groups have drifted at which step."""
    target = (1, 1, 1, 2, 2, 2, 3, 3, 3, 3)
    return tuple(
        tuple(target[g] if target[g] in drifted.get(t, ()) else 0 for g in range(10))
        for t in range(steps)
    )


SWAPS = "identity, swap:1-2, swap:3-4, swap:5-6"
PRESETS: dict[str, Preset] = {
    # microsoft/FedDrift data/changepoints/A.cp: staggered, clients drift back (2 concepts)
    "feddrift-a": Preset(
        "FedDrift's change points A: 11 steps, 2 concepts, staggered, some clients drift back",
        _matrix(
            """
            0 0 0 0 0 0 0 0 0 0
            0 1 0 0 0 0 0 0 0 0
            0 1 0 0 0 0 0 1 0 0
            0 1 1 1 0 1 0 1 0 0
            0 1 1 1 0 1 0 1 1 0
            1 0 1 1 0 1 1 0 1 0
            1 0 0 1 0 0 1 0 1 0
            1 0 0 0 1 0 1 0 1 1
            1 0 0 0 1 0 1 0 0 1
            1 0 0 0 1 0 1 0 0 1
            1 0 0 0 1 0 1 0 0 1
            """
        ),
        "identity, swap:1-2 (FedDrift's MNIST) or native:0, native:1 (SINE, CIRCLE, SEA)",
    ),
    # data/changepoints/B.cp: four concepts, staggered and recurring
    "feddrift-b": Preset(
        "FedDrift's change points B: 11 steps, 4 concepts, staggered and recurring",
        _matrix(
            """
            0 0 0 0 0 0 0 0 0 0
            1 1 1 0 0 0 0 0 0 0
            1 1 1 2 2 2 0 0 0 0
            2 2 1 2 2 2 2 1 0 0
            2 2 2 1 2 2 2 1 3 0
            2 3 2 1 2 3 3 1 3 0
            3 3 2 1 1 3 3 2 1 0
            3 0 3 3 1 3 3 2 1 3
            0 0 3 3 3 1 3 2 2 3
            0 0 0 3 3 1 1 3 2 2
            0 0 0 3 3 1 1 3 2 2
            """
        ),
        "identity, swap:1-2, swap:3-4, swap:5-6 (FedDrift's MNIST-4)",
    ),
    # data/changepoints/C.cp
    "feddrift-c": Preset(
        "FedDrift's change points C: 11 steps, 4 concepts, staggered and recurring",
        _matrix(
            """
            0 0 0 0 0 0 0 0 0 0
            1 1 1 2 2 2 0 0 0 0
            1 1 1 2 2 2 0 0 3 0
            2 2 1 1 2 2 2 1 3 0
            2 2 2 1 2 3 2 1 3 0
            2 3 2 1 1 3 3 1 3 0
            3 3 2 3 1 3 3 2 1 0
            3 0 3 3 3 1 3 2 1 3
            0 0 3 3 3 1 3 2 2 3
            0 0 0 3 3 1 1 3 2 2
            0 0 0 3 3 1 1 3 2 2
            """
        ),
        "identity, swap:1-2, swap:3-4, swap:5-6 (FedDrift's MNIST-4)",
    ),
    # FedCCFA utils/drift.py, 200 rounds: every client drifts at round 100
    "fedccfa-sudden": Preset(
        "FedCCFA's sudden drift: 2 steps, every client group swaps its label pair at step 1",
        _fedccfa(2, {1: (1, 2, 3)}),
        SWAPS,
    ),
    # drift at round 100, undone at round 150 (of 200): 4 steps of 50 rounds
    "fedccfa-recurrent": Preset(
        "FedCCFA's recurrent drift: 4 steps, the swaps at step 2 are undone at step 3",
        _fedccfa(4, {2: (1, 2, 3)}),
        SWAPS,
    ),
    # the three groups at rounds 100, 110, 120 (of 200): 20 steps of 10 rounds
    "fedccfa-incremental": Preset(
        "FedCCFA's incremental drift: 20 steps, the three groups swap at steps 10, 11, 12",
        _fedccfa(20, {t: (1, 2, 3)[: min(3, t - 9)] for t in range(10, 20)}),
        SWAPS,
    ),
}


def check_drift(
    drift: Any, drift_share: float, time_steps: int, clients: int, concepts: list[str]
) -> None:
    """Refuse a schedule that cannot be built, with one line naming the option."""
    if drift_share > 0 and drift is not None:
        raise FedrcError(f"{KEY}: give partition.drift or partition.drift_share, not both")
    if drift_share > 0 and time_steps < 2:
        raise FedrcError(
            f"partition.drift_share: drift needs partition.time_steps >= 2, got {time_steps}"
        )
    if drift is None:
        return
    if isinstance(drift, str):
        preset = PRESETS.get(drift)
        if preset is None:
            raise FedrcError(f"{KEY}: unknown preset {drift!r} (known: {', '.join(PRESETS)})")
        if time_steps not in (1, preset.time_steps):
            raise FedrcError(
                f"partition.time_steps: {drift} has {preset.time_steps} steps, got {time_steps} "
                "(leave time_steps at 1 or set it to the preset's)"
            )
        if preset.num_concepts > len(concepts):
            raise FedrcError(
                f"partition.concepts: {drift} uses {preset.num_concepts} concepts, got "
                f"{len(concepts)} (e.g. {preset.concepts_hint})"
            )
        return
    if not isinstance(drift, list) or not drift:
        raise FedrcError(f"{KEY}: expected a preset name or a non-empty list of events")
    if time_steps < 2:
        raise FedrcError(f"{KEY}: events need partition.time_steps >= 2, got {time_steps}")
    for n, event in enumerate(drift):
        _check_event(event, f"{KEY}[{n}]", time_steps, clients, concepts)


def _check_event(event: Any, where: str, steps: int, clients: int, concepts: list[str]) -> None:
    if not isinstance(event, dict):
        raise FedrcError(f"{where}: expected {{step, clients or share, concept}}, got {event!r}")
    unknown = set(event) - {"step", "clients", "share", "concept"}
    if unknown:
        raise FedrcError(
            f"{where}: unknown key {sorted(unknown)[0]!r} (known: step, clients, share, concept)"
        )
    step = event.get("step")
    if not (isinstance(step, int) and not isinstance(step, bool) and 1 <= step < steps):
        raise FedrcError(
            f"{where}.step: expected a step in 1..{steps - 1} (time_steps is {steps}), got {step!r}"
        )
    if ("clients" in event) == ("share" in event):
        raise FedrcError(f"{where}: give clients (a list of ids) or share (a number), not both")
    if "clients" in event:
        ids = event["clients"]
        ok = (
            isinstance(ids, list)
            and ids
            and all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < clients for i in ids
            )
        )
        if not ok:
            raise FedrcError(
                f"{where}.clients: expected participating client ids in 0..{clients - 1}, got "
                f"{ids!r}"
            )
    else:
        share = event["share"]
        ok = isinstance(share, (int, float)) and not isinstance(share, bool) and 0 <= share <= 1
        if not ok:
            raise FedrcError(f"{where}.share: expected a number in [0, 1], got {share!r}")
    if "concept" in event and event["concept"] not in concepts:
        raise FedrcError(
            f"{where}.concept: unknown concept {event['concept']!r} (known: {', '.join(concepts)})"
        )


def preset_schedule(name: str, clients: int) -> np.ndarray:
    """The preset's (T, clients) schedule: client i follows group i mod 10."""
    rows = np.asarray(PRESETS[name].rows, dtype=np.int64)
    return rows[:, np.arange(clients) % rows.shape[1]]


def build_schedule(
    drift: Any,
    drift_share: float,
    time_steps: int,
    start: np.ndarray,
    concepts: list[str],
    rng: np.random.Generator,
) -> np.ndarray:
    """The (T, clients) concept matrix; `start` is the static benchmark's concept per client
    (row 0 unless a preset fixes it)."""
    if isinstance(drift, str):
        return preset_schedule(drift, start.size)
    schedule = np.tile(start, (time_steps, 1))
    events = drift or []
    for t in range(1, time_steps):
        schedule[t] = schedule[t - 1]
        if drift_share > 0:
            _move(schedule[t], _draw(start.size, drift_share, rng), None, len(concepts), rng)
        for event in (e for e in events if e["step"] == t):
            who = event.get("clients") or _draw(start.size, event.get("share", 0), rng)
            to = concepts.index(event["concept"]) if "concept" in event else None
            _move(schedule[t], np.asarray(who, dtype=np.int64), to, len(concepts), rng)
    return schedule


def _draw(clients: int, share: float, rng: np.random.Generator) -> np.ndarray:
    return np.sort(rng.choice(clients, size=round(clients * share), replace=False))


def _move(
    row: np.ndarray, who: np.ndarray, to: int | None, num_concepts: int, rng: np.random.Generator
) -> None:
    """Clients `who` take concept `to`, or each a uniformly drawn concept other than its own."""
    if to is not None:
        row[who] = to
        return
    if num_concepts < 2:
        raise FedrcError(f"{KEY}: drift needs at least 2 concepts in partition.concepts")
    offset = rng.integers(1, num_concepts, size=who.size)
    row[who] = (row[who] + offset) % num_concepts


def drifted(schedule: np.ndarray, step: int) -> np.ndarray:
    """The clients whose concept at `step` differs from the step before (none at step 0)."""
    if step == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(schedule[step] != schedule[step - 1])
