"""Process launcher for the Docker sandbox backend, run *inside* the container (stdlib only).

Usage (the backend copies this file to ``/.clawgym/launch.py``, read-only):

* ``launch.py init [RELAY_CMD...]``: pid 1 of the container. Reaps every orphan; with a relay
  command it runs it as a child and exits when (and with the code that) the relay exits. It also
  exits as soon as its stdin reaches EOF: the backend holds the container's only stdin attachment
  (``stdin_once``), so when the host process that owns the sandbox dies, for any reason, pid 1 exits
  and the engine kills every process of the container and removes it.
* ``launch.py run TAG PORT CPU_S KEEP_HOSTNAME CWD -- CMD...``: one ``exec``. Applies RLIMIT_CPU
  (when CPU_S > 0), enters CWD, waits (at most 10 s) for the relay on 127.0.0.1:PORT (when PORT > 0),
  runs CMD, then kills every process of the tree and exits with CMD's code (128+N for signal N).
* ``launch.py sweep TAG``: SIGKILL every process of the tree TAG (used when an exec times out).

Invariant: the tree TAG is every process whose environment carries ``CLAWGYM_SANDBOX_EXEC=TAG``
(the backend sets it on each exec; children inherit it) plus every descendant of one, so after
``run`` returns or ``sweep`` ends no process of that exec is left, daemonised or not.
"""

from __future__ import annotations

import os
import signal
import sys
import time

TAG_VAR = "CLAWGYM_SANDBOX_EXEC"
REAP_WAIT_S = 2.0


def spawn(cmd: list[str], env: dict[str, str] | None = None) -> int:
    """fork + exec (cheaper to import than subprocess); a child that cannot exec exits 127/126."""
    pid = os.fork()
    if pid == 0:
        try:
            os.execvpe(cmd[0], cmd, os.environ if env is None else env)
        except OSError as exc:
            why = "command not found" if isinstance(exc, FileNotFoundError) else f"cannot run ({exc.strerror})"
            os.write(2, f"sandbox: {why}: {cmd[0]}\n".encode())
            os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
    return pid


def tagged(tag: str, me: int) -> set[int]:
    """Pids carrying TAG_VAR=tag in their environment, plus all their descendants."""
    want, parent, hits = f"{TAG_VAR}={tag}".encode(), {}, set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                parent[pid] = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    hits.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    grew = True
    while grew:
        new = {p for p, pp in parent.items() if pp in hits and p not in hits}
        hits |= new
        grew = bool(new)
    hits.discard(me)
    return hits


def sweep(tag: str) -> None:
    """Kill the tree until a scan finds nothing left (new forks are caught by the next scan), then
    wait (at most ``REAP_WAIT_S``) until every killed pid is reaped: a killed process stays in /proc
    as a zombie until its parent (or pid 1, for an orphan) collects it, and only then is it gone."""
    killed: set[int] = set()
    for _ in range(200):
        pids = tagged(tag, os.getpid())
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        killed |= pids
        time.sleep(0.005)
    deadline = time.monotonic() + REAP_WAIT_S
    while killed and time.monotonic() < deadline:
        killed = {pid for pid in killed if os.path.exists(f"/proc/{pid}")}
        if killed:
            time.sleep(0.005)


def wait_for_port(port: int, limit_s: float) -> None:
    """Wait until the relay accepts on 127.0.0.1:port (it starts with the container)."""
    import socket

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)


def run(tag: str, port: int, cpu_s: int, keep_hostname: bool, cwd: str, cmd: list[str]) -> int:
    """``launch.py run``: one exec (see the module docstring); returns CMD's exit code, 128+N for signal N."""
    if cpu_s:
        import resource
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    try:
        os.chdir(cwd)
    except OSError as exc:
        sys.stderr.write(f"sandbox: cannot enter {cwd}: {exc.strerror}\n")
        return 1
    if port:
        wait_for_port(port, 10.0)
    env = dict(os.environ)
    if not keep_hostname:
        env.pop("HOSTNAME", None)  # Docker adds it; the bwrap backend's environment has none
    child = spawn(cmd, env)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(child, s))
    _, status = os.waitpid(child, 0)
    sweep(tag)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _exit_on_eof() -> None:
    """Block on stdin; at EOF (the owner's attachment is gone) end the whole container."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os._exit(0)


def init(cmd: list[str]) -> None:
    """pid 1: reap every orphan; with a relay command, live exactly as long as the relay; end when
    stdin reaches EOF."""
    import threading

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    # SIGCHLD is blocked in every thread (the EOF thread inherits the mask) and taken with
    # sigtimedwait: with no child of its own, pid 1 still wakes the moment an orphan reparented to
    # it dies, so a killed exec's processes are reaped at once, not after a polling interval.
    # The relay is spawned first: a signal mask survives exec, and the relay must not inherit it.
    relay = spawn(cmd) if cmd else None
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    threading.Thread(target=_exit_on_eof, daemon=True).start()
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            signal.sigtimedwait({signal.SIGCHLD}, 1.0)
            continue
        if pid == relay:
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main(argv: list[str]) -> int:
    """Dispatch ``init``, ``run`` or ``sweep``; 2 with a usage line for anything else."""
    if argv[:1] == ["init"]:
        init(argv[1:])
    if argv[:1] == ["sweep"] and len(argv) == 2:
        sweep(argv[1])
        return 0
    if argv[:1] == ["run"] and len(argv) >= 8 and argv[6] == "--":
        return run(argv[1], int(argv[2]), int(argv[3]), argv[4] == "1", argv[5], argv[7:])
    sys.stderr.write("usage: launch.py init [CMD...] | run TAG PORT CPU_S KEEP_HOSTNAME CWD -- CMD... | sweep TAG\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
