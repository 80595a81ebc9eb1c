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
    :class:`~clawgym_env.leftovers.RunLock` on its episodes folder, whose ``tmp/`` holds every
    temporary folder of the run; the next start deletes dead runs' folders, cgroups of dead pids and
    episode folders that never finished and that no row references;
  * ``rerun_infra`` re-runs keys whose row is an ``infra_error``; the new row is appended after the
    old one and readers keep the last row of a key (:func:`leaderboards.schema.latest_by_key`);
  * every episode is graded inside the episode by its task's grader (:mod:`clawgym_env.grading`:
    ``reward.sh``, ClawGym-Bench hybrid 0.7 code + 0.3 rubric, JobBench judge per rubric), exactly
    as in ``env.step`` and training; an episode with no valid reward (``reward_invalid``: the judge
    failed) is retried, then reported, as ``infra_error``. The judge is ``judge`` or, when a task
    needs one (:func:`needs_host_scoring`), :meth:`tasks.judge.JudgeClient.from_env`
    (``CLAWGYM_JUDGE_BASE_URL``/``_MODEL``/``_API_KEY``), built before any episode starts so a
    missing configuration fails at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import fcntl
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from clawgym_env.capture.records import dump_record
from clawgym_env.errors import ClawGymError, TaskError
from clawgym_env.failures import exception_failure
from clawgym_env.leftovers import RunLock, reap_orphan_episodes
from clawgym_env.policy.base import SamplingOverrides
from clawgym_env.redact import redact
from leaderboards.schema import ResultRow, RowKey, parse_lines

log = logging.getLogger("clawgym.eval")


# -- results file ------------------------------------------------------------------------------

class ResultsWriteError(TaskError):
    """A results row could not be written (disk full, I/O error); the file was cut back to its last
    complete line. The message names the file, the cause and the fix."""


class ResultsFile:
    """Append-only JSONL of :class:`ResultRow`, exclusively locked while open (a context manager)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.rows: list[ResultRow] = []
        self.bad_lines = 0
        self.repaired_tail = False

    def __enter__(self) -> ResultsFile:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TaskError(f"{self.path} is being written by another evaluation run; wait for it, or "
                            "write to another --out file") from None
        self._fd = fd
        os.fchmod(fd, 0o600)  # run outputs are private to the user
        self._load_and_repair(fd)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the file, releasing its lock; idempotent."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)  # also releases the flock
                self._fd = None

    def _load_and_repair(self, fd: int) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            tail = data[cut:].decode("utf-8", errors="replace")
            if parse_lines([tail]).rows:  # complete row whose newline was lost: keep it
                os.write(fd, b"\n")
                data += b"\n"
            else:  # torn write: drop it, the episode runs again
                os.ftruncate(fd, cut)
                data = data[:cut]
            os.fsync(fd)
            self.repaired_tail = True
        parsed = parse_lines(data.decode("utf-8", errors="replace").splitlines())
        self.rows, self.bad_lines = parsed.rows, parsed.bad_lines

    def append(self, row: ResultRow) -> None:
        """Append one row (redacted), durably; on any write failure cut the file back to where it
        was and raise :class:`ResultsWriteError`."""
        line = (dump_record(row) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise TaskError(f"{self.path} is closed")
            end = os.fstat(self._fd).st_size
            try:
                n = os.write(self._fd, line)  # O_APPEND: one write, at the end
                if n != len(line):
                    raise OSError(28, f"short write ({n} of {len(line)} bytes)")
                os.fsync(self._fd)
            except OSError as exc:
                try:
                    os.ftruncate(self._fd, end)
                    os.fsync(self._fd)
                except OSError:
                    pass
                raise ResultsWriteError(
                    f"could not write a row to {self.path}: {exc.strerror or exc}; the file is intact up to its "
                    "last complete row. Free space on that disk (or pass another --out), then run the same "
                    "command again: finished episodes are skipped") from exc
            self.rows.append(row)


# -- grading: inside the episode, through the task's grader ------------------------------------

def needs_host_scoring(task: Any) -> str | None:
    """Which LLM-judge grader ``task`` has: ``"jobbench"`` (judge per rubric, no reward.sh),
    ``"hybrid"`` (ClawGym-Bench: reward.sh's code score + the judge's rubric score) or None.

    The name is historical: these tasks are graded inside the episode now
    (:mod:`clawgym_env.grading`, the task's ``grader``), with the judge this runner passes in, so
    ``clawgym eval``, ``env.step`` and training read one reward; the runner only needs to know
    whether to build a judge before the first episode."""
    if getattr(task, "grading_type", None) == "jobbench":
        return "jobbench"
    from tasks.hybrid import is_hybrid

    return "hybrid" if is_hybrid(task) else None


def host_side_score(task: Any, workspace: Path, *, judge: Any, record: Any) -> tuple[float, dict[str, float], str]:
    """Grade a kept final ``workspace`` again with the task's grader → (reward, subscores, scorer).

    For re-scoring saved workspaces (e.g. with another judge); episodes are already graded inside
    the episode. Raises :class:`TaskError` when there is no valid reward (judge outage, unusable
    verdict) — never the agent's 0."""
    from clawgym_env.grading import grade_episode

    gr = grade_episode(task, workspace, final_message=getattr(record, "final_message", None), judge=judge)
    if not gr.valid:
        raise TaskError(f"grading of {getattr(task, 'id', '?')} gave no valid reward: {gr.reason}")
    return gr.reward, dict(gr.subscores), gr.scorer


def default_judge() -> Any:
    """The shared LLM judge configured from the environment (see ``tasks.judge``)."""
    from tasks.judge import JudgeClient

    return JudgeClient.from_env()


# -- the runner ----------------------------------------------------------------------------------

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


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60] or "task"


def _category(task: Any) -> str | None:
    value = (getattr(task, "metadata", None) or {}).get("category")
    return str(value) if value not in (None, "") else None


def load_eval_suite(suite: str | Path, data: str | Path | None = None):
    """The suite to evaluate: ``tasks.load_suite(suite, data=data)`` (``data``: the downloaded
    dataset for suites that need one: officeqa, clawgym-bench, jobbench)."""
    from tasks import load_suite

    return load_suite(suite, data=data) if data is not None else load_suite(suite)


class _Job:
    def __init__(self, task: Any, sample: int, key: RowKey) -> None:
        self.task, self.sample, self.key = task, sample, key


def run_eval(suite: str | Path, *, harness: str, policy: Any, out: str | Path, samples: int = 1,
             concurrency: int = 2, data: str | Path | None = None, limit: int | None = None,
             sandbox: str = "bwrap", retries: int = 2, episodes_dir: str | Path | None = None,
             sampling: SamplingOverrides | Mapping[str, Any] | None = None, judge: Any = None,
             rerun_infra: bool = False,
             keep_workspace: bool = False, retry_backoff_s: float = 1.0, progress: bool = True,
             adapter: Any = None, ray_address: str | None = None,
             max_episodes_per_node: int | None = None) -> EvalSummary:
    """Evaluate; see the module doc. ``policy``: a spec string (also the rows' ``policy``) or a backend.

    ``ray_address`` (``"auto"``, ``"local"`` or ``HOST:PORT``) runs the episodes on a Ray fleet
    (:mod:`clawgym_env.fleet`: one rollout worker per node, at most ``max_episodes_per_node`` episodes
    each, default ``concurrency``; infrastructure failures retried on another node up to ``retries``
    times); ``policy`` must then be a spec string each worker builds. Rows are appended as episodes
    finish, as with threads."""
    if samples < 1 or concurrency < 1 or retries < 0:
        raise TaskError("samples and concurrency must be >= 1 and retries >= 0")
    from clawgym_env.plugins import make_harness

    adapter = adapter or make_harness(harness)
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
        reap_orphan_episodes(episodes_dir, {r.episode_dir for r in results.rows if r.episode_dir}, run.reaped)
        reaped = run.reaped.runs + run.reaped.cgroups + run.reaped.episode_dirs
        if reaped:
            log.warning("removed %d leftover(s) of dead runs (%d run folders, %d cgroups, %d episode folders)",
                        len(reaped), len(run.reaped.runs), len(run.reaped.cgroups), len(run.reaped.episode_dirs))
        done = {r.key for r in results.rows if not (rerun_infra and r.is_infra_failure)}
        if results.bad_lines:
            log.warning("%s: %d unreadable line(s) ignored", out, results.bad_lines)
        jobs = [_Job(t, s, (st.name, t.id, harness, policy_key, s)) for t in tasks for s in range(samples)]
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
                _run_on_fleet(todo, adapter, record, policy=policy, address=ray_address, sandbox=sandbox,
                              episodes_dir=episodes_dir, per_node=max_episodes_per_node or concurrency,
                              retries=retries, sampling=sampling, keep_workspace=keep_workspace, judge=judge,
                              suite_name=st.name, policy_key=policy_key, bar=bar)
            else:
                _run_on_threads(todo, adapter, record, policy=policy, sandbox=sandbox,
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


def _run_on_threads(todo: list[_Job], adapter: Any, record: Callable[[ResultRow, int], None], *, policy: Any,
                    sandbox: str, episodes_dir: Path, concurrency: int, suite_name: str, policy_key: str,
                    retries: int, sampling: Any, judge: Any, keep_workspace: bool, backoff_s: float) -> None:
    """The jobs on a thread pool of this process (one serving proxy), rows recorded as they finish."""
    from clawgym_env.runtime import Runtime

    with Runtime(policy, sandbox=sandbox, out_dir=episodes_dir) as rt:
        runner = _Runner(rt, adapter, suite_name, policy_key, retries, sampling, judge, keep_workspace, backoff_s)
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


def _run_on_fleet(todo: list[_Job], adapter: Any, record: Callable[[ResultRow, int], None], *, policy: Any,
                  address: str, sandbox: str, episodes_dir: Path, per_node: int, retries: int, sampling: Any,
                  keep_workspace: bool, judge: Any, suite_name: str, policy_key: str,
                  bar: Any = None) -> None:
    """The jobs on a Ray fleet; the fleet retries infrastructure failures on other nodes; ``bar`` (tqdm)
    shows the fleet's per-node and per-harness counts, queue depth and calls/s in its postfix."""
    from clawgym_env.fleet import FleetConfig, RayFleet, bar_postfix

    if not isinstance(policy, str):
        raise TaskError("with --ray-address the policy must be a spec string each rollout worker can build "
                        "(e.g. vllm:http://HOST:PORT), not an in-process backend")
    config = FleetConfig(policy=policy, address=None if address == "local" else address, sandbox=sandbox,
                         out_dir=str(episodes_dir), max_episodes_per_node=per_node, max_attempts=retries + 1,
                         judge=judge)
    runner = _Runner(None, adapter, suite_name, policy_key, retries, sampling, judge, keep_workspace, 0.0)

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


class _Runner:
    """Runs one job (with its infrastructure retries) and turns the outcome into a row."""

    def __init__(self, rt: Any, adapter: Any, suite_name: str, policy_key: str, retries: int,
                 sampling: SamplingOverrides | Mapping[str, Any] | None, judge: Any, keep_workspace: bool,
                 backoff_s: float) -> None:
        self.rt, self.adapter, self.suite_name, self.policy_key = rt, adapter, suite_name, policy_key
        self.retries, self.sampling, self.judge = retries, SamplingOverrides.of(sampling), judge
        self.keep_workspace, self.backoff_s = keep_workspace, backoff_s

    def run_job(self, job: _Job) -> tuple[ResultRow, int]:
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

    def _row(self, job: _Job, attempt: int, **fields: Any) -> ResultRow:
        return ResultRow(suite=self.suite_name, task_id=job.task.id, category=_category(job.task),
                         harness=job.key[2], policy=self.policy_key, sample=job.sample, attempts=attempt, **fields)

    def _attempt(self, job: _Job, attempt: int) -> ResultRow:
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

    def row_from_result(self, job: _Job, attempt: int, res: Any, *, scorer_kind: str | None,
                        upstream_failures: list[str] | None = None) -> ResultRow:
        """The results row of one finished episode."""
        task = job.task
        rec = res.record
        episode_dir = Path(rec.calls_path).parent if rec.calls_path else None
        fields: dict[str, Any] = dict(
            status=rec.status, reward=rec.reward, subscores=dict(rec.subscores), num_calls=rec.num_calls,
            wall_s=rec.wall_s, calls_path=rec.calls_path, episode_dir=str(episode_dir) if episode_dir else None,
            error=rec.error, failure_boundary=rec.failure_boundary,
            token_exact=all(c.token_exact for c in res.calls) if res.calls else None)
        failures = upstream_failures or []
        if failures and rec.status != "ok" and rec.is_task_outcome:  # the model API, not the agent, ended it
            fields.update(status="infra_error", failure_boundary="policy",
                          error=f"upstream model API failed: {failures[-1]}"
                          + (f" (episode status was {rec.status})" if rec.status else ""))
        fields.update(self._grade_fields(task, scorer_kind, rec, fields["status"]))
        return self._row(job, attempt, **fields)

    def _upstream_failures(self, episode_id: str) -> list[str]:
        pop = getattr(self.rt.policy, "pop_failures", None)
        return list(pop(episode_id)) if callable(pop) else []

    @staticmethod
    def _grade_fields(task: Any, scorer_kind: str | None, rec: Any, status: str) -> dict[str, Any]:
        """Row fields from the episode's own grade. No valid reward (``reward_invalid``: the judge
        failed) is retried, then reported, as an infrastructure failure — never the agent's 0."""
        if status == "infra_error":
            return {}
        if rec.status == "reward_invalid":
            log.warning("grading of %s gave no valid reward: %s", task.id, rec.error)
            return {"status": "infra_error", "error": f"host-side scoring failed: {rec.error}"}
        if scorer_kind is None:
            return {}
        from clawgym_env.grading import grader_of

        return {"scorer": grader_of(task).name}
