"""The parsers of the structured kinds of deliverables, each bounded by :mod:`tasks.extract_bounds`.

These run in the extraction worker (:mod:`tasks.extract_worker`), never in the grading process:
they open files an agent wrote with third-party parsers, and a parser can be made to hold far more
memory or time than the file's size suggests. :func:`parse` dispatches on the kind
:func:`tasks.extract.kind_of` gave.

Invariants: the text of a file within every bound is exactly what these parsers gave before they
were bounded (xlsx: every sheet, cell values, a formula shown where its cached value is absent;
docx: paragraphs and tables in document order; pdf: page by page; pptx: slide text, tables,
notes; ipynb: cells and text outputs; sqlite: schema, row counts, first rows); containers are
checked by :func:`check_zip` before a parser opens them; a bound reached while parsing raises
:class:`Bounded` and the collector keeps the text extracted before it.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

from tasks.extract_bounds import Bounded, Collector, check_zip

SQLITE_ROWS_PER_TABLE = 50
_XLSX_STREAMED = re.compile(r"^xl/worksheets/[^/]+\.xml$")


def fmt(v: object) -> str:
    """A cell value as text: ``None`` is empty, an integral float has no ``.0``."""
    if v is None:
        return ""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return str(v)


def _xlsx(path: Path, out: Collector) -> None:
    import openpyxl

    # worksheets are read as streams (read-only mode): bounded by the cell count below
    check_zip(path, out.limits, streamed=lambda name: bool(_XLSX_STREAMED.match(name)), collector=out)
    values = openpyxl.load_workbook(path, data_only=True, read_only=True)
    formulas = openpyxl.load_workbook(path, data_only=False, read_only=True)
    try:
        for ws in values.worksheets:
            fws = formulas[ws.title]
            out.add(f"--- Sheet: {ws.title} ---")
            for vrow, frow in zip(ws.iter_rows(), fws.iter_rows()):
                cells = []
                for vc, fc in zip(vrow, frow):
                    out.count("spreadsheet cells")
                    v = vc.value
                    f = fc.value
                    if v is None and isinstance(f, str) and f.startswith("="):
                        cells.append(f)  # no cached value (written by a library, never recalculated)
                    else:
                        cells.append(fmt(v))
                while cells and cells[-1] == "":
                    cells.pop()
                if cells:
                    out.add("\t".join(cells))
    finally:
        values.close()
        formulas.close()


def _docx(path: Path, out: Collector) -> None:
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    check_zip(path, out.limits, collector=out)  # python-docx holds every part as a tree
    doc = docx.Document(str(path))
    for child in doc.element.body.iterchildren():
        tag = child.tag.rsplit("}", 1)[-1]
        if tag == "p":
            out.count("paragraphs and table cells")
            text = Paragraph(child, doc).text
            if text.strip():
                out.add(text)
        elif tag == "tbl":
            out.add("[table]")
            for row in Table(child, doc).rows:
                # a cell spanning n grid columns is listed n times: count them before they are built
                out.count("paragraphs and table cells", max(1, sum(max(1, tc.grid_span) for tc in row._tr.tc_lst)))
                out.add(" | ".join(c.text.strip() for c in row.cells))
            out.add("[/table]")


def _pdf(path: Path, out: Collector) -> None:
    from pypdf import PdfReader

    reader = PdfReader(str(path))
    for i, page in enumerate(reader.pages, 1):
        out.count("pages", cap=out.limits.max_pages)
        out.add(f"--- Page {i} ---\n{page.extract_text() or ''}")


def _pptx(path: Path, out: Collector) -> None:
    from pptx import Presentation

    check_zip(path, out.limits, collector=out)
    prs = Presentation(str(path))
    for i, slide in enumerate(prs.slides, 1):
        out.count("slides, shapes and table cells")
        out.add(f"--- Slide {i} ---")
        for shape in slide.shapes:
            out.count("slides, shapes and table cells")
            if getattr(shape, "has_text_frame", False) and shape.text_frame.text.strip():
                out.add(shape.text_frame.text)
            if getattr(shape, "has_table", False):
                for row in shape.table.rows:
                    out.count("slides, shapes and table cells", max(1, len(row.cells)))
                    out.add(" | ".join(c.text.strip() for c in row.cells))
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            notes = slide.notes_slide.notes_text_frame.text.strip()
            if notes:
                out.add(f"[notes] {notes}")


def _joined(v: object) -> str:
    return "".join(v) if isinstance(v, list) else str(v or "")


def _ipynb(path: Path, out: Collector) -> None:
    nb = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    for i, cell in enumerate(nb.get("cells", []) if isinstance(nb, dict) else [], 1):
        if not isinstance(cell, dict):
            continue
        out.count("notebook cells and outputs")
        out.add(f"--- Cell {i} ({cell.get('cell_type', '?')}) ---")
        out.add(_joined(cell.get("source")))
        for o in cell.get("outputs", []) or []:
            if not isinstance(o, dict):
                continue
            out.count("notebook cells and outputs")
            otype = o.get("output_type")
            if otype == "stream":
                out.add(f"[output] {_joined(o.get('text'))}")
            elif otype in ("execute_result", "display_data"):
                data = o.get("data") or {}
                if "text/plain" in data:
                    out.add(f"[output] {_joined(data['text/plain'])}")
                for mime in data:
                    if mime.startswith("image/"):
                        out.add(f"[output {mime}]")
            elif otype == "error":
                out.add(f"[error] {o.get('ename', '')}: {o.get('evalue', '')}")


def _sqlite(path: Path, out: Collector, rows_per_table: int) -> None:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    con.set_progress_handler(lambda: int(out.expired()), 10_000)  # a query past the deadline is interrupted
    try:
        out.add("--- Schema ---")
        for r in con.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name"):
            out.count("schema entries and tables")
            out.add(r[0])
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        for t in tables:
            out.count("schema entries and tables")
            q = '"' + t.replace('"', '""') + '"'
            try:
                total = con.execute(f"SELECT COUNT(*) FROM {q}").fetchone()[0]
                cur = con.execute(f"SELECT * FROM {q} LIMIT {int(rows_per_table)}")
                rows = cur.fetchall()
            except sqlite3.Error as e:
                out.check_time()  # an interrupted query is the deadline, not a bad table
                out.add(f"--- Table {t}: unreadable ({e}) ---")
                continue
            out.add(f"--- Table {t}: {total} rows, first {len(rows)} shown ---")
            out.add("\t".join(d[0] for d in cur.description or []))
            for row in rows:
                out.add("\t".join(fmt(v) for v in row))
    except sqlite3.Error:
        out.check_time()
        raise
    finally:
        con.close()


def parse(kind: str, path: Path, out: Collector, *, sqlite_rows: int = SQLITE_ROWS_PER_TABLE) -> None:
    """Extract ``path`` (of a structured ``kind``) into ``out``; :class:`Bounded` at a bound, any
    other exception for a file the parser rejects (the caller turns it into a note)."""
    if kind == "xlsx":
        _xlsx(path, out)
    elif kind == "docx":
        _docx(path, out)
    elif kind == "pdf":
        _pdf(path, out)
    elif kind == "pptx":
        _pptx(path, out)
    elif kind == "ipynb":
        _ipynb(path, out)
    elif kind == "sqlite":
        _sqlite(path, out, sqlite_rows)
    else:
        raise ValueError(f"no structured parser for kind {kind!r}")


__all__ = ["Bounded", "SQLITE_ROWS_PER_TABLE", "fmt", "parse"]
