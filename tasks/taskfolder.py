"""A folder of ClawGym task dirs → one :class:`~clawgym_env.task.Suite`.

The plain loader under both :func:`tasks.suites.load_suite` (bundled suites and folders) and
:func:`tasks.clawgym_bench.load_clawgym_bench` (ClawGym-Bench as task dirs); it knows nothing of
data suites, so the modules above it never import each other for it.

Invariants: every non-hidden subfolder (not starting with ``.`` or ``_``) is a task candidate, and
each one that cannot be loaded becomes a :class:`~clawgym_env.task.TaskLoadIssue` (never an
exception); tasks are ordered by folder name and carry ``suite`` = ``name``; task ids are unique
(a later duplicate becomes an issue); a folder holding neither tasks nor issues is a
:class:`~clawgym_env.errors.TaskError`.
"""

from __future__ import annotations

from pathlib import Path

from clawgym_env.errors import TaskError
from clawgym_env.task import Suite, TaskLoadIssue
from tasks.taskdir import load_task_dir


def is_candidate(p: Path) -> bool:
    """A subfolder that may hold a task (not hidden, not ``_private``)."""
    return p.is_dir() and not p.name.startswith((".", "_"))


def load_task_folder(root: Path, name: str) -> Suite:
    """Every task dir directly under ``root`` as the suite ``name`` (see the module invariants)."""
    suite = Suite(name=name, root=root)
    seen: dict[str, Path] = {}
    for child in sorted(root.iterdir()):
        if not is_candidate(child):
            continue
        try:
            task = load_task_dir(child, suite=name)
        except TaskError as e:
            suite.issues.append(TaskLoadIssue(path=str(child), error=str(e)))
            continue
        if task.id in seen:
            suite.issues.append(TaskLoadIssue(
                path=str(child),
                error=f"{child / 'data_entry.json'}: task_id {task.id!r} is also used by {seen[task.id]}; "
                      f"give each task dir its own task_id"))
            continue
        seen[task.id] = child
        suite.tasks.append(task)
    if not suite.tasks and not suite.issues:
        raise TaskError(f"{root}: holds no task dirs (subfolders with data_entry.json and reward/); "
                        f"point at the folder that holds the task dirs")
    return suite
