"""Task format, suites, loaders and scorers.

Public API: :func:`load_task_dir` (one ClawGym task dir → :class:`Task`), :func:`load_suite`
(bundled name or folder → :class:`Suite`, bad tasks listed in ``suite.issues``),
:func:`resolve_task` (``suite/id`` or a path → :class:`Task`), :func:`list_suites` (bundled names),
:func:`load_expert` (a task's validated ``expert.json``).
"""

from tasks.base import Suite, Task, TaskLimits, TaskLoadIssue
from tasks.suites import list_suites, load_suite, resolve_task
from tasks.taskdir import PAYLOAD_ENV, ExpertScript, is_task_dir, load_expert, load_task_dir

__all__ = [
    "ExpertScript",
    "PAYLOAD_ENV",
    "Suite",
    "Task",
    "TaskLimits",
    "TaskLoadIssue",
    "is_task_dir",
    "list_suites",
    "load_expert",
    "load_suite",
    "load_task_dir",
    "resolve_task",
]
