"""Host-side files of the bwrap backend: private size-limited tmpfs mounts and read-only staging
binds (when this process is root), and sanitizing copies into and out of them.

Invariants:
  * every mount made here is ``nosuid,nodev`` and sits under a folder that only the sandbox's host
    uid (and root) can enter, so no other host user and no other sandbox can reach it;
  * :func:`ensure_reaper` starts, once per process, a watcher in its own session that waits for this
    process to end (however it ends, ``kill -9`` included) and then unmounts and removes what its
    sandboxes still hold, and their cgroups, so a killed driver leaves no mount, no tmpfs memory and
    no cgroup behind;
    :func:`sweep_stale` removes, by pid, what a driver whose reaper did not run left;
  * :func:`copy_owned` is :func:`clawgym_env.files.workspace.copy_tree` (links never followed,
    holes and hard links kept, bounded memory, special files skipped, no setuid/setgid/sticky entry)
    plus the owner it is told to, for every entry;
  * :func:`strip_setid` removes the setuid/setgid bits of every entry under a folder (links not followed).
"""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from clawgym_env.files.walk import chown_tree, iter_entries, remove_tree
from clawgym_env.files.workspace import copy_tree

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_reaper_lock = threading.Lock()
_reaper: dict[int, int] = {}  # pid of this process -> write end of the pipe its reaper waits on
_told: dict[int, set[str]] = {}  # pid of this process -> what its reaper was told to remove


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def mount_tmpfs(mountpoint: Path, *, size_mb: int | None, uid: int, gid: int, mode: int,
                inodes: int | None = None) -> None:
    """Mount a ``nosuid,nodev`` tmpfs of ``size_mb`` MiB (None: the kernel's default, half the RAM) holding
    at most ``inodes`` entries (None: the kernel's default) whose root folder belongs to (uid, gid) with
    ``mode`` on ``mountpoint`` (root only)."""
    opts = f"mode={mode:o},uid={uid},gid={gid}" + (f",size={int(size_mb)}m" if size_mb is not None else "")
    opts += f",nr_inodes={int(inodes)}" if inodes is not None else ""
    _check(_libc.mount(b"tmpfs", os.fsencode(mountpoint), b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV),
                       opts.encode()), f"mount -t tmpfs -o {opts} on {mountpoint}")


def make_private(mountpoint: Path) -> None:
    """Give the mount on ``mountpoint`` private propagation, so mounts under it stay out of other
    mount namespaces; one :func:`unmount_tree` then removes them all (root only)."""
    _check(_libc.mount(None, os.fsencode(mountpoint), None, ctypes.c_ulong(MS_PRIVATE), None),
           f"make {mountpoint} private")


def bind_ro(src: Path, dst: Path) -> None:
    """Bind ``src`` (and the mounts under it) read-only, ``nosuid,nodev`` on the existing ``dst``."""
    _check(_libc.mount(os.fsencode(src), os.fsencode(dst), None, ctypes.c_ulong(MS_BIND | MS_REC), None),
           f"bind {src} on {dst}")
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
    _check(_libc.mount(None, os.fsencode(dst), None, ctypes.c_ulong(flags), None), f"remount {dst} read-only")


def unmount_tree(path: Path) -> None:
    """Detach ``path`` and every mount under it (no error when nothing is mounted there)."""
    _libc.umount2(os.fsencode(path), MNT_DETACH)


def others_can_reach(path: Path) -> bool:
    """Whether a user with no relation to the owners can look up ``path`` (every folder on the way,
    symlinks resolved, carries the ``o+x`` bit)."""
    p = Path(os.path.realpath(path))
    for d in [*reversed(p.parents), p] if p.is_dir() else reversed(p.parents):
        try:
            if not os.stat(d).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


_REAPER_SH = r"""
while IFS= read -r line; do set -- "$@" "$line"; done
for a in "$@"; do v=${a#?}; case $a in M*)
  grep -o " [^ ]*/$v[^ /]* " /proc/self/mountinfo | sort -u | while read m; do umount -l "$m"; rmdir "$m"; done;;
esac; done
for a in "$@"; do v=${a#?}; case $a in
  C*) for d in "$v"*; do n=0
        while [ -d "$d" ] && ! rmdir "$d" 2>/dev/null && [ $n -lt 100 ]; do
          kill -9 $(cat "$d/cgroup.procs" 2>/dev/null) 2>/dev/null; sleep 0.1; n=$((n+1)); done; done;;
  D*) for d in "$v"*; do [ -e "$d" ] && rm -rf -- "$d"; done;;
esac; done
"""


def ensure_reaper(prefix: str | None = None, cgroup_parents: Sequence[Path] = (), folders: Path | None = None) -> None:
    """Start this process's reaper once (see the invariants) and tell it what to remove when this process
    is gone: the mounts whose folder name starts with ``prefix`` + this process's pid + ``-`` (unmounted,
    then the folder removed), the cgroups ``clawgym-<pid>-*`` under each of ``cgroup_parents`` (emptied,
    then removed: the sandboxes' processes die with their bwrap, ``--die-with-parent``), and the
    folders ``folders/<prefix><pid>-*`` (deleted). Each is told once per process."""
    me = os.getpid()
    lines = [f"M{prefix}{me}-"] if prefix else []
    lines += [f"C{p}/clawgym-{me}-" for p in cgroup_parents]
    if folders is not None and prefix:
        lines.append(f"D{folders}/{prefix}{me}-")
    with _reaper_lock:
        if me not in _reaper:
            r, w = os.pipe()  # both ends non-inheritable: only the reaper gets ``r``, nothing else gets ``w``
            try:
                subprocess.Popen(["/bin/sh", "-c", _REAPER_SH], stdin=r, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True, cwd="/")
            finally:
                os.close(r)
            _reaper[me] = w
            _told[me] = set()
        for line in lines:
            if line not in _told[me] and "\n" not in line:
                os.write(_reaper[me], (line + "\n").encode())
                _told[me].add(line)


def sweep_stale(tmp_dir: Path, prefix: str) -> None:
    """Unmount and delete ``tmp_dir/<prefix><pid>-*`` folders whose process ``pid`` is gone (killed
    drivers leave their tmpfs mounts behind)."""
    try:
        names = [n for n in os.listdir(tmp_dir) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or os.path.exists(f"/proc/{pid}"):
            continue
        unmount_tree(tmp_dir / name)
        discard(tmp_dir / name)


def is_full(path: Path) -> bool:
    """Whether the file system holding ``path`` has no block left for an unprivileged writer."""
    try:
        return os.statvfs(path).f_bavail == 0
    except OSError:
        return False


def out_of_inodes(path: Path) -> bool:
    """Whether the file system holding ``path`` has a finite inode count and no inode left."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_files > 0 and st.f_favail == 0


def clear_dir(path: Path) -> None:
    """Delete everything inside ``path`` (never following a link), keeping ``path`` itself."""
    with os.scandir(path) as it:
        for e in it:
            if e.is_dir(follow_symlinks=False):
                remove_tree(e.path)
            else:
                os.unlink(e.path)


def copy_owned(src: Path, dst: Path, uid: int, gid: int) -> int:
    """Copy the contents of folder ``src`` into the existing folder ``dst`` with
    :func:`clawgym_env.files.workspace.copy_tree` (links as links, holes and hard links kept, special
    files skipped, setuid/setgid/sticky bits dropped, bounded memory), then give every entry to
    ``uid:gid``. Returns how many entries were skipped."""
    report = copy_tree(src, dst)
    chown_tree(dst, uid, gid)
    return len(report.skipped)


def strip_setid(path: Path) -> None:
    """Clear the setuid and setgid bits of every file and folder under ``path`` (links not followed;
    iterative, so an agent's 1,200-deep tree is fine)."""
    for e in iter_entries(path):
        try:
            st = e.stat(follow_symlinks=False)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(e.path, stat.S_IMODE(st.st_mode) & 0o1777, follow_symlinks=False)
        except OSError:
            continue


def discard(path: str | Path) -> None:
    """Best-effort delete of a tree that may be deep or hold odd modes (never raises)."""
    try:
        remove_tree(path)
    except OSError:
        pass
