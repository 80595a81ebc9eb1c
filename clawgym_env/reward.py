"""Hermetic reward: the verifier runs in a *fresh* sandbox over a copy of the final workspace.

Procedure (invariants):
  1. the final workspace is copied (symlinks kept as links, never followed on the host);
  2. whatever the agent left at ``reward/`` is deleted, then the task's pristine ``reward/`` is
     placed there — planting or editing files under ``reward/`` (including shadowing a Python
     module next to ``check.py``) cannot change the score;
  3. the payload ``{task_id, user_query, metadata, final_message, transcript}`` is written to a
     private file named by ``OPENCLAW_REWARD_PAYLOAD``;
  4. ``bash <mount>/reward/reward.sh`` runs with no network; its last non-empty stdout line must be
     a float in [0, 1]. A non-float line, a non-zero exit or a timeout scores 0 *with the reason*.
  5. if the sandbox itself cannot start, :class:`SandboxError` propagates: an infrastructure
     failure is never silently scored 0.
Sub-scores come from running ``reward/check.py <mount>`` (when present) in the same sandbox.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from clawgym_env.sandbox import SandboxSpec, get_backend
from tasks.base import Task

PAYLOAD_PATH = "/tmp/clawgym-reward-payload.json"


@dataclasses.dataclass
class RewardResult:
    reward: float
    subscores: dict[str, float]
    ok: bool
    reason: str | None = None
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0


def parse_reward_output(stdout: str, returncode: int, timed_out: bool) -> tuple[float, bool, str | None]:
    """(reward, ok, reason) from reward.sh's output per the contract above."""
    if timed_out:
        return 0.0, False, "reward.sh timed out"
    if returncode != 0:
        return 0.0, False, f"reward.sh exited with code {returncode}"
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        return 0.0, False, "reward.sh printed nothing"
    try:
        value = float(lines[-1])
    except ValueError:
        return 0.0, False, f"last line of reward.sh is not a float: {lines[-1][:80]!r}"
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        return 0.0, False, f"reward {value} is outside [0, 1]"
    return value, True, None


def _parse_subscores(stdout: str) -> dict[str, float]:
    for line in reversed(stdout.strip().splitlines()):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return {str(k): float(v) for k, v in obj.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {}


def build_payload(task: Task, final_message: str | None, transcript: list[Any] | None) -> dict[str, Any]:
    return {"task_id": task.id, "user_query": task.instruction, "metadata": task.metadata,
            "final_message": final_message or "", "transcript": transcript or []}


def grade_workspace(task: Task, workspace: str | Path, *, final_message: str | None = None,
                    transcript: list[Any] | None = None, sandbox: str = "bwrap") -> RewardResult:
    """Grade ``workspace`` (a host folder, left untouched) for ``task`` in a fresh sandbox."""
    if task.reward_dir is None or not (Path(task.reward_dir) / "reward.sh").exists():
        return RewardResult(0.0, {}, False, f"task {task.full_id} has no reward/reward.sh")
    t0 = time.monotonic()
    backend = get_backend(sandbox)
    with tempfile.TemporaryDirectory(prefix="clawgym-grade-") as tmp:
        ws = Path(tmp) / "workspace"
        shutil.copytree(workspace, ws, symlinks=True)
        planted = ws / "reward"
        if planted.is_symlink() or planted.is_file():
            planted.unlink()
        elif planted.exists():
            shutil.rmtree(planted)
        shutil.copytree(task.reward_dir, planted, symlinks=False)
        spec = SandboxSpec(workspace_host=ws, workspace_target=task.mount_dir,
                           env={"OPENCLAW_REWARD_PAYLOAD": PAYLOAD_PATH, "PYTHONDONTWRITEBYTECODE": "1",
                                "PYTHONNOUSERSITE": "1"})
        with backend(spec) as sb:
            sb.write_file(PAYLOAD_PATH, json.dumps(build_payload(task, final_message, transcript)))
            res = sb.exec(["bash", f"{task.mount_dir}/reward/reward.sh"], cwd=task.mount_dir,
                          timeout=task.limits.reward_timeout_s)
            reward, ok, reason = parse_reward_output(res.stdout, res.returncode, res.timed_out)
            subscores: dict[str, float] = {}
            if (planted / "check.py").exists() and not res.timed_out:
                sub = sb.exec(["python3", f"{task.mount_dir}/reward/check.py", task.mount_dir], cwd=task.mount_dir,
                              timeout=task.limits.reward_timeout_s)
                subscores = _parse_subscores(sub.stdout)
    return RewardResult(reward, subscores, ok, reason, res.stdout[-4000:], res.stderr[-4000:], time.monotonic() - t0)
