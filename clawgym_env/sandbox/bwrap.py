"""Bubblewrap (``bwrap``) namespace sandbox.

Each :meth:`BwrapSandbox.exec` is one ``bwrap`` invocation with the same mounts, so the sandbox is
stateless apart from three host folders: the workspace (``spec.workspace_host``) and a private HOME
and ``/tmp``, which the sandbox object owns (created by ``__enter__``, deleted by ``close``).

Invariants:
  * every exec runs with ``--unshare-all`` (user, pid, net, ipc, uts, cgroup namespaces),
    ``--die-with-parent``, ``--new-session``, ``--cap-drop ALL``, a read-only root, a fresh
    ``/proc`` and a minimal ``/dev``; the only network is loopback, plus the relay to
    ``spec.proxy_socket`` when that is set (the relay listens before the command starts);
  * the environment inside is built from scratch (never the host's), see :meth:`BwrapSandbox.env`;
  * bind mounts are applied parents first (sorted by depth), so toolchain paths and the workspace
    may lie under the private HOME;
  * an exec that times out has its whole process tree killed (process group of ``bwrap``; the pid
    namespace takes every process inside with it) and returns ``ExecResult(timed_out=True)``;
  * captured stdout/stderr keep at most ``max_output_bytes`` each (the tail);
  * ``read_file``/``write_file`` resolve paths (symlinks included) as the sandbox sees them and
    only ever touch host files under the folders mounted there; writes go to writable mounts only;
  * ``enforced_limits`` says how each limit is enforced, ``unenforced_limits`` why one is not;
  * the sandbox uid maps to the host uid running this process, so files under ``/etc`` and ``/opt``
    that other users may not read (``/etc/shadow``, ``/etc/ssl/private``...) are masked with empty ones.
"""

from __future__ import annotations

import collections
import os
import posixpath
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path, PurePosixPath
from typing import Mapping, Sequence

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox._hostside import SCAN_FOR_SECRETS, Cgroup, plan_limits, unreadable_entries
from clawgym_env.sandbox.base import ExecResult, Sandbox, SandboxSpec

RUN_DIR = "/run/clawgym"
PROXY_SOCK = f"{RUN_DIR}/proxy.sock"
RELAY_PY = f"{RUN_DIR}/relay.py"
_RELAY_HOST = Path(__file__).with_name("relay.py")
_FIX = ("install bubblewrap (`apt-get install bubblewrap`) and allow unprivileged user namespaces "
        "(`sysctl -w kernel.unprivileged_userns_clone=1 user.max_user_namespaces=15000`, and "
        "`kernel.apparmor_restrict_unprivileged_userns=0` on Ubuntu >= 23.10; inside Docker run with "
        "`--security-opt seccomp=unconfined --security-opt apparmor=unconfined`), or use the docker backend")
_probe_lock = threading.Lock()
_probe_cache: dict[bool, tuple[bool, str]] = {}


def check_bwrap(unprivileged: bool = True) -> str:
    """Return the path of a working ``bwrap``, or raise :class:`SandboxError` with the fix.

    The check runs a trivial sandbox (``bwrap ... true``) once per process and mode; the answer is cached.
    """
    with _probe_lock:
        if unprivileged not in _probe_cache:
            _probe_cache[unprivileged] = _probe(unprivileged)
        ok, detail = _probe_cache[unprivileged]
    if not ok:
        raise SandboxError(f"bubblewrap sandbox unavailable: {detail}; fix: {_FIX}")
    return detail


def _probe(unprivileged: bool) -> tuple[bool, str]:
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "`bwrap` not found on PATH"
    argv = [exe, "--unshare-all", *_user_args(unprivileged), "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        res = subprocess.run(argv, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"`bwrap ... true` failed: {e}"
    if res.returncode != 0:
        return False, f"`bwrap ... true` exited {res.returncode}: {res.stderr.decode(errors='replace').strip()}"
    return True, exe


def _user_args(unprivileged: bool) -> list[str]:
    if unprivileged:
        return ["--unshare-user", "--uid", "1000", "--gid", "1000"]
    if os.getuid() != 0:  # a non-root host user can only be root inside through a user namespace
        return ["--unshare-user", "--uid", "0", "--gid", "0"]
    return []


def _release(root: list[Path], cgroup: Cgroup) -> None:
    """Last-resort and normal cleanup; referenced by a finalizer, so it must not reference the sandbox."""
    cgroup.destroy()
    for d in root:
        shutil.rmtree(d, ignore_errors=True)
    root.clear()


class BwrapSandbox(Sandbox):
    """A sandbox made of ``bwrap`` invocations. Use as ``with BwrapSandbox(spec) as sb: ...``.

    Args:
        spec: what to mount and which limits to apply.
        max_output_bytes: how much of each of stdout/stderr an exec keeps (the last bytes).
        use_cgroups: try cgroups for memory/process limits (else only rlimits are used).
        tmp_root: host folder under which the private HOME and /tmp are created (default: the
            host's temp dir).
    """

    def __init__(self, spec: SandboxSpec, *, max_output_bytes: int = 1 << 20, use_cgroups: bool = True,
                 tmp_root: Path | None = None) -> None:
        self.spec = spec
        self.max_output_bytes = max_output_bytes
        self.use_cgroups = use_cgroups
        self.tmp_root = tmp_root
        self.root: Path | None = None
        """Host folder holding ``home/`` and ``tmp/`` while the sandbox is open."""
        self.enforced_limits: dict[str, str] = {}
        self.unenforced_limits: dict[str, str] = {}
        self._dirs: list[Path] = []
        self._cgroup = Cgroup()
        self._finalizer: weakref.finalize | None = None
        self._wrapper: list[str] = []
        self._bwrap = "bwrap"
        self._mounts: list[tuple[str, str, str]] = []  # (kind, host source, target)
        self._tbl: list[tuple[str, Path, bool]] = []  # (target, real host source, writable)

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> "BwrapSandbox":
        if self._finalizer is not None:
            raise SandboxError("this BwrapSandbox was already started; create a new one")
        self._finalizer = weakref.finalize(self, _release, self._dirs, self._cgroup)
        try:
            self._start()
        except BaseException:
            self.close()
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
        root = Path(tempfile.mkdtemp(prefix="clawgym-bwrap-", dir=self.tmp_root))
        self._dirs.append(root)
        self.root = root
        (root / "home").mkdir(mode=0o700)
        (root / "tmp").mkdir()
        (root / "empty").mkdir(mode=0o555)
        (root / "empty.txt").touch(mode=0o444)
        os.chmod(root / "tmp", 0o1777)
        self._mounts = self._plan_mounts()
        name = f"clawgym-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._wrapper, self.enforced_limits, self.unenforced_limits = plan_limits(
            spec.limits, self._cgroup if self.use_cgroups else None, name)

    def peak_memory_bytes(self) -> int | None:
        """Peak memory of the sandbox's processes so far (from its memory cgroup; None without one)."""
        return self._cgroup.peak_memory_bytes() if self.use_cgroups else None

    def close(self) -> None:
        """Kill what is left in the sandbox's cgroup and delete its folders. Idempotent."""
        if self._finalizer is not None:
            self._finalizer()
        self.root = None

    # -- planning -------------------------------------------------------------------------------
    def _plan_mounts(self) -> list[tuple[str, str, str]]:
        spec, root = self.spec, self.root
        assert root is not None
        private = {posixpath.normpath(spec.home), "/tmp", posixpath.normpath(spec.workspace_target)}
        mounts = [("--bind", str(root / "home"), spec.home), ("--bind", str(root / "tmp"), "/tmp")]
        mounts += [("--ro-bind", str(p), str(p)) for p in spec.ro_paths if str(p) not in private]
        mounts += [("--bind" if rw else "--ro-bind", str(h), t) for h, t, rw in spec.extra_binds]
        mounts.append(("--bind", str(spec.workspace_host), spec.workspace_target))
        for top in SCAN_FOR_SECRETS:
            if top in map(str, spec.ro_paths):
                mounts += [("--ro-bind", str(root / ("empty" if is_dir else "empty.txt")), p)
                           for p, is_dir in unreadable_entries(top)]
        if spec.proxy_socket is not None:
            mounts += [("--bind", str(spec.proxy_socket), PROXY_SOCK), ("--ro-bind", str(_RELAY_HOST), RELAY_PY)]
        return sorted(mounts, key=lambda m: len(PurePosixPath(m[2]).parts))  # stable: parents first

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment inside: a clean PATH, HOME, TMPDIR, LANG, then ``spec.env``, then ``extra``."""
        spec = self.spec
        visible = [str(p) for p in spec.ro_paths]
        path = [os.path.dirname(sys.executable), str(Path(sys.base_prefix) / "bin")]
        path += [d for d in os.environ.get("PATH", "").split(os.pathsep)
                 if d and any(d == v or d.startswith(v.rstrip("/") + "/") for v in visible)]
        path += ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        env = {"PATH": ":".join(dict.fromkeys(path)), "HOME": spec.home, "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "USER": "sandbox" if spec.unprivileged else "root"}
        if spec.proxy_socket is not None:
            env["CLAWGYM_PROXY_URL"] = f"http://127.0.0.1:{spec.proxy_port}"
        env.update(spec.env)
        env.update(extra or {})
        return env

    def command(self, argv: Sequence[str], *, cwd: str | None = None) -> list[str]:
        """The full host command line (limits wrapper + bwrap + relay) for ``argv``."""
        if self.root is None:
            raise SandboxError("the sandbox is not open; use it as `with BwrapSandbox(spec) as sb:`")
        spec = self.spec
        cmd = [*self._wrapper, self._bwrap, "--unshare-all", *_user_args(spec.unprivileged), "--die-with-parent",
               "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev"]
        for kind, src, target in self._mounts:
            cmd += [kind, src, target]
        cmd += ["--remount-ro", "/", "--chdir", cwd or spec.workspace_target, "--"]
        if spec.proxy_socket is not None:
            cmd += [_inside_python(spec), "-I", "-S", RELAY_PY, str(spec.proxy_port), PROXY_SOCK, "--"]
        return cmd + list(argv)

    # -- exec -----------------------------------------------------------------------------------
    def exec(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
             timeout: float | None = None, stdin: bytes | None = None) -> ExecResult:
        if not argv:
            raise SandboxError("exec needs a non-empty argv")
        cmd = self.command(argv, cwd=cwd)
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env(env),
                                    start_new_session=True, cwd=str(self.root))
        except OSError as e:
            raise SandboxError(f"could not start bwrap: {e}; fix: {_FIX}") from e
        deadline = None if timeout is None else t0 + timeout
        try:
            out, err, timed_out = self._pump(proc, stdin, deadline)
            if not timed_out:  # the pipes closed; the command itself may still run (output redirected)
                try:
                    proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
        finally:
            if proc.poll() is None:
                _killpg(proc.pid)
            proc.wait()
        return ExecResult(returncode=proc.returncode, stdout=out, stderr=err, timed_out=timed_out,
                          wall_s=time.monotonic() - t0)

    def _pump(self, proc: subprocess.Popen, stdin: bytes | None, deadline: float | None) -> tuple[str, str, bool]:
        """Feed stdin and collect the output tails until both pipes close; kill the group at ``deadline``."""
        keep = self.max_output_bytes
        bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
        dropped = collections.Counter()
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
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                events = sel.select(wait)
                if deadline is not None and time.monotonic() >= deadline:
                    if timed_out:
                        break  # something kept the pipes open past the grace period
                    timed_out = True
                    _killpg(proc.pid)
                    deadline = time.monotonic() + 10  # drain what is left after the kill
                for key, _ in events:
                    f = key.fileobj
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

    # -- files ----------------------------------------------------------------------------------
    def _table(self) -> list[tuple[str, Path, bool]]:
        if self.root is None:
            raise SandboxError("the sandbox is not open; use it as `with BwrapSandbox(spec) as sb:`")
        if not self._tbl:  # bwrap follows a symlinked bind source on the host, so the table does too
            self._tbl = [(posixpath.normpath(t), Path(os.path.realpath(src)), kind == "--bind")
                         for kind, src, t in self._mounts]
        return self._tbl

    def _map(self, inside: str) -> tuple[Path, bool] | None:
        """The host path behind ``inside`` (already symlink-free) and whether it is writable."""
        best = None
        for target, host, rw in self._table():
            if inside == target or inside.startswith(target.rstrip("/") + "/"):
                if best is None or len(target) >= len(best[0]):
                    best = (target, host, rw)
        if best is None:
            return None
        rel = inside[len(best[0]):].lstrip("/")
        return (best[1] / rel if rel else best[1]), best[2]

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
            if mapped is not None and mapped[0].is_symlink():
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
        return mapped

    def read_file(self, path: str) -> bytes:
        host, _ = self._resolve(path)
        try:
            return host.read_bytes()
        except OSError as e:
            raise SandboxError(f"cannot read {path!r} in the sandbox: {e.strerror}") from e

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        host, writable = self._resolve(path)
        if not writable:
            raise SandboxError(f"{path!r} is read-only in the sandbox; write under {self.spec.workspace_target}, "
                               f"{self.spec.home} or /tmp")
        if isinstance(data, str):
            data = data.encode()
        try:
            host.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                os.fchmod(f.fileno(), mode)
        except OSError as e:
            raise SandboxError(f"cannot write {path!r} in the sandbox: {e.strerror}") from e


def _inside_python(spec: SandboxSpec) -> str:
    """This Python when the sandbox sees it (it is under a read-only path), else ``python3`` from PATH."""
    exe = os.path.abspath(sys.executable)
    visible = any(exe.startswith(str(p).rstrip("/") + "/") for p in spec.ro_paths)
    return exe if visible else "python3"


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
