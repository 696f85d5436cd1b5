"""Rounds over time steps: which step of a drifting benchmark a round trains on.

Rounds are dealt to the T steps in blocks of `rounds_per_step`; the last step takes whatever
rounds remain (a run extended with `--resume --rounds` trains on at the last step). A static
benchmark has one step, and every round is at step 0.
"""

from __future__ import annotations


def step_of(round_: int, rounds_per_step: int | None, time_steps: int) -> int:
    """The step round `round_` (1-based) trains on."""
    if time_steps == 1 or not rounds_per_step:
        return 0
    return min((round_ - 1) // rounds_per_step, time_steps - 1)


def ends_step(round_: int, rounds_per_step: int | None, time_steps: int) -> bool:
    """Whether `round_` is the last round of a step that another step follows."""
    step = step_of(round_, rounds_per_step, time_steps)
    return step < time_steps - 1 and step_of(round_ + 1, rounds_per_step, time_steps) > step


def step_rounds(
    step: int, rounds_per_step: int | None, rounds: int, time_steps: int
) -> tuple[int, int]:
    """The first and last round of `step` in a run of `rounds` rounds."""
    if time_steps == 1 or not rounds_per_step:
        return 1, rounds
    first = step * rounds_per_step + 1
    return first, rounds if step == time_steps - 1 else first + rounds_per_step - 1
