"""The next-step accuracy of an oracle on FedDrift's change points A: it knows every client's
concept at step t and has a perfect model of it, and is scored on step t + 1's data.

A client that keeps its concept scores 1; one that drifts at t + 1 scores the share of samples
on which its old and new concepts agree. No algorithm that trains at step t and is scored at
t + 1 can beat it, so it is the ceiling of the table in docs/authors-check.md. Run from the
repository root: `python experiments/streams/ceiling.py`.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from pipeline.data.drift import preset_schedule
from pipeline.data.loaders.streams import load_stream

STREAMS = ("sine", "circle", "sea")
CLIENTS = 10


def agreement(stream: str, a: int, b: int) -> float:
    """The share of the stream's test pool that concepts a and b label alike."""
    data = load_stream(stream)
    rules = data.label_rules
    return float((rules[a](data.test_images) == rules[b](data.test_images)).mean())


def ceiling(agree: float, schedule: np.ndarray) -> float:
    """Mean over steps t = 0..T−2 and clients of the oracle's accuracy on step t + 1, for a
    two-concept schedule whose concepts agree on a share `agree` of the samples."""
    scores = [
        1.0 if old == new else agree
        for before, after in pairwise(schedule)
        for old, new in zip(before, after, strict=True)
    ]
    return float(np.mean(scores))


def main() -> None:
    schedule = preset_schedule("feddrift-a", CLIENTS)
    moves = int((schedule[1:] != schedule[:-1]).sum())
    print(f"feddrift-a, {CLIENTS} clients: {moves} of {schedule[1:].size} client-steps drift")
    for stream in STREAMS:
        agree = agreement(stream, 0, 1)
        top = ceiling(agree, schedule)
        print(f"{stream}: concepts 0 and 1 agree on {agree:.3f}; ceiling {top:.3f}")


if __name__ == "__main__":
    main()
