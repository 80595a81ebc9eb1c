"""Grading in an evaluation run: which tasks need an LLM judge, and re-scoring a kept workspace.

Episodes are graded inside the episode by their task's grader (:mod:`clawgym_env.grading.grade`); the
runner only needs to know whether to build a judge before the first episode (:func:`needs_host_scoring`,
:func:`default_judge`). :func:`host_side_score` grades a saved workspace again (e.g. with another judge)
and raises :class:`~clawgym_env.errors.TaskError` when there is no valid reward, never the agent's 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clawgym_env.errors import TaskError
from clawgym_env.grading.judge import Judge


def needs_host_scoring(task: Any) -> str | None:
    """Which LLM-judge grader ``task`` has: ``"jobbench"`` (judge per rubric, no reward.sh),
    ``"hybrid"`` (ClawGym-Bench: reward.sh's code score + the judge's rubric score) or None.

    The name is historical: these tasks are graded inside the episode now
    (:mod:`clawgym_env.grading.grade`, the task's ``grader``), with the judge this runner passes in, so
    ``clawgym eval``, ``env.step`` and training read one reward; the runner only needs to know
    whether to build a judge before the first episode."""
    if getattr(task, "grading_type", None) == "jobbench":
        return "jobbench"
    from tasks.hybrid import is_hybrid

    return "hybrid" if is_hybrid(task) else None


def host_side_score(task: Any, workspace: Path, *, judge: Judge | None,
                    record: Any) -> tuple[float, dict[str, float], str]:
    """Grade a kept final ``workspace`` again with the task's grader → (reward, subscores, scorer).

    For re-scoring saved workspaces (e.g. with another judge); episodes are already graded inside
    the episode. Raises :class:`TaskError` when there is no valid reward (judge outage, unusable
    verdict) — never the agent's 0."""
    from clawgym_env.grading.grade import grade_episode

    gr = grade_episode(task, workspace, final_message=getattr(record, "final_message", None), judge=judge)
    if not gr.valid:
        raise TaskError(f"grading of {getattr(task, 'id', '?')} gave no valid reward: {gr.reason}")
    return gr.reward, dict(gr.subscores), gr.scorer


def default_judge() -> Any:
    """The shared LLM judge configured from the environment (see ``tasks.judge``)."""
    from tasks.judge import JudgeClient

    return JudgeClient.from_env()
