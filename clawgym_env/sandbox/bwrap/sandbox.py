"""Bubblewrap (``bwrap``) namespace sandbox.

Each :meth:`BwrapSandbox.exec` is one ``bwrap`` invocation with the same mounts, so the sandbox is
stateless apart from three writable places: the workspace, a private HOME and ``/tmp``, which the
sandbox object owns (created by ``__enter__``, removed by ``close``).

What it promises (the security boundary):
  * **no host root**: every exec runs in a new user namespace; when this process is root, ``bwrap``
    itself is started as the sandbox's own unprivileged host ids (``spec.host_ids``, else
    :func:`sandbox_host_ids`: a fresh id for every sandbox, no supplementary groups), so uid 1000
    inside (or root inside, ``unprivileged=False``) is that host uid: host files are reached with
    "other" permissions only, host processes cannot be signalled, ``/proc/sys``, ``/proc/irq``,
    ``/proc/bus`` and ``/proc/sysrq-trigger`` are mounted read-only on top of that;
  * **no setuid planting**: as root, the workspace, HOME and ``/tmp`` are ``nosuid,nodev`` tmpfs mounts
    under a folder that only the sandbox uid can enter (``0700``, never reachable by other host users or
    other sandboxes); the workspace's files are copied in at start and copied back (unless
    ``spec.hand_back`` is False) to ``spec.workspace_host`` by ``close`` with the workspace folder's
    owner, no setuid/setgid/sticky bit, symlinks as links, holes kept, hard links kept, special files
    dropped; a killed driver leaves the host workspace as it was given, and its mounts are removed by
    its reaper process; as a non-root user, ``close`` clears setuid/setgid bits under the workspace;
  * **no answer keys**: only ``spec.ro_paths`` (system folders, the interpreter, the harness's own
    install) are visible, read-only; ``spec.hidden_paths`` (our own packages' folders: tasks,
    verifiers, trainers) and the workspace's episode and run folders are masked with empty
    read-only folders wherever they fall under a visible path;
  * **limits** (see :mod:`clawgym_env.sandbox.bwrap.hostside`): memory, processes and CPU share by cgroup,
    rlimits, and ``disk_mb`` and ``inodes`` per writable place (workspace, HOME, ``/tmp``: tmpfs
    ``size``/``nr_inodes`` when root; ``/dev/shm``: a size-limited tmpfs always, whose entries the
    memory cgroup bounds), a write past either fails with ENOSPC inside;
    :meth:`BwrapSandbox.limits_hit` names the places that filled up, an OOM kill (``memory``) and a
    CPU share held at its quota (``cpu``); ``enforced_limits`` says how each limit is enforced,
    ``unenforced_limits`` why one is not. A workspace handed in that does not fit its place raises
    :class:`~clawgym_env.sandbox.base.PlaceFullError` (the files' size, not the sandbox, is at fault).
Not promised: protection against kernel exploits (use a VM or gVisor backend for that).

Other invariants:
  * every exec runs with ``--unshare-all``, ``--die-with-parent``, ``--new-session``,
    ``--cap-drop ALL``, a read-only root, a fresh ``/proc`` and a minimal ``/dev``; the only network
    is loopback, plus the relay to ``spec.proxy_socket`` when that is set: the socket is bound
    read-only (no ``chmod``, ``rm`` or replacement from inside; ``connect`` still works) and must be
    connectable by the sandbox uid (e.g. mode 0666 inside a 0700 folder, as the proxy makes it); as
    root the relay runs once per sandbox and every exec joins its loopback-only network namespace
    (``--share-net``, see :mod:`clawgym_env.sandbox.bwrap.relay`), else each exec starts its own; a
    command that cannot be found or run exits 127 or 126;
  * the environment inside is built from scratch (never the host's), see :meth:`BwrapSandbox.env`;
  * bind mounts are applied parents first (sorted by depth), so toolchain paths and the workspace
    may lie under the private HOME; a source the sandbox uid cannot look up on the host (e.g. under
    ``/root``) is first bound read-only into the sandbox's private folder;
  * an exec that times out has its whole process tree killed (process group of ``bwrap``; the pid
    namespace takes every process inside with it) and returns ``ExecResult(timed_out=True)``; an exec
    still running when ``close`` is called (from any thread) is killed the same way, cgroup or not;
  * captured stdout/stderr keep at most ``max_output_bytes`` each (the tail);
  * ``read_file``/``write_file``: see :mod:`clawgym_env.sandbox.bwrap.files`; mounts, environment and
    command lines: :mod:`clawgym_env.sandbox.bwrap.plan`;
  * when the sandbox maps to this process's own uid (not root), files under ``/etc`` and ``/opt``
    that other users may not read (``/etc/shadow``...) are masked with empty ones.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import subprocess
import tempfile
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox import hostfs
from clawgym_env.sandbox.base import (
    ExecResult,
    PlaceFullError,
    Sandbox,
    SandboxSpec,
    limit_tags,
    sandbox_host_ids,
)
from clawgym_env.sandbox.bwrap.files import MountTableFiles
from clawgym_env.sandbox.bwrap.hostside import Cgroup, cgroup_parents, plan_limits, sweep_stale_cgroups
from clawgym_env.sandbox.bwrap.plan import (
    PROXY_SOCK,
    READ_ONLY_PROC,
    RELAY_PY,
    RUN_DIR,
    BwrapCommands,
    inside_python,
)
from clawgym_env.sandbox.bwrap.relay import RelayHolder, holder_possible
from clawgym_env.sandbox.bwrap.run import _FIX, check_bwrap, killpg, pump, setpriv_prefix
from clawgym_env.sandbox.deadline import Deadline

_PREFIX = "clawgym-bwrap-"
_swept: set[str] = set()


def _release(root: list[Path], cgroup: Cgroup, holders: list[RelayHolder]) -> None:
    """Last-resort and normal cleanup; referenced by a finalizer, so it must not reference the sandbox."""
    for holder in holders:
        holder.stop()
    holders.clear()
    cgroup.destroy()
    for d in root:
        if os.getuid() == 0:
            hostfs.unmount_tree(d)
        hostfs.discard(d)
    root.clear()


class BwrapSandbox(BwrapCommands, MountTableFiles, Sandbox):
    """A sandbox made of ``bwrap`` invocations. Use as ``with BwrapSandbox(spec) as sb: ...``.

    Args:
        spec: what to mount and which limits to apply.
        max_output_bytes: how much of each of stdout/stderr an exec keeps (the last bytes).
        use_cgroups: try cgroups for memory/process/CPU limits (else only rlimits are used).
        tmp_root: host folder under which the sandbox's private folder is created (default: the
            host's temp dir); when root, every folder on its path must be enterable by others (o+x).
    """

    def __init__(self, spec: SandboxSpec, *, max_output_bytes: int = 1 << 20, use_cgroups: bool = True,
                 tmp_root: Path | None = None) -> None:
        self.spec = spec
        self.max_output_bytes = max_output_bytes
        self.use_cgroups = use_cgroups
        self.tmp_root = tmp_root
        self.root: Path | None = None
        """Host folder holding ``home/``, ``tmp/`` (and ``ws/`` when root) while the sandbox is open."""
        self.host_ids: tuple[int, int] = (os.getuid(), os.getgid())
        """Host (uid, gid) the sandboxed processes run as."""
        self.enforced_limits: dict[str, str] = {}
        self.unenforced_limits: dict[str, str] = {}
        self._private = os.getuid() == 0  # root: private tmpfs places, copy in/out, drop to host_ids
        self._ws_owner: tuple[int, int] = (0, 0)
        self._dirs: list[Path] = []
        self._cgroup = Cgroup()
        self._finalizer: weakref.finalize | None = None
        self._wrapper: list[str] = []
        self._bwrap = "bwrap"
        self._mounts: list[tuple[str, str, str]] = []  # (kind, host source, target)
        self._tbl: list[tuple[str, Path, bool]] = []  # (target, real host source, writable)
        self._places: dict[str, Path] = {}  # writable place -> host folder
        self._holders: list[RelayHolder] = []  # the relay holder, when one serves every exec (root)
        self._running: set[subprocess.Popen] = set()  # execs in progress: close() kills them (any thread)

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> BwrapSandbox:
        if self._finalizer is not None:
            raise SandboxError("this BwrapSandbox was already started; create a new one")
        self._finalizer = weakref.finalize(self, _release, self._dirs, self._cgroup, self._holders)
        try:
            self._start()
        except BaseException:
            self._finalizer()
            self.root = None
            raise
        return self

    def _start(self) -> None:
        spec = self.spec
        self._bwrap = check_bwrap(spec.unprivileged)
        ws = Path(spec.workspace_host)
        if not ws.is_dir():
            raise SandboxError(f"workspace {ws} does not exist or is not a folder; create it first")
        for p in (spec.workspace_target, spec.home):
            if not posixpath.isabs(p):
                raise SandboxError(f"sandbox path {p!r} must be absolute")
        for src in [*spec.ro_paths, *(h for h, _t, _rw in spec.extra_binds)]:
            if not os.path.lexists(src):
                raise SandboxError(f"bind source {src} does not exist on the host; remove it from the spec")
        if spec.proxy_socket is not None and not Path(spec.proxy_socket).exists():
            raise SandboxError(f"proxy socket {spec.proxy_socket} does not exist; start the proxy first")
        ids = spec.host_ids or sandbox_host_ids()
        if self._private and 0 in ids:
            raise SandboxError(f"host_ids {ids} would run sandboxed code as host root; leave host_ids unset")
        if not self._private and ids != (os.getuid(), os.getgid()):
            raise SandboxError(f"host_ids {ids}: only root can run a sandbox as another uid; leave host_ids unset")
        self.host_ids = ids
        tmp = Path(self.tmp_root or tempfile.gettempdir())
        if self._private and not hostfs.others_can_reach(tmp):
            raise SandboxError(f"the sandbox uid cannot enter {tmp}: every folder on the way needs o+x "
                               "(`chmod o+x` it, or pass another tmp_root / TMPDIR)")
        if self._private:
            hostfs.ensure_reaper(_PREFIX, cgroup_parents() if self.use_cgroups else ())
            if str(tmp) not in _swept:
                _swept.add(str(tmp))
                hostfs.sweep_stale(tmp, _PREFIX)
                if self.use_cgroups:
                    sweep_stale_cgroups(cgroup_parents())
        root = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=tmp))
        self._dirs.append(root)
        self.root = root
        if self._private:  # the private folder is itself a small tmpfs (nothing on disk to create or delete)
            hostfs.mount_tmpfs(root, size_mb=1, uid=ids[0], gid=ids[1], mode=0o700)
            hostfs.make_private(root)
        for name, mode in (("home", 0o700), ("tmp", 0o1777), ("empty", 0o555)):
            (root / name).mkdir()
            os.chmod(root / name, mode)
        (root / "empty.txt").touch(mode=0o444)
        self._places = {"home": root / "home", "tmp": root / "tmp", "workspace": ws}
        if self._private:
            self._start_private(root, ws)
        self._mounts = self._plan_mounts()
        name = f"clawgym-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._wrapper, self.enforced_limits, self.unenforced_limits = plan_limits(
            spec.limits, self._cgroup if self.use_cgroups else None, name)
        if self._private:
            self._wrapper = [*self._wrapper, *setpriv_prefix(ids)]
        self._note_disk_limit()
        self._note_inode_limit()
        if spec.proxy_socket is not None and holder_possible():  # one relay, in a network namespace every exec joins
            relay = [inside_python(spec), "-I", "-S", RELAY_PY, str(spec.proxy_port), PROXY_SOCK]
            holder = RelayHolder(self._bwrap_command, relay, self.env(), str(root))
            self._holders.append(holder)
            holder.start()

    def _start_private(self, root: Path, ws: Path) -> None:
        """As root: size-limited tmpfs places in a folder only the sandbox uid enters; workspace copied in."""
        uid, gid = self.host_ids
        disk, inodes = self.spec.limits.disk_mb, self.spec.limits.inodes
        st = ws.stat()
        self._ws_owner = (st.st_uid, st.st_gid)
        (root / "ws").mkdir()
        (root / "ro").mkdir()
        for place, mode in (("home", 0o700), ("tmp", 0o1777), ("ws", st.st_mode & 0o777 | 0o700)):
            hostfs.mount_tmpfs(root / place, size_mb=disk, uid=uid, gid=gid, mode=mode, inodes=inodes)
        self._places["workspace"] = root / "ws"
        try:
            hostfs.copy_owned(ws, root / "ws", uid, gid)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            limit = "inodes" if hostfs.out_of_inodes(root / "ws") else "disk"
            quota = f"{inodes} entries" if limit == "inodes" else f"{disk} MiB"
            raise PlaceFullError(f"the workspace {ws} does not fit the sandbox's workspace ({quota}: "
                                 f"limits.{'inodes' if limit == 'inodes' else 'disk_mb'}); hand in fewer files "
                                 "or raise that limit", place="workspace", limit=limit) from exc

    def _note_disk_limit(self) -> None:
        disk = self.spec.limits.disk_mb
        if disk is None:
            return
        if self._private:
            self.enforced_limits["disk_mb"] = (f"{disk} MiB tmpfs each for the workspace, HOME, /tmp and /dev/shm "
                                               "(RAM-backed: also charged to the memory cgroup)")
        else:
            self.unenforced_limits["disk_mb"] = (f"only /dev/shm is limited ({disk} MiB tmpfs): size-limited private "
                                                 "mounts for the workspace, HOME and /tmp need root")

    def _note_inode_limit(self) -> None:
        inodes = self.spec.limits.inodes
        if inodes is None:
            return
        if self._private:
            self.enforced_limits["inodes"] = (f"tmpfs nr_inodes={inodes} each for the workspace, HOME and /tmp "
                                              "(/dev/shm: bounded by the memory limit)")
        else:
            self.unenforced_limits["inodes"] = ("the workspace, HOME and /tmp are host folders: private tmpfs "
                                                "mounts with nr_inodes need root")

    def full_disks(self) -> list[str]:
        """The writable places (``workspace``, ``home``, ``tmp``) whose quota is used up (call before close)."""
        if self.root is None or not self._private or self.spec.limits.disk_mb is None:
            return []
        return [name for name, p in self._places.items() if hostfs.is_full(p)]

    def full_inodes(self) -> list[str]:
        """The writable places whose ``inodes`` quota is used up (call before close)."""
        if self.root is None or not self._private or self.spec.limits.inodes is None:
            return []
        return [name for name, p in self._places.items() if hostfs.out_of_inodes(p)]

    def limits_hit(self) -> list[str]:
        """Full places (disk, inodes), an OOM kill and a CPU share held at its quota (see
        :meth:`Sandbox.limits_hit`); call before close."""
        cgroup = self._cgroup if self.use_cgroups else None
        return limit_tags(full_disks=self.full_disks(), full_inodes=self.full_inodes(),
                          oom_kills=cgroup.oom_kills() if cgroup else 0,
                          throttled_periods=cgroup.throttled_periods() if cgroup else 0)

    def peak_memory_bytes(self) -> int | None:
        """Peak memory of the sandbox's processes so far (from its memory cgroup; None without one)."""
        return self._cgroup.peak_memory_bytes() if self.use_cgroups else None

    def close(self) -> None:
        """Kill what is left, hand the workspace back (sanitized), delete the rest. Idempotent."""
        if self._finalizer is not None and self._finalizer.alive and self.root is not None:
            for proc in list(self._running):  # an exec running in another thread ends now, not at its timeout
                killpg(proc.pid)
            self._cgroup.destroy()
            try:
                self._hand_back()
            finally:
                self._finalizer()
        self.root = None

    def _hand_back(self) -> None:
        ws = Path(self.spec.workspace_host)
        if not self._private:
            hostfs.strip_setid(ws)
            return
        if not self.spec.hand_back:  # a scratch copy: its tmpfs goes with the rest
            return
        try:
            hostfs.clear_dir(ws)
            hostfs.copy_owned(self._places["workspace"], ws, *self._ws_owner)
        except OSError as e:
            raise SandboxError(f"could not copy the final workspace back to {ws}: {e}") from e

    # -- exec -----------------------------------------------------------------------------------
    def exec(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
             timeout: float | None = None, stdin: bytes | None = None) -> ExecResult:
        """Run ``argv`` under bwrap (see :meth:`Sandbox.exec`): its own process group, killed whole at
        ``timeout`` (an :class:`~clawgym_env.sandbox.deadline.AgentTimeout`: extended by its excused time);
        output kept up to ``max_output_bytes`` per stream (the tail)."""
        if not argv:
            raise SandboxError("exec needs a non-empty argv")
        if self.root is None:
            raise SandboxError("the sandbox is not open; use it as `with BwrapSandbox(spec) as sb:`")
        joined: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if self._holders:  # spawned from inside the relay holder's network namespace, which it keeps
            cmd, joined = self._bwrap_command(["--share-net"], list(argv), cwd), self._holders[0].joined()
        else:
            cmd = self.command(argv, cwd=cwd)
        t0 = time.monotonic()
        try:
            with joined:
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env(env),
                                        start_new_session=True, cwd=str(self.root))
        except OSError as e:
            raise SandboxError(f"could not start bwrap: {e}; fix: {_FIX}") from e
        deadline = Deadline.of(timeout, t0)  # an AgentTimeout's deadline moves by the time excused so far
        self._running.add(proc)
        try:
            out, err, timed_out = pump(proc, stdin, deadline, self.max_output_bytes)
            while not timed_out and proc.poll() is None:  # the pipes closed; the command may still run
                try:
                    proc.wait(None if deadline is None else deadline.poll_s())
                except subprocess.TimeoutExpired:
                    timed_out = deadline is not None and deadline.expired()
        finally:
            self._running.discard(proc)
            if proc.poll() is None:
                killpg(proc.pid)
            proc.wait()
        code, err = _not_run(proc.returncode, err)
        return ExecResult(returncode=code, stdout=out, stderr=err, timed_out=timed_out, wall_s=time.monotonic() - t0)


def _not_run(code: int, err: str) -> tuple[int, str]:
    """A command bwrap could not start is exit 127 (not found) or 126 (not runnable), as a shell (and the
    per-exec relay, and the Docker backend) report it, instead of bwrap's own exit 1."""
    last = err.rstrip("\n").rpartition("\n")[2]
    if code != 1 or not last.startswith("bwrap: execvp "):
        return code, err
    name, _, why = last[len("bwrap: execvp "):].rpartition(": ")
    if why == "No such file or directory":
        return 127, err + f"command not found: {name}\n"
    return 126, err + f"cannot run {name}: {why}\n"



__all__ = ["PROXY_SOCK", "READ_ONLY_PROC", "RELAY_PY", "RUN_DIR", "BwrapSandbox", "check_bwrap"]
