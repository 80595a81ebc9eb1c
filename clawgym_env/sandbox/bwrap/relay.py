"""The proxy relay of a bwrap sandbox, started once per sandbox instead of once per exec.

Each exec of a :class:`~clawgym_env.sandbox.bwrap.sandbox.BwrapSandbox` is its own ``bwrap`` with its own
namespaces, so a relay inside it (``relay.py PORT SOCK -- CMD``) used to start a Python interpreter on
every exec, before the command, to listen on ``127.0.0.1:PORT`` in that exec's network namespace: that
interpreter's start-up was nearly all of what the relay cost an exec (tens of milliseconds). Here, when
this process is root, the sandbox starts one *holder* at ``__enter__``: a ``bwrap`` with the sandbox's
own mounts, limits and uid, running the relay in server mode in a fresh network namespace (loopback
only). Every exec then runs in that network namespace: the thread that spawns its ``bwrap`` enters the
namespace for the spawn (``setns``, :meth:`RelayHolder.joined`) and returns, and ``bwrap --unshare-all
--share-net`` keeps it; the exec's other namespaces are its own as before. No process is added to an exec.

Invariants:
  * The holder's namespace has loopback only, like an exec's own: the relay's ``127.0.0.1:PORT`` is the
    only way out, to the episode's socket. Execs of one sandbox share it (a port an exec's process listens
    on is visible to the sandbox's other execs while it runs); execs of different sandboxes never do.
  * Readiness is signalled, not polled: the relay writes ``ready`` on its stdout once it listens, and the
    sandbox waits for that line (at most :data:`READY_TIMEOUT_S` from the holder's start) before its first
    exec; the holder starts at ``__enter__``, so its start overlaps what the caller does until then.
  * The namespace an exec joins is the holder's: it is opened once, when the relay is ready, and checked
    against the namespace inode bwrap reported (``--info-fd``); an exec whose holder died restarts it first.
  * The spawning thread is back in its own network namespace before :meth:`RelayHolder.joined` returns
    (or it raises); no other thread moves, and nothing but the spawn runs while it is away.
  * The holder runs under the sandbox's limits (cgroup, rlimits) and uid, and dies with the sandbox
    (:meth:`RelayHolder.stop`, the cgroup, ``--die-with-parent``). ``--die-with-parent`` follows the
    *thread* that started it: a sandbox opened in a thread that ends before the sandbox is closed loses
    its holder then, and its next exec starts a new one (connections open at that moment are cut).
  * Only as root (``setns`` needs ``CAP_SYS_ADMIN``; :func:`holder_possible`); otherwise each exec starts
    the relay itself as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox.bwrap.run import killpg

READY_TIMEOUT_S = 10.0


_CLONE_NEWNET = 0x40000000


def holder_possible() -> bool:
    """Whether a holder can serve this process's sandboxes: root (``setns`` needs ``CAP_SYS_ADMIN``) on a
    system where this thread can name its own network namespace."""
    return os.getuid() == 0 and os.path.exists("/proc/thread-self/ns/net") and _setns_fn() is not None


def _setns_fn() -> Callable[[int, int], None] | None:
    """``setns(fd, nstype)``: :func:`os.setns` (Python 3.12+) or libc's through ctypes."""
    fn = getattr(os, "setns", None)
    if fn is not None:
        return fn
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        raw = libc.setns
    except (OSError, AttributeError):
        return None

    def setns(fd: int, nstype: int) -> None:
        if raw(fd, nstype) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    return setns


def _read_until(fd: int, deadline: float, done: Callable[[bytes], bool]) -> bytes:
    data = b""
    while not done(data):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data


def _json_complete(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


class RelayHolder:
    """One sandbox's relay holder (see the module invariants).

    ``build(bwrap_opts, argv)`` is the sandbox's full host command line for ``argv`` with extra ``bwrap``
    options (here ``--info-fd``); ``relay_argv`` the relay's server-mode command inside.
    """

    def __init__(self, build: Callable[[list[str], list[str]], list[str]], relay_argv: list[str],
                 env: Mapping[str, str], cwd: str) -> None:
        self._build, self._relay_argv, self._env, self._cwd = build, relay_argv, dict(env), cwd
        self.proc: subprocess.Popen | None = None
        self.pid = 0
        self.netns_inode = 0
        self._info_fd = -1  # bwrap's --info-fd, read end, until the holder was seen ready
        self._ns_fd = -1  # the holder's network namespace, opened once it was seen ready
        self._deadline = 0.0
        self._lock = threading.Lock()  # execs from several threads: one check (and restart) at a time

    def start(self) -> None:
        """Start the holder; its readiness is awaited by the first :meth:`netns` (so the relay's start overlaps
        whatever the caller does before its first exec)."""
        read_fd, write_fd = os.pipe()
        try:
            cmd = self._build(["--info-fd", str(write_fd)], self._relay_argv)
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, pass_fds=(write_fd,), env=self._env,
                                         cwd=self._cwd, start_new_session=True)
        except OSError as e:
            os.close(read_fd)
            raise SandboxError(f"could not start the sandbox's relay: {e}") from e
        finally:
            os.close(write_fd)
        self._info_fd, self._deadline = read_fd, time.monotonic() + READY_TIMEOUT_S

    def _await_ready(self) -> None:
        """Wait until the relay listens (SandboxError naming the cause otherwise); read bwrap's facts."""
        proc, read_fd = self.proc, self._info_fd
        assert proc is not None and proc.stdout is not None and read_fd >= 0
        try:
            info = _read_until(read_fd, self._deadline, _json_complete)
            ready = _read_until(proc.stdout.fileno(), self._deadline, lambda d: b"\n" in d)
        finally:
            os.close(read_fd)
            self._info_fd = -1
        if not _json_complete(info) or not ready.startswith(b"ready"):
            if proc.poll() is None:
                killpg(proc.pid)
            proc.wait()  # then what it wrote on stderr (read before stop() closes the pipe)
            raw = _read_until(proc.stderr.fileno(), time.monotonic() + 2, lambda d: False) if proc.stderr else b""
            err = raw.decode(errors="replace")[-2000:]
            self.stop()
            raise SandboxError(f"the sandbox's proxy relay did not start (exit {proc.returncode}, waited at most "
                               f"{READY_TIMEOUT_S:.0f} s): {err.strip() or 'no output'}; check that bwrap works "
                               "and that the proxy socket exists")
        facts = json.loads(info)
        self.pid, self.netns_inode = int(facts["child-pid"]), int(facts["net-namespace"])
        fd = os.open(f"/proc/{self.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(fd).st_ino != self.netns_inode:  # the pid is no longer the holder's
            os.close(fd)
            self.stop()
            raise SandboxError("the sandbox's proxy relay ended as it started; check the proxy socket")
        self._ns_fd = fd

    def _checked_fd(self) -> int:
        """An fd of the holder's network namespace once its relay listens (a holder that died is restarted).
        Call with the lock held."""
        if self._info_fd >= 0:
            self._await_ready()
        if self.proc is None or self.proc.poll() is not None or self._ns_fd < 0:
            self.stop()
            self.start()
            self._await_ready()
        return self._ns_fd

    @contextlib.contextmanager
    def joined(self) -> Iterator[None]:
        """Run the body (the spawning of an exec's ``bwrap``) with this thread in the holder's network
        namespace, so the child starts there; the thread is back in its own before this returns.
        Only this thread moves (a network namespace is per thread); execs are spawned one at a time."""
        setns = _setns_fn()
        assert setns is not None
        with self._lock:
            target = self._checked_fd()
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                setns(target, _CLONE_NEWNET)
                try:
                    yield
                finally:
                    setns(home, _CLONE_NEWNET)  # raises (and the thread must not go on) if it cannot return
            finally:
                os.close(home)

    def prefix(self) -> list[str]:
        """An exec's host command line prefix that joins the holder's network namespace (for running
        :meth:`~clawgym_env.sandbox.bwrap.sandbox.BwrapSandbox.command` by hand; ``exec`` uses :meth:`joined`)."""
        nsenter = shutil.which("nsenter")
        if nsenter is None:
            raise SandboxError("running a sandbox command by hand needs nsenter (util-linux); use exec()")
        with self._lock:
            self._checked_fd()
            return [nsenter, f"--net=/proc/{self.pid}/ns/net", "--"]

    def stop(self) -> None:
        """Kill the holder (its whole process group) and reap it. Idempotent."""
        proc, self.proc = self.proc, None
        for fd in (self._info_fd, self._ns_fd):
            if fd >= 0:
                os.close(fd)
        self._info_fd = self._ns_fd = -1
        if proc is None:
            return
        if proc.poll() is None:
            killpg(proc.pid)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
