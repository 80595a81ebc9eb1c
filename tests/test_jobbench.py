"""JobBench: loader (folder and parquet forms), text extraction, and rubric scoring against a real
local OpenAI-compatible judge server whose verdicts depend on the prompt it receives."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from clawgym_env.episodes.run import prepare_workspace
from clawgym_env.errors import TaskError
from clawgym_env.task import Task
from clawgym_env.testing import JudgeServer, free_port
from tasks import load_suite, resolve_task
from tasks.extract import extract_file, extract_folder
from tasks.jobbench import (
    DATA_ENV,
    HIDDEN_FILES,
    JobBenchTask,
    jobbench_leaderboard_score,
    load_jobbench,
    rubrics_for,
    score_jobbench,
)
from tasks.judge import JudgeClient

FIXTURES = Path(__file__).resolve().parent.parent / "tasks" / "fixtures" / "jobbench"
CRIT_RE = re.compile(r"^Criterion (\d+): (.*)$", re.M)


def phrase_judge(body: dict, *, claim_rubric_pass: bool | None = None) -> tuple[int, str]:
    """A criterion passes iff every "quoted phrase" in it occurs in the delivered files' text."""
    assert body["temperature"] == 0.0
    user = body["messages"][-1]["content"]
    delivered = user.split("# Delivered files\n", 1)[1].rsplit("\n\n# Answer\n", 1)[0].lower()
    verdicts = [{"index": int(i), "pass": all(p.lower() in delivered for p in re.findall(r'"([^"]+)"', c)),
                 "reason": "phrase check"} for i, c in CRIT_RE.findall(user)]
    rubric_pass = all(v["pass"] for v in verdicts) if claim_rubric_pass is None else claim_rubric_pass
    return 200, "Verdict follows.\n```json\n" + json.dumps({"criteria": verdicts, "rubric_pass": rubric_pass}) + "\n```"


@pytest.fixture(scope="module")
def server():
    with JudgeServer(phrase_judge) as srv:
        yield srv


@pytest.fixture
def judge(server):
    server.handler = phrase_judge
    server.requests.clear()
    return JudgeClient(server.base_url, "phrase-judge", backoff_s=0.01)


@pytest.fixture(scope="module")
def main_suite():
    return load_jobbench(FIXTURES, "main")


def _task(suite, tid) -> JobBenchTask:
    return suite.get(tid)


def _write(ws: Path, rel: str, text: str) -> Path:
    p = ws / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


# -- loader ----------------------------------------------------------------------------------------

def test_folder_loader_builds_tasks(main_suite):
    assert [t.id for t in main_suite] == ["accountants__task1", "paralegals__task1"] and not main_suite.issues
    t = _task(main_suite, "accountants__task1")
    assert t.grading_type == "jobbench" and t.reward_dir is None
    assert {k: t.metadata[k] for k in ("occupation", "category", "task_num", "split", "output_dir")} == {
        "occupation": "accountants", "category": "accountants", "task_num": 1, "split": "main",
        "output_dir": "outputs"}
    assert t.instruction.startswith("You are the accounts-payable reviewer")
    assert f"{t.mount_dir}/outputs/" in t.instruction
    assert [r.weight for r in t.rubrics] == [10, 5, 3] and t.total_weight == 18
    assert t.rubrics[2].criteria == ['Claim "E02" is approved at the capped amount of "50.00".']  # str → [str]
    assert "671.75" in t.task_card
    easy = load_jobbench(FIXTURES, "easy")
    assert [t.id for t in easy] == ["accountants__task1"] and easy.get("accountants__task1").total_weight == 3
    both = load_jobbench(FIXTURES, None)
    assert sorted(t.id for t in both) == ["easy__accountants__task1", "main__accountants__task1",
                                          "main__paralegals__task1"]


def test_hidden_files_never_reach_the_workspace(main_suite, tmp_path):
    for t in main_suite:
        ws = prepare_workspace(t, tmp_path / t.id)
        names = {p.relative_to(ws).as_posix() for p in ws.rglob("*") if p.is_file()}
        starters = {p.relative_to(t.input_dir).as_posix() for p in Path(t.input_dir).rglob("*") if p.is_file()}
        assert names == starters and "TASK_INSTRUCTIONS.txt" in names
        assert not any(Path(n).name in HIDDEN_FILES for n in names)
        dumped = json.dumps(t.model_dump(mode="json"))
        assert "rubrics" not in t.model_dump() and t.rubrics[0].rubric not in dumped
        assert t.rubrics[0].criteria[0] not in t.instruction


def test_starter_folder_holding_a_rubric_is_refused(tmp_path):
    shutil.copytree(FIXTURES / "dataset", tmp_path / "dataset")
    leak = tmp_path / "dataset" / "paralegals" / "task1"
    shutil.copy(leak / "RUBRICS.json", leak / "task_folder" / "RUBRICS.json")
    suite = load_jobbench(tmp_path, "main")
    assert [t.id for t in suite] == ["accountants__task1"]
    assert len(suite.issues) == 1 and "grading file" in suite.issues[0].error


def _write_parquet(root: Path, split_folder: str, name: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for task_dir in sorted((root / split_folder).glob("*/task*")):
        occ, tname = task_dir.parent.name, task_dir.name
        refs = sorted(p.relative_to(root).as_posix() for p in (task_dir / "task_folder").rglob("*")
                      if p.is_file() and p.name != "TASK_INSTRUCTIONS.txt")
        rows.append({
            "task_id": f"{occ}__{tname}", "occupation": occ, "task_num": int(tname[4:]),
            "prompt": (task_dir / "task_folder" / "TASK_INSTRUCTIONS.txt").read_text(),
            "reference_files": refs,
            "reference_file_urls": [f"https://example.invalid/resolve/main/{r}" for r in refs],
            "reference_file_hf_uris": [f"hf://datasets/example/jobbench@main/{r}" for r in refs],
            "rubric_json": (task_dir / "RUBRICS.json").read_text(),
            "task_card": (task_dir / "task_card.md").read_text()})
    pq.write_table(pa.Table.from_pylist(rows), root / name)


@pytest.fixture
def parquet_root(tmp_path):
    for split_folder in ("dataset", "dataset_easy"):
        shutil.copytree(FIXTURES / split_folder, tmp_path / split_folder)
    _write_parquet(tmp_path, "dataset", "tasks.parquet")
    _write_parquet(tmp_path, "dataset_easy", "easy.parquet")
    return tmp_path


def _shape(t: JobBenchTask) -> dict:
    meta = {k: v for k, v in t.metadata.items() if k != "jobbench_source"}
    files = sorted(p.relative_to(t.input_dir).as_posix() for p in Path(t.input_dir).rglob("*") if p.is_file())
    return {"id": t.id, "instruction": t.instruction, "mount": t.mount_dir, "meta": meta, "files": files,
            "rubrics": [r.model_dump() for r in t.rubrics], "card": t.task_card, "limits": t.limits}


@pytest.mark.parametrize("split", ["main", "easy"])
def test_parquet_form_yields_the_same_tasks(parquet_root, split):
    folder = load_jobbench(FIXTURES, split)
    by_dir = load_jobbench(parquet_root, split)
    by_file = load_jobbench(parquet_root / ("tasks.parquet" if split == "main" else "easy.parquet"))
    assert by_dir.tasks[0].metadata["jobbench_source"]["kind"] == "parquet"
    assert [_shape(t) for t in by_dir] == [_shape(t) for t in folder] == [_shape(t) for t in by_file]
    for t in by_dir:  # starter files come from next to the parquet, never the hidden files
        assert Path(t.input_dir).is_relative_to(parquet_root)
        assert not any(p.name in HIDDEN_FILES for p in Path(t.input_dir).rglob("*"))


def test_parquet_issues_do_not_crash(parquet_root):
    (parquet_root / "dataset" / "paralegals" / "task1" / "task_folder" / "local_rules.md").unlink()
    suite = load_jobbench(parquet_root, "main")
    assert [t.id for t in suite] == ["accountants__task1"]
    (issue,) = suite.issues
    assert "paralegals__task1" in issue.path and "local_rules.md" in issue.error
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(parquet_root / "easy.parquet").to_pylist()
    table[0]["rubric_json"] = '{"rubrics": [{"rubric": "x", "weight": 1}]}'
    pq.write_table(pa.Table.from_pylist(table), parquet_root / "easy.parquet")
    bad = load_jobbench(parquet_root, "easy")
    assert not bad.tasks and "criterion" in bad.issues[0].error


def test_suite_entry_points(parquet_root, monkeypatch):
    assert [t.id for t in load_suite("jobbench", data=FIXTURES)] == ["accountants__task1", "paralegals__task1"]
    assert [t.id for t in load_suite("jobbench-easy", data=parquet_root)] == ["accountants__task1"]
    assert load_suite(parquet_root / "tasks.parquet").name == "jobbench-main"
    assert len(load_suite(FIXTURES)) == 2  # a path to split data loads split main
    monkeypatch.delenv(DATA_ENV, raising=False)
    with pytest.raises(TaskError, match=DATA_ENV):
        load_suite("jobbench")
    monkeypatch.setenv(DATA_ENV, str(parquet_root))
    assert resolve_task("jobbench/paralegals__task1").metadata["jobbench_source"]["kind"] == "parquet"
    one = resolve_task(FIXTURES / "dataset" / "paralegals" / "task1")
    assert one.id == "paralegals__task1" and one.total_weight == 12
    with pytest.raises(TaskError, match="no task"):
        resolve_task("jobbench/nurses__task9")


# -- extraction ------------------------------------------------------------------------------------

def test_extracts_office_formats(tmp_path):
    import docx
    import openpyxl
    from fpdf import FPDF
    from pptx import Presentation
    from pptx.util import Inches

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Claims"
    ws.append(["claim", "approved"])
    ws.append(["E02", 50.0])
    ws["C2"] = "=B2*2"  # written by a library: no cached value, the formula is shown
    wb.create_sheet("Summary").append(["Total to reimburse", 671.75])
    wb.save(tmp_path / "book.xlsx")
    x = extract_file(tmp_path / "book.xlsx").text
    assert "--- Sheet: Claims ---" in x and "E02\t50\t=B2*2" in x and "Total to reimburse\t671.75" in x

    d = docx.Document()
    d.add_paragraph("Memo: reimburse 671.75 in total.")
    table = d.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "claim", "decision"
    table.cell(1, 0).text, table.cell(1, 1).text = "E04", "rejected: no receipt"
    d.add_paragraph("Closing line.")
    d.save(tmp_path / "memo.docx")
    t = extract_file(tmp_path / "memo.docx").text
    assert t.index("671.75") < t.index("E04 | rejected: no receipt") < t.index("Closing line.")

    pdf = FPDF()
    for line in ("Deadline: 2025-07-07", "Second page cites Rule 6(a)"):
        pdf.add_page()
        pdf.set_font("Helvetica", size=12)
        pdf.cell(0, 10, line)
    pdf.output(str(tmp_path / "memo.pdf"))
    t = extract_file(tmp_path / "memo.pdf").text
    assert "--- Page 2 ---" in t and "2025-07-07" in t and "Rule 6(a)" in t

    prs = Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[5])
    slide.shapes.title.text = "Findings for the board"
    tbl = slide.shapes.add_table(2, 2, Inches(1), Inches(2), Inches(4), Inches(1)).table
    tbl.cell(1, 0).text, tbl.cell(1, 1).text = "Reimburse", "671.75"
    slide.notes_slide.notes_text_frame.text = "Mention E08."
    prs.save(tmp_path / "deck.pptx")
    t = extract_file(tmp_path / "deck.pptx").text
    assert "Findings for the board" in t and "Reimburse | 671.75" in t and "[notes] Mention E08." in t


def test_extracts_notebook_sqlite_text_and_lists_binaries(tmp_path):
    nb = {"cells": [
        {"cell_type": "markdown", "source": ["# Totals\n", "by category"]},
        {"cell_type": "code", "source": "print(200.5)", "outputs": [
            {"output_type": "stream", "name": "stdout", "text": ["travel 200.50\n"]},
            {"output_type": "execute_result", "data": {"text/plain": "'meals 22.25'", "image/png": "iVBOR"}},
            {"output_type": "error", "ename": "KeyError", "evalue": "'supplies'", "traceback": []}]}]}
    (tmp_path / "a.ipynb").write_text(json.dumps(nb))
    t = extract_file(tmp_path / "a.ipynb").text
    assert "by category" in t and "travel 200.50" in t and "meals 22.25" in t and "[output image/png]" in t
    assert "KeyError: 'supplies'" in t

    con = sqlite3.connect(tmp_path / "claims.db")
    con.execute("CREATE TABLE claims (id TEXT PRIMARY KEY, amount REAL)")
    con.executemany("INSERT INTO claims VALUES (?, ?)", [(f"E{i:03d}", i * 1.5) for i in range(120)])
    con.commit()
    con.close()
    before = (tmp_path / "claims.db").read_bytes()
    t = extract_file(tmp_path / "claims.db").text
    assert "CREATE TABLE claims" in t and "120 rows, first 50 shown" in t and "E049\t73.5" in t and "E050" not in t
    assert (tmp_path / "claims.db").read_bytes() == before

    (tmp_path / "page.html").write_text("<p>Total <b>671.75</b></p>")
    (tmp_path / "notes").write_text("no extension, still text: E08")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    f = extract_file(tmp_path / "page.html")
    assert f.kind == "text" and "671.75" in f.text
    assert "E08" in extract_file(tmp_path / "notes").text
    b = extract_file(tmp_path / "blob.bin")
    assert b.kind == "binary" and "blob.bin" in b.text and "300 bytes" in b.text


def test_caps_corrupt_files_and_symlinks(tmp_path):
    out = tmp_path / "outputs"
    _write(out, "long.txt", "x" * 50 + "TAIL")
    f = extract_file(out / "long.txt", max_chars=20)
    assert f.truncated and f.chars == 54 and "TAIL" not in f.text and "first 20 of 54" in f.text
    (out / "broken.xlsx").write_bytes(b"PK\x03\x04 not really a workbook")
    b = extract_file(out / "broken.xlsx")
    assert b.error and "could not extract" in b.text
    secret = _write(tmp_path, "host_secret.txt", "TOP-SECRET-VALUE")
    (out / "link.txt").symlink_to(secret)
    (out / "linkdir").symlink_to(tmp_path)
    text, files = extract_folder(out)
    assert "TOP-SECRET-VALUE" not in text
    assert [f.path for f in files] == ["broken.xlsx", "link.txt", "linkdir", "long.txt"]
    assert {f.path: f.kind for f in files}["link.txt"] == "symlink"
    (tmp_path / "out2").symlink_to(out)
    assert extract_folder(tmp_path / "out2") == ("", [])


# -- scoring ---------------------------------------------------------------------------------------

def test_rubric_arithmetic_and_all_criteria_must_pass(main_suite, judge, server, tmp_path):
    import openpyxl

    t = _task(main_suite, "accountants__task1")
    ws = prepare_workspace(t, tmp_path / "ws")
    (ws / "outputs").mkdir()
    wb = openpyxl.Workbook()
    wb.active.append(["claim", "approved", "decision"])
    wb.active.append(["E02", "50.00", "reduced to the meal cap"])
    wb.active.append(["E04", "0", "rejected: missing receipt"])
    wb.save(ws / "outputs" / "reconciliation.xlsx")
    _write(ws, "outputs/memo.md", "Total to reimburse: 671.75")  # E08 never mentioned
    reward, details = score_jobbench(t, ws, judge)
    assert [r["passed"] for r in details["rubrics"]] == [True, False, True]
    assert [c["passed"] for c in details["rubrics"][1]["criteria"]] == [True, False]
    assert (details["earned"], details["possible"]) == (13, 18)
    assert reward == 0.7222 == round(13 / 18, 4) and details["reward"] == reward
    assert details["judge_calls"] == len(server.requests) == 3  # one call per rubric
    assert [f["path"] for f in details["files"]] == ["memo.md", "reconciliation.xlsx"]
    prompts = [r["messages"][-1]["content"] for r in server.requests]
    assert all("=== FILE: reconciliation.xlsx ===" in p and "expense_claims.csv" not in p for p in prompts)

    res = score_jobbench(t, ws, judge)  # also readable by attribute, as a results row keeps it
    assert res.reward == reward and res.subscores == {"earned": 13.0, "possible": 18.0, "rubric_0": 1.0,
                                                      "rubric_1": 0.0, "rubric_2": 1.0}

    _write(ws, "outputs/memo.md", "Total to reimburse: 671.75. E08 is rejected too.")
    reward, details = score_jobbench(t, ws, judge)
    assert (reward, details["earned"], details["passed_count"]) == (1.0, 18, 3)


def test_hostile_deliverables_are_judged_never_a_crash(main_suite, judge, server, tmp_path):
    """A fifo, a non-UTF-8 name and 1,200 nested folders under outputs/: the judge still gets valid
    requests naming the files, and the fifo is never opened (it would block forever)."""
    import os
    import subprocess

    t = _task(main_suite, "accountants__task1")
    out = tmp_path / "ws" / "outputs"
    _write(out.parent, "outputs/memo.md", "Total to reimburse: 671.75. E08 is rejected too.")
    os.mkfifo(out / "pipe")
    (out / os.fsdecode(b"r\xe9sum\xe9.md")).write_text("E02 50.00\n")
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1200):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("deep.md", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)
    reward, details = score_jobbench(t, out.parent, judge)
    paths = [f["path"] for f in details["files"]]
    assert "memo.md" in paths and "r\\xe9sum\\xe9.md" in paths and "pipe" not in paths
    assert any(p.endswith("/d/deep.md") for p in paths) and details["judge_errors"] == 0
    assert details["judge_calls"] == len(server.requests) == 3
    subprocess.run(["rm", "-rf", str(tmp_path / "ws")], check=True)  # pytest's clean-up recurses per level


def test_empty_or_missing_output_scores_zero_without_judge(main_suite, judge, server, tmp_path):
    t = _task(main_suite, "accountants__task1")
    ws = prepare_workspace(t, tmp_path / "ws")
    _write(ws, "memo.md", "671.75 E02 50.00 E04 E08")  # outside outputs/: not a deliverable
    reward, details = score_jobbench(t, ws, judge)
    assert (reward, details["earned"], details["possible"], details["judge_calls"]) == (0.0, 0, 18, 0)
    (ws / "outputs").mkdir()
    assert score_jobbench(t, ws, judge)[0] == 0.0
    assert score_jobbench(t, tmp_path / "never-created", judge)[0] == 0.0
    assert server.requests == []


def test_judge_overall_flag_is_not_trusted_and_bad_answers_fail_one_rubric(main_suite, judge, server, tmp_path):
    t = _task(main_suite, "paralegals__task1")
    ws = tmp_path / "ws"
    _write(ws, "outputs/deadline_memo.md", "Deadline 2025-07-07 because of the July 4 holiday.")  # no Rule 6
    server.handler = lambda body: phrase_judge(body, claim_rubric_pass=True)
    reward, details = score_jobbench(t, ws, judge)
    assert (reward, details["earned"]) == (round(8 / 12, 4), 8) and details["rubrics"][1]["judge_rubric_pass"]

    def garbled(body):
        if "Rule 6" in body["messages"][-1]["content"]:
            return 200, "The memo looks fine to me."
        return phrase_judge(body)
    server.handler = garbled
    reward, details = score_jobbench(t, ws, judge)
    assert (reward, details["judge_errors"]) == (0.6667, 1)
    assert "The memo looks fine" in details["rubrics"][1]["error"]

    server.handler = lambda body: (200, json.dumps({"criteria": [{"index": 0, "pass": True}], "rubric_pass": True}))
    _write(ws, "outputs/deadline_memo.md", "2025-07-07, July 4, Rule 6")
    reward, details = score_jobbench(t, ws, judge)  # the 2-criterion rubric got one verdict: it fails
    assert reward == round(8 / 12, 4) and "no verdict" in details["rubrics"][1]["criteria"][1]["reason"]


def test_unreachable_judge_raises_instead_of_scoring_zero(main_suite, tmp_path):
    t = _task(main_suite, "paralegals__task1")
    _write(tmp_path, "outputs/memo.md", "2025-07-07")
    dead = JudgeClient(f"http://127.0.0.1:{free_port()}/v1", "m", max_retries=0, timeout=5)
    with pytest.raises(TaskError, match="unreachable"):
        score_jobbench(t, tmp_path, dead)


def test_rubrics_survive_a_dump_round_trip(main_suite, parquet_root, judge, tmp_path):
    for task in (_task(main_suite, "paralegals__task1"), load_jobbench(parquet_root).get("paralegals__task1")):
        plain = Task(**task.model_dump())
        assert not isinstance(plain, JobBenchTask) and rubrics_for(plain) == task.rubrics
        _write(tmp_path, "outputs/m.md", "2025-07-07 July 4 Rule 6")
        assert score_jobbench(plain, tmp_path, judge)[0] == 1.0
    with pytest.raises(TaskError, match="no JobBench rubrics"):
        rubrics_for(resolve_task("builtin/csv_total"))


def test_leaderboard_number(main_suite, judge, tmp_path):
    acc, par = _task(main_suite, "accountants__task1"), _task(main_suite, "paralegals__task1")
    _write(tmp_path / "a", "outputs/memo.md", "671.75; E02 capped at 50.00; E04 rejected")  # 13 of 18
    _write(tmp_path / "b", "outputs/memo.md", "2025-07-07, July 4, Rule 6")               # 12 of 12
    results = [score_jobbench(acc, tmp_path / "a", judge), score_jobbench(par, tmp_path / "b", judge),
               score_jobbench(acc, tmp_path / "failed-rollout", judge)]                    # 0 of 18
    assert [r for r, _ in results] == [0.7222, 1.0, 0.0]
    assert jobbench_leaderboard_score(results) == round(100 * 25 / 48, 2) == 52.08
    assert jobbench_leaderboard_score([d for _, d in results[:2]]) == round(100 * 25 / 30, 2)
    assert jobbench_leaderboard_score([r.subscores for r in results]) == 52.08
    assert jobbench_leaderboard_score([]) == 0.0
    with pytest.raises(TaskError):
        jobbench_leaderboard_score([0.5])
