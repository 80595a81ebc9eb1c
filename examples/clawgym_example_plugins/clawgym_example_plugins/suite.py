"""The ``example`` suite: a couple of task folders shipped in this package, read by its own loader.

Each folder of ``suite_data/`` is one task: ``data_entry.json`` (``task_id``, ``user_query``,
``input_mount_dir``, ``metadata`` with what the grader checks, and ``grader``: the registered grader that
scores it, here ``example-files``), ``input_files/`` (copied into the workspace) and ``expert.json`` (the
scripted expert's steps, so ``--policy scripted:expert`` solves it). The loader is registered as the suite
``example`` (entry point ``clawgym.suites``), with the signature every suite loader has:
``(spec, data=None, **options) -> Suite``.

Invariants: tasks are ordered by folder name and carry ``suite="example"``; a folder that cannot be read, or
whose grader is not registered, becomes a ``TaskLoadIssue`` naming the file and the problem (the other tasks
still load); ``limit`` (an option) keeps the first ``limit`` tasks.
"""

from __future__ import annotations

import json
from pathlib import Path

from clawgym_env.errors import RegistrationError, TaskError
from clawgym_env.plugins import graders
from clawgym_env.task import Suite, Task, TaskLoadIssue

ROOT = Path(__file__).with_name("suite_data")
NAME = "example"


def load_task(folder: Path) -> Task:
    """One task from its folder (module docstring); a :class:`TaskError` naming the file and the fix."""
    entry_path = folder / "data_entry.json"
    try:
        entry = json.loads(entry_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TaskError(f"{entry_path}: cannot read it as JSON ({exc})") from exc
    missing = [k for k in ("task_id", "user_query", "grader") if not isinstance(entry.get(k), str)]
    if missing:
        raise TaskError(f"{entry_path}: needs the string keys {', '.join(missing)}")
    try:  # a misspelt or broken grader fails the task's load, not its grading
        graders.load(entry["grader"])
    except RegistrationError as exc:
        raise TaskError(f"{entry_path}: 'grader' {entry['grader']!r} cannot be used: {exc}") from exc
    inputs = folder / "input_files"
    return Task(id=entry["task_id"], instruction=entry["user_query"], suite=NAME, task_dir=folder,
                mount_dir=entry.get("input_mount_dir") or "/workspace", input_dir=inputs if inputs.is_dir() else None,
                metadata=entry.get("metadata") or {}, grader=entry["grader"])


def load_example_suite(spec: str | Path = NAME, data: str | Path | None = None, *, limit: int | None = None) -> Suite:
    """The ``example`` suite (``spec`` and ``data`` are the registry's arguments; this suite has no data)."""
    tasks: list[Task] = []
    issues: list[TaskLoadIssue] = []
    for folder in sorted(p for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        try:
            tasks.append(load_task(folder))
        except TaskError as exc:
            issues.append(TaskLoadIssue(path=str(folder), error=str(exc)))
    return Suite(name=NAME, root=ROOT, tasks=tasks[:limit] if limit is not None else tasks, issues=issues)
