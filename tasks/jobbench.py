"""JobBench: professional tasks over folders of reference files, graded by an LLM judge per rubric.

Data (the format of the Hugging Face dataset ``JobBench/job-bench``)::

    <split folder>/<occupation>/taskN/
      RUBRICS.json      {"rubrics": [{"rubric": str, "weight": int, "criterion": str | [str]}]}  hidden
      task_card.md      human-readable brief                                                    hidden
      task_folder/      TASK_INSTRUCTIONS.txt + starter files (csv, xlsx, pdf, docx, sqlite, …)

and the parquet form (``tasks.parquet`` = split main, ``easy.parquet`` = split easy), one row per task
with columns ``task_id, occupation, task_num, prompt, reference_files, reference_file_urls,
reference_file_hf_uris, rubric_json, task_card``; ``reference_files`` are paths relative to the
parquet's folder (``dataset/<occupation>/taskN/task_folder/<file>``) and are used when present.

:func:`load_jobbench` gives a :class:`~clawgym_env.task.Suite` of :class:`JobBenchTask`:
  * ``id`` is the official ``<occupation>__taskN`` (prefixed ``<split>__`` only when one call
    loads several splits, so ids stay unique); ``instruction`` is the prompt plus a closing note
    naming the workspace and the output folder ``outputs/``;
  * ``input_dir`` is the task's starter folder, copied verbatim into the workspace: it never holds
    ``RUBRICS.json`` or ``task_card.md`` (a task whose starter folder does is a suite issue);
  * rubrics and the task card live on the task in fields excluded from every dump, never in
    ``metadata`` (which travels to verifiers and env infos);
  * ``metadata``: ``occupation``, ``category`` (= occupation), ``task_num``, ``split``,
    ``grading_type`` = ``"jobbench"``, ``output_dir`` = ``"outputs"``;
  * a task that cannot be loaded (bad rubric JSON, a missing reference file) is a
    ``suite.issues`` entry; only an unusable path or table raises :class:`TaskError`.

Grading — why not ``reward/reward.sh``: the hermetic verifier runs with no network, and this grader
needs the judge endpoint. JobBench tasks therefore carry no ``reward_dir``; their grader
(:class:`tasks.graders.JobBenchGrader`, the task's ``grader``) runs inside the episode, on the host
side of the sandbox, so ``env.step``, training and ``clawgym eval`` read the same reward::

    res = run_episode(task, adapter, proxy, judge=JudgeClient.from_env())   # or judge=None: the same
    res.record.reward, res.record.status   # "reward_invalid" when the judge failed

:func:`score_jobbench` extracts the text of every file under ``<workspace>/outputs/`` (see
:mod:`tasks.extract`), asks the judge ONE question per rubric (all its criteria at once,
temperature 0, JSON verdicts), credits a rubric's weight only when every criterion passes, and
returns ``round(earned / possible, 4)``. An absent or empty output folder scores 0 with no judge
call. A judge that cannot be reached raises :class:`TaskError` (infrastructure, never a silent 0);
an unparseable verdict fails that rubric and is recorded in the details.
:func:`jobbench_leaderboard_score` is ``100 * sum(earned) / sum(possible)`` over many results.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from clawgym_env.errors import TaskError
from clawgym_env.task import Suite, Task, TaskLimits, TaskLoadIssue
from tasks.jobbench_score import JobBenchScore, jobbench_leaderboard_score, score_jobbench
from tasks.jobbench_task import (
    INSTRUCTIONS_FILE,
    OUTPUT_DIR,
    RUBRICS_FILE,
    TASK_CARD_FILE,
    TASK_FOLDER,
    JobBenchTask,
    Rubric,
    parse_rubrics,
    read_rows,
    rubrics_for,
)
from tasks.taskdir import DEFAULT_MOUNT_DIR

HIDDEN_FILES = (RUBRICS_FILE, TASK_CARD_FILE)
MOUNT_DIR = DEFAULT_MOUNT_DIR  # the workspace path inside the sandbox, as for ClawGym task dirs
SPLIT_FILES = {"main": "tasks.parquet", "easy": "easy.parquet"}
SPLIT_FOLDERS = {"main": ("dataset", "main"), "easy": ("dataset_easy", "easy")}
DEFAULT_LIMITS = TaskLimits(timeout_s=3600.0, max_turns=100)
_TASK_DIR_RE = re.compile(r"^task(\d+)$")
_ID_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _instruction(prompt: str, mount_dir: str) -> str:
    return (f"{prompt.rstrip()}\n\n---\n"
            f"Your working directory is {mount_dir}. It holds {INSTRUCTIONS_FILE} (the task above) and the "
            f"reference files it mentions. Save your final deliverables, and only them (no scratch or "
            f"intermediate files), in the folder {mount_dir}/{OUTPUT_DIR}/ (create it). If the task asks you "
            f"to modify a provided file, save the final modified copy in {OUTPUT_DIR}/. Where sources "
            f"conflict, explain the conflict and justify the approach you choose.")


def _hidden_inside(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.name in HIDDEN_FILES)


def _make_task(*, task_id: str, occupation: str, task_num: int | None, split: str | None, prompt: str,
               input_dir: Path | None, task_dir: Path | None, rubrics: list[Rubric], task_card: str | None,
               suite: str, source: dict[str, str], limits: TaskLimits | None) -> JobBenchTask:
    if input_dir is not None:
        leaked = _hidden_inside(input_dir)
        if leaked:
            raise TaskError(f"{input_dir}: the starter folder holds grading file(s) {leaked}; they would be "
                            f"copied into the agent's workspace, so this task is refused")
    metadata = {"occupation": occupation, "category": occupation, "task_num": task_num, "split": split,
                "grading_type": "jobbench", "output_dir": OUTPUT_DIR, "jobbench_source": source}
    return JobBenchTask(id=task_id, instruction=_instruction(prompt, MOUNT_DIR), mount_dir=MOUNT_DIR,
                        suite=suite, task_dir=task_dir, input_dir=input_dir, reward_dir=None,
                        metadata=metadata, limits=limits or DEFAULT_LIMITS, rubrics=rubrics,
                        task_card=task_card)


def _safe_id(text: str) -> str:
    return _ID_SAFE.sub("_", text).strip("_") or "task"


# -- folder form ---------------------------------------------------------------------------------

def _is_task_dir(p: Path) -> bool:
    return p.is_dir() and (p / TASK_FOLDER).is_dir() and ((p / RUBRICS_FILE).exists()
                                                          or (p / TASK_FOLDER / INSTRUCTIONS_FILE).exists())


def _find_task_dirs(root: Path, depth: int = 4) -> list[Path]:
    if _is_task_dir(root):
        return [root]
    if depth == 0 or not root.is_dir():
        return []
    out: list[Path] = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.is_symlink() and not child.name.startswith((".", "_")) \
                and child.name not in (TASK_FOLDER, "files_required_to_search", "model_output"):
            out += _find_task_dirs(child, depth - 1)
    return out


def _split_of(task_dir: Path, root: Path) -> str | None:
    for part in task_dir.relative_to(root).parts if task_dir != root else ():
        for split, names in SPLIT_FOLDERS.items():
            if part in names:
                return split
    return None


def _load_folder_task(d: Path, split: str | None, suite: str, limits: TaskLimits | None) -> JobBenchTask:
    m = _TASK_DIR_RE.match(d.name)
    occupation = d.parent.name
    task_num = int(m.group(1)) if m else None
    instr = d / TASK_FOLDER / INSTRUCTIONS_FILE
    if not instr.is_file():
        raise TaskError(f"{instr}: missing; every JobBench task folder needs {TASK_FOLDER}/{INSTRUCTIONS_FILE}")
    rub = d / RUBRICS_FILE
    if not rub.is_file():
        raise TaskError(f"{rub}: missing; the task cannot be graded without its rubrics")
    rubrics = parse_rubrics(rub.read_text(encoding="utf-8", errors="replace"), str(rub))
    card = d / TASK_CARD_FILE
    return _make_task(task_id=_safe_id(f"{occupation}__{d.name}"), occupation=occupation, task_num=task_num,
                      split=split, prompt=instr.read_text(encoding="utf-8", errors="replace"),
                      input_dir=d / TASK_FOLDER, task_dir=d, rubrics=rubrics,
                      task_card=card.read_text(encoding="utf-8", errors="replace") if card.is_file() else None,
                      suite=suite, source={"kind": "folder", "rubrics": str(rub)}, limits=limits)


def _load_folders(root: Path, split: str | None, suite: Suite, limits: TaskLimits | None) -> None:
    dirs = _find_task_dirs(root)
    found = {d: _split_of(d, root) for d in dirs}
    if split is not None and any(s is not None for s in found.values()):
        dirs = [d for d in dirs if found[d] == split]
    splits = {found[d] or split for d in dirs}
    for d in dirs:
        s = found[d] or split
        try:
            task = _load_folder_task(d, s, suite.name, limits)
        except TaskError as e:
            suite.issues.append(TaskLoadIssue(path=str(d), error=str(e)))
            continue
        if len(splits) > 1:
            task.id = f"{s or 'unsplit'}__{task.id}"
        suite.tasks.append(task)


# -- parquet form --------------------------------------------------------------------------------

def _starter_folder(base: Path, refs: list[str], where: str) -> Path | None:
    if not refs:
        return None
    paths = [base / r for r in refs]
    missing = [r for r, p in zip(refs, paths) if not p.is_file()]
    if missing:
        raise TaskError(f"{where}: reference file(s) missing next to the parquet: {missing[:5]}"
                        f"{' …' if len(missing) > 5 else ''}; download the dataset's files into {base}")
    parts = Path(refs[0]).parts
    if TASK_FOLDER in parts:
        folder = base.joinpath(*parts[:parts.index(TASK_FOLDER) + 1])
    else:
        folder = Path(os.path.commonpath([str(p.parent) for p in paths]))
    if not all(p.resolve().is_relative_to(folder.resolve()) for p in paths):
        raise TaskError(f"{where}: reference files do not share one starter folder ({folder})")
    return folder


def _load_parquet(parquet: Path, split: str | None, suite: Suite, limits: TaskLimits | None,
                  prefix: str = "") -> None:
    base = parquet.parent
    for i, row in enumerate(read_rows(parquet)):
        where = f"{parquet} row {i} ({row.get('task_id')})"
        try:
            tid = row.get("task_id")
            if not isinstance(tid, str) or not tid.strip():
                raise TaskError(f"{where}: task_id must be a non-empty string")
            if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
                raise TaskError(f"{where}: prompt must be a non-empty string")
            rubrics = parse_rubrics(row["rubric_json"], where)
            refs = [str(r) for r in row.get("reference_files") or []]
            folder = _starter_folder(base, refs, where)
            occupation = row.get("occupation") or tid.split("__")[0]
            tnum = row.get("task_num")
            task = _make_task(task_id=prefix + _safe_id(tid), occupation=str(occupation),
                              task_num=int(tnum) if tnum is not None else None, split=split,
                              prompt=row["prompt"], input_dir=folder,
                              task_dir=folder.parent if folder is not None else None, rubrics=rubrics,
                              task_card=row.get("task_card"), suite=suite.name,
                              source={"kind": "parquet", "parquet": str(parquet), "task_id": tid},
                              limits=limits)
        except TaskError as e:
            suite.issues.append(TaskLoadIssue(path=where, error=str(e)))
            continue
        suite.tasks.append(task)


# -- entry points --------------------------------------------------------------------------------

def is_jobbench_data(path: str | Path) -> bool:
    """True for a JobBench parquet file or a folder holding JobBench task folders (or parquets)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p.suffix == ".parquet"
    return p.is_dir() and (any((p / f).is_file() for f in SPLIT_FILES.values()) or bool(_find_task_dirs(p)))


def load_jobbench(path: str | Path, split: str | None = "main", *, name: str | None = None,
                  limits: TaskLimits | None = None) -> Suite:
    """JobBench tasks from a folder of task folders or a parquet file/folder (see module doc).

    ``split``: ``"main"``, ``"easy"`` or None (everything found); a parquet file named
    ``tasks.parquet`` / ``easy.parquet`` is of the split its name says. A folder holding the split's
    parquet is read through the parquet (the canonical listing); otherwise task folders are found
    below ``path`` (in the split's subfolder when the data has split subfolders).
    """
    if split not in (None, *SPLIT_FILES):
        raise TaskError(f"unknown JobBench split {split!r}; use 'main', 'easy' or None")
    root = Path(path).expanduser()
    if not root.exists():
        raise TaskError(f"{root}: no such JobBench data; pass a folder of task folders or a .parquet file")
    if root.is_file():
        if root.suffix != ".parquet":
            raise TaskError(f"{root}: not a parquet file; pass tasks.parquet, easy.parquet or a folder")
        split = next((s for s, f in SPLIT_FILES.items() if f == root.name), split)
    suite = Suite(name=name or (f"jobbench-{split}" if split else "jobbench"), root=root.resolve())
    if root.is_file():
        _load_parquet(root.resolve(), split, suite, limits)
    else:
        root = root.resolve()
        wanted = [split] if split else list(SPLIT_FILES)
        parquets = [(s, root / SPLIT_FILES[s]) for s in wanted if (root / SPLIT_FILES[s]).is_file()]
        if parquets:
            for s, pq_path in parquets:
                _load_parquet(pq_path, s, suite, limits, prefix=f"{s}__" if len(parquets) > 1 else "")
        else:
            _load_folders(root, split, suite, limits)
    if not suite.tasks and not suite.issues:
        raise TaskError(f"{root}: holds no JobBench tasks{f' of split {split!r}' if split else ''} "
                        f"(folders <occupation>/taskN/ with {TASK_FOLDER}/ and {RUBRICS_FILE}, "
                        f"or {' / '.join(SPLIT_FILES.values())})")
    seen: set[str] = set()
    for t in list(suite.tasks):
        if t.id in seen:
            suite.tasks.remove(t)
            suite.issues.append(TaskLoadIssue(path=str(t.task_dir or t.id), error=(
                f"task id {t.id!r} appears twice; pass split='main' or split='easy' to load one split")))
        seen.add(t.id)
    return suite


SUITE_NAMES = {"jobbench": "main", "jobbench-main": "main", "jobbench-easy": "easy"}
DATA_ENV = "CLAWGYM_JOBBENCH_DATA"


def _looks_like_jobbench(p: Path) -> bool:
    if p.is_file():
        return p.suffix == ".parquet"
    if not p.is_dir() or any((c / "data_entry.json").is_file() for c in p.iterdir() if c.is_dir()):
        return False  # a folder of ClawGym task dirs
    return is_jobbench_data(p)


def jobbench_suite_for(spec: str | Path, data: str | Path | None = None) -> Suite | None:
    """The suite a :func:`tasks.load_suite` spec names when it is JobBench, else None.

    ``jobbench`` / ``jobbench-main`` / ``jobbench-easy`` need ``data`` (or ``$CLAWGYM_JOBBENCH_DATA``);
    a path to JobBench data loads split ``main`` when the data is split, else everything found.
    """
    if isinstance(spec, str) and spec in SUITE_NAMES:
        path = data or os.environ.get(DATA_ENV)
        if not path:
            raise TaskError(f"suite {spec!r} needs the JobBench data: load_suite({spec!r}, data=PATH) or set "
                            f"{DATA_ENV} (a folder holding tasks.parquet / easy.parquet and their files, "
                            f"or a folder of <occupation>/taskN/ task folders)")
        return load_jobbench(path, SUITE_NAMES[spec], name=spec)
    p = Path(spec).expanduser()
    if not _looks_like_jobbench(p):
        return None
    split = "main" if p.is_dir() and ((p / SPLIT_FILES["main"]).is_file()
                                      or any((p / n).is_dir() for n in SPLIT_FOLDERS["main"])) else None
    return load_jobbench(p, split)


def jobbench_task_for(spec: str | Path) -> Task | None:
    """The task a :func:`tasks.resolve_task` spec names when it is JobBench (``jobbench/<id>``,
    ``<data path>/<id>`` or a path to one ``<occupation>/taskN`` folder), else None."""
    p = Path(spec).expanduser()
    if _is_task_dir(p):
        suite = load_jobbench(p, None)
        if suite.issues:
            raise TaskError(suite.issues[0].error)
        return suite.tasks[0]
    text = str(spec).rstrip("/")
    if "/" not in text:
        return None
    head, task_id = text.rsplit("/", 1)
    if head not in SUITE_NAMES and not _looks_like_jobbench(Path(head).expanduser()):
        return None
    found = jobbench_suite_for(head)
    return found.get(task_id) if found is not None else None


__all__ = ["JobBenchScore", "JobBenchTask", "Rubric", "is_jobbench_data", "jobbench_leaderboard_score",
           "jobbench_suite_for", "jobbench_task_for", "load_jobbench", "parse_rubrics", "rubrics_for", "score_jobbench"]
