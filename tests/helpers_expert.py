"""Run a task's scripted expert and its verifier on the host, for tests (not hermetic).

This is a test helper: steps run with the host's bash and python, unsandboxed, in a temp
workspace. The sandboxed grading path lives elsewhere. Invariants:
  * :func:`stage_workspace` copies ``input_files/`` verbatim (nothing else: never ``reward/`` or
    ``expert.json``) into the workspace;
  * :func:`apply_steps` runs tool steps in order with cwd = the workspace and refuses paths that
    leave it; it returns the final answer (the ``{"final": ...}`` step) and a transcript;
  * :func:`grade_on_host` runs ``python3 <task>/reward/check.py <workspace>`` with
    ``OPENCLAW_REWARD_PAYLOAD`` pointing at ``{task_id, user_query, metadata, final_message,
    transcript}`` and averages the printed dict exactly as the tasks' ``reward.sh`` does;
  * :func:`run_reward_sh_on_host` runs the task's own ``reward.sh`` with its mount dir rewritten to
    the temp workspace and ``reward/`` copied into it, as the sandbox would lay it out.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from clawgym_env.task import Task
from tasks.taskdir import PAYLOAD_ENV


@dataclasses.dataclass
class ExpertRun:
    final: str | None
    transcript: list[dict[str, Any]]


@dataclasses.dataclass
class HostGrade:
    score: float
    subscores: dict[str, float]
    stdout: str
    stderr: str
    returncode: int


def stage_workspace(task: Task, dest: Path) -> Path:
    """Create ``dest`` holding a copy of the task's input files; returns ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if task.input_dir is not None:
        shutil.copytree(task.input_dir, dest, dirs_exist_ok=True)
    return dest


def _inside(workspace: Path, rel: str) -> Path:
    p = (workspace / rel).resolve()
    if p != workspace.resolve() and workspace.resolve() not in p.parents:
        raise ValueError(f"step path {rel!r} leaves the workspace")
    return p


def apply_steps(steps: list[dict[str, Any]], workspace: Path, *, timeout_s: float = 60.0) -> ExpertRun:
    """Apply expert steps (write_file / bash / read_file, then final) in ``workspace``."""
    workspace = Path(workspace)
    transcript: list[dict[str, Any]] = []
    final: str | None = None
    for step in steps:
        if "final" in step:
            final = step["final"]
            transcript.append({"role": "assistant", "content": final})
            break
        tool = step["tool"]
        transcript.append({"role": "assistant", "tool": tool,
                           "arguments": {k: v for k, v in step.items() if k != "tool"}})
        if tool == "write_file":
            p = _inside(workspace, step["path"])
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(step["content"], encoding="utf-8")
            out = f"wrote {len(step['content'])} chars to {step['path']}"
        elif tool == "read_file":
            out = _inside(workspace, step["path"]).read_text(encoding="utf-8", errors="replace")
        elif tool == "bash":
            proc = subprocess.run(["bash", "-c", step["command"]], cwd=workspace, capture_output=True,
                                  text=True, timeout=timeout_s)
            out = proc.stdout + proc.stderr + (f"\n[exit {proc.returncode}]" if proc.returncode else "")
        else:
            raise ValueError(f"unknown expert tool {tool!r}")
        transcript.append({"role": "tool", "content": out})
    return ExpertRun(final=final, transcript=transcript)


def write_payload(task: Task, path: Path, final_message: str | None,
                  transcript: list[dict[str, Any]] | None = None) -> Path:
    """Write the verifier payload JSON for ``task`` to ``path``."""
    payload = {"task_id": task.id, "user_query": task.instruction, "metadata": task.metadata,
               "final_message": final_message, "transcript": transcript or []}
    Path(path).write_text(json.dumps(payload), encoding="utf-8")
    return Path(path)


def average(data: Any) -> float:
    """The reward.sh rule: mean of a dict's values, a bare number as is, anything else 0."""
    if isinstance(data, dict) and data:
        return sum(float(v) for v in data.values()) / len(data)
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    return 0.0


def guest_local_env(workspace: Path) -> dict[str, str]:
    """The environment that lets a check's ``import clawgym_guest`` work on the host, unsandboxed
    (``CLAWGYM_GUEST_LOCAL``): the client module on ``PYTHONPATH``, the workspace named."""
    from clawgym_env.grading import guest_client

    lib = Path(workspace).parent / "clawgym-guest-lib"
    lib.mkdir(exist_ok=True)
    shutil.copyfile(guest_client.__file__, lib / "clawgym_guest.py")
    extra = os.environ.get("PYTHONPATH")
    return {guest_client.LOCAL_ENV: str(workspace),
            "PYTHONPATH": str(lib) + (os.pathsep + extra if extra else "")}


def run_check(task: Task, workspace: Path, payload_path: Path | None, *,
              timeout_s: float = 60.0) -> HostGrade:
    """Run ``reward/check.py`` on ``workspace``; ``payload_path`` None leaves the env var unset."""
    assert task.reward_dir is not None
    env = {k: v for k, v in os.environ.items() if k != PAYLOAD_ENV}
    if payload_path is not None:
        env[PAYLOAD_ENV] = str(payload_path)
    env.update(guest_local_env(workspace))
    proc = subprocess.run([sys.executable, str(task.reward_dir / "check.py"), str(workspace)],
                          capture_output=True, text=True, timeout=timeout_s, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        data = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        data = None
    subscores = {k: float(v) for k, v in data.items()} if isinstance(data, dict) else {}
    return HostGrade(score=average(data), subscores=subscores, stdout=proc.stdout,
                     stderr=proc.stderr, returncode=proc.returncode)


def grade_on_host(task: Task, workspace: Path, final_message: str | None,
                  transcript: list[dict[str, Any]] | None = None, *,
                  payload_path: Path | None = None, timeout_s: float = 60.0) -> HostGrade:
    """Write the payload next to ``workspace``, run ``reward/check.py`` and average its dict."""
    payload_path = payload_path or Path(workspace).parent / f"{task.id}.payload.json"
    write_payload(task, payload_path, final_message, transcript)
    return run_check(task, workspace, payload_path, timeout_s=timeout_s)


def run_reward_sh_on_host(task: Task, workspace: Path, payload_path: Path, *,
                          timeout_s: float = 60.0) -> tuple[float | None, str]:
    """Run the task's own reward.sh against ``workspace`` (its mount dir rewritten); (score, output)."""
    assert task.reward_dir is not None
    dest = Path(workspace) / "reward"
    shutil.copytree(task.reward_dir, dest, dirs_exist_ok=True)
    script = (dest / "reward.sh").read_text(encoding="utf-8").replace(task.mount_dir, str(workspace))
    env = {**os.environ, PAYLOAD_ENV: str(payload_path), **guest_local_env(workspace)}
    proc = subprocess.run(["bash", "-c", script], cwd=workspace, capture_output=True, text=True,
                          timeout=timeout_s, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        return (float(lines[-1]) if lines else None), proc.stdout + proc.stderr
    except ValueError:
        return None, proc.stdout + proc.stderr
