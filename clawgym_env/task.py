"""Tasks and suites.

The engine's task vocabulary. A :class:`Task` is one thing to do in one workspace, graded by its
grader. Task sources (the ``tasks`` package and third-party suites) build them; the engine only reads
them. The ClawGym task-dir format (loaded by the ``tasks`` package):

    task_dir/
      data_entry.json   {"task_id", "user_query", "input_mount_dir", "metadata"}
      input_files/      copied verbatim into the workspace (optional)
      reward/           reward.sh (+ check.py …); last stdout line of reward.sh is a float in [0, 1]
      expert.json       (optional, this project's extension) the scripted expert's steps

Invariants: ``mount_dir`` is absolute (the workspace's path inside the sandbox, for the agent and
the verifier alike); ``reward_dir`` holds ``reward.sh`` when set; the agent never sees ``reward/``
or ``expert.json``; ``grader`` names a grader registered in :data:`clawgym_env.plugins.graders`
(``reward.sh`` by default: the hermetic ``reward/reward.sh`` script).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

from pydantic import BaseModel, Field

from clawgym_env.jsontypes import JSONObject


class SandboxOverrides(TypedDict, total=False):
    """The :class:`~clawgym_env.sandbox.SandboxLimits` fields a task sets (:meth:`TaskLimits.sandbox_overrides`)."""

    disk_mb: int
    memory_mb: int
    inodes: int
    cpus: float


class TaskLimits(BaseModel):
    """Per-task limits; a task dir may override any of them in ``data_entry.json["limits"]``.

    Invariant: every limit is strictly positive; ``disk_mb``, ``memory_mb``, ``inodes`` and ``cpus`` may
    also be ``None`` (the sandbox's default, never "unlimited").
    """

    timeout_s: float = Field(default=600.0, gt=0)
    """Wall-clock limit of the agent's episode."""
    max_turns: int = Field(default=30, gt=0)
    """Turn limit for harnesses that take one (the reference harness ``mini``)."""
    reward_timeout_s: float = Field(default=120.0, gt=0)
    """Wall-clock limit of the verifier (``reward/reward.sh``)."""
    disk_mb: int | None = Field(default=None, gt=0)
    """Disk quota of the agent's sandbox, in MiB, for each writable place (workspace, HOME, ``/tmp``,
    ``/dev/shm``); a write past it fails inside with ENOSPC and the episode records ``disk:<place>`` in
    ``limits_hit``. ``None``: the sandbox's default (:class:`~clawgym_env.sandbox.SandboxLimits`, 2 GiB)."""
    memory_mb: int | None = Field(default=None, gt=0)
    """Memory limit of the agent's sandbox, in MiB (on bubblewrap as root the tmpfs places count
    towards it). ``None``: the sandbox's default (:class:`~clawgym_env.sandbox.SandboxLimits`, 4 GiB)."""

    inodes: int | None = Field(default=None, gt=0)
    """Entries (files, folders, links) each writable place of the agent's sandbox may hold; creating one
    past it fails inside with ENOSPC and the episode records ``inodes:<place>`` in ``limits_hit``.
    ``None``: the sandbox's default (:class:`~clawgym_env.sandbox.SandboxLimits`, 262,144)."""
    cpus: float | None = Field(default=None, gt=0)
    """CPU share of the agent's sandbox in cores; a sandbox held at it records ``cpu`` in ``limits_hit``.
    ``None``: the sandbox's default (:class:`~clawgym_env.sandbox.SandboxLimits`, 2 cores)."""

    def sandbox_overrides(self) -> SandboxOverrides:
        """The :class:`~clawgym_env.sandbox.SandboxLimits` fields this task sets (those not ``None``),
        to apply over the sandbox's defaults; every other sandbox limit keeps its default."""
        out: SandboxOverrides = {}
        if self.disk_mb is not None:
            out["disk_mb"] = self.disk_mb
        if self.memory_mb is not None:
            out["memory_mb"] = self.memory_mb
        if self.inodes is not None:
            out["inodes"] = self.inodes
        if self.cpus is not None:
            out["cpus"] = self.cpus
        return out


class Task(BaseModel):
    """One task: an instruction, the workspace it runs in, its files, limits and grader."""

    id: str
    instruction: str
    mount_dir: str = "/root/.openclaw/workspace"
    suite: str | None = None
    task_dir: Path | None = None
    input_dir: Path | None = None
    reward_dir: Path | None = None
    metadata: JSONObject = Field(default_factory=dict)
    limits: TaskLimits = Field(default_factory=TaskLimits)
    notes: list[str] = Field(default_factory=list)
    """Non-fatal observations made while loading (e.g. the task_id differs from the folder name)."""
    protected_inputs: list[str] = Field(default_factory=list)
    """Task-provided files the grader restores from the pristine task before grading (workspace-relative
    paths or ``fnmatch`` patterns such as ``tests/*.py``, matched against the files of ``input_dir``): the
    test files and fixtures a check depends on, which the agent may read but must not change. A match
    the agent changed, deleted or replaced by a link or a folder is put back as the task shipped it."""
    grader: str = "reward.sh"
    """The name of the grader the engine applies inside the episode (:mod:`clawgym_env.grading.grade`), set
    by the task's source from its kind (``reward.sh``, ``hybrid``, ``jobbench``, or a third party's)."""

    @property
    def full_id(self) -> str:
        """``suite/id`` (just ``id`` for a task outside any suite)."""
        return f"{self.suite}/{self.id}" if self.suite else self.id

    @property
    def expert_path(self) -> Path | None:
        """The scripted expert's steps for this task, if the task ships them."""
        if self.task_dir is None:
            return None
        p = Path(self.task_dir) / "expert.json"
        return p if p.exists() else None

    def private_folders(self) -> list[Path]:
        """The host folders of this task that no agent may see: its folder (expert steps, the entry with its
        answer), its input and reward folders wherever they lie, and the folder holding its folder (the
        suite: every other task's answers). The episode's sandbox, the grader's and every sandbox the grader
        runs the agent's code in hide them (:func:`~clawgym_env.sandbox.base.hidden_paths_with`), so a suite
        kept under a folder sandboxes show read-only (``/opt``, a virtual environment) stays unread."""
        out = [Path(p) for p in (self.task_dir, self.input_dir, self.reward_dir) if p is not None]
        if self.task_dir is not None:
            out.append(Path(self.task_dir).resolve().parent)
        return out

    @property
    def grading_type(self) -> str:
        """``metadata["grading_type"]``, ``"automated"`` when unset."""
        return str(self.metadata.get("grading_type") or "automated")



class TaskLoadIssue(BaseModel):
    """A task dir in a suite that could not be loaded (the suite still loads the others)."""

    path: str
    error: str


class Suite(BaseModel):
    """A named list of tasks, with the task dirs that could not be loaded listed in ``issues``."""

    name: str
    root: Path | None = None
    tasks: list[Task] = Field(default_factory=list)
    issues: list[TaskLoadIssue] = Field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:  # type: ignore[override]  # tasks, not pydantic's (field, value) pairs
        return iter(self.tasks)

    def get(self, task_id: str) -> Task:
        """The task with this id; :class:`TaskError` with close matches (or how to list them) otherwise."""
        from clawgym_env.errors import TaskError

        for t in self.tasks:
            if t.id == task_id:
                return t
        for t in self.tasks:  # a task dir whose folder name differs from its task_id
            if t.task_dir is not None and Path(t.task_dir).name == task_id:
                return t
        import difflib

        for issue in self.issues:
            if Path(issue.path).name == task_id:
                raise TaskError(f"task {task_id!r} in suite {self.name!r} could not be loaded: {issue.error}")
        close = difflib.get_close_matches(task_id, [t.id for t in self.tasks], n=3)
        hint = (f"; did you mean {', '.join(close)}?" if close
                else f"; `clawgym tasks list --suite {self.name}` lists them")
        raise TaskError(f"no task {task_id!r} in suite {self.name!r}{hint}")
