"""The grader's guest sandbox (``clawgym_guest``), the link filter and the task-input bookkeeping.

The guest tests grade a workspace with a task whose check asks the guest broker to run commands, and look at
what the check saw: the guest never sees ``reward/`` or the verifier's processes, cannot change the verifier's
workspace, and a program that exits early reports nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clawgym_env.grading.inputs import modified_inputs, restore_protected
from clawgym_env.grading.reward import grade_workspace
from clawgym_env.grading.reward_links import drop_links_into_reward
from tasks import load_task_dir

MOUNT = "/root/.openclaw/workspace"


def _backend(name: str) -> str:
    if name == "docker":
        from helpers_docker import require_engine

        require_engine()
    return name


def _task(root: Path, check: str, inputs: dict[str, str] | None = None, **entry: object):
    d = root / "task"
    (d / "reward").mkdir(parents=True)
    (d / "input_files").mkdir()
    for name, text in (inputs or {"mod.py": "X = 1\n"}).items():
        (d / "input_files" / name).parent.mkdir(parents=True, exist_ok=True)
        (d / "input_files" / name).write_text(text)
    (d / "reward" / "secret.txt").write_text("the answer key\n")
    (d / "reward" / "check.py").write_text(check)
    (d / "reward" / "reward.sh").write_text(f"#!/usr/bin/env bash\npython3 {MOUNT}/reward/check.py\n")
    (d / "data_entry.json").write_text(json.dumps({"task_id": "task", "user_query": "q", "input_mount_dir": MOUNT,
                                                   "metadata": {}, **entry}))
    return load_task_dir(d)


def _grade(tmp_path: Path, task, sandbox: str = "bwrap", files: dict[str, str] | None = None):
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    for name, text in (files or {"mod.py": "X = 1\n"}).items():
        (ws / name).write_text(text)
    return grade_workspace(task, ws, sandbox=sandbox)


ISOLATION_CHECK = '''import json, os, sys
import clawgym_guest
me = os.getpid()
probe = clawgym_guest.run(["bash", "-c",
    "ls /root/.openclaw/workspace/reward 2>&1; echo ---; cat /proc/*/cmdline 2>/dev/null | tr '\\\\0' ' '; echo; "
    "echo planted > planted.txt; echo done"], collect=["planted.txt", "missing.txt"], files={"extra.txt": "hi"})
extra = clawgym_guest.run(["cat", "extra.txt"])
seen = {
    "reward_visible": "secret.txt" in probe.stdout,
    "verifier_visible": "reward.sh" in probe.stdout or "check.py" in probe.stdout,
    "planted_here": os.path.exists("planted.txt"),
    "collected": probe.files,
    "extra_is_per_request": extra.returncode != 0,
    "ok": probe.returncode == 0 and probe.stdout.strip().endswith("done"),
}
print(json.dumps({k: (v if not isinstance(v, dict) else {a: (b.decode() if b else b) for a, b in v.items()})
                  for k, v in seen.items()}), file=sys.stderr)
print(1.0 if seen["ok"] else 0.0)
'''


@pytest.mark.parametrize("sandbox", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_guest_sees_neither_the_verifier_nor_its_folder(tmp_path, sandbox):
    sandbox = _backend(sandbox)
    rr = _grade(tmp_path, _task(tmp_path, ISOLATION_CHECK), sandbox)
    assert rr.ok and rr.reward == 1.0, (rr.reason, rr.stdout, rr.stderr)
    seen = json.loads(rr.stderr.strip().splitlines()[-1])
    assert seen == {"reward_visible": False, "verifier_visible": False, "planted_here": False,
                    "collected": {"planted.txt": "planted\n", "missing.txt": None}, "extra_is_per_request": True,
                    "ok": True}


RESULT_CHECK = '''import json, sys
import clawgym_guest
out = {
    "reported": clawgym_guest.python_result("report({'n': data * 2})", 21),
    "early_exit": clawgym_guest.python_result("import mod\\nreport('never')"),
    "crash": clawgym_guest.python_result("raise SystemExit(0)"),
    "printed_tag": clawgym_guest.python_result("print('CLAWGYM-RESULT x 1')"),
    "values": clawgym_guest.evaluate("import math", ["math.sqrt(16)", "1 / 0", "[1, 'a']"]),
    "tests": clawgym_guest.unittest_result(["test_t"], files={"test_t.py": "import unittest\\n"
        "class T(unittest.TestCase):\\n    def test_a(self): pass\\n    def test_b(self): self.fail()\\n"}),
    "tests_exit": clawgym_guest.unittest_result(["test_u"], files={"test_u.py": "import os\\nos._exit(0)\\n"}),
    "escape": clawgym_guest.run(["true"], files={"../x": "no"}).error,
}
print(json.dumps(out), file=sys.stderr)
print(1.0)
'''


def test_a_guest_program_that_exits_early_reports_nothing(tmp_path):
    rr = _grade(tmp_path, _task(tmp_path, RESULT_CHECK), files={"mod.py": "import os\nos._exit(0)\n"})
    assert rr.ok, (rr.reason, rr.stderr)
    out = json.loads(rr.stderr.strip().splitlines()[-1])
    assert out["reported"] == {"n": 42}
    assert out["early_exit"] is None and out["crash"] is None and out["printed_tag"] is None
    assert out["values"] == [{"value": 4.0}, {"error": "ZeroDivisionError"}, {"value": [1, "a"]}]
    assert out["tests"] == {"ran": 2, "failures": 1, "errors": 0, "skipped": 0, "expected_failures": 0,
                            "unexpected_successes": 0}
    assert out["tests_exit"] is None
    assert "relative to the workspace" in out["escape"]


LIMIT_CHECK = '''import sys
import clawgym_guest
answers = [clawgym_guest.run(["true"]) for _ in range(40)]
ran = sum(1 for a in answers if a.error is None and a.returncode == 0)
refused = [a.error for a in answers if a.error]
print(ran, refused[:1], file=sys.stderr)
print(1.0)
'''


def test_the_guest_serves_a_bounded_number_of_runs(tmp_path):
    rr = _grade(tmp_path, _task(tmp_path, LIMIT_CHECK))
    assert rr.ok, (rr.reason, rr.stderr)
    first = rr.stderr.strip().splitlines()[0]
    assert first.startswith("32 ") and "the most it may" in first, rr.stderr


def test_outside_a_grading_sandbox_the_client_names_the_fix(monkeypatch):
    from clawgym_env.grading import guest_client

    monkeypatch.delenv(guest_client.SOCKET_ENV, raising=False)
    with pytest.raises(RuntimeError, match="grading sandbox"):
        guest_client.run(["true"])


# ---- links into reward/ ---------------------------------------------------------------------------

def test_links_leading_into_reward_are_dropped_and_others_kept(tmp_path):
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "reward").mkdir()
    (ws / "real.txt").write_text("x")
    links = {
        "rel": "reward/key", "abs": f"{MOUNT}/reward/key", "proc": "/proc/self/cwd/reward/key",
        "fd": "/dev/fd/3", "via": "rdir/key", "rdir": "reward", "d/up": "../../workspace/reward/key",
        "loop1": "loop2", "loop2": "loop1",
        "ok_inside": "real.txt", "ok_abs_inside": f"{MOUNT}/real.txt", "ok_system": "/etc/hostname",
        "ok_dangling": "nowhere", "d/ok_up": "../real.txt", "d/not_up": "../workspace/reward/key",
    }
    for name, target in links.items():
        os.symlink(target, ws / name)
    removed = drop_links_into_reward(ws, MOUNT)
    gone = {r.split(":")[0] for r in removed}
    assert gone == {"rel", "abs", "proc", "fd", "via", "rdir", "d/up", "loop1", "loop2"}, removed
    for name in links:
        assert os.path.lexists(ws / name) == (name not in gone), name
    assert all(": " in r for r in removed)


# ---- task inputs -----------------------------------------------------------------------------------

def _input_task(tmp_path: Path, protected: list[str]):
    return _task(tmp_path, "print(1.0)\n", {"a.txt": "A\n", "tests/t.py": "T\n", "tests/u.py": "U\n", "keep.py": "K\n"},
                 protected_inputs=protected)


def test_modified_inputs_lists_changes_deletions_and_replacements(tmp_path):
    task = _input_task(tmp_path, [])
    ws = tmp_path / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "a.txt").write_text("B\n")  # same size, other content
    (ws / "tests" / "t.py").write_text("T\n")
    os.symlink("/etc/hostname", ws / "tests" / "u.py")
    (ws / "keep.py").write_text("K\n")
    changes = {c.path: c for c in modified_inputs(task, ws)}
    assert set(changes) == {"a.txt", "tests/u.py"}
    assert changes["a.txt"].change == "modified" and changes["a.txt"].sha256_now != changes["a.txt"].sha256_task
    assert (changes["tests/u.py"].change, changes["tests/u.py"].now) == ("replaced", "symlink")
    (ws / "keep.py").unlink()
    assert {c.path: c.change for c in modified_inputs(task, ws)}["keep.py"] == "deleted"


def test_restore_puts_protected_inputs_back_without_following_links(tmp_path):
    task = _input_task(tmp_path, ["tests/*.py"])
    ws = tmp_path / "ws"
    outside = tmp_path / "outside"
    outside.mkdir()
    ws.mkdir()
    os.symlink(outside, ws / "tests")  # the agent replaced the folder by a link out of the workspace
    (ws / "a.txt").write_text("changed, not protected\n")
    assert sorted(restore_protected(task, ws)) == ["tests/t.py", "tests/u.py"]
    assert not os.path.islink(ws / "tests") and (ws / "tests" / "t.py").read_text() == "T\n"
    assert list(outside.iterdir()) == []  # nothing written through the link
    assert (ws / "a.txt").read_text() == "changed, not protected\n"
    assert restore_protected(task, ws) == []  # already as shipped


@pytest.mark.parametrize("bad,match", [("/abs.py", "relative"), ("../x", "relative"), ("nothing*.py", "matches no"),
                                       (3, "list of")])
def test_a_bad_protected_inputs_entry_is_a_clear_task_error(tmp_path, bad, match):
    from clawgym_env.errors import TaskError

    with pytest.raises(TaskError, match=match):
        _input_task(tmp_path, [bad])
