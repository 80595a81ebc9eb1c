"""The grading seam: one place where a finished episode gets its reward, chosen by the task.

Every path that produces a reward — ``env.step``, a trainer's rollouts, ``clawgym eval`` — goes
through :func:`run_episode <clawgym_env.episodes.run.run_episode>`, which calls :func:`grade_episode`
on the final workspace. So training and evaluation read the same ``record.reward``.

The engine defines the seam's types and one grader, the hermetic ``reward.sh`` script
(:class:`clawgym_env.grading.reward.ScriptGrader`); a task names its grader in ``Task.grader`` and the
engine finds it in :data:`clawgym_env.plugins.graders` (the ``tasks`` package registers the
ClawGym-Bench hybrid of script and rubric judge as ``hybrid`` and the JobBench rubric judge as
``jobbench``). The engine never imports ``tasks``.

Invariants:
  * a :class:`GradeResult`'s ``status`` is ``ok`` (``reward`` is the task's score in [0, 1]),
    ``reward_error`` (the verifier ran and failed on this workspace — the agent's outcome, scored
    ``reward`` = 0 with the reason) or ``reward_invalid`` (no valid reward could be computed: the
    judge failed or answered nonsense, the task's own verifier folder is unusable). A
    ``reward_invalid`` reward is meaningless: it is never a 0 to train on or to average;
  * the judge (anything with ``judge_json(system, user)``) is passed in by the caller; ``None``
    lets a grader that needs one use its own default (the environment-configured judge);
  * a sandbox that cannot start raises :class:`~clawgym_env.errors.SandboxError` (infrastructure);
    any other :class:`~clawgym_env.errors.ClawGymError` a grader raises becomes ``reward_invalid``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from clawgym_env.errors import ClawGymError, SandboxError
from clawgym_env.task import Task

log = logging.getLogger(__name__)

GradeStatus = Literal["ok", "reward_error", "reward_invalid"]


@dataclasses.dataclass
class GradeContext:
    """What a grader may look at: the task, its final workspace (a host folder a grader must leave
    untouched), the agent's final message and transcript, the sandbox backend and the judge."""

    task: Task
    workspace: Path
    final_message: str | None = None
    transcript: list[Any] | None = None
    sandbox: str = "bwrap"
    judge: Any = None


@dataclasses.dataclass
class GradeResult:
    """One episode's grade; ``reward`` is in [0, 1] and means something only when ``status`` is not
    ``reward_invalid``. ``scorer`` names the grader (e.g. ``reward.sh``, ``tasks.hybrid.hybrid_grade``)."""

    reward: float
    subscores: dict[str, float] = dataclasses.field(default_factory=dict)
    status: GradeStatus = "ok"
    reason: str | None = None
    scorer: str = "reward.sh"
    stdout: str = ""
    stderr: str = ""
    wall_s: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    """What the grader changed in its copy of the workspace before grading, with reasons (a planted
    ``reward/`` removed, protected inputs restored, links into ``reward/`` removed)."""

    @property
    def ok(self) -> bool:
        """Whether the verifier ran cleanly (status ``ok``)."""
        return self.status == "ok"

    @property
    def valid(self) -> bool:
        """Whether ``reward`` is a valid reward (any status but ``reward_invalid``)."""
        return self.status != "reward_invalid"


@runtime_checkable
class Grader(Protocol):
    """Grades one finished episode. ``needs_judge``: whether :meth:`grade` calls an LLM judge."""

    name: str
    needs_judge: bool

    def grade(self, ctx: GradeContext) -> GradeResult:
        """Grade the episode described by ``ctx``; a grader that cannot produce a valid reward returns
        status ``reward_invalid`` rather than a 0."""
        ...


def grader_of(task: Task) -> Grader:
    """The grader registered under the task's ``grader`` name (:data:`clawgym_env.plugins.graders`).

    Raises :class:`~clawgym_env.errors.RegistrationError` for an unknown name and ``TypeError`` for a
    registered object that is not a :class:`Grader`."""
    from clawgym_env.plugins import graders

    grader = graders.create(task.grader)
    if not isinstance(grader, Grader):
        raise TypeError(f"task {task.id}: grader {task.grader!r} ({grader!r}) has no name/needs_judge/grade()")
    return grader


def needs_judge(task: Task) -> bool:
    """Whether grading ``task`` calls an LLM judge (so a caller can build one up front)."""
    return bool(grader_of(task).needs_judge)


def grade_episode(task: Task, workspace: str | Path, *, final_message: str | None = None,
                  transcript: list[Any] | None = None, sandbox: str = "bwrap", judge: Any = None) -> GradeResult:
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
