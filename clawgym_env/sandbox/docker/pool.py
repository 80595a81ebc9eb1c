"""Pre-created Docker sandboxes: warm containers made ahead, handed out one per episode.

Starting a Docker sandbox is mostly the engine creating and starting a container (~0.7 s here,
against ~0.05 s for a bwrap sandbox, for which no pool is worth having). A :class:`DockerPool` pays
that ahead, in background threads, so an episode's sandbox start is a copy of its workspace and a
link to its proxy socket. ``Runtime(policy, sandbox="docker", sandbox_pool=N)`` uses one.

Invariants:
  * a container is handed out at most once and never reused: the episode's ``close`` destroys it like
    any Docker sandbox, and the pool makes a fresh one to replace it;
  * a warm container is handed out only for a spec of its *shape*: everything fixed when a container
    is created (read-only binds and masks, extra binds, HOME and workspace paths, proxy port, limits);
    a spec with no warm container of its shape (or with ``host_ids`` set, or ``unprivileged=False``)
    gets a cold sandbox, and the pool starts keeping ``size`` warm containers of that shape (at most
    ``max_shapes`` shapes: the one asked for least recently is dropped, its warm containers destroyed);
  * a warm container has an empty workspace and no way out: its relay's socket path is a placeholder
    socket (no listener) in a host folder of its own (0700, bound read-only at :data:`EP_DIR`); the
    hand-out copies the episode's workspace in and links the episode's proxy socket in place of the
    placeholder (an atomic rename); a hand-out that fails destroys that container and falls back to a
    cold sandbox;
  * a warm container is released like any Docker sandbox (its finalizer; the death of this process
    ends it through its lifeline, and this process's reaper deletes its socket folder);
    :meth:`DockerPool.close` stops the refill, waits for the containers being created and destroys
    every warm one; sandboxes already handed out are their episodes' to close;
  * while open, the pool's sandbox class is found by :func:`clawgym_env.sandbox.get_backend` under
    :attr:`DockerPool.name` (``docker-pool:<id>``), in this process only.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import logging
import os
import posixpath
import socket
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from clawgym_env.errors import SandboxError
from clawgym_env.files.walk import chown_tree
from clawgym_env.files.workspace import copy_tree
from clawgym_env.sandbox import hostfs
from clawgym_env.sandbox.base import ExecResult, Sandbox, SandboxSpec
from clawgym_env.sandbox.docker.host import IMAGE, plan_ro_mounts
from clawgym_env.sandbox.docker.sandbox import CTL_DIR, DockerSandbox

log = logging.getLogger(__name__)
EP_DIR = f"{CTL_DIR}/ep"
"""Inside a pooled container: the read-only folder holding the episode's proxy socket (``proxy.sock``)."""
POOL_PREFIX = "docker-pool:"
EP_PREFIX = "clawgym-docker-ep-"
"""Name prefix of a pooled container's proxy socket folder on the host (then the pid of its process)."""
_pools: dict[str, DockerPool] = {}
_pools_lock = threading.Lock()

Shape = tuple[object, ...]


def shape(spec: SandboxSpec) -> Shape | None:
    """What a container of ``spec`` fixes at creation (None: such a spec is never served warm)."""
    if spec.host_ids is not None or not spec.unprivileged:
        return None
    binds, masks = plan_ro_mounts(list(spec.ro_paths), list(spec.hidden_paths),
                                  Path(os.path.realpath(spec.workspace_host)))
    extra = tuple((os.path.realpath(h), posixpath.normpath(t), w) for h, t, w in spec.extra_binds)
    return (tuple(sorted(binds.items())), tuple(masks), extra, posixpath.normpath(spec.home),
            posixpath.normpath(spec.workspace_target), spec.proxy_socket is not None, spec.proxy_port,
            dataclasses.astuple(spec.limits))


def pool_class(name: str) -> type[Sandbox]:
    """The sandbox class of the open pool ``name`` (SandboxError naming the fix when there is none)."""
    with _pools_lock:
        pool = _pools.get(name)
    if pool is None:
        raise SandboxError(f"no open Docker sandbox pool named {name!r} in this process; a pool lives in the "
                           "process that made it (Runtime(..., sandbox='docker', sandbox_pool=N)), use 'docker'")
    return pool.sandbox_class


class WarmDockerSandbox(DockerSandbox):
    """A Docker sandbox started ahead of its episode (see the module invariants); :meth:`adopt` hands it over."""

    _warm = True

    def _proxy_mount(self, sock: Path) -> tuple[str, str, str]:
        tmp = Path(self.tmp_root or tempfile.gettempdir())
        hostfs.ensure_reaper(EP_PREFIX, folders=tmp)  # a killed process leaves no such folder behind
        ctl = Path(tempfile.mkdtemp(prefix=f"{EP_PREFIX}{os.getpid()}-", dir=tmp))  # 0700
        self._res["ctl"] = ctl
        placeholder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:  # the relay checks that its socket path exists when it starts
            placeholder.bind(str(ctl / "proxy.sock"))
        finally:
            placeholder.close()
        return str(ctl), EP_DIR, f"{EP_DIR}/proxy.sock"

    def adopt(self, spec: SandboxSpec) -> None:
        """Make this container ``spec``'s sandbox: copy its workspace in, link its proxy socket."""
        if self._container is None:
            raise SandboxError("this pooled sandbox is not running")
        ws_host = os.path.realpath(spec.workspace_host)
        if not Path(ws_host).is_dir():
            raise SandboxError(f"workspace {spec.workspace_host} does not exist or is not a folder; create it first")
        if spec.proxy_socket is not None:
            ctl, sock = self._res["ctl"], Path(spec.proxy_socket).resolve()
            if not sock.exists():
                raise SandboxError(f"proxy socket {spec.proxy_socket} does not exist; start the proxy first")
            os.link(sock, ctl / "proxy.sock.new")  # same inode: connect() reaches the proxy
            os.replace(ctl / "proxy.sock.new", ctl / "proxy.sock")
        ws = self._res["places"][1]
        copy_tree(ws_host, f"{ws.host}/.")  # "/.": through the fd's magic link (the copy never follows links)
        if os.geteuid() == 0:
            chown_tree(f"{ws.host}/.", self.uid, self.gid)
        if spec.hand_back:
            self._res["ws_out"] = (ws, ws_host)  # from now on close() copies it back
        self.spec = spec


class PooledDockerSandbox(Sandbox):
    """The sandbox class a pool registers: ``__enter__`` returns a started :class:`DockerSandbox` (a warm one
    adopted, else a cold one), which every other method then stands for."""

    pool: ClassVar[DockerPool]

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self._sb: DockerSandbox | None = None

    def __enter__(self) -> DockerSandbox:  # the real sandbox, not this stand-in
        if self._sb is not None:
            raise SandboxError("this sandbox was already started; create a new one")
        self._sb = self.pool.acquire(self.spec)
        return self._sb

    def _live(self) -> DockerSandbox:
        if self._sb is None:
            raise SandboxError("the sandbox is not open; use it as `with get_backend(name)(spec) as sb:`")
        return self._sb

    def exec(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
             timeout: float | None = None, stdin: bytes | None = None) -> ExecResult:
        """The started sandbox's ``exec``."""
        return self._live().exec(argv, env=env, cwd=cwd, timeout=timeout, stdin=stdin)

    def read_file(self, path: str) -> bytes:
        """The started sandbox's ``read_file``."""
        return self._live().read_file(path)

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """The started sandbox's ``write_file``."""
        self._live().write_file(path, data, mode)

    def full_disks(self) -> list[str]:
        """The started sandbox's ``full_disks``."""
        return self._live().full_disks()

    def limits_hit(self) -> list[str]:
        """The started sandbox's ``limits_hit``."""
        return self._live().limits_hit()

    def close(self) -> None:
        """Close the started sandbox (a pooled container is destroyed, never returned). Idempotent."""
        if self._sb is not None:
            self._sb.close()


@dataclasses.dataclass
class PoolStats:
    """What a pool did so far."""

    hits: int = 0
    """Sandboxes handed out warm."""
    misses: int = 0
    """Sandboxes started cold (no warm one of the shape, or a failed hand-out)."""
    created: int = 0
    """Warm containers created."""
    failed: int = 0
    """Warm containers that could not be created."""


class DockerPool:
    """Keeps ``size`` warm Docker containers per sandbox shape (see the module invariants).

    Args:
        size: warm containers kept ahead per shape (the number of episodes that may start at once
            without waiting for the engine).
        workers: threads creating containers (the engine creates a few at once).
        max_shapes: most shapes kept warm at a time.
        image, runtime, tmp_root, max_output_bytes: as for :class:`DockerSandbox`.
    """

    def __init__(self, size: int, *, workers: int = 2, max_shapes: int = 4, image: str = IMAGE,
                 runtime: str | None = None, tmp_root: Path | None = None, max_output_bytes: int = 1 << 20) -> None:
        if size < 1 or workers < 1 or max_shapes < 1:
            raise ValueError("size, workers and max_shapes must be >= 1")
        self.size, self.max_shapes = size, max_shapes
        self.stats = PoolStats()
        self.name = f"{POOL_PREFIX}{uuid.uuid4().hex[:12]}"
        """The backend name of this pool's sandboxes (for ``run_episode(sandbox=...)``)."""
        self.sandbox_class: type[Sandbox] = type("PooledDockerSandbox", (PooledDockerSandbox,), {"pool": self})
        self._opts = dict(image=image, runtime=runtime, tmp_root=tmp_root, max_output_bytes=max_output_bytes)
        self._lock = threading.Lock()
        self._templates: collections.OrderedDict[Shape, SandboxSpec] = collections.OrderedDict()
        self._warm: dict[Shape, list[WarmDockerSandbox]] = {}
        self._creating: collections.Counter[Shape] = collections.Counter()
        self._closed = False
        self._workers = cf.ThreadPoolExecutor(workers, thread_name_prefix="docker-pool")
        hostfs.sweep_stale(Path(tmp_root or tempfile.gettempdir()), EP_PREFIX)  # of processes gone unreaped
        with _pools_lock:
            _pools[self.name] = self

    def warm_count(self, spec: SandboxSpec | None = None) -> int:
        """Warm containers ready now (for ``spec``'s shape, or in all)."""
        with self._lock:
            if spec is None:
                return sum(map(len, self._warm.values()))
            return len(self._warm.get(shape(spec) or (), []))

    def prewarm(self, spec: SandboxSpec) -> None:
        """Start creating ``size`` warm containers of ``spec``'s shape now (before any episode asks)."""
        key = shape(spec)
        if key is not None:
            self._remember(key, spec)
            self._refill(key)

    def acquire(self, spec: SandboxSpec) -> DockerSandbox:
        """A started sandbox for ``spec``: a warm container adopted, else a cold one started now."""
        if self._closed:
            raise SandboxError(f"the Docker sandbox pool {self.name} is closed")
        key = shape(spec)
        warm = None
        if key is not None:
            dropped = self._remember(key, spec)
            for sb in dropped:
                sb.close()
            with self._lock:
                if self._warm.get(key):
                    warm = self._warm[key].pop(0)
            self._refill(key)
        if warm is not None:
            try:
                warm.adopt(spec)
                with self._lock:
                    self.stats.hits += 1
                return warm
            except Exception as exc:  # noqa: BLE001 - a broken warm container: destroy it, start a cold one
                log.warning("pooled Docker sandbox could not be handed out (%s); starting a cold one", exc)
                try:
                    warm.close()
                except SandboxError as close_exc:
                    log.warning("closing it failed: %s", close_exc)
        with self._lock:
            self.stats.misses += 1
        return DockerSandbox(spec, **self._opts).__enter__()  # type: ignore[arg-type]  # DockerSandbox's options

    def _remember(self, key: Shape, spec: SandboxSpec) -> list[WarmDockerSandbox]:
        """Make ``key`` the most recent shape (template: ``spec`` without its environment); returns the warm
        containers of a shape dropped to stay within ``max_shapes`` (for the caller to destroy)."""
        dropped: list[WarmDockerSandbox] = []
        with self._lock:
            self._templates[key] = dataclasses.replace(spec, env={})
            self._templates.move_to_end(key)
            while len(self._templates) > self.max_shapes:
                old, _ = self._templates.popitem(last=False)
                dropped += self._warm.pop(old, [])
        return dropped

    def _refill(self, key: Shape) -> None:
        with self._lock:
            if self._closed:
                return
            need = self.size - len(self._warm.get(key, [])) - self._creating[key]
            self._creating[key] += max(0, need)
        for _ in range(need):
            self._workers.submit(self._create, key)

    def _create(self, key: Shape) -> None:
        sb = None
        try:
            with self._lock:
                template = None if self._closed else self._templates.get(key)
            if template is not None:
                sb = WarmDockerSandbox(template, **self._opts)  # type: ignore[arg-type]
                sb.__enter__()
        except Exception as exc:  # noqa: BLE001 - an episode then starts cold; never a crash in the refill
            log.warning("could not create a warm Docker sandbox: %s", exc)
            sb = None
            with self._lock:
                self.stats.failed += 1
        finally:
            with self._lock:
                self._creating[key] -= 1
                keep = sb is not None and not self._closed and key in self._templates
                if keep:
                    self._warm.setdefault(key, []).append(sb)  # type: ignore[arg-type]  # not None: keep
                    self.stats.created += 1
        if sb is not None and not keep:
            sb.close()

    def close(self) -> None:
        """Stop the refill, wait for containers being created, destroy the warm ones. Idempotent."""
        with _pools_lock:
            _pools.pop(self.name, None)
        with self._lock:
            self._closed = True
        self._workers.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            warm = [sb for sbs in self._warm.values() for sb in sbs]
            self._warm.clear()
        errors = []
        for sb in warm:
            try:
                sb.close()
            except SandboxError as exc:
                errors.append(str(exc))
        if errors:
            raise SandboxError("closing the Docker sandbox pool: " + "; ".join(errors))

    def __enter__(self) -> DockerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
