"""A step's (task, harness) jobs: one seeded draw per step, shared by the RL loops (GRPO's groups, PPO's tasks).

Invariants:

* the draw depends only on (``seed``, ``step``, ``refill``, the jobs ``drawn`` before it in the step), so a
  resumed run draws what the uninterrupted one would have;
* the ``n`` jobs are split between the harnesses by ratio (:func:`trainers.rollouts.sync.harness_plan`);
* **without replacement within a step.** A step's first draw (``drawn`` empty) repeats no task within one
  harness's share until the suite is exhausted; only then is it drawn again, without replacement, for the rest
  (the repeats of a task collect into ONE larger group: the trainer groups rollouts by (suite, task, harness),
  and a warning says so). A refill draw (dynamic sampling, ``refill > 0``) excludes every (task, harness) in
  ``drawn`` (the jobs drawn earlier in the step) and never wraps: when fewer undrawn tasks are left than asked
  for it returns those it has (possibly none) and logs a warning naming the suite's size. So the groups of one
  step never share a key (two groups of one key would train one task twice, and async
  ``stale: regenerate`` could rebuild only one of them, leaving the other ``all_stale``).

Tasks are matched to ``drawn`` by identity: pass the same task objects the step drew from.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import TypeVar

from clawgym_env.harness import HarnessAdapter
from trainers.rollouts.sync import harness_plan

T = TypeVar("T")

__all__ = ["draw_jobs"]

log = logging.getLogger(__name__)


def draw_jobs(tasks: Sequence[T], step: int, *, harnesses: dict[str, float], n: int, seed: int,
              refill: int = 0, drawn: Sequence[tuple[T, str]] = (),
              adapters: Mapping[str, HarnessAdapter] | None = None) -> list[tuple[T, str]]:
    """``n`` (task, harness) jobs of ``step`` (fewer on a refill that runs out of tasks; module docstring);
    ``refill`` > 0 numbers an extra round of the same step (a fresh draw of its own, for dynamic sampling) and
    ``drawn`` lists the jobs the step drew before it, which it does not draw again; ``adapters`` (the run's own, by
    name) say whether their harness is installed."""
    base = seed * 1_000_003 + step
    rng = random.Random(base if refill == 0 else base * 1_009 + refill)
    jobs: list[tuple[T, str]] = []
    for harness, count in sorted(harness_plan(harnesses, n, adapters=adapters).items()):
        taken = {id(t) for t, h in drawn if h == harness}
        pool = [t for t in tasks if id(t) not in taken] if taken else list(tasks)
        picks: list[T] = []
        if refill == 0 and not taken:
            while len(picks) < count and pool:
                picks += rng.sample(pool, min(len(pool), count - len(picks)))
            if count > len(pool):
                log.warning("step %d: %d %s groups asked of a suite of %d tasks: some tasks are drawn twice and "
                            "their rollouts form one larger group", step, count, harness, len(pool))
        else:
            picks = rng.sample(pool, min(len(pool), count))
            if len(picks) < count:
                log.warning("step %d: refill %d asked for %d more %s groups but only %d tasks are undrawn this "
                            "step (the suite has %d tasks); drawing %d, never a task twice in one step",
                            step, refill, count, harness, len(pool), len(tasks), len(picks))
        jobs += [(t, harness) for t in picks]
    return jobs
