"""Docker sandbox backend: one long-lived container per sandbox; ``exec`` is ``docker exec``.

Same contract as the bubblewrap backend (see base.py). What it promises, and how:

* **Image.** ``clawgym/hostroot:1`` holds a few empty folders and nothing else; it is imported
  locally (never pulled) the first time it is missing. The container root is read-only.
* **Who runs.** Every exec runs as the sandbox's host ids (``spec.host_ids``, else
  :func:`~clawgym_env.sandbox.base.sandbox_host_ids`: an id from an unused range when this process is
  root, this user's own ids otherwise); as root, ids of root or of any account of this host are
  refused. The whole container has ``cap_drop=ALL`` and ``no-new-privileges`` (a setuid file,
  planted or from the host's ``/usr``, grants nothing), its own pid, ipc and uts namespaces,
  Docker's read-only ``/proc/sys`` and masked ``/proc`` paths, and ``network_mode="none"``
  (loopback only). ``unprivileged=False`` is refused: without the daemon's ``userns-remap`` root in
  a container *is* host root (use the bwrap backend, whose root is mapped to an unprivileged host
  id, for commands that need uid 0).
* **What is visible.** ``spec.ro_paths`` read-only at the same paths, minus what
  :func:`~clawgym_env.sandbox.docker.host.plan_ro_mounts` hides: ``spec.hidden_paths`` (our own
  packages' folders: task answer keys, verifiers), the project checkout, the workspace's episode
  folder and the run folder of other episodes are never shown (masked with an empty folder where a
  toolchain path would show them). ``extra_binds`` as asked.
* **Private places.** The workspace, HOME, ``/tmp`` and ``/dev/shm`` are writable by the sandbox user
  and private to the sandbox. ``/tmp`` and ``/dev/shm`` are Docker tmpfs. HOME and the workspace are
  :class:`~clawgym_env.sandbox.docker.host.Place` s: when this process is root, a host tmpfs per place,
  detached from every host path once the container runs. The workspace is copied in at start and copied
  back (unless ``spec.hand_back`` is False) into ``spec.workspace_host`` by ``close()`` (links kept as
  links, special files skipped, sparse files sparse, setuid/setgid bits stripped, everything owned by
  the workspace folder's owner, the folder 0700); the host folder is untouched while the sandbox runs,
  and stays as it was given if this process is killed. As a non-root user the places are plain folders
  under a 0700 staging folder (``tmp_root``), left behind by a killed process.
* **Not promised.** Protection against kernel exploits (the container shares the host kernel: use
  a VM or gVisor runtime for that); a driver that forks keeps the container alive in the child.
* **Lifetime.** pid 1 is ``launch.py init`` (bind-mounted read-only with ``relay.py`` at
  ``/.clawgym``), running as this process's uid without capabilities; it reaps orphans, runs the
  proxy relay for the container's whole life when ``spec.proxy_socket`` is set (the socket file is
  bound at ``/.clawgym/proxy.sock``) and exits when its stdin, held only by this object, reaches
  EOF. The container is ``auto_remove``: ``close()``, or the death of this process by any signal,
  leaves no container and no process behind. (Docker's ``init=True`` cannot be used: its
  ``/sbin/docker-init`` is hidden by the host's read-only ``/sbin``.)
* **exec.** Each command runs under ``launch.py run``, which marks its process tree with a
  fresh ``CLAWGYM_SANDBOX_EXEC`` value; when the command ends or its timeout passes, every process
  carrying the mark (or descending from one) is SIGKILLed, so nothing outlives its ``exec``. A
  timed-out exec returns ``timed_out=True`` and returncode -9. stdout and stderr keep their last
  ``max_output_bytes`` each. Defaults: cwd = ``spec.workspace_target``; env built from scratch: PATH,
  HOME, TMPDIR, LANG=C.UTF-8, USER, CLAWGYM_PROXY_URL (with a proxy), then ``spec.env``, then the
  exec's ``env``.
* **Files.** ``read_file``/``write_file`` on a path in HOME or the workspace (not in a bind below
  them) use the host side of the place, walked from its root with ``O_NOFOLLOW`` at every step (a
  written file and new folders go to the sandbox user); any other path, or one with a link or a
  special file on the way, is read or written by a command running as the sandbox user inside the
  container (at most ``file_timeout_s``), so both see exactly what the sandbox sees and a planted
  link is never followed on the host. Failures raise SandboxError (:mod:`clawgym_env.sandbox.docker.files`).
* **Limits.** ``memory_mb`` → cgroup memory without swap, ``max_procs`` → cgroup pids, ``cpus`` →
  CFS quota (``nano_cpus``), all for the whole container; ``open_files`` → RLIMIT_NOFILE; ``cpu_s`` →
  RLIMIT_CPU per exec'd process (the relay is exempt); ``disk_mb`` and ``inodes`` → tmpfs ``size`` and
  ``nr_inodes`` of each of the workspace, HOME, ``/tmp`` and ``/dev/shm`` (a write past either fails
  with ENOSPC); they need root to mount the host tmpfs, else they are reported unenforced;
  :meth:`DockerSandbox.limits_hit` names the places that filled up, an OOM kill (``memory``) and a CPU
  share held at its quota (``cpu``), read from the container's own cgroup files. tmpfs pages also
  count towards ``memory_mb``. Every limit that is not None lands in exactly one of
  ``enforced_limits`` (how) and ``unenforced_limits`` (why not). A workspace that does not fit its
  place raises :class:`~clawgym_env.sandbox.base.PlaceFullError` at start.
"""

from __future__ import annotations

import os
import posixpath
import sys
import tempfile
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from clawgym_env.errors import SandboxError
from clawgym_env.sandbox import hostfs
from clawgym_env.sandbox.base import ExecResult, Sandbox, SandboxSpec, limit_tags, sandbox_host_ids
from clawgym_env.sandbox.deadline import Deadline
from clawgym_env.sandbox.docker.files import DockerFiles
from clawgym_env.sandbox.docker.host import (
    IMAGE,
    Ledger,
    Place,
    _under,
    account,
    connect,
    ensure_image,
    limit_options,
    plan_ro_mounts,
    release,
    stage_in,
    tmpfs_opts,
)
from clawgym_env.sandbox.docker.stream import pump

CTL_DIR = "/.clawgym"  # read-only files inside: the launcher and the relay
PROXY_SOCK = f"{CTL_DIR}/proxy.sock"  # the proxy's unix socket, bound here
TAG_VAR = "CLAWGYM_SANDBOX_EXEC"
ROOT_FIX = ("the Docker backend cannot run commands as root inside: without the daemon's userns-remap, "
            "root in a container is host root; use unprivileged=True, or the bwrap backend (its root is "
            "mapped to an unprivileged host id)")


class DockerSandbox(DockerFiles, Sandbox):
    """A sandbox backed by one Docker container (see the module docstring for the invariants).

    Args:
        spec: what to mount and which limits to apply.
        max_output_bytes: how much of each of stdout/stderr an exec keeps (the last bytes).
        tmp_root: host folder under which the staging folder of HOME and the workspace is created
            (default: the host's temp dir); it is empty again once the container runs (as root).
        image: the (local) image to run; created by :func:`ensure_image` when missing.
        runtime: the OCI runtime of the container (default ``CLAWGYM_DOCKER_RUNTIME``, else the engine's
            default, ``runc``); ``runsc`` (gVisor, registered with the engine) puts a user-space kernel
            between the agent and the host kernel.
    """

    _warm = False
    """A pool's container, made ahead of its episode (:mod:`~clawgym_env.sandbox.docker.pool`): no workspace copied in
    and no proxy socket bound at start; the pool hands both over later."""

    def __init__(self, spec: SandboxSpec, *, max_output_bytes: int = 1 << 20, tmp_root: Path | None = None,
                 image: str = IMAGE, runtime: str | None = None) -> None:
        self.spec = spec
        self.runtime = runtime or os.environ.get("CLAWGYM_DOCKER_RUNTIME") or None
        self.max_output_bytes = max_output_bytes
        self.file_timeout_s = 120.0
        """Longest a read_file/write_file that has to go through the container may take."""
        self.tmp_root = tmp_root
        self.image = image
        self.root: Path | None = None
        """Staging folder of HOME and the workspace (removed once they are detached, or at close)."""
        self.container_id: str | None = None
        self.enforced_limits: dict[str, str] = {}
        self.unenforced_limits: dict[str, str] = {}
        self.uid, self.gid = -1, -1
        self._client: Any = None
        self._container: Any = None
        self._res: Ledger = {}  # what _release must undo (see there)
        self._finalizer: weakref.finalize | None = None
        self._py: str | None = None
        self._targets: list[tuple[str, Place | None]] = []  # (mount target inside, its Place if any)

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> DockerSandbox:
        if self._finalizer is not None:
            raise SandboxError("this DockerSandbox was already started; create a new one")
        self._finalizer = weakref.finalize(self, release, self._res)  # also runs at exit / on GC
        try:
            self._start()
        except BaseException as exc:
            self.close()
            if isinstance(exc, SandboxError) or not isinstance(exc, Exception):
                raise
            raise SandboxError(f"could not start the Docker sandbox: {exc}") from exc
        return self

    def _ids(self) -> tuple[int, int]:
        if not self.spec.unprivileged:
            raise SandboxError(ROOT_FIX)
        uid, gid = self.spec.host_ids or sandbox_host_ids()
        if os.geteuid() == 0 and (0 in (uid, gid) or account(uid)):
            raise SandboxError(f"sandbox host ids {(uid, gid)} are host root or a user of this host "
                               f"({account(uid) or 'root'}); leave spec.host_ids None or give ids no account has")
        return int(uid), int(gid)

    def _start(self) -> None:
        from docker.types import Mount, Ulimit

        spec = self.spec
        for p in (spec.workspace_target, spec.home):
            if not posixpath.isabs(p):
                raise SandboxError(f"sandbox path {p!r} must be absolute")
        if not self._warm and not Path(spec.workspace_host).is_dir():
            raise SandboxError(f"workspace {spec.workspace_host} does not exist or is not a folder; create it first")
        for src in [*spec.ro_paths, *(h for h, _t, _w in spec.extra_binds)]:
            if not os.path.lexists(src):
                raise SandboxError(f"bind source {src} does not exist on the host; remove it from the spec")
        sock = None if spec.proxy_socket is None else Path(spec.proxy_socket).resolve()
        if sock is not None and not self._warm and not sock.exists():
            raise SandboxError(f"proxy socket {spec.proxy_socket} does not exist; start the proxy first")
        self.uid, self.gid = uid, gid = self._ids()
        self._client = self._res["client"] = connect()
        ensure_image(self._client, self.image)
        kwargs = limit_options(spec.limits, self._client.info(), Ulimit, self.enforced_limits,
                               self.unenforced_limits)

        self.root = root = self._res["root"] = Path(tempfile.mkdtemp(prefix="clawgym-docker-", dir=self.tmp_root))
        disk, inodes = spec.limits.disk_mb, spec.limits.inodes
        self._res["places"] = places = [Place(root / "home", uid, gid, disk, 0o711, inodes=inodes),
                                        Place(root / "ws", uid, gid, disk, inodes=inodes)]
        home, ws = places
        ws_host = os.path.realpath(spec.workspace_host)
        if not self._warm:
            stage_in(ws_host, ws, uid, gid, spec.limits)

        binds, masks = plan_ro_mounts(list(spec.ro_paths), list(spec.hidden_paths), Path(ws_host))
        mounts: dict[str, tuple[str, bool]] = {t: (h, False) for t, h in binds.items()}
        for host, inside, writable in spec.extra_binds:
            mounts[posixpath.normpath(inside)] = (os.path.realpath(host), writable)
        here = Path(__file__).parent
        mounts.update({posixpath.normpath(spec.home): (home.host, True),
                       posixpath.normpath(spec.workspace_target): (ws.host, True),
                       f"{CTL_DIR}/launch.py": (str(here / "launch.py"), False),
                       f"{CTL_DIR}/relay.py": (str(here.parent / "relay.py"), False)})
        by_target = {posixpath.normpath(spec.home): home, posixpath.normpath(spec.workspace_target): ws}
        self._premake(mounts, by_target)
        tmpfs = {"/tmp": tmpfs_opts(disk, "1777", inodes)}
        if disk is not None or inodes is not None:  # with --ipc private, a tmpfs of our own replaces shm_size
            tmpfs["/dev/shm"] = tmpfs_opts(disk, "1777", inodes, executable=False)
        tmpfs.update({m: "size=4k,nr_inodes=16,mode=0555" for m in masks})
        self._targets = sorted(((t, by_target.get(t)) for t in [*mounts, *tmpfs, "/dev/shm", PROXY_SOCK]),
                               key=lambda m: -len(m[0]))  # deepest first: the mount that holds a path
        docker_mounts = [Mount(t, h, type="bind", read_only=not w)
                         for t, (h, w) in sorted(mounts.items(), key=lambda m: m[0].count("/"))]

        command = [self._python(), "-I", "-S", f"{CTL_DIR}/launch.py", "init"]
        if sock is not None:
            source, target, inside = self._proxy_mount(sock)
            docker_mounts.append(Mount(target, source, type="bind", read_only=True))
            command += [self._python(), "-I", "-S", f"{CTL_DIR}/relay.py", str(spec.proxy_port), inside]
        api = self._client.api
        host_config = api.create_host_config(
            network_mode="none", read_only=True, mounts=docker_mounts, tmpfs=tmpfs, cap_drop=["ALL"],
            security_opt=["no-new-privileges"], ipc_mode="private", auto_remove=True, init=False,
            runtime=self.runtime, **kwargs)
        config = api.create_container_config(
            self.image, command, hostname="sandbox", user=f"{os.geteuid()}:{os.getegid()}", detach=True,
            stdin_open=True, environment=self.env(), working_dir="/", labels={"org.clawgym.sandbox": "docker"},
            host_config=host_config)
        config["StdinOnce"] = True  # the stdin closes for good when our attachment goes (pid 1 then ends)
        created = api.create_container_from_config(config, name=f"clawgym-sb-{uuid.uuid4().hex[:12]}")
        self.container_id = self._res["container"] = created["Id"]
        # the container's only stdin: closed by the kernel if this process dies, which ends pid 1
        self._res["lifeline"] = api.attach_socket(self.container_id, params={"stdin": 1, "stream": 1})
        api.start(self.container_id)
        try:
            status = api.inspect_container(self.container_id)["State"]["Status"]
        except Exception:  # noqa: BLE001 - auto_remove: a pid 1 that died at once takes the container with it
            status = "removed"
        self._container = self.container_id
        if status != "running":
            raise SandboxError(f"sandbox container ended at start ({status}): its pid 1 ({self._python()}) "
                               "could not run; make sure that Python is visible through spec.ro_paths")
        if not self._warm and spec.hand_back:
            self._res["ws_out"] = (ws, ws_host)
        for place in places:  # from now on only the container and our fds reach them
            place.detach()
        if all(p.fd is not None for p in places):
            hostfs.discard(root)

    def _proxy_mount(self, sock: Path) -> tuple[str, str, str]:
        """(host source, mount target, socket path inside) of the proxy's bind: the socket itself, not its
        folder (which may hold anything)."""
        return str(sock), PROXY_SOCK, PROXY_SOCK

    def _premake(self, mounts: Mapping[str, tuple[str, bool]], places: Mapping[str, Place]) -> None:
        """Create, owned by the sandbox user, the parent folders of mountpoints inside HOME or the workspace
        (the engine would create them root-owned, and the user could not write beside a bind)."""
        for target in sorted(mounts, key=len):
            for top, place in sorted(places.items(), key=lambda kv: -len(kv[0])):  # the deepest place holds it
                if target != top and _under(target, top):
                    cur = place.host
                    for part in posixpath.relpath(target, top).split("/")[:-1]:
                        cur = os.path.join(cur, part)
                        if not os.path.lexists(cur):
                            os.mkdir(cur, 0o755)
                            if os.geteuid() == 0:
                                os.lchown(cur, self.uid, self.gid)
                    break

    def full_disks(self) -> list[str]:
        """The writable places (``workspace``, ``home``, ``tmp``, ``shm``) whose quota is used up (call
        before close; one exec for the two places that only the container sees)."""
        if self._container is None or self.spec.limits.disk_mb is None:
            return []
        return self._usage()[0]

    def limits_hit(self) -> list[str]:
        """Full places (disk, inodes), an OOM kill and a CPU share held at its quota (see
        :meth:`Sandbox.limits_hit`); one exec reads what only the container sees. Call before close."""
        if self._container is None:
            return []
        lim = self.spec.limits
        disks, inodes, counters = self._usage()
        return limit_tags(full_disks=disks if lim.disk_mb is not None else [],
                          full_inodes=inodes if lim.inodes is not None else [],
                          oom_kills=counters.get("oom_kill", 0), throttled_periods=counters.get("nr_throttled", 0))

    def _usage(self) -> tuple[list[str], list[str], dict[str, int]]:
        """(places out of blocks, places out of inodes, the container's cgroup counters): HOME and the
        workspace through our fds, ``/tmp``, ``/dev/shm`` and the cgroup files (v1 or v2, read-only
        inside) by one exec."""
        disks: list[str] = []
        inodes: list[str] = []
        for name, place in zip(("home", "workspace"), self._res.get("places", [])):
            if place.fd is not None:
                st = os.fstatvfs(place.fd)
                disks += [name] if st.f_bavail == 0 else []
                inodes += [name] if st.f_files > 0 and st.f_favail == 0 else []
        files = " ".join(f"/sys/fs/cgroup/{f}" for f in ("memory.events", "memory/memory.oom_control", "cpu.stat",
                                                          "cpu/cpu.stat"))
        try:
            code, out, _, _, _ = self._run(["sh", "-c", f"stat -f -c '%a %c %d' /tmp /dev/shm; cat {files} "
                                           "2>/dev/null; true"], cwd="/", timeout=30)
        except SandboxError:  # the container is gone: what only it could tell is unknown, not a failure
            code, out = -1, b""
        lines = out.decode(errors="replace").splitlines() if code == 0 else []
        for name, line in zip(("tmp", "shm"), lines[:2]):
            free, total, free_inodes = (line.split() + ["", "", ""])[:3]
            disks += [name] if free == "0" else []
            inodes += [name] if total not in ("", "0") and free_inodes == "0" else []
        counters: dict[str, int] = {}
        for line in lines[2:]:
            key, _, value = line.partition(" ")
            if key in ("oom_kill", "nr_throttled") and value.strip().isdigit():
                counters[key] = counters.get(key, 0) + int(value)
        return disks, inodes, counters

    def close(self) -> None:
        """Remove the container, copy the workspace back, free HOME and the workspace. Idempotent."""
        errors = self._finalizer() if self._finalizer is not None else None
        self._client = self._container = self.root = None
        if errors:
            raise SandboxError("; ".join(errors))

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
        """Run ``argv`` in the container through its launcher (see :meth:`Sandbox.exec`); at ``timeout`` (an
        :class:`~clawgym_env.sandbox.deadline.AgentTimeout`: extended by its excused time) every process of this
        exec is killed, daemonised or not."""
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
            ex = api.exec_create(self._container, cmd, stdin=stdin is not None, environment=full_env,
                                 user=f"{self.uid}:{self.gid}", workdir="/")
            raw = api.exec_start(ex["Id"], socket=True)
        except Exception as exc:
            raise SandboxError(f"docker exec failed: {exc}") from exc
        raw = getattr(raw, "_sock", raw)
        try:
            out, err, timed_out = pump(raw, stdin, Deadline.of(timeout, t0), keep,
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
            ex = api.exec_create(self._container, [self._python(), "-I", "-S", f"{CTL_DIR}/launch.py", "sweep",
                                                      tag], user=f"{self.uid}:{self.gid}", workdir="/")
            api.exec_start(ex["Id"])
        except Exception as exc:
            raise SandboxError(f"could not kill a timed-out command: {exc}") from exc

    # ---- helpers ---------------------------------------------------------------------------
    def _python(self) -> str:
        """This Python when a read-only bind shows it inside, else ``python3`` from PATH."""
        if self._py is None:
            exe = os.path.abspath(sys.executable)
            self._py = exe if any(_under(exe, str(p)) for p in self.spec.ro_paths) else "python3"
        return self._py
