"""Bounded extraction of an agent's deliverables: bombs built here (a docx of millions of
paragraphs, a zip bomb, a huge sheet, a pdf of thousands of pages, a table cell spanning two
billion columns, …) stop at a named bound in the extraction worker, with a reason that reaches the
grade, while honest files next to them extract as before and the grading process never parses."""

from __future__ import annotations

import sqlite3
import zipfile
from pathlib import Path

import pytest

from clawgym_env.grading.grade import GradeContext
from tasks.extract import ExtractLimits, extract_file, extract_folder
from tasks.jobbench import load_jobbench, score_jobbench

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
FIXTURES = Path(__file__).resolve().parent.parent / "tasks" / "fixtures" / "jobbench"


# -- bomb builders ---------------------------------------------------------------------------------

def _honest_docx(path: Path, line: str) -> Path:
    import docx

    d = docx.Document()
    d.add_paragraph(line)
    d.save(str(path))
    return path


def _docx_with_body(path: Path, body_parts, *, extra: dict[str, bytes] | None = None) -> Path:
    """A docx made from a real one, its document body replaced by the streamed ``body_parts``."""
    src = _honest_docx(path.with_suffix(".src.docx"), "seed")
    with zipfile.ZipFile(src) as s, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for info in s.infolist():
            if info.filename != "word/document.xml":
                z.writestr(info, s.read(info))
        with z.open("word/document.xml", "w", force_zip64=True) as f:
            f.write(f'<w:document xmlns:w="{W_NS}"><w:body>'.encode())
            for part in body_parts:
                f.write(part)
            f.write(b"</w:body></w:document>")
        for name, data in (extra or {}).items():
            with z.open(name, "w", force_zip64=True) as f:
                f.write(data)
    src.unlink()
    return path


def _paragraph_bomb(path: Path, paragraphs: int) -> Path:
    first = b"<w:p><w:r><w:t>Opening paragraph</w:t></w:r></w:p>"
    return _docx_with_body(path, [first] + [b"<w:p/>" * 100_000] * (paragraphs // 100_000))


def _sheet(path: Path, rows: int, *, dimension: bool) -> Path:
    """An xlsx made with openpyxl, its first sheet replaced by ``rows`` rows of two cells."""
    import openpyxl

    src = path.with_suffix(".src.xlsx")
    wb = openpyxl.Workbook()
    wb.active.title = "Data"
    wb.active.append(["seed", 1])
    wb.save(src)
    ns = b'<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
    with zipfile.ZipFile(src) as s, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for info in s.infolist():
            if info.filename != "xl/worksheets/sheet1.xml":
                z.writestr(info, s.read(info))
        with z.open("xl/worksheets/sheet1.xml", "w", force_zip64=True) as f:
            f.write(ns + (b'<dimension ref="A1:B%d"/>' % rows if dimension else b"") + b"<sheetData>")
            for start in range(1, rows + 1, 10_000):
                f.write(b"".join(b'<row r="%d"><c r="A%d"><v>%d</v></c><c r="B%d"><v>7</v></c></row>' % (i, i, i, i)
                                 for i in range(start, min(rows, start + 9_999) + 1)))
            f.write(b"</sheetData></worksheet>")
    src.unlink()
    return path


def _many_page_pdf(pages: int) -> bytes:
    """A valid PDF of ``pages`` pages sharing one content stream and one font (small on disk)."""
    content = b"BT /F1 12 Tf 72 720 Td (Page body) Tj ET"
    objs = {1: b"<< /Type /Catalog /Pages 2 0 R >>",
            3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            4: b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream"}
    page = (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
            b"/Resources << /Font << /F1 3 0 R >> >> >>")
    for i in range(pages):
        objs[5 + i] = page
    objs[2] = b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % (5 + i) for i in range(pages)) + \
        b"] /Count %d >>" % pages
    out = bytearray(b"%PDF-1.4\n")
    offsets = {}
    for n in sorted(objs):
        offsets[n] = len(out)
        out += b"%d 0 obj\n" % n + objs[n] + b"\nendobj\n"
    xref, size = len(out), max(objs) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    out += b"".join(b"%010d 00000 n \n" % offsets[n] for n in range(1, size))
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref)
    return bytes(out)


# -- bombs ------------------------------------------------------------------------------------------

def test_paragraph_bomb_is_bounded_and_never_parsed_here(tmp_path, monkeypatch):
    """5 M empty paragraphs (a 30 MB body deflated to ~30 KB) stop at the XML element bound; the
    grading process's own python-docx is broken here, so the honest docx beside it can only
    extract the way it does: in the worker."""
    import docx

    def not_here(*a, **k):
        raise AssertionError("a deliverable was parsed in the grading process")

    out = tmp_path / "outputs"
    out.mkdir()
    _paragraph_bomb(out / "bomb.docx", 5_000_000)
    _honest_docx(out / "memo.docx", "Total to reimburse: 671.75")
    monkeypatch.setattr(docx, "Document", not_here)
    text, files = extract_folder(out)
    bomb, memo = files
    assert bomb.bounded == "more than 1000000 XML elements (reached in word/document.xml)"
    assert bomb.error is None and bomb.chars == 0
    assert "[bounded: docx file bomb.docx" in bomb.text and "no text was extracted" in bomb.text
    assert memo.text == "Total to reimburse: 671.75" and memo.bounded is None
    assert "=== FILE: memo.docx ===\nTotal to reimburse: 671.75" in text


def test_memory_limit_stops_a_bomb_the_content_bounds_let_through(tmp_path):
    """With the element bound lifted, the same bomb meets the worker's address-space limit (as a
    bounded file, not a crash), and the next file gets a fresh worker."""
    out = tmp_path / "outputs"
    out.mkdir()
    _paragraph_bomb(out / "a_bomb.docx", 5_000_000)
    _honest_docx(out / "b_memo.docx", "after the bomb")
    _, files = extract_folder(out, limits=ExtractLimits(max_elements=10**9, memory_mb=400))
    assert files[0].bounded == "it needs more than the parser's memory limit of 400 MiB"
    assert files[1].text == "after the bomb" and files[1].bounded is None


def test_zip_bomb_inside_a_docx_and_a_plain_zip(tmp_path):
    """A docx carrying a 300 MiB member of zeros (deflated to ~300 KB) is refused on its declared
    sizes before any parser opens it; a plain .zip is never opened at all."""
    zeros = b"\0" * (300 * 2**20)
    bomb = _docx_with_body(tmp_path / "bomb.docx", [b"<w:p><w:r><w:t>kept?</w:t></w:r></w:p>"],
                           extra={"word/media/image1.png": zeros})
    f = extract_file(bomb)
    assert f.bounded is not None and "uncompressed, more than 268435456" in f.bounded, f.bounded
    assert "kept?" not in f.text
    with zipfile.ZipFile(tmp_path / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("zeros.bin", zeros)
    z = extract_file(tmp_path / "bomb.zip")
    assert z.kind == "binary" and z.bounded is None and "not extracted" in z.text


def test_too_many_members_and_inflated_bytes_are_bounded(tmp_path):
    members = _docx_with_body(tmp_path / "members.docx", [], extra={f"x/{i}.bin": b"" for i in range(60)})
    f = extract_file(members, limits=ExtractLimits(max_zip_members=50))
    assert f.bounded is not None and f.bounded.startswith("the archive has ") and "more than 50" in f.bounded
    big = _docx_with_body(tmp_path / "big.docx", [b"<w:p/>" * 200_000])
    f = extract_file(big, limits=ExtractLimits(max_unzipped_bytes=2**20))
    assert f.bounded is not None and "more than 1048576" in f.bounded


def test_huge_sheet_keeps_its_first_rows(tmp_path):
    """500 k rows stop at the cell bound with the rows read before it shown."""
    f = extract_file(_sheet(tmp_path / "huge.xlsx", 500_000, dimension=True),
                     limits=ExtractLimits(max_elements=50_000))
    assert f.bounded == "more than 50000 spreadsheet cells"
    assert f.text.startswith("--- Sheet: Data ---\n1\t7\n2\t7\n") and f.truncated
    assert f.chars > 20_000 and "the text above is what was extracted before it" in f.text


def test_a_parser_stuck_past_its_deadline_is_killed_and_the_next_file_extracts(tmp_path):
    """openpyxl scans a sheet without a <dimension> end to end before its first row, where the
    worker cannot stop itself: the parent kills it at the deadline and starts a fresh one."""
    out = tmp_path / "outputs"
    out.mkdir()
    _sheet(out / "a_slow.xlsx", 1_000_000, dimension=False)
    _honest_docx(out / "b_memo.docx", "after the slow sheet")
    _, files = extract_folder(out, limits=ExtractLimits(file_timeout_s=0.5, kill_grace_s=0.5))
    assert files[0].bounded == "its extraction took longer than 0.5 s (the parser was stopped)"
    assert files[1].text == "after the slow sheet"


def test_deadline_where_the_worker_stops_itself_and_the_folder_budget(tmp_path):
    f = extract_file(_paragraph_bomb(tmp_path / "p.docx", 400_000), limits=ExtractLimits(file_timeout_s=0.0))
    assert f.bounded == "its extraction took longer than 0 s"
    out = tmp_path / "outputs"
    out.mkdir()
    _honest_docx(out / "memo.docx", "never reached")
    (out / "notes.md").write_text("never reached either")
    text, files = extract_folder(out, limits=ExtractLimits(total_timeout_s=0.0))
    assert [f.bounded for f in files] == ["the folder's extraction time budget of 0 s ran out"] * 2
    assert "never reached" not in text


def test_pdf_of_thousands_of_pages(tmp_path):
    (tmp_path / "many.pdf").write_bytes(_many_page_pdf(2_500))
    f = extract_file(tmp_path / "many.pdf", max_chars=10**6)
    assert f.bounded == "more than 2000 pages"
    assert "--- Page 2000 ---\nPage body" in f.text and "--- Page 2001 ---" not in f.text


def test_cell_spanning_two_billion_columns(tmp_path):
    """python-docx lists a spanned cell once per grid column it spans: counted before it is built."""
    row = (b"<w:tbl><w:tr><w:tc><w:tcPr><w:gridSpan w:val=\"2000000000\"/></w:tcPr>"
           b"<w:p><w:r><w:t>wide</w:t></w:r></w:p></w:tc></w:tr></w:tbl>")
    f = extract_file(_docx_with_body(tmp_path / "span.docx", [b"<w:p><w:r><w:t>before</w:t></w:r></w:p>", row]))
    assert f.bounded == "more than 1000000 paragraphs and table cells"
    assert f.text.startswith("before\n[table]\n")


def test_text_and_sqlite_bounds(tmp_path):
    con = sqlite3.connect(tmp_path / "many.db")
    for i in range(120):
        con.execute(f"CREATE TABLE t{i:03d} (x)")
    con.commit()
    con.close()
    f = extract_file(tmp_path / "many.db", limits=ExtractLimits(max_elements=100))
    assert f.bounded == "more than 100 schema entries and tables" and "CREATE TABLE t000" in f.text
    f = extract_file(_paragraph_bomb(tmp_path / "long.docx", 0), limits=ExtractLimits(max_text_chars=10))
    assert f.bounded == "its text is longer than 10 characters" and f.text.startswith("Opening pa\n[bounded:")


def test_streamed_text_matches_a_whole_decode(tmp_path):
    """Text files are read in 1 MiB chunks on the host: the same text and count as one decode,
    with a multi-byte character and invalid bytes across the chunk edges."""
    raw = ("é" * (2**19 - 1)).encode() + b"a\xe2\x82" + b"\xff\xfe" + "€ tail".encode() * 300_000
    (tmp_path / "t.txt").write_bytes(raw)
    whole = raw.decode("utf-8", errors="replace")
    f = extract_file(tmp_path / "t.txt", max_chars=2**20)
    assert f.chars == len(whole) and f.truncated
    assert f.text == whole[:2**20] + f"\n[… truncated: showing the first {2**20} of {len(whole)} characters]"
    assert extract_file(tmp_path / "t.txt", max_chars=10**8).text == whole


# -- the grade -------------------------------------------------------------------------------------

@pytest.fixture
def judged_workspace(tmp_path):
    """An accountants__task1 workspace whose outputs/ hold a paragraph bomb and the right deliverables."""
    from clawgym_env.episodes.run import prepare_workspace

    task = load_jobbench(FIXTURES, "main").get("accountants__task1")
    ws = prepare_workspace(task, tmp_path / "ws")
    (ws / "outputs").mkdir()
    import openpyxl

    _paragraph_bomb(ws / "outputs" / "bomb.docx", 2_000_000)
    wb = openpyxl.Workbook()
    for row in (["claim", "approved", "decision"], ["E02", "50.00", "reduced to the meal cap"],
                ["E04", "0", "rejected: missing receipt"]):
        wb.active.append(row)
    wb.save(ws / "outputs" / "reconciliation.xlsx")
    (ws / "outputs" / "memo.md").write_text("Total to reimburse: 671.75. E08 is rejected too.")
    return task, ws


def test_a_bounded_deliverable_is_graded_as_the_agents_outcome(judged_workspace):
    """The judge sees the note in place of the bomb and grades the rest: status ok, the reason
    names the bounded file (never reward_invalid)."""
    from clawgym_env.testing import JudgeServer
    from tasks.graders import JobBenchGrader
    from tasks.judge import JudgeClient
    from tests.test_jobbench import phrase_judge

    task, ws = judged_workspace
    with JudgeServer(phrase_judge) as srv:
        judge = JudgeClient(srv.base_url, "phrase-judge", backoff_s=0.01)
        reward, details = score_jobbench(task, ws, judge)
        grade = JobBenchGrader().grade(GradeContext(task=task, workspace=ws, judge=judge))
        prompts = [r["messages"][-1]["content"] for r in srv.requests]
    assert reward == 1.0 and details["judge_errors"] == 0
    assert details["extraction_note"].endswith("bomb.docx: more than 1000000 XML elements "
                                               "(reached in word/document.xml)")
    assert all("[bounded: docx file bomb.docx" in p for p in prompts)
    assert (grade.status, grade.reward) == ("ok", 1.0)
    assert grade.reason == details["extraction_note"]


def test_the_worker_holds_no_secret_of_the_grading_process(tmp_path, monkeypatch):
    from tasks.extract_worker import ExtractWorker

    monkeypatch.setenv("CLAWGYM_JUDGE_API_KEY", "sk-grader-secret")
    with ExtractWorker() as worker:
        ans = worker.extract(_honest_docx(tmp_path / "m.docx", "hello"), "docx", max_chars=100, sqlite_rows=5)
        assert worker._proc is not None
        env = Path(f"/proc/{worker._proc.pid}/environ").read_bytes()
    assert ans.head == "hello" and b"PYTHONPATH=" in env and b"sk-grader-secret" not in env


def test_a_memory_limit_too_low_for_the_parsers_is_the_hosts_error(tmp_path):
    """Every file would look like a bomb under it: the worker refuses to start instead, and the
    grade is no valid reward (TaskError), never an agent's 0."""
    from clawgym_env.errors import TaskError

    with pytest.raises(TaskError, match="extraction worker did not start .*no room for the parsers"):
        extract_file(_honest_docx(tmp_path / "m.docx", "hello"), limits=ExtractLimits(memory_mb=120))
