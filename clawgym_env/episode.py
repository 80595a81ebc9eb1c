"""One whole harness episode: task → sandbox → harness → proxy → captured calls → reward.

:func:`run_episode` never raises for a failed rollout: it returns an :class:`EpisodeResult` whose
record's ``status`` says what happened (``ok``, ``harness_error``, ``timeout``, ``no_final_answer``,
``reward_error``, ``infra_error``) with the logs. Only programming errors propagate.

Layout of an episode's folder (``out_dir/<episode_id>/``): ``episode.json`` (the record),
``calls.jsonl`` (one :class:`CallRecord` per model call), ``workspace/`` (the final workspace,
kept when ``keep_workspace``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawgym_env.capture.records import CallRecord, EpisodeRecord, WorkspaceChange, write_jsonl
from clawgym_env.errors import SandboxError
from clawgym_env.reward import grade_workspace
from clawgym_env.sandbox import SandboxSpec, get_backend, host_toolchain_paths
from harness_adapters.base import Endpoint, HarnessAdapter
from tasks.base import Task

log = logging.getLogger(__name__)
LOG_TAIL = 8000
NETWORK_TRACE = "/tmp/.clawgym-network-trace"


@dataclass
class EpisodeResult:
    """The episode's record plus its captured calls (also written to ``record.calls_path``)."""

    record: EpisodeRecord
    calls: list[CallRecord]


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            out[str(p.relative_to(root))] = (len(data), hashlib.sha256(data).hexdigest())
    return out


def workspace_changes(before: dict[str, tuple[int, str]], after: dict[str, tuple[int, str]]) -> list[WorkspaceChange]:
    changes = [WorkspaceChange(path=p, change="added", size=after[p][0]) for p in sorted(after.keys() - before.keys())]
    changes += [WorkspaceChange(path=p, change="modified", size=after[p][0])
                for p in sorted(after.keys() & before.keys()) if after[p] != before[p]]
    changes += [WorkspaceChange(path=p, change="deleted") for p in sorted(before.keys() - after.keys())]
    return changes


def prepare_workspace(task: Task, dest: Path) -> Path:
    """Copy the task's input files verbatim into a fresh workspace folder."""
    dest.mkdir(parents=True, exist_ok=True)
    if task.input_dir is not None and Path(task.input_dir).exists():
        shutil.copytree(task.input_dir, dest, dirs_exist_ok=True, symlinks=True)
    return dest


def run_episode(task: Task, adapter: HarnessAdapter, proxy: Any, *, sandbox: str = "bwrap",
                sampling: dict[str, Any] | None = None, policy_version: int | None = None,
                out_dir: str | Path | None = None, keep_workspace: bool = False,
                episode_id: str | None = None, grade: bool = True, trace_network: bool = False) -> EpisodeResult:
    """Run ``adapter``'s harness on ``task`` against ``proxy`` (a started ProxyServer).

    ``trace_network`` runs the harness under ``strace`` (where installed) and keeps its socket
    syscalls in ``record.logs["network_trace"]``, for the conformance check.
    """
    episode_id = episode_id or uuid.uuid4().hex[:16]
    t_start = time.monotonic()
    root = (Path(out_dir).resolve() / episode_id if out_dir
            else Path(tempfile.mkdtemp(prefix=f"clawgym-ep-{episode_id}-")))
    root.mkdir(parents=True, exist_ok=True)
    ws = prepare_workspace(task, root / "workspace")
    before = _snapshot(ws)
    timings: dict[str, float] = {}
    record = dict(episode_id=episode_id, task_id=task.id, suite=task.suite, harness=adapter.name,
                  policy=getattr(proxy.policy, "name", "policy"), sampling=dict(sampling or {}),
                  policy_version=policy_version if policy_version is not None else getattr(proxy.policy, "version", 0))
    session = proxy.open_episode(episode_id, task=task, harness=adapter.name, sampling=sampling,
                                 policy_version=policy_version)
    calls: list = []
    res = None
    network_trace = None
    try:
        spec = SandboxSpec(workspace_host=ws, workspace_target=task.mount_dir, proxy_socket=Path(proxy.socket_path),
                           ro_paths=host_toolchain_paths() + list(adapter.ro_paths()))
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
            timings["sandbox_start_s"] = time.monotonic() - t0
            t1 = time.monotonic()
            argv = list(launch.argv)
            if trace_network and shutil.which("strace"):
                argv = ["strace", "-f", "-qq", "-e", "trace=connect,sendto,sendmsg,sendmmsg", "-s", "96",
                        "-o", NETWORK_TRACE] + argv
            record["resources"] = {"harness_started_at": time.time()}
            res = sb.exec(argv, env=launch.env, cwd=launch.cwd or task.mount_dir, timeout=task.limits.timeout_s)
            timings["harness_s"] = time.monotonic() - t1
            if trace_network:
                try:
                    network_trace = sb.read_file(NETWORK_TRACE).decode(errors="replace")[-200_000:]
                except SandboxError:
                    network_trace = "(no trace: strace is not installed or did not run)"
            peak = sb.peak_memory_bytes()
            if peak is not None:
                record["resources"]["peak_memory_mb"] = peak / 2**20
    except SandboxError as exc:
        log.warning("episode %s: sandbox failure: %s", episode_id, exc)
        record.update(status="infra_error", error=f"sandbox failure: {exc}")
    finally:
        calls = proxy.close_episode(session.token)
    calls_path = write_jsonl(root / "calls.jsonl", calls)
    record.update(num_calls=len(calls), calls_path=str(calls_path))
    if res is not None:
        out = adapter.read_output(res.stdout, res.stderr)
        record.update(final_message=out.final_message, exit_code=res.returncode,
                      logs={"stdout": res.stdout[-LOG_TAIL:], "stderr": res.stderr[-LOG_TAIL:]})
        if network_trace is not None:
            record["logs"]["network_trace"] = network_trace
        if res.timed_out:
            record.update(status="timeout", error=f"harness exceeded {task.limits.timeout_s:.0f} s")
        elif res.returncode != 0 and out.final_message is None:
            record.update(status="harness_error", error=f"harness exited with code {res.returncode}")
        elif out.final_message is None:
            record.update(status="no_final_answer", error="harness ended without a final answer")
        else:
            record["status"] = "ok"
        record["workspace_changes"] = workspace_changes(before, _snapshot(ws))
        if grade:
            t2 = time.monotonic()
            try:
                rr = grade_workspace(task, ws, final_message=out.final_message, transcript=out.transcript,
                                     sandbox=sandbox)
                record.update(reward=rr.reward, subscores=rr.subscores, reward_reason=rr.reason)
                if not rr.ok and record["status"] == "ok":
                    record["status"] = "reward_error"
                record["logs"]["reward_stdout"] = rr.stdout[-LOG_TAIL:]
                record["logs"]["reward_stderr"] = rr.stderr[-LOG_TAIL:]
            except SandboxError as exc:
                record.update(status="infra_error", reward=0.0, error=f"reward sandbox failure: {exc}")
            timings["reward_s"] = time.monotonic() - t2
    timings["proxy_generate_s"] = sum(c.timings.get("generate_s", 0.0) for c in calls)
    timings["proxy_total_s"] = sum(c.timings.get("total_s", 0.0) for c in calls)
    record.update(wall_s=time.monotonic() - t_start, timings=timings)
    rec = EpisodeRecord(**record)
    (root / "episode.json").write_text(rec.model_dump_json(indent=2))
    if not keep_workspace and not os.environ.get("CLAWGYM_KEEP_WORKSPACES"):
        shutil.rmtree(ws, ignore_errors=True)
    return EpisodeResult(rec, list(calls))
