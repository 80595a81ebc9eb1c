"""The evaluation runner: every (task, sample) of a suite through one harness and one policy,
concurrently, one JSON line per finished episode, resumable.

    run_eval("builtin", harness="mini", policy="scripted:expert", samples=2, out="results.jsonl")

Invariants:
  * rows are appended as episodes finish, one ``write`` per line, under a lock, flushed and
    fsync'd before the next episode is counted done: a crash loses only episodes in flight;
  * on start the runner holds an exclusive ``flock`` on the results file for its whole run (a
    second runner on the same file fails at once instead of duplicating work), cuts a torn last
    line (no newline and not a valid row) and skips every key already written, so a killed and
    restarted run writes each episode exactly once (key: suite, task_id, harness, policy, sample);
  * an infrastructure failure (status ``infra_error``: a sandbox that cannot start, a harness that
    cannot launch, an upstream API that failed and left the episode unfinished, a judge that kept
    failing) is retried up to ``retries`` times, then written as an ``infra_error`` row with
    ``attempts`` > 1 and its ``failure_boundary`` — reported and excluded from the means, never a
    silent 0; a task failure (the agent's fault, however it broke its workspace) is never retried;
  * a full disk (or any failed write) under the results file is a clear :class:`ResultsWriteError`
    that stops the run: the file is cut back to its last complete line (never a torn line), so a
    restart re-runs only the episodes whose rows were not written;
  * the results file is created 0600 and every row is redacted (:mod:`clawgym_env.redact`);
  * leftovers of dead runs (a SIGKILL mid-episode): the run holds a
    :class:`~clawgym_env.sandbox.leftovers.RunLock` on its episodes folder, whose ``tmp/`` holds every
    temporary folder of the run; the next start deletes dead runs' folders, cgroups of dead pids and
    episode folders that never finished and that no row references;
  * ``rerun_infra`` re-runs keys whose row is an ``infra_error``; the new row is appended after the
    old one and readers keep the last row of a key (:func:`leaderboards.schema.latest_by_key`);
  * every episode is graded inside the episode by its task's grader (:mod:`clawgym_env.grading.grade`:
    ``reward.sh``, ClawGym-Bench hybrid 0.7 code + 0.3 rubric, JobBench judge per rubric), exactly
    as in ``env.step`` and training; an episode with no valid reward (``reward_invalid``: the judge
    failed) is retried, then reported, as ``infra_error``. The judge is ``judge`` or, when a task
    needs one (:func:`needs_host_scoring`), :meth:`tasks.judge.JudgeClient.from_env`
    (``CLAWGYM_JUDGE_BASE_URL``/``_MODEL``/``_API_KEY``), built before any episode starts so a
    missing configuration fails at once.

The results file is :mod:`leaderboards.results_file`, grading helpers :mod:`leaderboards.scoring`, the
threads and Ray backends :mod:`leaderboards.eval_backends` (their public names are importable from here too).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clawgym_env.errors import TaskError
from clawgym_env.grading.judge import Judge
from clawgym_env.policy.base import SamplingOverrides
from clawgym_env.sandbox.leftovers import RunLock, reap_orphan_episodes
from leaderboards.eval_backends import Job, run_on_fleet, run_on_threads
from leaderboards.results_file import ResultsFile, ResultsWriteError
from leaderboards.schema import ResultRow
from leaderboards.scoring import default_judge, host_side_score, needs_host_scoring

__all__ = ["EvalSummary", "ResultsFile", "ResultsWriteError", "check_sandbox_pool", "default_judge",
           "host_side_score", "load_eval_suite", "needs_host_scoring", "run_eval"]

log = logging.getLogger("clawgym.eval")


@dataclasses.dataclass
class EvalSummary:
    """What one :func:`run_eval` call did to its results file (counts of this run, not of the file)."""

    out: Path
    total: int  # keys asked for
    skipped: int  # already in the results file
    ran: int  # rows written by this run
    infra_failures: int  # rows written by this run with status infra_error
    retried: int  # extra attempts spent on infrastructure failures
    repaired_tail: bool = False
    stopped_early: bool = False
    reaped: list[str] = dataclasses.field(default_factory=list)  # leftovers of dead runs deleted at start

def load_eval_suite(suite: str | Path, data: str | Path | None = None):
    """The suite to evaluate, resolved through the suite registry (:func:`clawgym_env.plugins.load_suite`: a
    registered name, this project's or a plugin's, or a path); ``data``: the downloaded dataset for suites
    that need one (officeqa, clawgym-bench, jobbench, or a plugin suite's own)."""
    from clawgym_env.plugins import load_suite

    return load_suite(suite, data=data)


def check_sandbox_pool(sandbox: str, sandbox_pool: int) -> None:
    """A :class:`TaskError` naming the fix unless ``sandbox_pool`` is 0, or positive with the Docker sandbox."""
    if sandbox_pool < 0:
        raise TaskError(f"--sandbox-pool {sandbox_pool}: must be >= 0 (0: every sandbox starts cold)")
    if sandbox_pool and sandbox != "docker":
        raise TaskError(f"--sandbox-pool {sandbox_pool} keeps warm Docker containers, but the sandbox is {sandbox!r} "
                        "(a bwrap sandbox starts in milliseconds, it has no pool): add --sandbox docker, or drop "
                        "--sandbox-pool")

def run_eval(suite: str | Path, *, harness: str, policy: Any, out: str | Path, samples: int = 1,
             concurrency: int = 2, data: str | Path | None = None, limit: int | None = None,
             sandbox: str = "bwrap", retries: int = 2, episodes_dir: str | Path | None = None,
             sampling: SamplingOverrides | Mapping[str, Any] | None = None, judge: Judge | None = None,
             rerun_infra: bool = False,
             keep_workspace: bool = False, retry_backoff_s: float = 1.0, progress: bool = True,
             adapter: Any = None, ray_address: str | None = None,
             max_episodes_per_node: int | None = None, sandbox_pool: int = 0,
             harness_options: Mapping[str, Any] | None = None,
             harness_cache_dir: str | Path | None = None) -> EvalSummary:
    """Evaluate; see the module doc. ``policy``: a spec string (also the rows' ``policy``) or a backend.

    ``ray_address`` (``"auto"``, ``"local"`` or ``HOST:PORT``) runs the episodes on a Ray fleet
    (:mod:`clawgym_env.fleet`: one rollout worker per node, at most ``max_episodes_per_node`` episodes
    each, default ``concurrency``; infrastructure failures retried on another node up to ``retries``
    times); ``policy`` must then be a spec string each worker builds. Rows are appended as episodes
    finish, as with threads. ``sandbox_pool`` (``sandbox="docker"`` only) keeps that many warm containers per
    sandbox shape: in this process on threads, in each rollout worker on a fleet. ``harness_options`` (the
    adapter's own constructor keywords) and ``harness_cache_dir`` (where it finds its pinned harness) build the
    adapter when ``adapter`` is not given, checked against its constructor
    (:func:`harness_adapters.options.build_harness`)."""
    if samples < 1 or concurrency < 1 or retries < 0:
        raise TaskError("samples and concurrency must be >= 1 and retries >= 0")
    check_sandbox_pool(sandbox, sandbox_pool)
    from harness_adapters.options import build_harness

    adapter = adapter or build_harness(harness, harness_options, cache_dir=harness_cache_dir)
    st = load_eval_suite(suite, data)
    if st.issues:
        log.warning("suite %s: %d load issue(s), e.g. %s: %s (-v lists them)", st.name, len(st.issues),
                    st.issues[0].path, st.issues[0].error)
        for issue in st.issues:
            log.info("suite issue: %s: %s", issue.path, issue.error)
    tasks = st.tasks[:limit] if limit else list(st.tasks)
    policy_key = policy.strip() if isinstance(policy, str) else getattr(policy, "name", "policy")
    out = Path(out)
    # absolute: the sandbox binds the episode's workspace by path
    episodes_dir = (Path(episodes_dir) if episodes_dir else out.with_name(out.stem + "-episodes")).resolve()
    with ResultsFile(out) as results, RunLock(episodes_dir, results=out.resolve()) as run:
        reap_orphan_episodes(episodes_dir, {r.episode_dir for r in results.rows if r.episode_dir}, run.reaped,
                             results=out.resolve())
        reaped = run.reaped.runs + run.reaped.cgroups + run.reaped.episode_dirs
        if reaped:
            log.warning("removed %d leftover(s) of dead runs (%d run folders, %d cgroups, %d episode folders)",
                        len(reaped), len(run.reaped.runs), len(run.reaped.cgroups), len(run.reaped.episode_dirs))
        done = {r.key for r in results.rows if not (rerun_infra and r.is_infra_failure)}
        if results.bad_lines:
            log.warning("%s: %d unreadable line(s) ignored", out, results.bad_lines)
        jobs = [Job(t, s, (st.name, t.id, harness, policy_key, s)) for t in tasks for s in range(samples)]
        todo = [j for j in jobs if j.key not in done]
        summary = EvalSummary(out=out, total=len(jobs), skipped=len(jobs) - len(todo), ran=0, infra_failures=0,
                              retried=0, repaired_tail=results.repaired_tail, reaped=reaped)
        if not todo:
            return summary
        if judge is None and any(needs_host_scoring(j.task) for j in todo):
            judge = default_judge()
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(jobs), initial=summary.skipped, unit="ep",
                       desc=f"{st.name} · {harness} · {policy_key}")

        def record(row: ResultRow, attempts: int) -> None:
            results.append(row)
            summary.ran += 1
            summary.retried += attempts - 1
            summary.infra_failures += row.is_infra_failure
            if bar is not None:
                if ray_address is None:  # on a fleet the postfix shows the fleet's counts (bar_postfix)
                    bar.set_postfix_str(f"{row.task_id}#{row.sample}: {row.status} r={row.reward:.2f}")
                bar.update(1)

        try:
            if ray_address is not None:
                run_on_fleet(todo, adapter, record, policy=policy, address=ray_address, sandbox=sandbox,
                              sandbox_pool=sandbox_pool,
                              episodes_dir=episodes_dir, per_node=max_episodes_per_node or concurrency,
                              retries=retries, sampling=sampling, keep_workspace=keep_workspace, judge=judge,
                              suite_name=st.name, policy_key=policy_key, bar=bar)
            else:
                run_on_threads(todo, adapter, record, policy=policy, sandbox=sandbox, sandbox_pool=sandbox_pool,
                                episodes_dir=episodes_dir, concurrency=concurrency, suite_name=st.name,
                                policy_key=policy_key, retries=retries, sampling=sampling, judge=judge,
                                keep_workspace=keep_workspace, backoff_s=retry_backoff_s)
        except BaseException:  # Ctrl-C: in-flight episodes are abandoned; a restart redoes them
            summary.stopped_early = True
            raise
        finally:
            if bar is not None:
                bar.close()
    return summary
