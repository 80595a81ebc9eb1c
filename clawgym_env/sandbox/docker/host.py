"""Host side of the Docker sandbox: the engine and its image, private size-limited places, what the
toolchain mounts hide, and the release of everything a sandbox created.

**Places.** HOME and the workspace of a Docker sandbox are each a :class:`Place`: a folder under a 0700
staging folder that, when this process is root, is a fresh tmpfs mounted on the host with
``size=disk_mb``, ``nr_inodes=inodes``, ``nosuid``, ``nodev`` and owned by the sandbox's host ids. Once
the container has started (it holds its own bind of the tmpfs), :meth:`Place.detach` keeps one directory
fd and lazily unmounts the host path, so the place is reachable from the host only through that fd: no
other host user can reach it by any path, and if this process is killed the fd closes, the container
dies with it (see docker.py) and the kernel frees the tmpfs: nothing is left on the host.

Invariants:
  * :func:`stage_in` copies a trusted tree into a place without following links and hands every entry to
    the sandbox ids; a tree that does not fit the place raises
    :class:`~clawgym_env.sandbox.base.PlaceFullError`; :func:`stage_out` replaces the host workspace's
    content with the place's (through :func:`clawgym_env.files.workspace.copy_tree`: links stay links,
    special files are skipped, sparse files stay sparse, setuid/setgid/sticky bits are stripped, never a
    whole file in memory), every entry owned by the workspace folder's owner and the folder itself 0700;
  * :func:`hidden_folders` names what a sandbox must never see: ``spec.hidden_paths`` (our own
    packages' folders and those of every plugin distribution shipping suites or graders: task data,
    expert solutions, verifiers), the project checkout, the workspace
    itself (only its private copy is mounted), its episode folder and the run folder holding other
    episodes; :func:`plan_ro_mounts` drops a toolchain path that *is* one of them and masks every one
    that a toolchain path would show with an empty root-owned 0555 tmpfs. A toolchain path strictly
    inside one of them (a harness's own file such as ``harness_adapters/mini/agent.py``) is mounted
    on purpose, above the mask (the bwrap backend's rule);
  * :func:`open_in_place` opens a path inside a place from the host without ever following a link
    (``O_NOFOLLOW`` at every step from the place's root) and never opens a fifo or device;
  * :func:`limit_options` puts every limit that is not None in exactly one of enforced/unenforced;
  * :func:`release` removes the container before it copies the workspace back (no process of the
    sandbox can still write to it) and frees the places last; it never raises, it returns errors.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import io
import os
import posixpath
import pwd
import stat
import tarfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from clawgym_env.errors import SandboxError
from clawgym_env.files.walk import chown_tree
from clawgym_env.files.workspace import copy_tree, remove_tree
from clawgym_env.sandbox.base import PlaceFullError, SandboxLimits

if TYPE_CHECKING:
    from docker import DockerClient

IMAGE = "clawgym/hostroot:1"
FIX = ("start a Docker engine with `scripts/dockerd.sh start` (install it first with "
       "`scripts/dockerd.sh --install start` or `apt-get install -y docker.io`), or use the bwrap backend")
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
_image_lock = threading.Lock()
_libc = None


def _sys(name: str) -> Callable[..., int]:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return getattr(_libc, name)


def can_mount() -> bool:
    """Whether this process may mount tmpfs file systems (root; the Docker daemon shares our mounts)."""
    return os.geteuid() == 0


class Place:
    """One private writable place of a sandbox (HOME or the workspace); see the module docstring."""

    def __init__(self, path: Path, uid: int, gid: int, size_mb: int | None, mode: int = 0o700, *,
                 inodes: int | None = None) -> None:
        self.path = path
        self.fd: int | None = None  # a directory fd once detached
        self.mounted = False
        path.mkdir(mode=0o700)
        if (size_mb is not None or inodes is not None) and can_mount():
            opts = _quota(size_mb, inodes) + f"mode={mode:o},uid={uid},gid={gid}"
            if _sys("mount")(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, opts.encode()) != 0:
                err = ctypes.get_errno()
                raise SandboxError(f"cannot mount a tmpfs ({opts}) at {path}: {os.strerror(err)}; run as root "
                                   "with CAP_SYS_ADMIN, or set SandboxLimits.disk_mb and inodes to None")
            self.mounted = True
        else:
            os.chmod(path, mode)
            if os.geteuid() == 0:
                os.chown(path, uid, gid)

    @property
    def host(self) -> str:
        """A host path to the place: the mount while attached, ``/proc/self/fd/N`` once detached."""
        return f"/proc/self/fd/{self.fd}" if self.fd is not None else str(self.path)

    def detach(self) -> None:
        """Keep a directory fd and lazily unmount the host path (only for a mounted tmpfs)."""
        if not self.mounted or self.fd is not None:
            return
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if _sys("umount2")(os.fsencode(self.path), MNT_DETACH) != 0:
            raise SandboxError(f"cannot detach {self.path}: {os.strerror(ctypes.get_errno())}")
        self.mounted = False

    def release(self) -> None:
        """Free the place: close the fd (the kernel frees a detached tmpfs) or unmount it. Idempotent."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.mounted:
            _sys("umount2")(os.fsencode(self.path), MNT_DETACH)
            self.mounted = False


def account(uid: int) -> str | None:
    """The name of the host account with ``uid``, if any."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _quota(size_mb: int | None, inodes: int | None) -> str:
    """The ``size=``/``nr_inodes=`` options (each followed by a comma) of a tmpfs, for the limits set."""
    return (f"size={int(size_mb)}m," if size_mb is not None else "") + \
        (f"nr_inodes={int(inodes)}," if inodes is not None else "")


def tmpfs_opts(size_mb: int | None, mode: str, inodes: int | None = None, *, executable: bool = True) -> str:
    """Docker tmpfs options of a place of ``size_mb`` MiB holding ``inodes`` entries (None: no such limit);
    ``executable=False`` leaves Docker's default ``noexec``."""
    return f"{_quota(size_mb, inodes)}mode={mode}" + (",exec" if executable else "")


def stage_in(src: str, place: Place, uid: int, gid: int, lim: SandboxLimits | None = None) -> None:
    """Copy the host workspace ``src`` into ``place`` and give it all to the sandbox ids; a workspace
    that does not fit the place (``lim``'s ``disk_mb`` or ``inodes``) raises :class:`PlaceFullError`."""
    try:
        copy_tree(src, place.host)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        st = os.statvfs(place.host)
        limit = "inodes" if st.f_files > 0 and st.f_favail == 0 else "disk"
        quota = "its quota" if lim is None else (
            f"{lim.inodes} entries: limits.inodes" if limit == "inodes" else f"{lim.disk_mb} MiB: limits.disk_mb")
        raise PlaceFullError(f"the workspace {src} does not fit the sandbox's workspace ({quota}); hand in fewer "
                             "files or raise that limit", place="workspace", limit=limit) from exc
    if os.geteuid() == 0:
        chown_tree(place.host, uid, gid)


def stage_out(place: Place, dest: str, owner: tuple[int, int], mode: int) -> None:
    """Replace the content of the host folder ``dest`` with the place's (module doc invariants)."""
    with os.scandir(dest) as entries:
        for entry in entries:
            remove_tree(entry.path)
    copy_tree(place.host, dest)
    if os.geteuid() == 0:
        chown_tree(dest, *owner)
    os.chmod(dest, mode & 0o700)


def checkout_root() -> Path | None:
    """The project checkout holding our packages (an editable install), None for a site-packages install."""
    parent = Path(__file__).resolve().parents[3]
    return None if parent.name in ("site-packages", "dist-packages") else parent


def hidden_folders(hidden_paths: list[Path], workspace_host: Path) -> list[str]:
    """Host folders no sandbox may see (module doc), those that exist."""
    ws = Path(workspace_host).resolve()
    out = [*(Path(p).resolve() for p in hidden_paths), checkout_root(), ws, ws.parent, ws.parent.parent]
    return [str(p) for p in dict.fromkeys(out) if p is not None and p != Path("/") and p.exists()]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def plan_ro_mounts(ro_paths: list[Path], hidden_paths: list[Path],
                   workspace_host: Path) -> tuple[dict[str, str], list[str]]:
    """({path inside: host path} read-only binds, [paths inside to mask]) for ``ro_paths`` (module doc)."""
    hidden = hidden_folders(hidden_paths, workspace_host)
    binds: dict[str, str] = {}
    for p in ro_paths:
        inside, host = posixpath.normpath(str(p)), os.path.realpath(p)
        if inside not in hidden and host not in hidden:
            binds[inside] = host
    masks = {posixpath.join(inside, posixpath.relpath(h, host))
             for h in hidden for inside, host in binds.items() if h != host and _under(h, host)}
    return binds, sorted(masks)


def connect() -> DockerClient:
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


def ensure_image(client: DockerClient, tag: str = IMAGE) -> str:
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


class Ledger(TypedDict, total=False):
    """What a Docker sandbox created and :func:`release` must undo; each key is set once its thing exists."""

    client: Any  # the Docker SDK's client (an untyped library)
    container: str  # the container id
    lifeline: Any  # the socket attached to the container's stdin (the SDK's own object)
    ws_out: tuple[Place, str]  # the workspace place and the host folder it is copied back into
    places: list[Place]  # HOME and the workspace
    root: Path  # the staging folder
    ctl: Path  # a pooled container's proxy socket folder


def release(res: Ledger) -> list[str]:
    """Undo what a Docker sandbox created, in order: the container (and with it every process), then the
    workspace copied back, then HOME and the workspace freed. ``res`` is the sandbox's ledger; this
    must not reference the sandbox itself (it runs from a finalizer)."""
    errors: list[str] = []
    client, cid = res.pop("client", None), res.pop("container", None)
    if client is not None and cid is not None:
        try:
            client.api.remove_container(cid, force=True)
        except Exception as exc:  # noqa: BLE001 - docker's errors vary; already gone (auto_remove) is fine
            if getattr(getattr(exc, "response", None), "status_code", None) not in (404, 409):
                errors.append(f"could not remove container {cid}: {exc}; remove it with `docker rm -f {cid}`")
    lifeline = res.pop("lifeline", None)
    if lifeline is not None:
        try:
            lifeline.close()
        except OSError:
            pass
    if "ws_out" in res:
        place, dest = res.pop("ws_out")
        try:
            st = os.stat(dest)
            stage_out(place, dest, (st.st_uid, st.st_gid), st.st_mode)
        except Exception as exc:  # noqa: BLE001 - a finalizer collects every failure, raises none
            errors.append(f"could not copy the workspace back into {dest}: {exc}")
    for place in res.pop("places", []):
        try:
            place.release()
        except OSError as exc:
            errors.append(f"could not free {place.path}: {exc}")
    for folder in (res.pop("root", None), res.pop("ctl", None)):  # staging; a pooled container's socket folder
        if folder is not None:
            try:
                remove_tree(folder)
            except OSError:
                pass
    if client is not None:
        client.close()
    return errors


def limit_options(lim: SandboxLimits, info: Mapping[str, object], Ulimit: Callable[..., object],
                  enforced: dict[str, str], unenforced: dict[str, str]) -> dict[str, object]:
    """Container options for ``lim`` on an engine reporting ``info``; fills ``enforced`` (how) and
    ``unenforced`` (why not) so that every limit that is not None is in exactly one of them."""
    opts: dict[str, object] = {}
    ulimits = []
    if lim.memory_mb is not None:
        if info.get("MemoryLimit", False):
            opts["mem_limit"] = f"{lim.memory_mb}m"
            if info.get("SwapLimit", False):
                opts["memswap_limit"] = f"{lim.memory_mb}m"
            enforced["memory_mb"] = f"cgroup memory={lim.memory_mb}MiB for the container"
        else:
            unenforced["memory_mb"] = "the Docker engine reports no memory cgroup"
    if lim.max_procs is not None:
        if info.get("PidsLimit", False):
            opts["pids_limit"] = lim.max_procs
            enforced["max_procs"] = f"cgroup pids.max={lim.max_procs} for the container"
        else:
            unenforced["max_procs"] = "the Docker engine reports no pids cgroup"
    if lim.cpus is not None:
        if info.get("CpuCfsQuota", False):
            opts["nano_cpus"] = int(lim.cpus * 1e9)
            enforced["cpus"] = f"CFS quota of {lim.cpus} CPUs for the container"
        else:
            unenforced["cpus"] = "the Docker engine reports no CFS quota support"
    if lim.disk_mb is not None:
        if can_mount():
            enforced["disk_mb"] = (f"tmpfs size={lim.disk_mb}MiB for each of the workspace, HOME, "
                                               "/tmp and /dev/shm")
        else:
            unenforced["disk_mb"] = ("HOME and the workspace are plain host folders: a size-limited "
                                                 "tmpfs needs root (only /tmp and /dev/shm are limited)")
    if lim.inodes is not None:
        if can_mount():
            enforced["inodes"] = f"tmpfs nr_inodes={lim.inodes} for each of the workspace, HOME, /tmp and /dev/shm"
        else:
            unenforced["inodes"] = ("HOME and the workspace are plain host folders: a tmpfs with nr_inodes "
                                    "needs root (only /tmp and /dev/shm are limited)")
    if lim.cpu_s is not None:  # set by the launcher in each exec
        enforced["cpu_s"] = f"RLIMIT_CPU={int(lim.cpu_s)}s per process"
    if lim.open_files is not None:
        ulimits.append(Ulimit(name="nofile", soft=lim.open_files, hard=lim.open_files))
        enforced["open_files"] = f"RLIMIT_NOFILE={lim.open_files}"
    if ulimits:
        opts["ulimits"] = ulimits
    return opts


def open_in_place(place: Place, rel: str, *, write: bool, uid: int, gid: int, mode: int = 0o644) -> int | None:
    """An fd for ``rel`` (a normalised relative path) inside ``place``, walked from the place's root
    with ``O_NOFOLLOW`` at every step, so a link planted by the sandbox is never followed on the host.
    With ``write``: missing folders are created and, like the file (truncated), given to the sandbox
    ids. None when a step is a link or not a folder: the caller must then go through the container,
    which resolves it as the sandbox sees it. Raises OSError for other failures."""
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    parts = [p for p in rel.split("/") if p]
    if not parts or ".." in parts:
        return None
    fd = os.dup(place.fd) if place.fd is not None else os.open(place.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, flags_dir, dir_fd=fd)
            except FileNotFoundError:
                if not write:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, flags_dir, dir_fd=fd)
                if os.geteuid() == 0:
                    os.fchown(nxt, uid, gid)
            except (NotADirectoryError, OSError) as exc:
                if isinstance(exc, NotADirectoryError) or getattr(exc, "errno", None) == 40:  # ELOOP: a link
                    return None
                raise
            os.close(fd)
            fd = nxt
        flags = (os.O_WRONLY | os.O_CREAT | os.O_TRUNC if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            out = os.open(parts[-1], flags | os.O_NONBLOCK, mode & 0o777, dir_fd=fd)
        except OSError as exc:
            if exc.errno == 40:  # ELOOP: the file itself is a link
                return None
            raise
        st = os.fstat(out)
        if not stat.S_ISREG(st.st_mode):  # a fifo or device: never block on it here
            os.close(out)
            return None
        os.set_blocking(out, True)
        if write:
            if os.geteuid() == 0:
                os.fchown(out, uid, gid)
            os.fchmod(out, mode & 0o777)
        return out
    finally:
        os.close(fd)
