"""Docker sandbox backend: one long-lived container per sandbox; ``exec`` is ``docker exec``.

Same contract and observable behaviour as the bubblewrap backend (see base.py and bwrap.py):

* **Image.** ``clawgym/hostroot:1`` holds a few empty folders and nothing else; it is imported
  locally (never pulled) the first time it is missing. The container root is read-only; all a
  program can use is bind-mounted (parents before children): ``spec.ro_paths`` read-only at the same
  paths, the workspace read-write at ``spec.workspace_target``, and a private HOME and ``/tmp`` that
  this object creates on the host (under ``tmp_root``) and deletes in ``close()``.
* **Isolation.** ``network_mode="none"`` (loopback only). With ``spec.unprivileged`` programs run as
  uid/gid 1000 (the caller's ids when the caller is not root), without capabilities, with
  ``no-new-privileges``; the workspace is chowned to that user at start and ``close()`` gives every
  entry back to the owner of the workspace folder. As root inside (``unprivileged=False``), the
  root-only files under ``/etc`` and ``/opt`` are masked with empty ones, as bwrap does.
* **pid 1 and proxy.** pid 1 is ``docker_launch.py init`` (copied in read-only), running as the
  caller's uid without capabilities; it reaps orphans. With ``spec.proxy_socket`` it runs
  ``relay.py`` for the container's whole life on ``127.0.0.1:proxy_port`` (the socket file is bound
  at ``/.clawgym/proxy.sock``, so a proxy must keep its socket for the sandbox's life) and the
  container ends with the relay. Docker's ``init=True`` cannot
  be used: its ``/sbin/docker-init`` is hidden by the host's read-only ``/sbin``.
* **exec.** Each command runs under ``docker_launch.py run``, which marks its process tree with a
  fresh ``CLAWGYM_SANDBOX_EXEC`` value; when the command ends or its timeout passes, every process
  carrying the mark (or descending from one) is SIGKILLed, so nothing outlives its ``exec`` (as with
  bwrap's pid namespace). A timed-out exec returns ``timed_out=True`` and returncode -9. stdout and
  stderr keep their last ``max_output_bytes`` each. Defaults: cwd = ``spec.workspace_target``; env
  built from scratch: PATH, HOME, TMPDIR, LANG=C.UTF-8, USER, CLAWGYM_PROXY_URL (with a proxy), then
  ``spec.env``, then the exec's ``env``.
* **Files.** ``read_file``/``write_file`` use the host side of a writable bind (HOME, /tmp, the
  workspace, writable extra binds) when the path's host location stays inside that bind; anything
  else (read-only toolchain paths, symlinks that leave their bind) is read or written by a command
  running as the sandbox user inside the container, so both see exactly what the sandbox sees.
  Failures raise SandboxError.
* **Limits.** ``memory_mb`` → cgroup memory without swap and ``max_procs`` → cgroup pids (both for
  the whole container), ``open_files`` → RLIMIT_NOFILE, ``cpu_s`` → RLIMIT_CPU per exec'd process (so
  the long-lived relay is exempt). Every limit that is not None lands in exactly one of
  ``enforced_limits`` (how) and ``unenforced_limits`` (why not).
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox._docker_stream import pump
from clawgym_env.sandbox.base import ExecResult, Sandbox, SandboxSpec

IMAGE = "clawgym/hostroot:1"
CTL_DIR = "/.clawgym"  # read-only folder inside: the launcher and the relay
PROXY_SOCK = f"{CTL_DIR}/proxy.sock"  # the proxy's unix socket, bound here
SANDBOX_UID = 1000
TAG_VAR = "CLAWGYM_SANDBOX_EXEC"
FIX = ("start a Docker engine with `scripts/dockerd.sh start` (install it first with "
       "`scripts/dockerd.sh --install start` or `apt-get install -y docker.io`), or use the bwrap backend")
_image_lock = threading.Lock()


def connect():
    """A DockerClient that has answered a ping, or SandboxError saying how to get one."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxError("the Docker backend needs the docker SDK: pip install 'clawgym[docker]'") from exc
    try:
        client = docker.from_env(timeout=120)
        client.ping()
        return client
    except Exception as exc:  # DockerException, requests errors: all mean "no engine here"
        raise SandboxError(f"no Docker engine answers ({str(exc).strip()[:300]}); fix: {FIX}") from exc


def ensure_image(client, tag: str = IMAGE) -> str:
    """Create the empty host-root image ``tag`` locally if it is missing (import, never pull)."""
    import docker

    with _image_lock:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name in ("tmp", "root", "proc", "dev", "sys", "etc", "usr", "run"):
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
                tar.addfile(info)
        repo, _, version = tag.rpartition(":")
        client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=version,
                                          changes=["LABEL org.clawgym.role=hostroot"])
        client.images.get(tag)
        return tag


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class DockerSandbox(Sandbox):
    """A sandbox backed by one Docker container (see the module docstring for the invariants).

    Args:
        spec: what to mount and which limits to apply.
        max_output_bytes: how much of each of stdout/stderr an exec keeps (the last bytes).
        tmp_root: host folder under which the private HOME and /tmp are created (default: the
            host's temp dir).
        image: the (local) image to run; created by :func:`ensure_image` when missing.
    """

    def __init__(self, spec: SandboxSpec, *, max_output_bytes: int = 1 << 20, tmp_root: Path | None = None,
                 image: str = IMAGE) -> None:
        self.spec = spec
        self.max_output_bytes = max_output_bytes
        self.tmp_root = tmp_root
        self.image = image
        self.root: Path | None = None
        """Host folder holding ``home/``, ``tmp/`` and ``ctl/`` while the sandbox is open."""
        self.container_id: str | None = None
        self.enforced_limits: dict[str, str] = {}
        self.unenforced_limits: dict[str, str] = {}
        self._client: Any = None
        self._container: Any = None
        self._mounts: list[tuple[str, str, bool]] = []  # (inside, host, writable), deepest first
        self._res: dict[str, Any] = {}  # what _release must undo: client, container, ws_owner, root
        self._finalizer: weakref.finalize | None = None
        self._py: str | None = None
        me = os.geteuid()
        if spec.unprivileged:
            self.uid, self.gid = (SANDBOX_UID, SANDBOX_UID) if me == 0 else (me, os.getegid())
        else:
            self.uid, self.gid = 0, 0

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "DockerSandbox":
        if self._finalizer is not None:
            raise SandboxError("this DockerSandbox was already started; create a new one")
        self._finalizer = weakref.finalize(self, _release, self._res)  # also runs at exit / on GC
        try:
            self._start()
        except BaseException as exc:
            self.close()
            if isinstance(exc, SandboxError) or not isinstance(exc, Exception):
                raise
            raise SandboxError(f"could not start the Docker sandbox: {exc}") from exc
        return self

    def _start(self) -> None:
        from docker.types import Mount, Ulimit

        spec = self.spec
        for p in (spec.workspace_target, spec.home):
            if not posixpath.isabs(p):
                raise SandboxError(f"sandbox path {p!r} must be absolute")
        if not Path(spec.workspace_host).is_dir():
            raise SandboxError(f"workspace {spec.workspace_host} does not exist or is not a folder; create it first")
        for src in [*spec.ro_paths, *(h for h, _t, _w in spec.extra_binds)]:
            if not os.path.lexists(src):
                raise SandboxError(f"bind source {src} does not exist on the host; remove it from the spec")
        sock = None if spec.proxy_socket is None else Path(spec.proxy_socket).resolve()
        if sock is not None and not sock.exists():
            raise SandboxError(f"proxy socket {spec.proxy_socket} does not exist; start the proxy first")
        self._client = self._res["client"] = connect()
        ensure_image(self._client, self.image)

        self.root = root = self._res["root"] = Path(tempfile.mkdtemp(prefix="clawgym-docker-", dir=self.tmp_root))
        home, tmp, ctl = root / "home", root / "tmp", root / "ctl"
        for d, mode in ((home, 0o711), (tmp, 0o1777), (ctl, 0o755), (root / "empty", 0o555)):
            d.mkdir()
            os.chmod(d, mode)  # HOME 0711: the capability-less pid 1 must traverse it to binds beneath
        (root / "empty.txt").touch(mode=0o444)
        for name, dest in (("docker_launch.py", "launch.py"), ("relay.py", "relay.py")):
            shutil.copyfile(Path(__file__).with_name(name), ctl / dest)
        self._chown(home)
        self._chown(tmp)
        ws = os.path.realpath(spec.workspace_host)
        if os.geteuid() == 0 and self.uid != 0:
            st = os.stat(ws)
            self._res["ws_owner"] = (ws, st.st_uid, st.st_gid)
            _chown_tree(ws, self.uid, self.gid)

        mounts: dict[str, tuple[str, bool]] = {posixpath.normpath(str(p)): (os.path.realpath(p), False)
                                               for p in spec.ro_paths}
        if self.uid == 0:  # root inside could read root-only host files through the toolchain binds
            from clawgym_env.sandbox._hostside import SCAN_FOR_SECRETS, unreadable_entries

            for top in (t for t in SCAN_FOR_SECRETS if t in mounts):
                mounts.update({p: (str(root / ("empty" if d else "empty.txt")), False)
                               for p, d in unreadable_entries(top)})
        for host, inside, writable in spec.extra_binds:
            mounts[posixpath.normpath(inside)] = (os.path.realpath(host), writable)
        mounts.update({posixpath.normpath(spec.home): (str(home), True), "/tmp": (str(tmp), True),
                       posixpath.normpath(spec.workspace_target): (ws, True), CTL_DIR: (str(ctl), False)})
        self._mounts = sorted(((t, h, w) for t, (h, w) in mounts.items()), key=lambda m: -len(m[0]))
        for target, _, _ in self._mounts:  # mountpoints inside writable binds belong to the user
            self._premake(target)
        docker_mounts = [Mount(t, h, type="bind", read_only=not w) for t, h, w in reversed(self._mounts)]

        command = [self._python(), "-I", "-S", f"{CTL_DIR}/launch.py", "init"]
        if sock is not None:  # the socket itself, not its folder (which may hold anything)
            (ctl / "proxy.sock").touch()
            docker_mounts.append(Mount(PROXY_SOCK, str(sock), type="bind", read_only=True))
            command += [self._python(), "-I", "-S", f"{CTL_DIR}/relay.py", str(spec.proxy_port), PROXY_SOCK]
        kwargs = self._limit_options(self._client.info(), Ulimit)
        if self.uid != 0:
            kwargs.update(cap_drop=["ALL"], security_opt=["no-new-privileges"])
        self._container = self._client.containers.create(
            self.image, command, name=f"clawgym-sb-{uuid.uuid4().hex[:12]}", detach=True, init=False,
            network_mode="none", read_only=True, mounts=docker_mounts, user=f"{os.geteuid()}:{os.getegid()}",
            environment=self.env(), hostname="sandbox", working_dir="/",
            labels={"org.clawgym.sandbox": "docker"}, **kwargs)
        self.container_id = self._res["container"] = self._container.id
        self._container.start()
        self._container.reload()
        if self._container.status != "running":
            logs = self._container.logs(tail=20).decode(errors="replace").strip()
            raise SandboxError(f"sandbox container exited at start ({self._container.status}): {logs}")

    def _limit_options(self, info: Mapping[str, Any], Ulimit) -> dict[str, Any]:
        """Container options for ``spec.limits``; fills ``enforced_limits``/``unenforced_limits``."""
        lim, opts, ulimits = self.spec.limits, {}, []
        if lim.memory_mb is not None:
            if info.get("MemoryLimit", False):
                opts["mem_limit"] = f"{lim.memory_mb}m"
                if info.get("SwapLimit", False):
                    opts["memswap_limit"] = f"{lim.memory_mb}m"
                self.enforced_limits["memory_mb"] = f"cgroup memory={lim.memory_mb}MiB for the container"
            else:
                self.unenforced_limits["memory_mb"] = "the Docker engine reports no memory cgroup"
        if lim.max_procs is not None:
            if info.get("PidsLimit", False):
                opts["pids_limit"] = lim.max_procs
                self.enforced_limits["max_procs"] = f"cgroup pids.max={lim.max_procs} for the container"
            else:
                self.unenforced_limits["max_procs"] = "the Docker engine reports no pids cgroup"
        if lim.cpu_s is not None:  # set by the launcher in each exec
            self.enforced_limits["cpu_s"] = f"RLIMIT_CPU={int(lim.cpu_s)}s per process"
        if lim.open_files is not None:
            ulimits.append(Ulimit(name="nofile", soft=lim.open_files, hard=lim.open_files))
            self.enforced_limits["open_files"] = f"RLIMIT_NOFILE={lim.open_files}"
        if ulimits:
            opts["ulimits"] = ulimits
        return opts

    def close(self) -> None:
        """Remove the container, give the workspace back to its owner, delete HOME and /tmp. Idempotent."""
        errors = self._finalizer() if self._finalizer is not None else None
        self._client = self._container = self.root = None
        if errors:
            raise SandboxError("; ".join(errors) + "; remove it with `docker rm -f` if it is still there")

    # ---- exec ------------------------------------------------------------------------------
    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment inside: a clean PATH, HOME, TMPDIR, LANG, USER, then ``spec.env``, then ``extra``."""
        spec, visible = self.spec, [str(p) for p in self.spec.ro_paths]
        path = [os.path.dirname(sys.executable), str(Path(sys.base_prefix) / "bin")]
        path += [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and any(_under(d, v) for v in visible)]
        path += ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        env = {"PATH": ":".join(dict.fromkeys(path)), "HOME": spec.home, "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "USER": "sandbox" if spec.unprivileged else "root"}
        if spec.proxy_socket is not None:
            env["CLAWGYM_PROXY_URL"] = f"http://127.0.0.1:{spec.proxy_port}"
        return {**env, **spec.env, **(extra or {})}

    def exec(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
             timeout: float | None = None, stdin: bytes | None = None) -> ExecResult:
        if not argv:
            raise SandboxError("exec needs a non-empty argv")
        code, out, err, timed_out, wall = self._run(list(argv), env=env, cwd=cwd, timeout=timeout, stdin=stdin,
                                                    keep=self.max_output_bytes)
        return ExecResult(code, out.decode(errors="replace"), err.decode(errors="replace"), timed_out, wall)

    def _run(self, argv: list[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
             timeout: float | None = None, stdin: bytes | None = None,
             keep: int | None = None) -> tuple[int, bytes, bytes, bool, float]:
        if self._container is None:
            raise SandboxError("the sandbox is not open; use it as `with DockerSandbox(spec) as sb:`")
        api, tag = self._client.api, uuid.uuid4().hex
        port = self.spec.proxy_port if self.spec.proxy_socket is not None else 0
        full_env = {**self.env(env), TAG_VAR: tag}
        cmd = [self._python(), "-I", "-S", f"{CTL_DIR}/launch.py", "run", tag, str(port),
               str(int(self.spec.limits.cpu_s or 0)), "1" if "HOSTNAME" in full_env else "0",
               cwd or self.spec.workspace_target, "--", *argv]
        t0 = time.monotonic()
        try:
            ex = api.exec_create(self._container.id, cmd, stdin=stdin is not None, environment=full_env,
                                 user=f"{self.uid}:{self.gid}", workdir="/")
            raw = api.exec_start(ex["Id"], socket=True)
        except Exception as exc:
            raise SandboxError(f"docker exec failed: {exc}") from exc
        raw = getattr(raw, "_sock", raw)
        try:
            out, err, timed_out = pump(raw, stdin, None if timeout is None else t0 + timeout, keep,
                                       on_deadline=lambda: self._sweep(tag))
        finally:
            raw.close()
        code = -9 if timed_out else -1
        for _ in range(0 if timed_out else 300):  # the exit code lags the stream's end a little
            try:
                info = api.exec_inspect(ex["Id"])
            except Exception as exc:
                raise SandboxError(f"docker exec inspect failed: {exc}") from exc
            if not info.get("Running") and info.get("ExitCode") is not None:
                code = int(info["ExitCode"])
                break
            time.sleep(0.01)
        return code, out, err, timed_out, time.monotonic() - t0

    def _sweep(self, tag: str) -> None:
        """Kill every process of the exec ``tag`` (run as the sandbox user, who owns them all)."""
        api = self._client.api
        try:
            ex = api.exec_create(self._container.id, [self._python(), "-I", "-S", f"{CTL_DIR}/launch.py", "sweep",
                                                      tag], user=f"{self.uid}:{self.gid}", workdir="/")
            api.exec_start(ex["Id"])
        except Exception as exc:
            raise SandboxError(f"could not kill a timed-out command: {exc}") from exc

    # ---- files -----------------------------------------------------------------------------
    def read_file(self, path: str) -> bytes:
        host = self._host_path(path)
        if host is not None:
            try:
                return Path(host).read_bytes()
            except OSError as exc:
                raise SandboxError(f"cannot read {path!r} in the sandbox: {exc.strerror}") from exc
        code, out, err, _, _ = self._run(["cat", "--", self._norm(path)], cwd="/")
        if code != 0:
            raise SandboxError(f"cannot read {path!r} in the sandbox: {err.decode(errors='replace').strip()}")
        return out

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        host = self._host_path(path)
        if host is not None:
            try:
                self._premake(posixpath.dirname(self._norm(path)))
                fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
                with os.fdopen(fd, "wb") as f:
                    f.write(raw)
                    os.fchmod(f.fileno(), mode)
                self._chown(host)
                return
            except OSError as exc:
                raise SandboxError(f"cannot write {path!r} in the sandbox: {exc.strerror}") from exc
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" "$1"'
        code, _, err, _, _ = self._run(["sh", "-c", script, "sh", self._norm(path), oct(mode)[2:]], stdin=raw,
                                       cwd="/")
        if code != 0:
            hint = "; write under the workspace, HOME or /tmp" if b"Read-only" in err else ""
            raise SandboxError(f"cannot write {path!r} in the sandbox: {err.decode(errors='replace').strip()}{hint}")

    # ---- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _norm(path: str) -> str:
        if not posixpath.isabs(path):
            raise SandboxError(f"sandbox path {path!r} must be absolute")
        return posixpath.normpath(path)

    def _host_path(self, path: str) -> str | None:
        """The host path behind ``path`` when it is under a writable bind and, symlinks resolved on the
        host, stays inside that bind; None when only the container can resolve it faithfully."""
        inside = self._norm(path)
        if self._container is None:
            raise SandboxError("the sandbox is not open; use it as `with DockerSandbox(spec) as sb:`")
        for target, host, writable in self._mounts:
            if _under(inside, target):
                cand = host if inside == target else os.path.join(host, posixpath.relpath(inside, target))
                return cand if writable and _under(os.path.realpath(cand), host) else None
        return None

    def _premake(self, inside: str) -> None:
        """Create ``inside``'s missing folders on the host side of the writable bind holding it."""
        for target, host, writable in self._mounts:
            if writable and inside != target and _under(inside, target):
                cur = host
                for part in posixpath.relpath(inside, target).split("/"):
                    cur = os.path.join(cur, part)
                    if not os.path.lexists(cur):
                        os.mkdir(cur, 0o755)
                        self._chown(cur)
                return

    def _chown(self, host: str | Path) -> None:
        if os.geteuid() == 0:
            os.lchown(host, self.uid, self.gid)

    def _python(self) -> str:
        """This Python when a read-only bind shows it inside, else ``python3`` from PATH."""
        if self._py is None:
            exe = os.path.abspath(sys.executable)
            self._py = exe if any(_under(exe, str(p)) for p in self.spec.ro_paths) else "python3"
        return self._py


def _chown_tree(root: str, uid: int, gid: int) -> None:
    os.lchown(root, uid, gid)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            try:
                os.lchown(os.path.join(dirpath, name), uid, gid)
            except OSError:
                pass


def _release(res: dict[str, Any]) -> list[str]:
    """Undo what a sandbox created (``res`` is its ledger); must not reference the sandbox itself."""
    errors: list[str] = []
    client, cid = res.pop("client", None), res.pop("container", None)
    if client is not None and cid is not None:
        try:
            client.api.remove_container(cid, force=True)
        except Exception as exc:  # already gone is fine
            if getattr(getattr(exc, "response", None), "status_code", None) != 404:
                errors.append(f"could not remove container {cid}: {exc}")
    if "ws_owner" in res:
        _chown_tree(*res.pop("ws_owner"))
    if "root" in res:
        shutil.rmtree(res.pop("root"), ignore_errors=True)
    if client is not None:
        client.close()
    return errors
