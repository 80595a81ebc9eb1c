"""The LLM judge a grader may call: :class:`Judge`, the one method graders rely on.

The engine never builds a judge; a caller passes one down (``run_episode(judge=...)``,
``Runtime(judge=...)``, ``grade_episode(judge=...)``) into :attr:`GradeContext.judge
<clawgym_env.grading.grader.GradeContext.judge>`, and a grader that needs one and finds ``None`` uses
its own default. This project's own implementation is the OpenAI-compatible ``tasks.judge.JudgeClient``;
a test may pass any object with the same method.

Invariants a :class:`Judge` keeps:
  * :meth:`Judge.judge_json` sends one system and one user message and returns the JSON object the
    judge answered with (a ``dict``; never a list or a scalar);
  * it raises :class:`~clawgym_env.errors.TaskError` when it cannot answer (unreachable, refused, or
    an answer holding no JSON object), never returns a partial verdict;
  * it is safe to call from several threads at once (graders judge rubrics in parallel).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from clawgym_env.jsontypes import JSONObject


@runtime_checkable
class Judge(Protocol):
    """An LLM judge asked for verdicts as JSON (see the module doc for the invariants)."""

    def judge_json(self, system: str, user: str) -> JSONObject:
        """The JSON object the judge answers ``user`` with, under the ``system`` instructions."""
        ...
