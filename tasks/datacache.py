"""Task dirs materialised from benchmark data (a CSV of questions, a parquet/JSONL table of tasks).

Suites that ship as data rather than as task folders (OfficeQA, the hub form of ClawGym-Bench) are
turned into ordinary ClawGym task dirs under a cache folder, then loaded with
:func:`tasks.taskdir.load_task_dir`, so every runner sees the same :class:`~clawgym_env.task.Task`.

Invariants:
  * one cache folder per (suite name, content key): ``<cache>/<name>-<key[:16]>/<task_id>/``;
    ``<cache>`` is ``cache_dir`` when given, else ``$CLAWGYM_CACHE/suites`` (default
    ``~/.cache/clawgym/suites``); the key is a digest of everything written, so changed data
    lands in a new folder and an unchanged one is reused without rewriting;
  * a folder is published only when complete (built under a temporary name, then renamed), so
    concurrent loaders and interrupted builds never expose a half-written suite;
  * every relative path taken from data goes through :func:`safe_relpath`: no absolute paths, no
    ``..``, nothing that could write outside the task dir;
  * large inputs (e.g. PDFs) are hard-linked into the cache when the filesystem allows it, copied
    otherwise; never symlinked (workspaces are copied with links kept as links).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from clawgym_env.errors import TaskError
from clawgym_env.jsontypes import JSONObject

COMPLETE_MARKER = ".clawgym-complete"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where materialised suites live (see module doc)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    base = os.environ.get("CLAWGYM_CACHE") or str(Path.home() / ".cache" / "clawgym")
    return Path(base).expanduser() / "suites"


def digest(obj: Any) -> str:
    """A stable hex digest of a JSON-serialisable object (keys sorted; bytes hashed, not dumped)."""
    h = hashlib.sha256()

    def feed(x: Any) -> Any:
        if isinstance(x, (bytes, bytearray)):
            return {"sha256": hashlib.sha256(x).hexdigest()}
        if isinstance(x, Path):
            return str(x)
        if isinstance(x, dict):
            return {str(k): feed(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [feed(v) for v in x]
        return x

    h.update(json.dumps(feed(obj), sort_keys=True, ensure_ascii=False, default=str).encode())
    return h.hexdigest()


def safe_relpath(raw: Any, what: str) -> PurePosixPath:
    """``raw`` as a relative POSIX path that stays inside its folder, or TaskError naming ``what``."""
    if not isinstance(raw, str) or not raw.strip():
        raise TaskError(f"{what}: file path must be a non-empty string, got {raw!r}")
    path = PurePosixPath(raw.strip().replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts or path.parts == (".",):
        raise TaskError(f"{what}: file path {raw!r} must be relative and stay inside the task "
                        f"(no leading '/', no '..')")
    return PurePosixPath(*[p for p in path.parts if p != "."])


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` at ``dst`` (same filesystem), else copy it with its metadata."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_file(root: Path, rel: PurePosixPath | str, content: str | bytes | Path, *,
               executable: bool = False) -> Path:
    """Write ``content`` (text, bytes, or a host file to link/copy) at ``root/rel``."""
    dst = root / Path(str(rel))
    dst.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, Path):
        link_or_copy(content, dst)
    elif isinstance(content, (bytes, bytearray)):
        dst.write_bytes(bytes(content))
    else:
        dst.write_text(content, encoding="utf-8")
    if executable:
        dst.chmod(0o755)
    return dst


def write_entry(task_dir: Path, entry: JSONObject) -> None:
    """``data_entry.json`` of a task dir (pretty, UTF-8, as upstream writes it)."""
    write_file(task_dir, "data_entry.json", json.dumps(entry, indent=2, ensure_ascii=False) + "\n")


def materialise(name: str, key: str, build: Callable[[Path], None],
                cache_dir: str | Path | None = None) -> Path:
    """The cache folder for ``(name, key)``, calling ``build(tmp_folder)`` first when it is absent."""
    root = cache_root(cache_dir)
    final = root / f"{name}-{key[:16]}"
    if (final / COMPLETE_MARKER).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{final.name}.building-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        build(tmp)
        (tmp / COMPLETE_MARKER).write_text(key + "\n")
        try:
            tmp.rename(final)
        except OSError:
            if not (final / COMPLETE_MARKER).is_file():  # a stale, incomplete folder: replace it
                shutil.rmtree(final, ignore_errors=True)
                tmp.rename(final)
    except OSError as e:
        raise TaskError(f"cannot write the {name} task dirs under {root} ({e.strerror or e}); "
                        f"pass cache_dir= a writable folder or set CLAWGYM_CACHE") from e
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
