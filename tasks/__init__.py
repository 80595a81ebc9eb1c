"""Task format, suites, loaders and scorers.

Public API: :func:`load_task_dir` (one ClawGym task dir → :class:`Task`), :func:`load_suite`
(bundled name or folder → :class:`Suite`, bad tasks listed in ``suite.issues``),
:func:`resolve_task` (``suite/id`` or a path → :class:`Task`), :func:`list_suites` (bundled names),
:func:`load_expert` (a task's validated ``expert.json``); JobBench: :func:`load_jobbench`,
:func:`score_jobbench` (LLM-judge grading), :func:`jobbench_leaderboard_score`, and the
shared judge :class:`JudgeClient`. Every task's ``grader`` (:mod:`tasks.graders`: ``reward.sh``,
hybrid, JobBench judge) is what the engine applies inside each episode.
OfficeQA: :func:`load_officeqa` (scorer: :func:`tasks.officeqa.score_answer`); ClawGym-Bench:
:func:`load_clawgym_bench`, :func:`score_hybrid` (0.7 code + 0.3 rubric, see :mod:`tasks.hybrid`).
"""

from clawgym_env.task import Suite, Task, TaskLimits, TaskLoadIssue
from tasks.clawgym_bench import load_clawgym_bench, score_hybrid
from tasks.jobbench import JobBenchTask, jobbench_leaderboard_score, load_jobbench, score_jobbench
from tasks.judge import JudgeClient
from tasks.officeqa import load_officeqa
from tasks.suites import list_suites, load_suite, resolve_task
from tasks.taskdir import PAYLOAD_ENV, ExpertScript, is_task_dir, load_expert, load_task_dir

__all__ = [
    "ExpertScript",
    "JobBenchTask",
    "JudgeClient",
    "PAYLOAD_ENV",
    "Suite",
    "Task",
    "TaskLimits",
    "TaskLoadIssue",
    "is_task_dir",
    "jobbench_leaderboard_score",
    "load_clawgym_bench",
    "load_jobbench",
    "load_officeqa",
    "list_suites",
    "load_expert",
    "load_suite",
    "load_task_dir",
    "resolve_task",
    "score_hybrid",
    "score_jobbench",
]
