"""The graders tasks supply to the engine's grading seam (:mod:`clawgym_env.grading.grade`).

Each is registered by name (entry points ``clawgym.graders`` in ``pyproject.toml``), and a task names
its own in :attr:`clawgym_env.task.Task.grader`, set by its loader from the task's kind. So
``run_episode`` — hence ``env.step``, trainers' rollouts and ``clawgym eval`` — grades every task the
same way:

  * ``jobbench`` (JobBench tasks): :class:`JobBenchGrader`, the LLM judge per rubric
    over the deliverables (:func:`tasks.jobbench.score_jobbench`); no ``reward.sh``;
  * ``hybrid`` (a ClawGym task dir that carries a rubric): :class:`HybridGrader`, the hermetic
    ``reward.sh`` code score combined with the judge's rubric score, ``0.7 code + 0.3 rubric``
    (:func:`tasks.hybrid.hybrid_grade`);
  * ``reward.sh`` (anything else, the engine's own): :class:`clawgym_env.grading.reward.ScriptGrader`, the hermetic
    ``reward.sh`` alone.

Invariants: the judge is the one in the :class:`~clawgym_env.grading.grade.GradeContext`, else the
environment-configured one (:func:`env_judge`, built once per configuration); a judge that is
missing, unreachable or answers nonsense gives ``reward_invalid`` ("no valid reward"), never a 0;
a verifier that fails on the workspace gives ``reward_error`` with the code score it printed; a
hybrid task's subscores carry ``code_score`` and ``rubric_score``; a JobBench rubric whose verdict
was unparseable fails that rubric only (as the official eval does) and is counted in
``judge_errors``.
"""

from __future__ import annotations

import os
import threading
import time

from clawgym_env.errors import TaskError
from clawgym_env.grading.grade import GradeContext, GradeResult
from clawgym_env.grading.judge import Judge
from clawgym_env.grading.reward import ScriptGrader

_judges: dict[tuple[str, str, str], Judge] = {}
_judges_lock = threading.Lock()


def env_judge() -> Judge:
    """The judge configured by ``CLAWGYM_JUDGE_BASE_URL``/``_MODEL``/``_API_KEY`` (one client per
    configuration); :class:`TaskError` naming the variables when it is not configured."""
    from tasks.judge import ENV_API_KEY, ENV_BASE_URL, ENV_MODEL, JudgeClient

    base_url, model, api_key = (os.environ.get(k, "").strip() for k in (ENV_BASE_URL, ENV_MODEL, ENV_API_KEY))
    key = (base_url, model, api_key)
    with _judges_lock:
        if key not in _judges:
            _judges[key] = JudgeClient.from_env()
        return _judges[key]


def _judge(ctx: GradeContext) -> Judge:
    return ctx.judge if ctx.judge is not None else env_judge()


class HybridGrader:
    """ClawGym-Bench hybrid: hermetic ``reward.sh`` (0.7) + LLM judge on the rubric (0.3)."""

    name = "tasks.hybrid.hybrid_grade"
    needs_judge = True

    def grade(self, ctx: GradeContext) -> GradeResult:
        """The code score first; an invalid one is returned as is, else combined with the judge's
        rubric score (no judge verdict: ``reward_invalid``)."""
        from tasks.hybrid import hybrid_grade

        code = ScriptGrader().grade(ctx)
        if not code.valid:
            return code
        t0 = time.monotonic()
        grade = hybrid_grade(ctx.task, code.reward, ctx.final_message, ctx.workspace, _judge(ctx),
                             subscores=dict(code.subscores))
        wall = code.wall_s + time.monotonic() - t0
        if grade.score is None:
            return GradeResult(0.0, dict(code.subscores), "reward_invalid",
                               f"no valid reward: the rubric judge failed ({grade.status}): {grade.error}",
                               self.name, code.stdout, code.stderr, wall)
        subs = {**grade.subscores, "code_score": float(code.reward)}
        if grade.rubric_score is not None:
            subs["rubric_score"] = float(grade.rubric_score)
        return GradeResult(float(grade.score), subs, code.status, code.reason, self.name, code.stdout, code.stderr,
                           wall, notes=list(code.notes))


class JobBenchGrader:
    """JobBench: one LLM-judge call per rubric over the files in the workspace's ``outputs/``."""

    name = "tasks.jobbench.score_jobbench"
    needs_judge = True

    def grade(self, ctx: GradeContext) -> GradeResult:
        """Judge every rubric of the task over the deliverables; a judge that fails gives ``reward_invalid``."""
        from tasks.jobbench import score_jobbench

        t0 = time.monotonic()
        try:
            result = score_jobbench(ctx.task, ctx.workspace, _judge(ctx))
        except TaskError as exc:
            return GradeResult(0.0, {}, "reward_invalid", f"no valid reward: the JobBench judge failed: {exc}",
                               self.name, wall_s=time.monotonic() - t0)
        subs = dict(result.subscores)
        errors = int(result.details.get("judge_errors") or 0)
        if errors:  # a rubric the judge could not judge: the reward would be biased low, so it is none
            subs["judge_errors"] = float(errors)
            return GradeResult(0.0, subs, "reward_invalid",
                               f"no valid reward: the judge gave no readable verdict for {errors} of "
                               f"{len(result.details.get('rubrics') or [])} rubrics (partial reward "
                               f"{result.reward})", self.name, wall_s=time.monotonic() - t0)
        return GradeResult(float(result.reward), subs, "ok", result.details.get("extraction_note"), self.name,
                           wall_s=time.monotonic() - t0)
