"""One whole harness episode: task → sandbox → harness → proxy → captured calls → reward.

:func:`run_episode` never raises for a failed rollout: it returns an :class:`EpisodeResult` whose
record's ``status`` says what happened (``ok``, ``harness_error``, ``timeout``, ``no_final_answer``,
``reward_error``, ``reward_invalid``, ``infra_error``) and ``failure_boundary`` where (sandbox, harness,
proxy, policy, grader, internal: :mod:`clawgym_env.failures`), with the logs.

The episode is a sequence of stages, each one function returning one typed result
(:mod:`clawgym_env.episodes.stages`): the workspace (:func:`prepare_workspace`), the sandbox with the
harness in it (:func:`sandbox_stage`), the proxy's calls (:func:`proxy_stage`), the harness's output and
verdict (:func:`harness_stage`), the workspace's changes (:func:`workspace_stage`) and the grade
(:func:`grade_stage`); the record is built once from them (:func:`~clawgym_env.episodes.stages.assemble_record`).

Invariants:
  * the harness's wall-clock limit (``task.limits.timeout_s``) is on the agent's own time: the time its model
    calls were held back by a weight sync of the policy (the policy's
    :class:`~clawgym_env.policy.sync_wait.SyncWaits`, written by its gate, never by the agent) extends the
    limit while the harness runs (:class:`~clawgym_env.sandbox.deadline.AgentTimeout`) and is recorded as
    ``sync_wait_s``; everything else (tools, harness, generation) counts, so the agent's own slowness still
    ends as ``timeout``;
  * whatever the agent left in its workspace (fifos, sockets, undecodable names, 1,200 nested
    folders, sparse files) and whatever a request held, the episode ends with exactly one record
    and ``episode.json`` is written: listing, copying and deleting use
    :mod:`clawgym_env.files.workspace` (no link followed, no recursion, no whole-file reads) and
    records are written by :func:`~clawgym_env.capture.records.write_record` (redacted, bounded);
  * the episode folder is 0700 and every file ClawGym writes in it 0600.

Layout of an episode's folder (``out_dir/<episode_id>/``): ``episode.json`` (the record),
``calls.jsonl`` (one :class:`CallRecord` per model call, streamed by the proxy while the harness runs and
replaced at the end by the same calls labelled with their ``kind`` and ``discarded_by``:
:func:`~clawgym_env.capture.call_kinds.classify_calls`), ``workspace/`` (the final workspace,
kept when ``keep_workspace``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from clawgym_env.capture.call_kinds import classify_calls
from clawgym_env.capture.records import CallRecord, EpisodeRecord, WorkspaceChange, write_jsonl, write_record
from clawgym_env.episodes.stages import (
    EpisodeIds,
    GradeStage,
    HarnessStage,
    ProxyStage,
    SandboxStage,
    WorkspaceStage,
    assemble_record,
)
from clawgym_env.errors import ClawGymError, ConfigError, SandboxError, TaskError
from clawgym_env.failures import (
    Verdict,
    classify_run,
    internal_failure,
    sandbox_failure,
)
from clawgym_env.files.workspace import Entry, copy_tree, remove_tree, snapshot
from clawgym_env.grading.grade import grade_episode
from clawgym_env.grading.inputs import modified_inputs
from clawgym_env.grading.judge import Judge
from clawgym_env.harness import Endpoint, HarnessAdapter
from clawgym_env.policy.base import SamplingOverrides
from clawgym_env.policy.sync_wait import SyncWaits, sync_waits_of
from clawgym_env.sandbox import (
    AgentTimeout,
    ExecResult,
    PlaceFullError,
    SandboxLimits,
    SandboxSpec,
    get_backend,
    hidden_paths_with,
    host_toolchain_paths,
)
from clawgym_env.task import Task

if TYPE_CHECKING:
    from clawgym_env.proxy.server import ProxyServer
    from clawgym_env.proxy.sessions import EpisodeSession

log = logging.getLogger(__name__)
LOG_TAIL = 8000
MAX_CHANGES = 2000  # workspace changes listed in a record (an agent may create a million files)
NETWORK_TRACE = "/tmp/.clawgym-network-trace"


class EpisodeResult(NamedTuple):
    """The episode's record plus its captured calls (also written to ``record.calls_path``).

    The one shape in which an episode reaches the trainers: it is the ``(record, calls)`` pair they
    unpack (``rec, calls = result``), named. A shape that is not one converts where it is produced:
    :meth:`from_info` for a gym step's ``info``."""

    record: EpisodeRecord
    calls: list[CallRecord]

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> EpisodeResult:
        """The episode a :class:`~clawgym_env.envs.env.ClawGymEnv` step's ``info`` describes (its ``episode``
        record and its ``calls``, as JSON or as records). Raises :class:`ConfigError` naming what is missing."""
        if not isinstance(info, Mapping) or "episode" not in info or "calls" not in info:
            keys = sorted(info) if isinstance(info, Mapping) else type(info).__name__
            raise ConfigError(f"EpisodeResult.from_info needs an env step's info with 'episode' and 'calls', "
                              f"got {keys}")
        rec = info["episode"]
        return cls(rec if isinstance(rec, EpisodeRecord) else EpisodeRecord.model_validate(rec),
                   [c if isinstance(c, CallRecord) else CallRecord.model_validate(c) for c in info["calls"]])


def _snapshot(root: Path) -> dict[str, Entry]:
    return snapshot(root)


def workspace_changes(before: dict[str, Entry], after: dict[str, Entry]) -> list[WorkspaceChange]:
    """What differs between two :func:`~clawgym_env.files.workspace.snapshot` s of a workspace."""
    changes = [WorkspaceChange(path=p, change="added", size=after[p].size, kind=after[p].kind)
               for p in sorted(after.keys() - before.keys())]
    changes += [WorkspaceChange(path=p, change="modified", size=after[p].size, kind=after[p].kind)
                for p in sorted(after.keys() & before.keys()) if after[p] != before[p]]
    changes += [WorkspaceChange(path=p, change="deleted", kind=before[p].kind)
                for p in sorted(before.keys() - after.keys())]
    return changes


def prepare_workspace(task: Task, dest: Path) -> Path:
    """Copy the task's input files into a fresh workspace folder (:func:`copy_tree`: special files
    skipped, setuid/setgid bits dropped). Task folders are untrusted input: ``input_files/`` must lie
    inside the task folder and a link in it may only point inside it (copied as its file); anything
    else is a :class:`TaskError` and nothing of the host outside the task folder is read."""
    dest.mkdir(parents=True, exist_ok=True)
    if task.input_dir is not None and Path(task.input_dir).exists():
        src = Path(task.input_dir)
        root = Path(task.task_dir) if task.task_dir is not None else src
        if src.is_symlink() or not os.path.realpath(src).startswith(os.path.realpath(root) + os.sep) and \
                os.path.realpath(src) != os.path.realpath(root):
            raise TaskError(f"task {task.full_id}: input_files/ ({src}) leads out of the task folder {root}; "
                            "ship the input files inside the task folder")
        report = copy_tree(src, dest, links_inside=root)
        if report.refused_links:
            path, why = report.refused_links[0]
            raise TaskError(f"task {task.full_id}: input_files/{path} is a link that leads out of the task folder "
                            f"({why}); replace it by the file itself")
        if report.skipped:
            log.warning("task %s: special files not copied into the workspace: %s", task.id, report.skipped[:5])
    return dest


def run_episode(task: Task, adapter: HarnessAdapter, proxy: ProxyServer, *, sandbox: str = "bwrap",
                sampling: SamplingOverrides | Mapping[str, Any] | None = None, policy_version: int | None = None,
                out_dir: str | Path | None = None, keep_workspace: bool = False,
                episode_id: str | None = None, grade: bool = True, trace_network: bool = False,
                judge: Judge | None = None) -> EpisodeResult:
    """Run ``adapter``'s harness on ``task`` against ``proxy`` (a started ProxyServer).

    ``sampling``: what the episode imposes on every model call (:class:`SamplingOverrides`; a mapping
    of its fields is accepted and converted, an invalid one is a :class:`ProxyError` naming the field).

    ``trace_network`` runs the harness under ``strace`` (where installed) and keeps its socket
    syscalls in ``record.logs["network_trace"]``, for the conformance check.

    ``grade``: grade the episode with the task's grader (:func:`clawgym_env.grading.grade.grade_episode`:
    ``reward.sh``, hybrid or rubric judge); ``judge``: the LLM judge for graders that need one
    (``None``: the grader's default, the environment-configured judge). A grade with no valid
    reward makes the status ``reward_invalid`` (never a 0 to train on).

    Unless ``keep_workspace`` (or ``CLAWGYM_KEEP_WORKSPACES``), the workspace folder is removed when the
    episode ends, however it ends (an exception included): a try leaves its record, never its files.
    """
    episode_id = episode_id or uuid.uuid4().hex[:16]
    sampling = SamplingOverrides.of(sampling)
    t_start = time.monotonic()
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    root = (Path(out_dir).resolve() / episode_id if out_dir
            else Path(tempfile.mkdtemp(prefix=f"clawgym-ep-{episode_id}-")))
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(root, 0o700)  # run outputs are private to the user
    try:
        return _run(task, adapter, proxy, root, episode_id=episode_id, t_start=t_start, sandbox=sandbox,
                    sampling=sampling, policy_version=policy_version, grade=grade, trace_network=trace_network,
                    judge=judge)
    finally:
        if not keep_workspace and not os.environ.get("CLAWGYM_KEEP_WORKSPACES"):
            _remove_workspace(root / "workspace", episode_id)


def _remove_workspace(ws: Path, episode_id: str) -> None:
    if not os.path.lexists(ws):
        return
    try:
        remove_tree(ws)
    except OSError as exc:
        log.warning("episode %s: could not remove its workspace %s: %s", episode_id, ws, exc)


def _run(task: Task, adapter: HarnessAdapter, proxy: ProxyServer, root: Path, *, episode_id: str, t_start: float,
         sandbox: str, sampling: SamplingOverrides, policy_version: int | None, grade: bool, trace_network: bool,
         judge: Judge | None) -> EpisodeResult:
    """The body of :func:`run_episode` in the episode folder ``root`` (which removes the workspace after it):
    the stages in order, each a typed result (:mod:`clawgym_env.episodes.stages`), and the record built once
    from them. Each failure path (a broken task folder, the sandbox, the harness's launch, the grader) ends in
    its stage's verdict, and so in a record."""
    ids = EpisodeIds(episode_id=episode_id, task_id=task.id, suite=task.suite, harness=adapter.name,
                     policy=getattr(proxy.policy, "name", "policy"), sampling=sampling.as_dict(),
                     policy_version=policy_version if policy_version is not None
                     else getattr(proxy.policy, "version", 0))
    try:
        ws = prepare_workspace(task, root / "workspace")
    except TaskError as exc:  # a broken or hostile task folder: nobody's outcome, never trained or scored
        log.warning("episode %s: %s", episode_id, exc)
        rec = assemble_record(ids, failure=Verdict("infra_error", "task", str(exc)), wall_s=time.monotonic() - t_start)
        write_record(root / "episode.json", rec)
        return EpisodeResult(rec, [])
    before = _snapshot(ws)
    session = proxy.open_episode(episode_id, task=task, harness=adapter.name, sampling=sampling,
                                 policy_version=policy_version, calls_path=root / "calls.jsonl")
    waits = sync_waits_of(proxy.policy)
    try:
        boxed = sandbox_stage(task, adapter, session, root, ws, episode_id=episode_id, sandbox=sandbox,
                              trace_network=trace_network, sync_waits=waits)
    finally:
        served = proxy.close_episode(session.token)
        if waits is not None:
            waits.forget(episode_id)
    proxied = proxy_stage(served, adapter, session, proxy, root / "calls.jsonl")
    harness = workspace = graded = None
    if boxed.run is not None:
        harness = harness_stage(task, adapter, boxed.run, proxied, network_trace=boxed.network_trace)
        workspace = workspace_stage(task, ws, before, episode_id)
        if grade and harness.verdict.status != "infra_error":  # nothing the agent did is left to grade
            graded = grade_stage(task, ws, harness, sandbox=sandbox, judge=judge, episode_id=episode_id)
    rec = assemble_record(ids, sandbox=boxed, proxy=proxied, harness=harness, workspace=workspace, grade=graded,
                          wall_s=time.monotonic() - t_start)
    try:
        write_record(root / "episode.json", rec)
    except OSError as exc:
        log.error("episode %s: could not write %s: %s", episode_id, root / "episode.json", exc)
    return EpisodeResult(rec, list(proxied.calls))


def sandbox_stage(task: Task, adapter: HarnessAdapter, session: EpisodeSession, root: Path, ws: Path, *,
                  episode_id: str, sandbox: str, trace_network: bool,
                  sync_waits: SyncWaits | None = None) -> SandboxStage:
    """Launch the harness in a sandbox on ``ws`` against the proxy ``session`` and wait for it.

    ``sync_waits``: the policy's ledger of calls held back by weight syncs; the time this episode's calls
    spend held there while the harness runs is not charged against ``task.limits.timeout_s`` and is the
    stage's ``sync_wait_s`` (None without a ledger).

    A :class:`SandboxError` (the sandbox could not start or failed) or another :class:`ClawGymError` (the
    adapter could not configure or launch its harness) is the stage's ``failure``, with what was measured
    before it; any other exception propagates (the caller closes the proxy's episode)."""
    if session.socket_path is None:  # ProxyServer.open_episode gives every episode its own socket
        raise RuntimeError(f"episode {episode_id}: the proxy opened no socket for it")
    run: ExecResult | None = None
    failure: Verdict | None = None
    start_s = harness_s = started_at = peak_mb = None
    limits_hit: tuple[str, ...] | None = None
    network_trace: str | None = None
    held_before = sync_waits.waited_s(episode_id) if sync_waits is not None else 0.0

    def held_s() -> float:  # this episode's calls held at the policy's sync gate since the stage began
        return sync_waits.waited_s(episode_id) - held_before if sync_waits is not None else 0.0

    timeout: float = task.limits.timeout_s if sync_waits is None else AgentTimeout(task.limits.timeout_s, held_s)
    sync_s: float | None = None
    try:
        spec = SandboxSpec(workspace_host=ws, workspace_target=task.mount_dir, proxy_socket=session.socket_path,
                           ro_paths=host_toolchain_paths() + list(adapter.ro_paths()),
                           hidden_paths=hidden_paths_with(task.private_folders()),
                           limits=SandboxLimits(**task.limits.sandbox_overrides()))
        if trace_network:  # DNS queries are then sent (to nobody) and show up, names included, in the trace
            (root / "resolv.conf").write_text("nameserver 127.0.0.1\n")
            spec.extra_binds.append((root / "resolv.conf", "/etc/resolv.conf", False))
        endpoint = Endpoint(base_url=f"http://127.0.0.1:{spec.proxy_port}/ep/{session.token}/v1",
                            api_key=session.token)
        launch = adapter.launch(task, endpoint, home=spec.home)
        t0 = time.monotonic()
        with get_backend(sandbox)(spec) as sb:
            for path, content in launch.files.items():
                sb.write_file(path, content)
            start_s = time.monotonic() - t0
            t1 = time.monotonic()
            argv = list(launch.argv)
            if trace_network and shutil.which("strace"):
                argv = ["strace", "-f", "-qq", "-e", "trace=connect,sendto,sendmsg,sendmmsg", "-s", "96",
                        "-o", NETWORK_TRACE] + argv
            started_at = time.time()
            run = sb.exec(argv, env=launch.env, cwd=launch.cwd or task.mount_dir, timeout=timeout)
            sync_s = held_s() if sync_waits is not None else None
            harness_s = time.monotonic() - t1
            if trace_network:
                try:
                    network_trace = sb.read_file(NETWORK_TRACE).decode(errors="replace")[-200_000:]
                except SandboxError:
                    network_trace = "(no trace: strace is not installed or did not run)"
            peak = sb.peak_memory_bytes()
            if peak is not None:
                peak_mb = peak / 2**20
            limits_hit = tuple(sb.limits_hit())  # disk/inodes per place, memory (OOM kill), cpu: its outcome
    except SandboxError as exc:
        log.warning("episode %s: sandbox failure: %s", episode_id, exc)
        failure = sandbox_failure(exc)
    except ClawGymError as exc:  # the adapter could not configure or launch its harness
        log.warning("episode %s: harness launch failure: %s", episode_id, exc)
        failure = Verdict("infra_error", "harness", f"the harness could not launch: {exc}")
    return SandboxStage(run=run, failure=failure, sandbox_start_s=start_s, harness_s=harness_s,
                        harness_started_at=started_at, peak_memory_mb=peak_mb, limits_hit=limits_hit,
                        network_trace=network_trace, sync_wait_s=sync_s)


def proxy_stage(served: list[CallRecord], adapter: HarnessAdapter, session: EpisodeSession, proxy: ProxyServer,
                calls_path: Path) -> ProxyStage:
    """The calls the proxy served, labelled with their kinds and dead retries (what the trainers may train on,
    :func:`classify_calls`) and written over the unlabelled ones it streamed to ``calls_path``."""
    calls = classify_calls(served, adapter)
    if calls or not calls_path.exists():  # the proxy streamed the calls unlabelled: replace them whole
        tmp = calls_path.with_name(calls_path.name + ".labelled")
        write_jsonl(tmp, calls)
        os.replace(tmp, calls_path)
    return ProxyStage(calls=tuple(calls), calls_path=str(calls_path),
                      failures=tuple(getattr(session, "failures", None) or ()),
                      running=bool(getattr(proxy, "running", True)))


def harness_stage(task: Task, adapter: HarnessAdapter, run: ExecResult, proxied: ProxyStage, *,
                  network_trace: str | None) -> HarnessStage:
    """What the harness said (its adapter reads its output; an adapter that raises fails the episode's run)
    and the verdict on its run (:func:`classify_run`)."""
    out = adapter.read_output(run.stdout, run.stderr)
    logs = {"stdout": run.stdout[-LOG_TAIL:], "stderr": run.stderr[-LOG_TAIL:]}
    if network_trace is not None:
        logs["network_trace"] = network_trace
    verdict = classify_run(returncode=run.returncode, timed_out=run.timed_out, final_message=out.final_message,
                           stderr=run.stderr, timeout_s=task.limits.timeout_s, num_calls=len(proxied.calls),
                           last_call_end=proxied.last_call_end, call_failures=list(proxied.failures),
                           proxy_running=proxied.running)
    return HarnessStage(final_message=out.final_message, transcript=out.transcript, exit_code=run.returncode,
                        logs=logs, verdict=verdict)


def workspace_stage(task: Task, ws: Path, before: dict[str, Entry], episode_id: str) -> WorkspaceStage:
    """What differs in ``ws`` from ``before`` (at most :data:`MAX_CHANGES` listed) and the task's own input
    files the agent changed (visible whether or not the grader restores them). A listing that fails is
    noted in the stage's logs: it never costs the episode its record."""
    logs: dict[str, str] = {}
    changes: list[WorkspaceChange] | None = None
    inputs = None
    try:
        found = workspace_changes(before, _snapshot(ws))
        if len(found) > MAX_CHANGES:
            logs["workspace_changes"] = f"{len(found)} changes, the first {MAX_CHANGES} listed"
        changes = found[:MAX_CHANGES]
    except Exception as exc:  # noqa: BLE001 - a listing must never cost the episode its record
        log.error("episode %s: listing the workspace failed", episode_id, exc_info=exc)
        logs["workspace_changes_error"] = f"{type(exc).__name__}: {exc}"
    try:
        inputs = tuple(modified_inputs(task, ws))
    except OSError as exc:
        logs["inputs_modified_error"] = f"{type(exc).__name__}: {exc}"
    return WorkspaceStage(changes=None if changes is None else tuple(changes), inputs_modified=inputs, logs=logs)


def grade_stage(task: Task, ws: Path, harness: HarnessStage, *, sandbox: str, judge: Judge | None,
                episode_id: str) -> GradeStage:
    """Grade the final workspace (:func:`grade_episode`) and the verdict after it.

    A grade with no valid reward makes the status ``reward_invalid`` (never the agent's 0); a verifier
    that failed makes an ``ok`` episode ``reward_error``; a workspace too big for the grader's room (past
    the agent's own quotas) is the agent's 0; the grader's sandbox failing or the grader raising is
    ``infra_error``. Whenever grading changes the status, the boundary is ``grader``."""
    before = harness.verdict
    status, error = before.status, before.error
    reward, subscores, reason = 0.0, {}, None
    logs: dict[str, str] = {}
    t0 = time.monotonic()
    try:
        rr = grade_episode(task, ws, final_message=harness.final_message, transcript=harness.transcript,
                           sandbox=sandbox, judge=judge)
        reward, subscores, reason = rr.reward, rr.subscores, rr.reason
        if rr.notes:
            logs["grader_notes"] = "\n".join(rr.notes)
        if not rr.valid:  # no valid reward: never the agent's 0, whatever else happened
            status, error = "reward_invalid", rr.reason
        elif not rr.ok and status == "ok":
            status = "reward_error"
        logs["reward_stdout"] = rr.stdout[-LOG_TAIL:]
        logs["reward_stderr"] = rr.stderr[-LOG_TAIL:]
    except PlaceFullError as exc:  # past the grader's room only if past the agent's own quotas: its 0
        reward, subscores, reason = 0.0, {}, f"the final workspace could not be graded: {exc}"
        if status == "ok":
            status = "reward_error"
    except SandboxError as exc:
        status, reward, error = "infra_error", 0.0, f"reward sandbox failure: {exc}"
    except Exception as exc:  # noqa: BLE001 - a grading bug: this episode's record says so, nothing escapes
        log.error("episode %s: grading raised", episode_id, exc_info=exc)
        status, reward, error = "infra_error", 0.0, internal_failure(exc, "grading").error
    reward_s = time.monotonic() - t0
    verdict = before if status == before.status else Verdict(status, "grader", error)
    return GradeStage(verdict=verdict, reward=reward, subscores=subscores, reward_reason=reason, logs=logs,
                      reward_s=reward_s)
