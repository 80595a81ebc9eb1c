"""In-loop evaluation of a training run: held-out pass rates through every harness of the mix.

A mix-harness run trains one policy through several harnesses, so its in-loop evaluation measures
each of them (a policy can improve through one harness and regress through another).

Invariants:
  * :func:`eval_harnesses` lists the harnesses to evaluate: the configured one, or every harness of
    the training mix with a positive ratio, in name order;
  * :func:`evaluate_harnesses` returns flat metrics: ``eval/<harness>/<metric>`` for each harness,
    plus ``eval/<metric>`` over all of them (episodes and passes summed; rates recomputed from the
    sums, never averaged over harnesses); infrastructure failures are excluded from the rates and
    counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainers.rollouts.sync import evaluate

METRICS = ("episodes", "passed", "pass_rate", "reward_mean", "infra_failures")


def eval_harnesses(configured: str | None, mix: dict[str, float]) -> list[str]:
    """The harnesses an in-loop evaluation runs through (see the module docstring)."""
    if configured:
        return [configured]
    return sorted(h for h, ratio in mix.items() if ratio > 0) or ["mini"]


def evaluate_harnesses(runtime, tasks: Sequence[Any], harnesses: Sequence[str], *, samples: int = 1,
                       sampling: dict[str, Any] | None = None, concurrency: int = 4,
                       pass_threshold: float = 1.0,
                       adapters: Mapping[str, Any] | None = None) -> dict[str, float | int | None]:
    """Evaluate ``tasks`` through each harness of ``harnesses`` (the run's own ``adapters`` by name, where given);
    flat ``eval/...`` metrics."""
    row: dict[str, float | int | None] = {}
    episodes = passed = infra = 0
    reward_sum = 0.0
    for harness in harnesses:
        ev = evaluate(runtime, tasks, harness, samples=samples, sampling=sampling, concurrency=concurrency,
                      pass_threshold=pass_threshold, adapter=(adapters or {}).get(harness))
        row.update({f"eval/{harness}/{k}": ev[k] for k in METRICS})
        episodes += ev["episodes"]
        passed += ev["passed"]
        infra += ev["infra_failures"]
        reward_sum += (ev["reward_mean"] or 0.0) * ev["episodes"]
    row.update({"eval/episodes": episodes, "eval/passed": passed, "eval/infra_failures": infra,
                "eval/pass_rate": passed / episodes if episodes else None,
                "eval/reward_mean": reward_sum / episodes if episodes else None})
    return row
