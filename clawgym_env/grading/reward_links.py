"""Links the agent left that would lead the verifier into its own folder: found and removed before grading.

At grading time the task's ``reward/`` sits inside the workspace (``<mount>/reward``, as the ClawGym task
format wants: ``reward.sh`` calls ``<mount>/reward/check.py``). A link the agent made, such as
``answer.txt -> reward/expected.txt``, would make the verifier read its own answer key as the agent's
answer. :func:`drop_links_into_reward` resolves every link of the grader's copy of the workspace the way
the sandbox would (absolute targets under the mount point map to the copy; ``..`` is applied after each
link is followed; at most :data:`MAX_HOPS` links in a chain) and removes each link that

* ends in ``<mount>/reward`` or below it,
* goes through ``/proc`` or ``/dev`` (``/proc/self/cwd/...``, ``/dev/fd/N``: paths whose meaning depends on
  the process that opens them, so they cannot be resolved here), or
* cannot be resolved within :data:`MAX_HOPS` links (a loop).

Other links stay: links inside the workspace, and links to system files the sandbox shows read-only to every
agent alike. Nothing is followed on the host: the walk reads link targets with ``readlink`` only.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path

from clawgym_env.files.walk import iter_entries

MAX_HOPS = 40
"""Longest chain of links resolved before a link counts as a loop (the kernel's own limit)."""
_PROCESS_RELATIVE = ("/proc", "/dev")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class _Resolver:
    """Resolves sandbox paths against the host copy of the workspace (``host``, seen at ``mount``)."""

    def __init__(self, host: Path, mount: str, protected: str) -> None:
        self.host, self.mount, self.protected = host, posixpath.normpath(mount), posixpath.normpath(protected)

    def _host_path(self, sandbox_path: str) -> Path:
        return self.host / posixpath.relpath(sandbox_path, self.mount)

    def verdict(self, link: str) -> str | None:
        """Why the link at sandbox path ``link`` must go, or ``None`` when it may stay."""
        hops = 0
        pending = [c for c in link.split("/") if c]  # components still to walk, from the root
        cur = "/"
        while pending:
            part = pending.pop(0)
            if part == ".":
                continue
            nxt = posixpath.dirname(cur) if part == ".." else posixpath.join(cur, part)
            if _under(nxt, self.protected):
                return f"it leads into {self.protected}"
            if any(_under(nxt, p) for p in _PROCESS_RELATIVE):
                return f"it goes through {nxt} (a per-process path)"
            if not _under(nxt, self.mount) or nxt == self.mount:
                cur = nxt  # outside the workspace: the sandbox's own read-only system folders
                continue
            try:
                st = os.lstat(self._host_path(nxt))
            except OSError:
                cur = nxt  # a dangling name: nothing to read through it
                continue
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_HOPS:
                    return f"more than {MAX_HOPS} links in a chain"
                target = os.readlink(self._host_path(nxt))
                pending = [c for c in target.split("/") if c] + pending
                cur = "/" if target.startswith("/") else cur
                continue
            cur = nxt
        return None


def drop_links_into_reward(workspace: str | Path, mount: str, protected: str | None = None) -> list[str]:
    """Remove from the host folder ``workspace`` (seen inside as ``mount``) every link that leads into
    ``protected`` (default ``<mount>/reward``) or through a per-process path; ``protected`` itself is
    skipped (the grader puts the task's own folder there). Returns ``"<path>: <why>"`` for each removed link."""
    host = Path(workspace)
    protected = protected or posixpath.join(mount, "reward")
    resolver = _Resolver(host, mount, protected)
    removed: list[str] = []
    skip = str(host / posixpath.relpath(protected, mount))
    doomed: list[tuple[str, str, str]] = []
    for entry in iter_entries(host):  # no recursion: an agent's 1,200-deep tree is fine
        if entry.path == skip or entry.path.startswith(skip + os.sep) or not entry.is_symlink():
            continue
        rel = os.path.relpath(entry.path, host).replace(os.sep, "/")
        why = resolver.verdict(posixpath.join(mount, rel))
        if why is not None:
            doomed.append((entry.path, rel, why))
    for path, rel, why in doomed:  # judged on the tree as the agent left it, then removed
        os.unlink(path)
        removed.append(f"{rel}: {why}")
    return removed
