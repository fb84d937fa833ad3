"""The call's clock and how many steps a run gets from the time left and the step times measured.

Context-length's runs all take the same number of optimizer steps (and tokens per step), so every
context sees equal tokens: the steps are what fits when the runs' measured step times and their
fixed costs (start-up, build, the first step's compiles, checkpoint and final evaluation) are
summed. A Pathfinder run gets what is left when it starts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass


class Clock:
    """Seconds since the call started and until its budget ends (monotonic)."""

    def __init__(self, budget_s: float, now=time.monotonic):
        self.budget_s = float(budget_s)
        self._now = now
        self.start = now()

    def elapsed(self) -> float:
        return self._now() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def at(self, seconds_from_now: float) -> float:
        """The clock reading (elapsed seconds) that many seconds from now."""
        return self.elapsed() + seconds_from_now


@dataclass(frozen=True)
class RunCost:
    """A run shape's measured step time and its fixed costs, from the probe."""

    step_s: float  # a steady optimizer step
    fixed_s: float  # start-up, build, first-step extra and the end (checkpoint, final eval)

    def seconds(self, steps: int) -> float:
        return self.fixed_s + steps * self.step_s


def equal_steps(costs: Sequence[RunCost], seconds: float, cap: int | None = None) -> int:
    """The most steps that every run can take with all of them together inside `seconds`
    (0 when not even one fits)."""
    if not costs:
        raise ValueError("equal_steps needs at least one run's cost")
    spare = seconds - sum(c.fixed_s for c in costs)
    per_step = sum(c.step_s for c in costs)
    if per_step <= 0:
        raise ValueError(f"step times must be > 0 s, got {[c.step_s for c in costs]}")
    steps = max(0, math.floor(spare / per_step))
    return steps if cap is None else min(steps, cap)


def deadline_for(cost: RunCost, steps: int, slack: float = 0.25, floor_s: float = 10.0) -> float:
    """A run's time limit: its predicted seconds plus `slack` of them (and at least floor_s),
    so a run that is slower than measured is stopped before it takes the next run's time."""
    predicted = cost.seconds(steps)
    return predicted + max(floor_s, slack * predicted)


def above_chance(correct: int, total: int, chance: float = 0.5, sigmas: float = 3.0) -> bool:
    """Whether an accuracy of correct/total is above `chance` by more than `sigmas` binomial
    standard deviations (3: a 0.13% chance of a model at chance passing)."""
    if total <= 0:
        return False
    spread = math.sqrt(chance * (1 - chance) / total)
    return correct / total > chance + sigmas * spread
