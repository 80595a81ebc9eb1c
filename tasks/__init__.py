"""Task format, suites, loaders and scorers."""

from tasks.base import Suite, Task, TaskLimits, TaskLoadIssue

__all__ = ["Suite", "Task", "TaskLimits", "TaskLoadIssue"]
