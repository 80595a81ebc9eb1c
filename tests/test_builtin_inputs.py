"""Builtin verifiers never trust the agent's inputs (issue 23, point 3).

An agent can rewrite the input files it was given: shrink ``sales.csv`` to one row, then write the total of that
row. A check that recomputes its expected answer from the workspace's inputs then pays full marks for no work.
Every builtin check (the three tasks that run agent code aside) and every generated family check therefore
carries its expected answers as constants, computed once from the pristine task, and reads an input file only
to compare it with the pristine sha256 it embeds. Two kinds of test hold that:

* behaviour, through the real hermetic grader (``grade_workspace``, bubblewrap), on workspaces built directly:
  the expert scores 1.0, and a tampered workspace (every input file replaced by a trivial version, the expert's
  steps replayed over it and its outputs and final answer made to match the trivial inputs) scores no more
  than the do-nothing workspace;
* a static rule: a check that names one of its task's input files does so only in its ``PRISTINE_SHA256``
  (which must hold the real pristine hashes), ``PRISTINE_SIZES``, ``MOVES`` (where the task moves an input)
  or ``EDITED_INPUTS`` (an input the task asks the agent to rewrite, read as an output).
"""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
import re
import shutil
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from clawgym_env.grading.reward import grade_workspace
from clawgym_env.task import Task
from tasks import load_expert, load_suite
from tasks.taskdir import load_task_dir

try:  # tests/ is on sys.path under pytest's default import mode; a package layout also works
    from helpers_expert import apply_steps, stage_workspace
except ImportError:  # pragma: no cover
    from tests.helpers_expert import apply_steps, stage_workspace

CODE_TASKS = {"fix_failing_test", "fix_off_by_one", "implement_function"}  # they run agent code: graded apart
BUILTIN = {t.id: t for t in load_suite("builtin") if t.id not in CODE_TASKS}
FAMILIES = Path(__file__).resolve().parents[1] / "tasks" / "families"
FAMILY_DIRS = sorted(p.parent for p in FAMILIES.glob("*/*/data_entry.json"))
ALLOWED = ("PRISTINE_SHA256", "PRISTINE_SIZES", "MOVES", "EDITED_INPUTS")  # where a check may name an input


def _inputs(task: Task) -> dict[str, bytes]:
    """Workspace-relative path -> bytes of every input file the task gives."""
    if task.input_dir is None:
        return {}
    root = Path(task.input_dir)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------------------- static rule

def _constants(tree: ast.Module) -> dict[str, tuple[ast.stmt, object]]:
    """Module-level ``NAME = <literal>`` assignments among ALLOWED: name -> (statement, value)."""
    out: dict[str, tuple[ast.stmt, object]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ALLOWED:
                out[name] = (node, ast.literal_eval(node.value))
    return out


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring constants (module, function, class)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def _names(literal: str, rel: str) -> bool:
    """True when the string ``literal`` names the input ``rel`` (its path or its file name, as a whole token)."""
    base = rel.rsplit("/", 1)[-1]
    return any(re.search(r"(?<![\w.-])" + re.escape(n) + r"(?![\w.-])", literal) for n in {rel, base})


def static_violations(task: Task) -> list[str]:
    """What in ``task``'s check breaks the rule (empty when it holds)."""
    inputs = _inputs(task)
    assert task.reward_dir is not None
    tree = ast.parse((Path(task.reward_dir) / "check.py").read_text(encoding="utf-8"))
    consts = _constants(tree)
    problems = []
    if inputs:
        want = {rel: hashlib.sha256(data).hexdigest() for rel, data in inputs.items()}
        if consts.get("PRISTINE_SHA256", (None, None))[1] != want:
            problems.append(f"PRISTINE_SHA256 must map every input file to its pristine sha256: {want}")
        if "PRISTINE_SIZES" in consts and consts["PRISTINE_SIZES"][1] != {r: len(d) for r, d in inputs.items()}:
            problems.append("PRISTINE_SIZES must map every input file to its pristine size")
        moves = consts.get("MOVES", (None, {}))[1]
        edited = consts.get("EDITED_INPUTS", (None, ()))[1]
        if not (isinstance(moves, dict) and set(moves) <= set(inputs)):
            problems.append("MOVES must map input files to where the task moves them")
        if not set(edited) <= set(inputs):
            problems.append("EDITED_INPUTS must list input files only")
        if "sha256" not in {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}:
            problems.append("the check never computes a sha256: it cannot compare an input with its pristine hash")
    allowed = {id(n) for stmt, _ in consts.values() for n in ast.walk(stmt)} | _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in allowed:
            for rel in inputs:
                if _names(node.value, rel):
                    problems.append(f"line {node.lineno}: {node.value!r} names the input {rel}: compute the "
                                    "expected answer once from the pristine task and embed it as a constant")
    return problems


@pytest.mark.parametrize("task_id", sorted(BUILTIN))
def test_a_builtin_check_names_its_inputs_only_to_compare_them_with_a_pristine_hash(task_id):
    assert static_violations(BUILTIN[task_id]) == []


@pytest.mark.parametrize("task_dir", FAMILY_DIRS, ids=lambda p: p.name)
def test_a_family_check_names_its_inputs_only_to_compare_them_with_a_pristine_hash(task_dir):
    assert static_violations(load_task_dir(task_dir)) == []


def test_the_static_rule_catches_a_check_that_reads_an_input(tmp_path):
    """The rule itself can fail: a copy of csv_total whose check opens sales.csv is named."""
    src = BUILTIN["csv_total"]
    shutil.copytree(src.task_dir, tmp_path / "csv_total")
    check = tmp_path / "csv_total" / "reward" / "check.py"
    check.write_text(check.read_text() + '\n\ndef _peek(ws):\n    return (ws / "sales.csv").read_text()\n')
    problems = static_violations(load_task_dir(tmp_path / "csv_total"))
    assert len(problems) == 1 and "'sales.csv' names the input sales.csv" in problems[0], problems


def test_an_edited_input_is_one_the_expert_rewrites(tmp_path):
    """EDITED_INPUTS may only list inputs the task really asks to rewrite: the expert changes each of them."""
    for task_id, task in sorted(BUILTIN.items()):
        assert task.reward_dir is not None
        consts = _constants(ast.parse((Path(task.reward_dir) / "check.py").read_text(encoding="utf-8")))
        edited = consts.get("EDITED_INPUTS", (None, ()))[1]
        if not edited:
            continue
        ws = stage_workspace(task, tmp_path / task_id)
        apply_steps(load_expert(task).steps, ws)
        pristine = _inputs(task)
        for rel in edited:
            assert (ws / rel).read_bytes() != pristine[rel], (task_id, rel)


# ------------------------------------------------------------------------------------------------ behaviour

def trivial_version(rel: str, data: bytes) -> bytes:
    """A trivial stand-in for an input file: a CSV keeps its header and first row, a JSON document its first
    element or key, a JSONL file its first record, any other file its first line; a file that is already that
    small becomes empty."""
    text = data.decode("utf-8")
    lines = text.splitlines(keepends=True)
    if rel.endswith(".csv"):
        small = "".join(lines[:2])
    elif rel.endswith(".jsonl"):
        small = next((ln for ln in lines if ln.strip()), "")
    elif rel.endswith(".json"):
        doc = json.loads(text)
        doc = doc[:1] if isinstance(doc, list) else dict(list(doc.items())[:1])
        small = json.dumps(doc, indent=2) + "\n"
    else:
        small = "".join(lines[:1])
    return b"" if small.encode() == data else small.encode()


def _read_csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def _densest(ws: Path) -> str:
    rows = _read_csv(ws / "cities.csv")
    best = max(rows, key=lambda r: int(r["population"]) / int(r["area_km2"]))
    return f"{best['city']}: {round(int(best['population']) / int(best['area_km2']))} people per km2."


def _largest(ws: Path) -> str:
    files = [p for p in (ws / "data").rglob("*") if p.is_file()]
    return f"The largest file is {max(files, key=lambda p: p.stat().st_size).relative_to(ws).as_posix()}."


def _report(ws: Path) -> None:
    rows = sorted(((r["name"], float(r["value"])) for r in _read_csv(ws / "data" / "metrics.csv")),
                  key=lambda r: (-r[1], r[0]))
    doc = {"top": [{"name": n, "value": v} for n, v in rows[:3]], "count": len(rows)}
    (ws / "report.json").write_text(json.dumps(doc, indent=2) + "\n")


# Where the trivial inputs need a specific shape (the first line of server.log holds no ERROR entry).
TRIVIAL_OVERRIDES: dict[str, dict[str, str]] = {
    "log_first_error_answer": {"server.log": "08:00:00 [ERROR] cache: boom\n"},
}

# After the expert's steps: what makes the outputs and the final answer match the trivial inputs where the
# steps alone do not (answers the expert states as constants; tools replaced by trivial scripts). Returns the
# final answer to grade, or None to keep the expert's.
MATCH_TRIVIAL: dict[str, Callable[[Path], str | None]] = {
    "count_words_answer": lambda ws: f"essay.txt contains {len((ws / 'essay.txt').read_text().split())} words.",
    "csv_max_answer": _densest,
    "largest_file_answer": _largest,
    "log_first_error_answer": lambda ws: "08:00:00 cache",
    "script_output_answer": lambda ws: f"The checksum is {zlib.adler32((ws / 'data/payload.txt').read_bytes()):08x}.",
    "script_with_args": lambda ws: _report(ws),
}


def tampered_workspace(task: Task, ws: Path) -> str | None:
    """Build ``ws``: the pristine inputs, each replaced by a trivial version, then the expert's steps replayed and
    the outputs and answer made to match those trivial inputs; returns the final answer."""
    stage_workspace(task, ws)
    overrides = TRIVIAL_OVERRIDES.get(task.id, {})
    for rel, data in _inputs(task).items():
        small = overrides[rel].encode() if rel in overrides else trivial_version(rel, data)
        assert small != data, (task.id, rel)
        (ws / rel).write_bytes(small)
    run = apply_steps(load_expert(task).steps, ws)
    final = MATCH_TRIVIAL.get(task.id, lambda ws: None)(ws)
    return final if final is not None else run.final


def _grade(task: Task, ws: Path, final: str | None) -> tuple[float, dict[str, float], str | None]:
    rr = grade_workspace(task, ws, final_message=final or "")
    assert rr.ok, (task.id, ws.name, rr.reason, rr.stderr)
    return rr.reward, rr.subscores, rr.reason


def _three_grades(task: Task, tmp_path: Path) -> dict[str, tuple[float, dict[str, float], str | None]]:
    """Grade the expert, the do-nothing and the tampered workspace of ``task``, concurrently."""
    expert = apply_steps(load_expert(task).steps, stage_workspace(task, tmp_path / "expert"))
    nothing = stage_workspace(task, tmp_path / "nothing")
    jobs = {"expert": (tmp_path / "expert", expert.final), "nothing": (nothing, "")}
    if _inputs(task):
        jobs["tampered"] = (tmp_path / "tampered", tampered_workspace(task, tmp_path / "tampered"))
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(_grade, task, ws, final) for name, (ws, final) in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("task_id", sorted(BUILTIN))
def test_expert_scores_full_marks_and_tampered_inputs_score_no_more_than_doing_nothing(task_id, tmp_path):
    grades = _three_grades(BUILTIN[task_id], tmp_path)
    assert grades["expert"][0] == 1.0, grades["expert"]
    if "tampered" in grades:
        assert grades["tampered"][0] <= grades["nothing"][0], grades


@pytest.mark.parametrize("task_dir", [FAMILY_DIRS[0], FAMILY_DIRS[-1]], ids=lambda p: p.name)
def test_a_family_task_pays_nothing_for_a_rewritten_log(task_dir, tmp_path):
    grades = _three_grades(load_task_dir(task_dir), tmp_path)
    assert grades["expert"][0] == 1.0, grades["expert"]
    assert grades["tampered"][0] <= grades["nothing"][0], grades


def test_an_input_turned_into_a_link_or_a_folder_is_tampering(tmp_path):
    """Inputs the agent swapped for a link elsewhere, a folder or an oversized file count as rewritten."""
    task = BUILTIN["csv_total"]
    for name, swap in (("link", lambda p: (p.unlink(), p.symlink_to("/etc/hostname"))),
                       ("folder", lambda p: (p.unlink(), p.mkdir())),
                       ("huge", lambda p: p.write_bytes(p.read_bytes() + b"x" * (2 << 20)))):
        ws = stage_workspace(task, tmp_path / name)
        (ws / "total.txt").write_text("100.14\n")
        swap(ws / "sales.csv")
        assert _grade(task, ws, "")[0] == 0.0, name
    ws = stage_workspace(task, tmp_path / "removed")  # a removed input is no tampering: the answer is a constant
    (ws / "total.txt").write_text("100.14\n")
    (ws / "sales.csv").unlink()
    assert _grade(task, ws, "")[0] == 1.0
