"""The grading seam: one place where a finished episode gets its reward, chosen by the task.

Every path that produces a reward — ``env.step``, a trainer's rollouts, ``clawgym eval`` — goes
through :func:`run_episode <clawgym_env.episodes.run.run_episode>`, which calls :func:`grade_episode`
on the final workspace. So training and evaluation read the same ``record.reward``.

The engine defines the seam's types (:mod:`clawgym_env.grading.grader`, :mod:`clawgym_env.grading.judge`,
re-exported here) and one grader, the hermetic ``reward.sh`` script
(:class:`clawgym_env.grading.reward.ScriptGrader`); a task names its grader in ``Task.grader`` and the
engine finds it in :data:`graders` (also :data:`clawgym_env.plugins.graders`) (the ``tasks`` package registers the
ClawGym-Bench hybrid of script and rubric judge as ``hybrid`` and the JobBench rubric judge as
``jobbench``). The engine never imports ``tasks``.

Invariants:
  * a :class:`GradeResult`'s ``status`` is ``ok`` (``reward`` is the task's score in [0, 1]),
    ``reward_error`` (the verifier ran and failed on this workspace — the agent's outcome, scored
    ``reward`` = 0 with the reason) or ``reward_invalid`` (no valid reward could be computed: the
    judge failed or answered nonsense, the task's own verifier folder is unusable). A
    ``reward_invalid`` reward is meaningless: it is never a 0 to train on or to average;
  * the judge (a :class:`~clawgym_env.grading.judge.Judge`) is passed in by the caller; ``None``
    lets a grader that needs one use its own default (the environment-configured judge);
  * a sandbox that cannot start raises :class:`~clawgym_env.errors.SandboxError` (infrastructure);
    any other :class:`~clawgym_env.errors.ClawGymError` a grader raises becomes ``reward_invalid``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from clawgym_env.errors import ClawGymError, SandboxError
from clawgym_env.grading.grader import GradeContext, Grader, GradeResult, GradeStatus
from clawgym_env.grading.judge import Judge
from clawgym_env.registry import Registry
from clawgym_env.task import Task

__all__ = ["GradeContext", "GradeResult", "GradeStatus", "Grader", "Judge", "grade_episode", "grader_of",
           "graders", "needs_judge"]

log = logging.getLogger(__name__)

graders: Registry[Grader] = Registry("grader", "clawgym.graders",
                                     builtins={"reward.sh": "clawgym_env.grading.reward:ScriptGrader"})
"""Graders by the name a task carries in ``Task.grader`` (entry points ``clawgym.graders``), also
:data:`clawgym_env.plugins.graders`."""


def grader_of(task: Task) -> Grader:
    """The grader registered under the task's ``grader`` name (:data:`clawgym_env.plugins.graders`).

    Raises :class:`~clawgym_env.errors.RegistrationError` for an unknown name and ``TypeError`` for a
    registered object that is not a :class:`Grader`."""
    grader = graders.create(task.grader)
    if not isinstance(grader, Grader):
        raise TypeError(f"task {task.id}: grader {task.grader!r} ({grader!r}) has no name/needs_judge/grade()")
    return grader


def needs_judge(task: Task) -> bool:
    """Whether grading ``task`` calls an LLM judge (so a caller can build one up front)."""
    return bool(grader_of(task).needs_judge)


def grade_episode(task: Task, workspace: str | Path, *, final_message: str | None = None,
                  transcript: list[Any] | None = None, sandbox: str = "bwrap",
                  judge: Judge | None = None) -> GradeResult:
    """Grade a finished episode with the task's grader (see the module doc for the invariants)."""
    try:
        grader = grader_of(task)
    except ClawGymError as exc:  # e.g. a grader name nobody registered: no valid reward, never a 0
        log.warning("task %s has no usable grader: %s", task.id, exc)
        return GradeResult(0.0, {}, "reward_invalid", f"no valid reward: {exc}", task.grader)
    ctx = GradeContext(task=task, workspace=Path(workspace), final_message=final_message, transcript=transcript,
                       sandbox=sandbox, judge=judge)
    t0 = time.monotonic()
    try:
        result = grader.grade(ctx)
    except SandboxError:
        raise
    except ClawGymError as exc:
        log.warning("grading %s with %s gave no valid reward: %s", task.id, grader.name, exc)
        return GradeResult(0.0, {}, "reward_invalid", f"no valid reward: {exc}", grader.name,
                           wall_s=time.monotonic() - t0)
    if result.status == "reward_invalid":
        result.reward = 0.0
    return result
