"""Text extraction from delivered files, for graders that read deliverables (the JobBench judge).

:func:`extract_file` turns one file into text by its kind; :func:`extract_folder` does every file
under a folder and joins them as ``=== FILE: <relative path> ===`` sections, sorted by path.

Kinds: xlsx/xlsm (every sheet, cell values; a formula whose cached value is absent is shown as its
formula), docx (paragraphs and tables in document order), pdf (pypdf, page by page), pptx (slide
text, tables, notes), ipynb (cells and their text outputs), sqlite (schema, row counts and the first
rows of each table), text (csv/txt/md/json/html/… and any other UTF-8 file without NUL bytes).
Anything else (images, archives, unknown binaries) is listed by name and size, never opened.

Where it runs: the structured kinds (everything but text and binary) are parsed in a child process
(:mod:`tasks.extract_worker`) under the bounds of :class:`~tasks.extract_bounds.ExtractLimits`:
address space, wall clock per file and per folder, bytes inflated from a zip container, XML
elements, extracted items (paragraphs, cells, pages, …) and text length. The grading process reads
only the first 8 KiB of a file (to tell its kind) and text files as a stream; it never holds a
parsed deliverable.

Invariants:
  * extraction never raises for a bad file: a corrupt or unreadable file yields a bracketed note
    and sets ``error`` (a grader must not crash on what an agent wrote);
  * a file over a bound yields the text extracted before the bound (or none) followed by a
    ``[bounded: …]`` note, and sets ``bounded`` to the reason; like a corrupt file, it is the
    agent's outcome: the grader judges what could be extracted (the note says the rest was not);
  * symbolic links are never followed (not the folder itself, not entries inside it): the folder
    comes from an untrusted sandbox, and following a link would read host files; only regular
    files are opened;
  * each file's text is capped at ``max_chars`` characters; a cut text ends with a note saying how
    much was left out, and ``truncated`` is set; a file within every bound extracts exactly as it
    did before extraction was bounded;
  * files larger than ``max_bytes`` are not parsed, only listed;
  * SQLite files are opened read-only and immutable (the deliverable is never modified).
"""

from __future__ import annotations

import codecs
import os
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tasks.extract_bounds import ExtractLimits
from tasks.extract_formats import SQLITE_ROWS_PER_TABLE
from tasks.extract_worker import ExtractWorker

MAX_CHARS_PER_FILE = 20_000
MAX_BYTES_PER_FILE = 64 * 2**20
MAX_FILES = 200

TEXT_EXTS = {"txt", "md", "markdown", "csv", "tsv", "json", "jsonl", "html", "htm", "xml", "yaml", "yml",
             "py", "r", "sql", "sh", "js", "ts", "css", "ini", "cfg", "conf", "toml", "log", "tex",
             "rst", "geojson", "svg"}
SQLITE_EXTS = {"db", "sqlite", "sqlite3"}
IMAGE_EXTS = {"png", "jpg", "jpeg", "gif", "bmp", "webp", "tif", "tiff"}
STRUCTURED_KINDS = {"xlsx", "docx", "pdf", "pptx", "ipynb", "sqlite"}
"""Kinds parsed in the extraction worker; ``text`` is streamed here, ``binary`` only listed."""


@dataclass
class ExtractedFile:
    """One file's text. ``kind`` is the extractor used (``xlsx``, ``text``, ``binary``, …);
    ``bounded`` is the reason when a bound of :class:`ExtractLimits` stopped the extraction."""

    path: str
    kind: str
    size: int
    text: str
    chars: int
    truncated: bool = False
    error: str | None = None
    bounded: str | None = None

    def to_dict(self) -> dict:
        """The file's fields without its text (what a report lists about it)."""
        d = asdict(self)
        d.pop("text")
        return d


def _cap_note(max_chars: int, chars: int) -> str:
    return f"\n[… truncated: showing the first {max_chars} of {chars} characters]"


def kind_of(path: Path, head: bytes) -> str:
    """The extractor for a file, from its name and its first bytes."""
    ext = path.suffix.lower().lstrip(".")
    if ext in ("xlsx", "xlsm"):
        return "xlsx"
    if ext in ("docx", "pdf", "pptx", "ipynb"):
        return ext
    if ext in SQLITE_EXTS or head.startswith(b"SQLite format 3\x00"):
        return "sqlite"
    if head.startswith(b"%PDF-"):
        return "pdf"
    if ext in TEXT_EXTS:
        return "text"
    if ext in IMAGE_EXTS:
        return "binary"
    if b"\x00" not in head:
        try:
            head.decode("utf-8")
            return "text"
        except UnicodeDecodeError as e:  # a multi-byte character cut at the end of the sample is fine
            if e.start >= len(head) - 3:
                return "text"
    return "binary"


def _stream_text(fd: int, max_chars: int) -> tuple[str, int]:
    """(first ``max_chars + 1`` characters, total characters) of a UTF-8 file, decoded with
    replacement as one piece would be, read in 1 MiB chunks (memory stays bounded)."""
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    head: list[str] = []
    kept = chars = 0
    while True:
        chunk = os.read(fd, 2**20)
        piece = dec.decode(chunk, final=not chunk)
        chars += len(piece)
        if kept <= max_chars and piece:
            head.append(piece[:max_chars + 1 - kept])
            kept += len(head[-1])
        if not chunk:
            return "".join(head), chars


def _open_regular(p: Path) -> tuple[int, os.stat_result]:
    """An fd of ``p`` opened without following a link or blocking on a fifo; OSError if it is not
    a regular file."""
    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(f"{p.name} is not a regular file")
    return fd, st


def extract_file(path: str | Path, *, rel: str | None = None, max_chars: int = MAX_CHARS_PER_FILE,
                 max_bytes: int = MAX_BYTES_PER_FILE, sqlite_rows: int = SQLITE_ROWS_PER_TABLE,
                 limits: ExtractLimits | None = None, worker: ExtractWorker | None = None) -> ExtractedFile:
    """The text of one regular file (see module doc); never raises for the file's content.

    ``worker`` is the extraction worker to use (one is started and stopped for this file when
    None); ``limits`` are its bounds when it is started here (the defaults otherwise).
    """
    p = Path(path)
    name = rel or p.name
    if p.is_symlink():
        return ExtractedFile(name, "symlink", 0, f"[symbolic link to {os.readlink(p)!r}, not followed]",
                             0, error="symbolic link")
    try:
        fd, st = _open_regular(p)
    except OSError as e:
        return ExtractedFile(name, "unreadable", 0, f"[cannot read {name}: {e.strerror or e}]", 0, error=str(e))
    try:
        size = st.st_size
        head = os.pread(fd, 8192, 0)
        kind = kind_of(p, head)
        if kind == "binary":
            text = f"[binary file {name}, {size} bytes, not extracted]"
            return ExtractedFile(name, kind, size, text, len(text))
        if size > max_bytes:
            text = f"[{kind} file {name}, {size} bytes: larger than {max_bytes} bytes, not extracted]"
            return ExtractedFile(name, kind, size, text, len(text), error="too large")
        if kind not in STRUCTURED_KINDS:
            text, chars = _stream_text(fd, max_chars)
            if chars > max_chars:
                return ExtractedFile(name, kind, size, text[:max_chars] + _cap_note(max_chars, chars), chars, True)
            return ExtractedFile(name, kind, size, text, chars)
    except OSError as e:
        return ExtractedFile(name, "unreadable", 0, f"[cannot read {name}: {e.strerror or e}]", 0, error=str(e))
    finally:
        os.close(fd)
    if worker is None:
        with ExtractWorker(limits) as own:
            return _structured(own, p, name, kind, size, max_chars, sqlite_rows)
    return _structured(worker, p, name, kind, size, max_chars, sqlite_rows)


def _structured(worker: ExtractWorker, p: Path, name: str, kind: str, size: int, max_chars: int,
                sqlite_rows: int) -> ExtractedFile:
    ans = worker.extract(p, kind, max_chars=max_chars, sqlite_rows=sqlite_rows)
    if ans.missing_module is not None:
        msg = f"[{kind} file {name}, {size} bytes: extractor unavailable ({ans.missing_module}); " \
              f"install the package's dev extras]"
        return ExtractedFile(name, kind, size, msg, len(msg), error=ans.error)
    if ans.error is not None:
        msg = f"[{kind} file {name}, {size} bytes: could not extract text ({ans.error})]"
        return ExtractedFile(name, kind, size, msg, len(msg), error=ans.error)
    truncated = ans.chars > max_chars
    text = ans.head + (_cap_note(max_chars, ans.chars) if truncated else "")
    if ans.bounded is not None:
        what = "the text above is what was extracted before it" if ans.chars else "no text was extracted"
        text += f"{chr(10) if ans.chars else ''}[bounded: {kind} file {name}, {size} bytes: extraction stopped " \
                f"because {ans.bounded}; {what}]"
    return ExtractedFile(name, kind, size, text, ans.chars, truncated, bounded=ans.bounded)


def iter_files(root: str | Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of every entry to report under ``root``, sorted; symlinks are
    reported (as links) but never descended into or read; fifos, sockets and devices are left out.
    Empty when ``root`` is absent or a link. The walk keeps its own stack (any depth is fine) and
    relative paths are valid UTF-8 (undecodable bytes of a name shown as ``\\xNN``)."""
    root = Path(root)
    if root.is_symlink() or not root.is_dir():
        return []
    out: list[tuple[str, Path]] = []
    stack = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            rel = prefix + os.fsencode(e.name).decode("utf-8", "backslashreplace")
            try:
                if e.is_symlink() or e.is_file(follow_symlinks=False):
                    out.append((rel, Path(e.path)))
                elif e.is_dir(follow_symlinks=False):
                    stack.append((Path(e.path), rel + "/"))
            except OSError:
                continue
    return sorted(out)


def _out_of_time(rel: str, limits: ExtractLimits) -> ExtractedFile:
    reason = f"the folder's extraction time budget of {limits.total_timeout_s:g} s ran out"
    text = f"[bounded: {rel} not extracted: {reason}]"
    return ExtractedFile(rel, "skipped", 0, text, len(text), bounded=reason)


def extract_folder(root: str | Path, *, max_chars_per_file: int = MAX_CHARS_PER_FILE,
                   max_files: int = MAX_FILES, limits: ExtractLimits | None = None) -> tuple[str, list[ExtractedFile]]:
    """(joined text, per-file records) for every file under ``root`` (see module doc).

    The joined text is empty exactly when there are no files. Beyond ``max_files`` files the rest
    are named in a closing note, not extracted. One extraction worker serves the whole folder;
    once ``limits.total_timeout_s`` has passed (not counting time spent waiting for a worker slot
    held by other gradings), the remaining files are recorded as bounded.
    """
    limits = limits or ExtractLimits()
    entries = iter_files(root)
    files: list[ExtractedFile] = []
    t0 = time.monotonic()
    with ExtractWorker(limits) as worker:
        for rel, p in entries[:max_files]:
            if time.monotonic() - t0 - worker.waited_s >= limits.total_timeout_s:
                files.append(_out_of_time(rel, limits))
            else:
                files.append(extract_file(p, rel=rel, max_chars=max_chars_per_file, worker=worker))
    parts = [f"=== FILE: {f.path} ===\n{f.text}\n" for f in files]
    if len(entries) > max_files:
        rest = ", ".join(rel for rel, _ in entries[max_files:max_files + 50])
        parts.append(f"[{len(entries) - max_files} more files not extracted: {rest}]")
    return "\n".join(parts), files


__all__ = ["MAX_BYTES_PER_FILE", "MAX_CHARS_PER_FILE", "MAX_FILES", "ExtractLimits", "ExtractedFile",
           "extract_file", "extract_folder", "iter_files", "kind_of"]
