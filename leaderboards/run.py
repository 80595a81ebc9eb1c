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
    cannot launch, an upstream API that failed and left the episode unfinished, a host-side judge
    that kept failing) is retried up to ``retries`` times, then written as an ``infra_error`` row
    with ``attempts`` > 1 — reported and excluded from the means, never a silent 0; a task failure
    (the agent's fault) is never retried;
  * ``rerun_infra`` re-runs keys whose row is an ``infra_error``; the new row is appended after the
    old one and readers keep the last row of a key (:func:`leaderboards.schema.latest_by_key`);
  * tasks scored on the host (JobBench judge, ClawGym-Bench hybrid rubric: :func:`needs_host_scoring`)
    keep their final workspace until :func:`host_side_score` has read it; JobBench episodes skip
    the hermetic verifier (they ship no reward.sh). The judge is ``judge`` or, when a task needs
    one, :meth:`tasks.judge.JudgeClient.from_env` (``CLAWGYM_JUDGE_BASE_URL``/``_MODEL``/``_API_KEY``),
    built before any episode starts so a missing configuration fails at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import fcntl
import logging
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from clawgym_env.errors import ClawGymError, TaskError
from leaderboards.schema import ResultRow, RowKey, parse_lines

log = logging.getLogger("clawgym.eval")


# -- results file ------------------------------------------------------------------------------

class ResultsFile:
    """Append-only JSONL of :class:`ResultRow`, exclusively locked while open (a context manager)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.rows: list[ResultRow] = []
        self.bad_lines = 0
        self.repaired_tail = False

    def __enter__(self) -> "ResultsFile":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TaskError(f"{self.path} is being written by another evaluation run; wait for it, or "
                            "write to another --out file") from None
        self._fd = fd
        self._load_and_repair()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)  # also releases the flock
                self._fd = None

    def _load_and_repair(self) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            tail = data[cut:].decode("utf-8", errors="replace")
            if parse_lines([tail]).rows:  # complete row whose newline was lost: keep it
                os.write(self._fd, b"\n")
                data += b"\n"
            else:  # torn write: drop it, the episode runs again
                os.ftruncate(self._fd, cut)
                data = data[:cut]
            os.fsync(self._fd)
            self.repaired_tail = True
        parsed = parse_lines(data.decode("utf-8", errors="replace").splitlines())
        self.rows, self.bad_lines = parsed.rows, parsed.bad_lines

    def append(self, row: ResultRow) -> None:
        line = (row.model_dump_json() + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise TaskError(f"{self.path} is closed")
            os.write(self._fd, line)  # O_APPEND: one write, at the end
            os.fsync(self._fd)
            self.rows.append(row)


# -- host-side scoring hook ----------------------------------------------------------------------

def needs_host_scoring(task: Any) -> str | None:
    """Which host-side scorer grades ``task``: ``"jobbench"`` (LLM judge per rubric, no reward.sh),
    ``"hybrid"`` (ClawGym-Bench: reward.sh's code score + an LLM judge's rubric score) or None."""
    if getattr(task, "grading_type", None) == "jobbench":
        return "jobbench"
    from tasks.hybrid import is_hybrid

    return "hybrid" if is_hybrid(task) else None


def host_side_score(task: Any, workspace: Path, *, judge: Any, record: Any) -> tuple[float, dict[str, float], str]:
    """Grade a finished episode on the host → (reward, subscores, scorer name).

    * ``jobbench``: :func:`tasks.jobbench.score_jobbench` over the final workspace (the episode ran
      with ``grade=False``: JobBench tasks have no reward.sh);
    * ``hybrid``: :func:`tasks.hybrid.hybrid_grade` from the record's code score (reward.sh, already
      run hermetically) and the judge's rubric score (0.7 code + 0.3 rubric).
    Raises when the judge failed (unreachable, unusable verdict): the runner retries the episode,
    then reports ``infra_error`` — a judge outage is never the agent's 0.
    """
    kind = needs_host_scoring(task)
    if kind == "jobbench":
        from tasks.jobbench import score_jobbench

        result = score_jobbench(task, workspace, judge)
        reward, details = result
        subs = getattr(result, "subscores", None) or {
            k: float(details[k]) for k in ("earned", "possible") if isinstance(details.get(k), (int, float))}
        if details.get("judge_errors"):
            subs = {**subs, "judge_errors": float(details["judge_errors"])}
        return float(reward), subs, "tasks.jobbench.score_jobbench"
    if kind == "hybrid":
        from tasks.hybrid import hybrid_grade

        grade = hybrid_grade(task, record.reward, record.final_message, workspace, judge,
                             subscores=dict(record.subscores))
        if grade.score is None:
            raise TaskError(f"hybrid grading of {task.id} failed ({grade.status}): {grade.error}")
        subs = {**grade.subscores, "code_score": float(grade.code_score or 0.0)}
        if grade.rubric_score is not None:
            subs["rubric_score"] = float(grade.rubric_score)
        return float(grade.score), subs, "tasks.hybrid.hybrid_grade"
    raise TaskError(f"task {getattr(task, 'id', '?')} has no host-side scorer")


def default_judge() -> Any:
    """The shared LLM judge configured from the environment (see ``tasks.judge``)."""
    from tasks.judge import JudgeClient

    return JudgeClient.from_env()


# -- the runner ----------------------------------------------------------------------------------

@dataclasses.dataclass
class EvalSummary:
    out: Path
    total: int  # keys asked for
    skipped: int  # already in the results file
    ran: int  # rows written by this run
    infra_failures: int  # rows written by this run with status infra_error
    retried: int  # extra attempts spent on infrastructure failures
    repaired_tail: bool = False
    stopped_early: bool = False


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
             sampling: dict[str, Any] | None = None, judge: Any = None, rerun_infra: bool = False,
             keep_workspace: bool = False, retry_backoff_s: float = 1.0, progress: bool = True,
             adapter: Any = None) -> EvalSummary:
    """Evaluate; see the module doc. ``policy``: a spec string (also the rows' ``policy``) or a backend."""
    if samples < 1 or concurrency < 1 or retries < 0:
        raise TaskError("samples and concurrency must be >= 1 and retries >= 0")
    from harness_adapters.registry import get_adapter

    adapter = adapter or get_adapter(harness)
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
    with ResultsFile(out) as results:
        done = {r.key for r in results.rows if not (rerun_infra and r.is_infra_failure)}
        if results.bad_lines:
            log.warning("%s: %d unreadable line(s) ignored", out, results.bad_lines)
        jobs = [_Job(t, s, (st.name, t.id, harness, policy_key, s)) for t in tasks for s in range(samples)]
        todo = [j for j in jobs if j.key not in done]
        summary = EvalSummary(out=out, total=len(jobs), skipped=len(jobs) - len(todo), ran=0, infra_failures=0,
                              retried=0, repaired_tail=results.repaired_tail)
        if not todo:
            return summary
        if judge is None and any(needs_host_scoring(j.task) for j in todo):
            judge = default_judge()
        from clawgym_env.runtime import Runtime

        with Runtime(policy, sandbox=sandbox, out_dir=episodes_dir) as rt:
            runner = _Runner(rt, adapter, st.name, policy_key, retries, sampling, judge, keep_workspace,
                             retry_backoff_s)
            bar = None
            if progress:
                from tqdm.auto import tqdm

                bar = tqdm(total=len(jobs), initial=summary.skipped, unit="ep",
                           desc=f"{st.name} · {harness} · {policy_key}")
            pool = cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="clawgym-eval")
            try:
                futs = [pool.submit(runner.run_job, j) for j in todo]
                for fut in cf.as_completed(futs):
                    row, attempts = fut.result()
                    results.append(row)
                    summary.ran += 1
                    summary.retried += attempts - 1
                    summary.infra_failures += row.is_infra_failure
                    if bar is not None:
                        bar.set_postfix_str(f"{row.task_id}#{row.sample}: {row.status} r={row.reward:.2f}")
                        bar.update(1)
            except BaseException:  # Ctrl-C: in-flight episodes are abandoned; a restart redoes them
                summary.stopped_early = True
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            else:
                pool.shutdown(wait=True)
            finally:
                if bar is not None:
                    bar.close()
    return summary


class _Runner:
    """Runs one job (with its infrastructure retries) and turns the outcome into a row."""

    def __init__(self, rt: Any, adapter: Any, suite_name: str, policy_key: str, retries: int,
                 sampling: dict[str, Any] | None, judge: Any, keep_workspace: bool, backoff_s: float) -> None:
        self.rt, self.adapter, self.suite_name, self.policy_key = rt, adapter, suite_name, policy_key
        self.retries, self.sampling, self.judge = retries, dict(sampling or {}), judge
        self.keep_workspace, self.backoff_s = keep_workspace, backoff_s

    def run_job(self, job: _Job) -> tuple[ResultRow, int]:
        row = None
        for attempt in range(1, self.retries + 2):
            row = self._attempt(job, attempt)
            if not row.is_infra_failure:
                return row, attempt
            log.warning("%s#%d attempt %d: infrastructure failure: %s", job.task.id, job.sample, attempt, row.error)
            if attempt <= self.retries and self.backoff_s:
                time.sleep(self.backoff_s * attempt)
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
            res = self.rt.run(task, self.adapter, episode_id=episode_id, sampling=self.sampling or None,
                              keep_workspace=self.keep_workspace or scorer_kind is not None,
                              grade=scorer_kind != "jobbench")
        except Exception as exc:  # noqa: BLE001 - a rollout that could not run is a record, not a crash
            kind = "" if isinstance(exc, ClawGymError) else "unexpected "
            log.warning("episode %s raised", episode_id, exc_info=not isinstance(exc, ClawGymError))
            return self._row(job, attempt, status="infra_error", wall_s=time.monotonic() - t0,
                             error=f"{kind}{type(exc).__name__}: {exc}")
        rec = res.record
        episode_dir = Path(rec.calls_path).parent if rec.calls_path else None
        fields: dict[str, Any] = dict(
            status=rec.status, reward=rec.reward, subscores=dict(rec.subscores), num_calls=rec.num_calls,
            wall_s=rec.wall_s, calls_path=rec.calls_path, episode_dir=str(episode_dir) if episode_dir else None,
            error=rec.error, token_exact=all(c.token_exact for c in res.calls) if res.calls else None)
        failures = self._upstream_failures(episode_id)
        if failures and rec.status != "ok":  # the model API, not the agent, ended this episode
            fields.update(status="infra_error", error=f"upstream model API failed: {failures[-1]}"
                          + (f" (episode status was {rec.status})" if rec.status else ""))
        if scorer_kind is not None and fields["status"] != "infra_error" and episode_dir is not None:
            fields.update(self._host_score(task, episode_dir / "workspace", rec))
            if not (self.keep_workspace or os.environ.get("CLAWGYM_KEEP_WORKSPACES")):
                shutil.rmtree(episode_dir / "workspace", ignore_errors=True)
        return self._row(job, attempt, **fields)

    def _upstream_failures(self, episode_id: str) -> list[str]:
        pop = getattr(self.rt.policy, "pop_failures", None)
        return list(pop(episode_id)) if callable(pop) else []

    def _host_score(self, task: Any, workspace: Path, rec: Any) -> dict[str, Any]:
        """Scorer fields for the row; a failing scorer (judge outage) makes the attempt infra_error."""
        try:
            reward, subs, scorer = host_side_score(task, workspace, judge=self.judge, record=rec)
        except Exception as exc:  # noqa: BLE001 - the judge's fault, not the agent's: retried as infra
            log.warning("host-side scoring of %s failed", task.id, exc_info=not isinstance(exc, ClawGymError))
            return {"status": "infra_error", "error": f"host-side scoring failed: {type(exc).__name__}: {exc}"}
        return {"reward": reward, "subscores": subs, "scorer": scorer}
