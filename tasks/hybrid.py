"""Hybrid grading (ClawGym-Bench): code verifier score combined with an LLM judge's rubric score.

A task is *hybrid* when it carries a rubric: ``task.metadata["rule"]`` (the ``rule`` column of the
hub data, kept under that key by the task-dir format). Its official score is

    score = 0.7 * code_score + 0.3 * rubric_score

where ``code_score`` is what ``reward/reward.sh`` prints (the hermetic verifier, run by
:func:`clawgym_env.grading.reward.grade_workspace`) and ``rubric_score`` in [0, 1] comes from an LLM judge
(:class:`tasks.judge.JudgeClient`) shown the task, the rubric, the agent's final message and the
workspace's output files. Automated tasks score ``code_score`` alone.

The judge runs on the host, after the sandboxed verifier (the verifier has no network). Episodes
are graded this way inside the episode (:class:`tasks.graders.HybridGrader`, the task's
``grader``), so ``env.step``, training and ``clawgym eval`` read one reward. Other callers:
  * already hold the code score → :func:`hybrid_grade`;
  * hold only a final workspace → :func:`grade_bench` (runs the verifier, then the judge).

Invariants: :func:`score_hybrid` is exactly ``0.7 a + 0.3 b`` for ``a, b`` in [0, 1] (ValueError
otherwise); a judge failure (unreachable, non-JSON, score outside [0, 1]) never becomes a silent 0:
:func:`judge_rubric` raises :class:`TaskError`, and the grade functions return a
:class:`BenchGrade` with ``status="judge_error"``, ``score=None`` and the reason.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
from pathlib import Path
from typing import Any

from clawgym_env.errors import TaskError
from clawgym_env.grading.judge import Judge
from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Task

CODE_WEIGHT = 0.7
RUBRIC_WEIGHT = 0.3
FILE_CHARS = 6000
"""At most this many characters of one output file go into the judge prompt."""
TOTAL_CHARS = 40000
"""At most this many characters of file contents in all go into the judge prompt."""

JUDGE_SYSTEM = (
    "You are a strict, fair grader of work done by an AI agent in a file workspace. You get the "
    "task the agent was given, a grading rubric, the agent's final message, and the files of its "
    "workspace (new or changed files shown in full or in part). Judge only against the rubric and "
    "the evidence shown; do not reward claims the files do not support. Give one overall score "
    "between 0 and 1 (1 = every rubric criterion fully met, 0 = none met; partial credit in "
    'between). Answer as {"score": <number between 0 and 1>, "rationale": "<two or three '
    'sentences>"}.')


def rubric_of(task: Task) -> str | None:
    """The task's rubric text, or None for a code-only task."""
    rule = task.metadata.get("rule")
    if isinstance(rule, (list, tuple)):
        rule = "\n".join(str(r) for r in rule)
    return rule.strip() if isinstance(rule, str) and rule.strip() else None


def is_hybrid(task: Task) -> bool:
    """True when the task is graded by code and rubric (it carries a rubric)."""
    return rubric_of(task) is not None


def score_hybrid(code_score: float, rubric_score: float) -> float:
    """The official hybrid score ``0.7 * code_score + 0.3 * rubric_score`` (both in [0, 1])."""
    for name, v in (("code_score", code_score), ("rubric_score", rubric_score)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must be a number in [0, 1], got {v!r}")
    return CODE_WEIGHT * float(code_score) + RUBRIC_WEIGHT * float(rubric_score)


def _text_of(path: Path, limit: int) -> str | None:
    """Up to ``limit`` characters of a regular file (never through a link, never a fifo); None for
    binary content or a file that cannot be opened as a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = f.read(limit * 4 + 4)
    if b"\x00" in head:
        return None
    text = head.decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[:limit]


def describe_workspace(task: Task, workspace: str | Path, *, file_chars: int = FILE_CHARS,
                       total_chars: int = TOTAL_CHARS) -> str:
    """A listing of the workspace (``reward/`` excluded) marking each file new, modified or an
    unchanged input, followed by the contents of the new and modified text files, within budget.

    The workspace is the agent's: it is walked without recursion or following links, files are
    fingerprinted by streaming (:func:`clawgym_env.files.workspace.snapshot`: deep trees, sparse
    files, fifos and non-UTF-8 names are fine), and only regular files are ever opened."""
    from clawgym_env.files.workspace import snapshot

    ws = Path(workspace)
    inputs = {}
    if task.input_dir is not None and Path(task.input_dir).is_dir():
        inputs = {rel: e.digest for rel, e in snapshot(task.input_dir).items() if e.kind == "file"}
    listing, changed = [], []
    for rel, entry in sorted(snapshot(ws).items()):
        if rel == "reward" or rel.startswith("reward/") or entry.kind != "file":
            continue
        state = "new" if rel not in inputs else ("input" if inputs[rel] == entry.digest else "modified")
        listing.append(f"- {rel} ({entry.size} bytes, {state})")
        if state != "input":
            changed.append((rel, ws / rel, entry.size or 0))
    parts = ["## Workspace files", "\n".join(listing) or "(the workspace is empty)"]
    budget = total_chars
    for rel, p, size in changed:
        if budget <= 0:
            parts.append(f"### {rel}\n(not shown: the content budget is used up)")
            continue
        text = _text_of(p, min(file_chars, budget))
        if text is None:
            parts.append(f"### {rel}\n(binary or unreadable file, {size} bytes)")
            continue
        cut = size > len(text.encode("utf-8"))
        parts.append(f"### {rel}\n```\n{text}\n```" + ("\n(truncated)" if cut else ""))
        budget -= len(text)
    return "\n\n".join(parts)


def build_judge_prompt(task: Task, rubric: str, final_message: str | None, workspace: str | Path) -> str:
    """The user message of the judge request (task, rubric, final message, workspace files)."""
    text = "\n\n".join([
        "# Task given to the agent", task.instruction.strip(),
        "# Rubric", rubric.strip(),
        "# Agent's final message", (final_message or "").strip() or "(none)",
        describe_workspace(task, workspace)])
    return text.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates cannot go on the wire


def _parse_score(obj: JSONObject) -> float:
    raw = obj.get("score")
    if isinstance(raw, str):
        try:
            raw = float(raw.strip())
        except ValueError:
            pass
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or math.isnan(raw):
        raise TaskError(f"the judge's answer has no numeric 'score': {obj!r}")
    if not 0.0 <= raw <= 1.0:
        raise TaskError(f"the judge's score {raw!r} is outside [0, 1]: {obj!r}")
    return float(raw)


def judge_rubric(judge: Judge, task: Task, final_message: str | None, workspace: str | Path) -> tuple[float, str]:
    """(rubric score in [0, 1], rationale) from ``judge`` (a :class:`~tasks.judge.JudgeClient`)."""
    rubric = rubric_of(task)
    if rubric is None:
        raise TaskError(f"task {task.full_id} has no rubric (metadata['rule']); it is graded by code alone")
    obj = judge.judge_json(JUDGE_SYSTEM, build_judge_prompt(task, rubric, final_message, workspace))
    score = _parse_score(obj)
    rationale = next((str(obj[k]) for k in ("rationale", "reasoning", "explanation") if obj.get(k)), "")
    return score, rationale


@dataclasses.dataclass
class BenchGrade:
    """One task's official ClawGym-Bench grade; ``score`` is None only when grading failed."""

    task_id: str
    category: str
    grading_type: str
    score: float | None
    code_score: float | None
    rubric_score: float | None = None
    status: str = "ok"
    """``ok``, ``reward_error`` (the verifier failed: scored 0 with a reason) or ``judge_error``."""
    rationale: str = ""
    error: str | None = None
    subscores: dict[str, float] = dataclasses.field(default_factory=dict)


def _category(task: Task) -> str:
    return str(task.metadata.get("category") or "")


def hybrid_grade(task: Task, code_score: float, final_message: str | None, workspace: str | Path,
                 judge: Judge | None = None, *, subscores: dict[str, float] | None = None) -> BenchGrade:
    """The grade of a finished episode whose code score is known (judge only for hybrid tasks).
    ``judge`` None means :meth:`JudgeClient.from_env` (built only when the task needs it)."""
    grading = "hybrid" if is_hybrid(task) else "automated"
    out = BenchGrade(task.id, _category(task), grading, score=float(code_score), code_score=float(code_score),
                     subscores=dict(subscores or {}))
    if grading == "automated":
        return out
    try:
        if judge is None:
            from tasks.judge import JudgeClient

            judge = JudgeClient.from_env()
        out.rubric_score, out.rationale = judge_rubric(judge, task, final_message, workspace)
        out.score = score_hybrid(code_score, out.rubric_score)
    except TaskError as e:
        out.score, out.status, out.error = None, "judge_error", str(e)
    return out


def grade_bench(task: Task, workspace: str | Path, final_message: str | None = None, *, judge: Judge | None = None,
                sandbox: str = "bwrap", transcript: list[Any] | None = None) -> BenchGrade:
    """Run the hermetic verifier on ``workspace``, then (hybrid tasks) the judge; see module doc.
    A sandbox that cannot start raises :class:`SandboxError` (infrastructure, never a 0)."""
    from clawgym_env.grading.reward import grade_workspace

    rr = grade_workspace(task, workspace, final_message=final_message, transcript=transcript, sandbox=sandbox)
    out = hybrid_grade(task, rr.reward, final_message, workspace, judge, subscores=rr.subscores)
    if not rr.ok and out.status == "ok":
        out.status, out.error = "reward_error", rr.reason
    return out


def category_scores(grades: list[BenchGrade]) -> dict[str, dict[str, float]]:
    """Mean score and count per category (``""`` → ``"uncategorised"``), plus ``"overall"``;
    grades whose score is None are counted under ``failed`` and left out of the means."""
    groups: dict[str, list[BenchGrade]] = {}
    for g in grades:
        groups.setdefault(g.category or "uncategorised", []).append(g)
    groups["overall"] = list(grades)
    out = {}
    for cat, gs in groups.items():
        scored = [g.score for g in gs if g.score is not None]
        out[cat] = {"n": float(len(gs)), "failed": float(len(gs) - len(scored)),
                    "mean": sum(scored) / len(scored) if scored else float("nan")}
    return out
