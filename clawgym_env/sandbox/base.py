"""The sandbox seam: create with a workspace → exec → read/write files → destroy.

Every backend (bubblewrap namespaces, Docker) implements :class:`Sandbox`. A sandbox is a context
manager; ``__enter__`` starts it inside ``try`` and cleans up whatever was created if the start
fails; ``close()`` is idempotent.

Inside every sandbox:
  * ``spec.workspace_target`` (an absolute path such as ``/root/.openclaw/workspace``) holds the
    files of the host folder ``spec.workspace_host``, writable; it is the only writable place that
    outlives the sandbox (a backend may work on a private copy and hand it back, sanitized, at close;
    with ``spec.hand_back=False`` a backend that works on a copy discards it);
  * ``HOME`` (``spec.home``) and ``/tmp`` are private and writable and vanish with the sandbox;
  * the host toolchain (``spec.ro_paths``) is visible read-only at the same paths, except
    ``spec.hidden_paths`` (our own packages and every installed plugin distribution that ships suites or
    graders: task data, expected answers, verifiers) and the run's folders. Precedence: a hidden path is
    masked wherever a ``ro_paths`` entry that is the same path or a folder above it would show it; a
    ``ro_paths`` entry strictly inside a hidden path (a harness's own agent file) is shown above the mask,
    exactly that path and nothing beside it;
  * sandboxed code never acts as host root: it runs as ``spec.host_ids`` (or
    :func:`sandbox_host_ids`), and a file it marks setuid/setgid never keeps that bit on the host;
  * there is no network at all, except that when ``spec.proxy_socket`` is set, a TCP listener on
    ``127.0.0.1:spec.proxy_port`` relays every connection to that host unix socket (the proxy).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import importlib.metadata
import importlib.util
import itertools
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

from clawgym_env.errors import SandboxError

DEFAULT_PROXY_PORT = 18080


DEFAULT_INODES = 262_144
"""Default of :attr:`SandboxLimits.inodes`: 256 Ki files, folders and links per writable place."""
DEFAULT_CPUS = 2.0
"""Default of :attr:`SandboxLimits.cpus`: two cores' worth of CPU time for the whole sandbox."""
CPU_HIT_PERIODS = 10
"""A sandbox throttled at its CPU quota in at least this many scheduler periods (100 ms each: a second
or more spent at the cap) reports ``cpu`` in :meth:`Sandbox.limits_hit`; a harness's brief bursts do not."""


@dataclasses.dataclass
class SandboxLimits:
    """Resource limits. ``None`` means no limit. Backends enforce what they can and report it."""

    memory_mb: int | None = 4096
    """Memory of the whole sandbox (cgroup); a process past it is killed (OOM): ``memory`` in
    :meth:`Sandbox.limits_hit`."""
    max_procs: int | None = 512
    cpu_s: int | None = None
    open_files: int | None = 4096
    disk_mb: int | None = 2048
    """Disk the sandbox may fill in each writable place (workspace, HOME, ``/tmp``, ``/dev/shm``); a
    write past it fails inside with ENOSPC (or EFBIG)."""
    cpus: float | None = DEFAULT_CPUS
    """CPU share of the whole sandbox in cores (e.g. ``1.0``: one core's worth of time), where the
    backend can enforce it (cgroup ``cpu.max``/CFS quota), so busy loops take no more of the host;
    ``None``: no limit."""
    inodes: int | None = DEFAULT_INODES
    """Entries (files, folders, links) each writable place may hold (tmpfs ``nr_inodes``: the workspace,
    HOME and ``/tmp``, and ``/dev/shm`` where the backend can); creating one past it fails inside with
    ENOSPC. It also bounds what grading must copy."""


class PlaceFullError(SandboxError):
    """Files given to a sandbox (its workspace) do not fit one of its places (``disk_mb`` or ``inodes``):
    the size of what was handed in, not the sandbox, is at fault. ``place`` names the place and
    ``limit`` the quota (``disk`` or ``inodes``)."""

    def __init__(self, message: str, *, place: str = "workspace", limit: str = "disk") -> None:
        super().__init__(message)
        self.place = place
        self.limit = limit


def limit_tags(*, full_disks: Sequence[str] = (), full_inodes: Sequence[str] = (), oom_kills: int = 0,
               throttled_periods: int = 0) -> list[str]:
    """The :meth:`Sandbox.limits_hit` tags from what a backend measured: ``disk:<place>`` and
    ``inodes:<place>`` for each place used up, ``memory`` after an OOM kill, ``cpu`` when throttled at
    the CPU quota for :data:`CPU_HIT_PERIODS` periods or more."""
    tags = [f"disk:{p}" for p in full_disks] + [f"inodes:{p}" for p in full_inodes]
    if oom_kills > 0:
        tags.append("memory")
    if throttled_periods >= CPU_HIT_PERIODS:
        tags.append("cpu")
    return tags


@dataclasses.dataclass
class SandboxSpec:
    """What a sandbox shows and allows: the workspace (host folder and its path inside), HOME, the
    read-only toolchain, extra binds, the proxy socket, the environment and the limits.

    Invariant: after construction every host path is absolute (backends run from their own folders)."""

    workspace_host: Path
    workspace_target: str = "/root/.openclaw/workspace"
    home: str = "/root"
    ro_paths: list[Path] = dataclasses.field(default_factory=lambda: host_toolchain_paths())
    hidden_paths: list[Path] = dataclasses.field(default_factory=lambda: default_hidden_paths())
    """Host paths never visible inside, even under or equal to a ``ro_paths`` entry (masked with an empty
    read-only folder); only a ``ro_paths`` entry strictly inside one is shown, above the mask (module doc).
    Default: :func:`default_hidden_paths`. Backends also hide the workspace's parent (episode) and
    grandparent (runs) folders."""
    extra_binds: list[tuple[Path, str, bool]] = dataclasses.field(default_factory=list)
    """(host path, path inside, writable) extra bind mounts."""
    proxy_socket: Path | None = None
    proxy_port: int = DEFAULT_PROXY_PORT
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    limits: SandboxLimits = dataclasses.field(default_factory=SandboxLimits)
    unprivileged: bool = True
    """Run as a non-root user (uid 1000) inside, where the backend can."""
    host_ids: tuple[int, int] | None = None
    """(uid, gid) on the host that the sandbox's user maps to; ``None``: :func:`sandbox_host_ids`
    picks them. Never 0 when this process is root: sandboxed code must not act as host root."""
    hand_back: bool = True
    """Copy the final workspace back into ``workspace_host`` at close. ``False`` for a scratch copy
    nobody reads afterwards (the grader's): a backend working on a private copy then discards it, which
    spares copying a workspace of a quota's worth of files twice more."""

    def __post_init__(self) -> None:
        # Backends run from their own folders: a relative host path would point elsewhere.
        self.workspace_host = Path(self.workspace_host).resolve()
        if self.proxy_socket is not None:
            self.proxy_socket = Path(self.proxy_socket).absolute()
        self.extra_binds = [(Path(h).resolve(), t, rw) for h, t, rw in self.extra_binds]


@dataclasses.dataclass
class ExecResult:
    """One finished ``exec``: exit code (128+N for signal N), the output tails, whether it was killed at
    its timeout, and its wall time."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Exit code 0 and not timed out."""
        return self.returncode == 0 and not self.timed_out


class Sandbox(abc.ABC):
    """A running sandbox. Use as ``with backend(spec) as sb: sb.exec([...])``."""

    spec: SandboxSpec

    def __init__(self, spec: SandboxSpec) -> None:
        """Prepare, not start, a sandbox for ``spec`` (``__enter__`` starts it); backends add keyword-only
        options of their own, so ``get_backend(name)(spec)`` builds any backend."""
        self.spec = spec

    @abc.abstractmethod
    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abc.abstractmethod
    def exec(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
             timeout: float | None = None, stdin: bytes | None = None) -> ExecResult:
        """Run ``argv`` inside the sandbox and wait for it (killing the whole process tree on timeout)."""

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes:
        """Read a file by its path inside the sandbox."""

    @abc.abstractmethod
    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a file by its path inside the sandbox (parents created)."""

    def peak_memory_bytes(self) -> int | None:
        """Peak memory used inside the sandbox so far, where the backend can measure it."""
        return None

    def full_disks(self) -> list[str]:
        """The writable places (``workspace``, ``home``, ``tmp``...) whose ``disk_mb`` quota is used up;
        call before ``close``. Backends that cannot tell return ``[]``."""
        return []

    def limits_hit(self) -> list[str]:
        """The limits the sandbox's processes ran into so far (call before ``close``): ``disk:<place>``,
        ``inodes:<place>``, ``memory`` (a process was killed at ``memory_mb``), ``cpu`` (held at the
        ``cpus`` quota; see :data:`CPU_HIT_PERIODS`). Backends report what they can measure."""
        return limit_tags(full_disks=self.full_disks())

    @abc.abstractmethod
    def close(self) -> None:
        """Destroy the sandbox and everything it created. Idempotent."""


SANDBOX_ID_BASE = 2_100_000_000
"""First host uid/gid of the range sandboxes map to when this process is root (overridable with
``CLAWGYM_SANDBOX_UID_BASE``). The range holds ``SANDBOX_ID_SLOTS`` ids, none of them a real user."""
SANDBOX_ID_SLOTS = 1 << 25
MAX_SANDBOX_ID = (1 << 31) - 1
_id_counter = itertools.count()


def sandbox_host_ids() -> tuple[int, int]:
    """Fresh unprivileged host (uid, gid) for one sandbox.

    As root: an id from the sandbox range (distinct for every call in this process, and across
    processes unless ``2**25`` sandboxes are created between two of them), so no two live sandboxes
    share a host uid and none is host root. As another user: that user's own ids (an unprivileged user
    cannot switch ids; the user namespace already maps the sandbox to it).
    """
    if os.getuid() != 0:
        return os.getuid(), os.getgid()
    base = int(os.environ.get("CLAWGYM_SANDBOX_UID_BASE", SANDBOX_ID_BASE))
    if not 65536 <= base <= MAX_SANDBOX_ID - SANDBOX_ID_SLOTS:
        raise SandboxError(f"CLAWGYM_SANDBOX_UID_BASE={base}: the sandbox ids [base, base + {SANDBOX_ID_SLOTS}) must "
                           f"lie in [65536, {MAX_SANDBOX_ID}] (bwrap's user namespaces refuse ids from 2**31); "
                           "unset it or pick a base in that range")
    slot = (os.getpid() * 4099 + next(_id_counter)) % SANDBOX_ID_SLOTS
    return base + slot, base + slot


OWN_PACKAGES = ("tasks", "trainers", "leaderboards", "clawgym_env", "harness_adapters", "clawgym_cli")
"""Our own top-level packages: their folders hold task data, expert solutions and verifiers."""


def host_toolchain_paths() -> list[Path]:
    """Host paths a harness needs read-only: system dirs and this Python (never this project's tree:
    it holds the tasks' answers; a harness adds its own install with ``ro_paths()``)."""
    paths = {Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc", "/opt")}
    paths.add(Path(sys.base_prefix).resolve())
    paths.add(Path(sys.prefix).resolve())
    extra = os.environ.get("CLAWGYM_SANDBOX_RO_PATHS", "")
    paths.update(Path(p) for p in extra.split(os.pathsep) if p)
    return sorted(p for p in paths if p.exists())


def own_package_paths() -> list[Path]:
    """The folders of :data:`OWN_PACKAGES` as installed (found by name, none of them imported), e.g.
    under ``site-packages`` of a non-editable install, which the interpreter's prefix makes visible.
    Looked up once per process."""
    return list(_own_package_paths())


@functools.lru_cache(maxsize=1)
def _own_package_paths() -> tuple[Path, ...]:
    found: list[Path] = []
    for name in OWN_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            found += [Path(p).resolve() for p in (spec.submodule_search_locations or [])]
    return tuple(found)


PLUGIN_DATA_GROUPS = ("clawgym.suites", "clawgym.graders")
"""Entry-point groups whose distributions ship task data, expected answers or reward code: every folder of
such a distribution is hidden from sandboxes (:func:`plugin_data_paths`)."""
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc", "/opt")


def default_hidden_paths() -> list[Path]:
    """What :attr:`SandboxSpec.hidden_paths` holds unless told otherwise: :func:`own_package_paths` and
    :func:`plugin_data_paths`, each once."""
    return list(dict.fromkeys([*own_package_paths(), *plugin_data_paths()]))


def hidden_paths_with(folders: Iterable[Path | str | None]) -> list[Path]:
    """:func:`default_hidden_paths` plus ``folders`` (a task's own folders: its data, inputs, reward code,
    its suite), each resolved and listed once. A folder that does not exist, or that would hide the toolchain
    (``/``, a system folder or one above it, the interpreter's prefixes), is left out: what it holds is then
    hidden only by the entries inside it (a task's own folder, when its suite folder is ``/opt``)."""
    broad = _too_broad()
    extra = [Path(p).resolve() for p in folders if p is not None]
    return list(dict.fromkeys([*default_hidden_paths(), *(p for p in extra if p.is_dir() and p not in broad)]))


def plugin_data_paths(path: Sequence[str] | None = None) -> list[Path]:
    """The folders of every distribution installed on ``path`` (default ``sys.path``) that declares a
    :data:`PLUGIN_DATA_GROUPS` entry point, found from its metadata alone (nothing of it is imported):

      * each top-level package folder its ``RECORD`` lists beside its ``dist-info`` (of a namespace
        package, which other distributions share, the folders one level down that it installed);
      * for an editable install, its project folder (``direct_url.json``) and the source folder of each
        top-level package it names (``top_level.txt``, its entry points) that lies in that project folder.

    Never a folder that would hide the toolchain (``/``, a system folder or one above it, the interpreter's
    prefix). A harness of the same distribution that needs one of its files inside names exactly that file
    in ``ro_paths``: it is shown above the mask, the suite data beside it stays hidden. Looked up once per
    process and ``path``."""
    return list(_plugin_data_paths(None if path is None else tuple(path)))


@functools.lru_cache(maxsize=8)
def _plugin_data_paths(path: tuple[str, ...] | None) -> tuple[Path, ...]:
    found: list[Path] = []
    dists = importlib.metadata.distributions() if path is None else importlib.metadata.distributions(path=list(path))
    for dist in dists:
        try:
            if any(ep.group in PLUGIN_DATA_GROUPS for ep in dist.entry_points):
                found += _installed_folders(dist) + _editable_folders(dist)
        except (OSError, ValueError, UnicodeError):  # unreadable metadata: nothing to locate by it
            continue
    broad = _too_broad()
    return tuple(p for p in dict.fromkeys(found) if p not in broad and p.is_dir())


def _installed_folders(dist: importlib.metadata.Distribution) -> list[Path]:
    """The top-level package folders ``dist``'s RECORD installed (module folders only, never ``__pycache__``,
    its metadata folder or anything outside its site folder)."""
    files = [PurePosixPath(str(f)) for f in dist.files or []]
    listed = {f.parts for f in files}
    tops: dict[str, list[PurePosixPath]] = {}
    for f in files:
        parts = f.parts
        if len(parts) < 2 or ".." in parts or parts[0] == "__pycache__" or parts[0].endswith((".dist-info",
                                                                                               ".egg-info")):
            continue
        tops.setdefault(parts[0], []).append(f)
    out: list[Path] = []
    for top, members in tops.items():
        if (top, "__init__.py") in listed:
            out.append(Path(str(dist.locate_file(top))).resolve())
        else:  # a namespace package others share: only this distribution's folders inside it
            out += [Path(str(dist.locate_file(f"{top}/{m.parts[1]}"))).resolve() for m in members if len(m.parts) > 2]
    return out


def _editable_folders(dist: importlib.metadata.Distribution) -> list[Path]:
    """For an editable install: its project folder and the source folders of its top-level packages there."""
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        return []
    if not isinstance(direct, dict) or not (direct.get("dir_info") or {}).get("editable"):
        return []
    url = urlparse(str(direct.get("url", "")))
    if url.scheme != "file":
        return []
    project = Path(unquote(url.path)).resolve()
    names = set((dist.read_text("top_level.txt") or "").split())
    names |= {ep.value.split(":")[0].split(".")[0].strip() for ep in dist.entry_points}
    out = [project]
    for name in sorted(n for n in names if n.isidentifier()):
        # the usual source layouts, whatever sys.path makes of the name (a test runner may put the project's
        # parent first, so the project folder itself is found as a namespace package of that name)
        out += [f.resolve() for f in (project / name, project / "src" / name) if f.is_dir()]
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for loc in (spec.submodule_search_locations or []) if spec is not None else []:
            folder = Path(loc).resolve()
            if folder.is_relative_to(project):  # another distribution's package is not this one's to hide
                out.append(folder)
    return out


def _too_broad() -> set[Path]:
    """Folders never hidden: ``/``, the system folders and every folder above one, this interpreter's prefixes."""
    out = {Path("/"), Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    for d in SYSTEM_DIRS:
        out.update([Path(d), *Path(d).parents])
    return out
