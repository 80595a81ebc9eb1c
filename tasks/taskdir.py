"""Loader of the ClawGym task-dir format.

A task dir is a folder::

    <task_dir>/
      data_entry.json   {"task_id": str, "user_query": str, "input_mount_dir": abs path,
                         "metadata": {...}, "limits": {...}, "protected_inputs": [...],
                         "grader": str (the last three optional, this project's extensions)}
      input_files/      optional; copied verbatim into the workspace by the runner
      reward/reward.sh  prints the score, a float in [0, 1], as its last stdout line
      expert.json       optional (this project's extension): {"steps": [...], "wrong": [...]}

``limits`` (:class:`~clawgym_env.task.TaskLimits`; every key optional, every value positive):
``timeout_s`` (the agent's wall clock, default 600), ``max_turns`` (30), ``reward_timeout_s`` (the
verifier's wall clock, 120), ``disk_mb`` (the sandbox's disk quota in MiB for each writable place:
workspace, HOME, ``/tmp``, ``/dev/shm``; null or absent: the sandbox default, 2048), ``memory_mb``
(the sandbox's memory limit in MiB; null or absent: 4096), ``inodes`` (files, folders and links
each writable place may hold; null or absent: 262144) and ``cpus`` (the sandbox's CPU share in
cores; null or absent: 2), e.g.
``{"timeout_s": 300, "max_turns": 20, "disk_mb": 64}``.

``protected_inputs`` (:attr:`~clawgym_env.task.Task.protected_inputs`): input files the grader puts
back as shipped before grading, as workspace-relative paths or ``fnmatch`` patterns, e.g.
``["test_mathutils.py", "tests/*.py"]``; each must match at least one file of ``input_files/``.

``grader`` (:attr:`~clawgym_env.task.Task.grader`): the name of a grader registered in
:data:`clawgym_env.plugins.graders` (``reward.sh``, ``hybrid``, ``jobbench`` or a plugin's, entry point
group ``clawgym.graders``), which then grades the task; absent: ``hybrid`` when the task carries a rubric,
else ``reward.sh``. An unknown name (or one whose plugin fails to import) fails the task's load.

Invariants of a :class:`~clawgym_env.task.Task` returned by :func:`load_task_dir`:
  * ``id`` is the ``task_id`` of ``data_entry.json`` (non-empty, no ``/``, no whitespace);
  * ``instruction`` is ``user_query`` verbatim;
  * ``mount_dir`` is an absolute POSIX path (``/root/.openclaw/workspace`` when the key is absent,
    as in a few upstream tasks that ship no input files);
  * ``reward_dir / "reward.sh"`` is a file; ``input_dir`` is a folder or ``None``;
  * anything unusual but harmless (folder name differs from task_id, absent mount dir) is recorded
    in ``notes`` instead of failing.

Every malformed task dir raises :class:`~clawgym_env.errors.TaskError` whose message names the
file, the problem and the fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from clawgym_env.errors import RegistrationError, TaskError
from clawgym_env.grading.inputs import input_files, matching
from clawgym_env.jsontypes import JSONObject
from clawgym_env.task import Task, TaskLimits
from tasks.hybrid import is_hybrid

DATA_ENTRY = "data_entry.json"
INPUT_DIR = "input_files"
REWARD_DIR = "reward"
REWARD_SCRIPT = "reward.sh"
EXPERT_FILE = "expert.json"
DEFAULT_MOUNT_DIR = "/root/.openclaw/workspace"
PAYLOAD_ENV = "OPENCLAW_REWARD_PAYLOAD"
"""Env var holding the path of the verifier's JSON payload
``{task_id, user_query, metadata, final_message, transcript}`` (for tasks graded on the answer)."""

_TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_LIMIT_KEYS = tuple(TaskLimits.model_fields)
_OPTIONAL_LIMITS = ("disk_mb", "memory_mb", "inodes", "cpus")  # null: the sandbox's default
_EXPERT_TOOLS = {"write_file": ("path", "content"), "bash": ("command",), "read_file": ("path",)}


def is_task_dir(path: str | Path) -> bool:
    """True when ``path`` is a folder holding ``data_entry.json`` (it may still be malformed)."""
    p = Path(path)
    return p.is_dir() and (p / DATA_ENTRY).is_file()


def _read_json(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text ({e}); save {what} as UTF-8 JSON") from e
    except OSError as e:
        raise TaskError(f"{path}: cannot be read ({e.strerror or e}); check its permissions") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskError(
            f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}; "
            f"fix the syntax of {what} (e.g. `python3 -m json.tool {path.name}` shows where)") from e


def _require_str(entry: dict, key: str, path: Path, *, hint: str) -> str:
    if key not in entry:
        raise TaskError(f"{path}: missing key {key!r}; add it ({hint})")
    value = entry[key]
    if not isinstance(value, str):
        raise TaskError(f"{path}: key {key!r} must be a string, got {type(value).__name__}; {hint}")
    if not value.strip():
        raise TaskError(f"{path}: key {key!r} is empty; {hint}")
    return value


def _parse_limits(raw: Any, path: Path) -> TaskLimits:
    if raw is None:
        return TaskLimits()
    if not isinstance(raw, dict):
        raise TaskError(f"{path}: 'limits' must be an object like "
                        f'{{"timeout_s": 300, "max_turns": 20, "reward_timeout_s": 60}}, '
                        f"got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_LIMIT_KEYS))
    if unknown:
        raise TaskError(f"{path}: unknown key(s) {unknown} in 'limits'; allowed: {list(_LIMIT_KEYS)}")
    for k, v in raw.items():
        if v is None and k in _OPTIONAL_LIMITS:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TaskError(f"{path}: limits.{k} must be a positive number, got {v!r}")
    try:
        return TaskLimits(**raw)
    except ValidationError as e:
        probs = "; ".join(f"limits.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise TaskError(f"{path}: {probs}; every limit must be a positive number "
                        f"(max_turns, disk_mb, memory_mb and inodes whole numbers)") from e


def _parse_protected(raw: Any, path: Path, input_dir: Path | None) -> list[str]:
    """``protected_inputs``: a list of workspace-relative paths or patterns, each matching an input file."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(p, str) and p.strip() for p in raw):
        raise TaskError(f"{path}: 'protected_inputs' must be a list of workspace-relative paths or patterns, "
                        f'e.g. ["test_mathutils.py", "tests/*.py"], got {raw!r}')
    files = input_files(input_dir) if input_dir is not None else []
    for pattern in raw:
        if pattern.startswith("/") or ".." in pattern.split("/"):
            raise TaskError(f"{path}: protected_inputs entry {pattern!r} must be relative to the workspace and "
                            "stay inside it (no leading '/', no '..')")
        if not matching(files, [pattern]):
            raise TaskError(f"{path}: protected_inputs entry {pattern!r} matches no file of {INPUT_DIR}/; "
                            f"name files the task ships there (it has {len(files)}: {files[:5]})")
    return list(raw)


def load_task_dir(path: str | Path, suite: str | None = None) -> Task:
    """Load one task dir into a :class:`Task` (``suite`` is recorded on it, not checked)."""
    task_dir = Path(path).expanduser()
    if not task_dir.exists():
        raise TaskError(f"{task_dir}: no such task dir; pass a folder holding {DATA_ENTRY} and {REWARD_DIR}/")
    if not task_dir.is_dir():
        raise TaskError(f"{task_dir}: not a folder; a task is a folder holding {DATA_ENTRY} and {REWARD_DIR}/")
    task_dir = task_dir.resolve()
    entry_path = task_dir / DATA_ENTRY
    if not entry_path.is_file():
        raise TaskError(
            f"{entry_path}: missing; every task dir needs {DATA_ENTRY} with keys "
            f"task_id, user_query, input_mount_dir and metadata")
    entry = _read_json(entry_path, DATA_ENTRY)
    if not isinstance(entry, dict):
        raise TaskError(f"{entry_path}: top level must be a JSON object with keys task_id, user_query, "
                        f"input_mount_dir and metadata, got {type(entry).__name__}")
    notes: list[str] = []

    task_id = _require_str(entry, "task_id", entry_path, hint="a short id such as the folder name")
    if not _TASK_ID_RE.match(task_id):
        raise TaskError(f"{entry_path}: task_id {task_id!r} may hold only letters, digits, '.', '_' "
                        f"and '-' (no '/' or spaces, it is used in suite/id specs); rename it")
    if task_id != task_dir.name:
        notes.append(f"task_id {task_id!r} differs from the folder name {task_dir.name!r}")
    instruction = _require_str(entry, "user_query", entry_path, hint="the instruction given to the agent")

    if "input_mount_dir" in entry:
        mount = entry["input_mount_dir"]
        if not isinstance(mount, str) or not mount.strip():
            raise TaskError(f"{entry_path}: 'input_mount_dir' must be a non-empty string such as "
                            f"{DEFAULT_MOUNT_DIR!r}, got {mount!r}")
        if not mount.startswith("/"):
            raise TaskError(f"{entry_path}: 'input_mount_dir' {mount!r} is relative; it must be the "
                            f"absolute workspace path inside the sandbox, e.g. {DEFAULT_MOUNT_DIR!r}")
        mount = mount.rstrip("/") or "/"
    else:
        mount = DEFAULT_MOUNT_DIR
        notes.append(f"no input_mount_dir; using {DEFAULT_MOUNT_DIR}")

    metadata = entry.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise TaskError(f"{entry_path}: 'metadata' must be an object such as "
                        f'{{"category": "files", "grading_type": "automated"}}, got {type(metadata).__name__}')
    if "metadata" not in entry:
        notes.append("no metadata; using {}")
    limits = _parse_limits(entry.get("limits"), entry_path)

    input_path = task_dir / INPUT_DIR
    if input_path.exists() and not input_path.is_dir():
        raise TaskError(f"{input_path}: must be a folder (its contents are copied into the workspace); "
                        f"move the file into a folder named {INPUT_DIR}/")
    input_dir = input_path if input_path.exists() else None

    reward_dir = task_dir / REWARD_DIR
    if not reward_dir.is_dir():
        raise TaskError(f"{reward_dir}: missing; add {REWARD_DIR}/{REWARD_SCRIPT}, a bash script that "
                        f"prints the score (a float in [0, 1]) as its last stdout line")
    if not (reward_dir / REWARD_SCRIPT).is_file():
        raise TaskError(f"{reward_dir / REWARD_SCRIPT}: missing; add a bash script that prints the score "
                        f"(a float in [0, 1]) as its last stdout line")

    protected = _parse_protected(entry.get("protected_inputs"), entry_path, input_dir)
    task = Task(id=task_id, instruction=instruction, mount_dir=mount, suite=suite, task_dir=task_dir,
                input_dir=input_dir, reward_dir=reward_dir, metadata=metadata, limits=limits, notes=notes,
                protected_inputs=protected)
    grader = _parse_grader(entry.get("grader"), entry_path)
    if grader is not None:  # the task names its grader
        task.grader = grader
    elif is_hybrid(task):  # a rubric: ClawGym-Bench hybrid grading (tasks.graders.HybridGrader)
        task.grader = "hybrid"
    return task


def _parse_grader(raw: Any, path: Path) -> str | None:
    """``grader``: the name of a registered grader (:data:`clawgym_env.plugins.graders`), checked and
    imported now, so a misspelt or broken one fails the task's load, not its grading."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        raise TaskError(f"{path}: 'grader' must be the name of a registered grader, e.g. \"reward.sh\", "
                        f"got {raw!r}")
    from clawgym_env.grading.grade import graders

    name = raw.strip()
    try:
        graders.load(name)
    except RegistrationError as exc:
        raise TaskError(f"{path}: 'grader' {name!r} cannot be used: {exc}; name a registered grader, or register "
                        f"yours (entry point group {graders.group!r}, or graders.register at runtime)") from exc
    return name


class ExpertScript(BaseModel):
    """A task's scripted expert (``expert.json``), never shown to the agent.

    Invariants: each of ``steps`` and ``wrong`` is a list of tool steps — ``{"tool": "write_file",
    "path", "content"}``, ``{"tool": "bash", "command"}`` or ``{"tool": "read_file", "path"}``, paths
    relative to the workspace (the agent's cwd) — followed by exactly one ``{"final": str}`` step,
    which is last. ``steps`` earn reward 1.0; ``wrong`` (possibly empty) is a plausible attempt that
    earns less.
    """

    steps: list[JSONObject]
    wrong: list[JSONObject] = Field(default_factory=list)

    @property
    def final(self) -> str:
        """The final answer text (the last step's ``final``)."""
        return str(self.steps[-1]["final"])

    @property
    def tool_steps(self) -> list[JSONObject]:
        """The tool steps, without the final answer."""
        return self.steps[:-1]


def _check_steps(steps: Any, where: str, path: Path) -> None:
    if not isinstance(steps, list) or not steps:
        raise TaskError(f"{path}: {where!r} must be a non-empty list of steps ending with {{\"final\": \"...\"}}")
    for i, step in enumerate(steps):
        loc = f"{where}[{i}]"
        if not isinstance(step, dict):
            raise TaskError(f"{path}: {loc} must be an object, got {type(step).__name__}")
        last = i == len(steps) - 1
        if "final" in step:
            if not last:
                raise TaskError(f"{path}: {loc} is a final step but not the last one; move it to the end")
            if not isinstance(step["final"], str):
                raise TaskError(f"{path}: {loc}.final must be a string (the final answer text)")
            continue
        if last:
            raise TaskError(f"{path}: the last step of {where!r} must be {{\"final\": \"<answer text>\"}}")
        tool = step.get("tool")
        if tool not in _EXPERT_TOOLS:
            raise TaskError(f"{path}: {loc}.tool is {tool!r}; use one of {sorted(_EXPERT_TOOLS)}")
        for key in _EXPERT_TOOLS[tool]:
            if not isinstance(step.get(key), str):
                raise TaskError(f"{path}: {loc} ({tool}) needs a string {key!r}")
        if "path" in step and (step["path"].startswith("/") or ".." in Path(step["path"]).parts):
            raise TaskError(f"{path}: {loc}.path {step['path']!r} must be relative to the workspace "
                            f"and stay inside it")


def load_expert(task_or_path: Task | str | Path) -> ExpertScript | None:
    """The validated ``expert.json`` of a task (or of a task dir / the file itself); None if absent."""
    if isinstance(task_or_path, Task):
        path = task_or_path.expert_path
        if path is None:
            return None
    else:
        path = Path(task_or_path)
        if path.is_dir():
            path = path / EXPERT_FILE
        if not path.is_file():
            return None
    raw = _read_json(path, EXPERT_FILE)
    if not isinstance(raw, dict) or "steps" not in raw:
        raise TaskError(f"{path}: must be an object {{\"steps\": [...], \"wrong\": [...]}}")
    unknown = sorted(set(raw) - {"steps", "wrong"})
    if unknown:
        raise TaskError(f"{path}: unknown key(s) {unknown}; allowed: steps, wrong")
    _check_steps(raw["steps"], "steps", path)
    if raw.get("wrong"):
        _check_steps(raw["wrong"], "wrong", path)
    return ExpertScript(steps=raw["steps"], wrong=raw.get("wrong") or [])
