"""ClawGym-Bench (RUC-AIBOX): 200 workspace tasks, 156 code-verified and 44 hybrid, as one suite.

Two forms of the same data load into the same :class:`~clawgym_env.task.Task`:

* **task dirs** (the ClawGym layout, e.g. a copy of ``RL/data/clawgym_eval``): loaded by the
  plain folder loader :func:`tasks.taskfolder.load_task_folder`; a rubric travels as ``metadata["rule"]``.
* **hub rows** (``RUC-AIBOX/ClawGym-Bench``, or local parquet / JSONL files of it), read through
  ``datasets``; each row has ``prompt``, ``hook_code``, ``input_files`` (a list of
  ``{file_path, content}``), ``rule`` (the rubric, empty for code-only tasks) and
  ``origin_template`` (the source task card, whose front matter may carry ``id`` and
  ``category``), plus optional id/category columns. A row becomes a task dir in a cache folder
  (:mod:`tasks.datacache`): files under ``reward/`` are the verifier (``reward/test.py`` is
  renamed ``reward/check.py``), the others are ``input_files/``; ``hook_code`` — the shell command
  that runs the verifier, e.g. ``python3 reward/test.py /root/.openclaw/workspace`` — is rewritten
  to call ``<mount>/reward/check.py`` and piped into the ClawGym ``reward.sh`` averaging step (the
  checker prints a JSON object of sub-scores, or one number; the reward is their mean).

Normalisation shared by both forms (so they compare equal): ``metadata`` is ``{"category",
"grading_type", "rule"?}`` with ``grading_type`` ``"hybrid"`` exactly when a rubric is present
(upstream task dirs say ``"automated"`` even then), ``category`` verbatim from the data (``""``
when it carries none); ``input_mount_dir`` is always set.

Task ids: an ``id``/``task_id``/``instance_id`` column, else the template's ``id:``, else
``task_<row index>``; characters outside ``[A-Za-z0-9._-]`` become ``_``; tasks are ordered by id
(as task dirs are by folder name). A malformed row (no prompt, an unsafe file path, a duplicate id)
becomes a ``suite.issues`` entry; the others load.
Hybrid grading (0.7 code + 0.3 rubric) lives in :mod:`tasks.hybrid` and is re-exported here.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypedDict

from clawgym_env.errors import TaskError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Suite, Task, TaskLoadIssue
from tasks import datacache
from tasks.hybrid import (
    CODE_WEIGHT,
    RUBRIC_WEIGHT,
    BenchGrade,
    category_scores,
    grade_bench,
    hybrid_grade,
    is_hybrid,
    judge_rubric,
    rubric_of,
    score_hybrid,
)
from tasks.taskdir import DEFAULT_MOUNT_DIR, is_task_dir, load_task_dir
from tasks.taskfolder import load_task_folder

__all__ = ["BENCH_NAME", "CODE_WEIGHT", "HUB_ID", "RUBRIC_WEIGHT", "BenchGrade", "category_scores",
           "grade_bench", "hybrid_grade", "is_hybrid", "judge_rubric", "load_clawgym_bench",
           "looks_like_bench_data", "rows_to_suite", "rubric_of", "score_hybrid"]

BENCH_NAME = "clawgym-bench"
HUB_ID = "RUC-AIBOX/ClawGym-Bench"
UPSTREAM_WORKSPACE = "/root/.openclaw/workspace"
TABLE_SUFFIXES = (".parquet", ".jsonl", ".json")
_ID_COLUMNS = ("task_id", "id", "instance_id", "uid")
_ID_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_AVERAGE = ("python3 -c 'import json, sys; raw = sys.stdin.read().strip(); data = json.loads(raw); "
            "print(sum(float(v) for v in data.values()) / len(data) if isinstance(data, dict) and data "
            "else float(data) if isinstance(data, (int, float)) else 0.0)'")


def normalise_metadata(metadata: JSONObject, *, category: Any = None, rule: Any = None) -> JSONObject:
    """The shared metadata form (see module doc); keys other than these three are kept."""
    out = dict(metadata or {})
    rule = rule if rule is not None else out.get("rule")
    if isinstance(rule, (list, tuple)):
        rule = "\n".join(str(r) for r in rule)
    out.pop("rule", None)
    cat = category if category not in (None, "") else out.get("category")
    out["category"] = str(cat) if cat is not None else ""
    if isinstance(rule, str) and rule.strip():
        out["rule"] = rule
        out["grading_type"] = "hybrid"
    else:
        out["grading_type"] = "automated" if out.get("grading_type") in (None, "", "hybrid") else out["grading_type"]
    return out


def _front_matter(template: Any) -> dict[str, str]:
    """``key: value`` lines of a task card's leading ``---`` block (no YAML dependency needed)."""
    if not isinstance(template, str):
        return {}
    m = re.match(r"\s*---\s*\n(.*?)\n---", template, re.DOTALL)
    out = {}
    for line in (m.group(1) if m else "").splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() and not line.startswith((" ", "\t", "-")):
            out[k.strip()] = v.strip().strip("'\"")
    return out


def rewrite_hook(hook_code: Any, mount: str) -> str:
    """``hook_code`` calling ``<mount>/reward/check.py`` (see module doc); empty → the default call."""
    q = shlex.quote
    default = f"python3 {q(mount + '/reward/check.py')} {q(mount)}"
    if not isinstance(hook_code, str) or not hook_code.strip():
        return default
    h = hook_code.strip()
    for ws in dict.fromkeys((UPSTREAM_WORKSPACE, mount)):
        h = h.replace(f"{ws}/reward/", "reward/")
    h = re.sub(r"(?<![\w./-])reward/test\.py\b", "reward/check.py", h)
    h = re.sub(r"(?<![\w./-])reward/", f"{mount}/reward/", h)
    if mount != UPSTREAM_WORKSPACE:
        h = h.replace(UPSTREAM_WORKSPACE, mount)
    return h


def _reward_sh(hook: str) -> str:
    return f"#!/usr/bin/env bash\nset -euo pipefail\n\n{hook} | {_AVERAGE}\n"


def _files_of(raw: Any, where: str) -> list[tuple[Any, Any]]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else []
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: input_files is a string but not JSON ({e})") from e
    if raw is None:
        return []
    if isinstance(raw, dict) and set(raw) >= {"file_path", "content"}:  # columnar (struct of lists)
        raw = [dict(zip(raw, vals)) for vals in zip(*raw.values())]
    if not isinstance(raw, (list, tuple)):
        raise TaskError(f"{where}: input_files must be a list of {{file_path, content}}, got {type(raw).__name__}")
    out = []
    for i, f in enumerate(raw):
        if not isinstance(f, dict) or "file_path" not in f:
            raise TaskError(f"{where}: input_files[{i}] must be an object with file_path and content")
        content = f.get("content")
        if content is None:
            content = ""
        elif not isinstance(content, (str, bytes)):  # a JSON file given as a parsed value
            content = json.dumps(content, indent=2, ensure_ascii=False)
        out.append((f["file_path"], content))
    return out


class TaskPlan(TypedDict):
    """One hub row planned as a task folder (:func:`plan_row`); its whole content is hashed into the cache key."""

    id: str
    entry: JSONObject  # the task's data_entry.json
    inputs: list[tuple[str, str | bytes]]  # input_files/: (relative path, content)
    reward: list[tuple[str, str | bytes]]  # reward/: (relative path, content)
    reward_sh: str


def plan_row(row: JSONObject, index: int, mount: str) -> TaskPlan:
    """One hub row as a task-dir plan: id, entry, input files, reward files (TaskError if malformed)."""
    card = _front_matter(row.get("origin_template"))
    raw_id = next((row[c] for c in _ID_COLUMNS if row.get(c) not in (None, "")), None) or card.get("id")
    task_id = _ID_BAD.sub("_", str(raw_id)).strip("._-") if raw_id is not None else ""
    task_id = task_id or f"task_{index:04d}"
    where = f"row {index} ({task_id})"
    prompt = row.get("prompt") if row.get("prompt") not in (None, "") else row.get("user_query")
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskError(f"{where}: empty prompt; every task needs the instruction given to the agent")
    inputs, reward = [], []
    for path, content in _files_of(row.get("input_files"), where):
        rel = datacache.safe_relpath(path, f"{where} input_files")
        if rel.parts[0] == "reward":
            sub = rel.relative_to("reward")
            reward.append(("check.py" if str(sub) == "test.py" else str(sub), content))
        else:
            inputs.append((str(rel), content))
    hook = rewrite_hook(row.get("hook_code"), mount)
    if not reward and f"{mount}/reward/" in hook:
        raise TaskError(f"{where}: hook_code runs a verifier under reward/ but no reward/ file is given")
    meta = row.get("metadata")
    meta_col: JSONObject = meta if isinstance(meta, dict) else {}
    category = row.get("category") or meta_col.get("category") or card.get("category")
    metadata = normalise_metadata({"category": ""}, category=category, rule=row.get("rule"))
    entry = {"task_id": task_id, "user_query": prompt, "input_mount_dir": mount, "metadata": metadata}
    return {"id": task_id, "entry": entry, "inputs": inputs, "reward": reward, "reward_sh": _reward_sh(hook)}


def rows_to_suite(rows: Iterable[JSONObject], *, name: str = BENCH_NAME, mount_dir: str = DEFAULT_MOUNT_DIR,
                  cache_dir: str | Path | None = None, source: str = "rows") -> Suite:
    """Materialise hub rows as task dirs (cached) and load them (see module doc)."""
    if not mount_dir.startswith("/"):
        raise TaskError(f"mount_dir {mount_dir!r} must be an absolute path inside the sandbox")
    mount = mount_dir.rstrip("/") or "/"
    plans, issues, seen = [], [], set()
    for i, row in enumerate(rows):
        try:
            if not isinstance(row, dict):
                raise TaskError(f"row {i}: expected an object, got {type(row).__name__}")
            plan = plan_row(row, i, mount)
        except TaskError as e:
            issues.append(TaskLoadIssue(path=f"{source}/row{i}", error=str(e)))
            continue
        if plan["id"] in seen:
            issues.append(TaskLoadIssue(path=f"{source}/{plan['id']}",
                                        error=f"row {i}: task id {plan['id']!r} repeats an earlier row"))
            continue
        seen.add(plan["id"])
        plans.append(plan)

    def build(root: Path) -> None:
        for p in plans:
            d = root / p["id"]
            datacache.write_entry(d, p["entry"])
            for rel, content in p["inputs"]:
                datacache.write_file(d / "input_files", rel, content)
            for rel, content in p["reward"]:
                datacache.write_file(d / "reward", rel, content)
            datacache.write_file(d / "reward", "reward.sh", p["reward_sh"], executable=True)

    root = datacache.materialise(name, datacache.digest({"v": 1, "plans": plans}), build, cache_dir)
    suite = Suite(name=name, root=root, issues=issues)
    suite.tasks = [load_task_dir(root / p["id"], suite=name) for p in sorted(plans, key=lambda p: p["id"])]
    if not suite.tasks and not suite.issues:
        raise TaskError(f"{source}: holds no ClawGym-Bench rows")
    return suite


def looks_like_bench_data(path: str | Path) -> bool:
    """True for a parquet/JSONL/JSON file, or a folder of them that is not a folder of task dirs."""
    p = Path(path).expanduser()
    if p.is_file():
        return p.suffix.lower() in TABLE_SUFFIXES
    return p.is_dir() and not any(is_task_dir(c) for c in p.iterdir()) and bool(_table_files(p))


def _table_files(folder: Path) -> list[Path]:
    found = [f for f in sorted(folder.rglob("*")) if f.is_file() and f.suffix.lower() in TABLE_SUFFIXES
             and not any(part.startswith(".") for part in f.relative_to(folder).parts)]
    parquet = [f for f in found if f.suffix.lower() == ".parquet"]
    return parquet or [f for f in found if f.suffix.lower() == ".jsonl"] or found


def _read_table(source: Any, split: str | None,
                cache_dir: str | Path | None = None) -> tuple[list[JSONObject], str]:
    """Rows of a datasets.Dataset/DatasetDict, a local table file or folder, or a hub dataset id
    (the ``datasets`` cache goes under our cache folder, see :mod:`tasks.datacache`)."""
    import datasets

    hf_cache = str(datacache.cache_root(cache_dir) / "hf-datasets")

    if isinstance(source, datasets.DatasetDict):
        keys = list(source)
        source = source[split or ("test" if "test" in keys else "train" if "train" in keys else keys[0])]
    if isinstance(source, datasets.Dataset):
        return [dict(r) for r in source], BENCH_NAME
    path = Path(str(source)).expanduser()
    if path.exists():
        files = [path] if path.is_file() else _table_files(path)
        if not files:
            raise TaskError(f"{path}: holds no task dirs and no .parquet/.jsonl/.json files")
        kind = "parquet" if files[0].suffix.lower() == ".parquet" else "json"
        try:
            ds = datasets.load_dataset(kind, data_files=[str(f) for f in files], split="train", cache_dir=hf_cache)
        except Exception as e:  # datasets raises many kinds; the file is what is wrong
            raise TaskError(f"{path}: cannot be read as a {kind} table of ClawGym-Bench rows ({e})") from e
        return [dict(r) for r in ds], str(path)
    try:
        loaded = datasets.load_dataset(str(source), split=split, cache_dir=hf_cache)
    except Exception as e:
        raise TaskError(f"cannot load the dataset {source!r} ({type(e).__name__}: {e}); pass a local copy "
                        f"(task dirs, or the parquet/JSONL files)") from e
    return _read_table(loaded, split, cache_dir)


def load_clawgym_bench(source: Any = HUB_ID, *, split: str | None = None, mount_dir: str = DEFAULT_MOUNT_DIR,
                       cache_dir: str | Path | None = None, name: str = BENCH_NAME) -> Suite:
    """ClawGym-Bench from task dirs, local parquet/JSONL, a ``datasets`` object or a hub id."""
    if isinstance(source, (str, Path)) and Path(source).expanduser().is_dir() and \
            any(is_task_dir(c) for c in Path(source).expanduser().iterdir()):
        suite = load_task_folder(Path(source).expanduser().resolve(), name)
        for t in suite.tasks:
            t.metadata = normalise_metadata(t.metadata)
        return suite
    if isinstance(source, list):
        rows, where = source, "rows"
    else:
        rows, where = _read_table(source, split, cache_dir)
    return rows_to_suite(rows, name=name, mount_dir=mount_dir, cache_dir=cache_dir, source=where)


def task_files(task: Task) -> dict[str, bytes]:
    """``{relative path: bytes}`` of the task's input files (for comparisons and reports)."""
    if task.input_dir is None:
        return {}
    base = Path(task.input_dir)
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}
