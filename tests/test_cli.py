"""The ``clawgym`` command line, run as a user would (a real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def clawgym(*args, check=True, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "clawgym_cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_tasks_list_builtin(builtin_suite):
    out = clawgym("tasks", "list", "--suite", "builtin").stdout.splitlines()
    assert len(out) == len(builtin_suite.tasks) >= 20
    assert all(line.split("\t")[0].startswith("builtin/") for line in out)


def test_run_json_and_grade(tmp_path, builtin_suite):
    task = builtin_suite.tasks[1]
    # a relative --out, as a user types it, resolved against the working directory
    proc = clawgym("run", "--harness", "mini", "--task", task.full_id, "--policy", "scripted:expert", "--json",
                   "--out", "eps", "--keep-workspace", cwd=tmp_path)
    obj = json.loads(proc.stdout.strip())
    for key in ("task_id", "harness", "reward", "subscores", "status", "num_calls", "wall_s", "calls_path",
                "limits_hit", "inputs_modified", "grader_notes"):
        assert key in obj
    assert obj["status"] == "ok" and obj["reward"] == 1.0 and obj["harness"] == "mini"
    assert obj["failure_boundary"] is None and obj["error"] is None
    ws = tmp_path / "eps" / obj["episode_dir"].split("/")[-1] / "workspace"
    assert os.stat(tmp_path / "eps").st_mode & 0o777 == 0o700 and os.stat(ws.parent).st_mode & 0o777 == 0o700
    assert ws.is_dir() and obj["episode_dir"].startswith(str(tmp_path))
    graded = json.loads(clawgym("grade", "--task-dir", str(task.task_dir), "--workspace", str(ws),
                                "--final-message", obj["final_message"] or "", "--json").stdout)
    assert graded["reward"] == 1.0 and graded["subscores"] == obj["subscores"]
    assert graded["inputs_modified"] == obj["inputs_modified"] and graded["grader_notes"] == []
    first = sorted(p for p in task.input_dir.rglob("*") if p.is_file())[0].relative_to(task.input_dir).as_posix()
    (ws / first).unlink()
    os.symlink("reward/check.py", ws / "answer.txt")
    tampered = json.loads(clawgym("grade", "--task-dir", str(task.task_dir), "--workspace", str(ws), "--json").stdout)
    assert {"path": first, "change": "deleted"} in tampered["inputs_modified"]
    assert any("answer.txt" in note for note in tampered["grader_notes"]), tampered


def test_bad_input_gets_a_clear_error():
    proc = clawgym("run", "--task", "builtin/no_such_task_xyz", check=False)
    assert proc.returncode == 2 and "no task" in proc.stderr and "Traceback" not in proc.stderr
    proc = clawgym("run", "--task", "builtin/x", "--harness", "nope", check=False)
    assert proc.returncode == 2 and "error" in proc.stderr
