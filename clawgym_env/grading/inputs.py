"""The files a task provides (``input_files/``) as the agent left them: what changed; the protected ones put back.

A task's input files are copied into the agent's workspace, where the agent may read, change or delete
them. Two things follow, both done on the host and never by following a link the agent made:

* :func:`modified_inputs` lists each input file the agent changed, deleted or replaced by something else
  (a link, a folder), by content hash: every episode record carries it (``inputs_modified``), so tampering
  with the inputs is visible even where the grader does not prevent it;
* :func:`restore_protected` puts the task's protected inputs (:attr:`~clawgym_env.task.Task.protected_inputs`:
  test files, fixtures a check depends on) back as the task shipped them, in the grader's copy of the
  workspace, before the verifier runs. A link or a file standing where a folder on the way should be is
  removed first, so the restored file always lands inside the workspace.

Invariants: the task folder is read through real paths that stay inside it (a link in ``input_files/``
that leads out of the task folder is never read); nothing outside ``workspace`` is written.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from clawgym_env.capture.records import InputChange
from clawgym_env.files.walk import iter_entries
from clawgym_env.task import Task

_CHUNK = 1 << 20


def input_files(input_dir: str | Path) -> list[str]:
    """Workspace-relative POSIX paths of the files under ``input_dir`` (links to files included), sorted."""
    root = Path(input_dir)
    out: list[str] = []
    for entry in iter_entries(root):  # no recursion, links never followed
        if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            out.append(os.path.relpath(entry.path, root).replace(os.sep, "/"))
    return sorted(out)


def matching(files: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """The ``files`` that equal, or match as an ``fnmatch`` pattern, one of ``patterns``."""
    pats = list(patterns)
    return [f for f in files if any(f == p or fnmatch.fnmatchcase(f, p) for p in pats)]


def _pristine(task: Task, rel: str) -> Path | None:
    """The real path of input file ``rel`` when it is a regular file inside the task folder."""
    if task.input_dir is None:
        return None
    root = os.path.realpath(task.task_dir if task.task_dir is not None else task.input_dir)
    real = os.path.realpath(Path(task.input_dir) / rel)
    if not real.startswith(root + os.sep) or not os.path.isfile(real):
        return None
    return Path(real)


def sha256_file(path: str | Path) -> str:
    """The hex sha256 of a regular file, read in chunks (the caller has checked it is one)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "special"


def _entry(workspace: Path, rel: str) -> os.stat_result | None:
    """``lstat`` of ``workspace/rel`` when every folder on the way is a real folder (never a link)."""
    cur = workspace
    parts = rel.split("/")
    for part in parts[:-1]:
        cur = cur / part
        try:
            if not stat.S_ISDIR(os.lstat(cur).st_mode):
                return None
        except OSError:
            return None
    try:
        return os.lstat(cur / parts[-1])
    except OSError:
        return None


def modified_inputs(task: Task, workspace: str | Path) -> list[InputChange]:
    """Every input file of ``task`` that differs in ``workspace``: ``modified`` (other content),
    ``deleted``, or ``replaced`` (by a link, a folder or a special file; ``now`` says which)."""
    if task.input_dir is None or not Path(task.input_dir).is_dir():
        return []
    ws = Path(workspace)
    changes: list[InputChange] = []
    for rel in input_files(task.input_dir):
        src = _pristine(task, rel)
        if src is None:
            continue
        st = _entry(ws, rel)
        if st is None:
            changes.append(InputChange(path=rel, change="deleted", sha256_task=sha256_file(src)))
        elif not stat.S_ISREG(st.st_mode):
            changes.append(InputChange(path=rel, change="replaced", now=_kind(st.st_mode),
                                       sha256_task=sha256_file(src)))
        else:
            before = sha256_file(src)
            if st.st_size != src.stat().st_size:
                changes.append(InputChange(path=rel, change="modified", sha256_task=before, size_now=st.st_size))
                continue
            now = sha256_file(ws / rel)
            if now != before:
                changes.append(InputChange(path=rel, change="modified", sha256_task=before, sha256_now=now,
                                           size_now=st.st_size))
    return changes


def _clear(path: Path) -> None:
    """Remove whatever is at ``path`` (a link is removed itself, never followed)."""
    from clawgym_env.files.workspace import remove_tree

    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        remove_tree(path)
    else:
        os.unlink(path)


def restore_protected(task: Task, workspace: str | Path) -> list[str]:
    """Put every protected input of ``task`` back in ``workspace`` as the task shipped it; returns the
    workspace-relative paths that had to be restored (those the agent changed, deleted or replaced)."""
    if not task.protected_inputs or task.input_dir is None:
        return []
    ws = Path(workspace)
    restored: list[str] = []
    for rel in matching(input_files(task.input_dir), task.protected_inputs):
        src = _pristine(task, rel)
        if src is None:
            continue
        st = _entry(ws, rel)
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == src.stat().st_size \
                and sha256_file(ws / rel) == sha256_file(src):
            continue
        cur = ws
        for part in rel.split("/")[:-1]:  # every folder on the way: a real folder, or made one
            cur = cur / part
            try:
                if not stat.S_ISDIR(os.lstat(cur).st_mode):
                    _clear(cur)
                    cur.mkdir(mode=0o755)
            except FileNotFoundError:
                cur.mkdir(mode=0o755)
        dest = ws / rel
        if os.path.lexists(dest):
            _clear(dest)
        shutil.copyfile(src, dest, follow_symlinks=False)
        os.chmod(dest, 0o644)
        restored.append(rel)
    return restored
