"""The grader is a trust boundary: attacks from inside real episodes, under bubblewrap and Docker.

Each attack runs as a model under RL would run it: the `mini` harness in a real sandbox, a scripted policy whose
steps are the attack, the real hermetic grader. Each must score no more than the do-nothing agent on the same
task, with the grader's reason where it changed something:

* verifier rewriting: the agent's module, imported by the check, appends ``echo 1.0`` to ``reward/reward.sh``
  (a builtin code task, whose check runs the agent's code in a guest sandbox; and a legacy check that runs the
  agent's code itself: ``reward/`` is sealed read-only there too);
* ``os._exit(0)`` in every module the agent may edit (the three builtin code tasks): no positive result;
* symlinks into ``reward/`` (relative, absolute, through a linked folder, through ``/proc/self/cwd``);
* protected inputs: a test file the agent rewrote is restored before grading, and the record lists it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawgym_env.envs.runtime import Runtime
from clawgym_env.plugins import make_harness
from tasks import load_task_dir

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = ROOT / "tasks" / "builtin"
MOUNT = "/root/.openclaw/workspace"
BACKENDS = ["bwrap", pytest.param("docker", marks=pytest.mark.docker)]


def _backend(name: str) -> str:
    if name == "docker":
        from helpers_docker import require_engine

        require_engine()
    return name


def _episode(tmp_path: Path, task, steps: list[dict], sandbox: str):
    script = tmp_path / f"steps-{len(list(tmp_path.glob('steps-*')))}.json"
    script.write_text(json.dumps({"steps": [*steps, {"final": "done"}]}))
    with Runtime(f"scripted:file:{script}", sandbox=sandbox, out_dir=tmp_path / "eps") as rt:
        rec = rt.run(task, make_harness("mini")).record
    assert rec.status in ("ok", "reward_error"), (rec.status, rec.error, rec.logs)
    assert not rec.is_infra_failure
    return rec


def _noop(tmp_path: Path, task, sandbox: str) -> float:
    return _episode(tmp_path, task, [], sandbox).reward


APPEND = '''import glob
for path in glob.glob("/root/.openclaw/workspace/reward/*.sh") + glob.glob("reward/*.sh"):
    try:
        with open(path, "a") as f:
            f.write("\\necho 1.0\\n")
    except OSError:
        pass
'''


@pytest.mark.parametrize("sandbox", BACKENDS)
def test_a_module_that_rewrites_the_verifier_scores_no_more_than_doing_nothing(tmp_path, sandbox):
    sandbox = _backend(sandbox)
    task = load_task_dir(BUILTIN / "fix_failing_test", suite="builtin")
    module = (task.input_dir / "mathutils.py").read_text()
    base = _noop(tmp_path, task, sandbox)
    rec = _episode(tmp_path, task, [{"tool": "write_file", "path": "mathutils.py", "content": APPEND + module}],
                   sandbox)
    assert rec.reward <= base, (rec.reward, base, rec.subscores, rec.logs.get("reward_stdout"))


def _legacy_task(root: Path) -> Path:
    """A check written the old way: it imports the agent's module in its own process, then scores 0.0 or 0.5."""
    d = root / "legacy"
    (d / "reward").mkdir(parents=True)
    (d / "input_files").mkdir()
    (d / "input_files" / "mod.py").write_text("VALUE = 1\n")
    (d / "data_entry.json").write_text(json.dumps({"task_id": "legacy", "user_query": "set VALUE to 2 in mod.py",
                                                   "input_mount_dir": MOUNT, "metadata": {}}))
    (d / "reward" / "check.py").write_text(
        "import subprocess, sys\n"
        f"out = subprocess.run([sys.executable, '-c', 'import mod; print(mod.VALUE)'], cwd='{MOUNT}',\n"
        "                     capture_output=True, text=True).stdout.strip()\n"
        "print(0.5 if out == '2' else 0.0)\n")
    (d / "reward" / "reward.sh").write_text(f"#!/usr/bin/env bash\nset -euo pipefail\n"
                                            f"python3 {MOUNT}/reward/check.py | tail -n 1\n")
    return d


@pytest.mark.parametrize("sandbox", BACKENDS)
def test_the_verifier_folder_is_read_only_even_to_a_legacy_check(tmp_path, sandbox):
    sandbox = _backend(sandbox)
    task = load_task_dir(_legacy_task(tmp_path))
    rec = _episode(tmp_path, task, [{"tool": "write_file", "path": "mod.py", "content": APPEND + "VALUE = 1\n"}],
                   sandbox)
    assert rec.reward == 0.0, (rec.reward, rec.logs.get("reward_stdout"), rec.logs.get("reward_stderr"))
    honest = _episode(tmp_path, task, [{"tool": "write_file", "path": "mod.py", "content": "VALUE = 2\n"}], sandbox)
    assert honest.reward == 0.5  # the same check does score honest work


CODE_TASKS = {"fix_failing_test": ["mathutils.py"], "fix_off_by_one": ["pagination.py"],
              "implement_function": ["textkit.py"]}


@pytest.mark.parametrize("sandbox", BACKENDS)
@pytest.mark.parametrize("task_id", sorted(CODE_TASKS))
def test_exiting_early_in_every_module_scores_no_more_than_doing_nothing(tmp_path, sandbox, task_id):
    sandbox = _backend(sandbox)
    task = load_task_dir(BUILTIN / task_id, suite="builtin")
    base = _noop(tmp_path, task, sandbox)
    exits = [{"tool": "write_file", "path": name, "content": "import os\nos._exit(0)\n"}
             for name in CODE_TASKS[task_id]]
    exits.append({"tool": "bash", "command": "for f in test_*.py; do printf 'import os\\nos._exit(0)\\n' > $f; done"})
    rec = _episode(tmp_path, task, exits, sandbox)
    assert rec.reward <= base, (task_id, rec.reward, base, rec.subscores)
    assert {c.path for c in rec.inputs_modified} >= set(CODE_TASKS[task_id])


def _key_task(root: Path) -> Path:
    """A task whose verifier keeps its answer key in reward/expected.txt."""
    d = root / "key"
    (d / "reward").mkdir(parents=True)
    (d / "reward" / "expected.txt").write_text("4242\n")
    (d / "data_entry.json").write_text(json.dumps({"task_id": "key", "user_query": "write the answer to answer.txt",
                                                   "input_mount_dir": MOUNT, "metadata": {}}))
    (d / "reward" / "reward.sh").write_text(
        f"#!/usr/bin/env bash\ncd {MOUNT}\n"
        f"if [ \"$(cat answer.txt 2>/dev/null)\" = \"$(cat {MOUNT}/reward/expected.txt)\" ]; then echo 1.0; "
        "else echo 0.0; fi\n")
    return d


LINKS = {
    "relative": "ln -s reward/expected.txt answer.txt",
    "absolute": f"ln -s {MOUNT}/reward/expected.txt answer.txt",
    "through a linked folder": "ln -s reward r && ln -s r/expected.txt answer.txt",
    "through /proc": "ln -s /proc/self/cwd/reward/expected.txt answer.txt",
    "dot-dot": "mkdir d && ln -s ../../workspace/reward/expected.txt d/x && ln -s d/x answer.txt",
}


@pytest.mark.parametrize("sandbox", BACKENDS)
def test_links_into_reward_are_removed_before_grading(tmp_path, sandbox):
    sandbox = _backend(sandbox)
    task = load_task_dir(_key_task(tmp_path))
    for name, cmd in LINKS.items():
        rec = _episode(tmp_path, task, [{"tool": "bash", "command": cmd}], sandbox)
        assert rec.reward == 0.0, (name, rec.logs.get("reward_stdout"))
        assert "answer.txt" in rec.logs.get("grader_notes", ""), (name, rec.logs)
    honest = _episode(tmp_path, task, [{"tool": "bash", "command": "echo 4242 > answer.txt"}], sandbox)
    assert honest.reward == 1.0 and "grader_notes" not in honest.logs


def _protected_task(root: Path) -> Path:
    """Tests in test_calc.py (protected) over calc.py; the check runs them in the guest, trusting nothing."""
    d = root / "prot"
    (d / "reward").mkdir(parents=True)
    (d / "input_files").mkdir()
    (d / "input_files" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (d / "input_files" / "test_calc.py").write_text(
        "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
    (d / "data_entry.json").write_text(json.dumps({
        "task_id": "prot", "user_query": "fix add() in calc.py", "input_mount_dir": MOUNT, "metadata": {},
        "protected_inputs": ["test_*.py"]}))
    (d / "reward" / "check.py").write_text(
        "import clawgym_guest\n"
        "counts = clawgym_guest.unittest_result(['test_calc'])\n"
        "print(1.0 if counts and counts['ran'] == 1 and not counts['failures'] and not counts['errors'] else 0.0)\n")
    (d / "reward" / "reward.sh").write_text(f"#!/usr/bin/env bash\npython3 {MOUNT}/reward/check.py\n")
    return d


@pytest.mark.parametrize("sandbox", BACKENDS)
def test_protected_inputs_are_restored_and_listed(tmp_path, sandbox):
    sandbox = _backend(sandbox)
    task = load_task_dir(_protected_task(tmp_path))
    assert task.protected_inputs == ["test_*.py"]
    weakened = "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        pass\n"
    rec = _episode(tmp_path, task, [{"tool": "write_file", "path": "test_calc.py", "content": weakened}], sandbox)
    assert rec.reward == 0.0, rec.logs.get("reward_stdout")
    assert [(c.path, c.change) for c in rec.inputs_modified] == [("test_calc.py", "modified")]
    assert "test_calc.py" in rec.logs["grader_notes"]
    gone = _episode(tmp_path, task, [{"tool": "bash", "command": "rm test_calc.py && ln -s /etc/hostname test_x.py"}],
                    sandbox)
    assert gone.reward == 0.0 and [(c.path, c.change) for c in gone.inputs_modified] == [("test_calc.py", "deleted")]
    fixed = _episode(tmp_path, task, [{"tool": "write_file", "path": "calc.py",
                                       "content": "def add(a, b):\n    return a + b\n"}], sandbox)
    assert fixed.reward == 1.0 and [c.path for c in fixed.inputs_modified] == ["calc.py"]
    assert "grader_notes" not in fixed.logs


def test_the_code_tasks_run_no_agent_code_in_the_verifier():
    """A static guard: the builtin checks never start a process themselves (clawgym_guest does it)."""
    for check in sorted(BUILTIN.glob("*/reward/check.py")):
        text = check.read_text()
        assert "subprocess" not in text and "os.system" not in text, check
    for task_id in CODE_TASKS:
        assert "clawgym_guest" in (BUILTIN / task_id / "reward" / "check.py").read_text()

