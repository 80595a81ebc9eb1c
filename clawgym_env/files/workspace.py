"""Copying and fingerprinting untrusted folder trees (workspaces, task folders) on the host.

Everything under a workspace was written by the agent, and a task folder may come from an untrusted
download, so both are hostile input. :func:`copy_tree` and :func:`snapshot` hold these invariants:

  * a symbolic link is never followed on the host: it is copied as a link (``readlink``/``symlink``),
    except that with ``links_inside=ROOT`` a link whose target resolves inside ``ROOT`` to a regular
    file is materialised (its content copied) and any other link (leaving ``ROOT``, dangling, a loop)
    is refused and listed in :attr:`CopyReport.refused_links`; every open uses ``O_NOFOLLOW`` relative
    to an already opened parent directory, so a link swapped in for a folder is never entered;
  * regular files are streamed in chunks of :data:`CHUNK` bytes and only their data segments are
    read and written (``SEEK_DATA``/``SEEK_HOLE``): a 3 GiB sparse file costs no memory and stays
    sparse; no file is ever read whole into memory; a file hard-linked N times is copied once and
    linked N - 1 times (a 1 GiB file linked 1,000 times stays 1 GiB, not 1 TB);
  * fifos, sockets and device nodes are never opened: they are skipped and listed;
  * setuid, setgid and sticky bits are stripped from every copied file and folder;
  * names are handled as bytes (a non-UTF-8 name is fine) and shown with
    :func:`display_path` (backslash escapes, always valid UTF-8, so records always serialise);
  * trees are walked with an explicit stack (no recursion): 1,200 nested folders, or a path far
    longer than ``PATH_MAX``, are fine; at most :data:`HELD_LEVELS` directory fds per tree stay open;
  * ``max_bytes`` bounds the data bytes written, ``max_entries`` the entries met (files, folders,
    links and skipped ones, the root not counted) and ``deadline`` (a :func:`time.monotonic` instant)
    the time spent, checked before every entry and every chunk: crossing one stops the copy with
    :class:`~clawgym_env.errors.CopyLimitError` whose ``limit`` names it (``bytes``, ``entries`` or
    ``time``), carrying the partial report; so a copy of a million files, or of files that never end,
    ends by its deadline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from clawgym_env.errors import CopyLimitError, WorkspaceError
from clawgym_env.files.walk import (
    DIR_FLAGS,
    FILE_FLAGS,
    PERM,
    DirStack,
    Entry,
    display_path,
    kind,
    names,
    open_regular,
    remove_tree,
    snapshot,
    stream_data,
)

__all__ = ["CopyReport", "Entry", "copy_tree", "display_path", "private_tempdir", "remove_tree", "snapshot"]


@dataclass
class CopyReport:
    """What :func:`copy_tree` did. Paths are relative, shown with :func:`display_path`."""

    files: int = 0
    dirs: int = 0
    links: int = 0
    hard_links: int = 0
    """Entries made as hard links to an earlier copy of the same source inode."""
    bytes_copied: int = 0
    """Data bytes written (holes are not counted)."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, kind) of special files that were not copied: fifo, socket, device, other."""
    refused_links: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of links refused under ``links_inside``."""
    materialised: list[str] = field(default_factory=list)
    """Links under ``links_inside`` whose in-root target file was copied in their place."""
    stripped_modes: list[str] = field(default_factory=list)
    """Paths whose setuid/setgid/sticky bits were dropped."""


def _resolve_inside(root_real: bytes, src_dir_real: bytes, target: bytes) -> tuple[bytes | None, str]:
    """(real target path, "") when ``target`` (a link in ``src_dir_real``) resolves to a regular
    file inside ``root_real``, else (None, why)."""
    full = os.path.realpath(os.path.join(src_dir_real, target))
    if os.path.commonpath([root_real, full]) != root_real:
        return None, "link target leaves the allowed root"
    try:
        st = os.stat(full)
    except OSError:
        return None, "dangling link"
    if not stat.S_ISREG(st.st_mode):
        return None, f"link target is a {kind(st.st_mode)}, not a regular file"
    return full, ""


class _Copier:
    def __init__(self, report: CopyReport, max_bytes: int | None, dst: bytes, *, max_entries: int | None = None,
                 deadline: float | None = None) -> None:
        self.report, self.max_bytes, self.dst = report, max_bytes, dst
        self.max_entries, self.deadline = max_entries, deadline
        self.entries = 0
        self.linked: dict[tuple[int, int], bytes] = {}
        """(device, inode) of a multiply linked source file -> where its first copy went (absolute)."""

    def _count(self, n: int) -> None:
        self.report.bytes_copied += n
        if self.max_bytes is not None and self.report.bytes_copied > self.max_bytes:
            raise CopyLimitError(
                f"copy exceeds its limit of {self.max_bytes} bytes of file data; remove large files or raise "
                "the limit", report=self.report, limit="bytes")
        self.check_time()

    def entry(self) -> None:
        """Count one more entry met; raise past ``max_entries`` or the deadline."""
        self.entries += 1
        if self.max_entries is not None and self.entries > self.max_entries:
            raise CopyLimitError(
                f"copy exceeds its limit of {self.max_entries} entries (files, folders and links); remove files "
                "or raise the limit", report=self.report, limit="entries")
        self.check_time()

    def check_time(self) -> None:
        """Raise once the deadline has passed."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise CopyLimitError(
                f"copy ran past its deadline after {self.entries} entries and {self.report.bytes_copied} bytes; "
                "leave fewer or smaller files, or give the copy more time", report=self.report, limit="time")

    def file(self, src_fd: int, st: os.stat_result, dst_dir: int, name: bytes, rel: bytes, *,
             hard_links: bool = True) -> None:
        try:
            os.unlink(name, dir_fd=dst_dir)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise WorkspaceError(f"cannot copy file {display_path(rel)!r} over an existing folder") from None
        key = (st.st_dev, st.st_ino)
        if hard_links and st.st_nlink > 1 and key in self.linked:  # the same inode again: link, not copy
            try:
                os.link(self.linked[key], name, dst_dir_fd=dst_dir, follow_symlinks=False)
                self.report.hard_links += 1
                return
            except OSError:
                pass  # e.g. the first copy was replaced meanwhile: copy the data after all
        mode = st.st_mode & PERM
        if st.st_mode & ~PERM & 0o7777:
            self.report.stripped_modes.append(display_path(rel))
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                      dir_fd=dst_dir)
        try:
            def sink(off: int, buf: bytes) -> None:
                self._count(len(buf))
                view = memoryview(buf)
                while view:
                    n = os.pwrite(out, view, off)
                    view, off = view[n:], off + n

            stream_data(src_fd, st.st_size, sink)
            os.ftruncate(out, st.st_size)  # keeps a trailing hole
            os.fchmod(out, mode)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
        self.report.files += 1
        if hard_links and st.st_nlink > 1:
            self.linked[key] = os.path.join(self.dst, rel)


def copy_tree(src: str | Path, dst: str | Path, *, links_inside: str | Path | None = None,
              max_bytes: int | None = None, max_entries: int | None = None,
              deadline: float | None = None) -> CopyReport:
    """Copy the folder ``src`` into ``dst`` (created if missing, merged into if present); see the
    module doc for the invariants. ``src`` itself is trusted (it may be reached through a link);
    nothing below it is. Raises :class:`CopyLimitError` past ``max_bytes``, ``max_entries`` or
    ``deadline`` (a :func:`time.monotonic` instant) and :class:`WorkspaceError` when ``src`` is not a
    folder."""
    report = CopyReport()
    copier = _Copier(report, max_bytes, os.fsencode(os.path.abspath(dst)), max_entries=max_entries,
                     deadline=deadline)
    try:
        src_root = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise WorkspaceError(f"cannot copy {src}: {exc.strerror}; pass an existing folder") from None
    root_real = os.fsencode(os.path.realpath(links_inside)) if links_inside is not None else None
    src_real = os.fsencode(os.path.realpath(src))
    Path(dst).mkdir(parents=True, exist_ok=True)
    dst_root = os.open(dst, DIR_FLAGS)
    s_tree, d_tree = DirStack(src_root), DirStack(dst_root)
    # one frame per open level: [pending entry names, stat of the source folder, finished]; a folder
    # is finished (modes, times) as soon as its last entry exists, so that a deep level whose fd was
    # closed never has to be reopened just for that
    frames: list[list] = [[names(src_root), os.fstat(src_root), False]]
    try:
        while frames:
            pending, dir_st, finished = frames[-1]
            if not pending:
                if not finished:
                    _finish_dir(d_tree.fd(), dir_st, report, d_tree.rel(), is_root=len(frames) == 1)
                frames.pop()
                if frames:
                    s_tree.pop()
                    d_tree.pop()
                continue
            name = pending.pop()
            copier.entry()
            sfd = s_tree.fd()
            rel = s_tree.rel(name)
            try:
                st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            what = kind(st.st_mode)
            if what == "dir":
                child = os.open(name, DIR_FLAGS, dir_fd=sfd)
                dfd = d_tree.fd()
                try:
                    os.mkdir(name, 0o700, dir_fd=dfd)
                except FileExistsError:
                    pass
                dchild = os.open(name, DIR_FLAGS, dir_fd=dfd)  # refuses a link planted in dst
                if not pending and len(frames) > 1:
                    _finish_dir(dfd, dir_st, report, d_tree.rel(), is_root=False)
                    frames[-1][2] = True
                s_tree.push(name, child)
                d_tree.push(name, dchild)
                frames.append([names(child), st, False])
                report.dirs += 1
            elif what == "file":
                fd = open_regular(sfd, name, st)
                if fd is None:
                    report.skipped.append((display_path(rel), "vanished or changed while copying"))
                    continue
                try:
                    copier.file(fd, st, d_tree.fd(), name, rel)
                finally:
                    os.close(fd)
            elif what == "symlink":
                target = os.readlink(name, dir_fd=sfd)
                if root_real is None:
                    _place_link(d_tree.fd(), name, target)
                    report.links += 1
                    continue
                here = os.path.join(src_real, s_tree.rel()) if s_tree.rel() else src_real
                full, why = _resolve_inside(root_real, here, target)
                if full is None:
                    report.refused_links.append((display_path(rel), why))
                    continue
                fd = os.open(full, FILE_FLAGS)
                try:
                    copier.file(fd, os.fstat(fd), d_tree.fd(), name, rel, hard_links=False)
                finally:
                    os.close(fd)
                report.materialised.append(display_path(rel))
            else:
                report.skipped.append((display_path(rel), what))
    finally:
        s_tree.close()
        d_tree.close()
        os.close(src_root)
        os.close(dst_root)
    return report


def _place_link(dst_dir: int, name: bytes, target: bytes) -> None:
    try:
        os.unlink(name, dir_fd=dst_dir)
    except FileNotFoundError:
        pass
    os.symlink(target, name, dir_fd=dst_dir)


def _finish_dir(dfd: int, st: os.stat_result, report: CopyReport, rel: bytes, *, is_root: bool) -> None:
    """Give a copied folder its source's permission bits (special bits stripped) and times."""
    if st.st_mode & ~PERM & 0o7777:
        report.stripped_modes.append(display_path(rel) or ".")
    if not is_root:
        os.fchmod(dfd, st.st_mode & PERM)
        os.utime(dfd, ns=(st.st_atime_ns, st.st_mtime_ns))


@contextlib.contextmanager
def private_tempdir(prefix: str = "clawgym-", dir: str | Path | None = None) -> Iterator[Path]:
    """A fresh 0700 temporary folder (a :class:`~pathlib.Path`), deleted on exit with
    :func:`remove_tree` — unlike :class:`tempfile.TemporaryDirectory`, whose cleanup recurses and
    dies on a 1,200-deep tree an agent left behind."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=dir))
    try:
        yield path
    finally:
        try:
            remove_tree(path)
        except OSError as exc:
            logging.getLogger(__name__).warning("could not remove %s: %s", path, exc)
