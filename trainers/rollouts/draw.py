"""A step's (task, harness) jobs: one seeded draw per step, shared by the RL loops (GRPO's groups, PPO's tasks).

Invariants: the draw depends only on (``seed``, ``step``, ``refill``), so a resumed run draws what the
uninterrupted one would have; the ``n`` jobs are split between the harnesses by ratio
(:func:`trainers.rollouts.sync.harness_plan`); within one harness's share no task repeats until the suite is
exhausted (then it is drawn again, without replacement, for the rest).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from trainers.rollouts.sync import harness_plan

T = TypeVar("T")

__all__ = ["draw_jobs"]


def draw_jobs(tasks: Sequence[T], step: int, *, harnesses: dict[str, float], n: int, seed: int,
              refill: int = 0) -> list[tuple[T, str]]:
    """``n`` (task, harness) jobs of ``step``; ``refill`` > 0 numbers an extra round of the same step (a fresh
    draw of its own, for dynamic sampling)."""
    base = seed * 1_000_003 + step
    rng = random.Random(base if refill == 0 else base * 1_009 + refill)
    jobs: list[tuple[T, str]] = []
    for harness, count in sorted(harness_plan(harnesses, n).items()):
        picks: list[T] = []
        while len(picks) < count:
            picks += rng.sample(list(tasks), min(len(tasks), count - len(picks)))
        jobs += [(t, harness) for t in picks]
    return jobs
