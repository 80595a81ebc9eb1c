"""Reward integrity: no sandbox of an episode shows the task's own folders, wherever the suite is kept.

The attack: a suite kept under a folder every sandbox shows read-only (``/opt``, a virtual environment, a path
of ``CLAWGYM_SANDBOX_RO_PATHS``) that no plugin entry point declares. Nothing hid it, so the agent (or the
agent's code the grader runs in a guest sandbox) could read the task's ``reward/`` and ``expert.json`` and every
other task's by their real path. ``Task.private_folders()`` names the task's folder, its input and reward
folders and its suite folder; the episode's sandbox, the grader's and every guest sandbox hide them.

The suite here lives in a world-readable temporary folder put on ``CLAWGYM_SANDBOX_RO_PATHS``, which makes it
visible the way ``/opt`` is. Tests skip, with the reason, where bwrap or a Docker engine is missing.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawgym_env.harness import Endpoint, HarnessAdapter, HarnessOutput, LaunchSpec
from clawgym_env.sandbox import hidden_paths_with
from clawgym_env.sandbox.base import default_hidden_paths
from clawgym_env.task import Task
from tasks import load_task_dir

MOUNT = "/root/.openclaw/workspace"
SECRET = "the-answer-key-7f3a"
pytestmark = pytest.mark.timeout(600)


def _backend(name: str) -> str:
    if name == "docker":
        from helpers_docker import require_engine

        require_engine()
    return name


@pytest.fixture
def suite(monkeypatch) -> Iterator[Path]:
    """A suite of two tasks in a world-readable folder that every sandbox shows read-only."""
    shown = Path(tempfile.mkdtemp(prefix="cg-shown-"))
    shown.chmod(0o755)
    monkeypatch.setenv("CLAWGYM_SANDBOX_RO_PATHS", str(shown))
    root = shown / "suite"
    for name in ("probe", "other"):
        d = root / name
        (d / "reward").mkdir(parents=True)
        (d / "input_files").mkdir()
        (d / "input_files" / "notes.txt").write_text("some input\n")
        (d / "reward" / "secret.txt").write_text(f"{SECRET}\n")
        (d / "reward" / "reward.sh").write_text("#!/usr/bin/env bash\necho 1.0\n")
        (d / "expert.json").write_text(json.dumps({"answer": SECRET}))
        (d / "data_entry.json").write_text(json.dumps({"task_id": name, "user_query": "q",
                                                       "input_mount_dir": MOUNT, "metadata": {}}))
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield root
    shutil.rmtree(shown, ignore_errors=True)


def _probe(root: Path) -> str:
    """A shell line that prints every file of the suite it can find and what it can read of one task."""
    return (f"echo shown-root:; ls -d {root.parent} 2>&1; echo found:; find {root} -type f 2>/dev/null; "
            f"echo read:; cat {root}/probe/reward/secret.txt {root}/other/expert.json 2>/dev/null; echo end")


def test_private_folders_name_the_task_its_data_and_its_suite(suite):
    task = load_task_dir(suite / "probe")
    folders = task.private_folders()
    assert {suite / "probe", suite / "probe" / "reward", suite / "probe" / "input_files", suite} <= set(folders)
    hidden = hidden_paths_with(folders)
    assert set(default_hidden_paths()) <= set(hidden) and suite.resolve() in hidden
    # never a folder whose hiding would hide the toolchain, nor one that does not exist
    loose = Task(id="t", instruction="q", task_dir=Path("/opt/t"), reward_dir=Path(sys.prefix))
    assert Path("/opt") in loose.private_folders()
    kept = hidden_paths_with([*loose.private_folders(), Path("/"), Path("/usr"), suite / "missing"])
    assert not {Path("/"), Path("/opt"), Path("/usr"), Path(sys.prefix).resolve(), suite / "missing"} & set(kept)


class ProbeHarness(HarnessAdapter):
    """A harness whose process runs one shell line and answers with all it printed."""

    name = "probe"
    dialect = "openai_chat"

    def __init__(self, line: str) -> None:
        self.line = line

    def launch(self, task: Task, endpoint: Endpoint, *, home: str) -> LaunchSpec:
        return LaunchSpec(argv=["sh", "-c", self.line])

    def read_output(self, stdout: str, stderr: str) -> HarnessOutput:
        return HarnessOutput(final_message=stdout)


@pytest.mark.parametrize("sandbox", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_agent_cannot_read_its_task_or_suite_from_a_shown_folder(tmp_path, suite, sandbox):
    from clawgym_env import Runtime
    from clawgym_env.testing import EchoScriptPolicy

    sandbox = _backend(sandbox)
    task = load_task_dir(suite / "probe", suite="s")
    with Runtime(EchoScriptPolicy(), out_dir=tmp_path / "eps", sandbox=sandbox) as rt:
        result = rt.run(task, ProbeHarness(_probe(suite)))
    seen = result.record.final_message or ""
    assert "shown-root:" in seen and "end" in seen, (seen, result.record)
    assert str(suite.parent) in seen.split("found:")[0], seen  # the folder holding the suite is shown ...
    assert SECRET not in seen and "expert.json" not in seen and "secret.txt" not in seen, seen  # ... not the suite
    assert (suite / "probe" / "reward" / "secret.txt").read_text() == f"{SECRET}\n"  # nothing changed on the host


GUEST_CHECK = '''import json, sys
import clawgym_guest
probe = clawgym_guest.run(["sh", "-c", {line!r}])
mine = open({secret!r}).read() if __import__("os").path.exists({secret!r}) else ""
print(json.dumps({{"guest": probe.stdout, "grader": mine}}), file=sys.stderr)
print(1.0 if probe.stdout.strip().endswith("end") else 0.0)
'''


@pytest.mark.parametrize("sandbox", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_neither_the_grader_nor_its_guest_reads_the_suite_from_a_shown_folder(tmp_path, suite, sandbox):
    from clawgym_env.grading.reward import grade_workspace

    sandbox = _backend(sandbox)
    check = GUEST_CHECK.format(line=_probe(suite), secret=str(suite / "other" / "reward" / "secret.txt"))
    (suite / "probe" / "reward" / "check.py").write_text(check)
    (suite / "probe" / "reward" / "reward.sh").write_text(f"#!/usr/bin/env bash\npython3 {MOUNT}/reward/check.py\n")
    for f in ("check.py", "reward.sh"):
        (suite / "probe" / "reward" / f).chmod(0o644)
    task = load_task_dir(suite / "probe")
    ws = tmp_path / "ws"
    ws.mkdir()
    rr = grade_workspace(task, ws, sandbox=sandbox)
    assert rr.ok and rr.reward == 1.0, (rr.reason, rr.stdout, rr.stderr)
    seen = json.loads(rr.stderr.strip().splitlines()[-1])
    assert str(suite.parent) in seen["guest"].split("found:")[0], seen
    assert SECRET not in seen["guest"] and "expert.json" not in seen["guest"], seen
    assert seen["grader"] == "", seen  # the grader reads its own reward/ copy, not the suite's folders
