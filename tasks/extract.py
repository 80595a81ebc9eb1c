"""Text extraction from delivered files, for graders that read deliverables (the JobBench judge).

:func:`extract_file` turns one file into text by its kind; :func:`extract_folder` does every file
under a folder and joins them as ``=== FILE: <relative path> ===`` sections, sorted by path.

Kinds: xlsx/xlsm (every sheet, cell values; a formula whose cached value is absent is shown as its
formula), docx (paragraphs and tables in document order), pdf (pypdf, page by page), pptx (slide
text, tables, notes), ipynb (cells and their text outputs), sqlite (schema, row counts and the first
rows of each table), text (csv/txt/md/json/html/… and any other UTF-8 file without NUL bytes).
Anything else (images, archives, unknown binaries) is listed by name and size.

Invariants:
  * extraction never raises for a bad file: a corrupt or unreadable file yields a bracketed note
    and sets ``error`` (a grader must not crash on what an agent wrote);
  * symbolic links are never followed (not the folder itself, not entries inside it): the folder
    comes from an untrusted sandbox, and following a link would read host files;
  * each file's text is capped at ``max_chars`` characters; a cut text ends with a note saying how
    much was left out, and ``truncated`` is set;
  * files larger than ``max_bytes`` are not parsed, only listed;
  * SQLite files are opened read-only and immutable (the deliverable is never modified).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_CHARS_PER_FILE = 20_000
MAX_BYTES_PER_FILE = 64 * 2**20
SQLITE_ROWS_PER_TABLE = 50
MAX_FILES = 200

TEXT_EXTS = {"txt", "md", "markdown", "csv", "tsv", "json", "jsonl", "html", "htm", "xml", "yaml", "yml",
             "py", "r", "sql", "sh", "js", "ts", "css", "ini", "cfg", "conf", "toml", "log", "tex",
             "rst", "geojson", "svg"}
SQLITE_EXTS = {"db", "sqlite", "sqlite3"}
IMAGE_EXTS = {"png", "jpg", "jpeg", "gif", "bmp", "webp", "tif", "tiff"}


@dataclass
class ExtractedFile:
    """One file's text. ``kind`` is the extractor used (``xlsx``, ``text``, ``binary``, …)."""

    path: str
    kind: str
    size: int
    text: str
    chars: int
    truncated: bool = False
    error: str | None = None

    def to_dict(self) -> dict:
        """The file's fields without its text (what a report lists about it)."""
        d = asdict(self)
        d.pop("text")
        return d


def _cap(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    return (text[:max_chars] + f"\n[… truncated: showing the first {max_chars} of {len(text)} characters]",
            True)


def _kind(path: Path, head: bytes) -> str:
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


def _fmt(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return str(v)


def _xlsx(path: Path) -> str:
    import openpyxl

    values = openpyxl.load_workbook(path, data_only=True, read_only=True)
    formulas = openpyxl.load_workbook(path, data_only=False, read_only=True)
    parts = []
    try:
        for ws in values.worksheets:
            fws = formulas[ws.title]
            parts.append(f"--- Sheet: {ws.title} ---")
            for vrow, frow in zip(ws.iter_rows(), fws.iter_rows()):
                cells = []
                for vc, fc in zip(vrow, frow):
                    v = vc.value
                    f = fc.value
                    if v is None and isinstance(f, str) and f.startswith("="):
                        cells.append(f)  # no cached value (written by a library, never recalculated)
                    else:
                        cells.append(_fmt(v))
                while cells and cells[-1] == "":
                    cells.pop()
                if cells:
                    parts.append("\t".join(cells))
    finally:
        values.close()
        formulas.close()
    return "\n".join(parts)


def _docx(path: Path) -> str:
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    doc = docx.Document(str(path))
    parts = []
    for child in doc.element.body.iterchildren():
        tag = child.tag.rsplit("}", 1)[-1]
        if tag == "p":
            text = Paragraph(child, doc).text
            if text.strip():
                parts.append(text)
        elif tag == "tbl":
            parts.append("[table]")
            for row in Table(child, doc).rows:
                parts.append(" | ".join(c.text.strip() for c in row.cells))
            parts.append("[/table]")
    return "\n".join(parts)


def _pdf(path: Path) -> str:
    from pypdf import PdfReader

    reader = PdfReader(str(path))
    return "\n".join(f"--- Page {i} ---\n{page.extract_text() or ''}" for i, page in enumerate(reader.pages, 1))


def _pptx(path: Path) -> str:
    from pptx import Presentation

    prs = Presentation(str(path))
    parts = []
    for i, slide in enumerate(prs.slides, 1):
        parts.append(f"--- Slide {i} ---")
        for shape in slide.shapes:
            if getattr(shape, "has_text_frame", False) and shape.text_frame.text.strip():
                parts.append(shape.text_frame.text)
            if getattr(shape, "has_table", False):
                for row in shape.table.rows:
                    parts.append(" | ".join(c.text.strip() for c in row.cells))
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            notes = slide.notes_slide.notes_text_frame.text.strip()
            if notes:
                parts.append(f"[notes] {notes}")
    return "\n".join(parts)


def _joined(v: object) -> str:
    return "".join(v) if isinstance(v, list) else str(v or "")


def _ipynb(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    parts = []
    for i, cell in enumerate(nb.get("cells", []) if isinstance(nb, dict) else [], 1):
        if not isinstance(cell, dict):
            continue
        parts.append(f"--- Cell {i} ({cell.get('cell_type', '?')}) ---")
        parts.append(_joined(cell.get("source")))
        for out in cell.get("outputs", []) or []:
            if not isinstance(out, dict):
                continue
            otype = out.get("output_type")
            if otype == "stream":
                parts.append(f"[output] {_joined(out.get('text'))}")
            elif otype in ("execute_result", "display_data"):
                data = out.get("data") or {}
                if "text/plain" in data:
                    parts.append(f"[output] {_joined(data['text/plain'])}")
                parts += [f"[output {mime}]" for mime in data if mime.startswith("image/")]
            elif otype == "error":
                parts.append(f"[error] {out.get('ename', '')}: {out.get('evalue', '')}")
    return "\n".join(parts)


def _sqlite(path: Path, rows_per_table: int) -> str:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        parts = ["--- Schema ---"]
        parts += [r[0] for r in con.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name")]
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        for t in tables:
            q = '"' + t.replace('"', '""') + '"'
            try:
                total = con.execute(f"SELECT COUNT(*) FROM {q}").fetchone()[0]
                cur = con.execute(f"SELECT * FROM {q} LIMIT {int(rows_per_table)}")
                rows = cur.fetchall()
            except sqlite3.Error as e:
                parts.append(f"--- Table {t}: unreadable ({e}) ---")
                continue
            parts.append(f"--- Table {t}: {total} rows, first {len(rows)} shown ---")
            parts.append("\t".join(d[0] for d in cur.description or []))
            parts += ["\t".join(_fmt(v) for v in row) for row in rows]
    finally:
        con.close()
    return "\n".join(parts)


def extract_file(path: str | Path, *, rel: str | None = None, max_chars: int = MAX_CHARS_PER_FILE,
                 max_bytes: int = MAX_BYTES_PER_FILE, sqlite_rows: int = SQLITE_ROWS_PER_TABLE) -> ExtractedFile:
    """The text of one regular file (see module doc); never raises for the file's content."""
    p = Path(path)
    name = rel or p.name
    if p.is_symlink():
        return ExtractedFile(name, "symlink", 0, f"[symbolic link to {os.readlink(p)!r}, not followed]",
                             0, error="symbolic link")
    try:
        size = p.stat().st_size
        with p.open("rb") as fh:
            head = fh.read(8192)
    except OSError as e:
        return ExtractedFile(name, "unreadable", 0, f"[cannot read {name}: {e.strerror or e}]", 0, error=str(e))
    kind = _kind(p, head)
    if kind == "binary":
        text = f"[binary file {name}, {size} bytes, not extracted]"
        return ExtractedFile(name, kind, size, text, len(text))
    if size > max_bytes:
        text = f"[{kind} file {name}, {size} bytes: larger than {max_bytes} bytes, not extracted]"
        return ExtractedFile(name, kind, size, text, len(text), error="too large")
    try:
        if kind == "xlsx":
            text = _xlsx(p)
        elif kind == "docx":
            text = _docx(p)
        elif kind == "pdf":
            text = _pdf(p)
        elif kind == "pptx":
            text = _pptx(p)
        elif kind == "ipynb":
            text = _ipynb(p)
        elif kind == "sqlite":
            text = _sqlite(p, sqlite_rows)
        else:
            text = p.read_bytes().decode("utf-8", errors="replace")
    except ImportError as e:
        msg = f"[{kind} file {name}, {size} bytes: extractor unavailable ({e.name or e}); " \
              f"install the package's dev extras]"
        return ExtractedFile(name, kind, size, msg, len(msg), error=f"missing module {e.name}")
    except Exception as e:  # noqa: BLE001 - corrupt file: a note, never a crash (see module doc)
        msg = f"[{kind} file {name}, {size} bytes: could not extract text ({type(e).__name__}: {e})]"
        return ExtractedFile(name, kind, size, msg, len(msg), error=f"{type(e).__name__}: {e}")
    chars = len(text)
    text, truncated = _cap(text, max_chars)
    return ExtractedFile(name, kind, size, text, chars, truncated)


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


def extract_folder(root: str | Path, *, max_chars_per_file: int = MAX_CHARS_PER_FILE,
                   max_files: int = MAX_FILES) -> tuple[str, list[ExtractedFile]]:
    """(joined text, per-file records) for every file under ``root`` (see module doc).

    The joined text is empty exactly when there are no files. Beyond ``max_files`` files the rest
    are named in a closing note, not extracted.
    """
    entries = iter_files(root)
    files = [extract_file(p, rel=rel, max_chars=max_chars_per_file) for rel, p in entries[:max_files]]
    parts = [f"=== FILE: {f.path} ===\n{f.text}\n" for f in files]
    if len(entries) > max_files:
        rest = ", ".join(rel for rel, _ in entries[max_files:max_files + 50])
        parts.append(f"[{len(entries) - max_files} more files not extracted: {rest}]")
    return "\n".join(parts), files
