"""Hermetic reward: the verifier runs in a *fresh* sandbox over a copy of the final workspace.

Procedure (invariants):
  1. the final workspace is copied without following any link on the host (links stay links,
     special files are skipped; :func:`clawgym_env.files.workspace.copy_tree`);
  2. the copy is made safe to grade (:func:`_prepare_for_grading`, each change a note on the result):
     whatever the agent left at ``reward/`` is deleted; the task's ``protected_inputs`` are put back
     as shipped (:func:`clawgym_env.grading.inputs.restore_protected`); links that would lead the verifier
     into ``reward/`` or through ``/proc``/``/dev`` are removed (:mod:`clawgym_env.grading.reward_links`);
  2b. the task's pristine ``reward/`` is copied aside, sealed (0444/0555, owned by this process, never
     the sandbox's user) and mounted **read-only** at ``<mount>/reward``: no code the verifier runs can
     change the verifier's program or data, whatever it executes. The task folder is untrusted too: a
     ``reward/`` that is itself a link, or holds a link whose target is not a file inside the task
     folder, is refused (``reward_invalid``, "task error: ..."), so no host file outside the task folder
     ever reaches the verifier or its logs;
  2c. a :class:`~clawgym_env.grading.guest.GuestBroker` serves ``clawgym_guest`` (on the verifier's path): the
     agent's code a check runs through it executes in a guest sandbox of its own, never in the verifier's,
     and only data comes back; the result channel (``reward.sh``'s stdout) is out of the guest's reach;
  3. the payload ``{task_id, user_query, metadata, final_message, transcript}`` is written to a
     private file named by ``OPENCLAW_REWARD_PAYLOAD``;
  4. ``bash <mount>/reward/reward.sh`` runs as is, with no network, in an environment built from
     scratch, with the workspace as its current folder; its last non-empty stdout line must be a
     float in [0, 1]. A non-float line, a non-zero exit or a timeout scores 0 *with the reason*;
  5. module shadowing is impossible: every Python the verifier starts runs with
     ``PYTHONSAFEPATH=1`` and the grader's ``sitecustomize`` (:data:`GRADER_SITE`), so for
     ``python3 -c``/``-m``/stdin the current folder (the agent's workspace) is searched *after*
     the standard library and site-packages — a ``json.py`` or ``re.py`` left there is never
     imported instead of the real module, while the agent's own modules stay importable — and a
     script's own folder stays first on ``sys.path`` as usual (``reward/check.py`` imports its
     siblings). ``PATH`` holds only system and interpreter folders, ``BASH_ENV``/``PYTHONPATH``/
     ``LD_PRELOAD`` are never inherited, user site-packages are off, ``/etc`` is read-only.
     Needs Python >= 3.11 in the sandbox (``PYTHONSAFEPATH``); an honest workspace scores exactly
     what the official pipeline gives unless it holds a module named like a standard one;
  6. if the sandbox (or a guest sandbox) cannot start, :class:`SandboxError` propagates: an
     infrastructure failure is never silently scored 0.
Sub-scores come from running ``reward/check.py <mount>`` (when present) in the same sandbox.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from clawgym_env.errors import ClawGymError, SandboxError
from clawgym_env.files.walk import iter_entries
from clawgym_env.grading import guest_client
from clawgym_env.grading.grade import GradeContext, GradeResult, GradeStatus
from clawgym_env.grading.guest import SOCKET_NAME, GuestBroker
from clawgym_env.grading.inputs import restore_protected
from clawgym_env.grading.reward_links import drop_links_into_reward
from clawgym_env.grading.room import copy_failure, copy_limits, grader_room
from clawgym_env.jsontypes import JSONObject
from clawgym_env.sandbox import SandboxLimits, SandboxSpec, get_backend, hidden_paths_with

PAYLOAD_PATH = "/tmp/clawgym-reward-payload.json"
GRADER_SITE_DIR = "/run/clawgym-grader"
"""Where the grader's ``sitecustomize`` is mounted read-only inside the grading sandbox."""

GRADER_SITE = '''\
"""ClawGym grader: restore sys.path[0] for scripts under PYTHONSAFEPATH; the grader's lib, then the cwd, go last."""
import os as _os
import sys as _sys


def _clawgym_grader_path():
    here = _os.path.dirname(_os.path.abspath(__file__))
    _sys.path[:] = [p for p in _sys.path if p and _os.path.abspath(p) != here]
    _sys.path.append(_os.path.join(here, "lib"))  # clawgym_guest: before the workspace, never shadowed by it
    import importlib.machinery as _m

    own = _m.PathFinder.find_spec("sitecustomize", list(_sys.path))  # the interpreter's own, if any
    if getattr(_sys.flags, "safe_path", False):
        arg0 = _sys.argv[0] if _sys.argv else ""
        if arg0 in ("", "-", "-c"):
            _sys.path.append("")  # python -c / stdin: the current folder, after every real module
        elif arg0 == "-m":
            _sys.path.append(_os.getcwd())
        else:  # a script: its own folder first, as without PYTHONSAFEPATH
            full = _os.path.realpath(arg0)
            _sys.path.insert(0, full if _os.path.isdir(full) else _os.path.dirname(full))
    if own is not None and own.loader is not None:
        import importlib.util as _u

        own.loader.exec_module(_u.module_from_spec(own))


_clawgym_grader_path()
del _clawgym_grader_path
'''

HERMETIC_ENV = {"PYTHONSAFEPATH": "1", "PYTHONPATH": GRADER_SITE_DIR, "PYTHONNOUSERSITE": "1",
                "PYTHONDONTWRITEBYTECODE": "1"}
"""Added to the verifier's from-scratch environment (see the module doc, point 5)."""


class TaskFolderError(ClawGymError):
    """A task's ``reward/`` folder cannot be used safely (a link out of the task folder, ...)."""


@dataclasses.dataclass
class RewardResult:
    """The outcome of a task's ``reward.sh`` (and ``check.py`` sub-scores) over one workspace: the
    reward in [0, 1], whether the verifier ran cleanly, and its output tails."""

    reward: float
    subscores: dict[str, float]
    ok: bool
    reason: str | None = None
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    invalid: bool = False
    """True when no valid reward exists (the task's verifier folder is unusable): not the agent's 0."""
    notes: list[str] = dataclasses.field(default_factory=list)
    """What the grader changed in its copy of the workspace before grading (a planted ``reward/`` removed,
    protected inputs restored, links into ``reward/`` removed), each with its reason."""


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


def build_payload(task: Any, final_message: str | None, transcript: list[Any] | None) -> JSONObject:
    """The JSON the verifier reads from ``$OPENCLAW_REWARD_PAYLOAD``: the task, its instruction and
    metadata, the agent's final message and transcript (empty when absent)."""
    return {"task_id": task.id, "user_query": task.instruction, "metadata": task.metadata,
            "final_message": final_message or "", "transcript": transcript or []}


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def copy_reward_dir(task: Any, dest: Path) -> None:
    """Copy the task's ``reward/`` to ``dest`` without ever following a link out of the task folder.

    Links inside the task folder to regular files are copied as files; anything else raises
    :class:`TaskFolderError` naming the offending path (nothing outside is read)."""
    from clawgym_env.files.workspace import copy_tree

    reward_dir = Path(task.reward_dir)
    root = Path(task.task_dir) if getattr(task, "task_dir", None) else reward_dir.parent
    root_real = os.path.realpath(root)
    if os.path.islink(reward_dir) and not _inside(os.path.realpath(reward_dir), root_real):
        raise TaskFolderError(f"task error: {reward_dir} is a link out of the task folder {root}; "
                              "a task's reward/ must be a real folder inside it")
    if not _inside(os.path.realpath(reward_dir), root_real):
        raise TaskFolderError(f"task error: {reward_dir} is not inside the task folder {root}")
    report = copy_tree(reward_dir, dest, links_inside=root_real)
    if report.refused_links or report.skipped:
        bad = [f"{p} ({why})" for p, why in [*report.refused_links, *report.skipped]]
        raise TaskFolderError(f"task error: {reward_dir} holds links out of the task folder or special files, "
                              f"refused: {', '.join(bad[:5])}; replace them with regular files")


def grader_limits(task: Any) -> SandboxLimits:
    """The grader's sandbox limits: its own room (:func:`clawgym_env.grading.room.grader_room`): the agent's disk and
    inode quotas plus a reserve and the task's ``reward/``, so a workspace the agent filled to its quotas fits; the
    agent's memory and CPU caps do not bind the grader."""
    return grader_room(task)


def grade_workspace(task: Any, workspace: str | Path, *, final_message: str | None = None,
                    transcript: list[Any] | None = None, sandbox: str = "bwrap") -> RewardResult:
    """Grade ``workspace`` (a host folder, left untouched) for ``task`` in a fresh sandbox."""
    if task.reward_dir is None or not (Path(task.reward_dir) / "reward.sh").exists():
        return RewardResult(0.0, {}, False, f"task error: task {task.full_id} has no reward/reward.sh; add one, or "
                            "give the task a grader that needs none", invalid=True)
    from clawgym_env.files.workspace import copy_tree, private_tempdir

    t0 = time.monotonic()
    backend = get_backend(sandbox)
    with private_tempdir("clawgym-grade-") as tmp:
        ws = tmp / "workspace"
        try:  # bounded by the grader's room and deadline (clawgym_env.grading.room), a million files included
            copy_tree(workspace, ws, **copy_limits(task, now=t0))
        except (OSError, ClawGymError) as exc:  # unreadable, or past the agent's own quotas or the deadline: its 0
            return RewardResult(0.0, {}, False, copy_failure(exc), wall_s=time.monotonic() - t0)
        notes = _prepare_for_grading(task, ws)
        reward_copy = tmp / "reward"
        try:
            copy_reward_dir(task, reward_copy)
        except TaskFolderError as exc:
            return RewardResult(0.0, {}, False, str(exc), wall_s=time.monotonic() - t0, invalid=True)
        seal_tree(reward_copy)
        (ws / "reward").mkdir(mode=0o755)  # the mount point of the sealed copy
        site = tmp / "grader-site"
        site.mkdir(mode=0o755)
        (site / "sitecustomize.py").write_text(GRADER_SITE)
        (site / "lib").mkdir(mode=0o755)
        (site / "lib" / "clawgym_guest.py").write_text(Path(guest_client.__file__).read_text())
        limits = grader_limits(task)
        spec = SandboxSpec(workspace_host=ws, workspace_target=task.mount_dir,
                           extra_binds=[(site, GRADER_SITE_DIR, False),
                                        (reward_copy, f"{task.mount_dir}/reward", False)],
                           env={"OPENCLAW_REWARD_PAYLOAD": PAYLOAD_PATH, **HERMETIC_ENV,
                                guest_client.SOCKET_ENV: f"{GRADER_SITE_DIR}/{SOCKET_NAME}"},
                           hidden_paths=hidden_paths_with(task.private_folders()), limits=limits, hand_back=False)
        budget = task.limits.reward_timeout_s
        lim = copy_limits(task)
        caps = {"max_bytes": lim["max_bytes"], "max_entries": lim["max_entries"]}
        with GuestBroker(socket_dir=site, base=ws, mount=task.mount_dir, sandbox=sandbox, limits=limits,
                         deadline=time.monotonic() + budget, work_dir=tmp, copy_caps=caps,
                         hidden=task.private_folders()) as broker, \
                backend(spec) as sb:
            sb.write_file(PAYLOAD_PATH, json.dumps(build_payload(task, final_message, transcript)))
            res = sb.exec(["bash", f"{task.mount_dir}/reward/reward.sh"], cwd=task.mount_dir, timeout=budget)
            reward, ok, reason = parse_reward_output(res.stdout, res.returncode, res.timed_out)
            subscores: dict[str, float] = {}
            if (reward_copy / "check.py").exists() and not res.timed_out:
                broker.renew(time.monotonic() + budget)
                sub = sb.exec(["python3", f"{task.mount_dir}/reward/check.py", task.mount_dir], cwd=task.mount_dir,
                              timeout=budget)
                subscores = _parse_subscores(sub.stdout)
        if broker.failure is not None:  # a guest sandbox could not start: infrastructure, never the agent's 0
            raise SandboxError(f"the grader's guest sandbox failed: {broker.failure}")
    return RewardResult(reward, subscores, ok, reason, res.stdout[-4000:], res.stderr[-4000:], time.monotonic() - t0,
                        notes=notes)


def _prepare_for_grading(task: Any, ws: Path) -> list[str]:
    """Make the grader's copy of the workspace safe to grade; returns what was changed, as notes.

    Whatever the agent left at ``reward/`` goes (the task's own is mounted there, sealed); protected inputs
    are put back as the task shipped them; links that would lead the verifier into ``reward/`` (or through
    ``/proc``, ``/dev``) are removed."""
    from clawgym_env.files.workspace import remove_tree

    notes: list[str] = []
    planted = ws / "reward"
    if os.path.lexists(planted):
        notes.append("removed what the agent left at reward/ (the task's own verifier folder goes there)")
        if planted.is_symlink() or not planted.is_dir():
            planted.unlink()
        else:
            remove_tree(planted)
    restored = restore_protected(task, ws)
    if restored:
        notes.append(f"restored {len(restored)} protected input(s) as the task shipped them: "
                     f"{', '.join(restored[:10])}")
    dropped = drop_links_into_reward(ws, task.mount_dir)
    if dropped:
        notes.append(f"removed {len(dropped)} link(s) the verifier must not follow: {'; '.join(dropped[:5])}")
    return notes


def seal_tree(root: Path) -> None:
    """Make the host copy ``root`` readable by anyone and writable by no one but its owner (this process):
    folders 0555, files 0444 (0555 when executable); the grading sandbox also mounts it read-only."""
    for entry in [*iter_entries(root)]:
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            os.chmod(entry.path, 0o555)
        else:
            os.chmod(entry.path, 0o555 if entry.stat(follow_symlinks=False).st_mode & 0o111 else 0o444)
    os.chmod(root, 0o555)


class ScriptGrader:
    """The task's own ``reward/reward.sh``, run hermetically (:func:`grade_workspace`)."""

    name = "reward.sh"
    needs_judge = False

    def grade(self, ctx: GradeContext) -> GradeResult:
        """Run the task's ``reward.sh`` over ``ctx.workspace`` in a fresh sandbox; an unusable verifier
        folder gives ``reward_invalid``, a failing verifier ``reward_error``."""
        rr = grade_workspace(ctx.task, ctx.workspace, final_message=ctx.final_message, transcript=ctx.transcript,
                             sandbox=ctx.sandbox)
        status: GradeStatus = "reward_invalid" if rr.invalid else ("ok" if rr.ok else "reward_error")
        return GradeResult(rr.reward, rr.subscores, status, rr.reason, self.name, rr.stdout, rr.stderr, rr.wall_s,
                           notes=rr.notes)
