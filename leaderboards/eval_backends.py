"""Where an evaluation run's episodes run: this process's threads (one serving proxy) or a Ray fleet.

:func:`run_on_threads` runs each job with its infrastructure retries (:class:`Runner`) on a thread
pool; :func:`run_on_fleet` hands the jobs to a :class:`~clawgym_env.fleet.RayFleet`, which retries
infrastructure failures on other nodes. Both call ``record(row, attempts)`` on the calling thread as
each job's final row is ready (see :mod:`leaderboards.run` for the results file's invariants).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from clawgym_env.errors import ClawGymError, TaskError
from clawgym_env.failures import exception_failure
from clawgym_env.grading.judge import Judge
from clawgym_env.policy.base import SamplingOverrides
from clawgym_env.redact import redact
from leaderboards.schema import ResultRow, RowKey
from leaderboards.scoring import needs_host_scoring

log = logging.getLogger("clawgym.eval")


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60] or "task"


def _category(task: Any) -> str | None:
    value = (getattr(task, "metadata", None) or {}).get("category")
    return str(value) if value not in (None, "") else None


class Job:
    """One requested episode: ``task``'s ``sample``-th run, written under the results ``key``."""

    def __init__(self, task: Any, sample: int, key: RowKey) -> None:
        self.task, self.sample, self.key = task, sample, key


def run_on_threads(todo: list[Job], adapter: Any, record: Callable[[ResultRow, int], None], *, policy: Any,
                   sandbox: str, sandbox_pool: int, episodes_dir: Path, concurrency: int, suite_name: str,
                   policy_key: str, retries: int, sampling: Any, judge: Judge | None, keep_workspace: bool,
                   backoff_s: float) -> None:
    """The jobs on a thread pool of this process (one serving proxy), rows recorded as they finish."""
    from clawgym_env.envs.runtime import Runtime

    with Runtime(policy, sandbox=sandbox, out_dir=episodes_dir, sandbox_pool=sandbox_pool) as rt:
        runner = Runner(rt, adapter, suite_name, policy_key, retries, sampling, judge, keep_workspace, backoff_s)
        pool = cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="clawgym-eval")
        try:
            futs = [pool.submit(runner.run_job, j) for j in todo]
            for fut in cf.as_completed(futs):
                record(*fut.result())
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        else:
            pool.shutdown(wait=True)


def run_on_fleet(todo: list[Job], adapter: Any, record: Callable[[ResultRow, int], None], *, policy: Any,
                 address: str, sandbox: str, sandbox_pool: int, episodes_dir: Path, per_node: int, retries: int,
                 sampling: Any, keep_workspace: bool, judge: Judge | None, suite_name: str, policy_key: str,
                 bar: Any = None) -> None:
    """The jobs on a Ray fleet; the fleet retries infrastructure failures on other nodes; ``bar`` (tqdm)
    shows the fleet's per-node and per-harness counts, queue depth and calls/s in its postfix."""
    from clawgym_env.fleet import FleetConfig, RayFleet, bar_postfix

    if not isinstance(policy, str):
        raise TaskError("with --ray-address the policy must be a spec string each rollout worker can build "
                        "(e.g. vllm:http://HOST:PORT), not an in-process backend")
    config = FleetConfig(policy=policy, address=None if address == "local" else address, sandbox=sandbox,
                         sandbox_pool=sandbox_pool, out_dir=str(episodes_dir), max_episodes_per_node=per_node,
                         max_attempts=retries + 1, judge=judge)
    runner = Runner(None, adapter, suite_name, policy_key, retries, sampling, judge, keep_workspace, 0.0)

    def on_result(index: int, res: Any) -> None:
        job = todo[index]
        attempts = int(res.record.logs.get("fleet_attempts") or 1)
        row = runner.row_from_result(job, attempts, res, scorer_kind=needs_host_scoring(job.task))
        if row.is_infra_failure:
            row.error = f"infrastructure failure after {attempts} attempt(s): {row.error}"
        record(row, attempts)

    with RayFleet(config, progress=bar_postfix(bar) if bar is not None else None) as fleet:
        fleet.run_pairs([(j.task, j.sample) for j in todo], adapter, on_result=on_result,
                        sampling=SamplingOverrides.of(sampling), keep_workspace=keep_workspace)


class Runner:
    """Runs one job (with its infrastructure retries) and turns the outcome into a row."""

    def __init__(self, rt: Any, adapter: Any, suite_name: str, policy_key: str, retries: int,
                 sampling: SamplingOverrides | Mapping[str, Any] | None, judge: Judge | None, keep_workspace: bool,
                 backoff_s: float) -> None:
        self.rt, self.adapter, self.suite_name, self.policy_key = rt, adapter, suite_name, policy_key
        self.retries, self.sampling, self.judge = retries, SamplingOverrides.of(sampling), judge
        self.keep_workspace, self.backoff_s = keep_workspace, backoff_s

    def run_job(self, job: Job) -> tuple[ResultRow, int]:
        """The job's final row (after up to ``retries`` re-runs of infrastructure failures) and its attempts."""
        attempt = 1
        while True:
            row = self._attempt(job, attempt)
            if not row.is_infra_failure:
                return row, attempt
            log.warning("%s#%d attempt %d: infrastructure failure (%s): %s", job.task.id, job.sample, attempt,
                        row.failure_boundary or "?", redact(row.error or ""))
            if attempt > self.retries:  # the first try and `retries` more
                break
            if self.backoff_s:
                time.sleep(self.backoff_s * attempt)
            attempt += 1
        row.error = f"infrastructure failure after {row.attempts} attempt(s): {row.error}"
        return row, row.attempts

    def _row(self, job: Job, attempt: int, **fields: Any) -> ResultRow:
        return ResultRow(suite=self.suite_name, task_id=job.task.id, category=_category(job.task),
                         harness=job.key[2], policy=self.policy_key, sample=job.sample, attempts=attempt, **fields)

    def _attempt(self, job: Job, attempt: int) -> ResultRow:
        task = job.task
        episode_id = f"{_safe(task.id)}-s{job.sample}-a{attempt}-{uuid.uuid4().hex[:8]}"
        scorer_kind = needs_host_scoring(task)
        t0 = time.monotonic()
        try:
            res = self.rt.run(task, self.adapter, episode_id=episode_id, sampling=self.sampling,
                              keep_workspace=self.keep_workspace, judge=self.judge)
        except Exception as exc:  # noqa: BLE001 - a rollout that could not run is a record, not a crash
            kind = "" if isinstance(exc, ClawGymError) else "unexpected "
            log.warning("episode %s raised", episode_id, exc_info=not isinstance(exc, ClawGymError))
            return self._row(job, attempt, status="infra_error", wall_s=time.monotonic() - t0,
                             failure_boundary=exception_failure(exc).boundary,
                             error=f"{kind}{type(exc).__name__}: {exc}")
        return self.row_from_result(job, attempt, res, scorer_kind=scorer_kind,
                                    upstream_failures=self._upstream_failures(episode_id))

    def row_from_result(self, job: Job, attempt: int, res: Any, *, scorer_kind: str | None,
                        upstream_failures: list[str] | None = None) -> ResultRow:
        """The results row of one finished episode."""
        task = job.task
        rec = res.record
        episode_dir = Path(rec.calls_path).parent if rec.calls_path else None
        fields: dict[str, object] = dict(  # ResultRow's fields, validated by ResultRow
            status=rec.status, reward=rec.reward, subscores=dict(rec.subscores), num_calls=rec.num_calls,
            wall_s=rec.wall_s, calls_path=rec.calls_path, episode_dir=str(episode_dir) if episode_dir else None,
            error=rec.error, failure_boundary=rec.failure_boundary,
            token_exact=all(c.token_exact for c in res.calls) if res.calls else None)
        failures = upstream_failures or []
        if failures and rec.status != "ok" and rec.is_task_outcome:  # the model API, not the agent, ended it
            fields.update(status="infra_error", failure_boundary="policy",
                          error=f"upstream model API failed: {failures[-1]}"
                          + (f" (episode status was {rec.status})" if rec.status else ""))
        fields.update(self._grade_fields(task, scorer_kind, rec, str(fields["status"])))
        return self._row(job, attempt, **fields)

    def _upstream_failures(self, episode_id: str) -> list[str]:
        pop = getattr(self.rt.policy, "pop_failures", None)
        return list(pop(episode_id)) if callable(pop) else []

    @staticmethod
    def _grade_fields(task: Any, scorer_kind: str | None, rec: Any, status: str) -> dict[str, object]:
        """Row fields from the episode's own grade. No valid reward (``reward_invalid``: the judge
        failed) is retried, then reported, as an infrastructure failure — never the agent's 0."""
        if status == "infra_error":
            return {}
        if rec.status == "reward_invalid":
            log.warning("grading of %s gave no valid reward: %s", task.id, rec.error)
            return {"status": "infra_error", "error": f"host-side scoring failed: {rec.error}"}
        if scorer_kind is None:
            return {}
        from clawgym_env.grading.grade import grader_of

        return {"scorer": grader_of(task).name}
