"""The stages of one episode as typed results, and the one function that builds its record from them.

:func:`~clawgym_env.episodes.run.run_episode` runs an episode as a sequence of stages, each a function
returning one frozen result here:

  * :class:`EpisodeIds`: who ran what, the record's identity (episode, task, suite, harness, policy,
    sampling, policy version);
  * :class:`SandboxStage`: the sandbox and the harness process in it: the raw run (None when it never
    returned), start and run times, resources, limits hit, the network trace, a sandbox or launch failure;
  * :class:`ProxyStage`: the episode's calls as the proxy served them (labelled), where they are written,
    the proxy's failures and whether it was still running;
  * :class:`HarnessStage`: what the harness said (final message, transcript, exit code, output tails) and
    the verdict on its run (:func:`~clawgym_env.failures.classify_run`);
  * :class:`WorkspaceStage`: what the agent changed: the workspace changes and the task inputs it modified;
  * :class:`GradeStage`: the grade (reward, subscores, reason, the grader's logs) and the verdict after it.

:func:`assemble_record` builds the :class:`~clawgym_env.capture.records.EpisodeRecord` once, from the
stages that ran. Invariants:
  * the record's keys keep one order (``tests/data/episode_records.json`` pins it for every path):
    ``logs`` in stage order (``stdout``, ``stderr``, ``network_trace``, ``workspace_changes``,
    ``workspace_changes_error``, ``inputs_modified_error``, ``grader_notes``, ``reward_stdout``,
    ``reward_stderr``), ``timings`` in stage order (``sandbox_start_s``, ``harness_s``, ``reward_s``,
    ``proxy_generate_s``, ``proxy_total_s``), ``resources`` as measured (``harness_started_at``,
    ``peak_memory_mb``); a key is there only when its stage measured it;
  * a record that cannot be built (a value the record refuses, no verdict at all) is still one record:
    ``infra_error`` at the ``internal`` boundary, with the episode's identity, calls and wall time;
  * stage results are frozen: a later stage never edits an earlier one's result.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clawgym_env.capture.records import CallRecord, EpisodeRecord, InputChange, WorkspaceChange
from clawgym_env.failures import Verdict, internal_failure

if TYPE_CHECKING:
    from clawgym_env.sandbox import ExecResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeIds:
    """The record's identity: known before anything runs, the same on every path."""

    episode_id: str
    task_id: str
    suite: str | None
    harness: str
    policy: str
    sampling: Mapping[str, Any]
    policy_version: int


@dataclass(frozen=True)
class SandboxStage:
    """The sandbox and the harness process in it.

    ``run`` is the harness process's result, None when it never returned (the sandbox did not start,
    the harness could not launch, the sandbox failed under it); then ``failure`` says why. A failure
    after the run returned (reading its measures) is kept too, but the harness's verdict supersedes it.
    Each measure is None when the stage did not get that far."""

    run: ExecResult | None = None
    failure: Verdict | None = None
    sandbox_start_s: float | None = None
    harness_s: float | None = None
    harness_started_at: float | None = None
    """Epoch seconds when the harness process was started."""
    peak_memory_mb: float | None = None
    limits_hit: tuple[str, ...] | None = None
    """Sandbox limits the agent ran into (disk/inodes per place, memory, cpu); None: not read."""
    network_trace: str | None = None
    """The harness's socket syscalls, when traced."""
    sync_wait_s: float | None = None
    """Seconds the episode's calls were held back by weight syncs while the harness ran (not charged
    against its wall-clock limit); None: the policy keeps no such ledger, or the harness never ran."""

    def timings(self) -> dict[str, float]:
        """``sandbox_start_s`` and ``harness_s``, those measured, in that order."""
        both = (("sandbox_start_s", self.sandbox_start_s), ("harness_s", self.harness_s))
        return {k: v for k, v in both if v is not None}

    def resources(self) -> dict[str, float]:
        """``harness_started_at`` and ``peak_memory_mb``, those measured, in that order."""
        both = (("harness_started_at", self.harness_started_at), ("peak_memory_mb", self.peak_memory_mb))
        return {k: v for k, v in both if v is not None}


@dataclass(frozen=True)
class ProxyStage:
    """The episode's calls as the proxy served them, labelled with their kinds, and the proxy's side of it.

    ``calls_path``: the calls file (``calls.jsonl``, the labelled calls); ``failures``: the session's
    non-2xx answers (:class:`~clawgym_env.proxy.sessions.CallFailure`); ``running``: whether the proxy
    was still serving when the episode closed."""

    calls: tuple[CallRecord, ...]
    calls_path: str
    failures: tuple[Any, ...] = ()
    running: bool = True

    @property
    def last_call_end(self) -> float | None:
        """``ended_at`` of the last served call (epoch seconds), None without calls."""
        return max((c.ended_at for c in self.calls), default=None)

    def timings(self) -> dict[str, float]:
        """``proxy_generate_s`` and ``proxy_total_s``: the calls' generation and total times, summed."""
        return {"proxy_generate_s": sum(c.timings.get("generate_s", 0.0) for c in self.calls),
                "proxy_total_s": sum(c.timings.get("total_s", 0.0) for c in self.calls)}


@dataclass(frozen=True)
class HarnessStage:
    """What the harness said, read by its adapter, and the verdict on its run."""

    final_message: str | None
    transcript: Any
    exit_code: int
    logs: Mapping[str, str]
    """``stdout`` and ``stderr`` tails, then ``network_trace`` when traced."""
    verdict: Verdict


@dataclass(frozen=True)
class WorkspaceStage:
    """What the agent changed in its workspace. ``changes``/``inputs_modified`` are None when listing
    them failed (then ``logs`` says why); ``logs`` also notes a listing cut at its maximum."""

    changes: tuple[WorkspaceChange, ...] | None
    inputs_modified: tuple[InputChange, ...] | None
    logs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GradeStage:
    """The grade of the final workspace and the verdict after it.

    ``verdict`` is the episode's verdict after grading: the harness's unchanged, or the grader's
    (boundary ``grader``) when grading changed the status. ``reward_s`` is None when the episode was
    not graded; ``logs``: ``grader_notes``, ``reward_stdout``, ``reward_stderr`` as the grader gave them."""

    verdict: Verdict
    reward: float = 0.0
    subscores: Mapping[str, float] = field(default_factory=dict)
    reward_reason: str | None = None
    logs: Mapping[str, str] = field(default_factory=dict)
    reward_s: float | None = None


def episode_verdict(sandbox: SandboxStage | None, harness: HarnessStage | None,
                    grade: GradeStage | None) -> Verdict | None:
    """The episode's verdict: the grade's, else the harness's, else the sandbox stage's failure (None: no
    stage reached one, which :func:`assemble_record` reports as an internal failure)."""
    if grade is not None:
        return grade.verdict
    if harness is not None:
        return harness.verdict
    return sandbox.failure if sandbox is not None else None


def assemble_record(ids: EpisodeIds, *, wall_s: float, failure: Verdict | None = None,
                    sandbox: SandboxStage | None = None, proxy: ProxyStage | None = None,
                    harness: HarnessStage | None = None, workspace: WorkspaceStage | None = None,
                    grade: GradeStage | None = None) -> EpisodeRecord:
    """The episode's one record, from the stages that ran (None: the stage did not run).

    ``failure``: a failure before any stage ran (a broken task folder); otherwise the verdict is
    :func:`episode_verdict`'s. A record the stages cannot make (see the module doc) is an ``internal``
    ``infra_error`` record, never an exception."""
    fields: dict[str, object] = {  # EpisodeRecord's fields, validated by EpisodeRecord(**fields)
        "episode_id": ids.episode_id, "task_id": ids.task_id, "suite": ids.suite, "harness": ids.harness,
        "policy": ids.policy, "sampling": dict(ids.sampling), "policy_version": ids.policy_version,
        "wall_s": wall_s}
    verdict = failure or episode_verdict(sandbox, harness, grade)
    if verdict is not None:
        fields.update(status=verdict.status, failure_boundary=verdict.boundary, error=verdict.error)
    if proxy is not None:
        fields.update(num_calls=len(proxy.calls), calls_path=proxy.calls_path)
    if failure is not None or proxy is None:  # nothing ran: the identity and the verdict are the record
        return _build(fields)
    logs: dict[str, str] = {}
    timings: dict[str, float] = {}
    if sandbox is not None:
        timings.update(sandbox.timings())
        if sandbox.harness_started_at is not None:
            fields["resources"] = sandbox.resources()
        if sandbox.limits_hit is not None:
            fields["limits_hit"] = list(sandbox.limits_hit)
        if sandbox.sync_wait_s is not None:
            fields["sync_wait_s"] = sandbox.sync_wait_s
    if harness is not None:
        fields.update(final_message=harness.final_message, exit_code=harness.exit_code)
        logs.update(harness.logs)
    if workspace is not None:
        if workspace.changes is not None:
            fields["workspace_changes"] = list(workspace.changes)
        if workspace.inputs_modified is not None:
            fields["inputs_modified"] = list(workspace.inputs_modified)
        logs.update(workspace.logs)
    if grade is not None:
        fields.update(reward=grade.reward, subscores=dict(grade.subscores), reward_reason=grade.reward_reason)
        logs.update(grade.logs)
        if grade.reward_s is not None:
            timings["reward_s"] = grade.reward_s
    timings.update(proxy.timings())
    if harness is not None:
        fields["logs"] = logs
    fields["timings"] = timings
    return _build(fields)


def _build(fields: dict[str, object]) -> EpisodeRecord:
    try:
        return EpisodeRecord.model_validate(fields)
    except Exception as exc:  # noqa: BLE001 - a bug here must still leave exactly one record
        log.error("episode %s: building the record failed", fields.get("episode_id"), exc_info=exc)
        keep = {k: fields[k] for k in ("episode_id", "task_id", "suite", "harness", "policy", "num_calls",
                                       "calls_path", "wall_s") if k in fields}
        return EpisodeRecord.model_validate({**keep, "status": "infra_error", "failure_boundary": "internal",
                                             "error": internal_failure(exc, "building the episode record").error})
