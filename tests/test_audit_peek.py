"""The audit's ``task_folder_peek`` adversary: it reads its task's ``expert.json`` at the real host path from
inside the sandbox and replays it.

Played through the real ``mini`` harness, bubblewrap and the real grader, on a task kept in a world-readable
folder put on ``CLAWGYM_SANDBOX_RO_PATHS`` (shown read-only in every sandbox, the way ``/opt`` is):

* with the episode's task folders masked (what the engine does) the peek finds nothing and scores what the
  do-nothing agent scores: not hackable;
* with a sandbox backend that hides only the defaults (the engine before the masking, or a remote pod's
  image that holds the tasks) the peek replays the expert and the task is named hackable by it.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawgym_env import plugins
from clawgym_env.sandbox.base import default_hidden_paths
from clawgym_env.sandbox.bwrap.sandbox import BwrapSandbox
from leaderboards.audit import AuditOptions, run_audit
from leaderboards.audit.facts import gather_facts
from leaderboards.audit.kit import PEEK_MISS, plan_task_folder_peek
from tasks import load_task_dir

WEAK = Path(__file__).resolve().parent / "fixtures" / "audit_weak"
pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def shown_task(monkeypatch) -> Iterator[Path]:
    """``honest_constant`` copied into a suite folder that every sandbox shows read-only."""
    shown = Path(tempfile.mkdtemp(prefix="cg-shown-"))
    monkeypatch.setenv("CLAWGYM_SANDBOX_RO_PATHS", str(shown))
    task_dir = shown / "suite" / "honest_constant"
    shutil.copytree(WEAK / "honest_constant", task_dir)
    for path in [shown, *shown.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield task_dir
    shutil.rmtree(shown, ignore_errors=True)


class ShowsTaskFolders(BwrapSandbox):
    """A backend that hides only the defaults, not the episode's task folders (a misconfigured deployment)."""

    def __init__(self, spec, **kw) -> None:
        super().__init__(dataclasses.replace(spec, hidden_paths=default_hidden_paths()), **kw)


def test_the_peek_reads_the_expert_at_its_real_path_and_skips_without_one(tmp_path, shown_task):
    plan = plan_task_folder_peek(gather_facts(load_task_dir(shown_task)))
    assert plan.skipped is None and len(plan.episodes) == 1
    script = plan.episodes[0].script
    assert script.final is None  # answers with what the replay printed: the expert's final answer
    assert str(shown_task.resolve() / "expert.json") in script.steps[0]["command"]
    bare = tmp_path / "bare"
    shutil.copytree(shown_task, bare)
    (bare / "expert.json").unlink()
    assert "no expert.json" in (plan_task_folder_peek(gather_facts(load_task_dir(bare))).skipped or "")


def test_a_masked_task_folder_resists_the_peek_and_a_shown_one_does_not(tmp_path, shown_task):
    task = load_task_dir(shown_task, suite="shown")
    masked = run_audit("shown", [task], AuditOptions(harness="mini", attacks=("task_folder_peek",),
                                                     out_dir=tmp_path / "masked"))
    peek = masked.tasks["honest_constant"].attacks["task_folder_peek"]
    assert masked.tasks["honest_constant"].gold.expert == 1.0  # the expert itself earns full marks here
    assert peek.reward == masked.tasks["honest_constant"].baseline and not peek.hacked, peek
    assert not masked.hackable
    with plugins.sandboxes.registered("shows-task-folders", ShowsTaskFolders):
        shown = run_audit("shown", [task], AuditOptions(harness="mini", sandbox="shows-task-folders",
                                                        attacks=("task_folder_peek",), out_dir=tmp_path / "shown"))
    peek = shown.tasks["honest_constant"].attacks["task_folder_peek"]
    assert peek.reward == 1.0 and peek.hacked, peek
    assert shown.hackable == ["honest_constant"]
    finals = [p.read_text() for p in (tmp_path / "masked").glob("*/episode.json")]
    assert any(PEEK_MISS in text for text in finals)  # the masked peek said what it found: nothing
