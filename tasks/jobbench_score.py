"""Host-side JobBench scoring: deliverable text → one judge call per rubric → weighted reward.

Why host-side and how the runner calls it: see :mod:`tasks.jobbench`. Invariants:
  * the deliverables are the files under ``<workspace>/<task.metadata["output_dir"]>`` (``outputs``),
    read without following symbolic links (:mod:`tasks.extract`);
  * an absent or empty output folder scores 0.0 and makes no judge call;
  * each rubric gets exactly ONE judge call (all its criteria at once) at the judge's temperature
    (0 by default); the judge answers a JSON object with one verdict per criterion;
  * a rubric earns its weight only when the judge returned a verdict for every criterion and every
    verdict is a pass (a missing verdict is a fail; the judge's own overall flag is recorded, not
    trusted); reward = ``round(earned / possible, 4)``;
  * a judge that cannot be reached (or answers 4xx) raises :class:`TaskError`; an answer that is
    not a JSON object fails that rubric, and the details say so (``judge_errors``);
  * details never include the full deliverable text (they name the files, sizes and truncation);
  * a deliverable over an extraction bound (:mod:`tasks.extract_bounds`: a zip or paragraph bomb,
    a sheet too large, a parser out of memory or time) is the agent's outcome, never an invalid
    reward: the judge sees what could be extracted and a ``[bounded: …]`` note in its place, and
    ``details["extraction_note"]`` names each such file and its bound (the grade's reason).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from clawgym_env.errors import TaskError
from clawgym_env.grading.judge import Judge
from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Task
from tasks.extract import MAX_CHARS_PER_FILE, ExtractLimits, extract_folder
from tasks.jobbench_task import OUTPUT_DIR, rubrics_for
from tasks.judge import JudgeAnswerError

JUDGE_SYSTEM = (
    "You grade the deliverables an agent produced for a professional task. You receive one rubric, "
    "the numbered criteria it consists of, and the text extracted from every delivered file. Judge "
    "each criterion on its own, strictly from the delivered content: a criterion passes only when "
    "the deliverables clearly satisfy it; equivalent wording, units or formatting are acceptable, "
    "missing or contradicted content is a fail. Give a short reason and quote the evidence."
)

VERDICT_FORMAT = (
    'Return a JSON object of this shape:\n{"criteria": [{"index": 0, "pass": true, "reason": "…", '
    '"evidence": "…"}, …], "rubric_pass": true}\nwith exactly one entry per criterion, in order; '
    '"rubric_pass" is true only if every criterion passes.'
)


def build_rubric_prompt(rubric: Any, deliverables: str) -> str:
    """The user message of the judge call for one rubric (``rubric``: a :class:`Rubric`)."""
    crits = "\n".join(f"Criterion {i}: {c}" for i, c in enumerate(rubric.criteria))
    text = (f"# Rubric\n{rubric.rubric}\n\n# Criteria ({len(rubric.criteria)})\n{crits}\n\n"
            f"# Delivered files\n{deliverables}\n\n# Answer\n{VERDICT_FORMAT}")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates cannot go on the wire


class JobBenchScore(NamedTuple):
    """What :func:`score_jobbench` returns: unpacks as ``(reward, details)``; ``subscores`` gives
    the numbers a results row keeps (``earned``, ``possible`` and ``rubric_<i>`` = 1.0/0.0)."""

    reward: float
    details: dict

    @property
    def subscores(self) -> dict[str, float]:
        """``earned``, ``possible`` and ``rubric_<i>`` (1.0 passed, 0.0 not) for a results row."""
        subs = {"earned": float(self.details["earned"]), "possible": float(self.details["possible"])}
        subs.update({f"rubric_{i}": float(r["passed"]) for i, r in enumerate(self.details["rubrics"])})
        return subs


def _truth(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return bool(v)
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("pass", "passed", "true", "yes", "met", "satisfied"):
            return True
        if s in ("fail", "failed", "false", "no", "not met", "unsatisfied"):
            return False
    return None


def read_verdicts(obj: dict, n: int) -> list[tuple[bool, str]]:
    """(passed, reason) per criterion from a judge answer; a missing or unreadable verdict fails."""
    items: list[Any] = next((obj[k] for k in ("criteria", "criteria_results", "results", "verdicts")
                  if isinstance(obj.get(k), list)), [])
    out: list[tuple[bool, str] | None] = [None] * n
    for pos, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        idx = item.get("index", pos)
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < n or out[idx] is not None:
            continue
        verdict = next((_truth(item[k]) for k in ("pass", "passed", "verdict", "result") if k in item), None)
        reason = str(item.get("reason") or item.get("reasoning") or "")
        if verdict is None:
            out[idx] = (False, f"no readable verdict in {item!r:.200}")
        else:
            out[idx] = (verdict, reason)
    return [v if v is not None else (False, "the judge gave no verdict for this criterion") for v in out]


def _judge_one(judge: Judge, rubric: Any, deliverables: str) -> JSONObject:
    res: JSONObject = {"rubric": rubric.rubric, "weight": rubric.weight, "passed": False, "earned": 0}
    try:
        obj = judge.judge_json(JUDGE_SYSTEM, build_rubric_prompt(rubric, deliverables))
    except JudgeAnswerError as e:
        res.update(error=str(e), criteria=[{"criterion": c, "passed": False, "reason": "unparseable judge answer"}
                                           for c in rubric.criteria])
        return res
    verdicts = read_verdicts(obj, len(rubric.criteria))
    res["criteria"] = [{"criterion": c, "passed": p, "reason": r} for c, (p, r) in zip(rubric.criteria, verdicts)]
    res["passed"] = all(p for p, _ in verdicts)
    res["earned"] = rubric.weight if res["passed"] else 0
    if "rubric_pass" in obj or "rubric_passed" in obj:
        res["judge_rubric_pass"] = _truth(obj.get("rubric_pass", obj.get("rubric_passed")))
    return res


def score_jobbench(task: Task, workspace_dir: str | Path, judge: Judge, *,
                   max_chars_per_file: int = MAX_CHARS_PER_FILE, max_workers: int = 4,
                   limits: ExtractLimits | None = None) -> JobBenchScore:
    """(reward in [0, 1], details) for ``task`` given the episode's final workspace (see module doc),
    as a :class:`JobBenchScore` (also ``.reward`` / ``.subscores`` for results rows).

    ``judge`` is a :class:`tasks.judge.JudgeClient` (anything with ``judge_json(system, user)`` and
    ``model``); ``limits`` bound the extraction of the deliverables (the defaults of
    :class:`ExtractLimits` when None). Details: ``reward, earned, possible, passed_count, rubric_count, judge_calls,
    judge_errors, judge_model, output_dir, files, rubrics`` (per rubric: text, weight, passed,
    earned, per-criterion verdicts and reasons).
    """
    rubrics = rubrics_for(task)
    out_rel = str(task.metadata.get("output_dir") or OUTPUT_DIR)
    out_dir = Path(workspace_dir) / out_rel
    text, files = extract_folder(out_dir, max_chars_per_file=max_chars_per_file, limits=limits)
    possible = sum(r.weight for r in rubrics)
    details: JSONObject = {
        "task_id": task.id, "judge_model": getattr(judge, "model", None), "output_dir": out_rel,
        "files": [f.to_dict() for f in files], "possible": possible, "rubric_count": len(rubrics),
        "judge_calls": 0, "judge_errors": 0}
    bounded = [f"{f.path}: {f.bounded}" for f in files if f.bounded]
    if bounded:
        details["extraction_note"] = ("deliverables over an extraction bound were judged on what could be "
                                      "extracted: " + "; ".join(bounded))
    if not files:
        details.update(reward=0.0, earned=0, passed_count=0, note=f"no files in {out_rel}/; not judged",
                       rubrics=[{"rubric": r.rubric, "weight": r.weight, "passed": False, "earned": 0,
                                 "criteria": []} for r in rubrics])
        return JobBenchScore(0.0, details)
    workers = max(1, min(int(max_workers), len(rubrics)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda r: _judge_one(judge, r, text), rubrics))
    earned = sum(r["earned"] for r in results)
    reward = round(earned / possible, 4) if possible > 0 else 0.0
    details.update(reward=reward, earned=earned, passed_count=sum(r["passed"] for r in results),
                   judge_calls=len(results), judge_errors=sum(1 for r in results if "error" in r),
                   rubrics=results)
    return JobBenchScore(reward, details)


def jobbench_leaderboard_score(results: Iterable[Any]) -> float:
    """``100 * total earned / total possible`` over many tasks, rounded to 2 decimals.

    Each item is what :func:`score_jobbench` returned, its details dict, or any dict holding
    ``earned`` and ``possible`` (e.g. a results row's ``subscores``). A task whose rollout failed
    still counts: score it with :func:`score_jobbench` on its (possibly absent) workspace, which
    gives 0 earned out of its full weight without calling the judge.
    """
    earned = possible = 0.0
    for item in results:
        details = item[1] if isinstance(item, tuple) and len(item) == 2 else item
        if not isinstance(details, dict) or "earned" not in details or "possible" not in details:
            raise TaskError(f"not a JobBench result (need the details dict of score_jobbench): {item!r:.200}")
        earned += float(details["earned"])
        possible += float(details["possible"])
    return round(100.0 * earned / possible, 2) if possible > 0 else 0.0
