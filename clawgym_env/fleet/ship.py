"""Shipping task folders to the nodes that lack them: packed once on the driver, materialised once per node.

On a cluster without a shared filesystem a task's folders (``task_dir``, ``input_dir``, ``reward_dir``)
exist only where the suite was loaded. :class:`Shipper` (driver side) packs each task's folders into a
:class:`TaskBundle` (a tar of its root folders, normalised so that equal contents give equal bytes),
puts it in the Ray object store once and hands each episode a :class:`ShippedTask`: the bundle's content
hash and object reference, which a worker fetches only when its node lacks the folders. The reference
travels once per worker (:func:`for_worker`): later episodes of the same bundle carry only its hash,
and the worker keeps the references it was sent (:class:`BundleRefs`).
:class:`TaskCache` (worker side) unpacks a bundle once per node under ``<cache>/<hash>/`` and rewrites
the task's paths into it.

Invariants: a bundle's ``digest`` is the SHA-256 of its uncompressed, normalised tar, so a cache entry
is never stale (other contents, another hash); an entry becomes visible only complete (unpacked in a
temporary folder, then renamed; a ``.complete`` marker last), so concurrent episodes and processes on
one node share it safely; a task larger than ``ship_max_mb`` is not shipped (its episodes on a node
without the folders end as ``infra_error``, boundary ``task``, naming the cap); the cache stays under
``ship_cache_max_mb`` by evicting the least recently used entries that no running episode of this
process uses, else the episode fails naming the cap; extraction refuses links and paths that leave the
entry (the ``data`` filter of :mod:`tarfile`).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import threading
import uuid
from pathlib import Path
from typing import Any

from clawgym_env.errors import ClawGymError
from clawgym_env.task import Task

TASK_FIELDS = ("task_dir", "input_dir", "reward_dir")
"""The task's folder fields that are shipped (and rewritten on the node)."""
COMPLETE = ".complete"
NEED_BUNDLE = "fleet_need_bundle"
"""Record log key of an attempt whose worker lacked a bundle's reference (the value: its hash); the scheduler
sends the reference again with the retry."""
BUNDLE_WAIT_S = 30.0
"""Seconds a worker waits for the reference of a bundle sent with another of its episodes (they may start
out of order on a threaded actor) before the attempt fails with :class:`BundleMissing`."""


class ShipError(ClawGymError):
    """A task could not be shipped or materialised (too large, cache full, a broken bundle)."""


class BundleMissing(ShipError):
    """A worker needs a bundle whose reference it was never sent (it restarted since): an infrastructure
    failure, retried with the reference."""


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**17 else f"{int(n)} bytes"


def on_node(path: Path) -> bool:
    """Whether ``path`` exists on this node (a module function, so that a test can simulate a node that
    does not see the driver's folders)."""
    return path.exists()


@dataclasses.dataclass(frozen=True)
class TaskBundle:
    """A task's root folders as one gzipped tar: ``r0``, ``r1``, ... are ``roots`` in order."""

    digest: str
    """SHA-256 (hex, first 32) of the uncompressed normalised tar: the cache key on every node."""
    roots: tuple[str, ...]
    """The driver's root folders (absolute), as packed."""
    size: int
    """Bytes of the files packed (uncompressed)."""
    data: bytes
    """The gzipped tar."""


@dataclasses.dataclass(frozen=True)
class ShippedTask:
    """What travels with an episode: where its bundle is, or why there is none."""

    digest: str | None
    roots: tuple[str, ...]
    ref: Any = None
    """Ray object reference of the :class:`TaskBundle` (fetched only by a node that lacks the folders)."""
    refused: str | None = None
    """Why the task was not shipped (too large), for the episode's error on a node without the folders."""
    layout: tuple[tuple[str, int, str], ...] = ()
    """``(field, root index, path inside the root)`` of each folder field of the task, computed on the driver."""


def task_roots(task: Task) -> list[Path]:
    """The task's existing folders that are not inside another of them (absolute, in field order)."""
    paths = [Path(p).resolve() for p in (getattr(task, f) for f in TASK_FIELDS) if p is not None]
    paths = [p for p in dict.fromkeys(paths) if p.is_dir()]
    return [p for p in paths if not any(q != p and p.is_relative_to(q) for q in paths)]


def _signature(roots: list[Path]) -> tuple:
    """Cheap change detector of the folders' files (path, size, mtime), to reuse a bundle across batches."""
    sig: list[tuple[str, int, int]] = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                st = os.stat(os.path.join(dirpath, name))
                sig.append((os.path.join(dirpath, name), st.st_size, st.st_mtime_ns))
    return tuple(sig)


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def _members(task: Task, roots: list[Path]) -> list[tuple[str, Path]]:
    """``(name in the bundle, path)`` of every folder and file, sorted; a link to a file inside its root is
    packed as that file, a link to a folder is left out (not followed), a link out of its root (or to anything
    but a file or folder) refuses the task: the node would otherwise read what the driver refuses to."""
    out: list[tuple[str, Path]] = []
    for i, root in enumerate(roots):
        real_root = os.path.realpath(root)
        out.append((f"r{i}", root))
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                path = Path(dirpath, name)
                real = os.path.realpath(path)
                if path.is_symlink() and not (real == real_root or real.startswith(real_root + "/")):
                    raise ShipError(f"task {task.full_id}: {path} is a link out of its folder {root}; it is not "
                                    "shipped (replace the link with a regular file)")
                if not (os.path.isfile(real) or os.path.isdir(real)):
                    raise ShipError(f"task {task.full_id}: {path} is not a regular file or folder; it is not shipped")
            for name in [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))] + sorted(filenames):
                path = Path(dirpath, name)
                out.append((f"r{i}/{path.relative_to(root)}", path))
    return sorted(out)


def pack(task: Task, max_bytes: int) -> TaskBundle:
    """The task's folders as a bundle; :class:`ShipError` when their files exceed ``max_bytes`` or hold a link
    out of their folder."""
    roots = task_roots(task)
    members = _members(task, roots)
    size = sum(os.path.getsize(p) for _, p in members if os.path.isfile(p))
    if size > max_bytes:
        raise ShipError(f"task {task.full_id}: its folders hold {_size(size)}, more than the "
                        f"{_size(max_bytes)} shipping cap; put the suite on a filesystem every node sees "
                        "at the same path, or raise FleetConfig.ship_max_mb")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in members:
            info = _normalise(tar.gettarinfo(os.path.realpath(path), arcname=name))
            if info.isfile():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    body = raw.getvalue()
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", compresslevel=1, mtime=0) as gz:
        gz.write(body)
    return TaskBundle(digest=hashlib.sha256(body).hexdigest()[:32], roots=tuple(map(str, roots)), size=size,
                      data=packed.getvalue())


def missing_folders(task: Task) -> list[str]:
    """The task's folders that are set but absent on this node (empty: all present)."""
    return [f"{name} {path}" for name in TASK_FIELDS
            if (path := getattr(task, name)) is not None and not on_node(Path(path))]


class Shipper:
    """Driver side: one bundle per task contents, put in the object store once (see the module doc)."""

    def __init__(self, ray: Any, max_mb: float) -> None:
        self._ray = ray
        self._max_bytes = int(max_mb * 2**20)
        self._memo: dict[tuple[Path, ...], tuple[tuple, ShippedTask]] = {}
        """Root folders -> (their files' signature, the shipped copy): one bundle per folders, the latest."""

    def ship(self, task: Task) -> ShippedTask | None:
        """The shipped form of ``task`` (``None``: it has no folder to ship on this side); packed again only
        when a file in its folders changed (path, size or mtime)."""
        roots = task_roots(task)
        if not roots:
            return None
        signature = _signature(roots)
        known = self._memo.get(tuple(roots))
        if known is not None and known[0] == signature:
            shipped = known[1]
        else:
            try:
                bundle = pack(task, self._max_bytes)
                shipped = ShippedTask(bundle.digest, bundle.roots, ref=self._ray.put(bundle))
            except ShipError as exc:
                shipped = ShippedTask(None, tuple(map(str, roots)), refused=str(exc))
            self._memo[tuple(roots)] = (signature, shipped)
        return dataclasses.replace(shipped, layout=layout(task, roots))

    def clear(self) -> None:
        """Drop every bundle reference (the object store frees them)."""
        self._memo.clear()


def for_worker(shipped: ShippedTask | None, sent: set[str]) -> ShippedTask | None:
    """What travels with one episode to a worker already sent the bundles ``sent`` (updated here): ``shipped``
    with its reference the first time, without it (its hash alone) after, so a bundle's reference is sent
    once per worker and not held by every call."""
    if shipped is None or shipped.digest is None or shipped.ref is None:
        return shipped
    if shipped.digest in sent:
        return dataclasses.replace(shipped, ref=None)
    sent.add(shipped.digest)
    return shipped


class BundleRefs:
    """Worker side: the bundle references this worker process was sent, by hash (see :func:`for_worker`)."""

    def __init__(self, wait_s: float = BUNDLE_WAIT_S) -> None:
        self.wait_s = wait_s
        self._refs: dict[str, object] = {}  # opaque object-store references, by bundle hash
        self._cv = threading.Condition()

    def remember(self, shipped: ShippedTask) -> None:
        """Keep ``shipped``'s reference, if it carries one."""
        if shipped.digest is not None and shipped.ref is not None:
            with self._cv:
                self._refs[shipped.digest] = shipped.ref
                self._cv.notify_all()

    def ref(self, shipped: ShippedTask) -> Any:
        """The reference of ``shipped``'s bundle: its own, else the one sent with an earlier (or concurrent)
        episode; :class:`BundleMissing` when none arrives within ``wait_s``."""
        digest = shipped.digest
        if shipped.ref is not None or digest is None:
            return shipped.ref
        with self._cv:
            if not self._cv.wait_for(lambda: digest in self._refs, timeout=self.wait_s):
                raise BundleMissing(f"this worker was never sent the shipped task {digest} (it restarted "
                                    "since); the attempt is retried with it")
            return self._refs[digest]


def _entry_size(entry: Path) -> int:
    try:
        return int((entry / COMPLETE).read_text() or 0)
    except (OSError, ValueError):
        return 0


class TaskCache:
    """Worker side: bundles unpacked once per node under ``root/<digest>/`` (see the module doc)."""

    def __init__(self, root: str | Path, max_mb: float) -> None:
        self.root = Path(root)
        self.max_bytes = int(max_mb * 2**20)
        self._lock = threading.Lock()
        self._in_use: dict[str, int] = {}

    def materialise(self, task: Task, shipped: ShippedTask, fetch: Any) -> Task:
        """``task`` with its folders in this node's cache (unpacked now if absent; ``fetch(shipped.ref)`` gets
        the bundle, whose reference may be ``None`` when ``fetch`` knows it from elsewhere). Pair with
        :meth:`release` once the episode is over."""
        if shipped.digest is None:
            raise ShipError(shipped.refused or f"task {task.full_id} was not shipped")
        entry = self.root / shipped.digest
        with self._lock:
            self._in_use[shipped.digest] = self._in_use.get(shipped.digest, 0) + 1
            try:
                if (entry / COMPLETE).exists():
                    os.utime(entry / COMPLETE)  # most recently used
                else:
                    self._unpack(entry, fetch(shipped.ref))
            except BaseException:
                self._release(shipped.digest)
                raise
        return rewrite(task, shipped, entry)

    def release(self, shipped: ShippedTask) -> None:
        """An episode using ``shipped`` is over: its entry may be evicted again."""
        if shipped.digest is not None:
            with self._lock:
                self._release(shipped.digest)

    def _release(self, digest: str) -> None:
        left = self._in_use.get(digest, 0) - 1
        if left > 0:
            self._in_use[digest] = left
        else:
            self._in_use.pop(digest, None)

    def _unpack(self, entry: Path, bundle: TaskBundle) -> None:
        if bundle.size > self.max_bytes:
            raise ShipError(f"a shipped task of {_size(bundle.size)} does not fit the node's task cache "
                            f"({_size(self.max_bytes)}); raise FleetConfig.ship_cache_max_mb")
        self.root.mkdir(parents=True, exist_ok=True)
        self._make_room(bundle.size)
        tmp = self.root / f".{bundle.digest}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
                tar.extractall(tmp, filter="data")
            (tmp / COMPLETE).write_text(str(bundle.size))
            try:
                os.rename(tmp, entry)
            except OSError:
                if not (entry / COMPLETE).exists():  # not another process's finished copy: a real failure
                    raise
        except (tarfile.TarError, OSError) as exc:
            raise ShipError(f"unpacking shipped task {bundle.digest} into {self.root} failed: {exc}") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _make_room(self, size: int) -> None:
        entries = [(p, (p / COMPLETE).stat().st_mtime) for p in self.root.iterdir()
                   if p.is_dir() and (p / COMPLETE).exists()]
        used = sum(_entry_size(p) for p, _ in entries)
        for path, _ in sorted(entries, key=lambda e: e[1]):
            if used + size <= self.max_bytes:
                break
            if path.name in self._in_use:
                continue
            used -= _entry_size(path)
            (path / COMPLETE).unlink(missing_ok=True)  # invisible first, then gone
            shutil.rmtree(path, ignore_errors=True)
        if used + size > self.max_bytes:
            raise ShipError(f"the node's task cache {self.root} is full ({_size(used)} in use by running "
                            f"episodes, cap {_size(self.max_bytes)}); raise FleetConfig.ship_cache_max_mb")


def layout(task: Task, roots: list[Path]) -> tuple[tuple[str, int, str], ...]:
    """Where each folder field of ``task`` lies among ``roots`` (see :attr:`ShippedTask.layout`)."""
    out = []
    for name in TASK_FIELDS:
        value = getattr(task, name)
        if value is None:
            continue
        path = Path(value).resolve()
        for i, root in enumerate(roots):
            if path.is_relative_to(root):
                out.append((name, i, str(path.relative_to(root))))
                break
    return tuple(out)


def rewrite(task: Task, shipped: ShippedTask, entry: Path) -> Task:
    """``task`` with each shipped folder field moved to the same place under ``entry``."""
    return task.model_copy(update={name: entry / f"r{i}" / rel for name, i, rel in shipped.layout})
