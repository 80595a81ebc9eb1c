"""The JobBench task record and its hidden grading data: rubrics, where they come from, how to reload them.

Shared by the loader (:mod:`tasks.jobbench`, which re-exports everything here) and the scorer
(:mod:`tasks.jobbench_score`), so that neither imports the other for it.

Invariants: a :class:`JobBenchTask`'s rubrics and task card are excluded from every dump (they never
reach ``metadata``, verifiers or env infos); :func:`parse_rubrics` accepts only rubrics with a
non-empty text, a weight >= 0 and at least one criterion, with weights summing above 0, and names
the source in every :class:`TaskError`; :func:`rubrics_for` reloads the rubrics of a task that lost
them from the source recorded in ``metadata["jobbench_source"]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from clawgym_env.errors import TaskError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Task

RUBRICS_FILE = "RUBRICS.json"
TASK_CARD_FILE = "task_card.md"
TASK_FOLDER = "task_folder"
INSTRUCTIONS_FILE = "TASK_INSTRUCTIONS.txt"
OUTPUT_DIR = "outputs"


class Rubric(BaseModel):
    """One weighted rubric; it earns ``weight`` only when every one of ``criteria`` passes."""

    rubric: str
    weight: int | float = Field(ge=0)
    criteria: list[str]


class JobBenchTask(Task):
    """A :class:`Task` that also carries its hidden grading data (excluded from dumps)."""

    grader: str = "jobbench"
    rubrics: list[Rubric] = Field(default_factory=list, exclude=True, repr=False)
    task_card: str | None = Field(default=None, exclude=True, repr=False)

    @property
    def total_weight(self) -> float:
        """The sum of the rubric weights (the most the task can earn)."""
        return sum(r.weight for r in self.rubrics)


def parse_rubrics(data: Any, where: str) -> list[Rubric]:
    """Validated rubrics from a RUBRICS.json object (or its JSON text); TaskError names ``where``."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: rubric JSON is invalid at line {e.lineno} column {e.colno}: {e.msg}") from e
    items = data.get("rubrics", data.get("evaluation_rubrics")) if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise TaskError(f'{where}: expected {{"rubrics": [{{"rubric", "weight", "criterion"}}, …]}} '
                        f"with at least one rubric")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise TaskError(f"{where}: rubrics[{i}] must be an object, got {type(item).__name__}")
        text, weight, crit = item.get("rubric"), item.get("weight"), item.get("criterion", item.get("criteria"))
        if not isinstance(text, str) or not text.strip():
            raise TaskError(f"{where}: rubrics[{i}].rubric must be a non-empty string")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
            raise TaskError(f"{where}: rubrics[{i}].weight must be a number >= 0, got {weight!r}")
        crits = [crit] if isinstance(crit, str) else crit
        if not isinstance(crits, list) or not crits or not all(isinstance(c, str) and c.strip() for c in crits):
            raise TaskError(f"{where}: rubrics[{i}].criterion must be a non-empty string or list of strings")
        out.append(Rubric(rubric=text, weight=weight, criteria=crits))
    if sum(r.weight for r in out) <= 0:
        raise TaskError(f"{where}: the rubric weights sum to 0; at least one weight must be positive")
    return out


def read_rows(parquet: Path) -> list[JSONObject]:
    """The rows of a JobBench parquet table (TaskError when unreadable or missing the needed columns)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise TaskError("reading JobBench parquet files needs pyarrow (pip install pyarrow)") from e
    try:
        rows = pq.read_table(parquet).to_pylist()
    except Exception as e:
        raise TaskError(f"{parquet}: not a readable parquet table ({e})") from e
    if rows and not {"task_id", "prompt", "rubric_json"} <= set(rows[0]):
        raise TaskError(f"{parquet}: needs the columns task_id, prompt and rubric_json; has {sorted(rows[0])}")
    return rows


def rubrics_for(task: Task) -> list[Rubric]:
    """The rubrics of a JobBench task; reloaded from its source when ``task`` lost them (a plain
    :class:`Task` rebuilt from a dump). TaskError when the task is not a JobBench task."""
    if isinstance(task, JobBenchTask) and task.rubrics:
        return task.rubrics
    src = task.metadata.get("jobbench_source") or {}
    if src.get("kind") == "folder" and Path(src.get("rubrics", "")).is_file():
        p = Path(src["rubrics"])
        return parse_rubrics(p.read_text(encoding="utf-8", errors="replace"), str(p))
    if src.get("kind") == "parquet" and Path(src.get("parquet", "")).is_file():
        for row in read_rows(Path(src["parquet"])):
            if row.get("task_id") == src.get("task_id"):
                return parse_rubrics(row["rubric_json"], f"{src['parquet']} ({src['task_id']})")
    raise TaskError(f"task {task.full_id} has no JobBench rubrics (grading_type {task.grading_type!r}); "
                    f"load it with tasks.jobbench.load_jobbench")
