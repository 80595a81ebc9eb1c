"""The grader's own room and deadline: what grading may take, whatever the agent left in its workspace.

The agent owns its resources: a workspace filled to its disk quota, or to its inode quota, is the
agent's outcome and is graded like any other, never an infrastructure failure. So the grading
sandbox has room for the largest workspace the agent's sandbox can leave plus what grading adds to
it (the task's ``reward/`` and the input files it puts back) and a reserve, and the host-side copy
that grading starts with is bounded in bytes, entries and time.

Invariants:
  * :func:`grader_room` gives the grading sandbox ``disk_mb`` = the agent's disk quota (the task's, else
    the sandbox default) + :data:`GRADER_RESERVE_MB` + the size of the task's ``reward/`` and
    ``input_files/`` (protected inputs are put back before grading), and ``inodes`` = the agent's inode
    quota + :data:`GRADER_RESERVE_INODES` + the entries of those two folders, each at least the sandbox
    default; an unlimited (``None``) agent quota stays unlimited; memory and CPU are the sandbox
    defaults (the agent's caps do not bind the grader);
  * :func:`copy_limits` bounds the host-side copy of the workspace by the agent's quotas (file data
    and entries, so the grader's room holds the copy and what grading adds with the reserve to spare)
    and by :data:`GRADING_COPY_S` seconds: a workspace the agent's sandbox enforced its quotas on
    always fits (a place holds its root among its entries), anything else stops the copy with
    :class:`~clawgym_env.errors.CopyLimitError` (the agent's 0, with :func:`copy_failure` as the
    reason) after at most that long, a million files included;
  * grading then takes at most that copy, the copy into the grading sandbox (the same entries and
    bytes), and the task's ``reward_timeout_s`` per verifier command.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from pathlib import Path
from typing import Any, TypedDict

from clawgym_env.errors import CopyLimitError
from clawgym_env.files.walk import iter_entries
from clawgym_env.sandbox.base import SandboxLimits

GRADER_RESERVE_MB = 64
"""Disk the grading sandbox has on top of the agent's quota (and of what grading adds): the verifier's own files."""
GRADER_RESERVE_INODES = 4096
"""Entries the grading sandbox holds on top of the agent's quota (and of what grading adds)."""
PAGE = 4096
GRADING_COPY_S = 120.0
"""Deadline of the host-side copy of the final workspace for grading, in seconds."""


def agent_limits(task: Any) -> SandboxLimits:
    """The limits of ``task``'s agent sandbox: the defaults with the task's overrides."""
    limits = getattr(task, "limits", None)
    overrides = limits.sandbox_overrides() if limits is not None and hasattr(limits, "sandbox_overrides") else {}
    return SandboxLimits(**overrides)


def _added_by_grading(task: Any) -> tuple[int, int]:
    """(bytes, entries) grading may add to the agent's workspace: the task's ``reward/`` and its input
    files (protected ones are put back); a link is counted as the file it is copied as, every file in
    whole pages (as a tmpfs stores it)."""
    size = entries = 0
    for folder in (getattr(task, "reward_dir", None), getattr(task, "input_dir", None)):
        if folder is not None and Path(folder).is_dir():
            more, count = _tree_size(Path(folder))
            size, entries = size + more, entries + count
    return size, entries


def _tree_size(folder: Path) -> tuple[int, int]:
    size = entries = 0
    for entry in iter_entries(folder):
        entries += 1
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):  # a link inside the task folder is copied as its file
            try:
                st = os.stat(entry.path)
            except OSError:
                continue
        if stat.S_ISREG(st.st_mode):
            size += -(-st.st_size // PAGE) * PAGE
    return size, entries


def grader_room(task: Any) -> SandboxLimits:
    """The grading sandbox's limits for ``task`` (see the module invariants)."""
    agent = agent_limits(task)
    size, entries = _added_by_grading(task)
    base = SandboxLimits()
    disk = _at_least(base.disk_mb, agent.disk_mb, GRADER_RESERVE_MB + -(-size // (1 << 20)))
    inodes = _at_least(base.inodes, agent.inodes, GRADER_RESERVE_INODES + entries)
    return dataclasses.replace(base, disk_mb=disk, inodes=inodes)


def _at_least(default: int | None, agent: int | None, extra: int) -> int | None:
    """``agent + extra``, never below ``default``; None (no limit) when either is None."""
    if default is None or agent is None:
        return None
    return max(default, agent + extra)


class CopyLimits(TypedDict):
    """Keyword arguments of :func:`~clawgym_env.files.workspace.copy_tree` bounding one copy (:func:`copy_limits`)."""

    max_bytes: int | None
    max_entries: int | None
    deadline: float


def copy_limits(task: Any, *, now: float | None = None) -> CopyLimits:
    """Keyword arguments of :func:`~clawgym_env.files.workspace.copy_tree` for the host-side copy of
    ``task``'s final workspace: at most the agent's quotas (so what grading adds still fits beside it
    in the grader's room) and :data:`GRADING_COPY_S` from ``now`` (default: this instant)."""
    agent = agent_limits(task)
    start = time.monotonic() if now is None else now
    return {"max_bytes": None if agent.disk_mb is None else agent.disk_mb << 20,
            "max_entries": agent.inodes, "deadline": start + GRADING_COPY_S}


def copy_failure(exc: BaseException) -> str:
    """The reason an agent's workspace scored 0 because it could not be copied for grading."""
    if isinstance(exc, CopyLimitError):
        what = {"bytes": "more file data", "entries": "more files, folders and links",
                "time": "more than can be copied in time"}.get(getattr(exc, "limit", ""), "more")
        return f"the final workspace holds {what} than grading takes ({exc}); its score is 0"
    return f"the final workspace could not be copied for grading: {exc}"
