"""Leftovers of runs that died (SIGKILL, OOM kill, power loss), found and reaped on the next start.

A long run (``clawgym eval``) holds a :class:`RunLock` on its state folder: ``<state>/.runs/<run_id>/``
with a ``lock`` file ``flock``-ed for the run's whole life and ``owner.json`` (pid, host, results
file, start time, temporary folder). The run's temporary folder, ``<system tmp>/clawgym-<id>`` (short:
unix socket paths live under it), is the process's temporary folder while the lock is held — so
every sandbox root, proxy socket folder, grading copy and other temporary folder of the run lies
under it.

Invariants:
  * a run is dead iff its ``lock`` can be locked by someone else: the kernel drops an ``flock`` when
    its holder dies, however it died, so a live run is never reaped (the pid is informational);
  * :func:`reap_dead_runs` deletes a dead run's folder and its temporary folder (only a direct child
    of the system temporary folder named ``clawgym-<8 hex>``, whatever ``owner.json`` claims)
    without following links and without recursion (:func:`~clawgym_env.files.workspace.remove_tree`);
  * the temporary folder holds its own flocked ``.lock`` too, so :func:`reap_dead_tmp` finds dead
    runs' temporary folders from any start, whatever state folder those runs used;
  * :func:`reap_dead_cgroups` removes the ``clawgym-<pid>-<id>`` cgroups (named by the sandbox
    backends) whose creating pid no longer exists, killing anything left inside first;
  * everything created here is private: folders 0700 (the temporary folder 0711: traversable, not
    listable, as the sandboxes' unprivileged uids must reach their own folders inside), files 0600.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import logging
import os
import re
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from clawgym_env.files.workspace import remove_tree

log = logging.getLogger(__name__)
RUNS = ".runs"
LOCK = ".lock"
_CGROUP_NAME = re.compile(r"^clawgym-(\d+)-[0-9a-f]{6,}$")
_TMP_NAME = re.compile(r"^clawgym-[0-9a-f]{8}$")
_tempdir_owner: str | None = None


@dataclass
class ReapReport:
    """What a reap removed (paths as text)."""

    runs: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    episode_dirs: list[str] = field(default_factory=list)
    live_runs: int = 0
    """Other runs on the same state folder that are alive (their leftovers were left alone)."""
    dead_started: dict[str, float] = field(default_factory=dict)
    """Results file (as ``owner.json`` names it) -> the earliest start (epoch seconds, rounded down)
    of a dead run that wrote it: an episode it finished after that whose row never landed is its."""


def _is_locked(lock: Path) -> bool:
    """True when another live process holds ``lock``'s flock."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the probe's own lock
    return False


def reap_dead_runs(state_dir: str | Path, *, skip: str | None = None) -> ReapReport:
    """Delete the folders (and temporary files) of every dead run under ``state_dir/.runs``."""
    report = ReapReport()
    runs = Path(state_dir) / RUNS
    if not runs.is_dir():
        return report
    for entry in sorted(runs.iterdir()):
        if entry.name == skip or entry.is_symlink() or not entry.is_dir():
            continue
        if _is_locked(entry / "lock"):
            report.live_runs += 1
            continue
        try:
            owner = json.loads((entry / "owner.json").read_text())
            tmp = Path(owner.get("tmp") or "")
        except (OSError, ValueError, AttributeError):
            owner, tmp = {}, Path("")
        _note_dead_start(report, owner)
        if _TMP_NAME.match(tmp.name) and tmp.parent == Path(tempfile.gettempdir()) and not tmp.is_symlink():
            try:
                unmount_under(tmp)
                remove_tree(tmp)
                report.runs.append(str(tmp))
            except OSError as exc:
                log.warning("could not reap the dead run's temporary folder %s: %s", tmp, exc)
        try:
            remove_tree(entry)
            report.runs.append(str(entry))
        except OSError as exc:
            log.warning("could not reap the dead run %s: %s", entry, exc)
    return report


def _note_dead_start(report: ReapReport, owner: object) -> None:
    if not isinstance(owner, dict) or not isinstance(owner.get("results"), str):
        return
    try:
        started = _dt.datetime.fromisoformat(str(owner.get("started"))).timestamp()
    except ValueError:
        return
    results = owner["results"]
    report.dead_started[results] = min(started, report.dead_started.get(results, started))


def reap_dead_tmp() -> list[str]:
    """Delete every ``<system tmp>/clawgym-<8 hex>`` run folder whose ``.lock`` no live run holds,
    whatever state folder its run used (unmounting what its sandboxes left mounted first)."""
    removed: list[str] = []
    base = Path(tempfile.gettempdir())
    try:
        entries = [e for e in base.iterdir() if _TMP_NAME.match(e.name)]
    except OSError:
        return removed
    for entry in entries:
        lock = entry / LOCK
        try:
            young = time.time() - entry.stat().st_ctime < 60  # a run may be between mkdir and flock
        except OSError:
            continue
        if young or entry.is_symlink() or not entry.is_dir() or not lock.exists() or _is_locked(lock):
            continue
        try:
            unmount_under(entry)
            remove_tree(entry)
            removed.append(str(entry))
        except OSError as exc:
            log.warning("could not reap the dead run's temporary folder %s: %s", entry, exc)
    return removed


def unmount_under(root: Path) -> list[str]:
    """Detach every mount at or below ``root`` (a dead run's sandbox tmpfs and binds), deepest
    first; returns the mount points. Needs root; without it nothing is mounted by us anyway."""
    prefix = str(root).rstrip("/") + "/"
    points: list[str] = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                point = line.split()[4].replace("\\040", " ")
                if point == str(root) or point.startswith(prefix):
                    points.append(point)
    except OSError:
        return []
    if not points:
        return []
    from clawgym_env.sandbox.hostfs import unmount_tree

    for point in sorted(set(points), key=len, reverse=True):
        try:
            unmount_tree(Path(point))
        except OSError as exc:
            log.warning("could not unmount %s: %s", point, exc)
    return points


def reap_dead_cgroups() -> list[str]:
    """Remove cgroups ``clawgym-<pid>-<id>`` whose creating process is gone (see the module doc)."""
    try:
        from clawgym_env.sandbox.bwrap.hostside import _hierarchy_base, _kill_cgroup, _own_cgroups
    except ImportError:  # pragma: no cover - a backend without cgroups
        return []
    removed: list[str] = []
    try:
        own_v1, own_v2 = _own_cgroups()
    except OSError:
        return removed
    bases = set()
    for ctrl in ("memory", "pids", "cpu"):
        try:
            found = _hierarchy_base(ctrl, own_v1, own_v2)
        except OSError:
            found = None
        if found is not None:
            bases.add(found[0])
    for base in bases:
        try:
            children = list(base.iterdir())
        except OSError:
            continue
        for d in children:
            m = _CGROUP_NAME.match(d.name)
            if not m or not d.is_dir() or _pid_alive(int(m.group(1))):
                continue
            deadline = time.monotonic() + 5  # processes killed with their run may still be exiting
            while True:
                try:
                    _kill_cgroup(d)
                    d.rmdir()
                    removed.append(str(d))
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        log.warning("could not remove the orphan cgroup %s: %s", d, exc)
                        break
                    time.sleep(0.05)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """Mark a run alive on ``state_dir`` for its lifetime (a context manager); see the module doc.

    On enter: reap dead runs and orphan cgroups (``reaped``), create this run's folder, lock it,
    and point :mod:`tempfile` at its temporary folder (restored on exit; the first RunLock of a
    process wins). On exit: delete the temporary folder, then the run's folder, then unlock; what
    cannot be deleted yet (a sandbox still mounted after an interrupt) stays, named by the run's
    ``owner.json``, for the next start to reap.
    """

    def __init__(self, state_dir: str | Path, *, results: str | Path | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.results = str(results) if results is not None else None
        short = uuid.uuid4().hex[:8]
        self.run_id = f"{os.getpid()}-{short}"
        self.dir = self.state_dir / RUNS / self.run_id
        self.tmp = Path(tempfile.gettempdir()) / f"clawgym-{short}"
        self.reaped = ReapReport()
        self._fd: int | None = None
        self._tmp_fd: int | None = None
        self._old_tempdir: str | None = None

    def __enter__(self) -> RunLock:
        global _tempdir_owner
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.state_dir / RUNS).mkdir(exist_ok=True, mode=0o700)
        self.reaped = reap_dead_runs(self.state_dir)
        self.reaped.runs += reap_dead_tmp()
        self.reaped.cgroups = reap_dead_cgroups()
        self.dir.mkdir(mode=0o700)
        self._fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "results": self.results, "tmp": str(self.tmp),
                 "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        fd = os.open(self.dir / "owner.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(owner, fh)
        self.tmp.mkdir(mode=0o700)  # after owner.json: a run killed now still names it
        os.chmod(self.tmp, 0o711)  # sandbox uids traverse it to their own (0700, random-named) folders
        self._tmp_fd = os.open(self.tmp / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._tmp_fd, fcntl.LOCK_EX)  # any later start, whatever its state folder, sees it live
        if _tempdir_owner is None:
            self._old_tempdir, tempfile.tempdir = tempfile.tempdir, str(self.tmp)
            _tempdir_owner = self.run_id
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the run: restore ``tempfile.tempdir``, remove the run's temp and state folders (left
        for the next run to reap if they cannot be removed), close the locks; idempotent."""
        global _tempdir_owner
        if self._fd is None:
            return
        if _tempdir_owner == self.run_id:
            tempfile.tempdir, _tempdir_owner = self._old_tempdir, None
        try:
            remove_tree(self.tmp)
            remove_tree(self.dir)
        except OSError as exc:  # e.g. a sandbox still mounted after an interrupt: the next start reaps it
            log.warning("left %s for the next run to reap: %s", self.tmp, exc)
        for fd in (self._tmp_fd, self._fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._tmp_fd = None


def reap_orphan_episodes(episodes_dir: str | Path, referenced: set[str], report: ReapReport, *,
                         results: str | Path | None = None) -> None:
    """Delete episode folders under ``episodes_dir`` that no results row references and that a dead run
    left unfinished (no ``episode.json``) or finished without its row landing (killed between the two
    writes: ``episode.json`` written after a dead run of the same ``results`` file started; the restart
    redoes that episode). Of other finished folders no row references only the kept ``workspace/`` goes.
    Call only while no other live run uses ``episodes_dir`` (``report.live_runs``)."""
    root = Path(episodes_dir)
    if report.live_runs or not root.is_dir():
        return
    dead_since = report.dead_started.get(str(results)) if results is not None else None
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or d.is_symlink() or not d.is_dir() or str(d) in referenced:
            continue
        try:
            done = d / "episode.json"
            if not done.exists() or (dead_since is not None and done.stat().st_mtime >= dead_since):
                remove_tree(d)
                report.episode_dirs.append(str(d))
            elif (d / "workspace").is_dir():
                remove_tree(d / "workspace")
                report.episode_dirs.append(str(d / "workspace"))
        except OSError as exc:
            log.warning("could not reap the orphan episode folder %s: %s", d, exc)
