"""Rollouts for trainers: groups of episodes through one or several harnesses, and held-out evaluation.

:func:`collect_groups` runs ``group_size`` episodes of each (task, harness) job concurrently against
one :class:`~clawgym_env.runtime.Runtime` (one policy behind one proxy); :func:`harness_plan` splits
a step's groups between harnesses by their configured ratios; :func:`evaluate` measures a pass rate.

Invariants: results come back in job order, ``group_size`` consecutive results per job; an episode
that raises instead of returning a record (a programming or proxy error outside the episode
runner's own handling) becomes an ``infra_error`` record naming its failure boundary
(:func:`clawgym_env.runtime.failed_episode`), so one failed rollout never ends a training run; only
task outcomes are trained or scored: records with ``is_infra_failure`` (``infra_error`` and
``reward_invalid``) are excluded from :func:`evaluate`'s rates and counted; a harness whose pinned
package is not installed is left out of the plan with a warning (``mini`` needs no install).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from clawgym_env.episode import EpisodeResult
from clawgym_env.errors import HarnessError
from clawgym_env.plugins import harnesses, make_harness
from clawgym_env.policy.base import SamplingOverrides
from clawgym_env.runtime import failed_episode
from clawgym_env.task import Task

log = logging.getLogger(__name__)


def harness_available(name: str) -> tuple[bool, str]:
    """(usable, reason): a harness with a pinned npm package must have it installed."""

    key = name.replace("_", "-").lower()
    if key not in harnesses:
        return False, f"unknown harness {name!r}"
    why = make_harness(key).missing()
    return why is None, why or ""


def harness_plan(ratios: dict[str, float], groups: int) -> dict[str, int]:
    """Split ``groups`` groups between the available harnesses in proportion to ``ratios``.

    Largest-remainder rounding, ties broken by name (deterministic). Unavailable harnesses are
    dropped with a warning; at least one must remain.
    """
    usable = {}
    for name, ratio in ratios.items():
        if ratio <= 0:
            continue
        ok, why = harness_available(name)
        if ok:
            usable[name] = float(ratio)
        else:
            log.warning("harness %s left out of the mix: %s", name, why)
    if not usable:
        raise HarnessError(f"no usable harness among {sorted(ratios)}; install one (`clawgym harness install NAME`) "
                           "or use mini")
    total = sum(usable.values())
    exact = {h: groups * r / total for h, r in usable.items()}
    plan = {h: int(v) for h, v in exact.items()}
    order = sorted(usable, key=lambda h: (-round(exact[h] - plan[h], 9), h))
    for h in order[: groups - sum(plan.values())]:
        plan[h] += 1
    return {h: n for h, n in plan.items() if n > 0}


def _failed(task: Task, harness: str, policy: str, exc: BaseException) -> EpisodeResult:
    return failed_episode(task, harness, policy, exc)


def judge_for(tasks: Sequence[Task]) -> Any:
    """The environment-configured LLM judge when any of ``tasks`` is graded by one, built now so that a
    missing configuration fails before the first rollout (naming the ``CLAWGYM_JUDGE_*`` variables)
    instead of turning every judged episode into ``reward_invalid``; ``None`` when no task needs one."""
    from clawgym_env.grading import needs_judge

    if not any(needs_judge(t) for t in tasks):
        return None
    from tasks.graders import env_judge

    return env_judge()


def run_jobs(runtime, jobs: Sequence[tuple[Task, str]], *, group_size: int = 1,
             sampling: SamplingOverrides | Mapping[str, Any] | None = None,
             policy_version: int | None = None, concurrency: int = 4, progress: Any = None,
             adapters: dict[str, Any] | None = None, judge: Any = None) -> list[EpisodeResult]:
    """Run ``group_size`` episodes of each ``(task, harness)`` job; results in job order.

    ``progress``: an optional callable ``progress(result)`` called as each episode finishes.
    ``judge``: the LLM judge for tasks graded by one (None: the runtime's, else the environment's).
    """
    adapters = dict(adapters or {})
    sampling = SamplingOverrides.of(sampling)
    for _, h in jobs:
        if h not in adapters:
            adapters[h] = make_harness(h)
    flat = [(t, h) for t, h in jobs for _ in range(group_size)]
    out: list[EpisodeResult | None] = [None] * len(flat)
    policy_name = getattr(runtime.policy, "name", "policy")
    extra = {"judge": judge} if judge is not None else {}
    with cf.ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futs = {pool.submit(runtime.run, t, adapters[h], sampling=sampling,
                            policy_version=policy_version, **extra): i for i, (t, h) in enumerate(flat)}
        for fut in cf.as_completed(futs):
            i = futs[fut]
            try:
                out[i] = fut.result()
            except Exception as exc:  # noqa: BLE001 - a failed rollout is a record, not a crash
                log.warning("episode of %s through %s raised: %s", flat[i][0].id, flat[i][1], exc)
                out[i] = _failed(flat[i][0], flat[i][1], policy_name, exc)
            if progress is not None:
                progress(out[i])
    return [r for r in out if r is not None]


def evaluate(runtime, tasks: Sequence[Task], harness: str = "mini", *, samples: int = 1,
             sampling: SamplingOverrides | Mapping[str, Any] | None = None, concurrency: int = 4,
             pass_threshold: float = 1.0,
             progress: Any = None) -> dict[str, Any]:
    """Pass rate of the runtime's policy on ``tasks`` (``samples`` episodes each).

    Returns ``{"episodes", "passed", "pass_rate", "reward_mean", "infra_failures", "results"}``;
    infrastructure failures are excluded from ``episodes`` and the rates, and counted.
    """
    results = run_jobs(runtime, [(t, harness) for t in tasks], group_size=samples, sampling=sampling,
                       concurrency=concurrency, progress=progress)
    scored = [r.record for r in results if r.record.is_task_outcome]
    passed = sum(r.reward >= pass_threshold for r in scored)
    return {"episodes": len(scored), "passed": passed, "pass_rate": passed / len(scored) if scored else None,
            "reward_mean": sum(r.reward for r in scored) / len(scored) if scored else None,
            "infra_failures": len(results) - len(scored), "results": results}
