"""OfficeQA: the scorer's rules (a table of cases, each rule both ways), the suite loader on a
fixture CSV + corpus of our own, and the generated verifier run hermetically in the real sandbox."""

from __future__ import annotations

import ast
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clawgym_env.errors import TaskError
from tasks import load_suite, resolve_task
from tasks.officeqa import load_officeqa, score_answer
from tasks.officeqa_scorer import judge

FIXTURE = Path(__file__).resolve().parent.parent / "tasks" / "fixtures" / "officeqa"
CSV = FIXTURE / "questions.csv"
SCORER = Path(__file__).resolve().parent.parent / "tasks" / "officeqa_scorer.py"
FA = "<FINAL_ANSWER>{}</FINAL_ANSWER>"

CASES = [
    # 1. extraction: last FINAL_ANSWER pair, else the whole reply
    ("2,602", FA.format("2,602"), 0.0, 1.0),
    ("2,602", "First I thought 1,000.\nThen I checked.\n" + FA.format("2602"), 0.0, 1.0),
    ("2,602", FA.format("1,000") + " on reflection " + FA.format("2,602"), 0.0, 1.0),
    ("2,602", FA.format("2,602") + " no wait " + FA.format("2,601"), 0.0, 0.0),
    ("2,602", "<final_answer>2,602</Final_Answer>", 0.0, 1.0),
    ("2,602", "2602", 0.0, 1.0),
    ("2,602", FA.format("  2,602  "), 0.0, 1.0),
    ("2,602", FA.format(""), 0.0, 0.0),
    ("2,602", "", 0.0, 0.0),
    ("2,602", "<FINAL_ANSWER>2,602", 0.0, 0.0),  # unclosed tag: the whole reply, which is markup
    # 2. direct answer only: one non-empty line, <= 250 characters, no markup
    ("2,602", "The answer is\n2,602", 0.0, 0.0),
    ("2,602", FA.format("2,602\n(in millions)"), 0.0, 0.0),
    ("2,602", FA.format("\n2,602\n\n"), 0.0, 1.0),
    ("2,602", FA.format("2,602 " + "x" * 250), 0.0, 0.0),
    ("2,602", FA.format("2,602 " + "x" * 200), 0.0, 1.0),
    ("2,602", "Defense spending in calendar year 1940 was 2,602 million dollars.", 0.0, 1.0),
    ("2,602", FA.format("<b>2,602</b>"), 0.0, 0.0),
    ("2,602", FA.format("**2,602**"), 0.0, 1.0),  # markdown emphasis is not markup (as upstream)
    # 5. number count, year-like numbers ignored unless the gold has one
    ("507", FA.format("507 or 508"), 0.0, 0.0),
    ("507", "In FY 1934 the VA spent 507", 0.0, 1.0),
    ("507", "1934: 507, 1935: 600", 0.0, 0.0),
    ("1990", FA.format("1990"), 0.0, 1.0),
    ("1990", "It happened in 1990", 0.0, 1.0),
    ("1990", FA.format("1991"), 0.0, 0.0),
    ("1990", FA.format("1990 and 1991"), 0.0, 0.0),
    ("[2017, 0.69]", FA.format("[2017, 0.69]"), 0.0, 1.0),
    ("[2017, 0.69]", FA.format("[0.69]"), 0.0, 0.0),
    # 3. normalisation: commas, currency, accounting parentheses, minus signs, percent
    ("2602", FA.format("2,602.00"), 0.0, 1.0),
    ("$37,921,314", FA.format("37921314"), 0.0, 1.0),
    ("37921314", FA.format("$37,921,314"), 0.0, 1.0),
    ("£1,000", FA.format("€1000"), 0.0, 1.0),
    ("-1,299", FA.format("(1,299)"), 0.0, 1.0),
    ("-1,299", FA.format("($1,299)"), 0.0, 1.0),
    ("-1,299", FA.format("$(1,299)"), 0.0, 1.0),
    ("-1,299", FA.format("-$1,299"), 0.0, 1.0),
    ("-1977", FA.format("($1977)"), 0.0, 1.0),
    ("-1977", FA.format("(1977)"), 0.0, 0.0),
    ("1,299", FA.format("(1,299)"), 0.0, 0.0),
    ("\u22123.524", FA.format("-3.524"), 0.0, 1.0),
    ("-3.524", FA.format("3.524"), 0.0, 0.0),
    ("1608.80%", FA.format("1608.8"), 0.0, 1.0),
    ("9.89%", FA.format("9.89 percent"), 0.0, 1.0),
    ("9.89%", FA.format("0.0989"), 0.0, 0.0),
    ("March 1977", FA.format("March (1977)"), 0.0, 1.0),
    # 4. units must agree and are never multiplied out
    ("36080 million", FA.format("36,080 million"), 0.0, 1.0),
    ("36080 million", FA.format("36080"), 0.0, 1.0),
    ("36080 million", FA.format("36,080,000,000"), 0.0, 0.0),
    ("36080 million", FA.format("36.08 billion"), 0.0, 0.0),
    ("997.3 billion", FA.format("997.3 million"), 0.0, 0.0),
    ("$140.9 Billion", FA.format("140.9 billion dollars"), 0.0, 1.0),
    ("140.9 billion", FA.format("$140.9B"), 0.0, 1.0),
    ("-1,667.86 millions", FA.format("-1667.86 million"), 0.0, 1.0),
    ("5.3 million", FA.format("5.3 thousand"), 0.0, 0.0),
    # 6. relative error within the tolerance (0.0 = exact)
    ("100", FA.format("101"), 0.01, 1.0),
    ("100", FA.format("101.5"), 0.01, 0.0),
    ("100", FA.format("100.0001"), 0.0, 0.0),
    ("2,602", FA.format("2,600"), 0.001, 1.0),
    ("2,602", FA.format("2,600"), 0.0005, 0.0),
    ("0.0", FA.format("0"), 0.0, 1.0),
    ("0", FA.format("0.001"), 0.5, 0.0),
    ("39482.03", FA.format("39,482.03"), 0.0, 1.0),
    # 6. lists: every gold number, in order when the gold is a bracketed list
    ("[0.096, \u2212184.143]", FA.format("[0.096, -184.143]"), 0.0, 1.0),
    ("[0.096, -184.143]", FA.format("[-184.143, 0.096]"), 0.0, 0.0),
    ("[0.096, -184.143]", FA.format("0.096, -184.143"), 0.0, 1.0),
    ("[44.00,231.52]", FA.format("[44, 231.52]"), 0.0, 1.0),
    ("[8, 152260]", FA.format("[8,152,260]"), 0.0, 1.0),
    ("[8, 152260]", FA.format("[8,152,261]"), 0.0, 0.0),
    ("[374,443, 381,327]", FA.format("[374443, 381327]"), 0.0, 1.0),
    ("[374,443, 381,327]", FA.format("[374443]"), 0.0, 0.0),
    ("[273.28, 54244, 56703]", FA.format("[273.28, 54244, 56704]"), 0.0, 0.0),
    ("[273.28, 54244, 56703]", FA.format("[273.28, 54244, 56704]"), 0.001, 1.0),
    ("March 3, 1977", FA.format("3 March 1977"), 0.0, 1.0),
    ("March 3, 1977", FA.format("March 4, 1977"), 0.0, 0.0),
    # 7. text parts such as a month must match
    ("March 3, 1977", FA.format("April 3, 1977"), 0.0, 0.0),
    ("August 1986", FA.format("august 1986"), 0.0, 1.0),
    ("August 1986", FA.format("1986"), 0.0, 0.0),
    ("August 1986", FA.format("Aug 1986"), 0.0, 1.0),  # upstream: either text may contain the other
    ("March 3, 1977", FA.format("Mar 3, 1977"), 0.0, 1.0),
    ("March 3, 1977", FA.format("May 3, 1977"), 0.0, 0.0),
    ("August 1986", FA.format("August, fiscal 1986"), 0.0, 1.0),  # gold text inside the answer's
    ("New York 5", FA.format("5 York"), 0.0, 1.0),  # answer text inside the gold's (upstream)
    ("New York 5", FA.format("5 Boston"), 0.0, 0.0),
    ("[0.012, surplus]", FA.format("[0.012, surplus]"), 0.0, 1.0),
    ("[0.012, surplus]", FA.format("[0.012, deficit]"), 0.0, 0.0),
    ("[2.59%, 2.34%, Decreased]", FA.format("[2.59%, 2.34%, decreased]"), 0.0, 1.0),
    ("[2.59%, 2.34%, Decreased]", FA.format("[2.59%, 2.34%, increased]"), 0.0, 0.0),
    # 6. several gold numbers, not a plain-number list: each must equal SOME answer number (upstream)
    ("[2.59%, 2.34%, Decreased]", FA.format("[2.34%, 2.59%, decreased]"), 0.0, 1.0),
    ("3 and 7", FA.format("7 and 3"), 0.0, 1.0),
    ("5 and 5", FA.format("5 and 6"), 0.0, 1.0),  # not one-to-one
    ("5 and 6", FA.format("5 and 5"), 0.0, 0.0),
    ("5 and 6", FA.format("5 and 6 and 6"), 0.0, 0.0),  # the count rule still applies
    # 8. text-only gold: exact after case/whitespace/punctuation normalisation
    ("Office of the Fiscal Assistant Secretary", FA.format("office of the fiscal assistant secretary"), 0.0, 1.0),
    ("Office of the Fiscal Assistant Secretary", FA.format("office of the fiscal assistant secretary."), 0.0, 0.0),
    ("Federal Reserve", FA.format('"Federal Reserve"'), 0.0, 1.0),
    ("Office of the Fiscal Assistant Secretary", FA.format("Office of the Fiscal Assistant Secretary (OFAS)"),
     0.0, 1.0),
    ("Federal  Reserve", FA.format(" federal reserve "), 0.0, 1.0),
    ("Office of the Fiscal Assistant Secretary", FA.format("Fiscal Assistant Secretary"), 0.0, 0.0),
    ("Federal Reserve", FA.format("Federal Reserve 2"), 0.0, 0.0),
    ("Federal Reserve", FA.format("The Federal Reserve Board"), 0.0, 0.0),
    # 9. an answer saying "unable to determine" scores 0 (upstream)
    ("2,602", FA.format("2,602 (unable to determine exactly)"), 0.0, 0.0),
    ("2,602", FA.format("2,602 (able to determine exactly)"), 0.0, 1.0),
    ("Unable to determine", FA.format("Unable to determine"), 0.0, 0.0),
    # 5. year-likeness is by value; a gold with text keeps the answer's years (upstream)
    ("507", FA.format("507 in 1934.0"), 0.0, 1.0),
    ("507", FA.format("507 in 1834"), 0.0, 0.0),
    ("August 5", FA.format("August 5, 1986"), 0.0, 0.0),
    ("August 5", FA.format("August 5"), 0.0, 1.0),
    # 4. a unit is found within 20 characters on either side; b/m/k only as separate words (upstream)
    ("36080 million", FA.format("billions: 36,080"), 0.0, 0.0),
    ("36080 million", FA.format("millions: 36,080"), 0.0, 1.0),
    ("140.9 million", FA.format("$140.9B"), 0.0, 1.0),
    ("140.9 million", FA.format("$140.9 B"), 0.0, 0.0),
]


@pytest.mark.parametrize("gold, pred, tolerance, expected", CASES)
def test_score_answer_rules(gold, pred, tolerance, expected):
    assert len(CASES) >= 60
    assert score_answer(gold, pred, tolerance) == expected, judge(gold, pred, tolerance)


def test_scores_are_exactly_zero_or_one_and_bad_arguments_raise():
    assert {score_answer(g, p, t) for g, p, t, _ in CASES} == {0.0, 1.0}
    assert score_answer("5", None) == 0.0  # type: ignore[arg-type]
    for tol in (-0.1, 1.5, True):
        with pytest.raises(ValueError):
            score_answer("5", "5", tol)
    with pytest.raises(ValueError):
        score_answer("  ", "5")


def test_the_scorer_is_standalone_standard_library_code():
    tree = ast.parse(SCORER.read_text())
    for node in ast.walk(tree):
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for m in mods:
            assert m.split(".")[0] in sys.stdlib_module_names | {"__future__"}, m


# ---- suite loader --------------------------------------------------------------------------

def _gold():
    with CSV.open(newline="") as f:
        return {r["uid"]: r["answer"] for r in csv.DictReader(f)}


@pytest.fixture()
def pdf_corpus(tmp_path):
    """The fixture corpus plus one bulletin available only as a PDF (generated here)."""
    from fpdf import FPDF

    corpus = tmp_path / "corpus"
    shutil.copytree(FIXTURE / "corpus", corpus)
    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=11)
    for line in ("SYNTHETIC FIXTURE - not a real Treasury Bulletin.", "FIXTURE BULLETIN - July 1960",
                 "Fixture interest payments: 96.3 million dollars."):
        pdf.cell(0, 8, line, new_x="LMARGIN", new_y="NEXT")
    (corpus / "nested").mkdir()
    pdf.output(str(corpus / "nested" / "treasury_bulletin_1960_07.pdf"))
    return corpus


def test_loader_builds_one_task_per_question_with_its_documents(pdf_corpus, tmp_path):
    suite = load_officeqa(CSV, pdf_corpus, cache_dir=tmp_path / "cache")
    gold = _gold()
    assert suite.name == "officeqa" and [t.id for t in suite] == sorted(gold)
    by_id = {t.id: t for t in suite}
    docs = lambda t: sorted(p.name for p in t.input_dir.iterdir()) if t.input_dir else []  # noqa: E731
    assert docs(by_id["FQA001"]) == ["treasury_bulletin_1941_01.txt"]
    assert docs(by_id["FQA002"]) == ["treasury_bulletin_1941_01.txt", "treasury_bulletin_1954_02.txt"]
    pdf = by_id["FQA005"].input_dir / "treasury_bulletin_1960_07.pdf"  # the .txt named in the CSV, found as PDF
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.read_bytes() == (pdf_corpus / "nested" / pdf.name).read_bytes()
    for t in suite:
        assert t.grading_type == "officeqa" and t.metadata["uid"] == t.id
        assert "<FINAL_ANSWER>" in t.instruction and t.instruction.count("Question:") == 1
        assert all(d in t.instruction for d in t.metadata["documents"])
        # the gold answer stays out of the agent's view (and of the metadata handed to trainers)
        assert gold[t.id] not in t.instruction + json.dumps(t.metadata, ensure_ascii=False), t.id
        reward = t.reward_dir
        assert json.loads((reward / "gold.json").read_text()) == {"answer": gold[t.id], "tolerance": 0.0}
        assert (reward / "check.py").read_bytes() == SCORER.read_bytes()
        assert "set -euo pipefail" in (reward / "reward.sh").read_text()
    assert {t.metadata["difficulty"] for t in suite} == {"easy", "hard"}


def test_missing_documents_are_a_note_and_an_issue_never_a_crash(tmp_path):
    suite = load_officeqa(CSV, cache_dir=tmp_path / "cache")  # corpus defaults to the CSV's folder
    by_id = {t.id: t for t in suite}
    assert len(suite) == 7
    for uid, name in (("FQA005", "treasury_bulletin_1960_07.txt"), ("FQA006", "treasury_bulletin_1999_12.txt")):
        t = by_id[uid]
        assert t.metadata["missing_files"] == [name] and t.input_dir is None
        assert any(name in n for n in t.notes) and "not in your workspace" in t.instruction
    assert sorted(Path(i.path).name for i in suite.issues) == ["FQA005", "FQA006"]
    assert all("treasury_bulletin_19" in i.error for i in suite.issues)
    assert by_id["FQA001"].notes == [] and by_id["FQA001"].metadata["missing_files"] == []
    skipped = load_officeqa(CSV, cache_dir=tmp_path / "cache", skip_incomplete=True)
    assert sorted(t.id for t in skipped) == ["FQA001", "FQA002", "FQA003", "FQA004", "FQA007"]


def test_pro_subset_keeps_the_hard_questions(tmp_path):
    pro = load_officeqa(CSV, subset="pro", cache_dir=tmp_path)
    assert pro.name == "officeqa-pro" and [t.id for t in pro] == ["FQA002", "FQA003", "FQA004"]
    with pytest.raises(TaskError, match="subset"):
        load_officeqa(CSV, subset="lite", cache_dir=tmp_path)


def test_malformed_csv_rows_and_files(tmp_path):
    bad = tmp_path / "q.csv"
    bad.write_text("uid,question,answer,source_files\nA1,What?,5,x.txt\nA1,Again?,6,x.txt\nA2,,7,x.txt\n")
    suite = load_officeqa(bad, cache_dir=tmp_path / "c")
    assert [t.id for t in suite] == ["A1"]
    errors = " ".join(i.error for i in suite.issues)
    assert "repeats" in errors and "empty" in errors and "x.txt" in errors
    (tmp_path / "r.csv").write_text("id,text\n1,2\n")
    with pytest.raises(TaskError, match="missing column"):
        load_officeqa(tmp_path / "r.csv", cache_dir=tmp_path / "c")


def test_load_suite_and_resolve_task_accept_officeqa_data(tmp_path, monkeypatch):
    monkeypatch.setenv("CLAWGYM_CACHE", str(tmp_path))
    by_name = load_suite("officeqa", data=CSV)
    by_path = load_suite(CSV)
    assert [t.id for t in by_name] == [t.id for t in by_path] == sorted(_gold())
    assert load_suite("officeqa-pro", data=CSV).name == "officeqa-pro"
    assert load_suite("officeqa", data=CSV, subset="pro", corpus_dir=FIXTURE / "corpus").name == "officeqa"
    monkeypatch.setenv("CLAWGYM_OFFICEQA_DATA", str(CSV))
    assert resolve_task("officeqa/FQA003").metadata["uid"] == "FQA003"
    assert resolve_task(f"{CSV}/FQA004").instruction == by_name.get("FQA004").instruction
    monkeypatch.delenv("CLAWGYM_OFFICEQA_DATA")
    with pytest.raises(TaskError, match="CLAWGYM_OFFICEQA_DATA"):
        load_suite("officeqa")
    assert len(load_suite("builtin")) >= 22  # bundled suites unchanged


def _run_check(task, final_message, tmp_path):
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"final_message": final_message}))
    env = {**os.environ, "OPENCLAW_REWARD_PAYLOAD": str(payload)}
    out = subprocess.run([sys.executable, str(task.reward_dir / "check.py"), str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["answer_correct"], out.stderr


def test_check_py_reads_the_payload_and_gold_with_tolerance(tmp_path):
    exact = load_officeqa(CSV, cache_dir=tmp_path / "a").get("FQA002")
    loose = load_officeqa(CSV, cache_dir=tmp_path / "b", tolerance=0.01).get("FQA002")
    assert _run_check(exact, FA.format("12.5%"), tmp_path)[0] == 1.0
    assert _run_check(exact, FA.format("12.58%"), tmp_path)[0] == 0.0
    score, log = _run_check(loose, FA.format("12.58%"), tmp_path)
    assert score == 1.0 and "12.5" not in log  # the verifier log never shows the gold answer


def test_generated_verifier_grades_hermetically_in_the_sandbox(tmp_path):
    from clawgym_env.grading.reward import grade_workspace

    suite = load_officeqa(CSV, cache_dir=tmp_path / "cache")
    task = suite.get("FQA004")
    ws = tmp_path / "ws"
    shutil.copytree(task.input_dir, ws)
    (ws / "reward").mkdir()  # a planted gold file cannot change the score
    (ws / "reward" / "gold.json").write_text('{"answer": "1", "tolerance": 1.0}')
    right = grade_workspace(task, ws, final_message="Balances from Table 3.\n" + FA.format("[410.5, -37.25]"))
    wrong = grade_workspace(task, ws, final_message=FA.format("[410.5, 37.25]"))
    assert (right.reward, right.ok, right.subscores) == (1.0, True, {"answer_correct": 1.0})
    assert (wrong.reward, wrong.ok) == (0.0, True)


def test_materialised_suites_are_cached_by_content(tmp_path):
    a = load_officeqa(CSV, cache_dir=tmp_path)
    b = load_officeqa(CSV, cache_dir=tmp_path)
    c = load_officeqa(CSV, cache_dir=tmp_path, tolerance=0.05)
    assert a.root == b.root != c.root and a.root.parent == tmp_path
    assert json.loads((c.get("FQA001").reward_dir / "gold.json").read_text())["tolerance"] == 0.05
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half-built folders left
