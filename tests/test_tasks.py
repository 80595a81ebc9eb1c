"""The task-dir loader, suite loading and task resolution (no sandbox, no network)."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from clawgym_env.errors import RegistrationError, TaskError
from tasks import Suite, TaskLimits, list_suites, load_expert, load_suite, load_task_dir, resolve_task

MOUNT = "/root/.openclaw/workspace"
REWARD_SH = "#!/usr/bin/env bash\nset -euo pipefail\necho 1.0\n"


def make_task(root: Path, name: str, *, entry: dict | str | None = None, reward: bool = True,
              reward_sh: bool = True, inputs: dict[str, str] | None = None) -> Path:
    """A task dir under ``root``; ``entry`` as a dict (dumped), raw text, or None (a valid one)."""
    d = root / name
    d.mkdir(parents=True)
    if entry is None:
        entry = {"task_id": name, "user_query": f"do {name}", "input_mount_dir": MOUNT,
                 "metadata": {"category": "test", "grading_type": "automated"}}
    (d / "data_entry.json").write_text(entry if isinstance(entry, str) else json.dumps(entry))
    if reward:
        (d / "reward").mkdir()
        if reward_sh:
            (d / "reward" / "reward.sh").write_text(REWARD_SH)
    for rel, text in (inputs or {}).items():
        p = d / "input_files" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return d


def entry(**overrides):
    base = {"task_id": "t1", "user_query": "do it", "input_mount_dir": MOUNT, "metadata": {}}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not ...}


# ---- builtin suite -------------------------------------------------------------------------

def test_builtin_is_listed():
    assert "builtin" in list_suites()


def test_builtin_loads_every_task():
    suite = load_suite("builtin")
    assert isinstance(suite, Suite) and suite.name == "builtin"
    assert suite.issues == []
    assert len(suite) >= 22
    for t in suite:
        assert t.suite == "builtin" and t.full_id == f"builtin/{t.id}"
        assert t.id == t.task_dir.name and t.notes == []
        assert t.mount_dir == MOUNT
        assert (t.reward_dir / "reward.sh").is_file() and (t.reward_dir / "check.py").is_file()
        assert t.metadata.get("category") and t.metadata.get("grading_type") == "automated"
        assert load_expert(t) is not None, f"{t.id} ships no expert.json"
        if t.input_dir is not None:  # the agent never sees the verifier or the expert
            names = {p.name for p in t.input_dir.rglob("*")}
            assert "expert.json" not in names and "check.py" not in names


def test_builtin_variety():
    suite = load_suite("builtin")
    experts = {t.id: load_expert(t) for t in suite}
    answer_graded = [t.id for t in suite
                     if "OPENCLAW_REWARD_PAYLOAD" in (t.reward_dir / "check.py").read_text()]
    assert len(answer_graded) >= 4
    assert sum(len(e.tool_steps) >= 3 for e in experts.values()) >= 5
    assert sum(len(e.tool_steps) >= 2 for e in experts.values()) > len(experts) // 2
    assert all(e.wrong for e in experts.values()), "every builtin task ships a wrong attempt"
    assert len({t.metadata["category"] for t in suite}) >= 5


def test_builtin_reward_scripts_follow_the_upstream_style():
    for t in load_suite("builtin"):
        sh = (t.reward_dir / "reward.sh").read_text()
        assert "set -euo pipefail" in sh
        assert f"python3 {MOUNT}/reward/check.py {MOUNT} | python3 -c" in sh


def test_builtin_checks_use_only_the_standard_library():
    """...and the grader's own ``clawgym_guest`` (on the verifier's path in every grading sandbox)."""
    stdlib = set(sys.stdlib_module_names) | {"clawgym_guest"}
    for t in load_suite("builtin"):
        tree = ast.parse((t.reward_dir / "check.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for m in mods:
                assert m.split(".")[0] in stdlib, f"{t.id}: check.py imports {m}"


def test_builtin_limits_are_read():
    t = resolve_task("builtin/write_greeting")
    assert t.limits == TaskLimits(timeout_s=300, max_turns=10, reward_timeout_s=30)


# ---- load_task_dir ---------------------------------------------------------------------------

def test_minimal_task_dir(tmp_path):
    d = make_task(tmp_path, "t1", inputs={"a/b.txt": "x"})
    t = load_task_dir(d, suite="s")
    assert (t.id, t.instruction, t.mount_dir, t.suite) == ("t1", "do t1", MOUNT, "s")
    assert t.input_dir == d.resolve() / "input_files" and t.reward_dir == d.resolve() / "reward"
    assert t.limits == TaskLimits() and t.notes == [] and t.expert_path is None


def test_no_input_files_means_no_input_dir(tmp_path):
    assert load_task_dir(make_task(tmp_path, "t1")).input_dir is None


def test_absent_mount_dir_defaults_with_a_note(tmp_path):
    d = make_task(tmp_path, "t1", entry=entry(input_mount_dir=...))
    t = load_task_dir(d)
    assert t.mount_dir == MOUNT and any("input_mount_dir" in n for n in t.notes)


def test_task_id_differing_from_folder_is_noted(tmp_path):
    t = load_task_dir(make_task(tmp_path, "folder", entry=entry(task_id="other")))
    assert t.id == "other" and any("folder" in n for n in t.notes)


def test_limits_override(tmp_path):
    d = make_task(tmp_path, "t1", entry=entry(limits={"timeout_s": 42, "max_turns": 5}))
    assert load_task_dir(d).limits == TaskLimits(timeout_s=42, max_turns=5, reward_timeout_s=120)


@pytest.mark.parametrize("setup, file_part, fragments", [
    (lambda r: (r / "t1").mkdir(), "data_entry.json", ["missing", "task_id"]),
    (lambda r: make_task(r, "t1", entry='{\n  "task_id": "t1",\n  "user_query": oops\n}'),
     "data_entry.json", ["invalid JSON", "line 3", "column"]),
    (lambda r: make_task(r, "t1", entry="[1, 2]"), "data_entry.json", ["JSON object"]),
    (lambda r: make_task(r, "t1", entry=entry(task_id=...)), "data_entry.json", ["missing key 'task_id'"]),
    (lambda r: make_task(r, "t1", entry=entry(user_query=7)), "data_entry.json",
     ["'user_query'", "must be a string", "int"]),
    (lambda r: make_task(r, "t1", entry=entry(user_query="  ")), "data_entry.json", ["empty"]),
    (lambda r: make_task(r, "t1", entry=entry(task_id="a/b")), "data_entry.json", ["'/'"]),
    (lambda r: make_task(r, "t1", entry=entry(input_mount_dir="root/ws")), "data_entry.json",
     ["relative", "absolute"]),
    (lambda r: make_task(r, "t1", entry=entry(input_mount_dir=3)), "data_entry.json", ["input_mount_dir"]),
    (lambda r: make_task(r, "t1", entry=entry(metadata=["x"])), "data_entry.json",
     ["'metadata'", "object"]),
    (lambda r: make_task(r, "t1", entry=entry(limits={"timeout_s": -1})), "data_entry.json",
     ["limits.timeout_s"]),
    (lambda r: make_task(r, "t1", entry=entry(limits={"timeout": 5})), "data_entry.json",
     ["unknown key", "timeout_s"]),
    (lambda r: make_task(r, "t1", entry=entry(limits={"max_turns": "ten"})), "data_entry.json",
     ["limits.max_turns"]),
    (lambda r: make_task(r, "t1", entry=entry(limits=5)), "data_entry.json", ["'limits'"]),
    (lambda r: make_task(r, "t1", reward=False), "reward", ["missing", "reward.sh"]),
    (lambda r: make_task(r, "t1", reward_sh=False), "reward.sh", ["missing", "last stdout line"]),
])
def test_malformed_task_dirs_name_the_file_and_the_problem(tmp_path, setup, file_part, fragments):
    setup(tmp_path)
    with pytest.raises(TaskError) as ei:
        load_task_dir(tmp_path / "t1")
    msg = str(ei.value)
    assert str(tmp_path / "t1") in msg and file_part in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


def test_input_files_must_be_a_folder(tmp_path):
    d = make_task(tmp_path, "t1")
    (d / "input_files").write_text("oops")
    with pytest.raises(TaskError, match="input_files"):
        load_task_dir(d)


def test_missing_or_file_path_is_a_task_error(tmp_path):
    with pytest.raises(TaskError, match="no such task dir"):
        load_task_dir(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(TaskError, match="not a folder"):
        load_task_dir(tmp_path / "f")


def test_limits_must_be_positive():
    with pytest.raises(ValueError):
        TaskLimits(max_turns=0)


# ---- expert.json ------------------------------------------------------------------------------

@pytest.mark.parametrize("body, fragment", [
    ({"steps": [{"final": "x"}, {"tool": "bash", "command": "ls"}]}, "not the last"),
    ({"steps": [{"tool": "bash", "command": "ls"}]}, "must be {\"final\""),
    ({"steps": [{"tool": "shell", "command": "ls"}, {"final": ""}]}, "use one of"),
    ({"steps": [{"tool": "write_file", "path": "/etc/x", "content": ""}, {"final": ""}]}, "relative"),
    ({"steps": [{"tool": "read_file"}, {"final": ""}]}, "'path'"),
    ({"steps": [{"final": ""}], "oops": 1}, "unknown key"),
    ({"wrong": []}, "steps"),
])
def test_malformed_expert_is_a_task_error(tmp_path, body, fragment):
    d = make_task(tmp_path, "t1")
    (d / "expert.json").write_text(json.dumps(body))
    with pytest.raises(TaskError) as ei:
        load_expert(load_task_dir(d))
    assert "expert.json" in str(ei.value) and fragment in str(ei.value)


def test_expert_accessors(tmp_path):
    d = make_task(tmp_path, "t1")
    assert load_expert(d) is None
    (d / "expert.json").write_text(json.dumps({"steps": [{"tool": "bash", "command": "ls"}, {"final": "done"}]}))
    ex = load_expert(load_task_dir(d))
    assert ex.final == "done" and ex.tool_steps == [{"tool": "bash", "command": "ls"}] and ex.wrong == []


# ---- suites ------------------------------------------------------------------------------------

def test_suite_with_one_bad_task_loads_the_others(tmp_path):
    root = tmp_path / "mysuite"
    make_task(root, "a")
    make_task(root, "b", entry="{not json")
    make_task(root, "c")
    (root / ".hidden").mkdir()
    (root / "_private").mkdir()
    (root / "LICENSE.txt").write_text("x")
    suite = load_suite(root)
    assert suite.name == "mysuite" and suite.root == root.resolve()
    assert [t.id for t in suite] == ["a", "c"] and all(t.suite == "mysuite" for t in suite)
    assert len(suite.issues) == 1
    issue = suite.issues[0]
    assert issue.path.endswith("b") and "data_entry.json" in issue.error and "invalid JSON" in issue.error
    with pytest.raises(TaskError, match="could not be loaded.*invalid JSON"):
        suite.get("b")


def test_duplicate_task_ids_become_an_issue(tmp_path):
    make_task(tmp_path, "a")
    make_task(tmp_path, "b", entry=entry(task_id="a"))
    suite = load_suite(tmp_path)
    assert [t.id for t in suite] == ["a"]
    assert len(suite.issues) == 1 and "also used by" in suite.issues[0].error


def test_folder_without_task_dirs_is_an_error(tmp_path):
    with pytest.raises(TaskError, match="no task dirs"):
        load_suite(tmp_path)


def test_task_dir_is_not_a_suite(tmp_path):
    d = make_task(tmp_path, "t1")
    with pytest.raises(TaskError, match="single task dir"):
        load_suite(d)


def test_unknown_suite_names_close_matches():
    with pytest.raises(RegistrationError) as ei:  # a name is looked up in the suite registry
        load_suite("builtn")
    assert "did you mean builtin" in str(ei.value)
    with pytest.raises(TaskError, match="no suite folder"):
        load_suite("./no/such/folder")


# ---- resolve_task ------------------------------------------------------------------------------

def test_resolve_bundled_suite_and_id():
    t = resolve_task("builtin/write_greeting")
    assert t.id == "write_greeting" and t.full_id == "builtin/write_greeting"


def test_resolve_task_dir_path(tmp_path):
    d = make_task(tmp_path, "t1")
    assert resolve_task(d).id == "t1"
    assert resolve_task(str(d)).id == "t1"


def test_resolve_suite_path_and_id(tmp_path):
    root = tmp_path / "s"
    make_task(root, "t1")
    make_task(root, "folder2", entry=entry(task_id="renamed"))
    t = resolve_task(f"{root}/t1")  # also a plain task dir path: no suite recorded
    assert t.id == "t1" and t.suite is None
    t = resolve_task(f"{root}/renamed")  # found by task_id in the suite folder
    assert t.task_dir.name == "folder2" and t.suite == "s"
    with pytest.raises(TaskError, match="did you mean renamed"):
        resolve_task(f"{root}/renamd")


def test_resolve_path_into_a_bundled_suite_keeps_its_name():
    t = resolve_task("builtin/csv_total")
    assert resolve_task(t.task_dir).full_id == "builtin/csv_total"


def test_resolve_unknown_id_lists_close_names():
    with pytest.raises(TaskError) as ei:
        resolve_task("builtin/write_greting")
    assert "write_greeting" in str(ei.value)


def test_resolve_bare_id_suggests_the_full_spec():
    with pytest.raises(TaskError) as ei:
        resolve_task("write_greeting")
    assert "builtin/write_greeting" in str(ei.value)


def test_resolve_unknown_suite():
    with pytest.raises(RegistrationError, match="unknown suite 'bultin'.*builtin"):
        resolve_task("bultin/write_greeting")


def test_resolve_bad_task_reports_its_own_error(tmp_path):
    root = tmp_path / "s"
    make_task(root, "ok")
    make_task(root, "bad", entry=entry(task_id="bad", input_mount_dir="rel"))
    with pytest.raises(TaskError, match="relative"):
        resolve_task(f"{root}/bad")


def test_suite_get_close_matches():
    suite = load_suite("builtin")
    with pytest.raises(TaskError, match="did you mean csv_total"):
        suite.get("csv_totl")
