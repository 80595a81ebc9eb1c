"""ClawGym-Bench: the task-dir form and the hub (parquet) form load to the same Task and grade the
same in the real sandbox; hybrid tasks combine 0.7 code + 0.3 rubric from an LLM judge served by a
real local OpenAI-compatible HTTP server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clawgym_env.errors import TaskError
from clawgym_env.testing import JudgeServer
from tasks import load_suite, resolve_task
from tasks.clawgym_bench import (
    BenchGrade,
    category_scores,
    grade_bench,
    hybrid_grade,
    is_hybrid,
    judge_rubric,
    load_clawgym_bench,
    rewrite_hook,
    score_hybrid,
    task_files,
)
from tasks.judge import JudgeClient

FIXTURE = Path(__file__).resolve().parent.parent / "tasks" / "fixtures" / "clawgym_bench"
WS = "/root/.openclaw/workspace"


def hub_row(task_dir: Path) -> dict:
    """The hub-form row of a fixture task dir: prompt, hook_code, input_files (verifier included as
    reward/test.py), rule, origin_template carrying id and category — the upstream schema."""
    entry = json.loads((task_dir / "data_entry.json").read_text())
    inputs = task_dir / "input_files"
    files = [{"file_path": p.relative_to(inputs).as_posix(), "content": p.read_text()}
             for p in sorted(inputs.rglob("*")) if p.is_file()]
    files.append({"file_path": "reward/test.py", "content": (task_dir / "reward" / "check.py").read_text()})
    card = (f"---\nid: {entry['task_id']}\nname: fixture\ncategory: {entry['metadata']['category']}\n"
            f"grading_type: {'hybrid' if entry['metadata'].get('rule') else 'automated'}\n---\n\n## Prompt\n...")
    return {"prompt": entry["user_query"], "hook_code": f"python3 reward/test.py {WS}", "input_files": files,
            "rule": entry["metadata"].get("rule"), "origin_template": card}


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    """(task-dir suite, parquet suite, parquet path), the parquet written with ``datasets``."""
    import datasets

    tmp = tmp_path_factory.mktemp("bench")
    rows = [hub_row(FIXTURE / "task_h1"), hub_row(FIXTURE / "task_a1")]
    parquet = tmp / "data" / "test-00000-of-00001.parquet"
    parquet.parent.mkdir()
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    cache = tmp / "cache"
    return load_clawgym_bench(FIXTURE, cache_dir=cache), load_clawgym_bench(parquet, cache_dir=cache), parquet


def solve(task, root: Path, *, totals=True, summary="The east region led with 200.10 in sales.") -> Path:
    ws = root / "ws"
    shutil.rmtree(ws, ignore_errors=True)
    shutil.copytree(task.input_dir, ws)
    (ws / "output").mkdir()
    if task.id == "task_h1":
        if totals:
            (ws / "output" / "totals.json").write_text(json.dumps({"north": 150.5, "south": 100.0, "east": 200.1}))
        if summary is not None:
            (ws / "output" / "summary.md").write_text(summary)
    else:
        (ws / "output" / "count.txt").write_text("4\n")
    return ws


def test_task_dir_and_parquet_forms_load_to_the_same_task(forms):
    dirs, table, _ = forms
    assert dirs.name == table.name == "clawgym-bench" and not dirs.issues and not table.issues
    assert [t.id for t in dirs] == [t.id for t in table] == ["task_a1", "task_h1"]
    for a, b in zip(dirs, table):
        assert (a.instruction, a.mount_dir, a.metadata, a.limits, a.suite) == \
               (b.instruction, b.mount_dir, b.metadata, b.limits, b.suite)
        assert task_files(a) == task_files(b) and task_files(a)
        assert (a.reward_dir / "check.py").read_bytes() == (b.reward_dir / "check.py").read_bytes()
        assert "test.py" not in {p.name for p in b.reward_dir.iterdir()}
        assert not any("reward" in p for p in task_files(b))  # the verifier never reaches the workspace
    h1 = table.get("task_h1")
    assert h1.metadata["grading_type"] == "hybrid" and h1.metadata["category"] == "Analysis & Reason."
    assert is_hybrid(h1) and not is_hybrid(table.get("task_a1"))
    assert table.get("task_a1").metadata == {"category": "Systems & Auto.", "grading_type": "automated"}


@pytest.mark.parametrize("tid, setup, expected", [
    ("task_h1", {}, 1.0),
    ("task_h1", {"summary": "North did fine."}, 0.75),
    ("task_h1", {"totals": False, "summary": None}, 0.0),
    ("task_a1", {}, 1.0),
])
def test_both_forms_grade_the_same_workspace_the_same(forms, tmp_path, tid, setup, expected):
    from clawgym_env.grading.reward import grade_workspace

    dirs, table, _ = forms
    ws = solve(dirs.get(tid), tmp_path, **setup)
    a, b = grade_workspace(dirs.get(tid), ws), grade_workspace(table.get(tid), ws)
    assert a.ok and b.ok, (a.reason, a.stderr, b.reason, b.stderr)
    assert a.reward == b.reward == pytest.approx(expected) and a.subscores == b.subscores


def test_jsonl_form_and_suite_specs(forms, tmp_path, monkeypatch):
    dirs, table, parquet = forms
    rows = [hub_row(FIXTURE / "task_h1"), hub_row(FIXTURE / "task_a1")]
    jsonl = tmp_path / "benchmark_data.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("CLAWGYM_CACHE", str(tmp_path / "cache"))
    for suite in (load_clawgym_bench(jsonl), load_suite(parquet), load_suite(parquet.parent),
                  load_suite("clawgym-bench", data=parquet), load_suite("clawgym-bench", data=FIXTURE)):
        assert suite.name == "clawgym-bench"
        assert [(t.id, t.instruction, t.metadata) for t in suite] == \
               [(t.id, t.instruction, t.metadata) for t in table]
    assert resolve_task(f"{parquet}/task_h1").instruction == table.get("task_h1").instruction
    monkeypatch.setenv("CLAWGYM_BENCH_DATA", str(parquet))
    assert resolve_task("clawgym-bench/task_a1").metadata["category"] == "Systems & Auto."


def test_malformed_rows_become_issues_and_the_rest_load(tmp_path):
    good = hub_row(FIXTURE / "task_a1")
    evil = {**good, "origin_template": "---\nid: evil\n---", "input_files": [{"file_path": "../x", "content": "1"}]}
    empty = {**good, "origin_template": "---\nid: empty\n---", "prompt": ""}
    no_checker = {**good, "origin_template": "---\nid: nochk\n---", "input_files": []}
    suite = load_clawgym_bench([good, evil, empty, no_checker, dict(good)], cache_dir=tmp_path)
    assert [t.id for t in suite] == ["task_a1"]
    errors = [i.error for i in suite.issues]
    assert len(errors) == 4
    assert any("'../x'" in e for e in errors) and any("empty prompt" in e for e in errors)
    assert any("no reward/ file" in e for e in errors) and any("repeats" in e for e in errors)
    unnamed = load_clawgym_bench([{**good, "origin_template": None, "category": "Software Dev."}], cache_dir=tmp_path)
    assert [t.id for t in unnamed] == ["task_0000"] and unnamed.tasks[0].metadata["category"] == "Software Dev."


def test_hook_code_is_rewritten_to_the_mount():
    assert rewrite_hook(f"python3 reward/test.py {WS}", WS) == f"python3 {WS}/reward/check.py {WS}"
    assert rewrite_hook(f"python3 {WS}/reward/test.py {WS}", WS) == f"python3 {WS}/reward/check.py {WS}"
    assert rewrite_hook("", WS) == f"python3 {WS}/reward/check.py {WS}"
    assert rewrite_hook(f"python3 reward/test.py {WS}", "/ws") == "python3 /ws/reward/check.py /ws"
    assert rewrite_hook("python3 myreward/test.py .", WS) == "python3 myreward/test.py ."


def test_score_hybrid_is_the_official_weighting():
    assert score_hybrid(1.0, 0.0) == pytest.approx(0.7)
    assert score_hybrid(0.0, 1.0) == pytest.approx(0.3)
    assert score_hybrid(0.75, 0.4) == pytest.approx(0.645)
    for bad in ((1.2, 0.5), (0.5, -0.1), (float("nan"), 0.5), (True, 0.5)):
        with pytest.raises(ValueError):
            score_hybrid(*bad)


# ---- a real judge endpoint --------------------------------------------------------------------

@pytest.fixture(scope="module")
def judge_server():
    """The shared test judge server (a real starlette app on uvicorn) answering the queued texts
    in turn; ``.client`` is a JudgeClient pointed at it."""
    replies: list[str] = []
    with JudgeServer(lambda body: (200, replies.pop(0) if replies else "{}")) as srv:
        srv.replies = replies
        srv.client = JudgeClient(srv.base_url, "judge-test", max_retries=0)
        yield srv


def test_hybrid_task_combines_code_and_rubric_scores(forms, tmp_path, judge_server):
    _, table, _ = forms
    task = table.get("task_h1")
    ws = solve(task, tmp_path, summary="North did fine.")  # 3 of 4 code checks pass: code score 0.75
    judge_server.replies.append('{"score": 0.4, "rationale": "Names the wrong region."}')
    n = len(judge_server.requests)
    grade = grade_bench(task, ws, "I wrote the totals and a summary.", judge=judge_server.client)
    assert isinstance(grade, BenchGrade) and grade.status == "ok" and grade.grading_type == "hybrid"
    assert (grade.code_score, grade.rubric_score) == (pytest.approx(0.75), 0.4)
    assert grade.score == pytest.approx(0.7 * 0.75 + 0.3 * 0.4) and grade.rationale == "Names the wrong region."
    assert grade.category == "Analysis & Reason." and len(grade.subscores) == 4
    assert len(judge_server.requests) == n + 1
    req = judge_server.requests[-1]
    assert req["model"] == "judge-test" and req["temperature"] == 0.0
    prompt = "\n".join(m["content"] for m in req["messages"])
    for needle in (task.metadata["rule"], task.instruction.strip(), "I wrote the totals and a summary.",
                   "North did fine.", "- output/summary.md (15 bytes, new)", "- input/sales.csv (",
                   "bytes, input)", '"east": 200.1'):
        assert needle in prompt
    assert "def grade(" not in prompt  # the verifier stays hidden from the judge too


def test_automated_task_never_calls_the_judge(forms, tmp_path, judge_server):
    _, table, _ = forms
    n = len(judge_server.requests)
    grade = grade_bench(table.get("task_a1"), solve(table.get("task_a1"), tmp_path), "done",
                        judge=judge_server.client)
    assert (grade.score, grade.rubric_score, grade.grading_type) == (1.0, None, "automated")
    assert len(judge_server.requests) == n


@pytest.mark.parametrize("reply, fragment", [
    ("I think it is pretty good.", "did not answer with a JSON object"),
    ('{"score": 7, "rationale": "out of ten"}', "outside [0, 1]"),
    ('{"verdict": "good"}', "no numeric 'score'"),
])
def test_a_failed_judge_is_a_judge_error_never_a_silent_zero(forms, tmp_path, judge_server, reply, fragment):
    _, table, _ = forms
    task = table.get("task_h1")
    ws = solve(task, tmp_path)
    judge_server.replies.append(reply)
    grade = hybrid_grade(task, 1.0, "done", ws, judge=judge_server.client)
    assert grade.status == "judge_error" and grade.score is None and fragment in grade.error
    judge_server.replies.append(reply)
    with pytest.raises(TaskError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        judge_rubric(judge_server.client, task, "done", ws)


def test_category_report(forms):
    _, table, _ = forms
    grades = [BenchGrade("task_h1", "Analysis & Reason.", "hybrid", 0.645, 0.75, 0.4),
              BenchGrade("task_a1", "Systems & Auto.", "automated", 1.0, 1.0),
              BenchGrade("task_x", "Systems & Auto.", "hybrid", None, 1.0, status="judge_error")]
    report = category_scores(grades)
    assert report["Analysis & Reason."] == {"n": 1.0, "failed": 0.0, "mean": 0.645}
    assert report["Systems & Auto."] == {"n": 2.0, "failed": 1.0, "mean": 1.0}
    assert report["overall"]["mean"] == pytest.approx((0.645 + 1.0) / 2)


def test_judge_grading_survives_a_hostile_workspace(forms, tmp_path, judge_server):
    """A fifo, a non-UTF-8 name, 1,200 nested folders, a 3 GiB sparse file and a link to a host file
    in the agent's workspace: the rubric judge still gets one valid request, without the host file."""
    import os
    import subprocess

    _, table, _ = forms
    task = table.get("task_h1")
    ws = solve(task, tmp_path)
    os.mkfifo(ws / "pipe")
    (ws / os.fsdecode(b"caf\xe9.txt")).write_text("latin-1 name\n")
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1200):  # deeper than PATH_MAX and than Python's recursion limit
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    out = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(out, b"deep\n")
    os.close(out)
    os.close(fd)
    with open(ws / "sparse.bin", "wb") as f:
        f.truncate(3 << 30)
    os.symlink("/etc/passwd", ws / "output" / "passwd.md")
    judge_server.replies.append('{"score": 0.5, "rationale": "ok"}')
    n = len(judge_server.requests)
    grade = hybrid_grade(task, 1.0, "done \udcff", ws, judge=judge_server.client)
    assert grade.status == "ok" and grade.score == 0.7 + 0.3 * 0.5, grade.error
    assert len(judge_server.requests) == n + 1
    prompt = "\n".join(m["content"] for m in judge_server.requests[-1]["messages"])
    assert "caf\\xe9.txt" in prompt and "root:" not in prompt and "pipe" not in prompt
    assert "- sparse.bin (3221225472 bytes, new)" in prompt
    assert "/d/d/bottom.txt (5 bytes, new)" in prompt
    subprocess.run(["rm", "-rf", str(ws)], check=True)  # pytest's own clean-up recurses per level
