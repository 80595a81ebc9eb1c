"""Walking untrusted folder trees on the host without following links, without recursion and
without reading files whole: the primitives under :mod:`clawgym_env.files.workspace`, plus
:func:`snapshot` (a fingerprint of every path) and :func:`remove_tree` (an iterative delete).

Invariants: every open is ``openat`` relative to an already opened folder with ``O_NOFOLLOW``; a
folder fd is kept for at most :data:`HELD_LEVELS` levels at a time (deeper ones are reopened on
demand), so 1,200 nested folders or paths far beyond ``PATH_MAX`` are fine; file data is streamed
in :data:`CHUNK`-byte pieces over data segments only (``SEEK_DATA``/``SEEK_HOLE``); fifos, sockets
and devices are never opened; names are bytes, shown with :func:`display_path` (valid UTF-8).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20
HELD_LEVELS = 64
"""Directory levels whose fds stay open during a walk; deeper levels are reopened on demand."""

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
PERM = 0o777  # what survives of a mode: no setuid, setgid or sticky bit


def display_path(rel: bytes) -> str:
    """A relative path (bytes) as valid UTF-8 text: undecodable bytes become ``\\xNN``."""
    return rel.decode("utf-8", "backslashreplace")


def names(dir_fd: int) -> list[bytes]:
    """The entry names of an open folder as bytes, in reverse order (popped from the end: sorted)."""
    return sorted((os.fsencode(n) for n in os.listdir(dir_fd)), reverse=True)


def kind(mode: int) -> str:
    """The kind of a file from its ``st_mode``: file, dir, symlink, fifo, socket, device or other."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


class DirStack:
    """One side of a walk: a stack of levels ``[name, fd or None]``, the root first.

    The first :data:`HELD_LEVELS` levels keep their fd; a deeper level's fd is closed when a child
    level is pushed and reopened (``openat`` + ``O_NOFOLLOW`` from the nearest open ancestor) only
    if it is needed again, keeping the deepest :data:`HELD_LEVELS` reopened fds so that climbing a
    deep chain costs O(depth²/HELD_LEVELS) opens. At most ~2×HELD_LEVELS+1 fds are open at once.
    The root fd is owned by the caller.
    """

    def __init__(self, root_fd: int) -> None:
        self.levels: list[list] = [[b"", root_fd]]

    def fd(self) -> int:
        """An fd of the deepest level, reopened from the nearest open ancestor if it was closed."""
        levels = self.levels
        if levels[-1][1] is None:
            i = len(levels) - 1
            while levels[i][1] is None:
                i -= 1
            fd, last = levels[i][1], len(levels) - 1
            for j in range(i + 1, last + 1):
                nxt = os.open(levels[j][0], DIR_FLAGS, dir_fd=fd)
                if j - 1 > i and levels[j - 1][1] is None:
                    os.close(fd)
                if j > last - HELD_LEVELS:  # keep the deepest few: popping up to them is then free
                    levels[j][1] = nxt
                fd = nxt
        return levels[-1][1]

    def push(self, name: bytes, fd: int) -> None:
        """Enter the child folder ``name`` (opened by the caller as ``fd``; the stack owns it now)."""
        if len(self.levels) > HELD_LEVELS and self.levels[-1][1] is not None:
            os.close(self.levels[-1][1])
            self.levels[-1][1] = None
        self.levels.append([name, fd])

    def pop(self) -> None:
        """Leave the deepest level, closing its fd if open."""
        _, fd = self.levels.pop()
        if fd is not None:
            os.close(fd)

    def rel(self, name: bytes = b"") -> bytes:
        """The deepest level's path relative to the root (plus ``name`` when given), as bytes."""
        parts = [lv[0] for lv in self.levels[1:]]
        if name:
            parts.append(name)
        return b"/".join(parts)

    def close(self) -> None:
        """Pop every level but the root (whose fd is the caller's)."""
        while len(self.levels) > 1:
            self.pop()


def data_segments(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of the data segments of an open regular file (holes skipped)."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole left
                return
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no hole support: all data
                yield pos, size - pos
                return
            raise
        end = min(end, size)
        if end > start:
            yield start, end - start
        pos = end


def stream_data(src_fd: int, size: int, sink: Callable[[int, bytes], object]) -> int:
    """Feed every data segment of ``src_fd`` to ``sink(offset, bytes)`` in chunks; returns bytes read."""
    total = 0
    for off, length in data_segments(src_fd, size):
        done = 0
        while done < length:
            buf = os.pread(src_fd, min(CHUNK, length - done), off + done)
            if not buf:  # the file shrank under us
                return total
            sink(off + done, buf)
            done += len(buf)
            total += len(buf)
    return total


def open_regular(dir_fd: int, name: bytes, st: os.stat_result) -> int | None:
    """Open ``name`` for reading iff it is still the regular file ``st`` describes (no link, no fifo)."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    now = os.fstat(fd)
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        return None
    return fd


# -- snapshots ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One path of a :func:`snapshot`: its kind, its size (files) and a fingerprint of its content
    (files: sha256 over the data segments and their offsets; links: the target)."""

    kind: str
    size: int | None = None
    digest: str | None = None


def _digest_file(fd: int, size: int) -> str:
    h = hashlib.sha256()

    def sink(off: int, buf: bytes) -> None:
        h.update(off.to_bytes(8, "little"))
        h.update(buf)

    stream_data(fd, size, sink)
    return h.hexdigest()


def snapshot(root: str | Path) -> dict[str, Entry]:
    """Every path under ``root`` (relative, shown with :func:`display_path`) → :class:`Entry`.

    Files are fingerprinted by streaming their data segments (no file is read whole, holes are not
    read); links are not followed; special files are listed, never opened; folders are not listed
    (only what is in them); a file hard-linked many times is read once. A missing ``root`` snapshots
    as empty.
    """
    out: dict[str, Entry] = {}
    seen: dict[tuple[int, int], str] = {}  # (device, inode) of a multiply linked file -> its digest
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return out
    tree = DirStack(root_fd)
    frames: list[list[bytes]] = [names(root_fd)]
    try:
        while frames:
            if not frames[-1]:
                frames.pop()
                if frames:
                    tree.pop()
                continue
            name = frames[-1].pop()
            dfd = tree.fd()
            rel = tree.rel(name)
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            what = kind(st.st_mode)
            if what == "dir":
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=dfd)
                except OSError:
                    out[display_path(rel)] = Entry("dir", digest="unreadable")
                    continue
                tree.push(name, child)
                frames.append(names(child))
            elif what == "file":
                if st.st_nlink > 1 and (st.st_dev, st.st_ino) in seen:
                    out[display_path(rel)] = Entry("file", st.st_size, seen[(st.st_dev, st.st_ino)])
                    continue
                fd = open_regular(dfd, name, st)
                digest = "unreadable"
                if fd is not None:
                    try:
                        digest = _digest_file(fd, st.st_size)
                    finally:
                        os.close(fd)
                out[display_path(rel)] = Entry("file", st.st_size, digest)
                if st.st_nlink > 1 and fd is not None:
                    seen[(st.st_dev, st.st_ino)] = digest
            elif what == "symlink":
                target = os.readlink(name, dir_fd=dfd)
                out[display_path(rel)] = Entry("symlink", len(target), hashlib.sha256(target).hexdigest())
            else:
                out[display_path(rel)] = Entry(what)
    finally:
        tree.close()
        os.close(root_fd)
    return out


def remove_tree(path: str | Path, *, one_file_system: bool = True) -> None:
    """Delete ``path`` and everything under it without following links, without recursion (deep
    trees are fine) and whatever the modes inside (folders are made writable first). A missing
    ``path`` is fine; a ``path`` that is itself a link or a file is unlinked. With
    ``one_file_system`` (the default) a folder on another file system (a mount point left under
    ``path``, e.g. a bind of a host folder) is never entered: :class:`OSError` (``EXDEV``) names it."""
    path = os.fspath(path)
    try:
        root_fd = os.open(path, DIR_FLAGS)
    except FileNotFoundError:
        return
    except (NotADirectoryError, OSError) as exc:
        if isinstance(exc, NotADirectoryError) or exc.errno == errno.ELOOP:
            os.unlink(path)
            return
        raise
    tree = DirStack(root_fd)
    frames: list[list[bytes]] = [names(root_fd)]
    dev = os.fstat(root_fd).st_dev
    try:
        os.fchmod(root_fd, 0o700)
        while frames:
            if not frames[-1]:
                frames.pop()
                if frames:
                    name = tree.levels[-1][0]
                    tree.pop()
                    os.rmdir(name, dir_fd=tree.fd())
                continue
            name = frames[-1].pop()
            dfd = tree.fd()
            try:
                os.unlink(name, dir_fd=dfd)
                continue
            except IsADirectoryError:
                pass
            except FileNotFoundError:
                continue
            child = os.open(name, DIR_FLAGS, dir_fd=dfd)
            if one_file_system and os.fstat(child).st_dev != dev:
                os.close(child)
                raise OSError(errno.EXDEV, "refusing to delete across a mount point; unmount it first",
                              os.path.join(path, display_path(tree.rel(name))))
            os.fchmod(child, 0o700)
            tree.push(name, child)
            frames.append(names(child))
    finally:
        tree.close()
        os.close(root_fd)
    os.rmdir(path)


def iter_entries(top: str | Path) -> Iterator[os.DirEntry[str]]:
    """Every entry under ``top`` as an :class:`os.DirEntry`, depth first, without recursion and
    without following links (an agent's 1,200-deep tree is fine); unreadable folders are skipped."""
    stack = [os.fspath(top)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            yield e
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
            except OSError:
                continue


def chown_tree(top: str | Path, uid: int, gid: int) -> None:
    """``lchown`` ``top`` and everything below it to ``uid:gid`` (never following a link; entries that
    vanish meanwhile are skipped)."""
    os.chown(top, uid, gid, follow_symlinks=False)
    for e in iter_entries(top):
        try:
            os.chown(e.path, uid, gid, follow_symlinks=False)
        except OSError:
            continue
