"""``read_file``/``write_file`` of the Docker backend: from the host side of a private place, else in the container.

A mixin of :class:`~clawgym_env.sandbox.docker.sandbox.DockerSandbox`. Invariants:
  * a path in HOME or the workspace (and not in a bind below them) is opened on the host side of its
    :class:`~clawgym_env.sandbox.docker.host.Place`, walked from the place's root with ``O_NOFOLLOW``
    at every step; a written file and new folders belong to the sandbox user;
  * any other path, or one with a link or a special file on the way, is read or written by a command
    running as the sandbox user inside the container (at most ``file_timeout_s``), so both see exactly
    what the sandbox sees and a planted link is never followed on the host;
  * every failure raises :class:`~clawgym_env.errors.SandboxError` naming the path.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from typing import Any

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox.docker.host import Place, _under, open_in_place


class DockerFiles:
    """Mixin: needs ``_run`` (a command in the container), ``_container`` (None when closed), ``_targets``
    (mount targets inside, deepest first, with their Place), ``uid``, ``gid`` and ``file_timeout_s``."""

    _container: Any
    _targets: list[tuple[str, Place | None]]
    uid: int
    gid: int
    file_timeout_s: float

    def _run(self, argv: list[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
             timeout: float | None = None, stdin: bytes | None = None,
             keep: int | None = None) -> tuple[int, bytes, bytes, bool, float]:
        """(exit code, stdout, stderr, timed out, wall s) of ``argv`` in the container (the sandbox's own)."""
        raise NotImplementedError

    def read_file(self, path: str) -> bytes:
        """Read a file inside the sandbox, from the host side where the path lies in a private place,
        else through the container."""
        fd = self._host_fd(path, write=False)
        if fd is not None:
            with os.fdopen(fd, "rb") as f:
                return f.read()
        code, out, err, late, _ = self._run(["cat", "--", self._norm(path)], cwd="/", timeout=self.file_timeout_s)
        if late:  # a fifo planted in place of a file must not hang the caller
            raise SandboxError(f"cannot read {path!r} in the sandbox: no end after {self.file_timeout_s}s (a fifo?)")
        if code != 0:
            raise SandboxError(f"cannot read {path!r} in the sandbox: {err.decode(errors='replace').strip()}")
        return out

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a file inside the sandbox (parents created), from the host side where the path lies in a
        private place, else through the container."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        fd = self._host_fd(path, write=True, mode=mode)
        if fd is not None:
            with os.fdopen(fd, "wb") as f:
                f.write(raw)
            return
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" "$1"'
        code, _, err, late, _ = self._run(["sh", "-c", script, "sh", self._norm(path), oct(mode & 0o777)[2:]],
                                          stdin=raw, cwd="/", timeout=self.file_timeout_s)
        if code != 0 or late:
            hint = "; write under the workspace, HOME or /tmp" if b"Read-only" in err else ""
            raise SandboxError(f"cannot write {path!r} in the sandbox: {err.decode(errors='replace').strip()}{hint}")

    def _host_fd(self, path: str, *, write: bool, mode: int = 0o644) -> int | None:
        """A host fd for ``path`` when it lies in HOME or the workspace (and not in a bind below them)
        and no step of it is a link; None: go through the container."""
        inside = self._norm(path)
        if self._container is None:
            raise SandboxError("the sandbox is not open; use it as `with DockerSandbox(spec) as sb:`")
        for target, place in self._targets:
            if _under(inside, target):
                if place is None or inside == target:
                    return None
                try:
                    return open_in_place(place, posixpath.relpath(inside, target), write=write, uid=self.uid,
                                         gid=self.gid, mode=mode)
                except OSError as exc:
                    verb = "write" if write else "read"
                    raise SandboxError(f"cannot {verb} {path!r} in the sandbox: {exc.strerror}") from exc
        return None

    @staticmethod
    def _norm(path: str) -> str:
        if not posixpath.isabs(path):
            raise SandboxError(f"sandbox path {path!r} must be absolute")
        return posixpath.normpath(path)
