"""The grading seam's types: what a grader sees (:class:`GradeContext`), what it returns
(:class:`GradeResult`) and what it is (:class:`Grader`). See :mod:`clawgym_env.grading.grade` for the
invariants and :func:`~clawgym_env.grading.grade.grade_episode` for the one caller.

This module imports no plugin registry, so the registry of graders can name :class:`Grader` as the
kind it builds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from clawgym_env.grading.judge import Judge
from clawgym_env.task import Task

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
    judge: Judge | None = None


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
