"""Leaderboard metrics from result rows: Pass@1, strict success, unbiased Pass@k, bootstrap CIs.

Definitions (per group of rows, e.g. one suite × harness × policy, optionally one category):
  * rows are first reduced to one per key (the last one, :func:`leaderboards.schema.latest_by_key`);
  * rows without a task outcome (``infra_error``, ``reward_invalid``) are counted (``infra_failures``,
    split by status and by failure boundary in ``not_scored``) and otherwise ignored: they are not
    episodes of the task, so they never lower a mean;
  * per task with ``n`` valid samples of which ``c`` are strict successes (reward == 1):
    mean reward ``r̄``, success rate ``c / n`` and ``pass@k = 1 - C(n-c, k) / C(n, k)`` (the unbiased
    estimator of "at least one of k samples succeeds");
  * a group's Pass@1 (``pass1``) is the mean over tasks of ``r̄``, its strict success rate
    (``strict``) the mean over tasks of ``c / n`` — every task weighs the same, whatever its number
    of valid samples; Pass@k is reported for ``k <= min n`` over the group's tasks only;
  * confidence intervals are percentile bootstraps over *tasks* (resampled with replacement,
    ``n_boot`` times, from a seeded generator): the same rows and seed give the same interval;
  * a task whose every sample was an infrastructure failure has no valid sample: it is counted in
    ``tasks_without_valid_samples`` and left out of every mean.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
from pydantic import BaseModel, Field

from leaderboards.schema import ResultRow, latest_by_key

GROUP_FIELDS = ("suite", "harness", "policy")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from ``n`` samples with ``c`` successes: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k / i): numerically stable for large n
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def bootstrap_ci(values: Sequence[float], *, n_boot: int = 2000, seed: int = 0,
                 alpha: float = 0.05) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (one value per task)."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        return (math.nan, math.nan)
    if np.all(arr == arr[0]):  # every resample has the same mean
        return (float(arr[0]), float(arr[0]))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
    means = arr[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return (float(lo), float(hi))


class TaskStats(BaseModel):
    """One task's scored samples (infrastructure failures excluded): how many, how many fully solved,
    the mean reward. Invariant: ``n >= 1`` (a task with no valid sample gets no stats)."""

    task_id: str
    category: str | None = None
    n: int
    successes: int
    mean_reward: float

    @property
    def success_rate(self) -> float:
        """Share of the task's scored samples with full marks."""
        return self.successes / self.n


class GroupSummary(BaseModel):
    """Metrics of one group (``category`` None: all of the group's tasks)."""

    suite: str
    harness: str
    policy: str
    category: str | None = None
    tasks: int = 0
    episodes: int = 0
    infra_failures: int = 0
    tasks_without_valid_samples: int = 0
    not_scored: dict[str, int] = Field(
        default_factory=dict, description="rows without a task outcome, by 'status/boundary' (e.g. infra_error/policy)")
    pass1: float = math.nan
    pass1_ci: tuple[float, float] = (math.nan, math.nan)
    strict: float = math.nan
    strict_ci: tuple[float, float] = (math.nan, math.nan)
    pass_at_k: dict[int, float] = Field(default_factory=dict)
    min_samples: int = 0

    @property
    def label(self) -> str:
        """``policy · harness``, the row label in tables and charts."""
        return f"{self.policy} · {self.harness}"


def task_stats(rows: Iterable[ResultRow]) -> tuple[list[TaskStats], int, int]:
    """(per-task stats of the valid rows, infra-failure rows, tasks with only infra failures)."""
    by_task: dict[str, list[ResultRow]] = defaultdict(list)
    infra = 0
    for row in rows:
        by_task[row.task_id].append(row)
        infra += row.is_infra_failure
    stats, empty = [], 0
    for task_id, task_rows in by_task.items():
        valid = [r for r in task_rows if not r.is_infra_failure]
        if not valid:
            empty += 1
            continue
        stats.append(TaskStats(task_id=task_id, category=valid[0].category, n=len(valid),
                               successes=sum(r.success for r in valid),
                               mean_reward=sum(r.reward for r in valid) / len(valid)))
    return stats, infra, empty


def not_scored(rows: Iterable[ResultRow]) -> dict[str, int]:
    """Rows without a task outcome counted by ``status/boundary`` (boundary ``?`` when unknown)."""
    out: dict[str, int] = defaultdict(int)
    for row in rows:
        if not row.is_task_outcome:
            out[f"{row.status}/{row.failure_boundary or '?'}"] += 1
    return dict(sorted(out.items()))


def summarize_group(rows: Sequence[ResultRow], *, suite: str, harness: str, policy: str,
                    category: str | None = None, n_boot: int = 2000, seed: int = 0) -> GroupSummary:
    """Metrics of one group's rows (already deduplicated); see the module doc."""
    stats, infra, empty = task_stats(rows)
    out = GroupSummary(suite=suite, harness=harness, policy=policy, category=category, tasks=len(stats),
                       episodes=sum(s.n for s in stats), infra_failures=infra, tasks_without_valid_samples=empty,
                       not_scored=not_scored(rows))
    if not stats:
        return out
    rewards = [s.mean_reward for s in stats]
    rates = [s.success_rate for s in stats]
    out.pass1, out.strict = float(np.mean(rewards)), float(np.mean(rates))
    out.pass1_ci = bootstrap_ci(rewards, n_boot=n_boot, seed=seed)
    out.strict_ci = bootstrap_ci(rates, n_boot=n_boot, seed=seed)
    out.min_samples = min(s.n for s in stats)
    out.pass_at_k = {k: float(np.mean([pass_at_k(s.n, s.successes, k) for s in stats]))
                     for k in range(1, out.min_samples + 1)}
    return out


def summarize(rows: Iterable[ResultRow], *, by_category: bool = True, n_boot: int = 2000,
              seed: int = 0) -> list[GroupSummary]:
    """One summary per (suite, harness, policy), followed by its per-category summaries.

    Order: suites by name; within a suite, entries by Pass@1 descending (ties: policy, harness);
    each entry's category summaries follow it, by category name.
    """
    groups: dict[tuple[str, str, str], list[ResultRow]] = defaultdict(list)
    for row in latest_by_key(rows):
        groups[(row.suite, row.harness, row.policy)].append(row)
    overall = [summarize_group(g, suite=s, harness=h, policy=p, n_boot=n_boot, seed=seed)
               for (s, h, p), g in groups.items()]
    overall.sort(key=lambda x: (x.suite, -(x.pass1 if not math.isnan(x.pass1) else -1.0), x.policy, x.harness))
    out: list[GroupSummary] = []
    for entry in overall:
        out.append(entry)
        if not by_category:
            continue
        rows_of = groups[(entry.suite, entry.harness, entry.policy)]
        cats = sorted({r.category for r in rows_of if r.category is not None})
        for cat in cats:
            out.append(summarize_group([r for r in rows_of if r.category == cat], suite=entry.suite,
                                       harness=entry.harness, policy=entry.policy, category=cat,
                                       n_boot=n_boot, seed=seed))
    return out
