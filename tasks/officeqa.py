"""OfficeQA (Databricks): grounded questions over U.S. Treasury Bulletins, as a ClawGym suite.

Data: a question CSV with columns ``uid, question, answer, source_docs, source_files, difficulty``
(``officeqa_full.csv``: 246 questions; the "pro" subset is its 133 ``hard`` ones, also shipped as
``officeqa_pro.csv``) and a corpus of bulletins named ``treasury_bulletin_YYYY_MM.{txt,json,pdf}``.

:func:`load_officeqa` turns each question into a task dir (see :mod:`tasks.datacache`):

* ``input_files/`` holds the question's source documents from the corpus. ``source_files`` names
  parsed ``.txt`` files; a corpus file with exactly that name wins, else one with the same stem in
  the order ``.txt, .md, .json, .pdf`` (so a PDF-only corpus works). The corpus is searched
  recursively; it defaults to the CSV's folder.
* a missing document never fails the load: the task keeps the documents that exist, records a
  note and ``metadata["missing_files"]``, and ``suite.issues`` names the missing files (with
  ``skip_incomplete=True`` such tasks are left out instead).
* ``reward/`` holds ``check.py`` (a byte copy of :mod:`tasks.officeqa_scorer`, standard library
  only), ``gold.json`` (answer + tolerance) and ``reward.sh`` in the ClawGym convention; the agent
  never sees ``reward/``, so the gold answer stays out of its view. It is also kept out of
  ``task.metadata``.
* ``metadata``: ``grading_type`` ``"officeqa"``, ``category`` (the difficulty), ``uid``,
  ``difficulty``, ``source_files``, ``source_docs``, ``documents`` (the workspace file names),
  ``tolerance``.

The instruction asks for the answer inside ``<FINAL_ANSWER>…</FINAL_ANSWER>``; the verifier scores
the final message with :func:`score_answer` (rules in :mod:`tasks.officeqa_scorer`).
"""

from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path
from typing import TypedDict

from clawgym_env.errors import TaskError
from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Suite, TaskLoadIssue
from tasks import datacache
from tasks.officeqa_scorer import extract_final_answer, judge, score_answer
from tasks.taskdir import DEFAULT_MOUNT_DIR, load_task_dir

__all__ = ["DEFAULT_TOLERANCE", "build_instruction", "extract_final_answer", "find_officeqa_csv", "judge",
           "load_officeqa", "looks_like_officeqa_csv", "score_answer"]

DEFAULT_TOLERANCE = 0.0
REQUIRED_COLUMNS = ("uid", "question", "answer", "source_files")
SUBSETS = ("full", "pro")
DOC_PREFERENCE = (".txt", ".md", ".json", ".pdf")
_SCORER = Path(__file__).resolve().with_name("officeqa_scorer.py")
_ID_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_AVERAGE = ("python3 -c 'import json, sys; raw = sys.stdin.read().strip(); data = json.loads(raw); "
            "print(sum(float(v) for v in data.values()) / len(data) if isinstance(data, dict) and data "
            "else float(data) if isinstance(data, (int, float)) else 0.0)'")


def build_instruction(question: str, documents: list[str]) -> str:
    """The agent's instruction for one question (documents: file names in the workspace)."""
    if documents:
        where = ("Use the U.S. Treasury Bulletin document(s) in your workspace: "
                 + ", ".join(documents) + ".")
    else:
        where = "The U.S. Treasury Bulletin documents for this question are not in your workspace."
    return (f"Answer the question below. {where}\n\n"
            f"Question: {question.strip()}\n\n"
            "When you are done, give your final answer inside <FINAL_ANSWER></FINAL_ANSWER> tags: "
            "only the value (a bracketed list when several values are asked for), on one line, "
            "in the units and format the question asks for, with no explanation inside the tags.\n"
            "All file paths are relative to the workspace directory.")


def looks_like_officeqa_csv(path: str | Path) -> bool:
    """True for a readable CSV file whose header holds the OfficeQA columns."""
    p = Path(path)
    if not p.is_file() or p.suffix.lower() != ".csv":
        return False
    try:
        with p.open(newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError):
        return False
    return set(REQUIRED_COLUMNS) <= {h.strip() for h in header}


def find_officeqa_csv(data: str | Path, subset: str = "full") -> Path:
    """The question CSV for ``data`` (a CSV file, or a folder holding ``officeqa_<subset>.csv``)."""
    p = Path(data).expanduser()
    if p.is_file():
        return p
    if not p.is_dir():
        raise TaskError(f"{p}: no such OfficeQA data; pass the question CSV (officeqa_full.csv) "
                        f"or the folder that holds it")
    names = [f"officeqa_{subset}.csv", "officeqa_full.csv", "officeqa.csv"]
    for name in names:
        for hit in sorted(p.rglob(name)):
            return hit
    raise TaskError(f"{p}: holds none of {', '.join(names)}; pass the question CSV itself")


def _split_list(cell: str | None) -> list[str]:
    return [x for x in re.split(r"[\s,;]+", cell or "") if x]


class _Plan(TypedDict):
    """One question planned as a task folder; hashed (documents by path, size and mtime) into the cache key."""

    id: str
    notes: list[str]
    docs: list[Path]  # the source documents copied into input_files/
    answer: str
    entry: JSONObject  # the task's data_entry.json


class _Corpus:
    """Files under a folder, by name and by stem (recursive; hidden entries skipped)."""

    def __init__(self, root: Path | None, exclude: Path) -> None:
        self.root = root
        self.by_name: dict[str, Path] = {}
        self.by_stem: dict[str, list[Path]] = {}
        if root is None or not root.is_dir():
            return
        for f in sorted(root.rglob("*")):
            rel = f.relative_to(root).parts
            if any(part.startswith(".") for part in rel) or not f.is_file() or f.resolve() == exclude:
                continue
            self.by_name.setdefault(f.name, f)
            self.by_stem.setdefault(f.stem, []).append(f)

    def find(self, name: str) -> Path | None:
        if name in self.by_name:
            return self.by_name[name]
        cands = self.by_stem.get(Path(name).stem, [])
        rank = {ext: i for i, ext in enumerate(DOC_PREFERENCE)}
        cands = sorted(cands, key=lambda c: (rank.get(c.suffix.lower(), len(rank)), c.suffix, str(c)))
        return cands[0] if cands else None


def _reward_sh(mount: str) -> str:
    q = shlex.quote
    return ("#!/usr/bin/env bash\nset -euo pipefail\n\n"
            f"python3 {q(mount + '/reward/check.py')} {q(mount)} | {_AVERAGE}\n")


def _read_rows(csv_path: Path) -> tuple[list[dict[str, str]], set[str]]:
    try:
        with csv_path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            header = {h.strip() for h in (reader.fieldnames or [])}
            rows = [{(k or "").strip(): (v or "") for k, v in row.items()} for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise TaskError(f"{csv_path}: cannot be read as a UTF-8 CSV ({e})") from e
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise TaskError(f"{csv_path}: missing column(s) {missing}; an OfficeQA CSV has "
                        f"uid, question, answer, source_docs, source_files, difficulty")
    return rows, header


def load_officeqa(csv_path: str | Path, corpus_dir: str | Path | None = None, subset: str = "full",
                  mount_dir: str = DEFAULT_MOUNT_DIR, *, tolerance: float = DEFAULT_TOLERANCE,
                  cache_dir: str | Path | None = None, skip_incomplete: bool = False,
                  name: str | None = None) -> Suite:
    """The OfficeQA suite (see module doc); ``subset`` "pro" keeps the ``hard`` questions."""
    if subset not in SUBSETS:
        raise TaskError(f"unknown OfficeQA subset {subset!r}; use one of {', '.join(SUBSETS)}")
    if not 0.0 <= float(tolerance) <= 1.0:
        raise TaskError(f"tolerance {tolerance!r} must be a relative error in [0, 1] (0.0 = exact)")
    if not mount_dir.startswith("/"):
        raise TaskError(f"mount_dir {mount_dir!r} must be an absolute path inside the sandbox")
    mount = mount_dir.rstrip("/") or "/"
    csv_path = find_officeqa_csv(csv_path, subset).resolve()
    rows, header = _read_rows(csv_path)
    if subset == "pro":
        if "difficulty" in header:
            rows = [r for r in rows if r.get("difficulty", "").strip().lower() == "hard"]
        elif "pro" not in csv_path.stem.lower():
            raise TaskError(f"{csv_path}: has no 'difficulty' column to select the pro (hard) subset; "
                            f"pass officeqa_pro.csv or subset='full'")
    corpus_root = Path(corpus_dir).expanduser().resolve() if corpus_dir is not None else csv_path.parent
    if corpus_dir is not None and not corpus_root.is_dir():
        raise TaskError(f"{corpus_root}: corpus_dir is not a folder; pass the folder holding the "
                        f"treasury_bulletin_*.txt/.pdf files")
    corpus = _Corpus(corpus_root, exclude=csv_path)
    suite_name = name or ("officeqa" if subset == "full" else "officeqa-pro")
    issues: list[TaskLoadIssue] = []
    plans: list[_Plan] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        uid = row.get("uid", "").strip()
        where = f"{csv_path}/{uid or f'row{i + 2}'}"
        question, answer = row.get("question", "").strip(), row.get("answer", "").strip()
        task_id = _ID_BAD.sub("_", uid).strip("._-")
        if not task_id or not question or not answer:
            issues.append(TaskLoadIssue(path=where, error=f"CSV row {i + 2}: empty uid, question or answer"))
            continue
        if task_id in seen:
            issues.append(TaskLoadIssue(path=where, error=f"CSV row {i + 2}: uid {uid!r} repeats an earlier row"))
            continue
        seen.add(task_id)
        wanted = _split_list(row.get("source_files"))
        found = {w: corpus.find(w) for w in wanted}
        missing = [w for w, f in found.items() if f is None]
        docs = list(dict.fromkeys(f for f in found.values() if f is not None))
        notes = [f"uid {uid!r} was renamed {task_id!r} to be a valid task id"] if task_id != uid else []
        if missing:
            notes.append(f"source file(s) not found under {corpus_root}: {', '.join(missing)}")
            issues.append(TaskLoadIssue(
                path=f"{csv_path}/{task_id}",
                error=f"source file(s) not found under {corpus_root}: {', '.join(missing)}; "
                      + ("task left out" if skip_incomplete else "the task is loaded without them")))
            if skip_incomplete:
                continue
        difficulty = row.get("difficulty", "").strip().lower()
        metadata = {"category": difficulty or "officeqa", "grading_type": "officeqa", "benchmark": "officeqa",
                    "uid": uid, "difficulty": difficulty, "source_files": wanted,
                    "source_docs": _split_list(row.get("source_docs")), "documents": [d.name for d in docs],
                    "missing_files": missing, "tolerance": float(tolerance)}
        plans.append({"id": task_id, "notes": notes, "docs": docs, "answer": answer,
                      "entry": {"task_id": task_id, "user_query": build_instruction(question, [d.name for d in docs]),
                                "input_mount_dir": mount, "metadata": metadata}})

    scorer = _SCORER.read_bytes()
    key = datacache.digest({"v": 1, "mount": mount, "tol": float(tolerance), "scorer": scorer, "plans": [
        {**p, "docs": [(str(d), d.stat().st_size, d.stat().st_mtime_ns) for d in p["docs"]]} for p in plans]})

    def build(root: Path) -> None:
        for p in plans:
            d = root / p["id"]
            datacache.write_entry(d, p["entry"])
            for doc in p["docs"]:
                datacache.write_file(d / "input_files", doc.name, doc)
            datacache.write_file(d / "reward", "check.py", scorer)
            datacache.write_file(d / "reward", "gold.json", json.dumps(
                {"answer": p["answer"], "tolerance": float(tolerance)}, ensure_ascii=False) + "\n")
            datacache.write_file(d / "reward", "reward.sh", _reward_sh(mount), executable=True)

    root = datacache.materialise(suite_name, key, build, cache_dir)
    suite = Suite(name=suite_name, root=root, issues=issues)
    for p in plans:
        task = load_task_dir(root / p["id"], suite=suite_name)
        task.notes.extend(p["notes"])
        suite.tasks.append(task)
    if not suite.tasks and not suite.issues:
        raise TaskError(f"{csv_path}: holds no questions" + (" in the pro (hard) subset" if subset == "pro" else ""))
    return suite
