"""What the audit's adversaries may know about a task: read from its folder, never hand-written per task.

An adversary of :mod:`leaderboards.audit.kit` is generic: it is built from a task's :class:`TaskFacts` —
the files of ``input_files/`` (and which of them the task protects), the file names under ``reward/``
and the standard modules its checks import, the scripted expert (``expert.json``) when the task ships
one, and, once the expert has run, the files it wrote (:func:`expert_outputs`).

Invariants: the task folder is untrusted input. Nothing outside it is read (a link in ``input_files/``
or ``reward/`` whose real path leaves the task folder is ignored), no file is read past
:data:`MAX_READ` bytes, and a malformed ``expert.json`` is a reason (``expert_error``), not a crash.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import os
import posixpath
import sys
from pathlib import Path

from clawgym_env.capture.records import EpisodeRecord
from clawgym_env.errors import ClawGymError
from clawgym_env.sandbox import SandboxLimits
from clawgym_env.task import Task
from tasks import ExpertScript, load_expert

MAX_READ = 256 * 1024
"""Bytes of one task file the audit reads at most (a module's text, a reward file's imports)."""
MODULE_SUFFIXES = (".py", ".sh")
"""Files an agent's code lives in: the ``os._exit(0)`` adversary rewrites those the task lets it edit."""


@dataclasses.dataclass(frozen=True)
class TaskFacts:
    """A task as its adversaries see it. Paths are workspace-relative POSIX paths, sorted."""

    task: Task
    inputs: tuple[str, ...]
    """Every file of ``input_files/`` (what the agent finds in its workspace)."""
    protected: tuple[str, ...]
    """The inputs the grader restores before grading (matched by ``Task.protected_inputs``)."""
    reward_files: tuple[str, ...]
    """Every file under ``reward/``, relative to it."""
    reward_imports: tuple[str, ...]
    """Standard-library modules the Python files under ``reward/`` import (top-level names)."""
    expert: ExpertScript | None
    expert_error: str | None = None
    """Why the task has no usable expert when it ships a malformed ``expert.json``."""
    outputs: tuple[str, ...] = ()
    """Files the expert added or changed in its own episode (set by :func:`with_expert_outputs`)."""

    @property
    def mount_dir(self) -> str:
        """The workspace's path inside the sandbox, for the agent and the verifier alike."""
        return self.task.mount_dir.rstrip("/") or "/"

    @property
    def reward_mount(self) -> str:
        """Where the grader lays the task's ``reward/`` today: ``<mount_dir>/reward``."""
        return posixpath.join(self.mount_dir, "reward")

    @property
    def disk_mb(self) -> int:
        """The disk quota of the agent's workspace in MiB (the task's, else the sandbox default)."""
        own = self.task.limits.disk_mb
        return int(own if own is not None else (SandboxLimits().disk_mb or 2048))

    @property
    def editable_modules(self) -> tuple[str, ...]:
        """Code the task lets the agent edit: unprotected ``.py``/``.sh`` inputs and those the expert wrote."""
        mine = [p for p in self.inputs if p.endswith(MODULE_SUFFIXES) and p not in self.protected]
        mine += [p for p in self.outputs if p.endswith(MODULE_SUFFIXES) and p not in self.protected]
        return tuple(sorted(set(mine)))

    @property
    def code_dirs(self) -> tuple[str, ...]:
        """Workspace folders holding Python code (``.`` first): where a script's own folder leads ``sys.path``."""
        dirs = {posixpath.dirname(p) or "." for p in (*self.inputs, *self.outputs) if p.endswith(".py")}
        return tuple(["."] + sorted(dirs - {"."}))

    def input_path(self, rel: str) -> Path | None:
        """The pristine input file ``rel`` on the host, when it is a regular file inside the task folder."""
        return _inside_file(self.task, self.task.input_dir, rel)

    def read_input(self, rel: str, limit: int = MAX_READ) -> bytes | None:
        """At most ``limit`` bytes of the pristine input ``rel`` (None when it cannot be read safely)."""
        path = self.input_path(rel)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                return f.read(limit)
        except OSError:
            return None

    def input_size(self, rel: str) -> int | None:
        """The size in bytes of the pristine input ``rel`` (None when it cannot be read safely)."""
        path = self.input_path(rel)
        try:
            return path.stat().st_size if path is not None else None
        except OSError:
            return None


def _inside_file(task: Task, base: Path | None, rel: str) -> Path | None:
    if base is None or task.task_dir is None:
        return None
    root = os.path.realpath(task.task_dir)
    real = os.path.realpath(Path(base) / rel)
    if not real.startswith(root + os.sep) or not os.path.isfile(real):
        return None
    return Path(real)


def _files_under(root: Path | None) -> list[str]:
    if root is None or not Path(root).is_dir():
        return []
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in filenames + links:
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            out.append(rel.replace(os.sep, "/"))
    return sorted(out)


def _protected(task: Task, inputs: list[str]) -> tuple[str, ...]:
    patterns = list(getattr(task, "protected_inputs", None) or [])
    return tuple(p for p in inputs if any(p == pat or fnmatch.fnmatchcase(p, pat) for pat in patterns))


def _stdlib_imports(task: Task, files: list[str]) -> tuple[str, ...]:
    names: set[str] = set()
    stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())
    for rel in files:
        if not rel.endswith(".py"):
            continue
        path = _inside_file(task, task.reward_dir, rel)
        if path is None:
            continue
        try:
            with open(path, "rb") as f:
                tree = ast.parse(f.read(MAX_READ))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return tuple(sorted(n for n in names if n in stdlib))


def gather_facts(task: Task) -> TaskFacts:
    """The :class:`TaskFacts` of ``task`` read from its folder (no episode run yet: no ``outputs``)."""
    inputs = _files_under(task.input_dir)
    reward_files = _files_under(task.reward_dir)
    expert, error = None, None
    try:
        expert = load_expert(task)
    except ClawGymError as exc:  # a malformed expert.json: the gate and the replays say why they are skipped
        error = f"expert.json is unusable: {exc}"
    return TaskFacts(task=task, inputs=tuple(inputs), protected=_protected(task, inputs),
                     reward_files=tuple(reward_files), reward_imports=_stdlib_imports(task, reward_files),
                     expert=expert, expert_error=error)


def expert_outputs(record: EpisodeRecord, facts: TaskFacts) -> tuple[str, ...]:
    """The regular files the expert's episode added or changed (from its record's workspace changes)."""
    out = {c.path for c in record.workspace_changes
           if c.change in ("added", "modified") and c.kind == "file" and _plain(c.path) and not _byproduct(c.path)}
    return tuple(sorted(out))


def with_expert_outputs(facts: TaskFacts, record: EpisodeRecord | None) -> TaskFacts:
    """``facts`` with :attr:`TaskFacts.outputs` taken from the expert's record (unchanged without one)."""
    if record is None or not record.is_task_outcome:
        return facts
    return dataclasses.replace(facts, outputs=expert_outputs(record, facts))


def _byproduct(rel: str) -> bool:
    """A file tools leave behind, not an output of the work (bytecode caches)."""
    return "__pycache__" in rel.split("/") or rel.endswith((".pyc", ".pyo"))


def _plain(rel: str) -> bool:
    """A path the adversaries may name in a shell command: relative, inside, printable, no odd bytes."""
    return (bool(rel) and not rel.startswith("/") and ".." not in rel.split("/") and rel.isprintable()
            and "\\x" not in rel and "\n" not in rel)
