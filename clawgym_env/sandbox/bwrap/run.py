"""Running ``bwrap`` for the bwrap backend: the availability probe, the uid drop and user namespace
arguments, and the output pump of one exec.

Invariants:
  * :func:`check_bwrap` probes once per process and mode, as the sandbox would run (through the uid
    drop when this process is root), and raises :class:`SandboxError` naming the fix;
  * :func:`pump` keeps at most ``keep`` bytes of each of stdout/stderr (the tail) and kills the whole
    process group at the deadline (then drains for at most 10 s more); the deadline is read afresh at every
    check, so an extendable one (:class:`~clawgym_env.sandbox.deadline.Deadline`) holds as it is extended.
"""

from __future__ import annotations

import collections
import os
import selectors
import shutil
import signal
import subprocess
import threading
from typing import IO, cast

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox.base import SANDBOX_ID_BASE
from clawgym_env.sandbox.deadline import Deadline

_FIX = ("install bubblewrap (`apt-get install bubblewrap`) and allow unprivileged user namespaces "
        "(`sysctl -w kernel.unprivileged_userns_clone=1 user.max_user_namespaces=15000`, and "
        "`kernel.apparmor_restrict_unprivileged_userns=0` on Ubuntu >= 23.10; inside Docker run with "
        "`--security-opt seccomp=unconfined --security-opt apparmor=unconfined`), or use the docker backend")
_probe_lock = threading.Lock()
_probe_cache: dict[tuple[bool, bool], tuple[bool, str]] = {}


def check_bwrap(unprivileged: bool = True) -> str:
    """Return the path of a working ``bwrap``, or raise :class:`SandboxError` with the fix.

    The check runs a trivial sandbox (``bwrap ... true``, as a sandbox uid when this process is root)
    once per process and mode; the answer is cached.
    """
    key = (unprivileged, os.getuid() == 0)
    with _probe_lock:
        if key not in _probe_cache:
            _probe_cache[key] = _probe(unprivileged)
        ok, detail = _probe_cache[key]
    if not ok:
        raise SandboxError(f"bubblewrap sandbox unavailable: {detail}; fix: {_FIX}")
    return detail


def _probe(unprivileged: bool) -> tuple[bool, str]:
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "`bwrap` not found on PATH"
    drop: list[str] = []
    if os.getuid() == 0:
        if shutil.which("setpriv") is None:
            return False, "`setpriv` (util-linux) not found on PATH: needed to run sandboxes as an unprivileged uid"
        drop = setpriv_prefix((SANDBOX_ID_BASE, SANDBOX_ID_BASE))
    argv = [*drop, exe, "--unshare-all", *user_args(unprivileged), "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        res = subprocess.run(argv, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"`bwrap ... true` failed: {e}"
    if res.returncode != 0:
        return False, f"`bwrap ... true` exited {res.returncode}: {res.stderr.decode(errors='replace').strip()}"
    return True, exe


def setpriv_prefix(ids: tuple[int, int]) -> list[str]:
    """Prefix that drops from root to ``ids`` (no supplementary groups, capabilities gone with root)."""
    return [shutil.which("setpriv") or "setpriv", f"--reuid={ids[0]}", f"--regid={ids[1]}", "--clear-groups", "--"]


def user_args(unprivileged: bool) -> list[str]:
    """Always a user namespace: uid 1000 inside, or root inside that is the unprivileged host uid."""
    uid = "1000" if unprivileged else "0"
    return ["--unshare-user", "--uid", uid, "--gid", uid]



def pump(proc: subprocess.Popen, stdin: bytes | None, deadline: Deadline | None, keep: int) -> tuple[str, str, bool]:
    """Feed stdin and collect the output tails until both pipes close; kill the group at ``deadline``."""
    if proc.stdout is None or proc.stderr is None:
        raise ValueError("pump needs a process started with stdout=PIPE and stderr=PIPE")
    bufs: dict[IO[bytes], bytearray] = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    dropped: collections.Counter[IO[bytes]] = collections.Counter()
    timed_out = False
    with selectors.DefaultSelector() as sel:
        for f in bufs:
            sel.register(f, selectors.EVENT_READ)
        pending = memoryview(stdin or b"")
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            if pending:
                sel.register(proc.stdin, selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
        while sel.get_map():
            events = sel.select(None if deadline is None else deadline.poll_s())
            if deadline is not None and deadline.expired():
                if timed_out:
                    break  # something kept the pipes open past the grace period
                timed_out = True
                killpg(proc.pid)
                deadline = Deadline.after(10)  # drain what is left after the kill
            for key, _ in events:
                f = cast(IO[bytes], key.fileobj)  # only the process's pipes are registered
                if f is proc.stdin:
                    try:
                        pending = pending[os.write(f.fileno(), pending[:65536]):]
                    except BrokenPipeError:
                        pending = pending[:0]
                    except BlockingIOError:
                        continue
                    if not pending:
                        sel.unregister(f)
                        f.close()
                    continue
                chunk = os.read(f.fileno(), 65536)
                if not chunk:
                    sel.unregister(f)
                    continue
                buf = bufs[f]
                buf += chunk
                if len(buf) > 2 * keep:
                    dropped[f] += len(buf) - keep
                    del buf[:-keep]
    out = []
    for f, buf in bufs.items():
        if len(buf) > keep:
            dropped[f] += len(buf) - keep
            del buf[:-keep]
        text = buf.decode("utf-8", errors="replace")
        out.append(f"[... {dropped[f]} bytes dropped ...]\n{text}" if dropped[f] else text)
    return out[0], out[1], timed_out


def killpg(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads; a group already gone is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
