"""``read_file``/``write_file`` of the bwrap backend, done on the host through the sandbox's mount table.

Invariants:
  * a path is resolved as the sandbox sees it (symlinks followed *inside*: a link's target is looked
    up in the mount table again, never on the host), so only host files under folders mounted in the
    sandbox are ever touched, and writes only under writable mounts;
  * a mount point is never treated as a symlink (inside, it is the mounted folder);
  * ``read_file`` only returns what the sandbox's host uid may read itself (this process may be root);
  * what ``write_file`` creates (the file and any missing parent folder) belongs to the sandbox's
    host ids, so the sandboxed user can change it afterwards; the file is opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import collections
import os
import posixpath
from pathlib import Path, PurePosixPath

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox.base import SandboxSpec

Mount = tuple[str, str, str]  # (bwrap option, host source, target inside)


class MountTableFiles:
    """Mixin: needs ``spec``, ``root`` (None when closed), ``_mounts`` and ``host_ids``."""

    spec: SandboxSpec
    root: Path | None
    host_ids: tuple[int, int]
    _mounts: list[Mount]
    _tbl: list[tuple[str, Path, bool]]

    def _table(self) -> list[tuple[str, Path, bool]]:
        if self.root is None:
            raise SandboxError("the sandbox is not open; use it as `with BwrapSandbox(spec) as sb:`")
        if not self._tbl:  # bwrap follows a symlinked bind source on the host, so the table does too
            self._tbl = [(posixpath.normpath(t), Path(os.path.realpath(src)), kind == "--bind")
                         for kind, src, t in self._mounts if kind in ("--bind", "--ro-bind")]
        return self._tbl

    def _map(self, inside: str) -> tuple[Path, bool, bool] | None:
        """(host path behind ``inside``, writable, is a mount point) for an already symlink-free path."""
        best = None
        for target, host, rw in self._table():
            if inside == target or inside.startswith(target.rstrip("/") + "/"):
                if best is None or len(target) >= len(best[0]):
                    best = (target, host, rw)
        if best is None:
            return None
        rel = inside[len(best[0]):].lstrip("/")
        return (best[1] / rel if rel else best[1]), best[2], not rel

    def _resolve(self, path: str) -> tuple[Path, bool]:
        """Resolve ``path`` as the sandbox would (symlinks followed inside) to (host path, writable)."""
        if not posixpath.isabs(path):
            raise SandboxError(f"sandbox path {path!r} must be absolute")
        parts = collections.deque(PurePosixPath(path).parts[1:])
        cur, hops = "/", 0
        while parts:
            name = parts.popleft()
            if name in ("", "."):
                continue
            if name == "..":
                cur = posixpath.dirname(cur)
                continue
            nxt = posixpath.join(cur, name)
            mapped = self._map(nxt)
            if mapped is not None and not mapped[2] and mapped[0].is_symlink():
                hops += 1
                if hops > 40:
                    raise SandboxError(f"too many symlinks resolving {path!r} inside the sandbox")
                target = os.readlink(mapped[0])
                parts.extendleft(reversed(PurePosixPath(target).parts[1 if target.startswith("/") else 0:]))
                if target.startswith("/"):
                    cur = "/"
                continue
            cur = nxt
        mapped = self._map(cur)
        if mapped is None:
            raise SandboxError(f"{path!r} is not inside a folder the sandbox shares with the host "
                               f"(workspace {self.spec.workspace_target}, HOME {self.spec.home}, /tmp, or a bind)")
        return mapped[0], mapped[1]

    def read_file(self, path: str) -> bytes:
        """The bytes of ``path`` (a sandbox path), read host-side with the sandbox user's permissions."""
        host, _ = self._resolve(path)
        try:
            with open(host, "rb") as f:
                if not _may_read(os.fstat(f.fileno()), self.host_ids):
                    raise SandboxError(f"cannot read {path!r} in the sandbox: the sandbox user may not read it")
                return f.read()
        except OSError as e:
            raise SandboxError(f"cannot read {path!r} in the sandbox: {e.strerror}") from e

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` (a sandbox path) host-side, owned by the sandbox user; read-only places refuse."""
        host, writable = self._resolve(path)
        if not writable:
            raise SandboxError(f"{path!r} is read-only in the sandbox; write under {self.spec.workspace_target}, "
                               f"{self.spec.home} or /tmp")
        if isinstance(data, str):
            data = data.encode()
        uid, gid = self.host_ids
        chown = (uid, gid) != (os.getuid(), os.getgid())
        try:
            missing = []
            p = host.parent
            while not p.exists():
                missing.append(p)
                p = p.parent
            for d in reversed(missing):
                d.mkdir()
                if chown:
                    os.chown(d, uid, gid, follow_symlinks=False)
            fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode & 0o777)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if chown:
                    os.fchown(f.fileno(), uid, gid)
                os.fchmod(f.fileno(), mode & 0o777)
        except OSError as e:
            raise SandboxError(f"cannot write {path!r} in the sandbox: {e.strerror}") from e


def _may_read(st: os.stat_result, ids: tuple[int, int]) -> bool:
    """Whether a process running as ``ids`` (no other groups, no capabilities) may read the file."""
    if (st.st_uid, st.st_gid) == (os.getuid(), os.getgid()) == ids:
        return True  # the sandbox is this host user (not root): same rights as here
    if st.st_uid == ids[0]:
        return bool(st.st_mode & 0o400)
    if st.st_gid == ids[1]:
        return bool(st.st_mode & 0o040)
    return bool(st.st_mode & 0o004)
